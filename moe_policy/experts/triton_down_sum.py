"""Decode down-projection with the top-k sum fused: one program per (token, H tile).

For tiny batches (the launcher's one-pair-per-block mode) GEMM 2 and the top-k sum are two
launches over a handful of rows. Here each program owns one token and ``BLOCK_N`` output
columns, streams the ``[BLOCK_N, K]`` slices of its ``k`` experts' ``w2`` and reduces over the
slots in registers::

    y_j    = W2[e_j] a_j + b2[e_j] + dLoRA2_j      (a_j: activation row of pair t*k + j)
    out[t] = sum_j w_j * y_j                       (w_j = 1 when the weight went on the input)

A GEMV in fp32 FMAs (one row per expert leaves nothing for an MMA to share), deterministic
(fixed reduction tree), no intermediate ``[T*k, H]`` buffer. Pairs routed outside
``[0, E)`` contribute nothing.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

#: Output columns and K elements per step of one program (measured on the H200, 2026-11-29).
BLOCK_N = 16
BLOCK_K = 64


@triton.jit(do_not_specialize=["rank"])
def _moe_down_sum_kernel(
    # pointers
    act_ptr,  # [T*k, K] activation, row = pair
    w_ptr,  # [E, N, K]
    out_ptr,  # [T, N]
    bias_ptr,  # [E, N] (HAS_BIAS)
    topk_w_ptr,  # [T*k]
    topk_ids_ptr,  # [T*k]
    u_ptr,  # [U_SPLIT, T*k, R] fp32 LoRA shrink of the activation (HAS_LORA)
    lb_ptr,  # [L, E, N, R] LoRA B of w2 (HAS_LORA)
    lora_map_ptr,  # [T] int32
    lora_enabled_ptr,  # [L] int32
    # sizes
    N,
    K,
    num_experts,
    rank,
    # strides
    stride_am,
    stride_ak,
    stride_we,
    stride_wn,
    stride_wk,
    stride_om,
    stride_on,
    stride_bias_e,
    stride_bias_n,
    stride_uk,
    stride_um,
    stride_ur,
    stride_lbl,
    stride_lbe,
    stride_lbn,
    stride_lbr,
    # constexpr
    TOP_K: tl.constexpr,
    SLOTS_P2: tl.constexpr,  # power of two >= TOP_K
    WEIGHTED: tl.constexpr,  # multiply by the router weight (not when it went on the input)
    HAS_BIAS: tl.constexpr,
    HAS_LORA: tl.constexpr,
    U_SPLIT: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """out[t, n-tile] = sum_j w_j (W2[e_j] a_j + b2[e_j] + dLoRA2_j)."""
    t = tl.program_id(0).to(tl.int64)
    j = tl.arange(0, SLOTS_P2)
    pairs = t * TOP_K + j
    ex = tl.load(topk_ids_ptr + pairs, mask=j < TOP_K, other=-1).to(tl.int32)
    valid = (j < TOP_K) & (ex >= 0) & (ex < num_experts)
    ex = tl.where(valid, ex, 0).to(tl.int64)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = act_ptr + pairs[:, None] * stride_am + offs_k[None, :] * stride_ak
    w_ptrs = w_ptr + ex[:, None, None] * stride_we + offs_n[None, :, None] * stride_wn
    w_ptrs += offs_k[None, None, :] * stride_wk
    rows = valid[:, None, None] & n_mask[None, :, None]
    acc = tl.zeros((SLOTS_P2, BLOCK_N), dtype=tl.float32)
    for kk in range(0, tl.cdiv(K, BLOCK_K)):
        k_mask = offs_k < K - kk * BLOCK_K
        a = tl.load(a_ptrs, mask=valid[:, None] & k_mask[None, :], other=0.0).to(tl.float32)
        w = tl.load(w_ptrs, mask=rows & k_mask[None, None, :], other=0.0).to(tl.float32)
        acc += tl.sum(a[:, None, :] * w, axis=2)
        a_ptrs += BLOCK_K * stride_ak
        w_ptrs += BLOCK_K * stride_wk
    if HAS_LORA:
        slot = tl.load(lora_map_ptr + t + j * 0)  # the token's slot, once per pair row
        on = tl.load(lora_enabled_ptr + slot, mask=valid & (slot >= 0), other=0)
        live = valid & (slot >= 0) & (on != 0)
        offs_r = tl.arange(0, BLOCK_R)
        u_mask = live[:, None] & (offs_r < rank)[None, :]
        u_ptrs = u_ptr + pairs[:, None] * stride_um + offs_r[None, :] * stride_ur
        u = tl.load(u_ptrs, mask=u_mask, other=0.0)
        for sp in tl.static_range(1, U_SPLIT):
            u += tl.load(u_ptrs + sp * stride_uk, mask=u_mask, other=0.0)
        lb_ptrs = lb_ptr + tl.where(live, slot, 0).to(tl.int64)[:, None, None] * stride_lbl
        lb_ptrs += ex[:, None, None] * stride_lbe + offs_n[None, :, None] * stride_lbn
        lb_ptrs += offs_r[None, None, :] * stride_lbr
        lb_mask = live[:, None, None] & n_mask[None, :, None] & (offs_r < rank)[None, None, :]
        lb = tl.load(lb_ptrs, mask=lb_mask, other=0.0).to(tl.float32)
        acc += tl.sum(u[:, None, :] * lb, axis=2)
    if HAS_BIAS:
        b_ptrs = bias_ptr + ex[:, None] * stride_bias_e + offs_n[None, :] * stride_bias_n
        acc += tl.load(b_ptrs, mask=valid[:, None] & n_mask[None, :], other=0.0).to(tl.float32)
    if WEIGHTED:
        wt = tl.load(topk_w_ptr + pairs, mask=valid, other=0.0).to(tl.float32)
        acc = acc * wt[:, None]
    total = tl.sum(tl.where(valid[:, None], acc, 0.0), axis=0)
    o_ptrs = out_ptr + t * stride_om + offs_n * stride_on
    tl.store(o_ptrs, total.to(out_ptr.dtype.element_ty), mask=n_mask)


def down_proj_topk_sum(
    act: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    out: torch.Tensor,
    *,
    w2_bias: torch.Tensor | None = None,
    weighted: bool = True,
    lora_u: torch.Tensor | None = None,
    lora_b: torch.Tensor | None = None,
    lora_map: torch.Tensor | None = None,
    lora_enabled: torch.Tensor | None = None,
) -> torch.Tensor:
    """Write ``out`` [T, H] = sum over slots of the (weighted) down projections of ``act``.

    ``act`` is ``[T*k, I]`` with one row per pair; LoRA operands as in ``triton_lora``
    (``lora_u`` [parts, T*k, R] fp32, ``lora_b`` [L, E, H, R])."""
    t, k = topk_ids.shape
    e, h, i = w2.shape
    has_lora = lora_u is not None
    rank = lora_u.shape[-1] if lora_u is not None else 1
    u = lora_u if lora_u is not None else act
    lb = lora_b if lora_b is not None else act
    lmap = lora_map if lora_map is not None else topk_ids
    len_ = lora_enabled if lora_enabled is not None else topk_ids
    bias = w2_bias if w2_bias is not None else act
    _moe_down_sum_kernel[(t, triton.cdiv(h, BLOCK_N))](
        act, w2, out, bias, topk_weights, topk_ids, u, lb, lmap, len_,
        h, i, e, rank,
        act.stride(0), act.stride(1), w2.stride(0), w2.stride(1), w2.stride(2),
        out.stride(0), out.stride(1),
        bias.stride(0) if w2_bias is not None else 0, bias.stride(1) if w2_bias is not None else 0,
        *(u.stride()[:1] + u.stride()[-2:] if has_lora else (0, 0, 0)),
        *(lb.stride() if has_lora else (0, 0, 0, 0)),
        TOP_K=k, SLOTS_P2=triton.next_power_of_2(k), WEIGHTED=weighted,
        HAS_BIAS=w2_bias is not None, HAS_LORA=has_lora,
        U_SPLIT=u.shape[0] if has_lora else 1, BLOCK_R=max(16, triton.next_power_of_2(rank)),
        BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K, num_warps=4,
    )  # fmt: skip
    return out
