"""Every reason code in the closed set is produced by some context (none is dead)."""

from __future__ import annotations

from typing import Any

import pytest

from moe_policy import ReasonCode
from moe_policy.api import Selector, explicit_entries
from moe_policy.core.origin import Origin
from tests.bundled import GPT_OSS, MIXTRAL, NEMOTRON, QWEN3

SM90 = {"platform": "cuda", "capability": "9.0"}
BIG_EXPERTS = {
    "num_experts": 1024,
    "num_experts_per_tok": 8,
    "hidden_size": 2048,
    "moe_intermediate_size": 768,
}
ODD_HIDDEN = {
    "num_experts": 8,
    "num_experts_per_tok": 2,
    "hidden_size": 2052,
    "moe_intermediate_size": 768,
}

# code -> (model, arguments, backend that gets the code)
CASES: dict[ReasonCode, tuple[Any, dict[str, Any], str]] = {
    ReasonCode.PLATFORM_UNSUPPORTED: (QWEN3, SM90, "aiter"),
    ReasonCode.DEVICE_CAPABILITY_UNSUPPORTED: (QWEN3, SM90, "flashinfer_trtllm"),
    ReasonCode.PACKAGE_UNAVAILABLE: (
        QWEN3,
        {**SM90, "packages": ["torch", "triton"]},
        "flashinfer_cutlass",
    ),
    ReasonCode.DTYPE_UNSUPPORTED: (QWEN3, {**SM90, "dtype": "fp32"}, "torch_grouped_mm"),
    ReasonCode.QUANTIZATION_UNSUPPORTED: (
        QWEN3,
        {**SM90, "overrides": {"model.quantization": "fp8"}},
        "triton",
    ),
    ReasonCode.ACTIVATION_UNSUPPORTED: (GPT_OSS, SM90, "flashinfer_cutlass"),
    ReasonCode.NON_GATED_UNSUPPORTED: (
        NEMOTRON,
        {"platform": "rocm", "overrides": {"rocm.aiter": True}},
        "aiter",
    ),
    ReasonCode.ACTIVATION_FORMAT_MISMATCH: (QWEN3, SM90, "batched_triton"),
    ReasonCode.PARALLEL_CONFIG_UNSUPPORTED: (
        QWEN3,
        {**SM90, "all2all": "flashinfer_nvlink_one_sided"},
        "triton",
    ),
    ReasonCode.EXPERT_COUNT_UNSUPPORTED: (BIG_EXPERTS, SM90, "triton"),
    ReasonCode.SHAPE_ALIGNMENT_UNSUPPORTED: (ODD_HIDDEN, SM90, "torch_grouped_mm"),
    ReasonCode.BATCH_INVARIANCE_UNSUPPORTED: (
        QWEN3,
        {**SM90, "batch_invariant": True},
        "flashinfer_cutlass",
    ),
    ReasonCode.LORA_UNSUPPORTED: (
        QWEN3,
        {**SM90, "lora": True, "max_lora_rank": 12},
        "torch_grouped_mm",
    ),
    ReasonCode.POLICY_FORBID: (QWEN3, {"platform": "rocm"}, "aiter"),
}


def _decide(model: Any, args: dict[str, Any], extra_checks=None):
    args = dict(args)
    overrides = args.pop("overrides", None)
    entries = explicit_entries(args, overrides, Origin.api())
    return Selector(model, environ={}, explicit=entries, extra_checks=extra_checks).decide()


@pytest.mark.parametrize("code", sorted(CASES, key=lambda c: c.value), ids=lambda c: c.value)
def test_code_is_produced(code):
    """The listed context eliminates the listed backend with exactly this code and a detail."""
    model, args, backend = CASES[code]
    cand = _decide(model, args).candidate(backend)
    assert cand.reason_code is code
    assert cand.detail


def test_policy_require_and_implementation_checks():
    """policy_require comes from a require rule; implementation_unsupported from an experts-class check."""
    decision = _decide(
        MIXTRAL,
        {**SM90, "overrides": {"parallel.eplb": True}},
        extra_checks={"triton": lambda ctx: (False, "refused for the test")},
    )
    assert decision.candidate("triton").reason_code is ReasonCode.IMPLEMENTATION_UNSUPPORTED
    assert decision.candidate("triton").detail == "refused for the test"


def test_every_code_is_covered():
    """Together the tests above cover the whole closed set."""
    covered = set(CASES) | {ReasonCode.IMPLEMENTATION_UNSUPPORTED, ReasonCode.POLICY_REQUIRE}
    assert covered == set(ReasonCode)


def test_require_rule(tmp_path):
    """A require rule eliminates every other backend with policy_require."""
    policy = tmp_path / "p.yaml"
    policy.write_text(
        "rules:\n  - {id: only-ref, effect: require, backends: [reference], reason: debugging}\n"
    )
    sel = Selector(
        QWEN3,
        environ={},
        policy_files=[str(policy)],
        explicit=explicit_entries(SM90, None, Origin.api()),
    )
    decision = sel.decide()
    assert decision.backend == "reference"
    assert decision.candidate("triton").reason_code is ReasonCode.POLICY_REQUIRE
