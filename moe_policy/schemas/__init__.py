"""The JSON Schemas (draft 2020-12) shipped with the package, by name.

* ``decision``: the decision record (``Decision.to_dict()``, ``moe-policy explain --json``).
* ``audit``: one audit line, a decision (the record plus timestamp, host, pid, rank,
  world_size and count) or the cross-rank agreement outcome (``kind: "agreement"``).
* ``policy``: a policy YAML file (every key the loader reads).
* ``matrix``: a deployment matrix for ``moe-policy plan``.

The files lie beside this module as ``<name>.v1.json``. :func:`schema` returns one
self-contained: a schema that refers to another file (the audit line reuses the decision
record's definitions) carries that file under ``$defs``, keyed by its file name, with
its own ``$id``, so a validator or an editor needs nothing else.

>>> schema("policy")["title"]
'moe_policy policy file, version 1'
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from importlib.resources import files
from typing import Any

from moe_policy.errors import PolicyError, did_you_mean

#: The schema names, in the order ``moe-policy schema --help`` lists them.
NAMES = ("decision", "audit", "policy", "matrix")
VERSION = 1


def file_name(name: str) -> str:
    """``audit`` -> ``audit.v1.json``."""
    return f"{name}.v{VERSION}.json"


def _read(file: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((files(__name__) / file).read_text(encoding="utf-8"))
    return loaded


def _external_refs(node: Any) -> Iterator[str]:
    """The files named by ``$ref`` values that point outside their own document."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref" and isinstance(value, str) and not value.startswith("#"):
                yield value.split("#", 1)[0]
            else:
                yield from _external_refs(value)
    elif isinstance(node, list):
        for item in node:
            yield from _external_refs(item)


def schema(name: str) -> dict[str, Any]:
    """The JSON Schema ``name`` (one of :data:`NAMES`), self-contained, as a new dict.

    Raises:
        PolicyError: for an unknown name, listing the known ones (did-you-mean).
    """
    if name not in NAMES:
        raise PolicyError(
            f"unknown schema {name!r}{did_you_mean(name, NAMES)}; known: {', '.join(NAMES)}",
            "api:name",
        )
    root = _read(file_name(name))
    pending = list(_external_refs(root))
    bundled: dict[str, Any] = {}
    while pending:
        file = pending.pop()
        if file in bundled:
            continue
        bundled[file] = _read(file)
        pending.extend(_external_refs(bundled[file]))
    if bundled:
        root.setdefault("$defs", {}).update(bundled)
    return root


__all__ = ["NAMES", "file_name", "schema"]
