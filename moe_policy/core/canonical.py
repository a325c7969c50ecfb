"""Canonical JSON and content hashes: the same value gives the same text on every host."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from enum import Enum
from typing import Any


def canonical_json(obj: Any) -> str:
    """Deterministic JSON: sorted keys, no spaces, ASCII; tuples and sets as sorted lists."""
    return json.dumps(canonical(obj), sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def canonical(obj: Any) -> Any:
    """``obj`` as plain JSON data: mappings with string keys, sets sorted, enums as values."""
    if isinstance(obj, Mapping):
        return {str(k): canonical(v) for k, v in obj.items()}
    if isinstance(obj, (frozenset, set)):
        return sorted(canonical(v) for v in obj)
    if isinstance(obj, (list, tuple)):
        return [canonical(v) for v in obj]
    if isinstance(obj, Enum):
        return obj.value
    return obj


def sha256_hex(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()
