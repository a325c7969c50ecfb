"""vLLM's own backend-selection scenarios (tests/kernels/moe/test_unquantized_backend_selection.py
in vLLM's repository), rewritten here and run through the plugin with the default policy.

Where vLLM's main branch has moved past the 0.33.0 release, the release wins: its LoRA layer
accepts expert parallelism only with allgather_reducescatter, so the main branch's
"LoRA + DeepEP low-latency -> BATCHED_TRITON" is a start-up crash in 0.33, and here a clear
error naming that constraint.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import replace

import pytest

pytest.importorskip("vllm")

from vllm.model_executor.layers.fused_moe.oracle.unquantized import (
    UnquantizedMoeBackend as B,
)

from moe_policy import BackendOverrideWarning, PolicyError
from moe_policy.core.state import STATE
from moe_policy.integrations.vllm.selection import select_unquantized_moe_backend
from tests.integrations.vllm.harness import Case, faked_platform, moe_config

#: vLLM's make_dummy_moe_config(): SiLU, no parallelism.
DUMMY = Case(
    name="dummy", num_experts=8, top_k=2, hidden=1024, intermediate=1024,
    activation="silu", routing="Renormalize", flashinfer=False,
)  # fmt: skip


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    for name in [n for n in os.environ if n.startswith("MOE_POLICY_")]:
        monkeypatch.delenv(name)
    STATE.selectors.clear()
    STATE.reporting.clear()


def select(case: Case) -> tuple[B, str | None, list[BackendOverrideWarning]]:
    with faked_platform(case), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        backend, cls = select_unquantized_moe_backend(moe_config(case))
    overrides = [w.message for w in caught if isinstance(w.message, BackendOverrideWarning)]
    return backend, getattr(cls, "__name__", None), overrides


@pytest.mark.parametrize(
    ("platform", "backend", "cls"),
    [
        ("cuda", B.TRITON, "TritonExperts"),
        ("rocm", B.TRITON, "TritonExperts"),
        ("cpu", B.CPU, "CPUUnquantizedExperts"),
        ("xpu", B.XPU, "XPUExperts"),
        ("tpu", B.TPU, None),
        ("oot", B.OOT, None),
    ],
)
def test_select_default_backend_by_platform(platform, backend, cls):
    case = replace(DUMMY, platform=platform, capability=(9, 0) if platform == "cuda" else None)
    assert select(case)[:2] == (backend, cls)


@pytest.mark.parametrize("platform", ["cuda", "rocm", "xpu"])
def test_select_lora_backend_prefers_triton(platform):
    case = replace(
        DUMMY, platform=platform, lora=True, flashinfer=True, aiter=True,
        env=(("VLLM_ROCM_USE_AITER", "1"),), capability=(9, 0) if platform == "cuda" else None,
    )  # fmt: skip
    backend, cls, _ = select(case)
    assert (backend, cls) == (B.TRITON, "TritonExperts")


@pytest.mark.parametrize("platform", ["cuda", "rocm", "xpu"])
def test_lora_with_deepep_low_latency_is_a_clear_error_in_the_release(platform):
    """Main branch: BATCHED_TRITON (cuda, rocm) or a ValueError (xpu). vLLM 0.33.0's LoRA
    layer rejects EP without allgather_reducescatter: refused at selection, naming it."""
    case = replace(
        DUMMY, platform=platform, lora=True, ep=True, dp=2, all2all="deepep_low_latency",
        capability=(9, 0) if platform == "cuda" else None,
    )  # fmt: skip
    with pytest.raises(PolicyError, match="allgather_reducescatter"):
        select(case)


def test_select_rocm_aiter_backend():
    case = replace(
        DUMMY, platform="rocm", capability=None, aiter=True, env=(("VLLM_ROCM_USE_AITER", "1"),)
    )
    assert select(case)[:2] == (B.AITER, "AiterUnquantizedExperts")


def test_rocm_swiglustep_falls_back_from_aiter_to_triton_with_a_warning():
    case = replace(
        DUMMY, platform="rocm", capability=None, aiter=True, activation="swiglustep",
        env=(("VLLM_ROCM_USE_AITER", "1"), ("VLLM_ROCM_USE_AITER_MOE", "1")),
    )  # fmt: skip
    backend, cls, overrides = select(case)
    assert (backend, cls) == (B.TRITON, "TritonExperts")
    assert [o.override.origin for o in overrides] == ["env:VLLM_ROCM_USE_AITER"]


def test_select_cuda_flashinfer_trtllm_backend():
    case = replace(
        DUMMY, capability=(10, 0), flashinfer=True, moe_backend="flashinfer_trtllm", ep=True, tp=2
    )
    assert select(case)[:2] == (B.FLASHINFER_TRTLLM, "TrtLlmBf16ExpertsMonolithic")


def test_select_cuda_flashinfer_cutlass_backend():
    case = replace(DUMMY, capability=(12, 0), flashinfer=True, moe_backend="flashinfer_cutlass")
    assert select(case)[:2] == (B.FLASHINFER_CUTLASS, "FlashInferExperts")


def test_lora_overrides_an_explicit_non_triton_backend_and_says_so():
    case = replace(
        DUMMY, capability=(9, 0), flashinfer=True, lora=True, moe_backend="flashinfer_cutlass"
    )
    backend, cls, overrides = select(case)
    assert (backend, cls) == (B.TRITON, "TritonExperts")
    [warning] = overrides
    assert warning.override.origin == "vllm:--moe-backend"
    assert warning.override.reason_code.value == "lora_unsupported"


@pytest.mark.parametrize("lora", [False, True])
def test_select_explicit_triton_backend(lora):
    case = replace(DUMMY, capability=(9, 0), lora=lora, moe_backend="triton")
    backend, cls, overrides = select(case)
    assert (backend, cls, overrides) == (B.TRITON, "TritonExperts", [])


@pytest.mark.parametrize("lora", [False, True])
def test_explicit_triton_ignores_the_removed_flashinfer_variables(lora):
    case = replace(
        DUMMY, capability=(10, 0), flashinfer=True, lora=lora, moe_backend="triton",
        env=(("VLLM_USE_FLASHINFER_MOE_FP16", "1"), ("VLLM_FLASHINFER_MOE_BACKEND", "throughput")),
    )  # fmt: skip
    assert select(case)[:2] == (B.TRITON, "TritonExperts")
