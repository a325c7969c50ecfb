"""Layered settings with provenance.

Precedence is the order of ``SOURCES`` (later wins), the same direction as the
architecture: built-in ``configs/default.yaml`` < policy files (in order) <
environment < explicit API/CLI arguments. Every resolved key keeps its winning
origin and the values it beat. Rules accumulate across layers; a later rule with
the same id replaces the earlier one.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from moe_policy.core.canonical import canonical_json, sha256_hex
from moe_policy.core.decision import Notice, Request
from moe_policy.core.engines import MOE_POLICY, EngineProfile
from moe_policy.core.origin import Origin
from moe_policy.core.policy import Policy
from moe_policy.core.rules import Rule
from moe_policy.core.state import STATE
from moe_policy.settings.base import Entry, FileInfo, Source, SourceOutput
from moe_policy.settings.builtin import BuiltinSource
from moe_policy.settings.env import EnvSource
from moe_policy.settings.explicit import ExplicitSource
from moe_policy.settings.policy_files import PolicyFilesSource

if TYPE_CHECKING:
    from moe_policy.core.catalog import Catalog

#: Settings a Decision carries for what happens after it (agreement check, audit).
RUN_SETTINGS = ("consistency", "audit.path", "audit.required", "mode")

#: The precedence, lowest first.
SOURCES: tuple[type[Source], ...] = (BuiltinSource, PolicyFilesSource, EnvSource, ExplicitSource)

__all__ = [
    "RUN_SETTINGS",
    "SOURCES",
    "Entry",
    "EnvSource",
    "ExplicitSource",
    "FileInfo",
    "Resolved",
    "Settings",
    "resolve_settings",
]


@dataclass(frozen=True)
class Resolved:
    """A key's winning value and origin, and every value it beat (earliest first)."""

    key: str
    value: Any
    origin: str
    layer: str
    history: tuple[tuple[Any, str, str], ...] = ()


@dataclass(frozen=True)
class Settings:
    """The merged result of every layer."""

    values: Mapping[str, Resolved]
    context: Mapping[str, Resolved]
    rules: tuple[Rule, ...]
    replaced_rules: tuple[tuple[Rule, Rule], ...]
    notices: tuple[Notice, ...]
    files: tuple[FileInfo, ...]
    layers: tuple[str, ...]
    #: Packages an engine switch takes out (``VLLM_USE_DEEP_GEMM=0``): (package, origin).
    switched_off: tuple[tuple[str, str], ...] = ()

    def value(self, key: str, default: Any = None) -> Any:
        resolved = self.values.get(key)
        return resolved.value if resolved is not None else default

    @property
    def mode(self) -> str:
        return str(self.value("mode", "warn"))

    @property
    def request(self) -> Request | None:
        resolved = self.values.get("backend")
        if resolved is None or resolved.value in (None, "auto"):
            return None
        return Request(resolved.value, resolved.origin)

    def priority(self, platform: str) -> tuple[str, ...]:
        return tuple(self.value(f"priority.{platform}", ()))

    def policy(self) -> Policy:
        """What the resolver decides under, as one value."""
        return Policy(
            rules=self.rules,
            priorities={
                key.removeprefix("priority."): tuple(resolved.value)
                for key, resolved in self.values.items()
                if key.startswith("priority.")
            },
            digest=self.policy_digest(),
            files=tuple((f.path, f.sha256 or "") for f in self.files if f.found),
            notices=self.notices,
            run_settings={
                key: (self.values[key].value, self.values[key].origin)
                for key in RUN_SETTINGS
                if key in self.values
            },
        )

    def policy_digest(self) -> str:
        """sha256 of what decides (rules, priority lists, mode); no paths, no audit settings."""
        priority = tuple(
            (k, tuple(v.value)) for k, v in self.values.items() if k.startswith("priority.")
        )
        # Keyed by the rule objects themselves (held by the entry, so their ids stay
        # theirs): equal-comparing operands such as 1 and true must not share a digest.
        key = (self.mode, priority, tuple(map(id, self.rules)))
        found = STATE.policy_digests.get(key)
        if found is None:
            if len(STATE.policy_digests) >= 256:
                STATE.policy_digests.clear()
            found = STATE.policy_digests[key] = (
                self.rules,
                _policy_digest(self.mode, priority, self.rules),
            )
        return found[1]


def _policy_digest(
    mode: str, priority: tuple[tuple[str, tuple[Any, ...]], ...], rules: tuple[Rule, ...]
) -> str:
    """sha256 of what decides."""
    decisive = {
        "mode": mode,
        "priority": {k: list(v) for k, v in priority},
        "rules": [
            {
                "id": r.id,
                "effect": r.effect,
                "action": r.action,
                "backends": list(r.backends),
                "when": [[c.key, c.op, c.operand] for c in r.conditions],
            }
            for r in rules
        ],
    }
    return sha256_hex(canonical_json(decisive))


def _merge(into: dict[str, Resolved], entries: Sequence[Entry], layer: str) -> None:
    for entry in entries:
        previous = into.get(entry.key)
        history: tuple[tuple[Any, str, str], ...] = ()
        if previous is not None:
            history = (*previous.history, (previous.value, previous.origin, previous.layer))
        into[entry.key] = Resolved(entry.key, entry.value, str(entry.origin), layer, history)


def resolve_settings(
    catalog: Catalog,
    *,
    policy_files: Sequence[str] | None = None,
    environ: Mapping[str, str] | None = None,
    explicit: Sequence[Entry] = (),
    files_origin: Origin | None = None,
    engine: EngineProfile = MOE_POLICY,
) -> Settings:
    """Read every layer in ``SOURCES`` order and merge them with provenance.

    ``policy_files`` given explicitly replace ``MOE_POLICY_FILES`` (which is then
    reported as ignored); ``environ`` replaces ``os.environ`` (tests, other hosts).
    """
    env = EnvSource(environ, engine=engine)
    notices: list[Notice] = []
    if isinstance(policy_files, (str, os.PathLike)):  # one file, not its characters
        policy_files = [os.fspath(policy_files)]
    if policy_files is not None:
        origin = files_origin or Origin.api("policy_files")
        files = [(str(p), origin) for p in policy_files]
        if env.policy_files():
            notices.append(
                Notice(
                    "MOE_POLICY_FILES",
                    str(Origin.env("MOE_POLICY_FILES")),
                    f"ignored: policy files were given explicitly ({origin})",
                )
            )
    else:
        files = env.policy_files()
    sources: dict[type[Source], Source] = {
        BuiltinSource: BuiltinSource(engine),
        PolicyFilesSource: PolicyFilesSource(files, env.environ),
        EnvSource: env,
        ExplicitSource: ExplicitSource(explicit),
    }
    values: dict[str, Resolved] = {}
    context: dict[str, Resolved] = {}
    rules: dict[str, Rule] = {}
    replaced: list[tuple[Rule, Rule]] = []
    infos: list[FileInfo] = []
    layers: list[str] = []
    switched_off: list[tuple[str, str]] = []
    for source_type in SOURCES:
        out: SourceOutput = sources[source_type].load(catalog)
        layers.append(out.layer)
        _merge(values, out.settings, out.layer)
        _merge(context, out.context, out.layer)
        for rule in out.rules:
            if rule.id in rules:
                replaced.append((rules[rule.id], rule))
            rules[rule.id] = rule
        notices.extend(out.notices)
        infos.extend(out.files)
        switched_off.extend((str(e.value), str(e.origin)) for e in out.switched_off)
    return Settings(
        values=values,
        context=context,
        rules=tuple(rules.values()),
        replaced_rules=tuple(replaced),
        notices=tuple(notices),
        files=tuple(infos),
        layers=tuple(layers),
        switched_off=tuple(switched_off),
    )
