"""``moe-policy models``: the bundled model configs, by the name ``--model NAME`` takes.

Each row shows the MoE shape read from the config (experts, experts per token, hidden and
intermediate size, activation, quantization), the facts a decision reads; the table fits
the terminal (``moe_policy.cli.terminal.output_width``), ``--json`` adds the architecture,
the file and the dtype.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

#: JSON field -> context key of the model facts, in column order.
FIELDS = {
    "architecture": "model.architecture",
    "num_experts": "model.num_experts",
    "top_k": "model.top_k",
    "hidden_size": "model.hidden_size",
    "intermediate_size": "model.intermediate_size",
    "activation": "model.activation",
    "gated": "model.gated",
    "dtype": "model.dtype",
    "quantization": "model.quantization",
}
#: The table's columns (the architecture and dtype are in --json).
HEADERS = ("name", "E", "top-k", "hidden", "intermediate", "activation", "quant")


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``models`` and its options."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "models",
        help="list the bundled model configs (names for --model)",
        description="The model configs bundled with the package, by the name "
        "`explain --model NAME` and deployment matrices take, with the MoE shape each one "
        "gives a decision.",
    )
    parser.add_argument("--json", action="store_true", help="print the models as JSON")
    return parser


def bundled_models() -> list[dict[str, Any]]:
    """One entry per bundled model config: name, file and MoE facts."""
    from moe_policy.core import paths
    from moe_policy.core.model import load_model

    entries = []
    for name, path in paths.bundled(paths.MODELS_DIR, ".json").items():
        facts = load_model(path).facts
        entry: dict[str, Any] = {"name": name, "file": paths.display_name(path)}
        entry.update({field: facts.get(key, (None,))[0] for field, key in FIELDS.items()})
        entries.append(entry)
    return entries


def run(args: argparse.Namespace) -> int:
    """Print the bundled models as a table or JSON."""
    models = bundled_models()
    if args.json:
        sys.stdout.write(json.dumps(models, indent=2) + "\n")
        return 0
    from moe_policy.cli.table import table
    from moe_policy.cli.terminal import output_width

    rows = [
        (
            m["name"],
            m["num_experts"],
            m["top_k"],
            m["hidden_size"],
            m["intermediate_size"],
            m["activation"] if m["gated"] is not False else f"{m['activation']} (non-gated)",
            m["quantization"],
        )
        for m in models
    ]
    print(table(rows, HEADERS, total=output_width(sys.stdout)))
    return 0
