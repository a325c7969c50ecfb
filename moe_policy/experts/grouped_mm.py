"""Fused MoE on torch's grouped GEMM (``torch_grouped_mm``), with LoRA through grouped GEMMs.

Math (``e = topk_ids[t,k]``, ``w = topk_weights[t,k]``, slot ``l = token_lora_mapping[t]``)::

    out[t] = sum_k w * (W2[e] act(W13[e] x[t] + b13[e] + dLoRA13) + b2[e] + dLoRA2)

Pipeline (all on the device, no host synchronisation):
  1. sort the flat (token, slot) pairs by expert (stable argsort), per-expert counts by
     ``scatter_add``, ``offs = cumsum(counts)`` int32; pairs with ids outside ``0..E-1``
     (experts on another rank) sort last, past ``offs[-1]``, and are masked out;
  2. gather ``x`` rows in that order; GEMM1 ``grouped_mm(xs, W13^T, offs)`` -> ``[T*k, N1]``;
  3. + bias, + LoRA w13 delta, activation in fp32 (``reference.apply_activation``);
  4. GEMM2 ``grouped_mm(a, W2^T, offs)`` -> ``[T*k, H]``, + bias, + LoRA w2 delta;
  5. router weight, un-permute, sum over k in fp32 (deterministic, no atomics).

LoRA: pairs with an enabled slot are sorted a second time by the virtual expert
``l * E + e``; the adapter stacks are viewed (no copy) as ``L * E`` groups, so each delta
is two grouped GEMMs (shrink ``[P, R]``, expand): ``S`` slices for w13 and one for w2.
The w13 delta goes in before the activation and is not router-weighted; the w2 delta is
router-weighted with the base output (``experts/lora.py``).

Layout: the common one, unchanged (``w13 [E, N1, H]``, ``w2 [E, H, I]``), passed to
``grouped_mm`` as transposed views ``[E, H, N1]`` / ``[E, I, H]``.

Exactly what runs (the catalog entry must say the same):
  * platform CUDA, compute capability >= 9.0, torch with ``torch.nn.functional.grouped_mm``
    or ``torch._grouped_mm`` that passes a bf16 probe on the device (``is_available``);
  * dtype bf16 only (activations, weights, biases and adapters);
  * gated activations silu, gelu, gelu_tanh, swigluoai (interleaved, clamped, with biases),
    swiglustep (clamped at ``swiglu_limit``);
    non-gated silu, gelu, gelu_tanh, relu2; biases; router weight on input or output;
  * LoRA yes (any number of slots, -1 rows and disabled slots give exactly no delta),
    with the max rank a multiple of 8 (16-byte row alignment of grouped_mm operands);
  * hidden and intermediate sizes multiples of 8 (same alignment rule);
  * packages: torch only.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import Any

import torch

from moe_policy.experts.base import (
    ExpertsConfig,
    FusedMoEExperts,
)
from moe_policy.experts.lora import MoELoRAContext
from moe_policy.experts.reference import apply_activation, check_inputs

#: Row alignment (elements) of every grouped_mm operand's last dimension on CUDA (16 B bf16).
ALIGN = 8
MIN_CAPABILITY = (9, 0)
_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
_BF16_NAMES = frozenset({"bfloat16", "bf16", "torch.bfloat16"})


def grouped_mm_fn() -> Callable[..., torch.Tensor] | None:
    """The installed torch's grouped GEMM: ``F.grouped_mm`` or ``torch._grouped_mm``; None if absent."""
    fn = getattr(torch.nn.functional, "grouped_mm", None)
    if fn is None:
        fn = getattr(torch, "_grouped_mm", None)
    return fn


def _sort_by_group(key: torch.Tensor, num_groups: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Stable order of ``key`` (values in 0..num_groups, num_groups = dropped) and int32 offsets."""
    order = torch.argsort(key, stable=True)
    counts = torch.zeros(num_groups + 1, dtype=torch.int64, device=key.device)
    counts.scatter_add_(0, key, torch.ones_like(key))
    offs = torch.cumsum(counts[:num_groups], 0).to(torch.int32)
    return order, offs


def grouped_mm_fused_moe(
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
    """The grouped-GEMM pipeline on any device/dtype the installed grouped_mm accepts."""
    gmm = grouped_mm_fn()
    if gmm is None:
        raise RuntimeError(f"torch {torch.__version__} has no grouped_mm")
    check_inputs(x, w13, w2, topk_weights, topk_ids, gated=gated, w13_bias=w13_bias,
                 w2_bias=w2_bias, lora=lora)  # fmt: skip
    ad = lora.adapters if lora is not None else None
    mats = [w13, w2] + ([ad.w13_a, ad.w13_b, ad.w2_a, ad.w2_b] if ad is not None else [])
    if x.dtype not in _DTYPES or any(m.dtype != x.dtype for m in mats):
        raise ValueError(
            f"x, w13, w2 and the LoRA weights must share one of {_DTYPES} (grouped_mm "
            f"operands); got x {x.dtype}, weights {[m.dtype for m in mats]}"
        )
    if ad is not None and (ad.num_slots == 0 or ad.max_rank == 0):
        lora = None  # no slot or rank 0: every delta is zero (and [L*E, 0, H] views are ambiguous)
    t_count, hidden = x.shape
    e_count = w13.shape[0]
    inter = w2.shape[2]
    top_k = topk_ids.shape[1]
    dtype = x.dtype

    # 1. Sort (token, slot) pairs by expert; invalid ids go last (key E).
    ids = topk_ids.reshape(-1).long()
    valid = (ids >= 0) & (ids < e_count)
    key = torch.where(valid, ids, torch.full_like(ids, e_count))
    order, offs = _sort_by_group(key, e_count)
    tok = order // top_k
    e_sorted = key[order].clamp(max=e_count - 1)
    valid_sorted = valid[order].unsqueeze(1)
    w_sorted = topk_weights.reshape(-1)[order].to(torch.float32).unsqueeze(1)

    # 2. Gather rows and GEMM1.
    xs = x[tok]
    if apply_router_weight_on_input:
        xs = (xs.to(torch.float32) * w_sorted).to(dtype)
    h = gmm(xs, w13.transpose(1, 2), offs=offs).to(torch.float32)

    # 3. Bias, LoRA w13 delta, activation (fp32), masked so rows past offs[-1] stay zero.
    if w13_bias is not None:
        h += w13_bias[e_sorted].to(torch.float32)
    lora_groups = None
    if lora is not None:
        lora_groups = _lora_groups(lora, tok, e_sorted, valid_sorted.squeeze(1), e_count)
        _add_w13_lora(h, xs, lora, lora_groups, gmm, inter, interleaved=activation == "swigluoai")
    a = apply_activation(h, activation, gated, alpha=swiglu_alpha, limit=swiglu_limit)
    a = torch.where(valid_sorted, a, 0.0).to(dtype)

    # 4. GEMM2, bias, LoRA w2 delta.
    y = gmm(a, w2.transpose(1, 2), offs=offs).to(torch.float32)
    if w2_bias is not None:
        y += w2_bias[e_sorted].to(torch.float32)
    if lora is not None and lora_groups is not None:
        _add_w2_lora(y, a, lora, lora_groups, gmm)

    # 5. Router weight, un-permute, sum over k.
    if not apply_router_weight_on_input:
        y = y * w_sorted
    y = torch.where(valid_sorted, y, 0.0)
    unsorted = torch.empty_like(y)
    unsorted[order] = y
    return unsorted.view(t_count, top_k, hidden).sum(1).to(dtype)


def _lora_groups(
    lora: MoELoRAContext,
    tok: torch.Tensor,
    e_sorted: torch.Tensor,
    valid_sorted: torch.Tensor,
    e_count: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Second sort of the expert-sorted rows by virtual expert ``slot * E + e``.

    Returns (order2 into the expert-sorted rows, int32 offsets over L*E groups, [P, 1]
    mask of rows that get a delta: valid expert, slot >= 0, slot enabled).
    """
    ad = lora.adapters
    num_slots = ad.num_slots
    slot = lora.token_lora_mapping.reshape(-1).long()[tok]
    in_range = (slot >= 0) & (slot < num_slots)
    enabled = ad.enabled.to(device=slot.device).long()[slot.clamp(0, max(num_slots - 1, 0))]
    has = valid_sorted & in_range & (enabled != 0)
    key2 = torch.where(has, slot * e_count + e_sorted, torch.full_like(slot, num_slots * e_count))
    order2, offs2 = _sort_by_group(key2, num_slots * e_count)
    return order2, offs2, has[order2].unsqueeze(1)


def _add_w13_lora(
    h: torch.Tensor,
    xs: torch.Tensor,
    lora: MoELoRAContext,
    groups: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    gmm: Callable[..., torch.Tensor],
    inter: int,
    *,
    interleaved: bool,
) -> None:
    """h[rows] += B13_s (A13_s x) per slice; slice s lands on its columns of h (in place)."""
    order2, offs2, has2 = groups
    ad = lora.adapters
    x2 = xs[order2]
    for s in range(ad.num_slices):
        a_mat = ad.w13_a[s].reshape(-1, ad.max_rank, xs.shape[1])  # [L*E, R, H] view
        b_mat = ad.w13_b[s].reshape(-1, inter, ad.max_rank)  # [L*E, I, R] view
        u = gmm(x2, a_mat.transpose(1, 2), offs=offs2)
        d = gmm(u, b_mat.transpose(1, 2), offs=offs2).to(torch.float32)
        d = torch.where(has2, d, 0.0)
        if ad.num_slices == 1:
            cols = h
        elif interleaved:
            cols = h[:, s::2]
        else:
            cols = h[:, s * inter : (s + 1) * inter]
        cols.index_add_(0, order2, d)


def _add_w2_lora(
    y: torch.Tensor,
    a: torch.Tensor,
    lora: MoELoRAContext,
    groups: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    gmm: Callable[..., torch.Tensor],
) -> None:
    """y[rows] += B2 (A2 a) (in place, before the router weight)."""
    order2, offs2, has2 = groups
    ad = lora.adapters
    a_mat = ad.w2_a.reshape(-1, ad.max_rank, a.shape[1])  # [L*E, R, I] view
    b_mat = ad.w2_b.reshape(-1, y.shape[1], ad.max_rank)  # [L*E, H, R] view
    v = gmm(a[order2], a_mat.transpose(1, 2), offs=offs2)
    d = gmm(v, b_mat.transpose(1, 2), offs=offs2).to(torch.float32)
    y.index_add_(0, order2, torch.where(has2, d, 0.0))


@functools.lru_cache(maxsize=1)
def _availability() -> tuple[bool, str | None]:
    gmm = grouped_mm_fn()
    if gmm is None:
        return False, (
            f"torch {torch.__version__} has neither torch.nn.functional.grouped_mm "
            "nor torch._grouped_mm"
        )
    if not torch.cuda.is_available():
        return False, "torch_grouped_mm needs a CUDA device; none is available"
    cc = torch.cuda.get_device_capability()
    if cc < MIN_CAPABILITY:
        return (
            False,
            f"torch_grouped_mm needs compute capability >= 9.0; device has {cc[0]}.{cc[1]}",
        )
    try:  # a tiny bf16 probe: the torch build may lack the grouped-GEMM kernels for this GPU
        a = torch.ones(16, 16, dtype=torch.bfloat16, device="cuda")
        b = torch.ones(2, 16, 16, dtype=torch.bfloat16, device="cuda")
        offs = torch.tensor([8, 16], dtype=torch.int32, device="cuda")
        gmm(a, b.transpose(1, 2), offs=offs)
        torch.cuda.synchronize()
    except RuntimeError as exc:
        return False, f"torch {torch.__version__} grouped_mm failed a bf16 probe: {exc}"
    return True, None


def check_config(
    config: ExpertsConfig, dtype: Any = "bfloat16", lora_max_rank: int | None = None
) -> tuple[bool, str | None]:
    """Static feasibility of a layer: dtype bf16, sizes and LoRA rank multiples of 8."""
    if str(dtype).replace("torch.", "") not in _BF16_NAMES:
        return False, f"torch_grouped_mm runs bf16 only; got dtype {dtype}"
    for name in ("hidden_size", "intermediate_size"):
        if getattr(config, name) % ALIGN:
            return (
                False,
                f"torch_grouped_mm needs {name} % {ALIGN} == 0; got {getattr(config, name)}",
            )
    if lora_max_rank is not None and lora_max_rank % ALIGN:
        return False, f"torch_grouped_mm LoRA needs max rank % {ALIGN} == 0; got {lora_max_rank}"
    return True, None


class TorchGroupedMMExperts(FusedMoEExperts):
    """Standard-format fused MoE on ``torch`` grouped GEMMs (CUDA SM90+, bf16), LoRA-capable."""

    backend = "torch_grouped_mm"
    activation_format = "standard"
    supports_lora = True

    @classmethod
    def is_available(cls) -> tuple[bool, str | None]:
        """CUDA, capability >= 9.0, a torch grouped_mm that passes a bf16 probe (cached)."""
        return _availability()

    @classmethod
    def supports(cls, ctx: Mapping[str, Any]) -> tuple[bool, str | None]:
        """Reads ``dtype``, ``hidden_size``, ``intermediate_size``, ``lora_max_rank`` when present."""
        dtype = ctx.get("dtype")
        if dtype is not None and str(dtype).replace("torch.", "") not in _BF16_NAMES:
            return False, f"torch_grouped_mm runs bf16 only; got dtype {dtype}"
        for name in ("hidden_size", "intermediate_size"):
            value = ctx.get(name)
            if value is not None and int(value) % ALIGN:
                return False, f"torch_grouped_mm needs {name} % {ALIGN} == 0; got {value}"
        rank = ctx.get("lora_max_rank")
        if ctx.get("lora_enabled") and rank is not None and int(rank) % ALIGN:
            return False, f"torch_grouped_mm LoRA needs max rank % {ALIGN} == 0; got {rank}"
        return True, None

    def apply(
        self,
        x: torch.Tensor,
        topk_weights: torch.Tensor,
        topk_ids: torch.Tensor,
        lora: MoELoRAContext | None = None,
    ) -> torch.Tensor:
        """``x`` [T, H] bf16 on CUDA -> [T, H]; raises ValueError outside the declared support."""
        c, wt = self.config, self.weights
        rank = lora.adapters.max_rank if lora is not None else None
        ok, reason = check_config(c, x.dtype, rank)
        if not ok:
            raise ValueError(reason)
        tensors = [x, wt["w13"], wt["w2"]]
        if lora is not None:
            tensors += [lora.adapters.w13_a, lora.adapters.w2_a]
        bad = [
            f"{tuple(t.shape)} {t.dtype} {t.device}"
            for t in tensors
            if t.dtype != torch.bfloat16 or t.device.type != "cuda"
        ]
        if bad:
            raise ValueError(f"torch_grouped_mm needs bf16 CUDA tensors; got {bad}")
        return grouped_mm_fused_moe(
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
