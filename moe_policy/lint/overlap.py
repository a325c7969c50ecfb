"""Can rule conditions hold together? A per-key, conservative satisfiability check for lint.

Conditions on different keys are treated as independent, so two rules "can overlap"
unless the conditions on some single key are provably contradictory. Per key the
check is exact for equality, membership and order operators (it probes the values
at and next to every operand; compute capabilities are assumed to have minors
0-9). Where it cannot decide (``multiple_of`` combined with other bounds and no
probe satisfying them), it answers "satisfiable": lint never reports a conflict it
cannot show, but it may miss one.

>>> from moe_policy.core.rules import Condition
>>> satisfiable([Condition("parallel.tp", "gt", 4), Condition("parallel.tp", "lt", 5)])
False
>>> satisfiable([Condition("device.capability", "ge", "9.0"), Condition("device.capability", "lt", "10.0")])
True
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

from moe_policy.core.keys import CONTEXT_KEYS, parse_capability
from moe_policy.core.rules import Condition

#: Operators whose probes decide satisfiability exactly.
_EXACT_OPS = frozenset({"eq", "ne", "in", "not_in", "gt", "ge", "lt", "le"})
_OUTSIDE = "\x00none-of-the-operands"


def _operands(conds: Sequence[Condition]) -> list[Any]:
    values: list[Any] = []
    for c in conds:
        values.extend(c.operand if isinstance(c.operand, tuple) else (c.operand,))
    return values


def _capability_probes(conds: Sequence[Condition]) -> list[str]:
    points = {(0, 0), (99, 9)}
    for operand in _operands(conds):
        major, minor = parse_capability(operand)
        points.update({(major, minor), (major, minor + 1), (major + 1, 0)})
        points.add((major, minor - 1) if minor > 0 else (max(major - 1, 0), 9))
    return [f"{major}.{minor}" for major, minor in sorted(points)]


def _int_probes(conds: Sequence[Condition]) -> list[int]:
    points = {0, 1, 2, 10**9}
    moduli = [int(c.operand) for c in conds if c.op in ("multiple_of", "not_multiple_of")]
    bounds = [
        int(v)
        for c in conds
        if c.op not in ("multiple_of", "not_multiple_of")
        for v in _operands([c])
    ]
    for value in bounds:
        points.update({value - 1, value, value + 1})
    for m in moduli:
        for base in (*bounds, 0):
            k = base // m
            points.update({k * m, (k + 1) * m, (k + 2) * m, k * m + 1, (k + 1) * m + 1})
    return sorted(points)


def _probes(key: str, conds: Sequence[Condition]) -> list[Any]:
    spec = CONTEXT_KEYS[key]
    if spec.type == "bool":
        return [True, False]
    if spec.type == "capability":
        return _capability_probes(conds)
    if spec.type == "int":
        return _int_probes(conds)
    if spec.choices is not None:
        return list(spec.choices)
    return [*_operands(conds), _OUTSIDE]


def _list_satisfiable(conds: Sequence[Condition]) -> bool:
    """A list key (packages): eq/ne test membership, in/not_in any/none of the operands."""
    present = {c.operand for c in conds if c.op == "eq"}
    absent = {c.operand for c in conds if c.op == "ne"}
    for c in conds:
        if c.op == "not_in":
            absent.update(c.operand)
    if present & absent:
        return False
    return all(set(c.operand) - absent for c in conds if c.op == "in")


def key_satisfiable(key: str, conds: Sequence[Condition]) -> bool:
    """Whether some value of ``key`` (or its absence) satisfies every condition."""
    exists = {bool(c.operand) for c in conds if c.op == "exists"}
    rest = [c for c in conds if c.op != "exists"]
    if False in exists:  # the key must be unknown: nothing else can hold
        return True not in exists and not rest
    if not rest:
        return True
    if CONTEXT_KEYS[key].type == "list":
        return _list_satisfiable(rest)
    multiples = [int(c.operand) for c in rest if c.op == "multiple_of"]
    if any(a % int(c.operand) == 0 for c in rest if c.op == "not_multiple_of" for a in multiples):
        return False
    if any(all(c.test(value) for c in rest) for value in _probes(key, rest)):
        return True
    return not all(c.op in _EXACT_OPS for c in rest)


#: The platforms whose devices have a compute capability (``device.capability`` is unknown
#: elsewhere: the probe sets it only there, and ``explain`` refuses one given for another).
CAPABILITY_PLATFORMS = ("cuda", "rocm")


def satisfiable(conditions: Iterable[Condition]) -> bool:
    """Whether a context can satisfy every condition (keys checked independently, except
    that a known ``device.capability`` means a platform of ``CAPABILITY_PLATFORMS``)."""
    by_key: dict[str, list[Condition]] = defaultdict(list)
    for cond in conditions:
        by_key[cond.key].append(cond)
    if not all(key_satisfiable(key, conds) for key, conds in by_key.items()):
        return False
    capability = by_key.get("device.capability")
    if capability and not key_satisfiable(
        "device.capability", [*capability, Condition("device.capability", "exists", False)]
    ):  # the capability must be known: a CUDA or ROCm device
        on_gpu = Condition("platform", "in", CAPABILITY_PLATFORMS)
        return key_satisfiable("platform", [*by_key.get("platform", ()), on_gpu])
    return True


def values_allowed(key: str, conditions: Iterable[Condition], values: Iterable[Any]) -> list[Any]:
    """Which of ``values`` for ``key`` are compatible with ``conditions`` (others unconstrained)."""
    conds = list(conditions)
    return [v for v in values if satisfiable([*conds, Condition(key, "eq", v)])]
