"""Decide every deployment under an old and a new policy set; keep only what changes.

Selector construction (settings, model, context) is the cost, so each distinct
(policy set, model, platform and context values, environment, engine) builds one
Selector whose decisions serve every deployment and layer kind that shares it;
identical policy sets share their Selectors, model configs are read once, and every
YAML file is parsed once per plan (``yamlio.memoized``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from moe_policy.api import Selector
from moe_policy.core.decision import Decision
from moe_policy.core.model import ModelFacts, load_model
from moe_policy.core.origin import Origin
from moe_policy.core.yamlio import memoized
from moe_policy.errors import BackendOverrideError, MoEPolicyError, NoFeasibleBackendError
from moe_policy.planning.matrix import Deployment
from moe_policy.settings import Entry

#: (id, origin) of a rule a change is attributed to.
RuleRef = tuple[str, str]


@dataclass(frozen=True)
class RuleState:
    matched: bool
    applied: bool
    effect: str
    action: str
    origin: str

    @property
    def status(self) -> tuple[bool, bool]:
        return (self.matched, self.applied)

    def describe(self) -> str:
        if not self.matched:
            return "not matched"
        return (
            f"matched, {'applied' if self.applied else 'not applied'} ({self.action} {self.effect})"
        )


@dataclass(frozen=True)
class Outcome:
    """What one layer of one deployment does under one policy set."""

    backend: str | None
    experts_class: str | None
    outcome: str
    override: str | None = None
    refuses: str | None = None
    error: str | None = None
    rules: Mapping[str, RuleState] = field(default_factory=dict)
    candidate_rules: Mapping[str, RuleRef] = field(default_factory=dict)

    @classmethod
    def from_decision(cls, decision: Decision, rename: Mapping[str, str]) -> Outcome:
        rules = {
            r.id: RuleState(r.matched, r.applied, r.effect, r.action, _show(r.origin, rename))
            for r in decision.rules
        }
        candidate_rules = {
            c.backend: (c.rule, rules[c.rule].origin if c.rule in rules else "")
            for c in decision.candidates
            if c.rule
        }
        override = refuses = None
        o = decision.override
        if o is not None:
            override = (
                f"{o.requested} from {_show(o.origin, rename)} -> {o.selected or 'nothing'}: "
                f"{o.reason_code.value} (pass {o.pass_name})"
            )
            if decision.mode == "strict":
                refuses = (
                    f"refuses to start: {o.requested} from {_show(o.origin, rename)} "
                    f"is infeasible ({o.reason_code.value})"
                )
        if decision.backend is None and refuses is None:
            refuses = "refuses to start: no feasible backend"
        return cls(
            decision.backend,
            decision.experts_class,
            decision.outcome.value,
            override,
            refuses,
            None,
            rules,
            candidate_rules,
        )

    @classmethod
    def from_error(cls, exc: MoEPolicyError) -> Outcome:
        return cls(
            None, None, "refused", refuses=f"refuses to start: {exc}", error=type(exc).__name__
        )


def _show(origin: str, rename: Mapping[str, str]) -> str:
    for real, shown in rename.items():
        if origin.startswith(f"file:{real}"):
            return shown + origin[len(f"file:{real}") :]
    return origin


@dataclass(frozen=True)
class Change:
    """One field that differs between the old and the new outcome."""

    field: str
    old: Any
    new: Any
    rules: tuple[RuleRef, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "field": self.field,
            "old": self.old,
            "new": self.new,
            "rules": [{"id": i, "origin": o} for i, o in self.rules],
        }


@dataclass(frozen=True)
class Cell:
    """One deployment x platform x layer kind whose outcome changes."""

    deployment: str
    model: str
    platform: str
    layer: str
    old: Outcome
    new: Outcome
    changes: tuple[Change, ...]
    #: The deployment as a table shows it: ``name (model)`` when it lists several models.
    label: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "deployment": self.deployment,
            "model": self.model,
            "platform": self.platform,
            "layer": self.layer,
            "old": _outcome_dict(self.old),
            "new": _outcome_dict(self.new),
            "changes": [c.to_dict() for c in self.changes],
        }


def _outcome_dict(o: Outcome) -> dict[str, Any]:
    return {
        "backend": o.backend,
        "experts_class": o.experts_class,
        "outcome": o.outcome,
        "override": o.override,
        "refuses": o.refuses,
    }


@dataclass(frozen=True)
class Plan:
    """Every changing cell, and how many cells were decided."""

    cells: tuple[Cell, ...]
    decided: int
    deployments: int
    selectors: int

    @property
    def changed(self) -> bool:
        return bool(self.cells)

    def to_dict(self) -> dict[str, Any]:
        return {
            "changed": self.changed,
            "decided": self.decided,
            "deployments": self.deployments,
            "changes": [c.to_dict() for c in self.cells],
        }


def _rule_changes(old: Outcome, new: Outcome) -> list[Change]:
    changes = []
    for rule_id in [*old.rules, *(r for r in new.rules if r not in old.rules)]:
        before, after = old.rules.get(rule_id), new.rules.get(rule_id)
        # A rule that does not match is no change, whether it exists or not.
        was = before.status if before is not None else (False, False)
        now = after.status if after is not None else (False, False)
        if was == now:
            continue
        ref = (rule_id, (after or before).origin)  # type: ignore[union-attr]
        changes.append(
            Change(
                "rule",
                before.describe() if before else "absent",
                after.describe() if after else "absent",
                (ref,),
            )
        )
    return changes


def compare(old: Outcome, new: Outcome) -> tuple[Change, ...]:
    """The changes from ``old`` to ``new``, each attributed to the rules behind it."""
    rule_changes = _rule_changes(old, new)
    because = tuple(ref for c in rule_changes for ref in c.rules)

    def attributed(*backends: str | None) -> tuple[RuleRef, ...]:
        refs = list(because)
        for outcome in (old, new):
            for backend in backends:
                ref = outcome.candidate_rules.get(backend or "")
                if ref and ref not in refs:
                    refs.append(ref)
        return tuple(refs)

    changes: list[Change] = []
    if old.backend != new.backend:
        changes.append(
            Change("backend", old.backend, new.backend, attributed(old.backend, new.backend))
        )
    if old.experts_class != new.experts_class:
        changes.append(Change("experts_class", old.experts_class, new.experts_class, because))
    if old.outcome != new.outcome:
        changes.append(Change("outcome", old.outcome, new.outcome, because))
    if old.override != new.override:
        kind = "override warning " + (
            "vanishes" if new.override is None else "appears" if old.override is None else "changes"
        )
        changes.append(
            Change(kind, old.override, new.override, attributed(old.backend, new.backend))
        )
    if old.refuses != new.refuses:
        changes.append(Change("refusal", old.refuses, new.refuses, because))
    return (*changes, *rule_changes)


class Planner:
    """Decides deployments under policy sets, reusing Selectors and model configs."""

    def __init__(self, rename: Mapping[str, str] | None = None) -> None:
        self.rename = dict(rename or {})
        self._models: dict[str, ModelFacts] = {}
        self._selectors: dict[Any, Selector | MoEPolicyError] = {}
        self._outcomes: dict[Any, Outcome] = {}

    @property
    def selectors(self) -> int:
        return len(self._selectors)

    def _model(self, path: str) -> ModelFacts:
        facts = self._models.get(path)
        if facts is None:
            facts = self._models[path] = load_model(Path(path))
        return facts

    def _selector(
        self, files: tuple[str, ...], files_origin: Origin, d: Deployment
    ) -> Selector | MoEPolicyError:
        key = (files, d.model_path, d.values, d.env, d.engine)
        found = self._selectors.get(key)
        if found is None:
            origin = Origin.file(d.source) if d.source else Origin.api()
            entries = [
                Entry(k, list(v) if isinstance(v, tuple) else v, origin) for k, v in d.values
            ]
            try:
                found = Selector(
                    self._model(d.model_path),
                    policy_files=list(files),
                    environ=dict(d.env),
                    explicit=entries,
                    files_origin=files_origin,
                    engine=d.engine,
                )
            except (BackendOverrideError, NoFeasibleBackendError) as exc:
                found = exc
            self._selectors[key] = found
        return found

    def outcome(
        self, files: tuple[str, ...], files_origin: Origin, d: Deployment, layer: str
    ) -> Outcome:
        """The outcome of one layer kind of ``d`` under the policy ``files``."""
        key = (files, d.model_path, d.values, d.env, d.engine, layer)
        found = self._outcomes.get(key)
        if found is None:
            selector = self._selector(files, files_origin, d)
            if isinstance(selector, MoEPolicyError):
                found = Outcome.from_error(selector)
            else:
                try:
                    found = Outcome.from_decision(selector.decide(None, layer), self.rename)
                except (BackendOverrideError, NoFeasibleBackendError) as exc:
                    found = Outcome.from_error(exc)
            self._outcomes[key] = found
        return found


def plan(
    deployments: Sequence[Deployment],
    old_files: Sequence[str],
    new_files: Sequence[str],
    *,
    rename: Mapping[str, str] | None = None,
    old_origin: Origin | None = None,
    new_origin: Origin | None = None,
    planner: Planner | None = None,
) -> Plan:
    """Every cell whose outcome differs between the policy sets ``old_files`` and ``new_files``.

    A bad policy (``PolicyError``) propagates; refusals and no feasible backend are outcomes.
    """
    with memoized():
        return _plan(deployments, old_files, new_files, rename, old_origin, new_origin, planner)


def _plan(
    deployments: Sequence[Deployment],
    old_files: Sequence[str],
    new_files: Sequence[str],
    rename: Mapping[str, str] | None,
    old_origin: Origin | None,
    new_origin: Origin | None,
    planner: Planner | None,
) -> Plan:
    planner = planner or Planner(rename)
    old_key, new_key = tuple(map(str, old_files)), tuple(map(str, new_files))
    old_origin = old_origin or Origin.cli("--from")
    new_origin = new_origin or Origin.cli("--to")
    cells: list[Cell] = []
    decided = 0
    models: dict[str, set[str]] = {}
    for d in deployments:
        models.setdefault(d.name, set()).add(d.model)
    for d in deployments:
        label = f"{d.name} ({d.model})" if len(models[d.name]) > 1 else d.name
        for layer in d.layers:
            decided += 1
            before = planner.outcome(old_key, old_origin, d, layer)
            after = planner.outcome(new_key, new_origin, d, layer)
            if before == after:
                continue
            changes = compare(before, after)
            if changes:
                cells.append(
                    Cell(d.name, d.model, d.platform, layer, before, after, changes, label)
                )
    return Plan(tuple(cells), decided, len(deployments), planner.selectors)
