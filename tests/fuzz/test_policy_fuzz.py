"""Hostile and mutated policy files through ``explain --policy`` and ``lint``: every one
gets a documented exit code, one error line naming its origin, no traceback, no hang,
bounded memory, and never prints or writes the secret in the environment."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings

from tests.fuzz.generators import crafted_cases, policy_case
from tests.fuzz.keep import CI, SEEDS, run_and_check

CRAFTED = [case for case in crafted_cases() if case.kind == "policy"]


@pytest.mark.parametrize("case", CRAFTED, ids=[case.note for case in CRAFTED])
def test_a_crafted_policy_keeps_the_contract(fuzz_worker, case):
    run_and_check(fuzz_worker, case)


@settings(CI, max_examples=120)
@given(seed=SEEDS)
def test_a_mutated_shipped_policy_keeps_the_contract(fuzz_worker, seed):
    run_and_check(fuzz_worker, policy_case(random.Random(seed)))


def test_the_secret_named_in_a_policy_is_refused_and_never_shown(fuzz_worker):
    """``${oc.env:SECRET}`` in a rule's reason: exit 2 at the key's file:line:col, and the
    value appears in no output."""
    case = next(c for c in CRAFTED if c.note == "crafted: secret in the reason")
    outcome = run_and_check(fuzz_worker, case)
    assert outcome.rc == 2
    assert "error: file:policy.yaml:" in outcome.stderr
