"""Explicit values from API arguments or CLI flags: the highest layer.

Their values pass the same typed validation as a model's config.json values
(``moe_policy.core.keys.coerce_value``): positive sizes, booleans that are booleans;
the checks across keys (``top_k <= num_experts``, ``ep_size <= num_experts``) run on the
assembled context (``moe_policy.core.facts``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from moe_policy.core.keys import CONTEXT_KEYS, coerce_value
from moe_policy.core.origin import Origin
from moe_policy.core.values import from_text
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
                if entry.value is None:
                    raise PolicyError(
                        f"{entry.key}: no value given (an override sets a value; leave the "
                        "key out to keep the model's or the default)",
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


#: The kind of text a setting's value is written in (``moe_policy.core.values.from_text``).
_SETTING_TEXT = {"bool": "bool", "backend_list": "list"}


def set_entry(item: str, origin: Origin) -> Entry:
    """One ``KEY=VALUE`` override (``--set``) as a typed entry: the value is read as the
    key's type (``moe_policy.core.values``: ASCII decimal integers, ``true``/``false``/``1``/``0``,
    ``MAJOR.MINOR``, ``[a, b]``; ``null`` for no value); no interpolation, no YAML."""
    key, sep, text = item.partition("=")
    key = key.strip()
    shown = item if len(item) <= 60 else item[:57] + "..."
    if not sep or not key:
        raise PolicyError(f"expected KEY=VALUE, got {shown!r}", origin)
    if key in SETTINGS_KEYS:
        kind = _SETTING_TEXT.get(SETTINGS_KEYS[key].type, "str")
    elif key in CONTEXT_KEYS:
        kind = CONTEXT_KEYS[key].type
    else:
        known = (*SETTINGS_KEYS, *CONTEXT_KEYS)
        raise PolicyError(
            f"unknown key {key!r}{did_you_mean(key, known)} (neither a setting nor a context key)",
            origin,
            key=key,
        )
    if not text.strip():
        hint = " (null switches it off)" if key == "audit.path" else ""
        raise PolicyError(f"{key}: no value after '='{hint}", origin, key=key)
    if "${" in text:
        raise PolicyError(
            f"{key}: interpolation (${{...}}) is not supported in --set values", origin, key=key
        )
    try:
        value = from_text(kind, text)
    except ValueError as exc:
        raise PolicyError(f"{key}: {exc}", origin, key=key) from None
    return Entry(key, value, origin)
