"""The context vocabulary: every key rules, ``--set`` and the record address, with its type,
choices and meaning, and the coercion that validates a value for a key."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from moe_policy.core import values
from moe_policy.core.origin import Origin
from moe_policy.errors import PolicyError, did_you_mean

PLATFORMS = ("cuda", "rocm", "cpu", "xpu", "tpu", "oot")
DTYPES = ("bf16", "fp16", "fp32")
QUANTIZATIONS = (
    "none",
    "fp8",
    "mxfp8",
    "mxfp4",
    "nvfp4",
    "int8",
    "int4",
    "w4a8_fp8",
    "w4a8_int8",
)
#: How the experts' weights are scaled, how their activations are quantized, and the
#: checkpoint format the scheme was read from (moe_policy.core.quantization).
QUANT_WEIGHT_SCALES = ("tensor", "channel", "block", "group")
QUANT_ACTIVATIONS = ("none", "static_tensor", "dynamic_tensor", "dynamic_token", "dynamic_group")
QUANT_FORMATS = (
    "fp8",
    "fbgemm_fp8",
    "compressed-tensors",
    "modelopt",
    "mxfp4",
    "mlx",
    "awq",
    "gptq",
)
ACTIVATIONS = (
    "silu",
    "gelu",
    "gelu_tanh",
    "swigluoai",
    "swigluoai_uninterleave",
    "swiglustep",
    "situ",
    "relu2",
)
ROUTINGS = (
    "renormalize",
    "renormalize_naive",
    "softmax",
    "topk",
    "sigmoid",
    "sigmoid_renorm",
    "deepseek_v3",
    "deepseek_v4",
    "llama4",
    "minimax2",
    "custom",
)
ALL2ALL_KINDS = (
    "none",
    "naive",
    "allgather_reducescatter",
    "deepep_high_throughput",
    "deepep_low_latency",
    "deepep_v2",
    "flashinfer_all2allv",
    "flashinfer_nvlink_one_sided",
    "flashinfer_nvlink_two_sided",
    "mori_high_throughput",
    "mori_low_latency",
    "nixl_ep",
    "moonep",
    "passthrough",
    "pplx",
)
#: All2all kinds whose prepare/finalize delivers the batched [E, max_tokens, H] format.
BATCHED_ALL2ALL = frozenset({"deepep_low_latency", "nixl_ep"})
FORMATS = ("standard", "batched")
#: Engines a decision can target; each has a profile (catalog, built-in policy, derivations).
ENGINES = ("moe_policy", "vllm")
CPU_ARCHS = ("x86", "arm", "power", "other")
#: The ROCm GPU families vLLM's experts classes tell apart, most specific first.
ROCM_GFX = ("gfx942", "gfx950", "gfx1250", "gfx9", "gfx1x", "other")
LAYER_KINDS = ("moe", "draft", "mtp", "shared")


@dataclass(frozen=True)
class KeySpec:
    """Type and meaning of one context key."""

    type: str  # str | int | bool | capability | list
    description: str
    choices: tuple[str, ...] | None = None
    #: Legitimately different between ranks of one deployment (excluded from fingerprints).
    rank_local: bool = False
    #: Computed from other keys; cannot be set.
    derived: bool = False
    #: The smallest value an int key takes (sizes are positive, counts and indices >= 0).
    minimum: int | None = None


CONTEXT_KEYS: Mapping[str, KeySpec] = MappingProxyType(
    {
        "engine": KeySpec("str", "engine the decision is for (its backends and rules)", ENGINES),
        "engine.version": KeySpec("str", "engine release the profile describes (e.g. 0.33)"),
        "platform": KeySpec("str", "accelerator platform", PLATFORMS),
        "device.capability": KeySpec(
            "capability", "CUDA compute capability, e.g. 9.0 (None off CUDA)"
        ),
        "device.name": KeySpec("str", "device name as the driver reports it"),
        "packages": KeySpec(
            "list", "importable packages on the target (flashinfer, triton, aiter, ...)"
        ),
        "model.architecture": KeySpec("str", "Hugging Face architecture class"),
        "model.dtype": KeySpec("str", "weight/activation dtype", DTYPES),
        "model.quantization": KeySpec("str", "experts' weight quantization scheme", QUANTIZATIONS),
        "model.quant.format": KeySpec(
            "str", "checkpoint format of the quantization", QUANT_FORMATS
        ),
        "model.quant.weight_scale": KeySpec(
            "str", "weight scale granularity (block: model.quant.block)", QUANT_WEIGHT_SCALES
        ),
        "model.quant.block": KeySpec("str", "weight scale block, NxK (e.g. 128x128)"),
        "model.quant.group_size": KeySpec("int", "values per weight scale group (mxfp4: 32)"),
        "model.quant.activation": KeySpec(
            "str", "how activations are quantized (none: weight-only)", QUANT_ACTIVATIONS
        ),
        "model.quant.symmetric": KeySpec("bool", "integer weights without zero points"),
        "model.activation": KeySpec("str", "expert activation", ACTIVATIONS),
        "model.gated": KeySpec("bool", "act(gate) * up (true) or act(up) (false, e.g. relu2)"),
        "model.num_experts": KeySpec("int", "routed experts in the model", minimum=1),
        "model.local_experts": KeySpec("int", "routed experts on one rank", derived=True),
        "model.top_k": KeySpec("int", "experts per token", minimum=1),
        "model.hidden_size": KeySpec("int", "hidden size H", minimum=1),
        "model.intermediate_size": KeySpec(
            "int", "expert intermediate size I (whole expert)", minimum=1
        ),
        "model.intermediate_size_per_partition": KeySpec(
            "int", "I on one rank (I / tp without expert parallelism)", derived=True
        ),
        "model.shared_experts": KeySpec("int", "shared experts beside the routed ones", minimum=0),
        "model.routing": KeySpec("str", "routing method", ROUTINGS),
        "model.router_weight_on_input": KeySpec(
            "bool", "router weight applied to the input (Llama-4)"
        ),
        "model.has_bias": KeySpec("bool", "expert projections carry biases (gpt-oss)"),
        "parallel.tp": KeySpec("int", "tensor-parallel size", minimum=1),
        "parallel.dp": KeySpec("int", "data-parallel size", minimum=1),
        "parallel.ep": KeySpec("bool", "expert parallelism enabled"),
        "parallel.ep_size": KeySpec("int", "expert-parallel group size", derived=True),
        "parallel.all2all": KeySpec("str", "all2all (prepare/finalize) kind", ALL2ALL_KINDS),
        "parallel.activation_format": KeySpec(
            "str", "format the experts receive (from parallel.all2all)", FORMATS, derived=True
        ),
        "parallel.all2all_active": KeySpec(
            "str",
            "all2all kind whose kernels actually run (none when the engine skips them)",
            ALL2ALL_KINDS,
            derived=True,
        ),
        "parallel.sp": KeySpec("bool", "sequence parallelism in the MoE layers"),
        "parallel.eplb": KeySpec("bool", "expert-parallel load balancing"),
        "lora.enabled": KeySpec("bool", "LoRA adapters are served"),
        "lora.max_rank": KeySpec("int", "largest adapter rank", minimum=1),
        "lora.max_loras": KeySpec("int", "adapter slots resident per batch", minimum=1),
        "lora.fully_sharded": KeySpec("bool", "LoRA weights sharded across tensor-parallel ranks"),
        "layer.kind": KeySpec("str", "layer kind (draft/mtp for speculative layers)", LAYER_KINDS),
        "layer.index": KeySpec("int", "layer index in the model", rank_local=True, minimum=0),
        "batch_invariant": KeySpec(
            "bool", "batch-invariant kernels required (VLLM_BATCH_INVARIANT)"
        ),
        "rocm.aiter": KeySpec("bool", "AITER MoE switched on (VLLM_ROCM_USE_AITER semantics)"),
        "rocm.gfx": KeySpec(
            "str", "ROCm GPU family vLLM's kernels ask for (gfx942, gfx950, ...)", ROCM_GFX
        ),
        "cpu.arch": KeySpec("str", "CPU architecture of a CPU target", CPU_ARCHS),
        "cpu.amx": KeySpec("bool", "the CPU has AMX tiles (x86 bf16 experts)"),
        "cpu.amx_fp8": KeySpec("bool", "the CPU has AMX-FP8 tiles (x86 fp8 W8A8 experts)"),
    }
)


def format_cause(values: Mapping[str, Any]) -> str:
    """Why the context has its activation format, for a reason's detail: the all2all kernels
    that run, or, for the batched format without batched all2all kernels, the request."""
    active = values.get("parallel.all2all_active", values.get("parallel.all2all"))
    if values.get("parallel.activation_format") == "batched" and active not in BATCHED_ALL2ALL:
        return "a batched_triton request without all2all kernels"
    return f"parallel.all2all_active={active}"


def parse_capability(value: Any) -> tuple[int, int]:
    """``(major, minor)`` of a capability, for ordering: a context value or operand already
    checked by ``moe_policy.core.values.parse_capability`` (``MAJOR.MINOR`` exactly), a
    catalog bound, or a probe lint builds around one (``"9.10"``, ``"100.0"``).

    >>> parse_capability("10.3")
    (10, 3)
    """
    pair = isinstance(value, (tuple, list)) and len(value) == 2
    if pair and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value):
        return int(value[0]), int(value[1])
    text = repr(value) if isinstance(value, float) else value
    match = _CAPABILITY_ORDER.fullmatch(text) if isinstance(text, str) else None
    if match is None:
        raise ValueError(f"not a compute capability: {value!r} (expected MAJOR.MINOR, e.g. 9.0)")
    return int(match[1]), int(match[2])


_CAPABILITY_ORDER = re.compile(r"([0-9]{1,3})\.([0-9]{1,3})", re.ASCII)


def coerce_value(key: str, value: Any, origin: Origin | str) -> Any:
    """Validate and normalise a typed context value (``moe_policy.core.values``: a boolean
    is a boolean, an integer an integer within the key's minimum, a capability
    ``MAJOR.MINOR``, a string a string); PolicyError names the key and origin."""
    spec = CONTEXT_KEYS.get(key)
    if spec is None:
        raise PolicyError(
            f"unknown context key {key!r}{did_you_mean(key, CONTEXT_KEYS)}",
            origin,
            key=key,
            code="unknown-context-key",
        )
    if value is None:
        return None
    try:
        if spec.type == "int":
            result: Any = values.parse_int(value)
            if spec.minimum is not None and result < spec.minimum:
                raise PolicyError(
                    f"{key} must be at least {spec.minimum}, got {result}", origin, key=key
                )
        elif spec.type == "bool":
            result = values.parse_bool(value)
        elif spec.type == "capability":
            result = values.parse_capability(value)
        elif spec.type == "list":
            if not isinstance(value, (list, tuple, set, frozenset)) or not all(
                isinstance(v, str) for v in value
            ):
                raise ValueError(f"expected a list of names, got {values.shown(value)}")
            result = tuple(sorted({v.strip() for v in value if v.strip()}))
        else:
            if not isinstance(value, str):
                raise ValueError(f"expected a string, got {values.shown(value)}")
            result = value.strip()
            if spec.type == "str" and spec.choices is not None:
                result = result.lower()
    except ValueError as exc:
        if isinstance(exc, PolicyError):
            raise
        raise PolicyError(f"{key}: {exc}", origin, key=key) from None
    if spec.choices is not None and result not in spec.choices:
        raise PolicyError(
            f"{key}: {result!r} is not one of {', '.join(spec.choices)}"
            f"{did_you_mean(result, spec.choices)}",
            origin,
            key=key,
        )
    return result
