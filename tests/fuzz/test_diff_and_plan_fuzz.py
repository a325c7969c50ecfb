"""Mutated audit logs through ``diff`` and mutated deployment matrices through ``plan``:
exit 0/1 (identical or not, changes or none) or 2 with one error line naming the file."""

from __future__ import annotations

import random

from hypothesis import given, settings

from tests.fuzz.generators import diff_case, matrix_case
from tests.fuzz.keep import CI, SEEDS, run_and_check


@settings(CI, max_examples=60)
@given(seed=SEEDS)
def test_a_mutated_audit_log_through_diff_keeps_the_contract(fuzz_worker, seed):
    run_and_check(fuzz_worker, diff_case(random.Random(seed)))


@settings(CI, max_examples=15)
@given(seed=SEEDS)
def test_a_mutated_deployment_matrix_through_plan_keeps_the_contract(fuzz_worker, seed):
    run_and_check(fuzz_worker, matrix_case(random.Random(seed)))
