"""A backend has one candidate in a decision, however often a priority list or a rule names it.

Loading refuses a repeated name (``duplicate-backend``, tests/test_lint.py); a ``Policy`` or a
``Rule`` built in code is not loaded, so the resolver itself never doubles a candidate.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest

from moe_policy.core.passes.feasibility import seed_candidates
from moe_policy.core.resolver import Resolver
from moe_policy.core.rules import Rule


def _counts(decision) -> Counter[str]:
    return Counter(c.backend for c in decision.candidates)


def test_seed_candidates_makes_one_candidate_per_backend(make_selector, qwen3, h200):
    selector = make_selector(qwen3, **h200)
    priority = ("triton", "flashinfer_cutlass", "triton", "triton")
    candidates = seed_candidates(selector.catalog, selector.context, priority)
    names = [c.backend for c in candidates]
    assert sorted(names) == sorted(selector.catalog.names)
    assert names[:2] == ["triton", "flashinfer_cutlass"]  # the first place is kept
    assert [c.listed for c in candidates[:2]] == [True, True]
    assert not any(c.listed for c in candidates[2:])


@pytest.mark.parametrize("effect", ["prefer", "demote", "forbid", "require"])
def test_a_policy_built_in_code_with_repeats_decides_on_one_candidate_each(
    make_selector, qwen3, h200, effect
):
    """Priority lists and rule backends with repeats, straight into a Resolver."""
    selector = make_selector(qwen3, **h200)
    policy = selector.resolver.policy
    rule = Rule(
        id="twice",
        effect=effect,
        backends=("triton", "flashinfer_cutlass", "triton"),
        conditions=(),
        reason="named twice",
        origin="api",
    )
    policy = replace(
        policy,
        priorities={**policy.priorities, "cuda": ("triton", "flashinfer_cutlass", "triton")},
        rules=(*policy.rules, rule),
    )
    decision = Resolver(selector.catalog, policy).resolve(selector.context)
    counts = _counts(decision)
    assert set(counts.values()) == {1}, counts
    assert sorted(counts) == sorted(selector.catalog.names)
    if effect in ("prefer", "require"):
        assert decision.backend == "triton"
