"""``moe-policy lint FILE...``: findings with severity, code, message and file:line:col.

``--format`` picks the output: ``text`` (a table laid out for the terminal's width, the
default: where the message has too little room beside a finding it goes under its row;
narrower still, each finding is a block of its own),
``json`` (also ``--json``),
``lines`` (``PATH:LINE:COL: SEVERITY: MESSAGE [CODE]`` for editors), ``github`` (GitHub
Actions annotations) or ``sarif`` (SARIF 2.1.0); see ``moe_policy.lint.formats``.
Exit 1 when any error is found, 0 otherwise (warnings alone pass).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from moe_policy.cli.app import EXIT_LINT_ERROR, EXIT_OK

#: ``--format`` values: ``text`` is rendered here, the others by ``moe_policy.lint.formats``
#: (named here so that building the parser imports no lint code).
FORMATS = ("text", "json", "lines", "github", "sarif")


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``lint`` and its options."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "lint",
        help="check policy files for defects (exit 1 on an error)",
        description="Check policy files: unknown keys, backends and context keys, invalid "
        "values, shadowed and conflicting rules, requires that leave no backend.",
    )
    parser.add_argument("files", nargs="+", metavar="FILE", help="policy YAML files")
    output = parser.add_mutually_exclusive_group()
    output.add_argument(
        "--format",
        choices=FORMATS,
        default="text",
        help="text: a table (default); json; lines: PATH:LINE:COL: SEVERITY: MESSAGE [CODE] "
        "for editors; github: GitHub Actions annotations; sarif: SARIF 2.1.0",
    )
    output.add_argument(
        "--json",
        dest="format",
        action="store_const",
        const="json",
        help="the same as --format json",
    )
    parser.add_argument(
        "--engine",
        default=None,
        metavar="NAME[==VERSION]",
        help="check against this engine's backends: moe_policy (default), vllm, vllm==0.33 or a "
        "vLLM quantized oracle (vllm/fp8, vllm/mxfp4, ...)",
    )
    return parser


def run(args: argparse.Namespace) -> int:
    """Lint every file, print the findings, exit 1 on any error."""
    from moe_policy.core.engines import resolve_engine
    from moe_policy.core.origin import Origin
    from moe_policy.errors import PolicyError
    from moe_policy.lint.checks import lint_paths

    for number, path in enumerate(args.files, 1):
        if not path.strip():  # no file is named: bad usage, not a finding at location '-'
            raise PolicyError(
                f"argument {number} of {len(args.files)} is an empty path (give a policy YAML "
                "file)",
                Origin.cli("FILE"),
            )
    findings = lint_paths(args.files, engine=resolve_engine(args.engine, Origin.cli("--engine")))
    from moe_policy.lint.formats import RENDERERS, counts, summary

    errors, warnings = counts(findings)
    if args.format in RENDERERS:
        sys.stdout.write(RENDERERS[args.format](findings, args.files))
    else:
        from moe_policy.cli.terminal import output_width

        if findings:
            rows = [(f.location, f.severity, f.code, f.message) for f in findings]
            print(render_text(rows, output_width(sys.stdout)))
        print(summary(len(args.files), errors, warnings))
    return EXIT_LINT_ERROR if errors else EXIT_OK


#: The text table's columns; the message is the last.
HEADERS = ("location", "severity", "code", "message")
#: The narrowest message column beside its row; narrower, the message goes under the row.
MESSAGE_MIN = 30
#: How far a message under its row is indented.
UNDER_INDENT = 4


#: The text layouts, widest first: the message beside its finding; a table of location,
#: severity and code with each message under its row; one block per finding, no table.
LAYOUTS = ("table", "stacked", "blocks")


def layout_for(rows: list[tuple[str, str, str, str]], width: int | None) -> str:
    """The widest layout of :data:`LAYOUTS` that fits ``width`` columns (None: no limit):
    the message goes beside its finding where that leaves it ``MESSAGE_MIN`` columns and
    its longest word."""
    from moe_policy.cli.table import GAP

    if width is None:
        return "table"
    fixed = sum(max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(HEADERS[:3]))
    longest = max(len(word) for r in rows for word in r[3].split() or [""])
    if width - fixed - GAP * 3 >= max(MESSAGE_MIN, longest):
        return "table"
    return "stacked" if fixed + GAP * 2 <= width else "blocks"


def render_text(
    rows: list[tuple[str, str, str, str]], width: int | None, layout: str | None = None
) -> str:
    """The findings for ``width`` columns (None: unwrapped) in ``layout`` (default:
    :func:`layout_for`). A location, severity or code is never wrapped, and no word of a
    message (a path, an identifier) is ever split."""
    from moe_policy.cli.lines import fit
    from moe_policy.cli.table import GAP, table

    layout = layout or layout_for(rows, width)
    pad = " " * UNDER_INDENT
    if layout == "table":
        fixed = sum(max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(HEADERS[:3]))
        room = None if width is None else width - fixed - GAP * 3
        return table(rows, HEADERS, (None, None, None, room))
    if layout == "blocks":
        out = []
        for location, severity, code, message in rows:
            out.append(fit(f"{location}  {severity}  {code}", width))
            out.append(fit(pad + " ".join(message.splitlines()), width, hang=0))
        return "\n".join(out)
    lines = table([r[:3] for r in rows], HEADERS[:3]).splitlines()
    out = lines[:2]
    for line, finding in zip(lines[2:], rows, strict=True):
        out.append(line)
        out.append(fit(pad + " ".join(finding[3].splitlines()), width, hang=0))
    return "\n".join(out)
