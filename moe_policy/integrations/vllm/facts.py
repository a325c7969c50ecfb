"""The selection context from vLLM's own objects: its ``FusedMoEConfig`` (with the parallel
config inside), its platform and its availability probes, each fact with an origin
``vllm:<where it was read>``. Imports vLLM; only the vLLM integration uses this module.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from moe_policy.core.model import ModelFacts
from moe_policy.core.origin import Origin
from moe_policy.core.platform import PlatformFacts
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


def model_facts(moe_config: Any, architecture: str | None = None) -> ModelFacts:
    """The ``model.*`` facts of one MoE layer, read from its ``FusedMoEConfig``."""
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
        "model.quantization": ("none", o("unquantized oracle")),
        "model.routing": (ROUTINGS.get(routing_name, "custom"), o("moe_config.routing_method")),
        "model.has_bias": (bool(moe_config.has_bias), o("moe_config.has_bias")),
    }
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
    """The parallel layout and LoRA settings, undone from vLLM's flattened sizes."""
    par = moe_config.moe_parallel_config
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
    packages = ["torch", "vllm"] + (["flashinfer"] if _flashinfer_moe_available() else [])
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
    if name == "cpu":
        entries += _cpu_entries(platform)
    return facts, entries


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
