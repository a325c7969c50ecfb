"""Hostile and mutated policy files through ``explain --policy`` and ``lint``: every one
gets a documented exit code, one error line naming its origin, no traceback, no hang,
bounded memory, and never prints or writes the secret in the environment."""

from __future__ import annotations

import random
import re

import pytest
from hypothesis import given, settings

from tests.fuzz.generators import crafted_cases, policy_case
from tests.fuzz.keep import CI, SEEDS, run_and_check
from tests.fuzz.pool import Case

CRAFTED = [case for case in crafted_cases() if case.kind == "policy"]


@pytest.mark.parametrize("case", CRAFTED, ids=[case.note for case in CRAFTED])
def test_a_crafted_policy_keeps_the_contract(fuzz_worker, case):
    run_and_check(fuzz_worker, case)


@settings(CI, max_examples=120)
@given(seed=SEEDS)
def test_a_mutated_shipped_policy_keeps_the_contract(fuzz_worker, seed):
    run_and_check(fuzz_worker, policy_case(random.Random(seed)))


SECRETS = [case for case in CRAFTED if "secret" in case.note]


@pytest.mark.parametrize("case", SECRETS, ids=[case.note for case in SECRETS])
def test_the_secret_named_in_a_policy_is_refused_at_its_key_and_never_shown(fuzz_worker, case):
    """``${oc.env:SECRET}`` in a reason, an id, a mode, a backend, the audit file's name,
    through oc.decode or in a key: explain exits 2 at the key's file:line:col, lint finds
    an error, and the value appears in no output and no file (the contract checks that)."""
    outcome = run_and_check(fuzz_worker, case)
    if case.argv[0] == "lint":
        assert outcome.rc == 1
    else:
        assert outcome.rc == 2
        assert re.search(r"moe-policy: error: file:policy\.yaml:\d+:\d+: ", outcome.stderr)


ANOTHER_ORACLE = b"version: 1\npriority:\n  rocm: [aiter, triton, marlin]\n"


def test_another_oracles_backend_in_a_vllm_priority_list_lints_and_loads(fuzz_worker):
    """marlin belongs to vLLM's fp8 oracle, not its unquantized one: a vLLM policy may name
    it (found by make fuzz: lint stopped with an error line naming no origin)."""
    files = {"policy.yaml": ANOTHER_ORACLE}
    lint = run_and_check(
        fuzz_worker, Case("policy", ("lint", "--engine", "vllm", "policy.yaml"), files=files)
    )
    assert lint.rc == 0, lint.stdout
    explain = Case(
        "policy",
        (
            "explain",
            "--engine",
            "vllm",
            "--model",
            "qwen3-30b-a3b",
            "--platform",
            "rocm",
            "--policy",
            "policy.yaml",
        ),
        files=files,
    )
    assert run_and_check(fuzz_worker, explain).rc == 0
