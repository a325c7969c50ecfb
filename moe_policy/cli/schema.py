"""``moe-policy schema NAME``: print a shipped JSON Schema (decision, audit, policy, matrix).

The schema printed is self-contained (``moe_policy.schema``): save it beside a policy file
for an editor, or hand it to a validator in CI.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from moe_policy.schemas import NAMES

_WHAT = {
    "decision": "the decision record (explain --json)",
    "audit": "one audit line: a decision, or the cross-rank agreement outcome",
    "policy": "a policy YAML file",
    "matrix": "a deployment matrix (plan)",
}


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``schema`` and its argument."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "schema",
        help="print a JSON Schema: decision, audit, policy or matrix",
        description="Print one of the JSON Schemas (draft 2020-12) shipped with the package, "
        "self-contained. "
        + "; ".join(f"{name}: {_WHAT[name]}" for name in NAMES)
        + ". Editors validate and complete policy files with the policy schema "
        "(a `# yaml-language-server: $schema=...` first line).",
    )
    parser.add_argument("name", choices=NAMES, metavar="NAME", help=", ".join(NAMES))
    return parser


def run(args: argparse.Namespace) -> int:
    """Print the schema as indented JSON."""
    from moe_policy.schemas import schema

    sys.stdout.write(json.dumps(schema(args.name), indent=2) + "\n")
    return 0
