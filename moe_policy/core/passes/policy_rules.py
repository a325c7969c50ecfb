"""Policy rules: forbid / require (hard) and prefer / demote (order), in rule order.

A rule with ``action: audit`` is evaluated and recorded but changes nothing.
``prefer`` and ``require`` also make the backends they name rankable when the
platform's priority list leaves them out (the policy asked for them by name).
Version-added: 0.1.0.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from moe_policy.core.context import SelectionContext
from moe_policy.core.decision import Candidate, ReasonCode, RuleRecord
from moe_policy.core.passes import Candidates, PassInputs, PassResult, TraceEntry

NAME = "policy_rules"


def _reorder(
    candidates: list[Candidate], backends: Sequence[str], to_front: bool
) -> list[Candidate]:
    # each named backend once (a Rule built in code may repeat one): one candidate each
    moved = [
        replace(c, listed=True) if to_front else c
        for name in dict.fromkeys(backends)
        for c in candidates
        if c.backend == name
    ]
    rest = [c for c in candidates if c.backend not in backends]
    return [*moved, *rest] if to_front else [*rest, *moved]


class RulesPass:
    """Applies the policy's rules in order; each evaluation is traced, enforced or not."""

    name = NAME

    def __call__(
        self, ctx: SelectionContext, candidates: Candidates, inputs: PassInputs
    ) -> PassResult:
        cands = list(candidates)
        trace: list[TraceEntry] = []
        for rule in inputs.policy.rules:
            matched, missing = rule.evaluate(ctx.values)
            applied = matched and rule.action == "enforce"
            trace.append(
                RuleRecord(
                    id=rule.id,
                    effect=rule.effect,
                    action=rule.action,
                    matched=matched,
                    applied=applied,
                    backends=rule.backends,
                    reason=rule.reason,
                    origin=rule.origin,
                    missing_context=missing,
                )
            )
            if not applied:
                continue
            if rule.effect == "forbid":
                cands = [
                    c.eliminate(
                        NAME, ReasonCode.POLICY_FORBID, f"rule {rule.id}: {rule.reason}", rule.id
                    )
                    if c.alive and c.backend in rule.backends
                    else c
                    for c in cands
                ]
            elif rule.effect == "require":
                cands = [
                    c.eliminate(
                        NAME,
                        ReasonCode.POLICY_REQUIRE,
                        f"rule {rule.id} requires one of {', '.join(rule.backends)}: {rule.reason}",
                        rule.id,
                    )
                    if c.alive and c.backend not in rule.backends
                    else (replace(c, listed=True) if c.backend in rule.backends else c)
                    for c in cands
                ]
            else:
                cands = _reorder(cands, rule.backends, to_front=rule.effect == "prefer")
        return tuple(cands), tuple(trace)
