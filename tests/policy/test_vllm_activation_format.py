"""The vLLM profile's activation format is the one vLLM 0.33's prepare/finalize delivers:
batched under the DeepEP low-latency and NIXL-EP all2all kernels, and without all2all kernels
only on XPU for a batched_triton request. Elsewhere a batched_triton request cannot run (vLLM
would fail building its kernel): it is overridden, and the reason says why."""

from __future__ import annotations

import pytest

from moe_policy import BackendOverrideError, NoFeasibleBackendError, Selector
from moe_policy.core.decision import Outcome
from tests.bundled import QWEN3

H200 = {"platform": "cuda", "capability": "9.0", "device_name": "NVIDIA H200"}


def vllm_selector(**arguments: object) -> Selector:
    return Selector(QWEN3, environ={}, engine="vllm==0.33", **arguments)


def test_batched_triton_request_on_cuda_without_all2all_is_overridden_in_the_standard_format():
    decision = vllm_selector(backend="batched_triton", **H200).decide()
    assert (decision.activation_format, decision.outcome) == ("standard", Outcome.OVERRIDDEN)
    [override] = decision.overrides
    assert override.reason_code.value == "activation_format_mismatch"
    assert "standard format (parallel.all2all_active=none)" in (override.detail or "")
    with pytest.raises(BackendOverrideError):
        vllm_selector(backend="batched_triton", mode="strict", **H200).select()


def test_batched_triton_request_on_xpu_runs_in_the_batched_format():
    decision = vllm_selector(backend="batched_triton", platform="xpu").decide()
    assert (decision.backend, decision.activation_format) == ("batched_triton", "batched")
    assert decision.outcome is Outcome.HONORED
    _, origin = decision.context["parallel.activation_format"]
    assert "batched_triton request on XPU" in origin


def test_lora_under_xpus_batched_format_has_no_backend_rather_than_a_standard_one():
    with pytest.raises(NoFeasibleBackendError, match="batched_triton: lora_unsupported"):
        vllm_selector(backend="batched_triton", platform="xpu", lora=True).select()


def test_deepep_low_latency_kernels_give_the_batched_format_whatever_the_request():
    layout = {"ep": True, "dp": 2, "all2all": "deepep_low_latency"}
    decision = vllm_selector(backend="triton", **layout, **H200).decide()
    assert (decision.backend, decision.activation_format) == ("batched_triton", "batched")
    [adaptation] = decision.adaptations
    assert "batched format (parallel.all2all_active=deepep_low_latency)" in adaptation.reason
