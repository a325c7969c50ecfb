"""Odd environment values (every variable the settings read, and near misses), odd flag
values and ``--set`` items, and non-regular files (FIFOs, devices, directories, dangling
links, overlong paths) as policy, model or audit log: the CLI's contract holds."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings

from tests.fuzz.generators import ENV_NAMES, crafted_cases, env_case, flag_case
from tests.fuzz.keep import CI, SEEDS, contract_report
from tests.fuzz.pool import Case

SPECIAL = [case for case in crafted_cases() if case.kind == "special"]


@settings(CI, max_examples=60)
@given(seed=SEEDS)
def test_odd_environment_values_keep_the_contract(fuzz_worker, seed):
    report = contract_report(fuzz_worker.run(env_case(random.Random(seed))))
    assert report == "", report


@pytest.mark.parametrize("name", ENV_NAMES)
def test_every_variable_read_with_an_empty_or_odd_value_keeps_the_contract(fuzz_worker, name):
    for value in ("", " ", "\u0662", "x" * 300, "{dir}/fifo"):
        case = Case(
            "env",
            ("explain", "--model", "qwen3-30b-a3b", "--platform", "cpu"),
            {name: value},
            specials={"fifo": "fifo"},
        )
        report = contract_report(fuzz_worker.run(case))
        assert report == "", report


@settings(CI, max_examples=80)
@given(seed=SEEDS)
def test_odd_flags_keep_the_contract(fuzz_worker, seed):
    report = contract_report(fuzz_worker.run(flag_case(random.Random(seed))))
    assert report == "", report


@pytest.mark.parametrize("case", SPECIAL, ids=[case.note for case in SPECIAL])
def test_a_file_that_is_not_a_regular_file_keeps_the_contract(fuzz_worker, case):
    report = contract_report(fuzz_worker.run(case))
    assert report == "", report
