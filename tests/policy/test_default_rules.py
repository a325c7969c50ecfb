"""Every rule of configs/default.yaml: one context where it fires, one where it does not."""

from __future__ import annotations

from typing import Any

import pytest

from moe_policy import ReasonCode
from moe_policy.core.paths import DEFAULT_POLICY
from moe_policy.core.yamlio import load_yaml_file
from tests.bundled import GPT_OSS, NEMOTRON, QWEN3

SM90 = {"platform": "cuda", "capability": "9.0"}
SM100 = {"platform": "cuda", "capability": "10.0"}
SM120 = {"platform": "cuda", "capability": "12.0"}
ROCM = {"platform": "rocm"}

# rule id -> (fires: (model, args, env, expected backend), does not fire: (...))
CASES: dict[
    str,
    tuple[
        tuple[Any, dict[str, Any], dict[str, str], str],
        tuple[Any, dict[str, Any], dict[str, str], str],
    ],
] = {
    "hopper-demotes-flashinfer": (
        (QWEN3, SM90, {}, "triton"),
        (QWEN3, SM100, {}, "flashinfer_trtllm"),
    ),
    "dp-demotes-flashinfer-cutlass": (
        (QWEN3, {**SM120, "dp": 2}, {}, "triton"),
        (QWEN3, SM120, {}, "flashinfer_cutlass"),
    ),
    "swigluoai-demotes-flashinfer": (
        (GPT_OSS, SM120, {}, "triton"),
        (QWEN3, SM120, {}, "flashinfer_cutlass"),
    ),
    "rocm-aiter-opt-in": (
        (QWEN3, ROCM, {}, "triton"),
        (QWEN3, ROCM, {"VLLM_ROCM_USE_AITER": "1"}, "aiter"),
    ),
    "lora-prefers-triton": (
        (QWEN3, {**SM100, "lora": True}, {}, "triton"),
        (QWEN3, SM100, {}, "flashinfer_trtllm"),
    ),
    "flashinfer-cutlass-unaligned-intermediate": (
        (NEMOTRON, SM120, {}, "triton"),
        (QWEN3, SM120, {}, "flashinfer_cutlass"),
    ),
}


def test_every_default_rule_has_cases():
    """No rule in default.yaml goes untested, and no case names a rule that does not exist."""
    loaded = load_yaml_file(DEFAULT_POLICY)
    assert sorted(rule["id"] for rule in loaded.data["rules"]) == sorted(CASES)


def _decide(make_selector, model, args, env):
    return make_selector(model, environ=env, **args).decide()


@pytest.mark.parametrize("rule_id", sorted(CASES))
def test_rule_fires(make_selector, rule_id):
    """In its firing context the rule matches, is applied, and the expected backend wins."""
    model, args, env, backend = CASES[rule_id][0]
    decision = _decide(make_selector, model, args, env)
    record = next(r for r in decision.rules if r.id == rule_id)
    assert record.matched and record.applied
    assert decision.backend == backend


@pytest.mark.parametrize("rule_id", sorted(CASES))
def test_rule_does_not_fire(make_selector, rule_id):
    """In its other context the rule does not match and another backend wins."""
    model, args, env, backend = CASES[rule_id][1]
    decision = _decide(make_selector, model, args, env)
    record = next(r for r in decision.rules if r.id == rule_id)
    assert not record.matched and not record.applied
    assert decision.backend == backend


def test_forbid_rule_records_policy_forbid(make_selector):
    """A forbid rule eliminates with policy_forbid and names the rule."""
    decision = _decide(make_selector, QWEN3, ROCM, {})
    cand = decision.candidate("aiter")
    assert (cand.reason_code, cand.rule, cand.pass_name) == (
        ReasonCode.POLICY_FORBID,
        "rocm-aiter-opt-in",
        "policy_rules",
    )


def test_rule_records_carry_file_line(make_selector):
    """Rules from default.yaml carry their file:line:col in the record."""
    decision = _decide(make_selector, QWEN3, SM90, {})
    record = next(r for r in decision.rules if r.id == "hopper-demotes-flashinfer")
    assert record.origin.startswith("file:configs/default.yaml:")
    line = int(record.origin.split(":")[2])
    text = DEFAULT_POLICY.read_text().splitlines()[line - 1]
    assert "hopper-demotes-flashinfer" in text
