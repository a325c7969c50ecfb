"""moe_policy with ``engine: vllm`` against vLLM 0.33's own selection, over a broad grid.

For every case the real ``select_unquantized_moe_backend`` runs under a faked platform, and
moe_policy decides twice: inside vLLM (the integration, which also asks vLLM's experts
classes) and as a dry run from the bare facts (the vLLM profile's YAML alone). Both must
agree with vLLM, except where moe_policy deliberately differs; each such case carries one of
the reason codes listed in docs/vllm.md, and each code is seen at least once.
"""

from __future__ import annotations

import collections
import json
import logging
import os
import warnings
from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("vllm")

from vllm.model_executor.layers.quantization.utils import quant_utils as qk

from moe_policy import (
    MoEPolicyError,
    PlatformFacts,
    Selector,
)
from moe_policy.core.state import STATE
from moe_policy.integrations.vllm import facts, selection, wna16
from tests.bundled import REPO
from tests.integrations.vllm.harness import (
    INT8_QUANTS,
    QUANTS,
    WNA16_QUANTS,
    Case,
    faked_platform,
    fp8_grid,
    fp8_keys,
    grid,
    int8_grid,
    kernel_build_outcome,
    lora_layer_outcome,
    moe_config,
    mxfp4_grid,
    mxfp8_grid,
    nvfp4_grid,
    oracle_outcome,
    parallel_config,
    set_current_vllm_config,
    vllm_config,
    w4a8_grid,
    w4a8_int8_grid,
    wna16_arguments,
    wna16_grid,
)

#: The deliberate differences, as documented in docs/vllm.md ("Where moe_policy differs").
DELIBERATE = {
    "request_fallback_warns": "an explicit --moe-backend vLLM cannot build: vLLM fails start-up "
    "(at selection, or building the kernel of a batched_triton pick its prepare/finalize cannot "
    "feed); moe_policy (warn mode) falls back with a warning, strict mode refuses",
    "lora_request_honoured": "LoRA with a feasible explicit --moe-backend: vLLM's LoRA branch "
    "ignores it; moe_policy honours it",
    "lora_unbuildable_refused": "LoRA where vLLM's LoRA branch returns TritonExperts without "
    "checking it (CPU, too many experts, NVLink all2all): moe_policy picks a backend that "
    "can run or refuses",
    "lora_layer_refused": "LoRA under expert parallelism that vLLM's LoRA layer rejects later "
    "in start-up: moe_policy refuses at selection, naming the constraint",
}
DOC = REPO / "docs" / "vllm.md"


def reset() -> None:
    """Forget selectors and what was reported (the parsed catalogs stay: they do not change)."""
    STATE.selectors.clear()
    STATE.reporting.clear()
    STATE.engine_decisions.clear()


def _plain(outcome: Any) -> tuple[str | None, str | None]:
    backend, cls = outcome
    return backend.name, getattr(cls, "__name__", None)


def ours_inside_vllm(case: Case, strict: bool = False) -> tuple[Any, str | None]:
    """((backend, class) | None, error) from the integration, under the case's fake."""
    reset()
    saved = {k: os.environ.pop(k) for k in list(os.environ) if k.startswith("MOE_POLICY_")}
    if strict:
        os.environ["MOE_POLICY_MODE"] = "strict"
    try:
        with (
            faked_platform(case),
            set_current_vllm_config(vllm_config(case)),
            warnings.catch_warnings(record=True),
        ):
            warnings.simplefilter("always")
            try:
                config = moe_config(case)
                fp8 = case.quant not in (None, "mxfp4", "mxfp8", "nvfp4", "w4a8-fp8",
                                         "w4a8-int8", *WNA16_QUANTS, *INT8_QUANTS)  # fmt: skip
                keys = fp8_keys(case, config) if fp8 else ()
            except Exception as exc:  # vLLM's config or quant method refuses: nothing to select
                return None, f"config: {type(exc).__name__}: {exc}"
            try:
                if case.quant is None:
                    return _plain(selection.select_unquantized_moe_backend(config)), None
                if case.quant == "mxfp4":
                    return _plain(selection.select_mxfp4_moe_backend(config)), None
                if case.quant == "mxfp8":
                    return _plain(selection.select_mxfp8_moe_backend(config)), None
                if case.quant == "w4a8-int8":  # CompressedTensorsW4A8Int8MoEMethod's keys
                    keys = (qk.kInt4W4A8StaticGroup128Sym, None)
                    return _plain(selection.select_w4a8_int8_moe_backend(config, *keys)), None
                if case.quant == "w4a8-fp8":  # CompressedTensorsW4A8Fp8MoEMethod's defaults
                    return _plain(selection.select_w4a8_moe_backend(config)), None
                if case.quant in INT8_QUANTS:
                    keys = INT8_QUANTS[case.quant]  # CompressedTensorsW8A8Int8MoEMethod's
                    return _plain(selection.select_int8_moe_backend(config, *keys)), None
                if case.quant in WNA16_QUANTS:
                    arguments = wna16_arguments(case)  # AutoGPTQMoEMethod / AutoAWQMoEMethod's
                    return _plain(selection.select_wna16_moe_backend(config, *arguments)), None
                if case.quant == "nvfp4":
                    keys = (qk.kNvfp4Static, qk.kNvfp4Dynamic)  # ModelOptNvFp4FusedMoE, W4A4
                    return _plain(selection.select_nvfp4_moe_backend(config, *keys)), None
                return _plain(selection.select_fp8_moe_backend(config, *keys)), None
            except MoEPolicyError as exc:
                return None, f"{type(exc).__name__}: {exc}"
    finally:
        os.environ.pop("MOE_POLICY_MODE", None)
        os.environ.update(saved)


def _dry_selector(case: Case) -> Selector:
    env = dict(case.env)
    aiter_on = env.get("VLLM_ROCM_USE_AITER", "0").lower() in ("1", "true")
    aiter_moe = env.get("VLLM_ROCM_USE_AITER_MOE", "1").lower() in ("1", "true")
    layer = SimpleNamespace(
        activation=case.activation,
        routing_method=SimpleNamespace(name=case.routing),
        in_dtype={"bf16": "torch.bfloat16", "fp16": "torch.float16", "fp32": "torch.float32"}[
            case.dtype
        ],
        num_experts=case.num_experts,
        experts_per_token=case.top_k,
        hidden_dim=case.hidden,
        intermediate_size=case.intermediate,
        has_bias=case.has_bias,
        moe_backend=case.moe_backend,
    )
    cap = case.capability
    capability = f"{cap[0]}.{cap[1]}" if case.platform == "cuda" and cap else None
    parallel = parallel_config(case)  # vLLM's layout facts, built without its platform
    explicit = [
        *facts.deployment_entries(
            SimpleNamespace(moe_parallel_config=parallel, is_lora_enabled=case.lora)
        ),
    ]
    from moe_policy.settings import Entry

    origin = facts.vllm_origin("dry run")
    explicit += [
        Entry("rocm.aiter", case.aiter and not case.rdna and aiter_on and aiter_moe, origin),
        Entry("cpu.arch", case.cpu_arch, origin),
        Entry("cpu.amx", case.cpu_amx, origin),
    ]
    packages = tuple(
        name
        for name, present in (
            ("flashinfer", case.flashinfer),
            ("deep_gemm", case.deep_gemm),
            ("humming", case.humming),
            ("triton_kernels", case.triton_kernels),
        )
        if present
    )
    if case.platform == "rocm":  # the harness's ROCm GPUs: CDNA3 (gfx942) or RDNA4
        explicit.append(Entry("rocm.gfx", "gfx1x" if case.rdna else "gfx942", origin))
    quant = None
    if case.quant in WNA16_QUANTS:
        quant = _checkpoint_quantization(case)
        request = wna16.wna16_request_entry(case.moe_backend)
    elif case.quant == "w4a8-int8":
        quant = _checkpoint_quantization(case)
        request = facts.w4a8_int8_request_entry(case.moe_backend)
    elif case.quant == "w4a8-fp8":
        quant = _checkpoint_quantization(case)
        request = facts.w4a8_request_entry(case.moe_backend)
    elif case.quant in INT8_QUANTS:
        quant = _checkpoint_quantization(case)
        request = facts.int8_request_entry(case.moe_backend)
    elif case.quant == "mxfp8":
        quant = _checkpoint_quantization(case)
        request = facts.mxfp8_request_entry(case.moe_backend)  # VLLM_USE_DEEP_GEMM: env layer
    elif case.quant in ("mxfp4", "nvfp4"):
        quant = _checkpoint_quantization(case)
        reader = facts.mxfp4_request_entry if case.quant == "mxfp4" else facts.nvfp4_request_entry
        request = reader(case.moe_backend, batched=parallel.use_batched_activation_format)
    elif case.quant is None:
        request = facts.request_entry(
            case.moe_backend,
            platform=case.platform,
            lora=case.lora,
            moonep=parallel.use_moonep_kernels,
        )
    else:
        # What `moe-policy explain` reads from the checkpoint's quantization_config.
        quant = _checkpoint_quantization(case)
        # vLLM's DeepGEMM and AITER switches: the environment layer (environ=env), as in
        # `moe-policy explain --engine vllm`
        request = facts.fp8_request_entry(
            case.moe_backend,
            batched=parallel.use_batched_activation_format,
            allow_vllm_cutlass=quant["model.quant.format"][0] == "compressed-tensors",
        )
        explicit.append(Entry("cpu.amx_fp8", False, origin))
    if request is not None:
        explicit.append(request)
    return Selector(
        facts.model_facts(layer, None, quant),
        explicit=explicit,
        environ=env,
        platform=PlatformFacts(case.platform, capability, None, packages, origin="api"),
        engine="vllm==0.33",
    )


def _checkpoint_quantization(case: Case) -> dict[str, Any]:
    from moe_policy.core.origin import Origin
    from moe_policy.core.quantization import quantization_facts
    from moe_policy.core.yamlio import LoadedYaml

    config = {"quantization_config": QUANTS[str(case.quant)]}
    loaded = LoadedYaml("api", config, {}, {}, "", Origin.api("model"))
    return quantization_facts(loaded, ("quantization_config",))


def ours_dry_run(case: Case) -> tuple[Any, str | None]:
    """((backend, class) | None, error) from the vLLM profile alone (no vLLM objects)."""
    reset()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            selector = _dry_selector(case)
            decision = selector.select()
        except MoEPolicyError as exc:
            return None, f"{type(exc).__name__}: {exc}"
    spec = selector.catalog.spec(str(decision.backend))
    return (spec.engine_name, decision.experts_class), None


def _triton_checks_fail(case: Case) -> bool:
    """Whether vLLM's TritonExperts would reject the case, had the LoRA branch asked it."""
    parallel = parallel_config(case)
    return (
        case.platform not in ("cuda", "rocm", "xpu")
        or (case.platform in ("cuda", "rocm") and -(-case.num_experts // 32) * 32 >= 1024)
        or parallel.use_fi_nvl_two_sided_kernels
        or parallel.use_fi_nvl_one_sided_kernels
        or parallel.use_moonep_kernels
        or case.activation == "relu2"  # gated relu2: not among TritonExperts' activations
    )


def requested(case: Case) -> bool:
    """Whether vLLM's oracle is asked for a backend: ``--moe-backend`` (humming and marlin
    mean auto for unquantized layers) or, for fp8, vLLM's DeepGEMM or AITER switches on."""
    if case.quant is None:
        return case.moe_backend not in ("auto", "humming", "marlin")
    if case.moe_backend != "auto" or case.quant in ("mxfp4", "mxfp8", "nvfp4", "w4a8-fp8",
                                                    "w4a8-int8", *WNA16_QUANTS,
                                                    *INT8_QUANTS):  # fmt: skip
        return case.moe_backend != "auto"
    env = dict(case.env)
    dg = [env.get(k, "1") for k in ("VLLM_USE_DEEP_GEMM", "VLLM_MOE_USE_DEEP_GEMM")]
    aiter = [env.get("VLLM_ROCM_USE_AITER", "0"), env.get("VLLM_ROCM_USE_AITER_MOE", "1")]
    set_dg = "VLLM_USE_DEEP_GEMM" in env or "VLLM_MOE_USE_DEEP_GEMM" in env
    set_aiter = "VLLM_ROCM_USE_AITER" in env or "VLLM_ROCM_USE_AITER_MOE" in env
    return (set_dg and dg == ["1", "1"]) or (
        set_aiter and aiter == ["1", "1"] and not (case.rdna and case.aiter)
    )


def classify(case: Case, vllm: Any, ours: tuple[Any, str | None], strict: Any = None) -> str:
    """``agree``, a deliberate-difference code, or ``MISMATCH``."""
    mine, error = ours
    oracle = (vllm.backend, vllm.experts_class)
    layer_error = lora_layer_outcome(case) if case.lora and vllm.error is None else None
    # vLLM's pick of a class its prepare/finalize cannot feed fails start-up building the kernel
    build_error = kernel_build_outcome(case) if vllm.error is None else None
    if vllm.error is not None and mine is None:
        return "agree"  # both refuse at selection
    # vLLM's LoRA layer would fail start-up later; moe_policy refuses at selection, naming the
    # constraint (or, where vLLM's fp8 oracle returns no experts class, finding no backend).
    refused = "cannot run this deployment" in str(error) or (
        case.quant is not None and "NoFeasibleBackendError" in str(error)
    )
    if layer_error is not None and mine is None and refused:
        return "lora_layer_refused"
    if mine is not None and mine == oracle and layer_error is None and build_error is None:
        return "agree"
    if case.lora and case.quant is None:
        if vllm.backend == "TRITON" and vllm.error is None and _triton_checks_fail(case):
            return "lora_unbuildable_refused"
        if requested(case) and mine is not None:
            return "lora_request_honoured"
    explicit = requested(case)
    refusals = ("does not support the deployment", "No supported MXFP8 expert class",
                "No W4A8 MoE backend supports")  # fmt: skip
    vllm_refused_request = (
        explicit and vllm.error and any(refusal in vllm.error for refusal in refusals)
    ) or (explicit and build_error is not None and mine != oracle)
    # warn mode fell back; strict mode must refuse like vLLM
    strict_refused = (
        strict is not None and strict[0] is None and "BackendOverrideError" in str(strict[1])
    )
    if vllm_refused_request and mine and strict_refused:
        return "request_fallback_warns"
    return "MISMATCH"


def _quietly(cases: list[Case] | None, label: str) -> list[dict[str, Any]]:
    quiet = [logging.getLogger(name) for name in ("moe_policy", "vllm")]
    levels = [logger.level for logger in quiet]
    for logger in quiet:  # thousands of decisions: their events are not what is tested here
        logger.setLevel(logging.CRITICAL)
    try:
        return _results(cases, label)
    finally:
        for logger, level in zip(quiet, levels, strict=True):
            logger.setLevel(level)


@pytest.fixture(scope="module")
def results() -> list[dict[str, Any]]:
    return _quietly(None, "unquantized")


@pytest.fixture(scope="module")
def fp8_results() -> list[dict[str, Any]]:
    return _quietly(fp8_grid(), "fp8")


@pytest.fixture(scope="module")
def mxfp4_results() -> list[dict[str, Any]]:
    return _quietly(mxfp4_grid(), "mxfp4")


@pytest.fixture(scope="module")
def nvfp4_results() -> list[dict[str, Any]]:
    return _quietly(nvfp4_grid(), "nvfp4")


@pytest.fixture(scope="module")
def w4a8_int8_results() -> list[dict[str, Any]]:
    return _quietly(w4a8_int8_grid(), "w4a8_int8")


@pytest.fixture(scope="module")
def w4a8_results() -> list[dict[str, Any]]:
    return _quietly(w4a8_grid(), "w4a8")


@pytest.fixture(scope="module")
def int8_results() -> list[dict[str, Any]]:
    return _quietly(int8_grid(), "int8")


@pytest.fixture(scope="module")
def mxfp8_results() -> list[dict[str, Any]]:
    return _quietly(mxfp8_grid(), "mxfp8")


@pytest.fixture(scope="module")
def wna16_results() -> list[dict[str, Any]]:
    return _quietly(wna16_grid(), "int_wna16")


def _results(cases: list[Case] | None = None, label: str = "unquantized") -> list[dict[str, Any]]:
    rows = []
    for case in grid() if cases is None else cases:
        vllm = oracle_outcome(case)
        inside = ours_inside_vllm(case)
        dry = ours_dry_run(case)
        strict = None
        if requested(case) and (vllm.error or kernel_build_outcome(case)):
            strict = ours_inside_vllm(case, strict=True)
        rows.append(
            {
                "case": case,
                "vllm": vllm,
                "inside": inside,
                "dry": dry,
                "inside_class": classify(case, vllm, inside, strict),
                "dry_class": classify(case, vllm, dry, strict),
            }
        )
    summary = {
        mode: dict(collections.Counter(r[f"{mode}_class"] for r in rows))
        for mode in ("inside", "dry")
    }
    print(f"\ndifferential ({label}):", len(rows), "cases;", json.dumps(summary, sort_keys=True))
    return rows


def _mismatches(rows: list[dict[str, Any]], mode: str) -> list[str]:
    return [
        f"{r['case'].name}: vLLM {r['vllm']} vs moe_policy {r[mode]}"
        for r in rows
        if r[f"{mode}_class"] == "MISMATCH"
    ]


def test_inside_vllm_agrees_except_documented_differences(results):
    assert _mismatches(results, "inside")[:20] == []


def test_dry_run_profile_agrees_except_documented_differences(results):
    assert _mismatches(results, "dry")[:20] == []


def test_every_documented_difference_is_seen_and_documented(results):
    seen = {r["inside_class"] for r in results} | {r["dry_class"] for r in results}
    text = DOC.read_text()
    for code in DELIBERATE:
        assert f"`{code}`" in text, code
        assert code in seen, code
    assert seen <= {"agree", *DELIBERATE}


def test_strict_mode_refuses_every_request_vllm_refuses(results):
    for r in results:
        if r["inside_class"] == "request_fallback_warns":
            strict = ours_inside_vllm(r["case"], strict=True)
            assert strict[0] is None and "BackendOverrideError" in str(strict[1])
            break


def test_the_grid_is_broad(results):
    cases = [r["case"] for r in results]
    assert len(cases) >= 1000
    assert {c.platform for c in cases} >= {"cuda", "rocm", "cpu", "xpu", "tpu", "oot"}
    assert {c.capability for c in cases if c.platform == "cuda"} >= {
        (8, 0),
        (9, 0),
        (10, 0),
        (12, 0),
    }
    assert any(c.lora for c in cases) and any(c.ep for c in cases)


#: The deliberate differences the fp8 oracle's grid shows (a subset of DELIBERATE).
FP8_DELIBERATE = ("request_fallback_warns", "lora_layer_refused")


def test_fp8_inside_vllm_agrees_except_documented_differences(fp8_results):
    assert _mismatches(fp8_results, "inside")[:20] == []


def test_fp8_dry_run_profile_agrees_except_documented_differences(fp8_results):
    assert _mismatches(fp8_results, "dry")[:20] == []


def test_fp8_differences_are_documented_ones_and_seen(fp8_results):
    seen = {r["inside_class"] for r in fp8_results} | {r["dry_class"] for r in fp8_results}
    assert seen <= {"agree", *DELIBERATE}
    for code in FP8_DELIBERATE:
        assert code in seen, code


def test_the_fp8_grid_covers_every_scheme_and_picks_many_backends(fp8_results):
    cases = [r["case"] for r in fp8_results]
    assert len(cases) >= 500
    others = {"mxfp4", "mxfp8", "nvfp4", "w4a8-fp8", "w4a8-int8", *WNA16_QUANTS, *INT8_QUANTS}
    assert {c.quant for c in cases} == set(QUANTS) - others
    picked = {r["vllm"].backend for r in fp8_results if r["vllm"].error is None}
    assert picked >= {"TRITON", "FLASHINFER_TRTLLM", "FLASHINFER_CUTLASS", "DEEPGEMM", "MARLIN",
                      "AITER", "XPU", "CPU", "VLLM_CUTLASS", "BATCHED_TRITON", "NONE"}  # fmt: skip


def test_mxfp4_inside_vllm_agrees_except_documented_differences(mxfp4_results):
    assert _mismatches(mxfp4_results, "inside")[:20] == []


def test_mxfp4_dry_run_profile_agrees_except_documented_differences(mxfp4_results):
    assert _mismatches(mxfp4_results, "dry")[:20] == []


def test_mxfp4_differences_are_documented_ones_and_seen(mxfp4_results):
    seen = {r["inside_class"] for r in mxfp4_results} | {r["dry_class"] for r in mxfp4_results}
    assert seen <= {"agree", *DELIBERATE}
    assert "request_fallback_warns" in seen
    picked = {r["vllm"].backend for r in mxfp4_results if r["vllm"].error is None}
    assert picked >= {"TRITON", "FLASHINFER_TRTLLM_MXFP4_BF16", "FLASHINFER_CUTLASS_MXFP4_BF16",
                      "MARLIN", "BATCHED_MARLIN", "AITER_TRITON_MXFP4_BF16", "XPU", "CPU"}  # fmt: skip


def test_nvfp4_inside_vllm_agrees_except_documented_differences(nvfp4_results):
    assert _mismatches(nvfp4_results, "inside")[:20] == []


def test_nvfp4_dry_run_profile_agrees_except_documented_differences(nvfp4_results):
    assert _mismatches(nvfp4_results, "dry")[:20] == []


def test_nvfp4_differences_are_documented_ones_and_seen(nvfp4_results):
    seen = {r["inside_class"] for r in nvfp4_results} | {r["dry_class"] for r in nvfp4_results}
    assert seen <= {"agree", *DELIBERATE}
    assert "request_fallback_warns" in seen
    picked = {r["vllm"].backend for r in nvfp4_results if r["vllm"].error is None}
    assert picked >= {"FLASHINFER_TRTLLM", "FLASHINFER_CUTLASS", "MARLIN", "EMULATION"}


def test_wna16_inside_vllm_agrees_except_documented_differences(wna16_results):
    assert _mismatches(wna16_results, "inside")[:20] == []


def test_wna16_dry_run_profile_agrees_except_documented_differences(wna16_results):
    assert _mismatches(wna16_results, "dry")[:20] == []


def test_wna16_differences_are_documented_ones_and_seen(wna16_results):
    seen = {r["inside_class"] for r in wna16_results} | {r["dry_class"] for r in wna16_results}
    assert seen <= {"agree", *DELIBERATE}
    assert "request_fallback_warns" in seen
    picked = {r["vllm"].backend for r in wna16_results if r["vllm"].error is None}
    assert picked >= {"MARLIN", "BATCHED_MARLIN", "EMULATION", "XPU", "CPU"}


def test_mxfp8_inside_vllm_agrees_except_documented_differences(mxfp8_results):
    assert _mismatches(mxfp8_results, "inside")[:20] == []


def test_mxfp8_dry_run_profile_agrees_except_documented_differences(mxfp8_results):
    assert _mismatches(mxfp8_results, "dry")[:20] == []


def test_mxfp8_differences_are_documented_ones_and_seen(mxfp8_results):
    seen = {r["inside_class"] for r in mxfp8_results} | {r["dry_class"] for r in mxfp8_results}
    assert seen <= {"agree", *DELIBERATE}
    assert "request_fallback_warns" in seen
    picked = {r["vllm"].backend for r in mxfp8_results if r["vllm"].error is None}
    assert picked >= {"FLASHINFER_TRTLLM", "DEEPGEMM", "MARLIN", "XPU", "EMULATION"}


def test_int8_inside_vllm_agrees_except_documented_differences(int8_results):
    assert _mismatches(int8_results, "inside")[:20] == []


def test_int8_dry_run_profile_agrees_except_documented_differences(int8_results):
    assert _mismatches(int8_results, "dry")[:20] == []


def test_int8_differences_are_documented_ones_and_seen(int8_results):
    seen = {r["inside_class"] for r in int8_results} | {r["dry_class"] for r in int8_results}
    assert seen <= {"agree", *DELIBERATE}
    assert "request_fallback_warns" in seen
    picked = {r["vllm"].backend for r in int8_results if r["vllm"].error is None}
    assert picked >= {"TRITON", "CPU"}


def test_w4a8_inside_vllm_agrees_except_documented_differences(w4a8_results):
    assert _mismatches(w4a8_results, "inside")[:20] == []


def test_w4a8_dry_run_profile_agrees_except_documented_differences(w4a8_results):
    assert _mismatches(w4a8_results, "dry")[:20] == []


def test_w4a8_differences_are_documented_ones_and_seen(w4a8_results):
    seen = {r["inside_class"] for r in w4a8_results} | {r["dry_class"] for r in w4a8_results}
    assert seen <= {"agree", *DELIBERATE}
    assert "request_fallback_warns" in seen
    picked = {r["vllm"].backend for r in w4a8_results if r["vllm"].error is None}
    assert picked >= {"CUTLASS"}


def test_w4a8_int8_inside_vllm_agrees_except_documented_differences(w4a8_int8_results):
    assert _mismatches(w4a8_int8_results, "inside")[:20] == []


def test_w4a8_int8_dry_run_profile_agrees_except_documented_differences(w4a8_int8_results):
    assert _mismatches(w4a8_int8_results, "dry")[:20] == []


def test_w4a8_int8_differences_are_documented_ones_and_seen(w4a8_int8_results):
    rows = w4a8_int8_results
    seen = {r["inside_class"] for r in rows} | {r["dry_class"] for r in rows}
    assert seen <= {"agree", *DELIBERATE}
    assert {r["vllm"].backend for r in rows if r["vllm"].error is None} == {"CPU_INT4"}


def _documented_row(oracle: str) -> list[int]:
    """The per-oracle counts of docs/vllm.md's agreement table (cases, agree, then each code)."""
    for line in DOC.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells and cells[0] == oracle:
            return [int(c.replace(",", "")) for c in cells[1:]]
    raise AssertionError(f"docs/vllm.md has no agreement row for {oracle}")


def _measured_row(rows: list[dict[str, Any]]) -> list[int]:
    codes = ("agree", "request_fallback_warns", "lora_layer_refused", "lora_unbuildable_refused",
             "lora_request_honoured", "MISMATCH")  # fmt: skip
    counts = [sum(r["inside_class"] == code for r in rows) for code in codes]
    return [len(rows), *counts]


def test_the_documented_counts_are_the_measured_ones(
    mxfp8_results, int8_results, w4a8_results, w4a8_int8_results, wna16_results
):
    for oracle, rows in (("mxfp8", mxfp8_results), ("int8", int8_results),
                         ("w4a8", w4a8_results), ("w4a8_int8", w4a8_int8_results),
                         ("int_wna16", wna16_results)):  # fmt: skip
        assert _documented_row(oracle) == _measured_row(rows), oracle
        assert [r["dry_class"] for r in rows] == [r["inside_class"] for r in rows], oracle
