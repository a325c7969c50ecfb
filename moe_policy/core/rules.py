"""Policy rules: ``when`` conditions over the context and an effect on backends.

A rule reads::

    - id: hopper-demotes-flashinfer
      when: {platform: cuda, device.capability: {ge: "9.0", lt: "10.0"}}
      effect: demote            # forbid | require (hard) | prefer | demote (order)
      backends: [flashinfer_trtllm, flashinfer_cutlass]
      reason: FlashInfer is slower than Triton on SM90.
      action: enforce           # enforce | audit (record what it would have done)

A condition value is a scalar (equality), a list (any of) or a mapping of operators:
``eq ne in not_in gt ge lt le multiple_of not_multiple_of exists``. Every condition
must hold. A condition on a key whose value is unknown (None) does not hold, and the
key is reported as missing context.

Operands are typed (``condition_operand``, the one validator loading and lint share): an
operand of the key's type (``moe_policy.core.keys.coerce_value``), ``exists`` a boolean,
ordering only on integer and capability keys, ``multiple_of`` only on integer keys, no null
operand (it would never match), non-empty lists; so a rule that loads evaluates on every
value its keys can take.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from moe_policy.core.keys import CONTEXT_KEYS, coerce_value, parse_capability
from moe_policy.core.origin import Origin
from moe_policy.core.problems import ProblemSink
from moe_policy.core.values import parse_bool, parse_int, shown
from moe_policy.errors import PolicyError, did_you_mean

EFFECTS = ("forbid", "require", "prefer", "demote")
ACTIONS = ("enforce", "audit")
OPERATORS = (
    "eq",
    "ne",
    "in",
    "not_in",
    "gt",
    "ge",
    "lt",
    "le",
    "multiple_of",
    "not_multiple_of",
    "exists",
)
RULE_KEYS = ("id", "when", "effect", "backends", "reason", "action", "link")


@dataclass(frozen=True)
class Condition:
    key: str
    op: str
    operand: Any

    def test(self, value: Any) -> bool:
        """Whether ``value`` (already normalised for the key) satisfies the condition."""
        if self.op == "exists":
            return (value is not None) == bool(self.operand)
        if value is None:
            return False
        if isinstance(value, tuple):  # a list key (packages): membership tests
            if self.op == "eq":
                return bool(self.operand in value)
            if self.op == "ne":
                return bool(self.operand not in value)
            hit = any(item in value for item in self.operand)
            return hit if self.op == "in" else not hit
        if self.op == "eq":
            return bool(value == self.operand)
        if self.op == "ne":
            return bool(value != self.operand)
        if self.op == "in":
            return bool(value in self.operand)
        if self.op == "not_in":
            return bool(value not in self.operand)
        if self.op in ("multiple_of", "not_multiple_of"):
            divisible = int(value) % int(self.operand) == 0
            return divisible if self.op == "multiple_of" else not divisible
        left = _ordered(self.key, value)
        right = _ordered(self.key, self.operand)
        return bool(
            {
                "gt": left > right,
                "ge": left >= right,
                "lt": left < right,
                "le": left <= right,
            }[self.op]
        )


def _ordered(key: str, value: Any) -> Any:
    spec = CONTEXT_KEYS.get(key)
    if spec is not None and spec.type == "capability":
        return parse_capability(value)
    return value


@dataclass(frozen=True)
class Rule:
    """One validated rule; ``origin`` is where it was written (file:line:col or env:NAME)."""

    id: str
    effect: str
    backends: tuple[str, ...]
    conditions: tuple[Condition, ...]
    reason: str
    origin: str
    action: str = "enforce"
    link: str | None = None

    @property
    def keys(self) -> frozenset[str]:
        return frozenset(c.key for c in self.conditions)

    def evaluate(self, values: Mapping[str, Any]) -> tuple[bool, tuple[str, ...]]:
        """``(matched, missing context keys)`` for a context's values."""
        missing = tuple(
            sorted(
                {c.key for c in self.conditions if c.op != "exists" and values.get(c.key) is None}
            )
        )
        matched = not missing and all(c.test(values.get(c.key)) for c in self.conditions)
        return matched, missing


#: ``origin_at(keypath, at_key=False)``: file:line:col of a value (or of its key).
OriginAt = Callable[..., Origin]
#: ``item_origin(index)``: file:line:col of one item of a list operand.
ItemOrigin = Callable[[int], Origin | str]


def parse_conditions(
    when: Any, origin_at: OriginAt, path: tuple[Any, ...], sink: ProblemSink
) -> tuple[Condition, ...]:
    """Validate a ``when`` mapping into conditions (operands normalised for their key)."""
    if when is None:
        return ()
    if not isinstance(when, Mapping):
        sink.add(
            "error",
            "invalid-type",
            f"when: expected a mapping of context keys, got {when!r}",
            origin_at(path),
        )
        return ()
    conditions: list[Condition] = []
    for key, spec in when.items():
        where = origin_at((*path, key))
        if key not in CONTEXT_KEYS:
            sink.add(
                "error",
                "unknown-context-key",
                f"condition on unknown context key {key!r}{did_you_mean(key, CONTEXT_KEYS)}",
                origin_at((*path, key), at_key=True),
            )
            continue
        if isinstance(spec, Mapping):
            if not spec:
                sink.add(
                    "error",
                    "invalid-value",
                    f"{key}: an empty mapping of operators would drop the condition "
                    f"(expected one of {', '.join(OPERATORS)})",
                    where,
                )
            for op, operand in spec.items():
                if op not in OPERATORS:
                    sink.add(
                        "error",
                        "unknown-operator",
                        f"{key}: unknown operator {op!r}{did_you_mean(op, OPERATORS)} "
                        f"(expected one of {', '.join(OPERATORS)})",
                        origin_at((*path, key, op), at_key=True),
                    )
                    continue
                cond = _make_condition(
                    key,
                    op,
                    operand,
                    origin_at((*path, key, op)),
                    sink,
                    _items_at(origin_at, (*path, key, op)),
                )
                if cond is not None:
                    conditions.append(cond)
        elif isinstance(spec, list):
            cond = _make_condition(key, "in", spec, where, sink, _items_at(origin_at, (*path, key)))
            if cond is not None:
                conditions.append(cond)
        else:
            cond = _make_condition(key, "eq", spec, where, sink)
            if cond is not None:
                conditions.append(cond)
    return tuple(conditions)


def line_col(origin: Origin | str) -> str:
    """``LINE:COL`` of a file origin (what a message names for a place in the same file);
    the whole origin for any other."""
    if isinstance(origin, Origin) and origin.kind == "file" and origin.line is not None:
        return f"{origin.line}:{origin.col}" if origin.col is not None else str(origin.line)
    return str(origin)


def _items_at(origin_at: OriginAt, path: tuple[Any, ...]) -> ItemOrigin:
    """Where each item of the list at ``path`` is written."""
    return lambda index: origin_at((*path, index))


#: Operators that order values: only integer and compute-capability keys have an order.
ORDERING = ("gt", "ge", "lt", "le")
ORDERED_TYPES = ("int", "capability")


def _make_condition(
    key: str,
    op: str,
    operand: Any,
    origin: Origin,
    sink: ProblemSink,
    item_origin: ItemOrigin | None = None,
) -> Condition | None:
    """One condition, or None after an error to ``sink`` (at the bad list item, if one is).

    This is the only validator of rule operands: loading and ``moe-policy lint`` both
    come here, so a condition that exists can be evaluated on any valid value of its key.
    """
    try:
        return Condition(key, op, condition_operand(key, op, operand, origin, item_origin))
    except PolicyError as exc:
        sink.add("error", exc.code, exc.message, exc.origin or origin)
        return None


def condition_operand(
    key: str,
    op: str,
    operand: Any,
    origin: Origin | str,
    item_origin: ItemOrigin | None = None,
) -> Any:
    """The normalised operand of ``key: {op: operand}``; PolicyError when it cannot be
    evaluated on the key's values (wrong type, an operator the key's type has not, null).

    ``item_origin(index)`` locates one item of a list operand (``in``/``not_in``), so an
    error about an item names the item's file:line:col, not the list's."""
    key_type = CONTEXT_KEYS[key].type
    if op == "exists":
        try:
            return parse_bool(operand)
        except ValueError as exc:
            raise PolicyError(f"{key}: exists: {exc}", origin) from None
    if op in ("multiple_of", "not_multiple_of"):
        if key_type != "int":
            raise PolicyError(
                f"{key}: {op} applies to integer keys only ({key} is a {key_type} key)", origin
            )
        try:
            return parse_int(operand, minimum=1)
        except ValueError:
            raise PolicyError(
                f"{key}: {op} needs a positive integer, got {shown(operand)}", origin
            ) from None
    if op in ORDERING and key_type not in ORDERED_TYPES:
        raise PolicyError(
            f"{key}: {op} orders values, and a {key_type} key has no order "
            "(use eq, ne, in or not_in)",
            origin,
        )
    if op in ("in", "not_in"):
        if not isinstance(operand, (list, tuple)) or not operand:
            raise PolicyError(f"{key}: {op} needs a non-empty list, got {operand!r}", origin)
        return tuple(
            _scalar_operand(
                key, key_type, op, item, origin if item_origin is None else item_origin(index)
            )
            for index, item in enumerate(operand)
        )
    return _scalar_operand(key, key_type, op, operand, origin)


def _scalar_operand(key: str, key_type: str, op: str, operand: Any, origin: Origin | str) -> Any:
    if operand is None:
        raise PolicyError(
            f"{key}: a null operand never matches (a condition on an unknown value does "
            f"not hold); write `{key}: {{exists: false}}` to match an unknown {key}",
            origin,
        )
    if key_type == "list":
        # `packages: flashinfer` means "flashinfer is among the packages".
        if op not in ("eq", "ne", "in", "not_in"):
            raise PolicyError(f"{key}: a list key takes eq/ne/in/not_in, not {op}", origin)
        if not isinstance(operand, str) or not operand.strip():
            raise PolicyError(f"{key}: expected a package name, got {shown(operand)}", origin)
        return operand.strip()
    return coerce_value(key, operand, origin)


def parse_rule(
    raw: Any,
    origin_at: OriginAt,
    path: tuple[Any, ...],
    backend_names: Iterable[str],
    sink: ProblemSink,
) -> Rule | None:
    """Validate one rule mapping; problems go to ``sink`` with their file:line:col."""
    names = tuple(backend_names)
    here = origin_at(path)
    if not isinstance(raw, Mapping):
        sink.add("error", "invalid-type", f"a rule must be a mapping, got {raw!r}", here)
        return None
    for key in raw:
        if key not in RULE_KEYS:
            sink.add(
                "error",
                "unknown-key",
                f"unknown rule key {key!r}{did_you_mean(str(key), RULE_KEYS)} "
                f"(expected {', '.join(RULE_KEYS)})",
                origin_at((*path, key), at_key=True),
            )
    rule_id = raw.get("id")
    if not isinstance(rule_id, str) or not rule_id.strip():
        sink.add("error", "missing-field", "rule needs an `id` (a non-empty string)", here)
        rule_id = f"<rule at {here}>"
    effect = raw.get("effect")
    action = raw.get("action", "enforce")
    for field_name, value, choices in (("effect", effect, EFFECTS), ("action", action, ACTIONS)):
        if value not in choices:
            sink.add(
                "error",
                "invalid-value",
                f"rule {rule_id}: {field_name} must be one of {', '.join(choices)}, got {value!r}"
                f"{did_you_mean(str(value), choices)}",
                origin_at((*path, field_name)),
            )
    backends_raw = raw.get("backends")
    backends: list[str] = []
    if not isinstance(backends_raw, list) or not backends_raw:
        sink.add(
            "error",
            "missing-field",
            f"rule {rule_id}: `backends` must be a non-empty list",
            origin_at((*path, "backends")),
        )
    else:
        first: dict[str, int] = {}
        for index, name in enumerate(backends_raw):
            where = origin_at((*path, "backends", index))
            if name not in names:
                sink.add(
                    "error",
                    "unknown-backend",
                    f"rule {rule_id}: unknown backend {name!r}{did_you_mean(str(name), names)}",
                    where,
                )
            elif name in first:
                # prefer/demote would move it twice: one backend, two candidates
                sink.add(
                    "error",
                    "duplicate-backend",
                    f"rule {rule_id}: backends lists {name} twice; first at "
                    f"{line_col(origin_at((*path, 'backends', first[name])))}",
                    where,
                )
            else:
                first[name] = index
                backends.append(name)
    reason = raw.get("reason")
    if not isinstance(reason, str) or not reason.strip():
        sink.add(
            "error", "missing-field", f"rule {rule_id}: `reason` must be a non-empty string", here
        )
        reason = ""
    link = raw.get("link")
    if link is not None and not isinstance(link, str):
        sink.add(
            "error",
            "invalid-type",
            f"rule {rule_id}: `link` must be a string, got {shown(link)}",
            origin_at((*path, "link")),
        )
        link = None
    conditions = parse_conditions(raw.get("when"), origin_at, (*path, "when"), sink)
    if effect not in EFFECTS or action not in ACTIONS:
        return None
    return Rule(
        id=rule_id,
        effect=effect,
        backends=tuple(backends),
        conditions=conditions,
        reason=reason,
        origin=str(here),
        action=action,
        link=str(link) if link is not None else None,
    )
