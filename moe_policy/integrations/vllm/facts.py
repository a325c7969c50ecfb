"""The selection context from vLLM's own objects: its ``FusedMoEConfig`` (with the parallel
config inside), its platform and its availability probes, each fact with an origin
``vllm:<where it was read>``. Imports vLLM; only the vLLM integration uses this module.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from moe_policy.core.model import ModelFacts
from moe_policy.core.origin import Origin
from moe_policy.core.platform import PlatformFacts
from moe_policy.core.quantization import unquantized
from moe_policy.errors import PolicyError, did_you_mean
from moe_policy.settings import Entry

#: vLLM's MoEActivation values -> (activation, gated) in the policy's vocabulary.
_GATED = ("silu", "gelu", "gelu_tanh", "relu2", "swigluoai", "situ", "swigluoai_uninterleave",
          "swiglustep")  # fmt: skip
_NON_GATED = ("silu", "gelu", "gelu_tanh", "relu2")  # vLLM spells them <name>_no_mul
ACTIVATIONS: Mapping[str, tuple[str, bool]] = {
    **{name: (name, True) for name in _GATED},
    **{f"{name}_no_mul": (name, False) for name in _NON_GATED},
}
#: vLLM's RoutingMethodType names -> the policy's routing names.
ROUTINGS: Mapping[str, str] = {
    "Default": "softmax",
    "Renormalize": "renormalize",
    "DeepSeekV3": "deepseek_v3",
    "Llama4": "llama4",
    "RenormalizeNaive": "renormalize_naive",
    "TopK": "topk",
    "SigmoidRenorm": "sigmoid_renorm",
    "MiniMax2": "minimax2",
    "Sigmoid": "sigmoid",
    "DeepseekV4": "deepseek_v4",
}
DTYPES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}
#: ``--moe-backend`` values vLLM maps to an unquantized backend; ``humming`` and ``marlin``
#: are quantization-only and mean auto for an unquantized layer.
REQUESTABLE = ("triton", "batched_triton", "flashinfer_trtllm", "flashinfer_cutlass", "aiter")
MEANS_AUTO = ("auto", "humming", "marlin")


def vllm_origin(field: str) -> Origin:
    return Origin.engine("vllm", field)


def model_facts(
    moe_config: Any,
    architecture: str | None = None,
    quantization: Mapping[str, tuple[Any, Origin]] | None = None,
) -> ModelFacts:
    """The ``model.*`` facts of one MoE layer, read from its ``FusedMoEConfig`` (and, for a
    quantized layer, its quantization facts: :func:`quant_facts`)."""
    activation = str(getattr(moe_config.activation, "value", moe_config.activation))
    if activation not in ACTIVATIONS:
        raise PolicyError(
            f"vLLM activation {activation!r} is not in moe_policy's vocabulary "
            f"(known: {', '.join(ACTIVATIONS)})",
            vllm_origin("moe_config.activation"),
        )
    name, gated = ACTIVATIONS[activation]
    routing_name = getattr(moe_config.routing_method, "name", str(moe_config.routing_method))
    dtype_name = str(moe_config.in_dtype).removeprefix("torch.")
    if dtype_name not in DTYPES:
        raise PolicyError(
            f"MoE activations in {dtype_name} are not an unquantized dtype moe_policy knows",
            vllm_origin("moe_config.in_dtype"),
        )
    o = vllm_origin
    facts: dict[str, tuple[Any, Origin]] = {
        "model.num_experts": (int(moe_config.num_experts), o("moe_config.num_experts")),
        "model.top_k": (int(moe_config.experts_per_token), o("moe_config.experts_per_token")),
        "model.hidden_size": (int(moe_config.hidden_dim), o("moe_config.hidden_dim")),
        "model.intermediate_size": (
            int(moe_config.intermediate_size),
            o("moe_config.intermediate_size"),
        ),
        "model.activation": (name, o("moe_config.activation")),
        "model.gated": (gated, o("moe_config.activation")),
        "model.dtype": (DTYPES[dtype_name], o("moe_config.in_dtype")),
        "model.routing": (ROUTINGS.get(routing_name, "custom"), o("moe_config.routing_method")),
        "model.has_bias": (bool(moe_config.has_bias), o("moe_config.has_bias")),
    }
    facts.update(quantization or unquantized(o("unquantized oracle")))
    if architecture:
        facts["model.architecture"] = (architecture, o("model_config.architectures"))
    return ModelFacts("vllm:moe_config", facts)


def request_entry(value: str, *, platform: str, lora: bool, moonep: bool) -> Entry | None:
    """vLLM's ``--moe-backend`` as an explicit request (None: auto for this layer).

    A value vLLM maps to no unquantized backend is an error where vLLM's oracle would raise
    too; on TPU and out-of-tree platforms, under LoRA and with the MoonEP all2all its oracle
    returns before it looks at the value.
    """
    value = str(value or "auto")
    origin = vllm_origin("--moe-backend")
    if value in MEANS_AUTO:
        return None
    if value not in REQUESTABLE:
        if platform in ("tpu", "oot") or lora or moonep:
            return None
        raise PolicyError(
            f"moe_backend={value!r} is not supported for unquantized MoE "
            f"(vLLM maps only {', '.join(REQUESTABLE)}){did_you_mean(value, REQUESTABLE)}",
            origin,
            key="backend",
        )
    return Entry("backend", value, origin)


def deployment_entries(moe_config: Any, lora_config: Any = None) -> list[Entry]:
    """The parallel layout and LoRA settings, undone from vLLM's flattened sizes.

    Prefill context parallelism is refused: vLLM flattens its ranks into the experts'
    tensor-parallel shards and expert-parallel group and runs the all2all kernels for it,
    which no fact of the profile describes, so every layout fact would be wrong.
    """
    par = moe_config.moe_parallel_config
    if int(par.pcp_size) > 1:
        raise PolicyError(
            f"prefill context parallelism (size {par.pcp_size}) is not described by the vLLM "
            "profile: the experts' tensor-parallel shards, expert-parallel size and all2all "
            "kernels it implies have no policy facts; serve without it or leave the plugin "
            "out (VLLM_PLUGINS)",
            vllm_origin("parallel_config.prefill_context_parallel_size"),
            key="parallel.tp",
        )
    dp = int(par.dp_size)
    flat = int(par.ep_size) if par.use_ep else int(par.tp_size)
    o = vllm_origin
    entries = [
        Entry(
            "parallel.tp",
            max(1, flat // max(1, dp * int(par.pcp_size))),
            o("parallel_config.tensor_parallel_size"),
        ),
        Entry("parallel.dp", dp, o("parallel_config.data_parallel_size")),
        Entry("parallel.ep", bool(par.use_ep), o("parallel_config.enable_expert_parallel")),
        Entry("parallel.all2all", str(par.all2all_backend), o("parallel_config.all2all_backend")),
        Entry("parallel.eplb", bool(par.enable_eplb), o("parallel_config.enable_eplb")),
        Entry("parallel.sp", int(par.sp_size) > 1, o("moe_parallel_config.sp_size")),
        Entry("lora.enabled", bool(moe_config.is_lora_enabled), o("lora_config")),
    ]
    if moe_config.is_lora_enabled and lora_config is not None:
        entries += [
            Entry("lora.max_rank", int(lora_config.max_lora_rank), o("lora_config.max_lora_rank")),
            Entry("lora.max_loras", int(lora_config.max_loras), o("lora_config.max_loras")),
            Entry(
                "lora.fully_sharded",
                bool(getattr(lora_config, "fully_sharded_loras", False)),
                o("lora_config.fully_sharded_loras"),
            ),
        ]
    return entries


def platform_entries(platform: Any) -> tuple[PlatformFacts, list[Entry]]:
    """The platform as vLLM sees it, plus the facts its probes decide (AITER, CPU kind)."""
    if platform.is_tpu():
        name = "tpu"
    elif platform.is_out_of_tree():
        name = "oot"
    elif platform.is_cuda():
        name = "cuda"
    elif platform.is_rocm():
        name = "rocm"
    elif platform.is_xpu():
        name = "xpu"
    elif platform.is_cpu():
        name = "cpu"
    else:
        raise PolicyError(
            f"vLLM's current platform {type(platform).__name__} is none of cuda, rocm, xpu, cpu, "
            "tpu or out-of-tree",
            vllm_origin("current_platform"),
        )
    capability = None
    if name == "cuda":
        cap = platform.get_device_capability()
        capability = f"{cap.major}.{cap.minor}" if cap is not None else None
    packages = ["torch", "vllm", *_optional_packages()]
    facts = PlatformFacts(
        name,
        capability,
        getattr(platform, "device_name", None) or None,
        tuple(packages),
        origin=str(vllm_origin("current_platform")),
    )
    entries: list[Entry] = []
    if name == "rocm":
        from vllm._aiter_ops import rocm_aiter_ops

        entries.append(
            Entry(
                "rocm.aiter",
                bool(rocm_aiter_ops.is_fused_moe_enabled()),
                vllm_origin("rocm_aiter_ops.is_fused_moe_enabled"),
            )
        )
        entries.append(Entry("rocm.gfx", rocm_gfx(), vllm_origin("vllm.platforms.rocm")))
    if name == "cpu":
        entries += _cpu_entries(platform)
    return facts, entries


def _optional_packages() -> list[str]:
    """The optional kernel packages vLLM's experts classes find (their own probes)."""
    from vllm.utils import deep_gemm, hpc, import_utils

    found = ["flashinfer"] if _flashinfer_moe_available() else []
    probes = {"deep_gemm": deep_gemm.has_deep_gemm, "humming": import_utils.has_humming,
              "hpc": hpc.has_hpc, "triton_kernels": import_utils.has_triton_kernels,
              "quark": import_utils.has_quark}  # fmt: skip
    return found + [name for name, probe in probes.items() if probe()]


def _flashinfer_moe_available() -> bool:
    """FlashInfer's fused-MoE modules as vLLM's experts classes probe them."""
    from vllm.model_executor.layers.fused_moe.experts import flashinfer_cutlass_moe, trtllm_bf16_moe

    return bool(
        flashinfer_cutlass_moe.has_flashinfer_cutlass_fused_moe()
        or trtllm_bf16_moe.has_flashinfer_trtllm_fused_moe()
    )


def _cpu_entries(platform: Any) -> list[Entry]:
    import torch

    arch = str(getattr(platform.get_cpu_architecture(), "name", "")).lower()
    kind = {"x86": "x86", "arm": "arm", "powerpc": "power"}.get(arch, "other")
    amx = bool(torch.cpu._is_amx_tile_supported()) if kind == "x86" else False
    origin = vllm_origin("current_platform.get_cpu_architecture")
    return [Entry("cpu.arch", kind, origin), Entry("cpu.amx", amx, vllm_origin("torch.cpu"))]


# --- quantized layers ------------------------------------------------------------------------

#: ``--moe-backend`` values vLLM's fp8 oracle maps (map_fp8_backend), and the batched
#: variant it swaps in when the all2all kernels deliver the batched format.
FP8_REQUESTABLE: Mapping[str, str] = {
    "triton": "triton",
    "deep_gemm": "deep_gemm",
    "cutlass": "vllm_cutlass",
    "flashinfer_trtllm": "flashinfer_trtllm",
    "flashinfer_cutlass": "flashinfer_cutlass",
    "marlin": "marlin",
    "humming": "humming",
    "aiter": "aiter",
    "hpc": "hpc",
}
FP8_BATCHED = {"triton": "batched_triton", "deep_gemm": "batched_deep_gemm",
               "vllm_cutlass": "batched_vllm_cutlass"}  # fmt: skip


def _w4a8_int8_keys(q: Any) -> tuple[Any, ...]:
    """vLLM's weight keys of W4A8 int8 layers (int4 values in int8 storage)."""
    names = ("kInt4W4A8StaticChannelSym", "kInt4W4A8StaticGroup128Sym",
             "kInt4W4A8StaticGroup64Sym", "kInt4W4A8StaticGroup32Sym")  # fmt: skip
    return tuple(getattr(q, name) for name in names)


def quant_facts(weight_key: Any, activation_key: Any, fmt: str) -> dict[str, tuple[Any, Origin]]:
    """The ``model.*`` quantization facts of a layer from vLLM's (weight, activation) keys."""
    from vllm.model_executor.layers.quantization.utils import quant_utils as q

    w_origin, a_origin = vllm_origin("weight_key"), vllm_origin("activation_key")
    block = None
    group = None
    if weight_key == q.kFp8StaticTensorSym:
        scheme, scale = "fp8", "tensor"
    elif weight_key == q.kFp8StaticChannelSym:
        scheme, scale = "fp8", "channel"
    elif weight_key == q.kMxfp8Static:
        scheme, scale, group = "mxfp8", "group", 32
    elif weight_key == q.kMxfp4Static:
        scheme, scale, group = "mxfp4", "group", 32
    elif weight_key == q.kNvfp4Static:
        scheme, scale, group = "nvfp4", "group", 16
    elif weight_key == q.kInt4Static and activation_key == q.kFp8DynamicTokenSym:
        # vLLM's compressed-tensors W4A8 method takes symmetric groups of 128 only
        scheme, scale, group = "w4a8_fp8", "group", 128
    elif weight_key in _w4a8_int8_keys(q) and activation_key is None:
        # int4 weights stored as int8; the kernel quantizes activations to int8 itself
        size = weight_key.scale.group_shape.col
        scheme, scale = "w4a8_int8", "group" if size > 1 else "channel"
        group = size if size > 1 else None
    elif weight_key == q.kInt8StaticChannelSym:
        scheme, scale = "int8", "channel"
    elif weight_key == q.kInt8StaticTensorSym:
        scheme, scale = "int8", "tensor"
    elif (
        weight_key is not None
        and weight_key.dtype == q.FP8_DTYPE
        and weight_key.scale.static
        and weight_key.scale.group_shape.row > 1
        and weight_key.scale.group_shape.col > 1
    ):
        shape = weight_key.scale.group_shape
        scheme, scale, block = "fp8", "block", f"{shape.row}x{shape.col}"
    else:
        raise PolicyError(f"vLLM weight key {weight_key} is no scheme moe_policy knows", w_origin)
    activations = {
        None: "none",
        q.kFp8StaticTensorSym: "static_tensor",
        q.kFp8DynamicTensorSym: "dynamic_tensor",
        q.kFp8DynamicTokenSym: "dynamic_token",
        q.kFp8Dynamic128Sym: "dynamic_group",
        q.kMxfp8Dynamic: "dynamic_group",
        q.kNvfp4Dynamic: "dynamic_group",
        q.kInt8DynamicTokenSym: "dynamic_token",
        q.kInt8DynamicTensorSym: "dynamic_tensor",
    }
    if activation_key not in activations:
        raise PolicyError(
            f"vLLM activation key {activation_key} is no activation quantization moe_policy knows",
            a_origin,
        )
    return {
        "model.quantization": (scheme, w_origin),
        "model.quant.format": (fmt, vllm_origin("quant_method")),
        "model.quant.weight_scale": (scale, w_origin),
        "model.quant.block": (block, w_origin),
        "model.quant.group_size": (group, w_origin),
        "model.quant.activation": (activations[activation_key], a_origin),
        "model.quant.symmetric": (True, w_origin),
    }


def fp8_request_entry(value: str, *, batched: bool, allow_vllm_cutlass: bool) -> Entry | None:
    """``--moe-backend`` as the explicit request of vLLM's fp8 oracle (None: auto).

    An unmapped value is an error where vLLM's raises, and so is a CUTLASS request where vLLM
    disabled CUTLASS. vLLM's DeepGEMM and AITER switches, which its oracle reads after
    ``--moe-backend``, are environment-layer requests read by the settings
    (:mod:`moe_policy.settings.vllm_switches` and ``settings/env.py``), in dry runs as here,
    so ``MOE_POLICY_BACKEND`` beats them and this flag beats both.
    """
    value = str(value or "auto")
    if value == "auto":
        return None
    origin = vllm_origin("--moe-backend")
    if value not in FP8_REQUESTABLE:
        raise PolicyError(
            f"moe_backend={value!r} is not supported for FP8 MoE (vLLM maps "
            f"{', '.join(FP8_REQUESTABLE)}){did_you_mean(value, FP8_REQUESTABLE)}",
            origin,
            key="backend",
        )
    backend = FP8_REQUESTABLE[value]
    if batched:
        backend = FP8_BATCHED.get(backend, backend)
    if backend.endswith("vllm_cutlass") and not allow_vllm_cutlass:
        raise PolicyError(
            "vLLM's CUTLASS fp8 MoE backend is disabled for this checkpoint format "
            "(vLLM offers it to compressed-tensors only)",
            origin,
            key="backend",
        )
    return Entry("backend", backend, origin)


#: ``--moe-backend`` values of vLLM's mxfp4 oracle (map_mxfp4_backend) whose bf16-activation
#: variant the profile describes; the others name variants it does not.
MXFP4_REQUESTABLE: Mapping[str, str] = {
    "flashinfer_trtllm": "flashinfer_trtllm",
    "flashinfer_cutlass": "flashinfer_cutlass",
    "triton": "triton",
    "marlin": "marlin",
    "humming": "humming",
    "aiter": "aiter",
    "aiter_triton_mxfp4_bf16": "aiter_triton",
    "xpu": "xpu",
    "cpu": "cpu",
    "emulation": "emulation",
}
MXFP4_NOT_DESCRIBED = ("b12x", "deep_gemm", "flashinfer_trtllm_afp8", "flashinfer_cutlass_afp8",
                       "flashinfer_moe_ep_cutedsl", "flashinfer_moe_ep_mega_deep_gemm",
                       "triton_unfused", "aiter_mxfp4_fp8", "aiter_triton_mxfp4_mxfp4",
                       "aiter_mxfp4_mxfp4")  # fmt: skip


def mxfp4_request_entry(value: str, *, batched: bool) -> Entry | None:
    """``--moe-backend`` as the mxfp4 oracle's request (None: auto); the batched format
    swaps Marlin for its batched class, as vLLM does."""
    return mapped_request_entry(
        value,
        MXFP4_REQUESTABLE,
        "MXFP4",
        not_described=MXFP4_NOT_DESCRIBED,
        not_described_what="variant with quantized activations",
        batched_names={"marlin": "batched_marlin"} if batched else None,
    )


def rocm_gfx() -> str:
    """The ROCm GPU family as vLLM's experts classes ask about it (most specific first)."""
    from vllm.platforms import rocm

    for name in ("gfx942", "gfx950", "gfx1250", "gfx9", "gfx1x"):
        if getattr(rocm, f"on_{name}")():
            return name
    return "other"


#: ``--moe-backend`` values of vLLM's nvfp4 oracle (map_nvfp4_backend) the profile describes.
NVFP4_REQUESTABLE: Mapping[str, str] = {
    "cutlass": "vllm_cutlass",
    "flashinfer_trtllm": "flashinfer_trtllm",
    "flashinfer_cutlass": "flashinfer_cutlass",
    "flashinfer_cutedsl": "flashinfer_cutedsl",
    "marlin": "marlin",
    "humming": "humming",
    "emulation": "emulation",
}
NVFP4_NOT_DESCRIBED = ("b12x", "flashinfer_b12x", "flashinfer_moe_ep_cutedsl")


def nvfp4_request_entry(value: str, *, batched: bool) -> Entry | None:
    """``--moe-backend`` as the nvfp4 oracle's request (None: auto); the batched format swaps
    CuTe DSL for its batched class, as vLLM does."""
    return mapped_request_entry(
        value,
        NVFP4_REQUESTABLE,
        "NvFP4",
        not_described=NVFP4_NOT_DESCRIBED,
        batched_names={"flashinfer_cutedsl": "flashinfer_cutedsl_batched"} if batched else None,
    )


#: ``--moe-backend`` values of vLLM's mxfp8 oracle (_BACKEND_NAME_MAP) -> catalog names.
#: vLLM maps an explicit request to exactly that backend; emulation is not requestable.
MXFP8_REQUESTABLE: Mapping[str, str] = {
    "flashinfer_trtllm": "flashinfer_trtllm",
    "deep_gemm": "deep_gemm",
    "marlin": "marlin",
    "xpu": "xpu",
    "aiter": "aiter",
    "triton": "triton",
    "humming": "humming",
}


def mapped_request_entry(
    value: str,
    requestable: Mapping[str, str],
    oracle: str,
    *,
    not_described: Sequence[str] = (),
    not_described_what: str = "backend",
    batched_names: Mapping[str, str] | None = None,
) -> Entry | None:
    """``--moe-backend`` as a quantized oracle's request, through that oracle's map of
    vLLM's names to catalog names (None: auto). A name vLLM knows but the profile does not
    describe (``not_described``) and an unknown name are errors naming the flag, with a
    did-you-mean; under the batched format ``batched_names`` swaps a catalog name for its
    batched class."""
    value = str(value or "auto")
    if value == "auto":
        return None
    origin = vllm_origin("--moe-backend")
    if value in not_described:
        raise PolicyError(
            f"moe_backend={value!r} names an {oracle} {not_described_what} the vLLM profile "
            f"does not describe (described: {', '.join(requestable)})",
            origin,
            key="backend",
        )
    if value not in requestable:
        raise PolicyError(
            f"moe_backend={value!r} is not supported for {oracle} MoE"
            f"{did_you_mean(value, (*requestable, *not_described))} "
            f"(expected one of {', '.join(requestable)})",
            origin,
            key="backend",
        )
    backend = requestable[value]
    return Entry("backend", (batched_names or {}).get(backend, backend), origin)


def mxfp8_request_entry(value: str) -> Entry | None:
    """``--moe-backend`` as the mxfp8 oracle's request (None: auto)."""
    return mapped_request_entry(value, MXFP8_REQUESTABLE, "MXFP8")


#: ``--moe-backend`` values of vLLM's int8 oracle (map_int8_backend) -> catalog names.
INT8_REQUESTABLE: Mapping[str, str] = {"triton": "triton", "humming": "humming"}


def int8_request_entry(value: str) -> Entry | None:
    """``--moe-backend`` as the int8 (w8a8) oracle's request (None: auto)."""
    return mapped_request_entry(value, INT8_REQUESTABLE, "Int8")


#: ``--moe-backend`` values of vLLM's w4a8 oracle -> catalog names.
W4A8_REQUESTABLE: Mapping[str, str] = {"cutlass": "vllm_cutlass", "humming": "humming"}


def w4a8_request_entry(value: str) -> Entry | None:
    """``--moe-backend`` as the W4A8 (int4 x fp8) oracle's request (None: auto)."""
    return mapped_request_entry(value, W4A8_REQUESTABLE, "W4A8")


def w4a8_int8_request_entry(value: str) -> Entry | None:
    """``--moe-backend`` as the W4A8 int8 oracle's request (None: auto; vLLM maps cpu only)."""
    return mapped_request_entry(value, {"cpu": "cpu"}, "W4A8 Int8")
