"""``moe-policy lint FILE...``: findings with severity, code, message and file:line:col.

``--format`` picks the output: ``text`` (a table, the default), ``json`` (also ``--json``),
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
        help="check against this engine's backends: moe_policy (default) or vllm",
    )
    return parser


def run(args: argparse.Namespace) -> int:
    """Lint every file, print the findings, exit 1 on any error."""
    from moe_policy.core.engines import resolve_engine
    from moe_policy.core.origin import Origin
    from moe_policy.lint.checks import lint_paths

    findings = lint_paths(args.files, engine=resolve_engine(args.engine, Origin.cli("--engine")))
    from moe_policy.lint.formats import RENDERERS, counts, summary

    errors, warnings = counts(findings)
    if args.format in RENDERERS:
        sys.stdout.write(RENDERERS[args.format](findings, args.files))
    else:
        from moe_policy.cli.table import WIDTH, table

        if findings:
            rows = [(f.location, f.severity, f.code, f.message) for f in findings]
            fixed = max(len(r[0]) for r in rows) + 8 + max(len(r[2]) for r in rows) + 6
            widths = (None, 8, None, max(WIDTH - fixed, 30))
            print(table(rows, ("location", "severity", "code", "message"), widths))
        print(summary(len(args.files), errors, warnings))
    return EXIT_LINT_ERROR if errors else EXIT_OK
