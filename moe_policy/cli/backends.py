"""``moe-policy backends``: the capability catalog as a matrix (human table or JSON)."""

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
    if spec.delegated:
        activations = "(the platform runs MoE)"
    else:
        activations = f"gated: {_names(spec.gated_activations)}\nnon-gated: {_names(spec.non_gated_activations)}"
    return (
        spec.name + ("*" if catalog.implementation(spec.name) else ""),
        _names(spec.platforms),
        _capability(spec),
        activations,
        spec.activation_format,
        _lora(spec),
        "yes" if spec.batch_invariant else "no",
        _names(spec.packages),
    )


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
WIDTHS = (19, 9, 10, 17, 8, 8, 5, 10)


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
    from moe_policy.cli.table import heading, table

    print(heading("Backends", f"{paths.BACKENDS_CATALOG_NAME}; dtypes and limits: --json"))
    print(table([row(spec, catalog) for spec in catalog], HEADERS, WIDTHS))
    conditional = [s for s in catalog if s.lora == "conditional"]
    notes = [
        "* implemented here (an experts class in moe_policy.experts); others are provided by the engine",
        "format: standard [T, H] or batched [E, max_tokens, H]; b-inv: batch-invariant",
    ]
    notes.extend(
        f"LoRA if ...: {s.name} through {s.lora_experts_class}, where its catalog conditions hold"
        for s in conditional
    )
    print("\n".join(notes))
    return 0
