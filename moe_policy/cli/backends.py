"""``moe-policy backends``: the capability catalog as a matrix (human table or JSON).

The text fits the terminal (``moe_policy.cli.terminal.output_width``): where every column
fits side by side it is one matrix; on a narrower terminal the activations and packages go
on the lines under each backend's row (narrower still: one block per backend), so no
backend, activation or package name is split.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from moe_policy.core.catalog import BackendSpec, Catalog


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``backends`` and its options."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "backends",
        help="show the backend capability catalog",
        description="The catalog (configs/backends.yaml): where each backend runs, what it "
        "computes, LoRA and batch invariance, the packages it needs, and whether this "
        "package implements it or an engine provides it.",
    )
    parser.add_argument("--json", action="store_true", help="print the catalog as JSON")
    return parser


def _capability(spec: BackendSpec) -> str:
    parts = []
    if spec.capability_min or spec.capability_max:
        parts.append(f"{spec.capability_min or ''}..{spec.capability_max or ''}")
    if spec.capability_any_of:
        parts.append(" ".join(spec.capability_any_of))
    return " ".join(parts) if parts else "any"


def _lora(spec: BackendSpec) -> str:
    return {"true": "yes", "false": "no", "delegated": "platform", "conditional": "if ..."}.get(
        spec.lora, spec.lora
    )


def _names(values: tuple[str, ...]) -> str:
    return " ".join(values) if values else "-"


def row(spec: BackendSpec, catalog: Catalog) -> tuple[str, ...]:
    """One matrix row: the facts people compare across backends."""
    return (
        spec.name + ("*" if catalog.implementation(spec.name) else ""),
        _names(spec.platforms),
        _capability(spec),
        "\n".join(_activations(spec)),
        spec.activation_format,
        _lora(spec),
        "yes" if spec.batch_invariant else "no",
        _names(spec.packages),
    )


def _activations(spec: BackendSpec) -> list[str]:
    if spec.delegated:
        return ["(the platform runs MoE)"]
    return [
        f"gated: {_names(spec.gated_activations)}",
        f"non-gated: {_names(spec.non_gated_activations)}",
    ]


HEADERS = (
    "backend",
    "platforms",
    "capability",
    "activations",
    "format",
    "LoRA",
    "b-inv",
    "packages",
)
#: The columns of the narrow layout (the row's activations and packages go under it).
SHORT = (0, 1, 2, 4, 5, 6)
#: How far the lines under a row are indented.
UNDER_INDENT = 4


#: The layouts, widest first: the whole matrix; a narrower table with the activations and
#: packages under each row; one block of ``name: value`` lines per backend.
LAYOUTS = ("matrix", "stacked", "blocks")


def _natural(rows: list[list[str]], headers: list[str]) -> int:
    """The width of ``rows`` as a table with nothing wrapped."""
    from moe_policy.cli.table import GAP

    widths = [
        max(len(line) for cell in (h, *(r[i] for r in rows)) for line in cell.splitlines())
        for i, h in enumerate(headers)
    ]
    return sum(widths) + GAP * (len(headers) - 1)


def _narrowest(rows: list[list[str]], headers: list[str]) -> int:
    """The width of ``rows`` as a table with every cell wrapped at each space."""
    from moe_policy.cli.table import GAP

    widths = [
        max(len(word) for cell in (h, *(r[i] for r in rows)) for word in cell.split() or ["-"])
        for i, h in enumerate(headers)
    ]
    return sum(widths) + GAP * (len(headers) - 1)


def layout_for(rows: list[tuple[str, ...]], width: int | None) -> str:
    """The widest layout of :data:`LAYOUTS` that fits ``width`` columns (None: no limit)."""
    cells = [list(r) for r in rows]
    if width is None or _natural(cells, list(HEADERS)) <= width:
        return "matrix"
    short = [[r[i] for i in SHORT] for r in rows]
    return "stacked" if _narrowest(short, [HEADERS[i] for i in SHORT]) <= width else "blocks"


def _under(spec: BackendSpec) -> list[str]:
    packages = [f"packages: {_names(spec.packages)}"] if spec.packages else []
    return [*_activations(spec), *packages]


def matrix(
    specs: list[BackendSpec], catalog: Catalog, width: int | None, layout: str | None = None
) -> str:
    """The catalog in ``layout`` (default: :func:`layout_for` ``width``), wrapped to
    ``width`` columns (None: unwrapped)."""
    from moe_policy.cli.lines import fit
    from moe_policy.cli.table import table

    rows = [row(spec, catalog) for spec in specs]
    layout = layout or layout_for(rows, width)
    pad = " " * UNDER_INDENT
    if layout == "matrix":
        return table(rows, HEADERS)
    if layout == "blocks":
        out = []
        for spec, cells in zip(specs, rows, strict=True):
            out.append(cells[0])
            facts = [f"{HEADERS[i]}: {cells[i]}" for i in SHORT[1:3]]
            facts.append(", ".join(f"{HEADERS[i]}: {cells[i]}" for i in SHORT[3:]))
            out.extend(fit(pad + line, width) for line in [*facts, *_under(spec)])
        return "\n".join(out)
    short = [[r[i] for i in SHORT] for r in rows]
    lines = table(short, [HEADERS[i] for i in SHORT], total=width).splitlines()
    # A row starts where the backend column (never wrapped: names are not split) is not blank.
    starts = [i for i, line in enumerate(lines) if i >= 2 and line[:1] != " "]
    out = lines[:2]
    for n, start in enumerate(starts):
        stop = starts[n + 1] if n + 1 < len(starts) else len(lines)
        out.extend(lines[start:stop])
        out.extend(fit(pad + line, width) for line in _under(specs[n]))
    return "\n".join(out)


def run(args: argparse.Namespace) -> int:
    """Print the catalog."""
    from moe_policy.core import paths
    from moe_policy.core.catalog import load_catalog

    catalog = load_catalog()
    if args.json:
        backends = [
            {**spec.to_dict(), "implemented_here": catalog.implementation(spec.name) is not None}
            for spec in catalog
        ]
        document = {
            "catalog": paths.BACKENDS_CATALOG_NAME,
            "sha256": catalog.sha256,
            "backends": backends,
        }
        sys.stdout.write(json.dumps(document, indent=2) + "\n")
        return 0
    from moe_policy.cli.terminal import output_width

    print(render(catalog, output_width(sys.stdout)))
    return 0


def render(catalog: Catalog, width: int | None, layout: str | None = None) -> str:
    """The human text: heading, matrix and notes, laid out for ``width`` columns (None:
    unwrapped); ``layout`` (one of :data:`LAYOUTS`) overrides the one ``width`` picks."""
    from moe_policy.cli.lines import fit
    from moe_policy.cli.table import heading
    from moe_policy.core import paths

    title = heading(
        "Backends", f"{paths.BACKENDS_CATALOG_NAME}; dtypes and limits: --json", width or 10**6
    )
    lines = [title, matrix(list(catalog), catalog, width, layout)]
    conditional = [s for s in catalog if s.lora == "conditional"]
    notes = [
        "* implemented here (an experts class in moe_policy.experts); others are provided by the engine",
        "format: standard [T, H] or batched [E, max_tokens, H]; b-inv: batch-invariant",
    ]
    notes.extend(
        f"LoRA if ...: {s.name} through {s.lora_experts_class}, where its catalog conditions hold"
        for s in conditional
    )
    lines.extend(fit(note, width) for note in notes)
    return "\n".join(lines)
