"""Explicit values from API arguments or CLI flags: the highest layer."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from moe_policy.core.keys import CONTEXT_KEYS, coerce_value
from moe_policy.errors import PolicyError, did_you_mean
from moe_policy.settings.base import Entry, Source, SourceOutput
from moe_policy.settings.schema import SETTINGS_KEYS, validate_setting

if TYPE_CHECKING:
    from moe_policy.core.catalog import Catalog


class ExplicitSource(Source):
    """Entries the caller built, each already carrying its origin (``api``, ``cli:--flag``)."""

    layer = "explicit"

    def __init__(self, entries: Sequence[Entry]) -> None:
        self.entries = tuple(entries)

    def __repr__(self) -> str:
        return f"ExplicitSource({[(e.key, e.value, str(e.origin)) for e in self.entries]!r})"

    def load(self, catalog: Catalog) -> SourceOutput:
        out = SourceOutput(self.layer)
        for entry in self.entries:
            if entry.key in SETTINGS_KEYS:
                value = validate_setting(entry.key, entry.value, entry.origin, catalog)
                out.settings.append(Entry(entry.key, value, entry.origin))
            elif entry.key in CONTEXT_KEYS:
                if CONTEXT_KEYS[entry.key].derived:
                    raise PolicyError(
                        f"{entry.key} is derived from other keys and cannot be set",
                        entry.origin,
                        key=entry.key,
                    )
                value = coerce_value(entry.key, entry.value, entry.origin)
                out.context.append(Entry(entry.key, value, entry.origin))
            else:
                known = (*SETTINGS_KEYS, *CONTEXT_KEYS)
                raise PolicyError(
                    f"unknown key {entry.key!r}{did_you_mean(entry.key, known)} "
                    f"(neither a setting nor a context key)",
                    entry.origin,
                    key=entry.key,
                )
        return out
