"""Adapter to FlashInfer's CUTLASS fused MoE (``flashinfer_cutlass``); no LoRA.

Math (computed by ``flashinfer.fused_moe.cutlass_fused_moe``)::

    out[t] = sum_k w[t,k] * W2[e] act(W13[e] x[t]),   e = topk_ids[t,k]

Layout: FlashInfer's gated ``fc1`` is ``w31 = [up; gate]`` ``[E, 2I, H]`` (up rows
first), the reverse of the common ``w13 = [gate; up]``; ``convert_weights`` swaps the
halves into a new tensor. Non-gated ``relu2`` keeps ``[E, I, H]``. ``fc2`` is ``w2``
``[E, H, I]`` unchanged.

Argument mapping: ``input`` = x [T, H]; ``token_selected_experts`` = topk_ids as int32;
``token_final_scales`` = topk_weights as fp32 (applied in FlashInfer's finalize);
``output_dtype`` = x.dtype; ``quant_scales`` = None (bf16/fp16, unquantized);
``activation_type`` = ``Swiglu`` for gated silu, ``Relu2`` for non-gated relu2;
``output=`` a preallocated [T, H] buffer (the call returns a list, element 0 = output).
With the router weight on the input (top-1 only) ``x`` is scaled first and the scales are 1.

Limits (what the catalog must declare): activations gated {silu}, non-gated {relu2};
no biases, no swigluoai/gelu (their FlashInfer semantics were not validated here);
no LoRA (FlashInfer's CUTLASS MoE has no LoRA hook: ``apply`` with a LoRA context raises);
bf16/fp16; CUDA with compute capability 8.9 or >= 9.0 (the archs FlashInfer builds this
module for); ``topk_ids`` must all be local experts (0..E-1); package ``flashinfer-python``.
``flashinfer`` is imported lazily, in ``is_available`` and ``apply`` only. GPU validation of
this adapter is pending: only the layout and the argument mapping are tested, on the CPU,
against a fake of the call boundary.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

import torch

from moe_policy.experts.base import (
    ExpertsConfig,
    FusedMoEExperts,
    check_common_layout,
    check_devices,
)
from moe_policy.experts.lora import MoELoRAContext

#: (gated, activation) -> FlashInfer ``ActivationType`` member name.
ACTIVATION_TYPES: dict[tuple[bool, str], str] = {
    (True, "silu"): "Swiglu",
    (False, "relu2"): "Relu2",
}
DTYPES = (torch.bfloat16, torch.float16)


def check_config(config: ExpertsConfig) -> tuple[bool, str | None]:
    """Whether this adapter can run a layer with this config; the reason when not."""
    if (config.gated, config.activation) not in ACTIVATION_TYPES:
        kind = "gated" if config.gated else "non-gated"
        return False, (
            f"flashinfer_cutlass adapter supports gated silu and non-gated relu2; "
            f"got {kind} {config.activation}"
        )
    if config.has_bias:
        return False, "flashinfer_cutlass adapter does not pass expert biases"
    if config.apply_router_weight_on_input and config.top_k != 1:
        return (
            False,
            "flashinfer_cutlass applies the router weight on the input only for top_k == 1",
        )
    return True, None


def swap_gate_up(w13: torch.Tensor, intermediate_size: int) -> torch.Tensor:
    """``[E, 2I, H]`` ``[gate; up]`` -> new tensor ``[up; gate]`` (FlashInfer's w31)."""
    i = intermediate_size
    return torch.cat([w13[:, i : 2 * i], w13[:, :i]], dim=1).contiguous()


def _activation_type(name: str) -> Any:
    """FlashInfer's ``ActivationType.<name>`` (the enum moved between modules across versions)."""
    fused_moe = importlib.import_module("flashinfer.fused_moe")
    enum = getattr(fused_moe, "ActivationType", None)
    for module in ("flashinfer.fused_moe.core", "flashinfer.tllm_enums", "flashinfer"):
        if enum is not None:
            break
        try:
            enum = getattr(importlib.import_module(module), "ActivationType", None)
        except ImportError:
            continue
    if enum is None:
        raise RuntimeError("installed flashinfer has no ActivationType enum")
    return getattr(enum, name)


class FlashInferCutlassExperts(FusedMoEExperts):
    """FlashInfer ``cutlass_fused_moe`` behind the experts interface (standard format, no LoRA)."""

    backend = "flashinfer_cutlass"
    activation_format = "standard"
    supports_lora = False
    gated_activations = frozenset(a for gated, a in ACTIVATION_TYPES if gated)
    non_gated_activations = frozenset(a for gated, a in ACTIVATION_TYPES if not gated)

    @classmethod
    def is_available(cls) -> tuple[bool, str | None]:
        """flashinfer with ``fused_moe.cutlass_fused_moe`` importable and a CUDA GPU of cc 8.9 / >= 9.0."""
        try:
            fused_moe = importlib.import_module("flashinfer.fused_moe")
        except ModuleNotFoundError as exc:
            if (exc.name or "").split(".")[0] == "flashinfer":
                return False, "package flashinfer (flashinfer-python) is not installed"
            return False, f"flashinfer.fused_moe failed to import: {exc}"
        except Exception as exc:  # a broken install raises anything at import
            return False, f"flashinfer.fused_moe failed to import: {exc}"
        if not hasattr(fused_moe, "cutlass_fused_moe"):
            return False, "installed flashinfer has no fused_moe.cutlass_fused_moe"
        if not torch.cuda.is_available():
            return False, "flashinfer_cutlass needs a CUDA device; none is available"
        cc = torch.cuda.get_device_capability()
        if cc < (8, 9):
            return (
                False,
                f"flashinfer_cutlass needs compute capability 8.9 or >= 9.0; got {cc[0]}.{cc[1]}",
            )
        return True, None

    @classmethod
    def supports(cls, ctx: Mapping[str, Any]) -> tuple[bool, str | None]:
        """Reads ``activation``, ``gated``, ``has_bias`` and ``lora_enabled`` when present."""
        if ctx.get("lora_enabled"):
            return False, "flashinfer_cutlass has no LoRA support"
        act, gated = ctx.get("activation"), ctx.get("gated")
        if act is not None and gated is not None and (bool(gated), act) not in ACTIVATION_TYPES:
            return (
                False,
                f"flashinfer_cutlass adapter: activation {act} (gated={gated}) unsupported",
            )
        if ctx.get("has_bias"):
            return False, "flashinfer_cutlass adapter does not pass expert biases"
        return True, None

    @staticmethod
    def convert_weights(
        config: ExpertsConfig,
        w13: torch.Tensor,
        w2: torch.Tensor,
        w13_bias: torch.Tensor | None = None,
        w2_bias: torch.Tensor | None = None,
    ) -> dict[str, Any]:
        """Common layout -> ``fc1`` ([up; gate] when gated), ``fc2``; new tensors, inputs untouched."""
        ok, reason = check_config(config)
        if not ok:
            raise ValueError(reason)
        if w13_bias is not None or w2_bias is not None:
            raise ValueError("flashinfer_cutlass adapter does not pass expert biases")
        check_common_layout(config, w13, w2)
        i = config.intermediate_size
        fc1 = (
            swap_gate_up(w13, i)
            if config.gated
            else w13.clone(memory_format=torch.contiguous_format)
        )
        return {
            "fc1": fc1,
            "fc2": w2.clone(memory_format=torch.contiguous_format),
            "activation_type": ACTIVATION_TYPES[(config.gated, config.activation)],
        }

    def apply(
        self,
        x: torch.Tensor,
        topk_weights: torch.Tensor,
        topk_ids: torch.Tensor,
        lora: MoELoRAContext | None = None,
    ) -> torch.Tensor:
        """``x`` [T, H] -> [T, H] through ``cutlass_fused_moe``; raises on a LoRA context."""
        if lora is not None:
            raise ValueError(
                "flashinfer_cutlass does not support LoRA (FlashInfer's CUTLASS fused MoE has no "
                "LoRA hook); use the triton or batched_triton backend for LoRA"
            )
        c, wt = self.config, self.weights
        if x.dim() != 2 or x.shape[1] != c.hidden_size or x.dtype not in DTYPES:
            raise ValueError(
                f"x must be [T, {c.hidden_size}] in {DTYPES}; got {tuple(x.shape)} {x.dtype}"
            )
        if topk_ids.shape != topk_weights.shape or topk_ids.shape != (x.shape[0], c.top_k):
            raise ValueError(
                f"topk_ids and topk_weights must be [T={x.shape[0]}, k={c.top_k}]; got "
                f"{tuple(topk_ids.shape)} and {tuple(topk_weights.shape)}"
            )
        if topk_ids.is_floating_point() or topk_ids.dtype == torch.bool:
            raise ValueError(f"topk_ids must be int; got {topk_ids.dtype}")
        if not topk_weights.is_floating_point():
            raise ValueError(f"topk_weights must be float; got {topk_weights.dtype}")
        if wt["fc1"].dtype != x.dtype:
            raise ValueError(f"weights are {wt['fc1'].dtype}, x is {x.dtype}")
        check_devices(x, topk_weights=topk_weights, topk_ids=topk_ids, w13=wt["fc1"], w2=wt["fc2"])
        if x.shape[0] == 0:  # CUTLASS rejects the null data pointer of an empty input
            return torch.empty_like(x)
        from flashinfer.fused_moe import cutlass_fused_moe  # lazy: heavy import

        scales = topk_weights.to(torch.float32)
        if c.apply_router_weight_on_input:
            x = (x.to(torch.float32) * scales).to(x.dtype)  # top_k == 1 (check_config)
            scales = torch.ones_like(scales)
        out = torch.empty_like(x)
        result = cutlass_fused_moe(
            input=x.contiguous(),
            token_selected_experts=topk_ids.to(torch.int32).contiguous(),
            token_final_scales=scales.contiguous(),
            fc1_expert_weights=wt["fc1"],
            fc2_expert_weights=wt["fc2"],
            output_dtype=x.dtype,
            quant_scales=None,
            output=out,
            activation_type=_activation_type(wt["activation_type"]),
        )
        if isinstance(result, (list, tuple)):
            return result[0]
        return result if result is not None else out
