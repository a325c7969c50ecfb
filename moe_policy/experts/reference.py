"""Torch reference fused MoE: the oracle of every numeric test (any device, fp32 math).

Computes, per token ``t`` and routed slot ``k`` (``e = topk_ids[t,k]``, ``w = topk_weights[t,k]``)::

    h      = W13[e] x_in + b13[e] + dLoRA13          # x_in = w * x when the weight is on the input
    a      = act(h)                                  # gated: act(gate) * up; non-gated: act(h)
    y      = W2[e] a + b2[e] + dLoRA2
    out[t] = sum_k w * y                             # weight on the output (default)

``topk_ids`` entries < 0 (experts not on this rank) contribute nothing. Simple
loops over experts and adapter slots: clarity over speed.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from moe_policy.experts.base import (
    ExpertsConfig,
    FusedMoEExperts,
    check_bias_shapes,
    check_common_layout,
    check_devices,
)
from moe_policy.experts.lora import MoELoRAContext, check_lora


def apply_activation(
    h: torch.Tensor, activation: str, gated: bool, *, alpha: float = 1.702, limit: float = 7.0
) -> torch.Tensor:
    """``[..., N1]`` -> ``[..., I]`` (gated) or ``[..., I]`` (non-gated), in h's dtype.

    Gated ``h`` is ``[gate; up]`` along the last dimension, except ``swigluoai`` (gate at even,
    up at odd channels). The clamped ones: ``swigluoai`` ``(clamp(up, +-limit) + 1) * g *
    sigmoid(alpha * g)`` with ``g = min(gate, limit)``; ``swiglustep`` ``min(silu(gate),
    limit) * clamp(up, +-limit)`` (the clamp after the SiLU; ``alpha`` unused)."""
    if not gated:
        if activation == "relu2":
            return torch.relu(h).square()
        if activation == "silu":
            return F.silu(h)
        if activation == "gelu":
            return F.gelu(h)
        if activation == "gelu_tanh":
            return F.gelu(h, approximate="tanh")
        raise ValueError(f"unknown non-gated activation {activation!r}")
    if activation == "swigluoai":
        gate, up = h[..., 0::2], h[..., 1::2]
        gate = gate.clamp(max=limit)
        up = up.clamp(min=-limit, max=limit)
        return (up + 1.0) * gate * torch.sigmoid(alpha * gate)
    n = h.shape[-1] // 2
    gate, up = h[..., :n], h[..., n:]
    if activation == "silu":
        return F.silu(gate) * up
    if activation == "gelu":
        return F.gelu(gate) * up
    if activation == "gelu_tanh":
        return F.gelu(gate, approximate="tanh") * up
    if activation == "swiglustep":
        return F.silu(gate).clamp(max=limit) * up.clamp(min=-limit, max=limit)
    raise ValueError(f"unknown gated activation {activation!r}")


def _w13_lora_delta(
    xs: torch.Tensor, lora: MoELoRAContext, slot: int, expert: int, n1: int, interleaved: bool
) -> torch.Tensor:
    """Delta [rows, N1] of all w13 slices for one (slot, expert), in ``xs.dtype``."""
    ad = lora.adapters
    slices = []
    for s in range(ad.num_slices):
        a = ad.w13_a[s, slot, expert].to(xs.dtype)  # [R, H]
        b = ad.w13_b[s, slot, expert].to(xs.dtype)  # [I, R]
        slices.append((xs @ a.t()) @ b.t())  # [rows, I]
    if len(slices) == 1:
        return slices[0]
    if interleaved:
        out = xs.new_zeros(xs.shape[0], n1)
        out[:, 0::2] = slices[0]
        out[:, 1::2] = slices[1]
        return out
    return torch.cat(slices, dim=1)


def check_inputs(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    *,
    gated: bool,
    w13_bias: torch.Tensor | None = None,
    w2_bias: torch.Tensor | None = None,
    lora: MoELoRAContext | None = None,
) -> None:
    """ValueError naming what arrived unless the tensors are one layer's standard-format
    inputs: float ``x`` [T, H], ``w13`` [E, N1, H] (N1 = 2I gated, I otherwise), ``w2``
    [E, H, I], float ``topk_weights`` and int ``topk_ids`` [T, k], biases [E, N1] and [E, H],
    a LoRA context of the layer, all on x's device (any float dtypes)."""

    def got() -> str:  # built only for an error: this check runs on every grouped-GEMM call
        return (
            f"x {tuple(x.shape)} {x.dtype}, w13 {tuple(w13.shape)} {w13.dtype}, "
            f"w2 {tuple(w2.shape)} {w2.dtype}, topk_weights {tuple(topk_weights.shape)} "
            f"{topk_weights.dtype}, topk_ids {tuple(topk_ids.shape)} {topk_ids.dtype}"
        )

    if x.dim() != 2 or w13.dim() != 3 or w2.dim() != 3 or topk_ids.dim() != 2:
        raise ValueError(
            f"expected x [T, H], w13 [E, N1, H], w2 [E, H, I], topk_ids [T, k]; got {got()}"
        )
    (t, h), (e, n1, _), i = x.shape, w13.shape, w2.shape[2]
    if tuple(w13.shape) != (e, 2 * i if gated else i, h) or tuple(w2.shape[:2]) != (e, h):
        want = f"w13 [{e}, {2 * i if gated else i}, {h}], w2 [{e}, {h}, I]"
        raise ValueError(f"shape mismatch (gated={gated}): expected {want}; got {got()}")
    if topk_weights.shape != topk_ids.shape or topk_ids.shape[0] != t:
        raise ValueError(f"topk_ids and topk_weights must both be [T={t}, k]; got {got()}")
    if not all(a.is_floating_point() for a in (x, w13, w2, topk_weights)) or (
        topk_ids.is_floating_point() or topk_ids.dtype == torch.bool
    ):
        raise ValueError(f"x, w13, w2, topk_weights must be float and topk_ids int; got {got()}")
    check_bias_shapes(e, n1, h, w13_bias, w2_bias)
    check_devices(x, w13=w13, w2=w2, topk_weights=topk_weights, topk_ids=topk_ids,
                  w13_bias=w13_bias, w2_bias=w2_bias)  # fmt: skip
    if lora is not None:
        check_lora(lora, x, e, i, gated)


def fused_moe_reference(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    *,
    activation: str = "silu",
    gated: bool = True,
    w13_bias: torch.Tensor | None = None,
    w2_bias: torch.Tensor | None = None,
    apply_router_weight_on_input: bool = False,
    lora: MoELoRAContext | None = None,
    swiglu_alpha: float = 1.702,
    swiglu_limit: float = 7.0,
) -> torch.Tensor:
    """Reference MoE forward: ``x`` [T, H] -> [T, H] in ``x.dtype`` (fp32 accumulation)."""
    check_inputs(x, w13, w2, topk_weights, topk_ids, gated=gated, w13_bias=w13_bias,
                 w2_bias=w2_bias, lora=lora)  # fmt: skip
    t_count, hidden = x.shape
    num_experts, n1, _ = w13.shape
    interleaved = activation == "swigluoai"
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    xf = x.to(acc)
    out = torch.zeros(t_count, hidden, dtype=acc, device=x.device)
    ids = topk_ids.long()
    weights = topk_weights.to(acc)
    mapping = lora.token_lora_mapping.long() if lora is not None else None
    enabled = lora.adapters.enabled if lora is not None else None

    for e in range(num_experts):
        tok, slot_k = torch.nonzero(ids == e, as_tuple=True)
        if tok.numel() == 0:
            continue
        w = weights[tok, slot_k].unsqueeze(1)
        xs = xf[tok] * w if apply_router_weight_on_input else xf[tok]
        h = xs @ w13[e].to(acc).t()
        if w13_bias is not None:
            h = h + w13_bias[e].to(acc)
        groups: list[tuple[int, torch.Tensor]] = []
        if lora is not None and mapping is not None and enabled is not None:
            slots = mapping[tok]
            for slot in torch.unique(slots).tolist():
                if not 0 <= slot < enabled.numel() or int(enabled[slot]) == 0:
                    continue
                rows = torch.nonzero(slots == slot, as_tuple=True)[0]
                groups.append((slot, rows))
                h[rows] += _w13_lora_delta(xs[rows], lora, slot, e, n1, interleaved)
        a = apply_activation(h, activation, gated, alpha=swiglu_alpha, limit=swiglu_limit)
        y = a @ w2[e].to(acc).t()
        if w2_bias is not None:
            y = y + w2_bias[e].to(acc)
        for slot, rows in groups:
            ad = lora.adapters  # type: ignore[union-attr]
            v = a[rows] @ ad.w2_a[slot, e].to(acc).t()
            y[rows] += v @ ad.w2_b[slot, e].to(acc).t()
        if not apply_router_weight_on_input:
            y = y * w
        out.index_add_(0, tok, y)
    return out.to(x.dtype)


class ReferenceExperts(FusedMoEExperts):
    """The reference as a backend: correct everywhere, slow; LoRA-capable."""

    backend = "reference"
    activation_format = "standard"
    supports_lora = True

    @staticmethod
    def convert_weights(
        config: ExpertsConfig,
        w13: torch.Tensor,
        w2: torch.Tensor,
        w13_bias: torch.Tensor | None = None,
        w2_bias: torch.Tensor | None = None,
    ) -> dict[str, Any]:
        """The common layout as given (no copy), once checked against ``config`` (biases too)."""
        check_common_layout(config, w13, w2, w13_bias, w2_bias)
        return {"w13": w13, "w2": w2, "w13_bias": w13_bias, "w2_bias": w2_bias}

    def apply(
        self,
        x: torch.Tensor,
        topk_weights: torch.Tensor,
        topk_ids: torch.Tensor,
        lora: MoELoRAContext | None = None,
    ) -> torch.Tensor:
        c, wt = self.config, self.weights
        return fused_moe_reference(
            x,
            wt["w13"],
            wt["w2"],
            topk_weights,
            topk_ids,
            activation=c.activation,
            gated=c.gated,
            w13_bias=wt["w13_bias"],
            w2_bias=wt["w2_bias"],
            apply_router_weight_on_input=c.apply_router_weight_on_input,
            lora=lora,
            swiglu_alpha=c.swiglu_alpha,
            swiglu_limit=c.swiglu_limit,
        )
