"""``moe-policy lint FILE...``: findings with severity, code, message and file:line:col.

Exit 1 when any error is found, 0 otherwise (warnings alone pass).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from moe_policy.cli.app import EXIT_LINT_ERROR, EXIT_OK


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``lint`` and its options."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "lint",
        help="check policy files for defects (exit 1 on an error)",
        description="Check policy files: unknown keys, backends and context keys, invalid "
        "values, shadowed and conflicting rules, requires that leave no backend.",
    )
    parser.add_argument("files", nargs="+", metavar="FILE", help="policy YAML files")
    parser.add_argument("--json", action="store_true", help="print the findings as JSON")
    parser.add_argument(
        "--engine",
        default=None,
        metavar="NAME[==VERSION]",
        help="check against this engine's backends: moe_policy (default) or vllm",
    )
    return parser


def run(args: argparse.Namespace) -> int:
    """Lint every file, print the findings, exit 1 on any error."""
    from moe_policy.core.engines import resolve_engine
    from moe_policy.core.origin import Origin
    from moe_policy.lint.checks import lint_paths

    findings = lint_paths(args.files, engine=resolve_engine(args.engine, Origin.cli("--engine")))
    errors = sum(f.severity == "error" for f in findings)
    warnings = len(findings) - errors
    if args.json:
        report = {
            "files": list(args.files),
            "findings": [f.to_dict() for f in findings],
            "errors": errors,
            "warnings": warnings,
        }
        sys.stdout.write(json.dumps(report, indent=2) + "\n")
    else:
        from moe_policy.cli.table import WIDTH, table

        if findings:
            rows = [(f.location, f.severity, f.code, f.message) for f in findings]
            fixed = max(len(r[0]) for r in rows) + 8 + max(len(r[2]) for r in rows) + 6
            widths = (None, 8, None, max(WIDTH - fixed, 30))
            print(table(rows, ("location", "severity", "code", "message"), widths))
        files = len(args.files)
        print(
            f"{files} file{'s' if files != 1 else ''} checked: {errors} error(s), {warnings} warning(s)"
        )
    return EXIT_LINT_ERROR if errors else EXIT_OK
