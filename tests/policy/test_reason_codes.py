"""Every reason code in the closed set is produced by some context (none is dead)."""

from __future__ import annotations

from typing import Any

import pytest

from moe_policy import ReasonCode
from moe_policy.api import Selector, explicit_entries
from moe_policy.core.origin import Origin
from tests.bundled import DEEPSEEK, GPT_OSS, MIXTRAL, NEMOTRON, QWEN3

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
    """A require rule eliminates every other live backend with policy_require."""
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
    # A backend the catalog already ruled out keeps the catalog's reason.
    trtllm = decision.candidate("flashinfer_trtllm")
    assert (trtllm.reason_code, trtllm.pass_name, trtllm.rule) == (
        ReasonCode.DEVICE_CAPABILITY_UNSUPPORTED,
        "feasibility",
        None,
    )


def test_a_forbid_rule_keeps_an_earlier_elimination():
    """rocm-aiter-opt-in matches, but AITER was already out (package missing): the candidate
    keeps the first reason, the pass that found it and no rule."""
    decision = _decide(QWEN3, {"platform": "rocm", "packages": ["torch", "triton"]})
    record = next(r for r in decision.rules if r.id == "rocm-aiter-opt-in")
    assert record.matched and record.applied
    aiter = decision.candidate("aiter")
    assert (aiter.reason_code, aiter.pass_name, aiter.rule) == (
        ReasonCode.PACKAGE_UNAVAILABLE,
        "feasibility",
        None,
    )


def test_lora_eliminates_only_what_feasibility_left():
    """The passes run feasibility first: a backend that cannot run the context at all keeps
    that reason under LoRA; lora_unsupported is for backends that could otherwise run."""
    decision = _decide(QWEN3, {**SM90, "lora": True})
    expected = {
        "aiter": (ReasonCode.PLATFORM_UNSUPPORTED, "feasibility"),
        "flashinfer_trtllm": (ReasonCode.DEVICE_CAPABILITY_UNSUPPORTED, "feasibility"),
        "flashinfer_cutlass": (ReasonCode.LORA_UNSUPPORTED, "lora"),
    }
    for backend, (code, pass_name) in expected.items():
        cand = decision.candidate(backend)
        assert (cand.reason_code, cand.pass_name) == (code, pass_name), backend


@pytest.mark.parametrize(
    ("capability", "feasible"),
    [("10.0", True), ("10.1", False), ("10.2", False), ("10.3", True), ("11.0", False)],
)
def test_capability_patterns_match_the_minor_exactly(capability, feasible):
    """flashinfer_trtllm's `any_of: ["10.0", "10.3"]` names two capabilities, not a range."""
    cand = _decide(QWEN3, {"platform": "cuda", "capability": capability}).candidate(
        "flashinfer_trtllm"
    )
    assert cand.alive is feasible
    if not feasible:
        assert cand.reason_code is ReasonCode.DEVICE_CAPABILITY_UNSUPPORTED


@pytest.mark.parametrize(("experts", "feasible"), [(992, True), (993, False)])
def test_the_expert_count_limit_is_inclusive(experts, feasible):
    """Triton's max_experts 992 admits 992 local experts and refuses 993."""
    cand = _decide({**BIG_EXPERTS, "num_experts": experts}, SM90).candidate("triton")
    assert cand.alive is feasible
    if not feasible:
        assert cand.reason_code is ReasonCode.EXPERT_COUNT_UNSUPPORTED


def test_intermediate_alignment_is_checked_per_partition():
    """torch_grouped_mm needs I per partition a multiple of 8: I=1544 is, 1544/tp2=772 is not."""
    model = {**ODD_HIDDEN, "hidden_size": 2048, "moe_intermediate_size": 1544}
    assert _decide(model, SM90).candidate("torch_grouped_mm").alive
    cand = _decide(model, {**SM90, "tp": 2}).candidate("torch_grouped_mm")
    assert cand.reason_code is ReasonCode.SHAPE_ALIGNMENT_UNSUPPORTED
    assert "772" in (cand.detail or "")


def test_eplb_eliminates_the_backends_without_it():
    """FlashInfer TRT-LLM runs no EPLB: on SM100 with EPLB the next backend runs."""
    decision = _decide(QWEN3, {"platform": "cuda", "capability": "10.0", "eplb": True})
    trtllm = decision.candidate("flashinfer_trtllm")
    assert trtllm.reason_code is ReasonCode.PARALLEL_CONFIG_UNSUPPORTED
    assert decision.backend == "flashinfer_cutlass"


def test_expert_biases_eliminate_the_backends_without_them():
    """FlashInfer CUTLASS declares `bias: false`; Triton takes biases."""
    decision = _decide(QWEN3, {**SM90, "overrides": {"model.has_bias": True}})
    cutlass = decision.candidate("flashinfer_cutlass")
    assert (cutlass.reason_code, cutlass.detail) == (
        ReasonCode.ACTIVATION_UNSUPPORTED,
        "expert biases are not supported",
    )
    assert decision.backend == "triton"


@pytest.mark.parametrize("platform", ["tpu", "oot"])
@pytest.mark.parametrize("lora", [False, True])
def test_a_delegating_platform_runs_moe_itself(platform, lora):
    """tpu and oot delegate MoE to the platform: the model checks and LoRA do not apply."""
    decision = _decide(NEMOTRON, {"platform": platform, "lora": lora})
    assert (decision.backend, decision.experts_class) == (platform, None)


def test_a_backend_of_either_format_runs_both():
    """vLLM's fp8 Humming experts take `activation_format: any`: feasible under the standard
    format and selected under DeepEP low-latency's batched one."""
    standard = Selector(DEEPSEEK, environ={}, engine="vllm", **SM90).decide()
    assert standard.activation_format == "standard" and standard.candidate("humming").alive
    batched = Selector(
        DEEPSEEK, environ={}, engine="vllm", all2all="deepep_low_latency", ep=True, dp=2, **SM90
    ).decide()
    assert (batched.activation_format, batched.backend) == ("batched", "humming")


def test_an_experts_class_check_does_not_replace_the_catalog_reason():
    """An extra check runs on backends the catalog left; an eliminated one keeps its code."""
    decision = _decide(
        QWEN3, SM90, extra_checks={"flashinfer_trtllm": lambda ctx: (False, "refused")}
    )
    trtllm = decision.candidate("flashinfer_trtllm")
    assert (trtllm.reason_code, trtllm.pass_name) == (
        ReasonCode.DEVICE_CAPABILITY_UNSUPPORTED,
        "feasibility",
    )


def test_a_backend_whose_experts_classes_all_refuse_is_eliminated():
    """Under vLLM, FlashInfer TRT-LLM has a monolithic and a modular experts class; DeepEP
    high-throughput suits neither, so the backend is out with the last class's reason."""
    decision = Selector(
        QWEN3,
        environ={},
        engine="vllm",
        platform="cuda",
        capability="10.0",
        all2all="deepep_high_throughput",
        ep=True,
        dp=2,
    ).decide()
    trtllm = decision.candidate("flashinfer_trtllm")
    assert trtllm.reason_code is ReasonCode.PARALLEL_CONFIG_UNSUPPORTED
    assert (trtllm.detail or "").startswith("TrtLlmBf16ExpertsModular: ")
    assert decision.backend == "triton"
