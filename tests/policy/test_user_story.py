"""The story that started the project: LoRA on a BF16 Nemotron-3-Nano with a FlashInfer request."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from moe_policy import BackendOverrideError, BackendOverrideWarning, Outcome, ReasonCode
from tests.bundled import NEMOTRON, QWEN3

ENV_REQUEST = {"MOE_POLICY_BACKEND": "flashinfer_cutlass"}


@pytest.mark.parametrize("target", ["h200", "b200"])
def test_env_request_is_overridden_by_lora_with_a_structured_warning(
    make_selector, target, request
):
    """flashinfer_cutlass from env:MOE_POLICY_BACKEND + LoRA -> triton, warned with code and origin."""
    dry = request.getfixturevalue(target)
    selector = make_selector(NEMOTRON, environ=ENV_REQUEST, lora=True, **dry)
    with capture_logs() as logs, pytest.warns(BackendOverrideWarning) as warned:
        decision = selector.select()
    assert decision.backend == "triton"
    assert decision.outcome is Outcome.OVERRIDDEN
    override = decision.override
    assert override is not None
    assert (
        override.requested,
        override.selected,
        override.reason_code,
        override.pass_name,
        override.origin,
    ) == (
        "flashinfer_cutlass",
        "triton",
        ReasonCode.LORA_UNSUPPORTED,
        "lora",
        "env:MOE_POLICY_BACKEND",
    )
    assert warned[0].message.override == override
    events = [e for e in logs if e["event"] == "moe_policy.request_overridden"]
    assert len(events) == 1
    assert events[0]["log_level"] == "warning"
    assert {k: events[0][k] for k in ("requested", "origin", "selected", "reason_code")} == {
        "requested": "flashinfer_cutlass",
        "origin": "env:MOE_POLICY_BACKEND",
        "selected": "triton",
        "reason_code": "lora_unsupported",
    }


@pytest.mark.parametrize("target", ["h200", "b200"])
def test_strict_mode_refuses_with_the_same_facts(make_selector, target, request):
    """In strict mode the override is a BackendOverrideError carrying request, origin and reason."""
    dry = request.getfixturevalue(target)
    selector = make_selector(
        NEMOTRON, environ={**ENV_REQUEST, "MOE_POLICY_MODE": "strict"}, lora=True, **dry
    )
    with pytest.raises(BackendOverrideError) as info:
        selector.select()
    override = info.value.override
    assert (override.requested, override.origin, override.reason_code) == (
        "flashinfer_cutlass",
        "env:MOE_POLICY_BACKEND",
        ReasonCode.LORA_UNSUPPORTED,
    )
    assert info.value.decision.backend == "triton"
    assert "env:MOE_POLICY_BACKEND" in str(info.value) and "lora_unsupported" in str(info.value)


def test_request_from_a_policy_file_carries_file_line_col(make_selector, h200, tmp_path: Path):
    """A request written in a policy file is reported with the file:line:col of its value."""
    policy = tmp_path / "serving.yaml"
    policy.write_text("version: 1\n# fastest before LoRA\nbackend: flashinfer_cutlass\n")
    selector = make_selector(NEMOTRON, policy_files=[str(policy)], lora=True, **h200)
    with pytest.warns(BackendOverrideWarning):
        decision = selector.select()
    assert decision.override is not None
    assert decision.override.origin == f"file:{policy}:3:10"
    assert decision.to_dict()["requested"] == {
        "backend": "flashinfer_cutlass",
        "origin": f"file:{policy}:3:10",
        "adapted_from": None,
    }


def test_request_from_the_api_has_origin_api(make_selector, b200):
    """An API argument is the highest layer and is reported as origin `api`."""
    selector = make_selector(
        NEMOTRON,
        environ={"MOE_POLICY_BACKEND": "triton"},
        backend="flashinfer_cutlass",
        lora=True,
        **b200,
    )
    with pytest.warns(BackendOverrideWarning, match=re.escape("(from api)")):
        decision = selector.select()
    assert decision.override is not None and decision.override.origin == "api"
    assert decision.backend == "triton"


def test_without_lora_the_request_is_honoured_silently(make_selector, h200, recwarn):
    """No LoRA: flashinfer_cutlass can run Nemotron on SM90, so the request is honoured."""
    with capture_logs() as logs:
        decision = make_selector(NEMOTRON, environ=ENV_REQUEST, **h200).select()
    assert (decision.backend, decision.outcome) == ("flashinfer_cutlass", Outcome.HONORED)
    assert not decision.overrides
    assert not [w for w in recwarn if issubclass(w.category, BackendOverrideWarning)]
    assert not [e for e in logs if e["log_level"] == "warning"]


def test_lora_with_deepep_low_latency_keeps_the_batched_format(make_selector, h200):
    """LoRA + batched format -> batched_triton (a batched backend with LoRA), never plain triton."""
    decision = make_selector(
        NEMOTRON, lora=True, all2all="deepep_low_latency", ep=True, dp=2, **h200
    ).select()
    assert decision.backend == "batched_triton"
    assert decision.activation_format == "batched"
    assert decision.candidate("triton").reason_code is ReasonCode.ACTIVATION_FORMAT_MISMATCH


def test_triton_request_under_batched_format_becomes_batched_triton(make_selector, h200):
    """An explicit `triton` under the batched format is adapted, recorded and honoured."""
    with capture_logs() as logs:
        decision = make_selector(
            NEMOTRON, backend="triton", lora=True, all2all="deepep_low_latency", **h200
        ).select()
    assert (decision.backend, decision.outcome) == ("batched_triton", Outcome.HONORED)
    assert decision.requested is not None and decision.requested.adapted_from == "triton"
    assert [e["adapted_to"] for e in logs if e["event"] == "moe_policy.request_adapted"] == [
        "batched_triton"
    ]


def test_sm100_gated_silu_lora_defaults_to_triton(make_selector, b200):
    """Qwen3 (gated SiLU, I=768) + LoRA on SM100: TRT-LLM LoRA is feasible but Triton is preferred."""
    decision = make_selector(QWEN3, lora=True, **b200).select()
    assert decision.backend == "triton"
    assert decision.candidate("flashinfer_trtllm").alive
    assert [r.id for r in decision.rules if r.matched and r.applied] == ["lora-prefers-triton"]
    # the candidate that lost still says which class the engine would build for it here
    assert decision.candidate("flashinfer_trtllm").experts_class == "TrtLlmBf16LoRAExperts"
    assert (
        make_selector(QWEN3, **b200).select().candidate("flashinfer_trtllm").experts_class is None
    )


def test_a_policy_preferring_trtllm_picks_its_lora_variant(make_selector, b200, tmp_path: Path):
    """Preferring flashinfer_trtllm under LoRA selects the TrtLlmBf16LoRAExperts class."""
    policy = tmp_path / "prefer.yaml"
    policy.write_text(
        "rules:\n"
        "  - id: prefer-trtllm-lora\n"
        "    when: {lora.enabled: true}\n"
        "    effect: prefer\n"
        "    backends: [flashinfer_trtllm]\n"
        "    reason: measured faster for our adapters\n"
    )
    decision = make_selector(QWEN3, policy_files=[str(policy)], lora=True, **b200).select()
    assert (decision.backend, decision.experts_class) == (
        "flashinfer_trtllm",
        "TrtLlmBf16LoRAExperts",
    )


def test_trtllm_lora_needs_intermediate_multiple_of_128(make_selector, b200, tmp_path: Path):
    """tp=4 shards Qwen3's I=768 to 192: the TRT-LLM LoRA gate refuses it with lora_unsupported."""
    policy = tmp_path / "prefer.yaml"
    policy.write_text(
        "rules:\n  - {id: p, when: {lora.enabled: true}, effect: prefer, backends: [flashinfer_trtllm], reason: r}\n"
    )
    decision = make_selector(QWEN3, policy_files=[str(policy)], lora=True, tp=4, **b200).select()
    assert decision.backend == "triton"
    cand = decision.candidate("flashinfer_trtllm")
    assert cand.reason_code is ReasonCode.LORA_UNSUPPORTED
    assert "multiple_of 128" in (cand.detail or "")


def test_trtllm_lora_refuses_non_gated_experts(make_selector, b200):
    """Nemotron's relu2 experts are non-gated: the TRT-LLM LoRA class cannot take them."""
    decision = make_selector(NEMOTRON, lora=True, **b200).select()
    cand = decision.candidate("flashinfer_trtllm")
    assert cand.reason_code is ReasonCode.LORA_UNSUPPORTED
    assert "model.gated" in (cand.detail or "")


def test_a_request_a_rule_forbids_is_overridden_naming_the_rule(make_selector):
    """`aiter` asked for on ROCm without VLLM_ROCM_USE_AITER: rocm-aiter-opt-in vetoes it, and
    the override names the rule, its pass and the backend that runs instead."""
    with pytest.warns(BackendOverrideWarning):
        decision = make_selector(QWEN3, platform="rocm", backend="aiter").select()
    assert (decision.backend, decision.outcome) == ("triton", Outcome.OVERRIDDEN)
    override = decision.override
    assert override is not None
    assert (
        override.requested,
        override.selected,
        override.reason_code,
        override.pass_name,
        override.rule,
        override.origin,
    ) == ("aiter", "triton", ReasonCode.POLICY_FORBID, "policy_rules", "rocm-aiter-opt-in", "api")
    # the record still marks the vetoed backend as the requested one
    aiter = decision.candidate("aiter")
    assert (aiter.requested, aiter.rule) == (True, "rocm-aiter-opt-in")
    assert not aiter.alive


def test_an_adapted_request_is_overridden_under_the_name_asked_for(make_selector, h200):
    """`triton` under the batched format becomes batched_triton, which is not batch-invariant:
    the override names `triton`, what the caller asked for, with batched_triton's reason."""
    decision = make_selector(
        QWEN3, backend="triton", all2all="deepep_low_latency", batch_invariant=True, **h200
    ).decide()
    assert decision.requested is not None
    assert (decision.requested.backend, decision.requested.adapted_from) == (
        "batched_triton",
        "triton",
    )
    assert [(o.requested, o.reason_code, o.pass_name) for o in decision.overrides] == [
        ("triton", ReasonCode.BATCH_INVARIANCE_UNSUPPORTED, "feasibility")
    ]
    assert decision.candidate("batched_triton").requested
