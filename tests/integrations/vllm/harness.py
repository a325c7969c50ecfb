"""vLLM 0.33's real unquantized fused-MoE backend selection, run on a CPU machine under a fake platform.

Test support for the differential test of moe_policy against vLLM: it imports vllm and so works
only in the environment that ``scripts/vllm_env.sh`` builds. A :class:`Case` describes one
deployment (model shape, platform, parallel layout, LoRA, ``moe_backend``, env);
:func:`oracle_outcome` builds vLLM's ``FusedMoEConfig`` for it by keyword and runs vLLM's own
``select_unquantized_moe_backend`` with ``current_platform`` and the probes it consults faked
(:func:`faked_platform`); :func:`lora_layer_outcome` evaluates what vLLM's fused-MoE LoRA layer
would then refuse; :func:`grid` is a broad, deterministic set of cases.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import sys
import types
import typing
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, replace
from typing import Any

import torch
import vllm.envs as envs
import vllm.logger as vllm_logger

# xpu_moe imports vllm_xpu_kernels at import time when the platform is XPU: import every experts
# module the oracle may pick while the platform is still the real one, so that no import happens
# under a fake (an import under a fake could also snapshot faked state).
import vllm.model_executor.layers.fused_moe.experts.cpu_moe
import vllm.model_executor.layers.fused_moe.experts.flashinfer_cutlass_moe
import vllm.model_executor.layers.fused_moe.experts.fused_batched_moe
import vllm.model_executor.layers.fused_moe.experts.moonep_experts
import vllm.model_executor.layers.fused_moe.experts.rocm_aiter_moe
import vllm.model_executor.layers.fused_moe.experts.triton_moe
import vllm.model_executor.layers.fused_moe.experts.trtllm_bf16_moe
import vllm.model_executor.layers.fused_moe.experts.trtllm_lora_moe
import vllm.model_executor.layers.fused_moe.experts.xpu_moe
import vllm.model_executor.layers.fused_moe.modular_kernel as mk
import vllm.model_executor.layers.fused_moe.oracle.fp8 as fp8_oracle
import vllm.model_executor.layers.fused_moe.oracle.int8 as int8_oracle
import vllm.model_executor.layers.fused_moe.oracle.int_wna16 as wna16_oracle
import vllm.model_executor.layers.fused_moe.oracle.mxfp4 as mxfp4_oracle
import vllm.model_executor.layers.fused_moe.oracle.mxfp8 as mxfp8_oracle
import vllm.model_executor.layers.fused_moe.oracle.nvfp4 as nvfp4_oracle
import vllm.model_executor.layers.fused_moe.oracle.unquantized as oracle
import vllm.model_executor.layers.fused_moe.oracle.w4a8 as w4a8_oracle
import vllm.model_executor.layers.fused_moe.oracle.w4a8_int8 as w4a8_int8_oracle
import vllm.platforms
import vllm.utils.deep_gemm as vllm_deep_gemm
import vllm.utils.flashinfer as vllm_flashinfer
import vllm.utils.hpc as vllm_hpc
import vllm.utils.import_utils as vllm_import_utils
from vllm import _aiter_ops
from vllm._aiter_ops import rocm_aiter_ops
from vllm.config import DeviceConfig, VllmConfig, set_current_vllm_config
from vllm.config.parallel import All2AllBackend
from vllm.model_executor.layers.fused_moe.activation import MoEActivation
from vllm.model_executor.layers.fused_moe.config import (
    FusedMoEConfig,
    FusedMoEParallelConfig,
    RoutingMethodType,
)
from vllm.model_executor.layers.fused_moe.unquantized_fused_moe_method import (
    UnquantizedFusedMoEMethod,
)
from vllm.model_executor.layers.quantization.auto_awq import AutoAWQConfig
from vllm.model_executor.layers.quantization.auto_gptq import AutoGPTQConfig
from vllm.model_executor.layers.quantization.utils import flashinfer_utils, w8a8_utils
from vllm.model_executor.layers.quantization.utils import quant_utils as qk
from vllm.platforms import CpuArchEnum
from vllm.platforms.interface import DeviceCapability, PlatformEnum
from vllm.scalar_type import scalar_types

# The function itself, taken before anything (a plugin under test) can rebind the module's name.
_SELECT = oracle.select_unquantized_moe_backend
assert _SELECT.__module__ == oracle.__name__, "vLLM's selector is already patched"
_SELECT_FP8 = fp8_oracle.select_fp8_moe_backend
assert _SELECT_FP8.__module__ == fp8_oracle.__name__, "vLLM's fp8 selector is already patched"
_SELECT_MXFP4 = mxfp4_oracle.select_mxfp4_moe_backend
assert _SELECT_MXFP4.__module__ == mxfp4_oracle.__name__, "vLLM's mxfp4 selector is patched"
for _backend in mxfp4_oracle._get_priority_backends_for_gpt_oss():
    mxfp4_oracle.backend_to_kernel_cls(_backend)
_SELECT_NVFP4 = nvfp4_oracle.select_nvfp4_moe_backend
_SELECT_MXFP8 = mxfp8_oracle.select_mxfp8_moe_backend
assert _SELECT_MXFP8.__module__ == mxfp8_oracle.__name__, "vLLM's mxfp8 selector is patched"
for _backend in mxfp8_oracle._SUPPORTED_BACKENDS:
    mxfp8_oracle._mxfp8_backend_to_kernel_cls(_backend)
_SELECT_INT8 = int8_oracle.select_int8_moe_backend
assert _SELECT_INT8.__module__ == int8_oracle.__name__, "vLLM's int8 selector is patched"
for _backend in int8_oracle.Int8MoeBackend:
    int8_oracle.backend_to_kernel_cls(_backend)
_SELECT_W4A8 = w4a8_oracle.select_w4a8_moe_backend
assert _SELECT_W4A8.__module__ == w4a8_oracle.__name__, "vLLM's w4a8 selector is patched"
for _backend in w4a8_oracle.W4A8MoeBackend:
    w4a8_oracle.backend_to_kernel_cls(_backend)
_SELECT_W4A8_INT8 = w4a8_int8_oracle.select_w4a8_int8_moe_backend
assert _SELECT_W4A8_INT8.__module__ == w4a8_int8_oracle.__name__, "w4a8_int8 selector patched"
for _backend in w4a8_int8_oracle.W4A8Int8MoeBackend:
    w4a8_int8_oracle.backend_to_kernel_cls(_backend)
_SELECT_WNA16 = wna16_oracle.select_wna16_moe_backend
assert _SELECT_WNA16.__module__ == wna16_oracle.__name__, "vLLM's wna16 selector is patched"
for _backend in wna16_oracle.WNA16MoEBackend:
    wna16_oracle.backend_to_kernel_cls(_backend)
assert _SELECT_NVFP4.__module__ == nvfp4_oracle.__name__, "vLLM's nvfp4 selector is patched"
for _backend in nvfp4_oracle.NvFp4MoeBackend:
    if _backend.name not in ("B12X", "FLASHINFER_B12X", "FLASHINFER_MOE_EP_CUTEDSL"):
        nvfp4_oracle.backend_to_kernel_cls(_backend)
# The fp8 oracle's experts modules too, imported here under the real platform (the oracle
# imports them lazily; one imported under a fake would snapshot the first case's state).
for _backend in fp8_oracle.Fp8MoeBackend:  # those backend_to_kernel_cls knows
    if _backend.name not in ("NONE", "EMULATION", "TRITON_MXFP8", "AITER_MXFP8"):
        fp8_oracle.backend_to_kernel_cls(_backend)

PLATFORM = vllm.platforms.current_platform  # the singleton every vLLM module imported by name

_PLATFORM_ENUMS = {
    "cuda": PlatformEnum.CUDA,
    "rocm": PlatformEnum.ROCM,
    "cpu": PlatformEnum.CPU,
    "xpu": PlatformEnum.XPU,
    "tpu": PlatformEnum.TPU,
    "oot": PlatformEnum.OOT,
}
_CPU_ARCHS = {"x86": CpuArchEnum.X86, "arm": CpuArchEnum.ARM, "power": CpuArchEnum.POWERPC}
_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
ALL2ALL_BACKENDS: tuple[str, ...] = typing.get_args(All2AllBackend)
# ParallelConfig.__post_init__ rewrites these removed backends (config/parallel.py:537-543).
_REMOVED_ALL2ALL = ("naive", "pplx")

# The availability probes FlashInfer experts ask; modules bind them by name, so each binding of
# these function objects in a loaded vllm module is replaced (see _probe_bindings).
_FLASHINFER_PROBES = (
    vllm_flashinfer.has_flashinfer_trtllm_fused_moe,
    vllm_flashinfer.has_flashinfer_cutlass_fused_moe,
)
# The other kernel-package probes the quantized experts classes ask (bound by name too), and
# the CUTLASS group-GEMM and AMX-FP8 checks that need vLLM's compiled ops.
_PACKAGE_PROBES = (
    vllm_import_utils.has_deep_gemm,
    vllm_import_utils.has_humming,
    vllm_hpc.has_hpc,
    w8a8_utils.cutlass_group_gemm_supported,
    vllm.model_executor.layers.fused_moe.experts.cpu_moe.cpu_has_amx_fp8,
    vllm_import_utils.has_triton_kernels,
    vllm_flashinfer.has_flashinfer,
    flashinfer_utils.has_flashinfer_situ_activation,
    vllm_flashinfer.has_flashinfer_cutedsl_moe_nvfp4,
    vllm_flashinfer.has_flashinfer_cutedsl_grouped_gemm_nt_masked,
)
_PROBES = (*_FLASHINFER_PROBES, *_PACKAGE_PROBES)
_ONCE_CACHES = tuple(
    getattr(vllm_logger, f"_print_{level}_once") for level in ("debug", "info", "warning", "error")
)


@dataclass(frozen=True)
class Case:
    """One deployment of one MoE layer, as vLLM would see it at backend-selection time."""

    name: str  # readable id
    num_experts: int
    top_k: int
    hidden: int
    intermediate: int  # whole-model I (not per partition)
    activation: str  # vLLM MoEActivation value: "silu", "relu2_no_mul", "swigluoai", ...
    routing: str  # RoutingMethodType name: "Renormalize", "DeepSeekV3", "TopK", "Llama4", ...
    dtype: str = "bf16"  # bf16 | fp16 | fp32
    platform: str = "cuda"  # cuda | rocm | cpu | xpu | tpu | oot
    capability: tuple[int, int] | None = (9, 0)
    flashinfer: bool = True  # both FlashInfer probes (trtllm fused moe, cutlass fused moe) say yes
    # ROCm: the AITER library is installed (vllm._aiter_ops.IS_AITER_FOUND); with rdna=False the
    # GPU is also CDNA3+, so is_aiter_found_and_supported() holds. With rdna=True the GPU is gfx12:
    # is_aiter_found_and_supported() is False and is_rdna_aiter_enabled() follows the env.
    aiter: bool = False
    rdna: bool = False  # ROCm gfx12 (on_rdna4)
    cpu_arch: str = "x86"  # x86 | arm | power
    cpu_amx: bool = False
    tp: int = 1
    dp: int = 1
    ep: bool = False
    all2all: str = "allgather_reducescatter"
    eplb: bool = False
    sp: bool = False
    lora: bool = False
    moe_backend: str = "auto"
    env: tuple[tuple[str, str], ...] = ()  # VLLM_ROCM_USE_AITER, VLLM_BATCH_INVARIANT, ...
    has_bias: bool = False
    quant: str | None = None  # a QUANTS name: the checkpoint's quantization (None: unquantized)
    deep_gemm: bool = False  # the deep_gemm package is importable
    humming: bool = False  # the humming package is importable
    triton_kernels: bool = False  # OpenAI's triton_kernels package is importable


@dataclass(frozen=True)
class Outcome:
    """What vLLM's selector did: the backend enum name and experts class, or the error it raised."""

    backend: str | None  # UnquantizedMoeBackend member name, e.g. "TRITON", "FLASHINFER_TRTLLM"
    experts_class: str | None  # experts class __name__; None for TPU/OOT or on error
    error: str | None  # "<ExceptionType>: <message>" from building the config or from selecting


# --- configs -------------------------------------------------------------------------------------


def parallel_config(case: Case) -> FusedMoEParallelConfig:
    """The FusedMoEParallelConfig that ``FusedMoEParallelConfig.make`` gives on rank 0.

    Mirrors make() (fused_moe/config.py:1116-1245) with pcp=1: EP only when asked for and more
    than one rank; without EP the TP group is flattened across DP (tp_size = tp*dp, ep_size 1),
    with EP every rank holds experts (tp_size 1, ep_size = tp*dp). sp_size is tp under sequence
    parallelism (fused_moe/layer.py:59). Removed all2all backends become allgather_reducescatter
    as ParallelConfig does; an unknown name is refused, as ParallelConfig's validation would.
    """
    if case.all2all not in ALL2ALL_BACKENDS:
        raise ValueError(f"unknown all2all backend {case.all2all!r}; vLLM knows {ALL2ALL_BACKENDS}")
    all2all = "allgather_reducescatter" if case.all2all in _REMOVED_ALL2ALL else case.all2all
    ranks = case.tp * case.dp
    use_ep = case.ep and ranks > 1
    return FusedMoEParallelConfig(
        tp_size=1 if use_ep else ranks,
        tp_rank=0,
        pcp_size=1,
        pcp_rank=0,
        dp_size=case.dp,
        dp_rank=0,
        ep_size=ranks if use_ep else 1,
        ep_rank=0,
        sp_size=case.tp if case.sp else 1,
        use_ep=use_ep,
        all2all_backend=all2all,
        enable_eplb=case.eplb,
    )


def moe_config(case: Case) -> FusedMoEConfig:
    """vLLM's FusedMoEConfig for the case, built by keyword as fused_moe/layer.py:361 builds it.

    Call it inside ``faked_platform(case)``: ``__post_init__`` reads the platform and the AITER
    state, and raises NotImplementedError for non-gated activations off CUDA/ROCm/XPU.
    """
    parallel = parallel_config(case)
    return FusedMoEConfig(
        num_experts=case.num_experts,
        experts_per_token=case.top_k,
        hidden_dim=case.hidden,
        intermediate_size=case.intermediate,
        num_local_experts=math.ceil(case.num_experts / parallel.ep_size),
        num_logical_experts=case.num_experts,
        activation=MoEActivation.from_str(case.activation),
        device="cpu",
        routing_method=RoutingMethodType[case.routing],
        moe_parallel_config=parallel,
        in_dtype=_DTYPES[case.dtype],
        moe_backend=case.moe_backend,  # type: ignore[arg-type]
        is_lora_enabled=case.lora,
        has_bias=case.has_bias,
    )


# --- the fake platform ---------------------------------------------------------------------------

_ABSENT = object()


def _set(stack: ExitStack, obj: Any, name: str, value: Any) -> None:
    """Set obj.name for the life of ``stack``; an attribute obj did not hold itself is removed."""
    old = vars(obj).get(name, _ABSENT)
    setattr(obj, name, value)
    if old is _ABSENT:
        stack.callback(delattr, obj, name)
    else:
        stack.callback(setattr, obj, name, old)


_probe_scan: tuple[int, list[tuple[types.ModuleType, str]]] = (-1, [])


def _probe_bindings() -> list[tuple[types.ModuleType, str, Callable[[], bool]]]:
    """Every (module, name) in a loaded vllm module bound to one of the probes.

    Scanning sys.modules costs milliseconds, so the modules holding a binding are remembered and
    scanned again only when the number of loaded modules changes; each remembered binding is
    checked to still be the probe itself.
    """
    global _probe_scan
    if _probe_scan[0] != len(sys.modules):
        holders = []
        for module_name, module in list(sys.modules.items()):
            if module is None or not (module_name == "vllm" or module_name.startswith("vllm.")):
                continue
            namespace = vars(module)
            holders += [(module, p.__name__) for p in _PROBES if p.__name__ in namespace]
        _probe_scan = (len(sys.modules), holders)
    probes = {probe.__name__: probe for probe in _PROBES}
    return [
        (module, name, probes[name])
        for module, name in _probe_scan[1]
        if vars(module).get(name) is probes[name]
    ]


def _restore_environ(saved: dict[str, str]) -> None:
    for key in [k for k in os.environ if k not in saved]:
        del os.environ[key]
    for key, value in saved.items():
        if os.environ.get(key) != value:
            os.environ[key] = value


def _aiter_class_state() -> dict[str, Any]:
    """rocm_aiter_ops' snapshotted settings (refresh_env_variables rewrites them)."""
    return {
        key: value
        for key, value in vars(rocm_aiter_ops).items()
        if key.startswith("_")
        and not key.startswith("__")
        and not isinstance(value, (classmethod, staticmethod, property, types.FunctionType))
    }


def _restore_aiter_class_state(saved: dict[str, Any]) -> None:
    for key, value in saved.items():
        setattr(rocm_aiter_ops, key, value)


def _supports_fp8(case: Case) -> bool:
    if case.platform == "cuda":
        return case.capability is not None and case.capability >= (8, 9)
    return case.platform in ("rocm", "xpu")  # CDNA3+/RDNA4 GPUs here; every XPU


def _support_deep_gemm(case: Case) -> bool:
    cap = case.capability
    return case.platform == "cuda" and cap is not None and (cap == (9, 0) or cap[0] in (10, 12))


def _probe_answers(case: Case) -> dict[str, bool]:
    cap = case.capability
    cutlass = case.platform == "cuda" and cap is not None and 90 <= cap[0] * 10 + cap[1] < 110
    return {
        "has_flashinfer_trtllm_fused_moe": case.flashinfer,
        "has_flashinfer_cutlass_fused_moe": case.flashinfer,
        "has_deep_gemm": case.deep_gemm,
        "has_humming": case.humming,
        "has_hpc": False,
        "cutlass_group_gemm_supported": cutlass,  # built with CUTLASS group GEMM for SM90-SM10x
        "cpu_has_amx_fp8": False,
        "has_triton_kernels": case.triton_kernels,
        "has_flashinfer": case.flashinfer,
        "has_flashinfer_situ_activation": False,
        "has_flashinfer_cutedsl_moe_nvfp4": case.flashinfer,
        "has_flashinfer_cutedsl_grouped_gemm_nt_masked": case.flashinfer,
    }


@contextmanager
def faked_platform(case: Case) -> Iterator[None]:
    """vLLM sees the case's platform, GPU, libraries and environment; all restored on exit.

    * ``current_platform`` (the singleton object every module imported by name): ``_enum`` (so
      every ``is_*`` and ``is_cuda_alike`` agree), ``device_name``, and at class level
      ``get_device_capability`` (the capability helpers are classmethods that call it) and
      ``get_cpu_architecture``; ``torch.cpu._is_amx_tile_supported``.
    * The FlashInfer, DeepGEMM, Humming and HPC probes, vLLM's CUTLASS group-GEMM check
      (SM90 to SM10x) and its AMX-FP8 check (no), in every loaded vllm module that imported
      them by name; the platform class's ``supports_fp8`` and ``support_deep_gemm``.
    * AITER: ``vllm._aiter_ops.IS_AITER_FOUND``; on ROCm a stub ``vllm.platforms.rocm`` module
      (``get_cdna_version``, ``on_rdna4``; the real one needs a GPU to import); then
      ``rocm_aiter_ops.refresh_env_variables()`` once the environment is set.
    * ``os.environ``: every ``VLLM_*`` variable is removed and ``case.env`` set, so the outcome
      depends on the case alone; the whole environment is put back on exit (refreshing AITER
      also writes ``AITER_SITUV2_*``). vLLM's env cache, if enabled, is off meanwhile.
    * vLLM's ``*_once`` logging caches are cleared, so each case logs what it would alone.
    """
    if case.platform not in _PLATFORM_ENUMS:
        raise ValueError(
            f"unknown platform {case.platform!r}; expected one of {list(_PLATFORM_ENUMS)}"
        )
    capability = DeviceCapability(*case.capability) if case.capability is not None else None
    arch = _CPU_ARCHS[case.cpu_arch]
    amx = case.cpu_amx
    saved_environ = dict(os.environ)
    saved_aiter = _aiter_class_state()
    envs_cached = envs._is_envs_cache_enabled()
    with ExitStack() as stack:
        # Callbacks run last-registered first: the environment comes back after every attribute,
        # then vLLM's env cache (which reads the environment as it is then), then AITER's state.
        stack.callback(_restore_aiter_class_state, saved_aiter)
        if envs_cached:
            envs.disable_envs_cache()
            stack.callback(envs.enable_envs_cache)
        stack.callback(_restore_environ, saved_environ)

        platform_cls = type(PLATFORM)
        _set(stack, PLATFORM, "_enum", _PLATFORM_ENUMS[case.platform])
        _set(stack, PLATFORM, "device_name", case.platform)
        _set(
            stack,
            platform_cls,
            "get_device_capability",
            classmethod(lambda cls, device_id=0: capability),
        )
        _set(stack, platform_cls, "get_cpu_architecture", classmethod(lambda cls: arch))
        _set(stack, torch.cpu, "_is_amx_tile_supported", lambda: amx)
        answers = _probe_answers(case)
        for module, name, _probe in _probe_bindings():
            _set(stack, module, name, (lambda value: lambda *args: value)(answers[name]))
        # The platform class's own fp8 and DeepGEMM checks, as the case's platform class has
        # them (platforms/cuda.py, rocm.py, xpu.py; the others inherit False).
        _set(stack, platform_cls, "supports_fp8", classmethod(lambda cls: _supports_fp8(case)))
        _set(
            stack,
            platform_cls,
            "support_deep_gemm",
            classmethod(lambda cls: _support_deep_gemm(case)),
        )
        vllm_deep_gemm.is_deep_gemm_supported.cache_clear()  # functools.cache'd
        stack.callback(vllm_deep_gemm.is_deep_gemm_supported.cache_clear)

        _set(stack, _aiter_ops, "IS_AITER_FOUND", case.aiter)
        if case.platform == "rocm":
            rocm = types.ModuleType("vllm.platforms.rocm")
            rocm.get_cdna_version = lambda: 0 if case.rdna else 3  # type: ignore[attr-defined]
            rocm.on_rdna4 = lambda: case.rdna  # type: ignore[attr-defined]
            # CDNA3 is gfx942 (MI300X), of the gfx9 family; RDNA4 is gfx12xx, of gfx1x.
            rocm.on_gfx942 = lambda: not case.rdna  # type: ignore[attr-defined]
            rocm.on_gfx9 = lambda: not case.rdna  # type: ignore[attr-defined]
            rocm.on_gfx950 = lambda: False  # type: ignore[attr-defined]
            rocm.on_gfx1250 = lambda: False  # type: ignore[attr-defined]
            rocm.on_gfx1x = lambda: case.rdna  # type: ignore[attr-defined]
            old = sys.modules.get(rocm.__name__)
            sys.modules[rocm.__name__] = rocm
            if old is None:
                stack.callback(sys.modules.pop, rocm.__name__, None)
            else:
                stack.callback(sys.modules.__setitem__, rocm.__name__, old)

        for key in [k for k in os.environ if k.startswith("VLLM_")]:
            del os.environ[key]
        os.environ.update(dict(case.env))
        rocm_aiter_ops.refresh_env_variables()

        for cache in _ONCE_CACHES:
            cache.cache_clear()
        yield


# --- outcomes ------------------------------------------------------------------------------------


def _error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def fp8_keys(case: Case, config: FusedMoEConfig) -> tuple[Any, Any, bool]:
    """(weight key, activation key, allow_vllm_cutlass) as the case's quantization method
    passes them to ``select_fp8_moe_backend``. Call it inside ``faked_platform(case)``.

    * HF fp8 (``Fp8MoEMethod.__init__``, quantization/fp8.py:480-528): a block checkpoint
      keys the TP-adapted block shape with dynamic 128-group activations; per-tensor weights
      take static activations for ``activation_scheme: static``, else per-token under
      ``VLLM_BATCH_INVARIANT`` and per-tensor otherwise; CUTLASS is not allowed.
    * ModelOpt FP8 (``ModelOptFp8MoEMethod``, modelopt.py:501): static per-tensor both.
    * compressed-tensors (``CompressedTensorsW8A8Fp8MoEMethod``): channel weights with
      per-token activations, CUTLASS allowed.
    """
    spec = QUANTS[str(case.quant)]
    method = spec["quant_method"]
    if method == "fp8" and spec.get("weight_block_size"):
        shape, _ = fp8_oracle.resolve_fp8_moe_weight_block_shape(
            config, list(spec["weight_block_size"]), qk.kFp8Dynamic128Sym, True
        )
        weight = qk.create_fp8_quant_key(static=True, group_shape=qk.GroupShape(*shape))
        return weight, qk.kFp8Dynamic128Sym, False
    if method == "fp8":
        if spec.get("activation_scheme") == "static":
            return qk.kFp8StaticTensorSym, qk.kFp8StaticTensorSym, False
        if envs.VLLM_BATCH_INVARIANT:
            return qk.kFp8StaticTensorSym, qk.kFp8DynamicTokenSym, False
        return qk.kFp8StaticTensorSym, qk.kFp8DynamicTensorSym, False
    if method == "modelopt":
        return qk.kFp8StaticTensorSym, qk.kFp8StaticTensorSym, False
    assert method == "compressed-tensors", method
    return qk.kFp8StaticChannelSym, qk.kFp8DynamicTokenSym, True


@functools.cache
def _vllm_config(model_type: str | None = None) -> VllmConfig:
    """A CPU VllmConfig. The fp8 oracle reads the current model's type (its DeepGEMM
    auto-disable list): without ``model_type`` there is no model. The mxfp4 oracle reads the
    model's ``quantization_config`` arguments (a MoE activation override): for ``model_type``
    a model of that type with none (the fields the oracles read, not a loaded model)."""
    config = VllmConfig(device_config=DeviceConfig(device="cpu"))
    if model_type is not None:
        model = types.SimpleNamespace(
            quantization_config=None, hf_text_config=types.SimpleNamespace(model_type=model_type)
        )
        object.__setattr__(config, "model_config", model)
    return config


def vllm_config(case: Case) -> VllmConfig:
    """The current VllmConfig while the case's layer is built (see _vllm_config)."""
    return _vllm_config("gpt_oss" if case.quant == "mxfp4" else None)


def _select(case: Case) -> tuple[Any, type | None, str | None]:
    """(backend enum, experts class, None) or (None, None, error) for the case."""
    with faked_platform(case), set_current_vllm_config(vllm_config(case)):
        try:
            config = moe_config(case)
            if case.quant is None:
                backend, experts = _SELECT(moe_config=config)
            elif case.quant == "mxfp4":
                backend, experts = _SELECT_MXFP4(config)
            elif case.quant == "nvfp4":
                backend, experts = _SELECT_NVFP4(config, qk.kNvfp4Static, qk.kNvfp4Dynamic)
            elif case.quant == "mxfp8":
                backend, experts = _SELECT_MXFP8(config)
            elif case.quant == "w4a8-int8":
                backend, experts = _SELECT_W4A8_INT8(config, qk.kInt4W4A8StaticGroup128Sym, None)
            elif case.quant == "w4a8-fp8":
                backend, experts = _SELECT_W4A8(config)
            elif case.quant in INT8_QUANTS:
                backend, experts = _SELECT_INT8(config, *INT8_QUANTS[case.quant])
            elif case.quant in WNA16_QUANTS:
                backend, experts = _SELECT_WNA16(config, *wna16_arguments(case))
            else:
                weight, activation, cutlass = fp8_keys(case, config)
                backend, experts = _SELECT_FP8(config, weight, activation, cutlass)
        except Exception as exc:
            return None, None, _error(exc)
    return backend, experts, None


def oracle_outcome(case: Case) -> Outcome:
    """Run vLLM's own selector for the case (select_unquantized_moe_backend, or
    select_fp8_moe_backend for an fp8 checkpoint) under its fake platform."""
    backend, experts, error = _select(case)
    if error is not None:
        return Outcome(None, None, error)
    return Outcome(backend.name, experts.__name__ if experts is not None else None, None)


def prepare_finalize_is_batched(case: Case) -> bool:
    """Whether vLLM's prepare/finalize hands the case's experts the batched format.

    ``all2all_utils.maybe_make_prepare_finalize``: the passthrough all2all is standard; with
    all2all kernels the DeepEP low-latency and NIXL-EP ones are batched
    (``use_batched_activation_format``); without them only XPU's ``BatchedPrepareAndFinalize``
    for ``--moe-backend batched_triton`` is.
    """
    parallel = parallel_config(case)
    if parallel.use_passthrough_all2all:
        return False
    if parallel.use_all2all_kernels:
        return bool(parallel.use_batched_activation_format)
    return case.platform == "xpu" and case.moe_backend == "batched_triton"


def kernel_build_outcome(case: Case) -> str | None:
    """The error vLLM raises building the kernel of its oracle's pick, or None.

    ``make_*_moe_kernel`` gives the experts class ``max_num_tokens`` and ``num_dispatchers``
    only under a batched prepare/finalize, and ``FusedMoEExperts.__init__`` refuses a class of
    the other format (vLLM's oracle, for instance, takes the batched format from
    ``--moe-backend batched_triton`` on any platform). None when the oracle itself refuses or
    picks no class.
    """
    _, experts, error = _select(case)
    if error is not None or experts is None:
        return None
    batched = experts.activation_format() == mk.FusedMoEActivationFormat.BatchedExperts
    if batched == prepare_finalize_is_batched(case):
        return None
    if batched:
        return (
            f"TypeError: {experts.__name__}.__init__() missing 2 required positional "
            "arguments: 'max_num_tokens' and 'num_dispatchers'"
        )
    return (
        "ValueError: max_num_tokens and num_dispatchers should only be set for "
        "BatchedExperts activation format."
    )


_LORA_EP_A2A = "allgather_reducescatter"


def _method_is_monolithic(experts: type | None) -> bool:
    """vLLM's own ``FusedMoEMethodBase.is_monolithic`` for a method that chose ``experts``.

    Read on a bare UnquantizedFusedMoEMethod holding only what that property reads (no kernel
    built: it then asks ``experts_cls.is_monolithic()``, as the built kernel would). With no
    experts class (TPU/OOT) the property's AttributeError reaches torch's Module.__getattr__,
    which raises its own AttributeError, exactly as on the real layer.
    """
    method = object.__new__(UnquantizedFusedMoEMethod)
    vars(method).update(moe_kernel=None, experts_cls=experts)
    return bool(method.is_monolithic)


def lora_layer_outcome(case: Case) -> str | None:
    """The error vLLM's FusedMoEWithLoRA would raise for the oracle's pick, or None if it builds.

    Re-implements, in order, the checks of ``FusedMoEWithLoRA.__init__``
    (vllm/lora/layers/fused_moe.py:31-88) without building a layer, with vLLM's own code for
    each answer (``is_monolithic``, the experts class's ``supports_lora()``):

    1. ``_ep_check`` under EP: all2all must be allgather_reducescatter; no sequence parallelism
       (a bare assert in vLLM: reported with its expression);
    2. monolithic experts are refused. With no experts class (TPU/OOT) this check itself fails
       with an AttributeError, so the later "Old-style modular kernel not supported."
       RuntimeError is never reached for unquantized layers;
    3. the experts must ``supports_lora()``.

    Returns ``"<ExceptionType>: <message>"``. None when the layer would build, when the case has
    no LoRA (no LoRA layer is made) and when the oracle itself already fails (see oracle_outcome).
    """
    if not case.lora:
        return None
    _, experts, error = _select(case)
    if error is not None:
        return None
    parallel = parallel_config(case)
    if parallel.use_ep:
        if parallel.all2all_backend != _LORA_EP_A2A:
            return (
                "AssertionError: Fused MoE LoRA with EP currently only supports "
                f"all2all_backend='{_LORA_EP_A2A}', got '{parallel.all2all_backend}'."
            )
        if parallel.is_sequence_parallel:
            return "AssertionError: assert not moe_config.moe_parallel_config.is_sequence_parallel"
    try:
        monolithic = _method_is_monolithic(experts)
    except AttributeError as exc:
        return _error(exc)
    if monolithic:
        return "AssertionError: Monolithic kernels are not supported for Fused MoE LoRA."
    assert experts is not None
    if not experts.supports_lora():
        return (
            f"AssertionError: {experts.__name__} does not support LoRA. "
            "For unquantized MoE, set moe_backend='triton' or moe_backend='auto' "
            "(auto selects Triton automatically when LoRA is enabled). "
            "For quantized MoE, mix LoRAExpertsMixin into the experts class "
            "and consume self._lora_context in apply()."
        )
    return None


# --- the grid ------------------------------------------------------------------------------------

# Routed-expert shapes of real models (hidden, whole-model intermediate, activation, routing as
# the model's router reports it to the kernel).
MODELS: dict[str, dict[str, Any]] = {
    "mixtral-8x7b": dict(num_experts=8, top_k=2, hidden=4096, intermediate=14336, activation="silu", routing="Renormalize"),
    "qwen3-30b-a3b": dict(num_experts=128, top_k=8, hidden=2048, intermediate=768, activation="silu", routing="Renormalize"),
    # sigmoid + score bias + grouped top-k
    "nemotron-3-nano": dict(num_experts=128, top_k=6, hidden=2688, intermediate=1856, activation="relu2_no_mul", routing="DeepSeekV3"),
    "deepseek-v3": dict(num_experts=256, top_k=8, hidden=7168, intermediate=2048, activation="silu", routing="DeepSeekV3"),
    "gpt-oss-20b": dict(num_experts=32, top_k=4, hidden=2880, intermediate=2880, activation="swigluoai", routing="Renormalize", has_bias=True),
    "llama-4-scout": dict(num_experts=16, top_k=1, hidden=5120, intermediate=8192, activation="silu", routing="Llama4"),
}  # fmt: skip

_AITER_ON = (("VLLM_ROCM_USE_AITER", "1"),)
PLATFORMS: dict[str, dict[str, Any]] = {
    **{
        f"cuda{major}.{minor}{'+fi' if fi else ''}": dict(
            platform="cuda", capability=(major, minor), flashinfer=fi
        )
        for major, minor in ((8, 0), (9, 0), (10, 0), (11, 0), (12, 0))
        for fi in (False, True)
    },
    "rocm": dict(platform="rocm", capability=(9, 4), flashinfer=False),
    "rocm+aiter": dict(platform="rocm", capability=(9, 4), flashinfer=False, aiter=True),
    "rocm+aiter+env": dict(
        platform="rocm", capability=(9, 4), flashinfer=False, aiter=True, env=_AITER_ON
    ),
    "rocm+aiter+env+moe0": dict(
        platform="rocm",
        capability=(9, 4),
        flashinfer=False,
        aiter=True,
        env=(*_AITER_ON, ("VLLM_ROCM_USE_AITER_MOE", "0")),
    ),
    "rocm+aiter+env0+moe1": dict(
        platform="rocm",
        capability=(9, 4),
        flashinfer=False,
        aiter=True,
        env=(("VLLM_ROCM_USE_AITER", "0"), ("VLLM_ROCM_USE_AITER_MOE", "1")),
    ),
    "rocm+rdna": dict(platform="rocm", capability=(12, 0), flashinfer=False, aiter=True, rdna=True),
    "rocm+rdna+env": dict(
        platform="rocm", capability=(12, 0), flashinfer=False, aiter=True, rdna=True, env=_AITER_ON
    ),
    "cpu-x86": dict(platform="cpu", capability=None, flashinfer=False),
    "cpu-x86-amx": dict(platform="cpu", capability=None, flashinfer=False, cpu_amx=True),
    "cpu-arm": dict(platform="cpu", capability=None, flashinfer=False, cpu_arch="arm"),
    "cpu-power": dict(platform="cpu", capability=None, flashinfer=False, cpu_arch="power"),
    "xpu": dict(platform="xpu", capability=None, flashinfer=False),
    "tpu": dict(platform="tpu", capability=None, flashinfer=False),
    "oot": dict(platform="oot", capability=None, flashinfer=False),
}
_CUDA = [name for name in PLATFORMS if name.startswith("cuda")]
# Platforms where the parallel layout and the backends' device checks matter.
_PARALLEL_PLATFORMS = [*_CUDA, "rocm", "rocm+aiter+env", "rocm+rdna+env", "xpu", "cpu-x86"]

EP_ALL2ALL = (
    "allgather_reducescatter",
    "deepep_high_throughput",
    "deepep_low_latency",
    "nixl_ep",
    "moonep",
    "flashinfer_nvlink_two_sided",
    "flashinfer_nvlink_one_sided",
    "mori_low_latency",
    "passthrough",
)
LAYOUTS: dict[str, dict[str, Any]] = {
    "tp1": {},
    "tp2": dict(tp=2),
    "tp2dp2": dict(tp=2, dp=2),  # no EP: one TP group of 4
    "ep-tp2": dict(tp=2, ep=True),  # EP without DP: no all2all kernels
    **{f"ep-dp2-{a2a}": dict(dp=2, ep=True, all2all=a2a) for a2a in EP_ALL2ALL},
    "ep-dp2+eplb": dict(dp=2, ep=True, eplb=True),
    "ep-tp2+eplb": dict(tp=2, ep=True, eplb=True),
    # Sequence-parallel MoE: vLLM turns it on for EP with tp>1 and dp>1 (use_sequence_parallel_moe).
    **{
        f"ep-tp2dp2-{a2a}+sp": dict(tp=2, dp=2, ep=True, sp=True, all2all=a2a)
        for a2a in ("allgather_reducescatter", "deepep_high_throughput", "deepep_low_latency")
    },
}
MOE_BACKENDS = (
    "triton",
    "batched_triton",
    "flashinfer_cutlass",
    "flashinfer_trtllm",
    "aiter",
    "humming",
    "marlin",
    "deep_gemm",
)
ACTIVATIONS = tuple(member.value for member in MoEActivation)
ROUTINGS = tuple(member.name for member in RoutingMethodType)
_BATCH_INVARIANT = (("VLLM_BATCH_INVARIANT", "1"),)
_DEFAULTS = {field.name: field.default for field in dataclasses.fields(Case)}


def _case(
    model: str,
    platform: str,
    layout: str = "tp1",
    *,
    lora: bool = False,
    moe_backend: str = "auto",
    dtype: str = "bf16",
    env: tuple[tuple[str, str], ...] = (),
    **fields: Any,
) -> Case:
    """A case named after its parts: model/platform/layout[/lora][/be=...][/dtype][/env][/k=v]."""
    spec = {**MODELS[model], **PLATFORMS[platform], **LAYOUTS[layout]}
    # Only fields that change something are named (and so a case gets one name).
    fields = {key: value for key, value in fields.items() if spec.get(key, _DEFAULTS[key]) != value}
    spec.update(fields)
    parts = [model, platform, layout]
    if lora:
        parts.append("lora")
    if moe_backend != "auto":
        parts.append(f"be={moe_backend}")
    if dtype != "bf16":
        parts.append(dtype)
    parts += [f"{key}={value}" for key, value in env]
    parts += [f"{key}={value}" for key, value in sorted(fields.items())]
    spec["env"] = (*spec.get("env", ()), *env)
    return Case(name="/".join(parts), lora=lora, moe_backend=moe_backend, dtype=dtype, **spec)


def _subgrids() -> Iterator[Case]:
    # Every model on every platform, with and without LoRA.
    for model in MODELS:
        for platform in PLATFORMS:
            for lora in (False, True):
                yield _case(model, platform, lora=lora)
    # Parallel layouts on the platforms where they matter, with and without LoRA.
    for model in MODELS:
        for layout in LAYOUTS:
            for platform in _PARALLEL_PLATFORMS:
                yield _case(model, platform, layout)
            for platform in (
                "cuda9.0+fi",
                "cuda10.0",
                "cuda10.0+fi",
                "cuda12.0+fi",
                "rocm+aiter+env",
                "xpu",
                "cpu-x86",
            ):
                yield _case(model, platform, layout, lora=True)
    # Explicit moe_backend: per platform, under all2all layouts, and with LoRA.
    for model in MODELS:
        for backend in MOE_BACKENDS:
            for platform in [*_PARALLEL_PLATFORMS, "tpu", "oot"]:
                yield _case(model, platform, moe_backend=backend)
            for platform in ("cuda9.0+fi", "cuda10.0+fi"):
                for layout in (
                    "ep-dp2-allgather_reducescatter",
                    "ep-dp2-deepep_low_latency",
                    "ep-dp2-moonep",
                ):
                    yield _case(model, platform, layout, moe_backend=backend)
            for platform in ("cuda9.0", "cuda10.0+fi", "cpu-x86"):
                yield _case(model, platform, lora=True, moe_backend=backend)
    # Environment: batch invariance everywhere; the AITER switches off ROCm too (vLLM reads them
    # on every platform).
    for model in MODELS:
        for platform in PLATFORMS:
            yield _case(model, platform, env=_BATCH_INVARIANT)
        for platform in ("cuda9.0+fi", "cuda10.0+fi", "cpu-x86", "xpu"):
            yield _case(model, platform, env=_AITER_ON)
            yield _case(model, platform, env=(*_AITER_ON, ("VLLM_ROCM_USE_AITER_MOE", "0")))
    # Activation dtypes.
    for model in MODELS:
        for dtype in ("fp16", "fp32"):
            for platform in (
                "cpu-x86",
                "cpu-x86-amx",
                "cpu-arm",
                "cpu-power",
                "cuda9.0",
                "cuda10.0+fi",
                "xpu",
                "rocm+aiter+env",
            ):
                yield _case(model, platform, dtype=dtype)
    # Every activation and every routing method on one shape.
    for activation in ACTIVATIONS:
        for platform in (
            "cuda9.0+fi",
            "cuda10.0+fi",
            "cuda12.0+fi",
            "rocm+aiter+env",
            "cpu-x86",
            "cpu-x86-amx",
            "xpu",
        ):
            yield _case("mixtral-8x7b", platform, activation=activation)
        yield _case("mixtral-8x7b", "cuda10.0+fi", lora=True, activation=activation)
    for routing in ROUTINGS:
        for lora in (False, True):
            yield _case("mixtral-8x7b", "cuda10.0+fi", lora=lora, routing=routing)
    # The removed all2all backends, which vLLM rewrites to allgather_reducescatter.
    for model in MODELS:
        for a2a in _REMOVED_ALL2ALL:
            yield _case(model, "cuda10.0+fi", "ep-dp2-allgather_reducescatter", all2all=a2a)


# --- the quantized grid ---------------------------------------------------------------------------

#: The quantization_config of real public checkpoints, by scheme.
QUANTS: dict[str, dict[str, Any]] = {
    # deepseek-ai/DeepSeek-V3 (configs/models/deepseek-v3.json), Qwen/Qwen3-30B-A3B-FP8
    "fp8-block": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                  "weight_block_size": [128, 128]},
    # neuralmagic/Mixtral-8x7B-Instruct-v0.1-FP8: per-tensor weights and activations
    "fp8-tensor-static": {"activation_scheme": "static", "quant_method": "fp8"},
    # per-tensor weights, dynamic activations (Fp8Config's default activation scheme)
    "fp8-tensor-dynamic": {"activation_scheme": "dynamic", "quant_method": "fp8"},
    # nvidia/Llama-4-Scout-17B-16E-Instruct-FP8, nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-FP8
    "fp8-modelopt": {"quant_method": "modelopt", "quant_algo": "FP8", "kv_cache_quant_algo": "FP8"},
    # openai/gpt-oss-20b, openai/gpt-oss-120b (configs/models/gpt-oss-120b.json)
    "mxfp4": {"modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                         "model.embed_tokens", "lm_head"],
              "quant_method": "mxfp4"},
    # nvidia/Qwen3-30B-A3B-NVFP4 (configs/models/qwen3-30b-a3b-nvfp4.json): ModelOpt W4A4
    "nvfp4": {"quant_method": "modelopt", "quant_algo": "NVFP4", "producer": {"name": "modelopt"},
              "ignore": ["lm_head"]},
    # compressed-tensors W8A8 int8 as llm-compressor's W8A8 scheme writes it (per-channel
    # weights, dynamic per-token activations)
    "int8-channel-token": {
        "quant_method": "compressed-tensors", "format": "int-quantized",
        "config_groups": {"group_0": {
            "targets": ["Linear"],
            "weights": {"num_bits": 8, "type": "int", "strategy": "channel", "symmetric": True,
                        "dynamic": False},
            "input_activations": {"num_bits": 8, "type": "int", "strategy": "token",
                                  "symmetric": True, "dynamic": True}}},
        "ignore": ["lm_head"],
    },
    # compressed-tensors W4A8 (int4 weights in symmetric groups of 128, dynamic per-token fp8
    # activations), the layout vLLM's CompressedTensorsW4A8Fp8MoEMethod takes
    "w4a8-fp8": {
        "quant_method": "compressed-tensors", "format": "pack-quantized",
        "config_groups": {"group_0": {
            "targets": ["Linear"],
            "weights": {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 128,
                        "symmetric": True, "dynamic": False},
            "input_activations": {"num_bits": 8, "type": "float", "strategy": "token",
                                  "symmetric": True, "dynamic": True}}},
        "ignore": ["lm_head"],
    },
    # compressed-tensors W4A8 int8 (int4 weights in symmetric groups of 128, dynamic per-token
    # int8 activations), the layout vLLM's CompressedTensorsW4A8Int8MoEMethod takes
    "w4a8-int8": {
        "quant_method": "compressed-tensors", "format": "pack-quantized",
        "config_groups": {"group_0": {
            "targets": ["Linear"],
            "weights": {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 128,
                        "symmetric": True, "dynamic": False},
            "input_activations": {"num_bits": 8, "type": "int", "strategy": "token",
                                  "symmetric": True, "dynamic": True}}},
        "ignore": ["lm_head"],
    },
    # ModelOpt's MXFP8 export (quant_algo MXFP8: e4m3 weights and activations, e8m0 scales
    # per 32)
    "mxfp8": {"quant_method": "modelopt", "quant_algo": "MXFP8", "producer": {"name": "modelopt"},
              "ignore": ["lm_head"]},
    # Qwen/Qwen3-30B-A3B-GPTQ-Int4 (configs/models/qwen3-30b-a3b-gptq-int4.json)
    "gptq-int4": {"bits": 4, "damp_percent": 0.01, "desc_act": False, "group_size": 128,
                  "quant_method": "gptq", "static_groups": False, "sym": True,
                  "true_sequential": True},
    # Qwen/Qwen1.5-MoE-A2.7B-Chat-GPTQ-Int8
    "gptq-int8": {"bits": 8, "damp_percent": 0.01, "desc_act": False, "group_size": 128,
                  "quant_method": "gptq", "static_groups": False, "sym": True,
                  "true_sequential": True},
    # TheBloke/Mixtral-8x7B-Instruct-v0.1-AWQ (zero points)
    "awq-int4": {"bits": 4, "group_size": 128, "quant_method": "awq", "version": "gemm",
                 "zero_point": True},
    # RedHatAI/Llama-4-Scout-17B-16E-Instruct-FP8-dynamic
    "fp8-channel-token": {
        "quant_method": "compressed-tensors",
        "format": "float-quantized",
        "config_groups": {"group_0": {
            "targets": ["Linear"],
            "weights": {"num_bits": 8, "type": "float", "strategy": "channel", "dynamic": False,
                        "symmetric": True},
            "input_activations": {"num_bits": 8, "type": "float", "strategy": "token",
                                  "dynamic": True, "symmetric": True},
        }},
    },
}  # fmt: skip
#: (model shape, scheme) pairs as public checkpoints ship them.
QUANTIZED_MODELS = (
    ("deepseek-v3", "fp8-block"),
    ("qwen3-30b-a3b", "fp8-block"),
    ("mixtral-8x7b", "fp8-tensor-static"),
    ("mixtral-8x7b", "fp8-tensor-dynamic"),
    ("llama-4-scout", "fp8-modelopt"),
    ("nemotron-3-nano", "fp8-modelopt"),
    ("llama-4-scout", "fp8-channel-token"),
)
#: ``--moe-backend`` values for the fp8 oracle (batched_triton is one it does not map).
FP8_BACKENDS = ("triton", "deep_gemm", "cutlass", "flashinfer_trtllm", "flashinfer_cutlass",
                "marlin", "humming", "aiter", "hpc", "batched_triton")  # fmt: skip
FP8_LAYOUTS: dict[str, dict[str, Any]] = {
    "tp2": dict(tp=2),
    "tp4": dict(tp=4),  # Qwen3-30B-A3B-FP8's 768 / 4 = 192: vLLM refines its 128x128 blocks
    "ep-tp2": dict(tp=2, ep=True),
    "ep-tp2+eplb": dict(tp=2, ep=True, eplb=True),
    **{
        f"ep-dp2-{a2a}": dict(dp=2, ep=True, all2all=a2a)
        for a2a in ("allgather_reducescatter", "deepep_high_throughput", "deepep_low_latency",
                    "deepep_v2", "flashinfer_nvlink_one_sided", "flashinfer_nvlink_two_sided",
                    "moonep")
    },
    "ep-tp2dp2-allgather_reducescatter+sp": dict(
        tp=2, dp=2, ep=True, sp=True, all2all="allgather_reducescatter"
    ),
}  # fmt: skip
_FP8_ENVS = (
    (("VLLM_USE_DEEP_GEMM", "0"),),
    (("VLLM_MOE_USE_DEEP_GEMM", "0"),),
    (("VLLM_USE_DEEP_GEMM", "1"), ("VLLM_MOE_USE_DEEP_GEMM", "1")),
    _AITER_ON,
    (*_AITER_ON, ("VLLM_ROCM_USE_AITER_MOE", "0")),
    _BATCH_INVARIANT,
)


def _qcase(model: str, quant: str, platform: str, layout: str = "tp1", **fields: Any) -> Case:
    """An fp8 case named model/quant/platform/layout[/k=v]."""
    shape = {**MODELS, **QUANTIZED_SHAPES}[model]
    spec = {**shape, **PLATFORMS[platform], **{**LAYOUTS, **FP8_LAYOUTS}[layout]}
    spec.update(quant=quant, **{k: v for k, v in fields.items() if k != "env"})
    spec["env"] = (*spec.get("env", ()), *fields.get("env", ()))
    extras = [f"{k}={v}" for k, v in sorted(fields.items()) if k != "env"]
    extras += [f"{k}={v}" for k, v in fields.get("env", ())]
    return Case(name="/".join([model, quant, platform, layout, *extras]), **spec)


def _fp8_subgrids() -> Iterator[Case]:
    # humming stays uninstalled: its classes ask the humming package itself which GEMM it
    # prefers (is_supported_config), which a machine without it cannot answer.
    kernels = dict(deep_gemm=True)
    for model, quant in QUANTIZED_MODELS:
        # Every platform, with and without LoRA; the kernel packages on CUDA.
        for platform in PLATFORMS:
            for lora in (False, True):
                yield _qcase(model, quant, platform, lora=lora)
        for platform in ("cuda8.0", "cuda9.0+fi", "cuda10.0+fi", "cuda11.0", "cuda12.0+fi"):
            yield _qcase(model, quant, platform, deep_gemm=True)
        # Parallel layouts.
        for layout in FP8_LAYOUTS:
            yield _qcase(model, quant, "cuda9.0+fi", layout, **kernels)
            yield _qcase(model, quant, "cuda10.0+fi", layout, deep_gemm=True)
            yield _qcase(model, quant, "rocm+aiter+env", layout)
            yield _qcase(model, quant, "xpu", layout)
        # Explicit --moe-backend, also under LoRA and the batched format.
        for backend in FP8_BACKENDS:
            yield _qcase(model, quant, "cuda9.0+fi", moe_backend=backend, **kernels)
            yield _qcase(model, quant, "cuda10.0+fi", moe_backend=backend)
            yield _qcase(model, quant, "rocm+aiter+env", moe_backend=backend)
            yield _qcase(model, quant, "cuda9.0+fi", moe_backend=backend, lora=True)
            yield _qcase(
                model, quant, "cuda9.0+fi", "ep-dp2-deepep_low_latency", moe_backend=backend,
                deep_gemm=True,
            )  # fmt: skip
        # vLLM's DeepGEMM and AITER switches, and batch invariance.
        for env in _FP8_ENVS:
            yield _qcase(model, quant, "cuda9.0+fi", env=env, deep_gemm=True)
            yield _qcase(model, quant, "rocm+aiter", env=env)
        # The DeepGEMM switches on under the batched format: vLLM takes BatchedDeepGemmExperts.
        yield _qcase(model, quant, "cuda9.0+fi", "ep-dp2-deepep_low_latency", env=_FP8_ENVS[2],
                     deep_gemm=True)  # fmt: skip


#: gpt-oss's routed experts (mxfp4 weights, bf16 activations): openai/gpt-oss-20b and -120b.
MXFP4_MODELS = ("gpt-oss-20b", "gpt-oss-120b")
#: Shapes only the quantized grids use (the unquantized grid keeps MODELS).
QUANTIZED_SHAPES: dict[str, dict[str, Any]] = {
    "gpt-oss-120b": {**MODELS["gpt-oss-20b"], "num_experts": 128},
    # Qwen/Qwen1.5-MoE-A2.7B's routed experts (its shared expert is a plain MLP)
    "qwen1.5-moe-a2.7b": dict(
        num_experts=60,
        top_k=4,
        hidden=2048,
        intermediate=1408,
        activation="silu",
        routing="Default",
    ),
}
MXFP4_BACKENDS = ("triton", "marlin", "humming", "flashinfer_trtllm", "flashinfer_cutlass",
                  "emulation", "xpu", "cpu", "b12x", "not_a_backend")  # fmt: skip


def _mxfp4_subgrids() -> Iterator[Case]:
    kernels = dict(triton_kernels=True)
    # rocm+aiter+env+moe0 stays out: AITER's Triton a16w4 kernel needs AITER on but not AITER
    # MoE, which rocm.aiter (AITER MoE on) does not tell apart.
    platforms = [p for p in PLATFORMS if p != "rocm+aiter+env+moe0"]
    for model in MXFP4_MODELS:
        for platform in platforms:
            for lora in (False, True):
                yield _qcase(model, "mxfp4", platform, lora=lora)
                yield _qcase(model, "mxfp4", platform, lora=lora, **kernels)
        for layout in FP8_LAYOUTS:
            for platform in ("cuda9.0+fi", "cuda10.0+fi", "cuda12.0+fi", "rocm+aiter+env", "xpu"):
                yield _qcase(model, "mxfp4", platform, layout, **kernels)
        for backend in MXFP4_BACKENDS:
            for platform in ("cuda9.0+fi", "cuda10.0+fi", "cpu-x86-amx", "xpu"):
                yield _qcase(model, "mxfp4", platform, moe_backend=backend, **kernels)
            yield _qcase(
                model, "mxfp4", "cuda10.0+fi", "ep-dp2-deepep_low_latency", moe_backend=backend
            )
        for env in (_BATCH_INVARIANT,):
            yield _qcase(model, "mxfp4", "cuda10.0+fi", env=env, **kernels)


#: Models with public ModelOpt NVFP4 checkpoints (nvidia/Qwen3-30B-A3B-NVFP4,
#: nvidia/DeepSeek-R1-FP4, nvidia/Llama-4-Scout-17B-16E-Instruct-FP4).
NVFP4_MODELS = ("qwen3-30b-a3b", "deepseek-v3", "llama-4-scout")
NVFP4_BACKENDS = ("cutlass", "flashinfer_trtllm", "flashinfer_cutlass", "flashinfer_cutedsl",
                  "marlin", "humming", "emulation", "b12x", "not_a_backend")  # fmt: skip


def _nvfp4_subgrids() -> Iterator[Case]:
    for model in NVFP4_MODELS:
        for platform in PLATFORMS:
            for lora in (False, True):
                yield _qcase(model, "nvfp4", platform, lora=lora)
        for layout in FP8_LAYOUTS:
            for platform in ("cuda9.0+fi", "cuda10.0+fi", "cuda12.0+fi", "rocm", "xpu"):
                yield _qcase(model, "nvfp4", platform, layout)
        for backend in NVFP4_BACKENDS:
            for platform in ("cuda9.0+fi", "cuda10.0+fi", "cuda12.0+fi", "rocm"):
                yield _qcase(model, "nvfp4", platform, moe_backend=backend)
            yield _qcase(
                model, "nvfp4", "cuda10.0+fi", "ep-dp2-deepep_low_latency", moe_backend=backend
            )
        yield _qcase(model, "nvfp4", "cuda10.0+fi", env=_BATCH_INVARIANT)


def nvfp4_grid() -> list[Case]:
    """The nvfp4 oracle's grid: ModelOpt NVFP4 checkpoints over platforms, layouts, LoRA and
    explicit backends (first occurrence kept)."""
    seen: dict[Case, Case] = {}
    for case in _nvfp4_subgrids():
        seen.setdefault(replace(case, name=""), case)
    return list(seen.values())


def mxfp4_grid() -> list[Case]:
    """The mxfp4 oracle's grid: gpt-oss over platforms, layouts, LoRA, explicit backends
    and triton_kernels installed or not (first occurrence kept)."""
    seen: dict[Case, Case] = {}
    for case in _mxfp4_subgrids():
        seen.setdefault(replace(case, name=""), case)
    return list(seen.values())


def fp8_grid() -> list[Case]:
    """The fp8 oracle's grid: real fp8 checkpoints' schemes over platforms, layouts, LoRA,
    explicit backends, kernel packages and vLLM's switches (first occurrence kept)."""
    seen: dict[Case, Case] = {}
    for case in _fp8_subgrids():
        seen.setdefault(replace(case, name=""), case)
    cases = list(seen.values())
    assert len({c.name for c in cases}) == len(cases), "grid case names must be unique"
    return cases


def grid() -> list[Case]:
    """A broad, deterministic grid: the union of the sub-grids above, first occurrence kept."""
    seen: dict[Case, Case] = {}
    for case in _subgrids():
        seen.setdefault(replace(case, name=""), case)  # the same deployment under another name
    cases = list(seen.values())
    names = [case.name for case in cases]
    assert len(set(names)) == len(names), "grid case names must be unique"
    return cases


def with_fields(case: Case, **fields: Any) -> Case:
    """A copy of the case with fields changed (the name says so)."""
    suffix = ",".join(f"{key}={value}" for key, value in sorted(fields.items()))
    return replace(case, name=f"{case.name}[{suffix}]", **fields)


#: The QUANTS that vLLM's GPTQ and AWQ methods hand to its int_wna16 oracle.
WNA16_QUANTS = ("gptq-int4", "gptq-int8", "awq-int4")


def wna16_arguments(case: Case) -> tuple[Any, Any, bool, bool, bool]:
    """What AutoGPTQMoEMethod / AutoAWQMoEMethod pass select_wna16_moe_backend: (weight key,
    quantization config, may_have_zp, may_have_bias, allow_tile_padding)."""
    spec = QUANTS[str(case.quant)]
    if spec["quant_method"] == "awq":
        config: Any = AutoAWQConfig.from_config(spec)
        return qk.kInt4Static, config, bool(config.zero_point), True, True
    config = AutoGPTQConfig.from_config(spec)
    four = config.quant_type.size_bits == 4
    quant_type = scalar_types.uint4b8 if four else scalar_types.uint8b128
    scale = qk.kInt4StaticGroupScale if four else qk.kInt8StaticGroupScale
    return qk.QuantKey(quant_type, scale), config, not config.is_sym, True, True


#: Models with public GPTQ/AWQ checkpoints: Qwen3-30B-A3B-GPTQ-Int4, Mixtral-8x7B-Instruct
#: AWQ, Qwen1.5-MoE-A2.7B-Chat-GPTQ-Int8.
WNA16_MODELS = (
    ("qwen3-30b-a3b", "gptq-int4"),
    ("mixtral-8x7b", "awq-int4"),
    ("qwen1.5-moe-a2.7b", "gptq-int8"),
)
WNA16_BACKENDS = ("triton", "marlin", "humming", "flashinfer_trtllm", "emulation", "rdna3",
                  "cutlass", "not_a_backend")  # fmt: skip
_WNA16_PLATFORMS = ("cuda8.0", "cuda9.0+fi", "cuda10.0+fi", "cuda12.0+fi", "rocm", "xpu",
                    "cpu-x86", "cpu-x86-amx", "cpu-arm", "tpu")  # fmt: skip
_WNA16_LAYOUTS = ("tp2", "tp4", "ep-tp2", "ep-dp2-deepep_low_latency",
                  "ep-dp2-flashinfer_nvlink_two_sided", "ep-dp2-flashinfer_nvlink_one_sided")  # fmt: skip


def _wna16_subgrids() -> Iterator[Case]:
    for model, quant in WNA16_MODELS:
        for platform in _WNA16_PLATFORMS:
            for lora in (False, True):
                yield _qcase(model, quant, platform, lora=lora)
        for layout in _WNA16_LAYOUTS:
            for platform in ("cuda8.0", "cuda9.0+fi", "rocm"):
                yield _qcase(model, quant, platform, layout)
        for backend in WNA16_BACKENDS:
            for platform in ("cuda8.0", "cuda10.0+fi", "rocm"):
                yield _qcase(model, quant, platform, moe_backend=backend)
            yield _qcase(model, quant, "cuda8.0", "ep-dp2-deepep_low_latency", moe_backend=backend)
        yield _qcase(model, quant, "cuda8.0", env=_BATCH_INVARIANT)
        yield _qcase(model, quant, "cuda9.0+fi", lora=True, moe_backend="triton")


def wna16_grid() -> list[Case]:
    """The int_wna16 oracle's grid: GPTQ and AWQ checkpoints over platforms, layouts, LoRA and
    explicit backends (first occurrence kept)."""
    seen: dict[Case, Case] = {}
    for case in _wna16_subgrids():
        seen.setdefault(replace(case, name=""), case)
    return list(seen.values())


#: Model shapes for the mxfp8 oracle's grid (the ModelOpt MXFP8 export of each).
MXFP8_MODELS = ("qwen3-30b-a3b", "deepseek-v3", "llama-4-scout")
MXFP8_BACKENDS = ("flashinfer_trtllm", "deep_gemm", "marlin", "xpu", "aiter", "triton", "humming",
                  "emulation", "not_a_backend")  # fmt: skip


def _mxfp8_subgrids() -> Iterator[Case]:
    for model in MXFP8_MODELS:
        for platform in PLATFORMS:
            for lora in (False, True):
                yield _qcase(model, "mxfp8", platform, lora=lora)
        for platform in ("cuda9.0+fi", "cuda10.0", "cuda10.0+fi", "cuda12.0+fi"):
            yield _qcase(model, "mxfp8", platform, deep_gemm=True)
            yield _qcase(model, "mxfp8", platform, deep_gemm=True, lora=True)
            yield _qcase(model, "mxfp8", platform, deep_gemm=True,
                         env=(("VLLM_USE_DEEP_GEMM", "0"),))  # fmt: skip
            # vLLM's mxfp8 oracle does not read VLLM_MOE_USE_DEEP_GEMM: DeepGEMM stays.
            yield _qcase(model, "mxfp8", platform, deep_gemm=True,
                         env=(("VLLM_MOE_USE_DEEP_GEMM", "0"),))  # fmt: skip
        for layout in FP8_LAYOUTS:
            for platform in ("cuda9.0+fi", "cuda10.0+fi", "rocm", "xpu"):
                yield _qcase(model, "mxfp8", platform, layout)
        for backend in MXFP8_BACKENDS:
            for platform in ("cuda9.0+fi", "cuda10.0+fi", "rocm", "xpu"):
                yield _qcase(model, "mxfp8", platform, moe_backend=backend)
            yield _qcase(
                model, "mxfp8", "cuda10.0+fi", "ep-dp2-deepep_low_latency", moe_backend=backend
            )
        yield _qcase(model, "mxfp8", "cuda10.0+fi", env=_BATCH_INVARIANT)


def mxfp8_grid() -> list[Case]:
    """The mxfp8 oracle's grid: ModelOpt MXFP8 layers over platforms, layouts, LoRA, DeepGEMM
    and explicit backends (first occurrence kept)."""
    seen: dict[Case, Case] = {}
    for case in _mxfp8_subgrids():
        seen.setdefault(replace(case, name=""), case)
    return list(seen.values())


#: The int8 (w8a8) QUANTS and the (weight, activation) keys their vLLM method passes.
INT8_QUANTS: dict[str, tuple[Any, Any]] = {
    "int8-channel-token": (qk.kInt8StaticChannelSym, qk.kInt8DynamicTokenSym),
}
INT8_MODELS = ("qwen3-30b-a3b", "mixtral-8x7b", "deepseek-v3")
INT8_BACKENDS = ("triton", "humming", "marlin", "not_a_backend")


def _int8_subgrids() -> Iterator[Case]:
    for model in INT8_MODELS:
        for platform in PLATFORMS:
            for lora in (False, True):
                yield _qcase(model, "int8-channel-token", platform, lora=lora)
        for layout in FP8_LAYOUTS:
            for platform in ("cuda8.0", "cuda9.0+fi", "rocm", "xpu", "cpu-x86-amx"):
                yield _qcase(model, "int8-channel-token", platform, layout)
        for backend in INT8_BACKENDS:
            for platform in ("cuda8.0", "cuda9.0+fi", "rocm", "cpu-x86-amx"):
                yield _qcase(model, "int8-channel-token", platform, moe_backend=backend)
        yield _qcase(model, "int8-channel-token", "cuda9.0+fi", env=_BATCH_INVARIANT)


def int8_grid() -> list[Case]:
    """The int8 (w8a8) oracle's grid: compressed-tensors W8A8 int8 layers over platforms,
    layouts, LoRA and explicit backends (first occurrence kept)."""
    seen: dict[Case, Case] = {}
    for case in _int8_subgrids():
        seen.setdefault(replace(case, name=""), case)
    return list(seen.values())


W4A8_MODELS = ("qwen3-30b-a3b", "mixtral-8x7b", "deepseek-v3", "nemotron-3-nano")


def _w4a8_subgrids() -> Iterator[Case]:
    for model in W4A8_MODELS:
        for platform in PLATFORMS:
            for lora in (False, True):
                yield _qcase(model, "w4a8-fp8", platform, lora=lora)
        for layout in FP8_LAYOUTS:
            for platform in ("cuda9.0", "cuda10.0"):
                yield _qcase(model, "w4a8-fp8", platform, layout)
        for backend in ("cutlass", "humming", "marlin"):
            for platform in ("cuda9.0", "cuda10.0", "rocm"):
                yield _qcase(model, "w4a8-fp8", platform, moe_backend=backend)
        yield _qcase(model, "w4a8-fp8", "cuda9.0", dtype="fp16")
        yield _qcase(model, "w4a8-fp8", "cuda9.0", env=_BATCH_INVARIANT)


def w4a8_grid() -> list[Case]:
    """The W4A8 (int4 x fp8) oracle's grid: compressed-tensors W4A8 layers over platforms,
    layouts, LoRA, dtypes and explicit backends (first occurrence kept)."""
    seen: dict[Case, Case] = {}
    for case in _w4a8_subgrids():
        seen.setdefault(replace(case, name=""), case)
    return list(seen.values())


def _w4a8_int8_subgrids() -> Iterator[Case]:
    for model in ("qwen3-30b-a3b", "mixtral-8x7b", "deepseek-v3"):
        for platform in PLATFORMS:
            for lora in (False, True):
                yield _qcase(model, "w4a8-int8", platform, lora=lora)
        for layout in ("tp2", "ep-tp2"):
            yield _qcase(model, "w4a8-int8", "cpu-arm", layout)
        for backend in ("cpu", "triton"):
            for platform in ("cpu-arm", "cpu-x86-amx", "cuda9.0"):
                yield _qcase(model, "w4a8-int8", platform, moe_backend=backend)


def w4a8_int8_grid() -> list[Case]:
    """The W4A8 int8 oracle's grid: compressed-tensors W4A8 int8 layers over platforms,
    layouts, LoRA and explicit backends (first occurrence kept)."""
    seen: dict[Case, Case] = {}
    for case in _w4a8_int8_subgrids():
        seen.setdefault(replace(case, name=""), case)
    return list(seen.values())
