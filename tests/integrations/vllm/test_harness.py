"""The vLLM harness itself: its fake platform gives the outcomes verified against vLLM 0.33.0's
selection code, leaves no trace, and its configs are the ones vLLM builds.

Runs only where vllm is installed (``bash scripts/vllm_env.sh``; then
``.venv-vllm/bin/python -m pytest -q tests/integrations/vllm``); the main suite skips it.
"""

from __future__ import annotations

import collections
import logging
import os
import sys
import time
import types
from unittest import mock

import pytest

pytest.importorskip("vllm")

import torch
import vllm.envs as envs
import vllm.model_executor.layers.fused_moe.config as vllm_moe_config
from vllm._aiter_ops import rocm_aiter_ops
from vllm.config import ParallelConfig
from vllm.model_executor.layers.fused_moe.experts import (
    flashinfer_cutlass_moe,
    trtllm_bf16_moe,
    trtllm_lora_moe,
)

from tests.integrations.vllm import harness
from tests.integrations.vllm.harness import Case, Outcome, oracle_outcome


def case(
    model: str = "mixtral-8x7b", platform: str = "cuda9.0+fi", layout: str = "tp1", **kw
) -> Case:
    return harness._case(model, platform, layout, **kw)


def outcome(*args, **kw) -> Outcome:
    return oracle_outcome(case(*args, **kw))


def picked(*args, **kw) -> tuple[str | None, str | None]:
    result = outcome(*args, **kw)
    assert result.error is None, result.error
    return result.backend, result.experts_class


# --- outcomes verified against vLLM 0.33.0 --------------------------------------------------------


@pytest.mark.parametrize(
    ("platform", "expected"),
    [
        ("cuda9.0", ("TRITON", "TritonExperts")),
        ("cuda9.0+fi", ("TRITON", "TritonExperts")),  # SM90 demotes both FlashInfer backends
        ("cuda10.0", ("TRITON", "TritonExperts")),
        ("cuda10.0+fi", ("FLASHINFER_TRTLLM", "TrtLlmBf16ExpertsMonolithic")),
        ("cuda11.0+fi", ("TRITON", "TritonExperts")),  # TRTLLM is SM10x only, CUTLASS skips SM110
        ("cuda12.0+fi", ("FLASHINFER_CUTLASS", "FlashInferExperts")),
        ("cuda8.0+fi", ("TRITON", "TritonExperts")),
        ("rocm", ("TRITON", "TritonExperts")),
        ("rocm+aiter", ("TRITON", "TritonExperts")),  # VLLM_ROCM_USE_AITER defaults to off
        ("rocm+aiter+env", ("AITER", "AiterUnquantizedExperts")),
        ("rocm+aiter+env+moe0", ("TRITON", "TritonExperts")),
        ("rocm+aiter+env0+moe1", ("TRITON", "TritonExperts")),
        ("rocm+rdna", ("TRITON", "TritonExperts")),
        ("rocm+rdna+env", ("TRITON", "TritonExperts")),  # gfx12: no CK AITER MoE
        ("cpu-x86", ("CPU", "CPUUnquantizedExperts")),
        ("cpu-x86-amx", ("CPU", "X86CPUUnquantizedExperts")),
        ("cpu-arm", ("CPU", "ArmCPUUnquantizedExperts")),
        ("cpu-power", ("CPU", "PowerCPUUnquantizedExperts")),
        ("xpu", ("XPU", "XPUExperts")),
        ("tpu", ("TPU", None)),
        ("oot", ("OOT", None)),
    ],
)
def test_mixtral_tp1_per_platform(platform, expected):
    assert picked("mixtral-8x7b", platform) == expected


def test_cpu_dtype_picks_the_portable_kernel_unless_bf16():
    assert picked(platform="cpu-x86-amx", dtype="fp16") == ("CPU", "CPUUnquantizedExperts")
    assert picked(platform="cpu-arm", dtype="fp32") == ("CPU", "CPUUnquantizedExperts")


@pytest.mark.parametrize(
    ("platform", "layout", "expected"),
    [
        ("cuda9.0", "ep-dp2-deepep_low_latency", ("BATCHED_TRITON", "BatchedTritonExperts")),
        ("cuda9.0", "ep-dp2-nixl_ep", ("BATCHED_TRITON", "BatchedTritonExperts")),
        ("cuda10.0+fi", "ep-dp2-deepep_low_latency", ("BATCHED_TRITON", "BatchedTritonExperts")),
        ("cuda9.0", "ep-dp2-moonep", ("MOONEP", "MoonEPExperts")),
        ("cuda10.0+fi", "ep-dp2-moonep", ("MOONEP", "MoonEPExperts")),
        # EP without DP uses no all2all kernels, so the moonep name changes nothing.
        ("cuda10.0+fi", "ep-tp2", ("FLASHINFER_TRTLLM", "TrtLlmBf16ExpertsMonolithic")),
        (
            "cuda10.0+fi",
            "ep-dp2-allgather_reducescatter",
            ("FLASHINFER_TRTLLM", "TrtLlmBf16ExpertsMonolithic"),
        ),
        # Monolithic TRTLLM refuses DeepEP-HT all2all, Modular refuses it too, CUTLASS is demoted
        # behind Triton under DP.
        ("cuda10.0+fi", "ep-dp2-deepep_high_throughput", ("TRITON", "TritonExperts")),
        ("cuda10.0+fi", "ep-dp2+eplb", ("TRITON", "TritonExperts")),
        ("rocm+aiter+env", "ep-dp2-mori_low_latency", ("AITER", "AiterUnquantizedExperts")),
    ],
)
def test_parallel_layouts(platform, layout, expected):
    assert picked(platform=platform, layout=layout) == expected


def test_flashinfer_nvlink_all2all_has_no_backend_on_hopper():
    result = outcome(platform="cuda9.0", layout="ep-dp2-flashinfer_nvlink_two_sided")
    assert result == Outcome(
        None,
        None,
        "NotImplementedError: No Unquantized MoE backend supports the deployment configuration.",
    )


def test_mori_without_aiter_fails_at_config():
    result = outcome(platform="cuda9.0", layout="ep-dp2-mori_low_latency")
    assert result.error == "AssertionError: Mori needs to be used with aiter fused_moe for now."


def test_activation_and_routing_steer_the_flashinfer_pick_on_sm100():
    # TRTLLM monolithic refuses TopK routing; CUTLASS takes it.
    assert picked(platform="cuda10.0+fi", routing="TopK") == (
        "FLASHINFER_CUTLASS",
        "FlashInferExperts",
    )
    # SWIGLUOAI moves both FlashInfer backends behind Triton.
    assert picked("gpt-oss-20b", "cuda10.0+fi") == ("TRITON", "TritonExperts")
    # Nemotron's non-gated relu2 runs on TRTLLM (it accepts RELU2_NO_MUL and DeepSeekV3 routing).
    assert picked("nemotron-3-nano", "cuda10.0+fi") == (
        "FLASHINFER_TRTLLM",
        "TrtLlmBf16ExpertsMonolithic",
    )


def test_lora_returns_before_any_support_check():
    assert picked(platform="cpu-x86", lora=True) == ("TRITON", "TritonExperts")
    assert picked(platform="xpu", lora=True) == ("TRITON", "TritonExperts")
    assert picked(platform="cuda9.0", layout="ep-dp2-deepep_low_latency", lora=True) == (
        "TRITON",
        "TritonExperts",
    )
    assert picked(platform="cuda10.0", lora=True, moe_backend="flashinfer_cutlass") == (
        "TRITON",
        "TritonExperts",
    )
    # SM100 with FlashInfer and an intermediate per partition that is a multiple of 128 ...
    assert picked(platform="cuda10.0+fi", lora=True) == (
        "FLASHINFER_TRTLLM",
        "TrtLlmBf16LoRAExperts",
    )
    assert picked("qwen3-30b-a3b", "cuda10.0+fi", lora=True) == (
        "FLASHINFER_TRTLLM",
        "TrtLlmBf16LoRAExperts",
    )
    # ... but Qwen3's 768 over a TP group of 4 is 192: the TRTLLM LoRA gate falls back to Triton.
    assert picked("qwen3-30b-a3b", "cuda10.0+fi", "tp2dp2", lora=True) == (
        "TRITON",
        "TritonExperts",
    )


def test_non_gated_activation_off_cuda_rocm_xpu_fails_at_config():
    expected = (
        "NotImplementedError: is_act_and_mul=False is supported only for CUDA, XPU and ROCm for now"
    )
    for platform in ("cpu-x86", "cpu-arm"):
        assert outcome("nemotron-3-nano", platform).error == expected
    # Checked before the TPU/OOT early return, since it is the config that raises.
    assert outcome("nemotron-3-nano", "tpu").error == expected
    assert picked("nemotron-3-nano", "xpu") == ("XPU", "XPUExperts")
    assert picked("nemotron-3-nano", "rocm+aiter+env") == ("TRITON", "TritonExperts")


def test_explicit_moe_backend():
    result = outcome(platform="cuda9.0+fi", moe_backend="flashinfer_trtllm")
    assert result.backend is None and result.experts_class is None
    assert result.error == (
        "ValueError: Unquantized MoE backend FlashInfer TRTLLM does not support the deployment "
        "configuration since kernel does not support current device cuda."
    )
    assert outcome(moe_backend="deep_gemm").error.startswith(
        "ValueError: moe_backend='deep_gemm' is not supported for unquantized MoE."
    )
    # Quantization-only backends fall through to auto.
    assert picked(platform="cuda9.0", moe_backend="marlin") == ("TRITON", "TritonExperts")
    assert picked(platform="cuda10.0+fi", moe_backend="humming") == (
        "FLASHINFER_TRTLLM",
        "TrtLlmBf16ExpertsMonolithic",
    )
    assert picked(platform="cuda9.0", moe_backend="batched_triton") == (
        "BATCHED_TRITON",
        "BatchedTritonExperts",
    )
    # triton under a batched all2all becomes batched_triton.
    assert picked(platform="cuda9.0", layout="ep-dp2-deepep_low_latency", moe_backend="triton") == (
        "BATCHED_TRITON",
        "BatchedTritonExperts",
    )
    # flashinfer_trtllm on SM100 under TP-only: Monolithic first.
    assert picked(platform="cuda10.0+fi", moe_backend="flashinfer_trtllm") == (
        "FLASHINFER_TRTLLM",
        "TrtLlmBf16ExpertsMonolithic",
    )


def test_environment_switches():
    invariant = (("VLLM_BATCH_INVARIANT", "1"),)
    assert picked(platform="xpu", env=invariant) == ("TRITON", "TritonExperts")
    assert picked(platform="cuda10.0+fi", env=invariant) == ("TRITON", "TritonExperts")
    assert outcome(platform="cpu-x86", env=invariant).error == (
        "NotImplementedError: No Unquantized MoE backend supports the deployment configuration."
    )
    # The AITER switches are read on every platform; off ROCm AITER is tried and skipped.
    aiter = (("VLLM_ROCM_USE_AITER", "1"),)
    assert picked(platform="cuda10.0+fi", env=aiter) == (
        "FLASHINFER_TRTLLM",
        "TrtLlmBf16ExpertsMonolithic",
    )


def test_removed_all2all_backends_are_rewritten_as_parallel_config_does():
    for name in ("naive", "pplx"):
        assert ParallelConfig(all2all_backend=name).all2all_backend == "allgather_reducescatter"
        c = case(platform="cuda10.0+fi", layout="ep-dp2-allgather_reducescatter", all2all=name)
        assert harness.parallel_config(c).all2all_backend == "allgather_reducescatter"
    with pytest.raises(ValueError, match="unknown all2all backend"):
        harness.parallel_config(case(all2all="bogus"))


# --- lora_layer_outcome ---------------------------------------------------------------------------


def test_lora_layer_refuses_ep_with_other_all2all():
    message = harness.lora_layer_outcome(
        case(platform="cuda9.0", layout="ep-dp2-deepep_low_latency", lora=True)
    )
    assert message == (
        "AssertionError: Fused MoE LoRA with EP currently only supports "
        "all2all_backend='allgather_reducescatter', got 'deepep_low_latency'."
    )


def test_lora_layer_outcomes():
    lora = harness.lora_layer_outcome
    assert (
        lora(case(platform="cuda9.0", layout="ep-dp2-allgather_reducescatter", lora=True)) is None
    )
    assert lora(case(platform="cuda10.0+fi", lora=True)) is None  # TrtLlmBf16LoRAExperts
    assert lora(case(platform="cpu-x86", lora=True)) is None  # Triton, even there
    # EP checks run even without all2all kernels (EP over TP only): the name still counts.
    assert "got 'moonep'" in lora(
        case(platform="cuda9.0", layout="ep-tp2", lora=True, all2all="moonep")
    )
    sp = lora(case(platform="cuda9.0", layout="ep-tp2dp2-allgather_reducescatter+sp", lora=True))
    assert sp == "AssertionError: assert not moe_config.moe_parallel_config.is_sequence_parallel"
    # TPU/OOT pick no experts class: vLLM's is_monolithic property then fails (torch's
    # Module.__getattr__ rewords the AttributeError), before the "Old-style modular kernel" check.
    no_experts = (
        "AttributeError: 'UnquantizedFusedMoEMethod' object has no attribute 'is_monolithic'"
    )
    assert lora(case(platform="tpu", lora=True)) == no_experts
    assert lora(case(platform="oot", lora=True)) == no_experts
    # Without LoRA there is no LoRA layer; a failing oracle never gets to one.
    assert lora(case(platform="cuda9.0", layout="ep-dp2-deepep_low_latency")) is None
    assert lora(case("nemotron-3-nano", "cpu-x86", lora=True)) is None


@pytest.mark.parametrize(
    ("platform", "layout", "backend", "built"),
    [
        ("cuda9.0", "tp1", "auto", True),
        ("cuda9.0", "tp1", "batched_triton", False),  # batched class, standard prepare/finalize
        ("rocm", "tp2", "batched_triton", False),
        ("xpu", "tp1", "batched_triton", True),  # XPU's BatchedPrepareAndFinalize
    ],
)
def test_kernel_build_outcome_is_what_vllms_kernel_build_does(platform, layout, backend, built):
    """kernel_build_outcome against vLLM's own make_unquantized_moe_kernel, on the paths that
    need no all2all manager (no all2all kernels, one DP rank)."""
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.layers.fused_moe.config import FUSED_MOE_UNQUANTIZED_CONFIG

    c = case(platform=platform, layout=layout, moe_backend=backend)
    predicted = harness.kernel_build_outcome(c)
    with harness.faked_platform(c), set_current_vllm_config(harness.vllm_config(c)):
        config = harness.moe_config(c)
        selected, experts = harness.oracle.select_unquantized_moe_backend(config)
        try:
            harness.oracle.make_unquantized_moe_kernel(
                FUSED_MOE_UNQUANTIZED_CONFIG, config, selected, experts
            )
            error = None
        except (TypeError, ValueError) as exc:
            error = f"{type(exc).__name__}: {exc}"
    assert (error is None) is built
    assert predicted == error


def test_monolithic_is_read_through_vllms_own_property():
    assert harness._method_is_monolithic(trtllm_bf16_moe.TrtLlmBf16ExpertsMonolithic) is True
    assert harness._method_is_monolithic(trtllm_bf16_moe.TrtLlmBf16ExpertsModular) is False
    assert harness._method_is_monolithic(trtllm_lora_moe.TrtLlmBf16LoRAExperts) is False
    with pytest.raises(AttributeError, match="'UnquantizedFusedMoEMethod' object has no attribute"):
        harness._method_is_monolithic(None)


# --- configs are vLLM's -----------------------------------------------------------------------------


@pytest.mark.parametrize("layout", [*harness.LAYOUTS, "naive", "pplx"])
def test_parallel_config_is_what_make_builds(layout):
    if layout in ("naive", "pplx"):
        c = case(platform="cuda10.0+fi", layout="ep-dp2-allgather_reducescatter", all2all=layout)
    else:
        c = case(platform="cuda10.0+fi", layout=layout)
    with harness.faked_platform(c):
        vllm_parallel = ParallelConfig(enable_expert_parallel=c.ep, all2all_backend=c.all2all)
        vllm_parallel.enable_eplb = c.eplb  # set after: its validation wants a real world size
        group = types.SimpleNamespace(rank_in_group=0)
        with (
            mock.patch.object(vllm_moe_config, "get_tensor_model_parallel_rank", lambda: 0),
            mock.patch.object(vllm_moe_config, "get_dp_group", lambda: group),
            mock.patch.object(vllm_moe_config, "get_pcp_group", lambda: group),
        ):
            made = vllm_moe_config.FusedMoEParallelConfig.make(
                tp_size_=c.tp,
                pcp_size_=1,
                dp_size_=c.dp,
                sp_size_=c.tp if c.sp else 1,
                vllm_parallel_config=vllm_parallel,
            )
    assert harness.parallel_config(c) == made


def test_moe_config_partitions_like_vllm():
    with harness.faked_platform(c := case("qwen3-30b-a3b", "cuda9.0", "tp2dp2")):
        config = harness.moe_config(c)
    assert (config.tp_size, config.ep_size, config.intermediate_size_per_partition) == (4, 1, 192)
    assert config.num_local_experts == 128
    with harness.faked_platform(c := case("deepseek-v3", "cuda9.0", "ep-dp2-deepep_low_latency")):
        config = harness.moe_config(c)
    assert (config.tp_size, config.ep_size, config.intermediate_size_per_partition) == (1, 2, 2048)
    assert (config.num_local_experts, config.num_logical_experts) == (128, 256)
    assert config.in_dtype is torch.bfloat16 and config.is_lora_enabled is False
    with harness.faked_platform(c := case("gpt-oss-20b", "cuda9.0", lora=True, dtype="fp16")):
        config = harness.moe_config(c)
    assert config.has_bias and config.is_lora_enabled and config.in_dtype is torch.float16
    assert config.activation.value == "swigluoai"
    assert (
        config.rocm_aiter_fmoe_enabled is None
    )  # off ROCm the @if_aiter_supported wrapper says None
    with harness.faked_platform(c := case(platform="rocm+aiter+env")):
        assert harness.moe_config(c).rocm_aiter_fmoe_enabled is True


# --- the fake leaves no trace ---------------------------------------------------------------------


def _state() -> dict:
    platform = harness.PLATFORM
    return {
        "platform": dict(vars(platform)),
        "platform_cls": dict(vars(type(platform))),
        "enum": platform._enum,
        "capability": platform.get_device_capability(),
        "environ": dict(os.environ),
        "aiter_found": harness._aiter_ops.IS_AITER_FOUND,
        "aiter": harness._aiter_class_state(),
        "rocm_module": sys.modules.get("vllm.platforms.rocm"),
        "probes": [(module.__name__, name) for module, name, _ in harness._probe_bindings()],
        "amx": vars(torch.cpu)["_is_amx_tile_supported"],
    }


def test_rocm_then_cuda_gets_the_cuda_result():
    before = _state()
    assert picked(platform="rocm+aiter+env") == ("AITER", "AiterUnquantizedExperts")
    assert picked(platform="cuda10.0+fi") == ("FLASHINFER_TRTLLM", "TrtLlmBf16ExpertsMonolithic")
    assert picked(platform="cuda9.0") == ("TRITON", "TritonExperts")
    assert _state() == before


def test_fake_is_undone_after_an_exception():
    before = _state()
    with (
        pytest.raises(RuntimeError, match="boom"),
        harness.faked_platform(case(platform="rocm+rdna+env")),
    ):
        assert harness.PLATFORM.is_rocm() and harness.PLATFORM.is_cuda_alike()
        assert os.environ["VLLM_ROCM_USE_AITER"] == "1"
        assert rocm_aiter_ops.is_rdna_aiter_enabled() is True
        assert "vllm.platforms.rocm" in sys.modules
        raise RuntimeError("boom")
    assert _state() == before
    assert not harness.PLATFORM.is_rocm()


def test_fake_sets_what_vllm_reads():
    with harness.faked_platform(case(platform="cuda10.0+fi")):
        p = harness.PLATFORM
        assert p.is_cuda() and p.is_cuda_alike() and not p.is_rocm() and p.device_name == "cuda"
        assert p.is_device_capability_family(100) and p.has_device_capability(90)
        assert harness._probe_bindings() == []  # every binding is the fake's now
        assert trtllm_bf16_moe.has_flashinfer_trtllm_fused_moe() is True
        assert trtllm_lora_moe.has_flashinfer_trtllm_fused_moe() is True
        assert flashinfer_cutlass_moe.has_flashinfer_cutlass_fused_moe() is True
    with harness.faked_platform(case(platform="cuda10.0")):
        assert trtllm_bf16_moe.has_flashinfer_trtllm_fused_moe() is False
    with harness.faked_platform(case(platform="cpu-arm")):
        assert harness.PLATFORM.is_cpu() and harness.PLATFORM.get_device_capability() is None
        assert harness.PLATFORM.get_cpu_architecture().name == "ARM"
    with harness.faked_platform(case(platform="rocm+aiter+env")):
        assert rocm_aiter_ops.is_fused_moe_enabled() is True
        assert rocm_aiter_ops.is_rdna_aiter_enabled() is False


def test_outer_environment_does_not_leak_into_a_case(monkeypatch):
    monkeypatch.setenv("VLLM_ROCM_USE_AITER", "1")
    monkeypatch.setenv("VLLM_BATCH_INVARIANT", "1")
    # rocm+aiter sets no env: AITER stays off and batch invariance is not asked for.
    assert picked(platform="rocm+aiter") == ("TRITON", "TritonExperts")
    assert picked(platform="cuda10.0+fi") == ("FLASHINFER_TRTLLM", "TrtLlmBf16ExpertsMonolithic")
    assert os.environ["VLLM_ROCM_USE_AITER"] == "1" and os.environ["VLLM_BATCH_INVARIANT"] == "1"


def test_an_enabled_vllm_env_cache_is_bypassed_and_kept(monkeypatch):
    monkeypatch.setenv("VLLM_BATCH_INVARIANT", "1")
    envs.enable_envs_cache()
    try:
        assert envs.VLLM_BATCH_INVARIANT is True
        assert picked(platform="xpu", env=(("VLLM_BATCH_INVARIANT", "1"),)) == (
            "TRITON",
            "TritonExperts",
        )
        assert picked(platform="xpu") == ("XPU", "XPUExperts")  # the case's env, not the cache
        assert envs._is_envs_cache_enabled()
        assert envs.VLLM_BATCH_INVARIANT is True  # cached again from the outer environment
    finally:
        envs.disable_envs_cache()


def test_once_logging_is_per_case(caplog):
    c = case(platform="cuda10.0+fi", env=(("VLLM_ROCM_USE_AITER", "1"),))
    for _ in range(2):
        caplog.clear()
        with caplog.at_level(logging.DEBUG, logger="vllm"):
            oracle_outcome(c)
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert any("VLLM_ROCM_USE_AITER_MOE=1 was requested" in w for w in warnings)
        assert any(
            "Using FlashInfer TRTLLM Unquantized MoE backend" in r.getMessage()
            for r in caplog.records
        )


def test_outcomes_do_not_depend_on_order():
    sample = harness.grid()[::17]
    forward = [oracle_outcome(c) for c in sample]
    backward = [oracle_outcome(c) for c in reversed(sample)][::-1]
    assert forward == backward


# --- the grid ---------------------------------------------------------------------------------------


def test_grid_is_broad_deterministic_and_uniquely_named():
    cases = harness.grid()
    assert 2000 <= len(cases) <= 5000
    assert cases == harness.grid()
    assert len({c.name for c in cases}) == len(cases)
    assert {c.platform for c in cases} == {"cuda", "rocm", "cpu", "xpu", "tpu", "oot"}
    assert {c.capability for c in cases if c.platform == "cuda"} == {
        (8, 0),
        (9, 0),
        (10, 0),
        (11, 0),
        (12, 0),
    }
    assert {c.moe_backend for c in cases} == {"auto", *harness.MOE_BACKENDS}
    assert {c.all2all for c in cases if c.ep and c.dp > 1} >= set(harness.EP_ALL2ALL)
    assert {(c.hidden, c.num_experts) for c in cases} >= {
        (4096, 8),
        (2048, 128),
        (2688, 128),
        (7168, 256),
        (2880, 32),
        (5120, 16),
    }
    assert (
        any(c.lora and c.ep for c in cases)
        and any(c.eplb for c in cases)
        and any(c.sp for c in cases)
    )
    assert {dict(c.env).get("VLLM_BATCH_INVARIANT") for c in cases} == {None, "1"}
    assert {c.rdna for c in cases if c.platform == "rocm"} == {False, True}


@pytest.mark.slow
def test_whole_grid_runs_fast_and_every_outcome_is_vllms_own():
    """No harness-level failure hides in the grid: every error is one vLLM raises on purpose."""
    before = _state()
    cases = harness.grid()
    start = time.perf_counter()
    outcomes = [oracle_outcome(c) for c in cases]
    elapsed = time.perf_counter() - start
    assert elapsed < 60, f"{len(cases)} cases took {elapsed:.1f} s"
    assert _state() == before
    kinds = collections.Counter(o.error.split(":", 1)[0] for o in outcomes if o.error)
    assert set(kinds) <= {"ValueError", "NotImplementedError", "AssertionError"}, kinds
    messages = {o.error for o in outcomes if o.error}
    for message in messages:
        assert message.startswith(
            (
                "ValueError: Unquantized MoE backend ",
                "ValueError: moe_backend='deep_gemm' is not supported",
                "NotImplementedError: No Unquantized MoE backend supports",
                "NotImplementedError: is_act_and_mul=False is supported only",
                "AssertionError: Mori needs to be used with aiter",
            )
        ), message
    backends = {o.backend for o in outcomes if o.backend}
    assert backends == {
        "FLASHINFER_TRTLLM",
        "FLASHINFER_CUTLASS",
        "AITER",
        "TRITON",
        "BATCHED_TRITON",
        "MOONEP",
        "CPU",
        "XPU",
        "TPU",
        "OOT",
    }
    lora = [harness.lora_layer_outcome(c) for c in cases if c.lora]
    assert None in lora and any(m and "allgather_reducescatter" in m for m in lora)
