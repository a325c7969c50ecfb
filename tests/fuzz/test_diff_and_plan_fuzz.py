"""Mutated audit logs through ``diff`` and mutated deployment matrices through ``plan``:
exit 0/1 (identical or not, changes or none) or 2 with one error line naming the file."""

from __future__ import annotations

import random

from hypothesis import given, settings

from tests.fuzz.generators import diff_case, matrix_case
from tests.fuzz.keep import CI, SEEDS, contract_report


@settings(CI, max_examples=60)
@given(seed=SEEDS)
def test_a_mutated_audit_log_through_diff_keeps_the_contract(fuzz_worker, seed):
    report = contract_report(fuzz_worker.run(diff_case(random.Random(seed))))
    assert report == "", report


@settings(CI, max_examples=15)
@given(seed=SEEDS)
def test_a_mutated_deployment_matrix_through_plan_keeps_the_contract(fuzz_worker, seed):
    report = contract_report(fuzz_worker.run(matrix_case(random.Random(seed))))
    assert report == "", report
