"""Environment interpolation in policy files: in ``audit.path`` only, of allowed names only.

A policy file is input, and the environment holds secrets. A policy may interpolate the
environment in one place, ``audit.path``, with OmegaConf's syntax ``${oc.env:NAME}`` or
``${oc.env:NAME,DEFAULT}``, and only variables in ``ALLOWED_VARIABLES``, so the one
value that reaches a record is the value of a documented setting. Any other ``${`` in a
value (another key, another variable, another resolver such as ``oc.decode`` or
``oc.select``, a node reference ``${a.b}``) is an ``interpolation-not-allowed`` error at
the value's file:line:col, naming what was written, never what the environment holds.
Loading and ``moe-policy lint`` run this same check (through ``parse_policy_document``).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any

from moe_policy.core.problems import ProblemSink
from moe_policy.core.yamlio import KeyPath, LoadedYaml

#: Variables ``audit.path`` may interpolate.
ALLOWED_VARIABLES = ("MOE_POLICY_AUDIT_DIR",)
#: The key paths whose values may interpolate them.
INTERPOLATED_KEYS: tuple[KeyPath, ...] = (("audit", "path"),)
CODE = "interpolation-not-allowed"

_REFERENCE = re.compile(
    r"\$\{\s*oc\.env\s*:\s*(?P<name>[A-Za-z_][A-Za-z0-9_]*)\s*"
    r"(?:,(?P<default>[^${}\\'\"]*))?\}"
)
_SHOWN = 60


def environment_used(environ: Mapping[str, str]) -> tuple[str | None, ...]:
    """The values interpolation can read from ``environ`` (what a parse depends on)."""
    return tuple(environ.get(name) for name in ALLOWED_VARIABLES)


def _dotted(keypath: KeyPath) -> str:
    out = ""
    for part in keypath:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(document)"


def _written(text: str, start: int) -> str:
    """The interpolation as written, from ``start`` to its closing brace (shortened)."""
    end = text.find("}", start)
    piece = text[start : end + 1] if end != -1 else text[start:]
    return piece if len(piece) <= _SHOWN else piece[: _SHOWN - 3] + "..."


def _strings(value: Any, keypath: KeyPath) -> Iterator[tuple[KeyPath, str]]:
    if isinstance(value, str):
        yield keypath, value
    elif isinstance(value, Mapping):
        for key, item in value.items():
            yield from _strings(item, (*keypath, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _strings(item, (*keypath, index))


def _expand(text: str, environ: Mapping[str, str]) -> tuple[str | None, str | None]:
    """(expanded text, None) or (None, why not)."""
    out: list[str] = []
    pos = 0
    while (start := text.find("${", pos)) != -1:
        match = _REFERENCE.match(text, start)
        if match is None:
            return None, (
                f"only ${{oc.env:NAME}} or ${{oc.env:NAME,DEFAULT}} may be interpolated here, "
                f"found {_written(text, start)!r}"
            )
        name, default = match["name"], match["default"]
        if name not in ALLOWED_VARIABLES:
            return None, (
                f"environment variable {name} may not be interpolated "
                f"(allowed: {', '.join(ALLOWED_VARIABLES)})"
            )
        value = environ.get(name, "")
        if not value.strip():
            if default is None:
                return None, (
                    f"{name} is not set and {_written(text, start)!r} gives no default "
                    f"(write ${{oc.env:{name},DEFAULT}})"
                )
            value = default.strip()
        out.extend((text[pos:start], value))
        pos = match.end()
    out.append(text[pos:])
    return "".join(out), None


def check_interpolations(
    loaded: LoadedYaml, sink: ProblemSink, environ: Mapping[str, str]
) -> dict[KeyPath, str | None]:
    """Every ``${`` of the document checked (findings into ``sink``). Returns, by key
    path, the expanded value of each allowed interpolation, and None for each refused one
    (a value that is not to be checked further: its finding is made)."""
    expanded: dict[KeyPath, str | None] = {}
    for keypath, text in _strings(loaded.data, ()):
        start = text.find("${")
        if start == -1:
            continue
        key = _dotted(keypath)
        origin = loaded.origin(keypath)
        if keypath not in INTERPOLATED_KEYS:
            expanded[keypath] = None
            sink.add(
                "error",
                CODE,
                f"{key}: interpolation is not allowed here ({_written(text, start)!r}); only "
                f"audit.path may name the environment, as ${{oc.env:{ALLOWED_VARIABLES[0]},DEFAULT}}",
                origin,
            )
            continue
        value, problem = _expand(text, environ)
        expanded[keypath] = value
        if problem is not None:
            sink.add("error", CODE, f"{key}: {problem}", origin)
    return expanded
