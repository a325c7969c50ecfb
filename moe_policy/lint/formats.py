"""Lint findings in the formats CI systems and editors read.

* ``json``: the findings with counts (``moe-policy lint --json``).
* ``lines``: one ``PATH:LINE:COL: SEVERITY: MESSAGE [CODE]`` line per finding, the compiler
  format editors jump from (Vim's and Emacs' defaults, VS Code's ``$gcc`` problem matcher).
* ``github``: GitHub Actions workflow commands, ``::error file=F,line=L,col=C,title=CODE::MESSAGE``,
  which the runner turns into annotations on the pull request's files.
* ``sarif``: a SARIF 2.1.0 log (code scanning, IDE viewers), one run with a rule per code.

The human table (``text``) is the CLI's own rendering.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple
from urllib.parse import quote

from moe_policy.core.values import is_decimal

if TYPE_CHECKING:
    from moe_policy.lint.checks import Finding

SARIF_VERSION = "2.1.0"
SARIF_SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"
#: Where a code's meaning is written down (the lint section of the CLI reference).
CODES_DOC = "docs/cli.md#lint"


class Position(NamedTuple):
    """Where a finding is: its file and, when known, 1-based line and column."""

    path: str
    line: int | None
    col: int | None


def position(finding: Finding) -> Position:
    """``configs/p.yaml:3:1`` -> (``configs/p.yaml``, 3, 1); a bare path has no line or column."""
    location = finding.location
    parts = location.rsplit(":", 2)
    if len(parts) == 3 and is_decimal(parts[1]) and is_decimal(parts[2]):
        return Position(parts[0], int(parts[1]), int(parts[2]))
    head, _, tail = location.rpartition(":")
    if head and is_decimal(tail):
        return Position(head, int(tail), None)
    return Position(location, None, None)


def summary(files: int, errors: int, warnings: int) -> str:
    """``3 files checked: 1 error(s), 0 warning(s)``."""
    return (
        f"{files} file{'s' if files != 1 else ''} checked: {errors} error(s), {warnings} warning(s)"
    )


def counts(findings: Sequence[Finding]) -> tuple[int, int]:
    """(errors, warnings)."""
    errors = sum(f.severity == "error" for f in findings)
    return errors, len(findings) - errors


def to_json(findings: Sequence[Finding], files: Sequence[str]) -> str:
    errors, warnings = counts(findings)
    report = {
        "files": list(files),
        "findings": [f.to_dict() for f in findings],
        "errors": errors,
        "warnings": warnings,
    }
    return json.dumps(report, indent=2) + "\n"


def _one_line(text: str) -> str:
    return " ".join(text.split())


def to_lines(findings: Sequence[Finding], files: Sequence[str]) -> str:
    out = []
    for f in findings:
        pos = position(f)
        where = ":".join(str(p) for p in pos if p is not None)
        out.append(f"{where}: {f.severity}: {_one_line(f.message)} [{f.code}]")
    out.append(summary(len(files), *counts(findings)))
    return "\n".join(out) + "\n"


def _escape_data(text: str) -> str:
    """A workflow command's message: ``%``, CR and LF percent-encoded (the runner decodes them)."""
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_property(text: str) -> str:
    """A workflow command's property value: also ``:`` and ``,``."""
    return _escape_data(text).replace(":", "%3A").replace(",", "%2C")


def to_github(findings: Sequence[Finding], files: Sequence[str]) -> str:
    out = []
    for f in findings:
        pos = position(f)
        props = {"file": pos.path, "line": pos.line, "col": pos.col, "title": f.code}
        text = ",".join(
            f"{k}={_escape_property(str(v))}" for k, v in props.items() if v is not None
        )
        command = "error" if f.severity == "error" else "warning"
        out.append(f"::{command} {text}::{_escape_data(f.message)}")
    out.append(summary(len(files), *counts(findings)))
    return "\n".join(out) + "\n"


def artifact_location(path: str) -> dict[str, str]:
    """An absolute path as a file URI; a relative one as a relative URI against %SRCROOT%."""
    p = Path(path)
    if p.is_absolute():
        return {"uri": p.as_uri()}
    return {"uri": quote(p.as_posix()), "uriBaseId": "%SRCROOT%"}


def sarif_log(
    findings: Sequence[Finding], files: Sequence[str], tool_version: str, root: Path
) -> dict[str, Any]:
    """The SARIF 2.1.0 log of one lint run; relative paths are relative to ``root``."""
    codes = sorted({f.code for f in findings})
    results = []
    for f in findings:
        pos = position(f)
        physical: dict[str, Any] = {"artifactLocation": artifact_location(pos.path)}
        if pos.line is not None:
            region = {"startLine": pos.line}
            if pos.col is not None:
                region["startColumn"] = pos.col
            physical["region"] = region
        results.append(
            {
                "ruleId": f.code,
                "ruleIndex": codes.index(f.code),
                "level": "error" if f.severity == "error" else "warning",
                "message": {"text": f.message},
                "locations": [{"physicalLocation": physical}],
            }
        )
    run: dict[str, Any] = {
        "tool": {
            "driver": {
                "name": "moe-policy",
                "version": tool_version,
                "rules": [{"id": code, "name": code, "helpUri": CODES_DOC} for code in codes],
            }
        },
        "originalUriBaseIds": {"%SRCROOT%": {"uri": root.resolve().as_uri() + "/"}},
        "artifacts": [{"location": artifact_location(path)} for path in files],
        "columnKind": "unicodeCodePoints",
        "results": results,
    }
    return {"$schema": SARIF_SCHEMA, "version": SARIF_VERSION, "runs": [run]}


def to_sarif(findings: Sequence[Finding], files: Sequence[str]) -> str:
    from moe_policy._version import __version__

    return json.dumps(sarif_log(findings, files, __version__, Path.cwd()), indent=2) + "\n"


#: ``moe-policy lint --format`` -> renderer(findings, files), for every format but ``text``.
RENDERERS: Mapping[str, Callable[[Sequence[Finding], Sequence[str]], str]] = {
    "json": to_json,
    "lines": to_lines,
    "github": to_github,
    "sarif": to_sarif,
}


__all__ = [
    "RENDERERS",
    "Position",
    "artifact_location",
    "counts",
    "position",
    "sarif_log",
    "summary",
    "to_github",
    "to_json",
    "to_lines",
    "to_sarif",
]
