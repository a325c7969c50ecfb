"""Settings keys, their types, and validation of a policy document.

The same parser serves loading (first error raises) and ``moe-policy lint``
(every problem collected), so the two can never disagree.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from moe_policy.core.keys import PLATFORMS
from moe_policy.core.origin import Origin
from moe_policy.core.problems import ProblemSink
from moe_policy.core.rules import ItemOrigin, Rule, line_col, parse_rule
from moe_policy.core.values import bool_from_text, parse_bool
from moe_policy.core.yamlio import LoadedYaml
from moe_policy.errors import PolicyError, did_you_mean
from moe_policy.settings.base import Entry
from moe_policy.settings.interpolation import check_interpolations

if TYPE_CHECKING:
    from moe_policy.core.catalog import Catalog

MODES = ("warn", "strict")
CONSISTENCY = ("error", "warn")
POLICY_VERSION = 1
TOP_LEVEL_KEYS = ("version", "backend", "mode", "audit", "consistency", "priority", "rules")
AUDIT_KEYS = ("path", "required")


@dataclass(frozen=True)
class SettingSpec:
    type: str  # backend | choice | str | bool | backend_list
    description: str
    choices: tuple[str, ...] = ()


SETTINGS_KEYS: Mapping[str, SettingSpec] = {
    "backend": SettingSpec("backend", "explicit backend request, or auto"),
    "mode": SettingSpec("choice", "warn: override with a warning; strict: refuse", MODES),
    "audit.path": SettingSpec("str", "JSON-lines audit file (null: off)"),
    "audit.required": SettingSpec("bool", "an audit line that cannot be written is an error"),
    "consistency": SettingSpec("choice", "cross-rank disagreement: error or warn", CONSISTENCY),
    **{
        f"priority.{platform}": SettingSpec("backend_list", f"auto order on {platform}")
        for platform in PLATFORMS
    },
}


def validate_setting(
    key: str,
    value: Any,
    origin: Origin | str,
    catalog: Catalog,
    *,
    as_text: bool = False,
    item_origin: ItemOrigin | None = None,
) -> Any:
    """Normalise a settings value; PolicyError names the key, the value and the origin.

    ``as_text``: the value is written as text (an environment variable), so a boolean is
    ``true``/``false``/``1``/``0``; otherwise (files, API, ``--set``) it must be typed.
    ``item_origin(index)``: where each item of a list value is written (a policy file), so
    an error about one backend of a priority list names that item's file:line:col."""
    spec = SETTINGS_KEYS.get(key)
    if spec is None:
        raise PolicyError(
            f"unknown setting {key!r}{did_you_mean(key, SETTINGS_KEYS)}",
            origin,
            key=key,
            code="unknown-key",
        )
    if spec.type == "backend":
        if not isinstance(value, str) or not value.strip():
            raise PolicyError(
                f"{key}: expected a backend name or 'auto', got {value!r}", origin, key=key
            )
        name = value.strip().lower().replace("-", "_")
        # a backend of the engine's other oracles is a request this layer cannot run (the
        # request pass overrides it, loudly), not an unknown name
        if name != "auto" and name not in catalog.policy_names:
            raise PolicyError(
                f"unknown MoE backend {value!r}"
                f"{did_you_mean(name, (*catalog.policy_names, 'auto'))}; "
                f"known: auto, {', '.join(catalog.policy_names)}",
                origin,
                key=key,
                code="unknown-backend",
            )
        return name
    if spec.type == "choice":
        text = str(value).strip().lower() if isinstance(value, str) else value
        if text not in spec.choices:
            raise PolicyError(
                f"{key}: expected one of {', '.join(spec.choices)}, got {value!r}"
                f"{did_you_mean(str(value), spec.choices)}",
                origin,
                key=key,
            )
        return text
    if spec.type == "bool":
        try:
            return bool_from_text(value) if as_text else parse_bool(value)
        except ValueError as exc:
            raise PolicyError(f"{key}: {exc}", origin, key=key) from None
    if spec.type == "str":
        if value is None:
            return None
        if not isinstance(value, str):
            raise PolicyError(f"{key}: expected a string or null, got {value!r}", origin, key=key)
        if not value.strip():
            raise PolicyError(
                f"{key}: an empty value is not a path (null switches the audit off)",
                origin,
                key=key,
            )
        return value
    if spec.type == "backend_list":
        if not isinstance(value, (list, tuple)):
            raise PolicyError(
                f"{key}: expected a list of backend names, got {value!r}", origin, key=key
            )
        for index, name in enumerate(value):
            if not isinstance(name, str):
                raise PolicyError(
                    f"{key}: expected a list of backend names, got {value!r}",
                    origin if item_origin is None else item_origin(index),
                    key=key,
                )
        first: dict[str, int] = {}
        for index, name in enumerate(value):
            where = origin if item_origin is None else item_origin(index)
            if name not in catalog.policy_names:
                raise PolicyError(
                    f"{key}: unknown backend {name!r}{did_you_mean(name, catalog.policy_names)}",
                    where,
                    key=key,
                    code="unknown-backend",
                )
            if name in first:
                earlier = (
                    f"; first at {line_col(item_origin(first[name]))}"
                    if item_origin is not None
                    else f" (items {first[name] + 1} and {index + 1})"
                )
                raise PolicyError(
                    f"{key} lists {name} twice{earlier}",
                    where,
                    key=key,
                    code="duplicate-backend",
                )
            first[name] = index
        return tuple(value)
    raise AssertionError(spec.type)


def parse_policy_document(
    loaded: LoadedYaml,
    catalog: Catalog,
    sink: ProblemSink,
    *,
    environ: Mapping[str, str] | None = None,
) -> tuple[list[Entry], list[Rule]]:
    """Settings entries and rules of one policy document, each with file:line:col.

    Interpolation is checked first (``settings.interpolation``): ``audit.path`` may read
    ``environ`` (None: ``os.environ``), nothing else may name the environment."""
    data = loaded.data
    entries: list[Entry] = []
    rules: list[Rule] = []
    if data is None:
        return entries, rules
    if not isinstance(data, Mapping):
        sink.add(
            "error",
            "invalid-type",
            f"a policy file must be a mapping, got {type(data).__name__}",
            loaded.origin(()),
        )
        return entries, rules

    expanded = check_interpolations(loaded, sink, os.environ if environ is None else environ)

    def at(path: tuple[Any, ...], at_key: bool = False) -> Origin:
        return loaded.origin(path, at_key=at_key)

    def add(key: str, value: Any, path: tuple[Any, ...]) -> None:
        if path in expanded:
            value = expanded[path]
            if value is None:  # a refused interpolation, already a finding
                return
        origin = at(path)
        try:
            value = validate_setting(
                key, value, origin, catalog, item_origin=lambda index: at((*path, index))
            )
        except PolicyError as exc:
            sink.add("error", exc.code, exc.message, exc.origin or origin)
            return
        entries.append(Entry(key, value, origin))

    def known_items(
        key: str, value: Any, allowed: tuple[str, ...], expected: str, unknown: Callable[[str], str]
    ) -> Iterator[tuple[str, Any]]:
        """The entries of a nested mapping whose names are allowed; the rest are findings."""
        if not isinstance(value, Mapping):
            sink.add(
                "error", "invalid-type", f"{key}: expected {expected}, got {value!r}", at((key,))
            )
            return
        for name, item in value.items():
            if name not in allowed:
                sink.add(
                    "error",
                    "unknown-key",
                    unknown(name) + did_you_mean(str(name), allowed),
                    loaded.origin((key, name), at_key=True),
                )
                continue
            yield name, item

    for key, value in data.items():
        if key not in TOP_LEVEL_KEYS:
            sink.add(
                "error",
                "unknown-key",
                f"unknown key {key!r}{did_you_mean(str(key), TOP_LEVEL_KEYS)} "
                f"(expected {', '.join(TOP_LEVEL_KEYS)})",
                loaded.origin((key,), at_key=True),
            )
            continue
        if key == "version":
            if type(value) is not int or value != POLICY_VERSION:
                sink.add(
                    "error",
                    "invalid-value",
                    f"version: expected {POLICY_VERSION}, got {value!r}",
                    at((key,)),
                )
        elif key in ("backend", "mode", "consistency"):
            add(key, value, (key,))
        elif key == "audit":
            for sub, subvalue in known_items(
                key,
                value,
                AUDIT_KEYS,
                f"a mapping with {', '.join(AUDIT_KEYS)}",
                lambda name: f"unknown key 'audit.{name}'",
            ):
                add(f"audit.{sub}", subvalue, (key, sub))
        elif key == "priority":
            for platform, order in known_items(
                key,
                value,
                PLATFORMS,
                "a mapping of platform -> backends",
                lambda name: f"priority: unknown platform {name!r}",
            ):
                add(f"priority.{platform}", order, (key, platform))
        elif key == "rules":
            if not isinstance(value, list):
                sink.add(
                    "error",
                    "invalid-type",
                    f"rules: expected a list of rules, got {value!r}",
                    at((key,)),
                )
                continue
            seen: dict[str, str] = {}
            for index, raw in enumerate(value):
                rule = parse_rule(raw, at, ("rules", index), catalog.policy_names, sink)
                if rule is None:
                    continue
                if rule.id in seen:
                    sink.add(
                        "error",
                        "duplicate-rule",
                        f"rule id {rule.id!r} already used at {seen[rule.id]}",
                        rule.origin,
                    )
                    continue
                seen[rule.id] = rule.origin
                rules.append(rule)
    return entries, rules
