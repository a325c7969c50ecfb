"""``moe-policy plan``: what a policy change does to every deployment, before it ships.

``--from`` and ``--to`` each name a policy set: policy files (repeatable, in order), a
bundled profile name (``strict``, ``audit``, ``prefer-trtllm-lora``) or
``git:REV:PATH`` (read with ``git show``, no checkout). Every deployment x platform x
layer kind of the matrix is decided under both; only what changes is printed (the table
fits the terminal: with too little room for a change beside its deployment, the changes go
under a row per deployment).
Exit 0: nothing changes, 1: something does, 2: bad input.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from moe_policy.core.origin import Origin
from moe_policy.errors import PolicyError

FORMATS = ("table", "markdown")


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``plan`` and its options."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "plan",
        help="show what a policy change does to every deployment of a matrix",
        description="Decide every deployment x platform x layer kind of a deployment matrix "
        "under the old and the new policy and print only what changes.",
    )
    parser.add_argument(
        "--from",
        dest="old",
        action="append",
        default=[],
        metavar="POLICY",
        help="old policy: a file, a bundled profile name or git:REV:PATH (repeatable, in "
        "order; omitted: the built-in defaults only)",
    )
    parser.add_argument(
        "--to",
        dest="new",
        action="append",
        required=True,
        metavar="POLICY",
        help="new policy: a file, a bundled profile name or git:REV:PATH (repeatable)",
    )
    parser.add_argument(
        "--matrix",
        metavar="FILE",
        default=None,
        help="deployment matrix (YAML); default: the bundled configs/matrices/default.yaml",
    )
    output = parser.add_mutually_exclusive_group()  # --json --format markdown: which one?
    output.add_argument("--json", action="store_true", help="print the changes as JSON")
    output.add_argument(
        "--format", choices=FORMATS, default="table", help="table (default) or markdown"
    )
    return parser


def _profiles() -> dict[str, Path]:
    from moe_policy.core.paths import CONFIG_DIR

    return {p.stem: p for p in sorted((CONFIG_DIR / "profiles").glob("*.yaml"))}


def resolve_policy(spec: str, flag: str, workdir: Path, rename: dict[str, str]) -> str:
    """A policy file path for ``spec`` (file, profile name or ``git:REV:PATH``)."""
    origin = Origin.cli(flag)
    if spec.startswith("git:"):
        rev, sep, path = spec[4:].partition(":")
        if not sep or not rev or not path:
            raise PolicyError(f"expected git:REV:PATH, got {spec!r}", origin)
        if rev.startswith("-"):
            # `git show --output=FILE:PATH` would write FILE: a revision is never an option
            raise PolicyError(
                f"expected git:REV:PATH, got {spec!r} (a revision cannot start with '-')", origin
            )
        done = subprocess.run(
            ["git", "show", f"{rev}:{path}"], capture_output=True, text=True, check=False
        )
        if done.returncode != 0:
            detail = done.stderr.strip().splitlines()[-1:] or ["git failed"]
            raise PolicyError(f"git show {rev}:{path}: {detail[0]}", origin)
        target = workdir / f"{len(rename)}" / Path(path).name
        target.parent.mkdir(parents=True)
        target.write_text(done.stdout, encoding="utf-8")
        rename[str(target)] = spec
        return str(target)
    profiles = _profiles()
    if spec in profiles and not Path(spec).exists():
        return str(profiles[spec])
    return spec


def run(args: argparse.Namespace) -> int:
    """Plan, print, and exit 1 when something changes."""
    from moe_policy.planning import DEFAULT_MATRIX, load_matrix, plan

    deployments = load_matrix(args.matrix or DEFAULT_MATRIX)
    rename: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="moe-policy-plan-") as tmp:
        work = Path(tmp)
        old = [resolve_policy(s, "--from", work, rename) for s in args.old]
        new = [resolve_policy(s, "--to", work, rename) for s in args.new]
        result = plan(deployments, old, new, rename=rename)
    labels = (" ".join(args.old) or "built-in defaults", " ".join(args.new))
    if args.json:
        out = {"from": list(args.old), "to": list(args.new), **result.to_dict()}
        text = json.dumps(out, indent=2) + "\n"
    elif args.format == "markdown":
        text = render_markdown(result, labels)
    else:
        from moe_policy.cli.terminal import output_width

        text = render_table(result, labels, output_width(sys.stdout))
    sys.stdout.write(text)
    sys.stdout.flush()
    return 1 if result.changed else 0


def _refs(change: Any) -> str:
    return ", ".join(f"{rule_id} ({origin})" for rule_id, origin in change.rules) or "-"


def _value(value: Any) -> str:
    return "-" if value is None else str(value)


def _summary(result: Any) -> str:
    cells = len(result.cells)
    if not cells:
        return f"no changes ({result.decided} layer decisions over {result.deployments} deployment-platform pairs)"
    backends = sum(any(c.field == "backend" for c in cell.changes) for cell in result.cells)
    return (
        f"{cells} of {result.decided} layer decisions change ({backends} change backend) "
        f"over {result.deployments} deployment-platform pairs"
    )


#: The table's columns; a change is one row.
HEADERS = ("deployment", "platform", "layer", "change", "old -> new", "because")
#: The narrowest each of the last two columns may be beside the others; with less room
#: each change goes on a line under its deployment's row.
CHANGE_MIN = 30
#: How far a change under its deployment's row is indented.
UNDER_INDENT = 4


def _change_text(change: Any) -> str:
    refs = _refs(change)
    text = f"{change.field}: {_value(change.old)} -> {_value(change.new)}"
    return text if refs == "-" else f"{text}; because {refs}"


def _longest_word(cells: list[str]) -> int:
    return max((len(word) for cell in cells for word in cell.split()), default=1)


def render_table(
    result: Any, labels: tuple[str, str], width: int | None = None, stacked: bool | None = None
) -> str:
    """The human text for ``width`` columns (None: unwrapped): one table row per change
    where the old and new values and the rules fit beside the deployment (``CHANGE_MIN``
    columns each, and their longest word), else (or where ``stacked``) one row per
    deployment x platform x layer with its changes under it. No word (a path, a rule id, a
    backend) is ever split."""
    from moe_policy.cli.lines import fit
    from moe_policy.cli.table import GAP, table

    lines = [
        fit(f"moe-policy plan: {labels[0]} -> {labels[1]}", width),
        fit(_summary(result), width),
    ]
    if result.cells:
        rows = [
            [
                cell.label,
                cell.platform,
                cell.layer,
                change.field,
                f"{_value(change.old)} -> {_value(change.new)}",
                _refs(change),
            ]
            for cell in result.cells
            for change in cell.changes
        ]
        fixed = sum(max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(HEADERS[:4]))
        room = None if width is None else width - fixed - GAP * 5
        olds, becauses = [r[4] for r in rows], [r[5] for r in rows]
        least = [max(CHANGE_MIN, _longest_word(olds)), max(CHANGE_MIN, _longest_word(becauses))]
        if stacked is None:
            stacked = room is not None and room < sum(least)
        lines.append("")
        if not stacked:
            limits: list[int | None] = [None] * len(HEADERS)
            natural = [max(len(c) for c in olds), max(len(c) for c in becauses)]
            if room is not None and sum(natural) > room:
                because = min(
                    natural[1], max(least[1], room - natural[0], room // 2), room - least[0]
                )
                limits[4:] = [min(natural[0], room - because), because]
            lines.append(table(rows, HEADERS, limits))
        else:
            keys = [[cell.label, cell.platform, cell.layer] for cell in result.cells]
            keyed = table(keys, HEADERS[:3]).splitlines()
            lines.extend(keyed[:2])
            pad = " " * UNDER_INDENT
            for line, cell in zip(keyed[2:], result.cells, strict=True):
                lines.append(line)
                lines.extend(fit(pad + _change_text(change), width) for change in cell.changes)
    return "\n".join(lines).rstrip("\n") + "\n"


def _md(text: str) -> str:
    return text.replace("|", "\\|")


def render_markdown(result: Any, labels: tuple[str, str]) -> str:
    """A pull-request comment."""
    lines = [
        "### moe-policy plan",
        "",
        f"`{_md(labels[0])}` → `{_md(labels[1])}`: {_summary(result)}",
    ]
    if result.cells:
        lines += [
            "",
            "| deployment | platform | layer | change | old → new | because |",
            "| --- | --- | --- | --- | --- | --- |",
        ]
        for cell in result.cells:
            for change in cell.changes:
                lines.append(
                    f"| {_md(cell.label)} | {_md(cell.platform)} | {cell.layer} | "
                    f"{_md(change.field)} | {_md(_value(change.old))} → "
                    f"{_md(_value(change.new))} | {_md(_refs(change))} |"
                )
    return "\n".join(lines) + "\n"
