"""Hostile and mutated model configs through ``explain --model``: the same contract as
policy files (documented exit code, one error line with its origin, no traceback, no hang,
bounded memory)."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings

from tests.fuzz.generators import crafted_cases, model_case
from tests.fuzz.keep import CI, SEEDS, contract_report

CRAFTED = [case for case in crafted_cases() if case.kind == "model"]


@pytest.mark.parametrize("case", CRAFTED, ids=[case.note for case in CRAFTED])
def test_a_crafted_model_config_keeps_the_contract(fuzz_worker, case):
    report = contract_report(fuzz_worker.run(case))
    assert report == "", report


@settings(CI, max_examples=80)
@given(seed=SEEDS)
def test_a_mutated_shipped_model_config_keeps_the_contract(fuzz_worker, seed):
    report = contract_report(fuzz_worker.run(model_case(random.Random(seed))))
    assert report == "", report
