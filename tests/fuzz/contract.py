"""The contract every command line keeps, whatever its input (README "Exit codes").

- The exit code is documented: explain and backends 0/2/3/4, lint 0/1/2, diff and plan
  also 1 (changes found).
- Exit 2 prints exactly one line that is not a JSON event, ``moe-policy: error: ORIGIN: ...``
  where ORIGIN names the file, variable or flag (``file:PATH[:LINE:COL]``, ``env:NAME``,
  ``cli:--flag``, ``cli:COMMAND`` for a positional argument, ...).
- Exit 0 leaves stderr to JSON events (stderr is not a terminal), nothing else.
- No traceback, no hang, peak resident memory under :data:`PEAK_MB`.
- The secret in every case's environment appears in no output and no file the run wrote.
"""

from __future__ import annotations

import json
import re

from tests.fuzz.pool import SECRET_VALUE, Outcome

PEAK_MB = 300
EXIT_CODES = {
    "explain": {0, 2, 3, 4},
    "backends": {0, 2, 3, 4},
    "lint": {0, 1, 2},
    "diff": {0, 1, 2, 3, 4},
    "plan": {0, 1, 2, 3, 4},
}
#: ``moe-policy: error: <origin>: message``; the origin kinds of moe_policy.core.origin.
ERROR_LINE = re.compile(
    r"^moe-policy: error: (file:.+?|env:[^\s:]+|cli:[^\s:]+|api:?\S*|default|probe:?\S*|derived:\S+)(: | \()"
)


def command_of(argv: tuple[str, ...]) -> str:
    return next((a for a in argv if not a.startswith("-")), "")


def error_lines(stderr: str) -> list[str]:
    """stderr lines that are not JSON events."""
    lines = []
    for line in stderr.splitlines():
        if not line.strip():
            continue
        try:
            if isinstance(json.loads(line), dict):
                continue
        except ValueError:
            pass
        lines.append(line)
    return lines


def violations(outcome: Outcome) -> list[str]:
    """What ``outcome`` broke of the contract (empty: it kept it)."""
    found: list[str] = []
    if outcome.timed_out:
        return ["hang"]
    if outcome.traceback:
        kind = "memory" if "MemoryError" in outcome.traceback else "traceback"
        return [f"{kind}: {outcome.exception or outcome.traceback.strip().splitlines()[-1][:300]}"]
    if "Traceback (most recent call last)" in outcome.stdout + outcome.stderr:
        found.append("traceback printed")
    command = command_of(outcome.case.argv)
    allowed = EXIT_CODES.get(command, {0, 2})
    if outcome.rc not in allowed:
        found.append(
            f"exit code {outcome.rc} (allowed for {command or 'no command'}: {sorted(allowed)})"
        )
    if outcome.rc == 2:
        lines = error_lines(outcome.stderr)
        if len(lines) != 1:
            found.append(f"exit 2 with {len(lines)} error lines: {lines[:3]!r}")
        elif not ERROR_LINE.match(lines[0]):
            found.append(f"error line without an origin: {lines[0][:300]!r}")
    if outcome.rc == 0 and "--log-format" not in outcome.case.argv:
        stray = error_lines(outcome.stderr)  # not a terminal: events are JSON lines
        if stray:
            found.append(f"exit 0 with stderr lines that are not JSON events: {stray[:2]!r}")
    if outcome.peak_kb > PEAK_MB * 1024:
        found.append(f"peak memory {outcome.peak_kb // 1024} MB")
    if SECRET_VALUE in outcome.stdout + outcome.stderr:
        found.append("the secret's value was printed")
    for name, data in outcome.left.items():
        if SECRET_VALUE.encode() in data:
            found.append(f"the secret's value was written to {name}")
    return found


def failure_class(violation: str) -> str:
    """A short class name for counting (``traceback: ValueError``, ``hang``, ...)."""
    head, _, rest = violation.partition(": ")
    if head in ("traceback", "memory"):
        return f"{head}: {rest}"
    if head.startswith("the secret"):
        return "the secret's value leaked"
    return re.sub(r"\d+", "N", head)[:60]
