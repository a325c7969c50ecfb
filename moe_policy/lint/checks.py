"""Policy lint: structural problems (the loader's own parser) plus semantic checks.

Structural findings come from ``parse_policy_document`` with a collecting
``ProblemSink``, so lint and loading can never disagree: malformed YAML, unknown
keys, unknown backends (did-you-mean), unknown context keys, invalid values, and
``interpolation-not-allowed`` (``settings.interpolation``: ``${...}`` outside
``audit.path``, or naming a variable other than ``MOE_POLICY_AUDIT_DIR``). A file past
the YAML limits (``core.yamlbounds``) or unreadable is one finding.

Semantic checks, per file, in rule order:

* ``shadowed-rule``: an earlier enforced rule that always holds when this one does
  (unconditional, or with a subset of its conditions) already forbids every backend
  this rule names, or requires none of them: this rule can never change anything.
* ``conflicting-rules``: two enforced rules that can match the same context
  (``moe_policy.lint.overlap``) and contradict each other: prefer A vs forbid A, require
  only forbidden backends, disjoint requires (errors); prefer vs demote of the same
  backend (warning: the later rule wins).
* ``rule-never-matches``: a rule whose conditions contradict each other
  (``parallel.tp: {gt: 4, lt: 5}``, a compute capability on a platform without one).
* ``require-no-backend``: a require rule that, on some platform it can match,
  leaves no backend the catalog can run there (platform, compute capability, LoRA).
  A required backend is rankable even when the priority list leaves it out.
* ``forbid-no-backend``: a forbid rule that, with the forbids that always hold when it
  does, leaves no backend the catalog can run on some platform it can match, or none
  that auto selection ranks (the priority list, or named by a prefer or require rule).
* ``priority-unreachable`` (warning): a priority list naming a backend that never
  runs on that platform.

For an engine with one oracle per quantization (vLLM), the catalog checks skip a rule
that cannot match a layer of the oracle linted (``model.quantization``): its backends
are another oracle's.

Version-added: 0.1.0.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from moe_policy.core.catalog import BackendSpec, Catalog, load_catalog
from moe_policy.core.engines import MOE_POLICY, EngineProfile, oracle_for
from moe_policy.core.keys import PLATFORMS, QUANT_ACTIVATIONS, QUANTIZATIONS, parse_capability
from moe_policy.core.origin import Origin
from moe_policy.core.problems import ProblemSink
from moe_policy.core.rules import Condition, Rule
from moe_policy.core.values import is_decimal
from moe_policy.core.yamlio import LoadedYaml, load_yaml_file
from moe_policy.errors import PolicyError
from moe_policy.lint.overlap import satisfiable, values_allowed
from moe_policy.settings.base import Entry
from moe_policy.settings.schema import parse_policy_document


@dataclass(frozen=True)
class Finding:
    """One lint finding: severity, code, message and where (``file:PATH:LINE:COL``)."""

    severity: str
    code: str
    message: str
    origin: str

    @property
    def location(self) -> str:
        """``PATH:LINE:COL`` (the origin without its ``file:`` prefix)."""
        return self.origin.removeprefix("file:")

    def sort_key(self) -> tuple[str, int, int, str]:
        path, line, col = self.location, 0, 0
        parts = self.location.rsplit(":", 2)
        if len(parts) == 3 and is_decimal(parts[1]) and is_decimal(parts[2]):
            path, line, col = parts[0], int(parts[1]), int(parts[2])
        return path, line, col, self.code

    def to_dict(self) -> dict[str, Any]:
        return {
            "severity": self.severity,
            "code": self.code,
            "message": self.message,
            "location": self.location,
            "origin": self.origin,
        }


# ---------------------------------------------------------------- rule checks


def _implies(earlier: Rule, later: Rule) -> bool:
    """``earlier`` holds whenever ``later`` does (its conditions are a subset)."""
    return set(earlier.conditions) <= set(later.conditions)


def _where(rule: Rule) -> str:
    return f"rule {rule.id!r} ({rule.origin})"


class _EarlierRules:
    """The enforced rules seen so far, indexed so that a later rule is compared only with
    those it can shadow or contradict: a policy of thousands of rules is not checked pair
    by pair."""

    def __init__(self) -> None:
        self.by_effect: dict[str, list[int]] = {}
        self.by_backend: dict[tuple[str, str], list[int]] = {}

    def add(self, index: int, rule: Rule) -> None:
        self.by_effect.setdefault(rule.effect, []).append(index)
        for name in set(rule.backends) or {""}:  # "": a rule left without backends by an error
            self.by_backend.setdefault((rule.effect, name), []).append(index)

    def naming(self, effect: str, backends: Sequence[str]) -> set[int]:
        """Earlier ``effect`` rules naming one of ``backends`` or none at all (every one, if
        ``backends`` is empty)."""
        if not backends:
            return set(self.by_effect.get(effect, ()))
        return {i for name in (*backends, "") for i in self.by_backend.get((effect, name), ())}

    def all(self, effect: str) -> set[int]:
        return set(self.by_effect.get(effect, ()))


#: For a later rule's effect: the earlier effects it can contradict where both name a
#: backend (``_conflict``); a require also contradicts every disjoint earlier require.
_CONTRADICTING = {
    "prefer": ("forbid", "demote"),
    "forbid": ("prefer", "require"),
    "require": ("forbid",),
    "demote": ("prefer",),
}


def _shadowed(rules: Sequence[Rule]) -> tuple[list[Finding], set[tuple[int, int]]]:
    findings: list[Finding] = []
    covered: set[tuple[int, int]] = set()
    earlier_rules = _EarlierRules()
    for j, later in enumerate(rules):
        # only an earlier forbid of every backend named, or a require of none, can shadow
        candidates = earlier_rules.naming("forbid", later.backends) | earlier_rules.all("require")
        if later.effect != "require":  # against an earlier forbid/require: a conflict, not dead
            for i in sorted(candidates):
                earlier = rules[i]
                if not _implies(earlier, later):
                    continue
                names = set(later.backends)
                if earlier.effect == "forbid" and names <= set(earlier.backends):
                    does = f"forbids {', '.join(later.backends)}"
                elif earlier.effect == "require" and not names & set(earlier.backends):
                    does = f"requires only {', '.join(earlier.backends)}"
                else:
                    continue
                when = (
                    "unconditionally"
                    if not earlier.conditions
                    else "holds whenever this one does and"
                )
                findings.append(
                    Finding(
                        "error",
                        "shadowed-rule",
                        f"rule {later.id!r} can never take effect: {_where(earlier)} {when} {does}",
                        later.origin,
                    )
                )
                covered.add((i, j))
                break
        if later.action == "enforce":
            earlier_rules.add(j, later)
    return findings, covered


def _conflict(a: Rule, b: Rule) -> tuple[str, str] | None:
    """(severity, message) when ``a`` then ``b`` contradict each other on some backend."""
    ea, eb = a.effect, b.effect
    sa, sb = set(a.backends), set(b.backends)
    pair = {ea, eb}
    if pair == {"prefer", "forbid"} and sa & sb:
        names = ", ".join(sorted(sa & sb))
        return "error", f"one prefers and the other forbids {names} where both match"
    if pair == {"require", "forbid"}:
        required, forbidden = (sa, sb) if ea == "require" else (sb, sa)
        if required <= forbidden:
            return "error", (
                f"one requires only {', '.join(sorted(required))} and the other forbids "
                "them: no backend is left where both match"
            )
    if pair == {"require"} and not sa & sb:
        return "error", "they require disjoint backend sets: no backend is left where both match"
    if pair == {"prefer", "demote"} and sa & sb:
        names = ", ".join(sorted(sa & sb))
        return (
            "warning",
            f"one prefers and the other demotes {names} where both match (the later wins)",
        )
    return None


def _conflict_candidates(later: Rule, earlier_rules: _EarlierRules) -> set[int]:
    """The earlier rules ``_conflict`` can find contradicting ``later`` (a superset)."""
    found: set[int] = set()
    for effect in _CONTRADICTING.get(later.effect, ()):
        found |= earlier_rules.naming(effect, later.backends)
    if later.effect == "require":
        found |= earlier_rules.all("require")
    return found


def _conflicts(rules: Sequence[Rule], skip: set[tuple[int, int]]) -> list[Finding]:
    findings = []
    earlier_rules = _EarlierRules()
    for j, later in enumerate(rules):
        if later.action != "enforce":
            continue
        for i in sorted(_conflict_candidates(later, earlier_rules)):
            earlier = rules[i]
            if (i, j) in skip:
                continue
            verdict = _conflict(earlier, later)
            if verdict is None or not satisfiable((*earlier.conditions, *later.conditions)):
                continue
            severity, message = verdict
            findings.append(
                Finding(
                    severity,
                    "conflicting-rules",
                    f"rule {later.id!r} conflicts with {_where(earlier)}: {message}",
                    later.origin,
                )
            )
        earlier_rules.add(j, later)
    return findings


# ---------------------------------------------------------------- require / priority


def _capability_values(rule: Rule, spec: BackendSpec) -> list[str]:
    """Capabilities worth trying: the rule's operands and the backend's bounds, with neighbours."""
    seeds = [
        c.operand for c in rule.conditions if c.key == "device.capability" and c.op != "exists"
    ]
    flat: list[Any] = []
    for seed in seeds:
        flat.extend(seed if isinstance(seed, tuple) else (seed,))
    flat.extend(v for v in (spec.capability_min, spec.capability_max) if v)
    for pattern in spec.capability_any_of:
        family, _, sub = pattern.partition(".")
        flat.extend([f"{family}.{m}" for m in range(10)] if sub in ("*", "x") else [pattern])
    points = {(0, 0), (99, 9)}
    for value in flat:
        major, minor = parse_capability(value)
        points.update(
            {(major, minor), (major, minor + 1), (major + 1, 0), (major, max(minor - 1, 0))}
        )
    return [f"{a}.{b}" for a, b in sorted(points)]


def _why_not(rule: Rule, spec: BackendSpec, platform: str) -> str | None:
    """Why ``spec`` can never run where ``rule`` matches on ``platform``, or None."""
    from moe_policy.core.passes.feasibility import capability_ok

    if platform not in spec.platforms:
        return f"runs only on {', '.join(spec.platforms)}"
    conds = (*rule.conditions, Condition("platform", "eq", platform))
    if platform == "cuda" and any(c.key == "device.capability" for c in rule.conditions):
        caps = values_allowed("device.capability", conds, _capability_values(rule, spec))
        if not any(capability_ok(spec, cap)[0] for cap in caps):
            return "no compute capability where the rule matches is in its range"
    lora_on = not satisfiable((*conds, Condition("lora.enabled", "eq", False)))
    if lora_on and spec.lora == "false":
        return "cannot apply LoRA, and the rule matches only with LoRA on"
    return None


def _oracle_rules(rules: Sequence[Rule], engine: EngineProfile) -> list[Rule]:
    """The rules that can match a layer decided by ``engine``'s catalog: for an engine with
    an oracle per quantization, those whose ``model.quantization`` can be routed to it."""
    if not engine.oracles:
        return list(rules)
    routed = tuple(
        scheme
        for scheme in QUANTIZATIONS
        if any(oracle_for(scheme, act) == engine.quantization for act in (None, *QUANT_ACTIVATIONS))
    )
    here = Condition("model.quantization", "in", routed)
    return [rule for rule in rules if satisfiable((*rule.conditions, here))]


def _never_matches(rules: Sequence[Rule]) -> list[Finding]:
    return [
        Finding(
            "error",
            "rule-never-matches",
            f"rule {rule.id!r} can never match: its conditions cannot all hold "
            f"({', '.join(sorted(rule.keys))})",
            rule.origin,
        )
        for rule in rules
        if rule.conditions and not satisfiable(rule.conditions)
    ]


def _require_findings(rules: Sequence[Rule], catalog: Catalog) -> list[Finding]:
    findings = []
    for rule in rules:
        if rule.effect != "require" or rule.action != "enforce" or not rule.backends:
            continue
        problems = []
        for platform in values_allowed("platform", rule.conditions, PLATFORMS):
            reasons = {
                name: _why_not(rule, catalog.spec(name), platform)
                if name in catalog
                else "a backend of another of the engine's oracles"
                for name in rule.backends
            }
            # a required backend that can run is selected: require makes it rankable
            if all(why is not None for why in reasons.values()):
                problems.append(
                    f"on {platform} none can run ("
                    + "; ".join(f"{name}: {why}" for name, why in reasons.items())
                    + ")"
                )
        if problems:
            findings.append(
                Finding(
                    "error",
                    "require-no-backend",
                    f"rule {rule.id!r} requires {', '.join(rule.backends)}, leaving no backend: "
                    + "; ".join(problems),
                    rule.origin,
                )
            )
    return findings


def _forbid_findings(
    rules: Sequence[Rule],
    catalog: Catalog,
    priority: dict[str, tuple[str, ...]],
    requested: str | None,
) -> list[Finding]:
    """Forbids that, with the forbids always holding alongside, leave a platform nothing."""
    forbids = [r for r in rules if r.effect == "forbid" and r.action == "enforce" and r.backends]
    named = {
        name
        for r in rules
        if r.effect in ("prefer", "require") and r.action == "enforce"
        for name in r.backends
    }
    if requested:
        named.add(requested)
    findings = []
    for j, rule in enumerate(forbids):
        group = [other for other in forbids if _implies(other, rule)]
        # one finding per set of conditions: at the last forbid written with them
        if any(set(other.conditions) == set(rule.conditions) for other in forbids[j + 1 :]):
            continue
        forbidden = {name for other in group for name in other.backends}
        # the forbids it implies without it: when they already leave nothing, they report
        before = {name for other in group if other is not rule for name in other.backends}
        problems = []
        for platform in values_allowed("platform", rule.conditions, PLATFORMS):
            runs = [spec.name for spec in catalog if _why_not(rule, spec, platform) is None]
            left = [name for name in runs if name not in forbidden]
            rankable = set(priority.get(platform, ())) | named
            if not set(runs) & rankable:  # nothing there to begin with: not these rules' doing
                continue
            if not {name for name in runs if name not in before} & rankable:
                continue
            if not left:
                problems.append(f"on {platform} none can run")
            elif not set(left) & rankable:
                problems.append(
                    f"on {platform} only {', '.join(left)} can run and none is in "
                    f"priority.{platform} or named by a prefer or require rule, so auto "
                    "selection finds nothing"
                )
        if problems:
            others = [other.id for other in group if other is not rule]
            also = f" (with {', '.join(repr(o) for o in others)})" if others else ""
            findings.append(
                Finding(
                    "error",
                    "forbid-no-backend",
                    f"rule {rule.id!r}{also} forbids {', '.join(sorted(forbidden))}, leaving no "
                    "backend: " + "; ".join(problems),
                    rule.origin,
                )
            )
    return findings


def _priority_findings(
    loaded: LoadedYaml, entries: Iterable[Entry], catalog: Catalog
) -> list[Finding]:
    findings = []
    for entry in entries:
        if not entry.key.startswith("priority."):
            continue
        platform = entry.key.split(".", 1)[1]
        for index, name in enumerate(entry.value):
            if name not in catalog:  # loading refused unknown names: another oracle's
                findings.append(
                    Finding(
                        "warning",
                        "priority-unreachable",
                        f"priority.{platform} lists {name}, a backend of another of the "
                        "engine's oracles: never a candidate for this catalog",
                        str(loaded.origin(("priority", platform, index))),
                    )
                )
                continue
            spec = catalog.spec(name)
            if platform not in spec.platforms:
                findings.append(
                    Finding(
                        "warning",
                        "priority-unreachable",
                        f"priority.{platform} lists {name}, which never runs on {platform} "
                        f"(runs on {', '.join(spec.platforms) or 'nothing'})",
                        str(loaded.origin(("priority", platform, index))),
                    )
                )
    return findings


# ---------------------------------------------------------------- entry points


def _expected_conditions(when: Any) -> int:
    if not isinstance(when, Mapping):
        return 0
    return sum(len(spec) if isinstance(spec, Mapping) else 1 for spec in when.values())


def well_formed(loaded: LoadedYaml, rules: Sequence[Rule]) -> list[Rule]:
    """The rules parsed without losing a condition or a backend to a structural error.

    A rule with a dropped condition would look broader than written (an unconditional
    rule, say), so the semantic checks leave it out; its structural finding stands.
    """
    raw_rules = loaded.data.get("rules") if isinstance(loaded.data, Mapping) else None
    if not isinstance(raw_rules, list):
        return list(rules)
    raw_at = {str(loaded.origin(("rules", i))): raw for i, raw in enumerate(raw_rules)}
    kept = []
    for rule in rules:
        raw = raw_at.get(rule.origin)
        if not isinstance(raw, Mapping):
            continue
        backends = raw.get("backends")
        if (
            not rule.backends
            or not isinstance(backends, list)
            or len(backends) != len(rule.backends)
        ):
            continue
        if len(rule.conditions) != _expected_conditions(raw.get("when")):
            continue
        kept.append(rule)
    return kept


def builtin_priority(
    catalog: Catalog, engine: EngineProfile = MOE_POLICY
) -> dict[str, tuple[str, ...]]:
    """The engine's built-in priority lists (what a policy file's own lists replace)."""
    from moe_policy.settings.builtin import BuiltinSource

    out = BuiltinSource(engine).load(catalog)
    return {
        e.key.split(".", 1)[1]: tuple(e.value)
        for e in out.settings
        if e.key.startswith("priority.")
    }


def lint_document(
    loaded: LoadedYaml, catalog: Catalog | None = None, engine: EngineProfile = MOE_POLICY
) -> list[Finding]:
    """Every finding in one parsed policy document (for ``engine``), sorted by position."""
    catalog = catalog or load_catalog(engine)
    sink = ProblemSink(strict=False)
    entries, rules = parse_policy_document(loaded, catalog, sink)
    findings = [Finding(p.severity, p.code, p.message, p.origin) for p in sink.problems]
    rules = well_formed(loaded, rules)
    shadowed, covered = _shadowed(rules)
    findings.extend(shadowed)
    findings.extend(_conflicts(rules, covered))
    findings.extend(_never_matches(rules))
    priority = builtin_priority(catalog, engine)
    priority.update(
        {e.key.split(".", 1)[1]: tuple(e.value) for e in entries if e.key.startswith("priority.")}
    )
    requested = next((e.value for e in entries if e.key == "backend" and e.value != "auto"), None)
    here = _oracle_rules(rules, engine)
    findings.extend(_require_findings(here, catalog))
    findings.extend(_forbid_findings(here, catalog, priority, requested))
    findings.extend(_priority_findings(loaded, entries, catalog))
    return sorted(findings, key=Finding.sort_key)


def lint_file(
    path: str, catalog: Catalog | None = None, engine: EngineProfile = MOE_POLICY
) -> list[Finding]:
    """Lint one file; a file that cannot be read or parsed is itself a finding."""
    try:
        loaded = load_yaml_file(path)
    except PolicyError as exc:
        return [Finding("error", exc.code, exc.message, exc.origin or str(Origin.file(path)))]
    return lint_document(loaded, catalog, engine)


def lint_paths(
    paths: Sequence[str], catalog: Catalog | None = None, engine: EngineProfile = MOE_POLICY
) -> list[Finding]:
    """Lint several files, in the order given, against ``engine``'s backends."""
    catalog = catalog or load_catalog(engine)
    return [finding for path in paths for finding in lint_file(path, catalog, engine)]
