"""Batched-format Triton fused-MoE experts with multi-adapter LoRA (``batched_triton``).

Math, per local expert ``e`` and row ``m < expert_num_tokens[e]`` with LoRA slot
``l = lora_mapping[e, m]`` (the delta terms only when ``l >= 0`` and slot ``l`` is enabled)::

    h[e,m] = W13[e] x[e,m] + b13[e] + [B13_s[l,e] (A13_s[l,e] x[e,m]) for s in slices]
    a[e,m] = act(h[e,m])                      # gated: act(gate) * up; non-gated: act(h)
    y[e,m] = W2[e] a[e,m] + b2[e] + B2[l,e] (A2[l,e] a[e,m])

The router weight is *not* applied here: as with DeepEP low-latency, the combine computes
``out[t] = sum_k w[t,k] * y[row(t,k)]`` (see ``batched_format.combine_from_batched``), so
the w2 LoRA delta ends up router-weighted and the w13 delta does not, exactly as in the
standard path (``experts/lora.py``). Models that apply the weight on the input have the
prepare step scale the rows before dispatch.

Layout: ``x`` ``[E, M, H]`` (``M`` = max tokens per expert), ``expert_num_tokens`` ``[E]``
int32 on the device; weights in the common layout, unchanged: ``w13`` ``[E, 2I, H]``
(gate rows then up rows, ``swiglustep`` too; ``swigluoai`` interleaved even=gate, odd=up) or
``[E, I, H]`` non-gated, ``w2`` ``[E, H, I]``, biases ``[E, N1]`` / ``[E, H]``. LoRA:
``MoELoRAAdapters`` (``w13_a [S,L,E,R,H]``, ``w13_b [S,L,E,I,R]``, ``w2_a [L,E,R,I]``,
``w2_b [L,E,H,R]``, ``enabled [L]``) and a per-row slot mapping ``[E, M]`` int32 (``-1`` =
no adapter).
Output ``[E, M, H]`` in ``x.dtype``; rows at or past the count are not written.

Kernels (two launches without LoRA, four with):
  1. ``_lora_shrink_kernel`` (LoRA only): ``u[s,e,m] = A13_s[l,e] x[e,m]`` (fp32); one
     program per (expert, M-block, slice, slot, K split), absent slots exit at once; long K
     is split (fp32 atomic adds into a zeroed ``u``: summation order not fixed).
  2. ``_batched_gemm_kernel`` GEMM1: gate and up accumulators in one program, + bias,
     + LoRA expand ``u @ B13^T`` per slot present in the tile, then the activation in the
     epilogue; writes ``a`` ``[E, M, I]`` (no ``[E, M, 2I]`` round trip).
  3. ``_lora_shrink_kernel`` (LoRA only): ``v[e,m] = A2[l,e] a[e,m]``.
  4. ``_batched_gemm_kernel`` GEMM2: ``a @ W2^T`` + bias + LoRA expand ``v @ B2^T``.

No host synchronisation (CUDA-graph capturable): grids come from the static ``E`` and
``M``; programs whose M-block starts at or past the device-side count return at once. A count
above ``M`` (invalid; checking it would need a host sync) is taken as ``M``: the kernels never
touch rows past ``M``, which belong to the next expert.

Limits: bf16/fp16 (fp32 under the interpreter or for tests); adapters in the activation
dtype; LoRA rank padded to ``max(16, next_pow2(R))`` inside the kernels; every adapter slot
present in an M-tile costs one extra small ``tl.dot`` per output tile and one shrink pass
over that tile's rows; with a split K the LoRA result is not bit-reproducible. Configs are
a token-count heuristic keyed by ``M`` (no tuned tables yet).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from moe_policy.experts.base import FusedMoEExperts, check_devices
from moe_policy.experts.lora import MoELoRAContext
from moe_policy.experts.triton.config import SMEM_LIMIT, GemmConfig, fit_stages
from moe_policy.experts.triton.device import config_limits, sm_count, triton_runtime_available
from moe_policy.experts.triton.jit import (
    ACT_NONE,
    ACTIVATION_CODES,
    KERNEL_GATED_ACTIVATIONS,
    KERNEL_NON_GATED_ACTIVATIONS,
    activation,
)

_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


# ----------------------------------------------------------------------------------------
# Configs: a heuristic on M (rows per expert). Decode (M <= 16) uses BLOCK_M = 16 and
# narrow N tiles for parallelism; prefill uses 64/128-row tiles. Gated GEMM1 holds two
# accumulators (gate and up), so its N tile is halved at BLOCK_M = 128.
# ----------------------------------------------------------------------------------------
_TILE_KEYS = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "num_warps", "num_stages")
#: Up to this many rows per expert: (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages), plain / gated.
_TILES = (
    (16, (16, 64, 128, 4, 4), (16, 64, 128, 4, 3)),
    (64, (32, 64, 128, 4, 4), (32, 64, 128, 4, 3)),
    (256, (64, 128, 64, 4, 3), (64, 128, 64, 8, 3)),
    (float("inf"), (128, 128, 64, 8, 3), (128, 64, 64, 8, 3)),
)


def gemm_config(
    m: int, n: int, k: int, gated: bool, smem_limit: int = SMEM_LIMIT, elem_bytes: int = 2
) -> dict[str, int]:
    """Tile config for one batched GEMM with ``m`` rows per expert, its stages and tiles cut
    (as ``triton_config.fit_stages`` does) to ``smem_limit`` bytes of shared memory for
    ``elem_bytes``-byte operands: gated decode tiles take 108-120 KB in bf16, over Ada's
    budget, and twice that in fp32."""
    for max_m, plain, gate in _TILES:
        if m <= max_m:
            bm, bn, bk, warps, stages = gate if gated else plain
            g = fit_stages(bm, GemmConfig(bn, bk, 1, warps, stages), 2 if gated else 1,
                            smem_limit, elem_bytes)  # fmt: skip
            return dict(
                zip(_TILE_KEYS, (bm, g.block_n, g.block_k, warps, g.num_stages), strict=True)
            )
    raise AssertionError("unreachable: the last row takes every m")


def shrink_split_k(programs: int, k: int, block_k: int, m: int, sm_count: int) -> int:
    """K splits of the LoRA shrink: its rank-wide output leaves few programs per (expert,
    M-block), so long K (Mixtral's I = 14336) is split, keeping >= 4 K blocks per split.
    ``programs`` counts (expert, M-block, slice) programs of the static grid; at decode
    (m <= 16) only top_k experts are busy, so K is split as far as allowed."""
    max_split = max(1, triton.cdiv(k, block_k * 4))
    if m <= 16:
        return max_split
    return max(1, min(max_split, triton.cdiv(4 * sm_count, programs)))


def shrink_config(m: int) -> dict[str, int]:
    """Tile config for the LoRA shrink with ``m`` rows per expert."""
    bm = 16 if m <= 16 else (32 if m <= 64 else 64)
    return {"BLOCK_M": bm, "BLOCK_K": 128 if m <= 64 else 64, "num_warps": 4, "num_stages": 3}


# ----------------------------------------------------------------------------------------
# Kernels
# ----------------------------------------------------------------------------------------
@triton.jit
def _batched_gemm_kernel(
    # Pointers: input rows, weights, bias, output, per-expert counts, LoRA (slot map,
    # enabled flags, shrink output u [S, E, M, R] fp32, expand weights B [S, L, E, N, R]).
    a_ptr,
    w_ptr,
    bias_ptr,
    out_ptr,
    counts_ptr,
    slot_ptr,
    enabled_ptr,
    lu_ptr,
    lb_ptr,
    # Sizes: M rows per expert, N output columns (I for gated GEMM1), K reduction,
    # number of LoRA slots and the real (unpadded) rank.
    M,
    N,
    K,
    NUM_SLOTS,
    RANK,
    # Strides (elements to step one index along that dimension).
    stride_ae,
    stride_am,
    stride_ak,
    stride_we,
    stride_wn,
    stride_wk,
    stride_be,
    stride_bn,
    stride_oe,
    stride_om,
    stride_on,
    stride_se,
    stride_sm,
    stride_us,
    stride_ue,
    stride_um,
    stride_ur,
    stride_lbs,
    stride_lbl,
    stride_lbe,
    stride_lbn,
    stride_lbr,
    # swigluoai / swiglustep parameters (alpha: swigluoai only).
    alpha,
    limit,
    # Meta-parameters.
    GATED: tl.constexpr,
    INTERLEAVED: tl.constexpr,
    ACT: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    HAS_LORA: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_R: tl.constexpr,
):
    # Program -> (expert, N-block, M-block); M fastest so that programs sharing one weight
    # tile run together (L2 reuse). Blocks past the expert's device-side count exit.
    pid = tl.program_id(0)
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    e = pid // (num_m * num_n)
    rem = pid % (num_m * num_n)
    pid_n = rem // num_m
    pid_m = rem % num_m
    # a count above M (invalid, not checkable without a host sync) is clamped to M: rows past
    # M would be the next expert's rows of x and out
    count = tl.minimum(tl.load(counts_ptr + e), M)
    if pid_m * BLOCK_M >= count:
        return
    e64 = e.to(tl.int64)

    # Row, column and K offsets; weight rows of the gate and up halves for column n
    # (taken modulo N so loads stay in bounds; the store is masked).
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    row_mask = offs_m < count
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_nw = offs_n % N
    offs_k = tl.arange(0, BLOCK_K)
    if INTERLEAVED:
        g_rows = 2 * offs_nw
        u_rows = 2 * offs_nw + 1
    else:
        g_rows = offs_nw
        u_rows = offs_nw + N
    a_ptrs = a_ptr + e64 * stride_ae + offs_m[:, None] * stride_am + offs_k[None, :] * stride_ak
    wg_ptrs = w_ptr + e64 * stride_we + g_rows[None, :] * stride_wn + offs_k[:, None] * stride_wk
    wu_ptrs = w_ptr + e64 * stride_we + u_rows[None, :] * stride_wn + offs_k[:, None] * stride_wk

    # Accumulate in fp32 over K: one accumulator, two when gated (gate and up columns).
    acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kb in range(0, tl.cdiv(K, BLOCK_K)):
        k_mask = offs_k < K - kb * BLOCK_K
        x = tl.load(a_ptrs, mask=row_mask[:, None] & k_mask[None, :], other=0.0)
        wg = tl.load(wg_ptrs, mask=k_mask[:, None], other=0.0)
        acc_g += tl.dot(x, wg)
        if GATED:
            wu = tl.load(wu_ptrs, mask=k_mask[:, None], other=0.0)
            acc_u += tl.dot(x, wu)
        a_ptrs += BLOCK_K * stride_ak
        wg_ptrs += BLOCK_K * stride_wk
        wu_ptrs += BLOCK_K * stride_wk

    # Epilogue 1: per-expert bias.
    if HAS_BIAS:
        bias_base = bias_ptr + e64 * stride_be
        acc_g += tl.load(bias_base + g_rows * stride_bn).to(tl.float32)[None, :]
        if GATED:
            acc_u += tl.load(bias_base + u_rows * stride_bn).to(tl.float32)[None, :]

    # Epilogue 2: LoRA expand, one small dot per adapter slot present in this tile;
    # rows of other slots (and -1 rows, disabled slots) load u as zero / are skipped.
    if HAS_LORA:
        slots = tl.load(slot_ptr + e64 * stride_se + offs_m * stride_sm, mask=row_mask, other=-1)
        offs_r = tl.arange(0, BLOCK_R)
        r_mask = offs_r < RANK
        u_base = (
            lu_ptr + e64 * stride_ue + offs_m[:, None] * stride_um + offs_r[None, :] * stride_ur
        )
        b_off = e64 * stride_lbe + offs_nw[None, :] * stride_lbn + offs_r[:, None] * stride_lbr
        for slot in range(0, NUM_SLOTS):
            sel = (slots == slot) & row_mask
            present = tl.sum(sel.to(tl.int32), axis=0)
            enabled = tl.load(enabled_ptr + slot)
            if (present > 0) & (enabled != 0):
                um = sel[:, None] & r_mask[None, :]
                u0 = tl.load(u_base, mask=um, other=0.0)
                b0 = tl.load(lb_ptr + slot * stride_lbl + b_off, mask=r_mask[:, None], other=0.0)
                acc_g += tl.dot(u0.to(b0.dtype), b0)
                if GATED:
                    u1 = tl.load(u_base + stride_us, mask=um, other=0.0)
                    b1 = tl.load(
                        lb_ptr + stride_lbs + slot * stride_lbl + b_off,
                        mask=r_mask[:, None],
                        other=0.0,
                    )
                    acc_u += tl.dot(u1.to(b1.dtype), b1)

    # Epilogue 3: activation (GEMM1) and masked store of the valid rows.
    res = activation(acc_g, acc_u, alpha, limit, ACT, GATED) if ACT != 0 else acc_g
    out_ptrs = out_ptr + e64 * stride_oe + offs_m[:, None] * stride_om + offs_n[None, :] * stride_on
    tl.store(
        out_ptrs, res.to(out_ptr.dtype.element_ty), mask=row_mask[:, None] & (offs_n[None, :] < N)
    )


@triton.jit
def _lora_shrink_kernel(
    # Pointers: input rows [E, M, K], A [S, L, E, R, K], slot map [E, M], enabled [L],
    # counts [E], output u [S, E, M, R] (fp32; zero-filled when SPLIT_K > 1).
    x_ptr,
    la_ptr,
    slot_ptr,
    enabled_ptr,
    counts_ptr,
    u_ptr,
    # Sizes.
    M,
    K,
    NUM_SLOTS,
    RANK,
    # Strides.
    stride_xe,
    stride_xm,
    stride_xk,
    stride_las,
    stride_lal,
    stride_lae,
    stride_lar,
    stride_lak,
    stride_se,
    stride_sm,
    stride_us,
    stride_ue,
    stride_um,
    stride_ur,
    # Meta-parameters.
    BLOCK_M: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_R: tl.constexpr,
    SPLIT_K: tl.constexpr,
):
    # Program -> (expert, M-block) on axis 0, (slice, slot) on axis 1, K split on axis 2.
    # Blocks past the count, slots absent from the tile and disabled slots exit at once.
    pid = tl.program_id(0)
    s = tl.program_id(1) // NUM_SLOTS
    slot = tl.program_id(1) % NUM_SLOTS
    pid_k = tl.program_id(2)
    num_m = tl.cdiv(M, BLOCK_M)
    e = pid // num_m
    pid_m = pid % num_m
    count = tl.minimum(tl.load(counts_ptr + e), M)  # as in the GEMM: at most M rows
    if pid_m * BLOCK_M >= count:
        return
    if tl.load(enabled_ptr + slot) == 0:
        return
    e64 = e.to(tl.int64)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    row_mask = offs_m < count
    slots = tl.load(slot_ptr + e64 * stride_se + offs_m * stride_sm, mask=row_mask, other=-1)
    sel = (slots == slot) & row_mask
    if tl.sum(sel.to(tl.int32), axis=0) == 0:
        return

    # Pointers to this split's first K block of x (this slot's rows) and of A[s, slot, e]^T.
    offs_k = pid_k * BLOCK_K + tl.arange(0, BLOCK_K)
    offs_r = tl.arange(0, BLOCK_R)
    r_mask = offs_r < RANK
    x_ptrs = x_ptr + e64 * stride_xe + offs_m[:, None] * stride_xm + offs_k[None, :] * stride_xk
    a_ptrs = (
        la_ptr
        + s * stride_las
        + slot * stride_lal
        + e64 * stride_lae
        + offs_r[None, :] * stride_lar
        + offs_k[:, None] * stride_lak
    )

    # u = x A^T over this split's K blocks (every SPLIT_K-th), fp32 accumulation.
    acc = tl.zeros((BLOCK_M, BLOCK_R), dtype=tl.float32)
    for kb in range(pid_k, tl.cdiv(K, BLOCK_K), SPLIT_K):
        k_mask = offs_k < K - kb * BLOCK_K + pid_k * BLOCK_K
        x = tl.load(x_ptrs, mask=sel[:, None] & k_mask[None, :], other=0.0)
        a = tl.load(a_ptrs, mask=k_mask[:, None] & r_mask[None, :], other=0.0)
        acc += tl.dot(x, a.to(x.dtype))
        x_ptrs += SPLIT_K * BLOCK_K * stride_xk
        a_ptrs += SPLIT_K * BLOCK_K * stride_lak

    # Store (or add, when K is split) the rows of this slot.
    u_ptrs = (
        u_ptr
        + s * stride_us
        + e64 * stride_ue
        + offs_m[:, None] * stride_um
        + offs_r[None, :] * stride_ur
    )
    u_mask = sel[:, None] & r_mask[None, :]
    if SPLIT_K == 1:
        tl.store(u_ptrs, acc, mask=u_mask)
    else:
        tl.atomic_add(u_ptrs, acc, mask=u_mask)


# ----------------------------------------------------------------------------------------
# Launchers
# ----------------------------------------------------------------------------------------
def batched_lora_shrink(
    x: torch.Tensor,
    a: torch.Tensor,
    slot_map: torch.Tensor,
    enabled: torch.Tensor,
    counts: torch.Tensor,
    num_slices: int,
    split_k: int | None = None,
) -> torch.Tensor:
    """u [S, E, M, R] fp32 = A[s, slot(e,m), e] x[e, m] for valid rows with an enabled slot."""
    e_count, m_cap, k = x.shape
    num_slots, rank = a.shape[1], a.shape[3]
    cfg = shrink_config(m_cap)
    num_m = triton.cdiv(m_cap, cfg["BLOCK_M"])
    if split_k is None:
        split_k = shrink_split_k(
            e_count * num_m * num_slices, k, cfg["BLOCK_K"], m_cap, sm_count(x.device)
        )
    alloc = torch.zeros if split_k > 1 else torch.empty
    u = alloc(num_slices, e_count, m_cap, rank, dtype=torch.float32, device=x.device)
    grid = (e_count * num_m, num_slices * num_slots, split_k)
    _lora_shrink_kernel[grid](
        x,
        a,
        slot_map,
        enabled,
        counts,
        u,
        m_cap,
        k,
        num_slots,
        rank,
        x.stride(0),
        x.stride(1),
        x.stride(2),
        a.stride(0),
        a.stride(1),
        a.stride(2),
        a.stride(3),
        a.stride(4),
        slot_map.stride(0),
        slot_map.stride(1),
        u.stride(0),
        u.stride(1),
        u.stride(2),
        u.stride(3),
        BLOCK_M=cfg["BLOCK_M"],
        BLOCK_K=cfg["BLOCK_K"],
        BLOCK_R=_block_r(rank),
        SPLIT_K=split_k,
        num_warps=cfg["num_warps"],
        num_stages=cfg["num_stages"],
    )
    return u


def _block_r(rank: int) -> int:
    return max(16, triton.next_power_of_2(rank))


def _gemm(
    a: torch.Tensor,
    w: torch.Tensor,
    bias: torch.Tensor | None,
    out: torch.Tensor,
    counts: torch.Tensor,
    n: int,
    *,
    gated: bool,
    interleaved: bool,
    act: int,
    lora: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor] | None,
    alpha: float,
    limit: float,
) -> None:
    """One batched GEMM launch (GEMM1 with activation, or GEMM2)."""
    e_count, m_cap, k = a.shape
    smem = config_limits(a.device).get("smem_limit", SMEM_LIMIT)
    cfg = gemm_config(m_cap, n, k, gated, smem, a.element_size())
    grid = (e_count * triton.cdiv(m_cap, cfg["BLOCK_M"]) * triton.cdiv(n, cfg["BLOCK_N"]),)
    if lora is not None:
        slot_map, enabled, u, b = lora
        num_slots, rank = b.shape[1], b.shape[4]
        lora_strides = (
            slot_map.stride(0),
            slot_map.stride(1),
            u.stride(0),
            u.stride(1),
            u.stride(2),
            u.stride(3),
            b.stride(0),
            b.stride(1),
            b.stride(2),
            b.stride(3),
            b.stride(4),
        )
    else:
        slot_map = enabled = u = b = counts  # never read (HAS_LORA=False)
        num_slots, rank = 0, 1
        lora_strides = (0,) * 11
    bias_t = bias if bias is not None else counts
    bias_strides = (bias.stride(0), bias.stride(1)) if bias is not None else (0, 0)
    _batched_gemm_kernel[grid](
        a,
        w,
        bias_t,
        out,
        counts,
        slot_map,
        enabled,
        u,
        b,
        m_cap,
        n,
        k,
        num_slots,
        rank,
        a.stride(0),
        a.stride(1),
        a.stride(2),
        w.stride(0),
        w.stride(1),
        w.stride(2),
        *bias_strides,
        out.stride(0),
        out.stride(1),
        out.stride(2),
        *lora_strides,
        alpha,
        limit,
        GATED=gated,
        INTERLEAVED=interleaved,
        ACT=act,
        HAS_BIAS=bias is not None,
        HAS_LORA=lora is not None,
        BLOCK_M=cfg["BLOCK_M"],
        BLOCK_N=cfg["BLOCK_N"],
        BLOCK_K=cfg["BLOCK_K"],
        BLOCK_R=_block_r(rank),
        num_warps=cfg["num_warps"],
        num_stages=cfg["num_stages"],
    )


def _check_inputs(
    x: torch.Tensor,
    expert_num_tokens: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    gated: bool,
    w13_bias: torch.Tensor | None,
    w2_bias: torch.Tensor | None,
    lora: MoELoRAContext | None,
) -> None:
    """Raise ValueError naming what was received when shapes, dtypes or devices disagree."""
    got = (
        f"x {tuple(x.shape)} {x.dtype}, expert_num_tokens {tuple(expert_num_tokens.shape)} "
        f"{expert_num_tokens.dtype}, w13 {tuple(w13.shape)} {w13.dtype}, "
        f"w2 {tuple(w2.shape)} {w2.dtype}"
    )
    if x.dim() != 3 or w13.dim() != 3 or w2.dim() != 3:
        raise ValueError(f"expected x [E, M, H], w13 [E, N1, H], w2 [E, H, I]; got {got}")
    e_count, _, hidden = x.shape
    n1 = w13.shape[1]
    inter = w2.shape[2]
    if (
        w13.shape[0] != e_count
        or w2.shape[0] != e_count
        or w13.shape[2] != hidden
        or w2.shape[1] != hidden
        or n1 != (2 * inter if gated else inter)
    ):
        raise ValueError(f"shape mismatch (gated={gated}): {got}")
    if expert_num_tokens.shape != (e_count,) or expert_num_tokens.dtype not in (
        torch.int32,
        torch.int64,
    ):
        raise ValueError(f"expert_num_tokens must be [E={e_count}] int32; got {got}")
    if x.dtype not in _DTYPES or w13.dtype != x.dtype or w2.dtype != x.dtype:
        raise ValueError(f"x, w13, w2 must share one of {_DTYPES}; got {got}")
    check_devices(x, expert_num_tokens=expert_num_tokens, w13=w13, w2=w2, w13_bias=w13_bias,
                  w2_bias=w2_bias)  # fmt: skip
    if w13_bias is not None and w13_bias.shape != (e_count, n1):
        raise ValueError(f"w13_bias must be [E, N1]=({e_count}, {n1}); got {tuple(w13_bias.shape)}")
    if w2_bias is not None and w2_bias.shape != (e_count, hidden):
        raise ValueError(
            f"w2_bias must be [E, H]=({e_count}, {hidden}); got {tuple(w2_bias.shape)}"
        )
    if lora is None:
        return
    ad = lora.adapters
    s_want = 2 if gated else 1
    exp = {
        "w13_a": (s_want, ad.num_slots, e_count, ad.max_rank, hidden),
        "w13_b": (s_want, ad.num_slots, e_count, inter, ad.max_rank),
        "w2_a": (ad.num_slots, e_count, ad.max_rank, inter),
        "w2_b": (ad.num_slots, e_count, hidden, ad.max_rank),
    }
    for name, shape in exp.items():
        t = getattr(ad, name)
        if tuple(t.shape) != shape or t.dtype != x.dtype:
            raise ValueError(
                f"LoRA {name} must be {shape} {x.dtype}; got {tuple(t.shape)} {t.dtype}"
            )
    mapping = lora.token_lora_mapping
    if mapping.shape != x.shape[:2] or mapping.dtype not in (torch.int32, torch.int64):
        raise ValueError(
            f"batched LoRA mapping must be [E, M]={tuple(x.shape[:2])} int32; "
            f"got {tuple(mapping.shape)} {mapping.dtype}"
        )
    if tuple(ad.enabled.shape) != (ad.num_slots,):  # the kernels read enabled[slot]
        raise ValueError(f"LoRA enabled must be [L={ad.num_slots}]; got {tuple(ad.enabled.shape)}")
    check_devices(x, token_lora_mapping=mapping, **{f"LoRA {n}": getattr(ad, n) for n in exp})


def batched_fused_experts(
    x: torch.Tensor,
    expert_num_tokens: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    *,
    activation: str = "silu",
    gated: bool = True,
    w13_bias: torch.Tensor | None = None,
    w2_bias: torch.Tensor | None = None,
    lora: MoELoRAContext | None = None,
    swiglu_alpha: float = 1.702,
    swiglu_limit: float = 7.0,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Batched experts: ``x`` [E, M, H] + counts [E] -> [E, M, H] (unweighted; see module doc)."""
    allowed = KERNEL_GATED_ACTIVATIONS if gated else KERNEL_NON_GATED_ACTIVATIONS
    if activation not in allowed:
        raise ValueError(f"activation {activation!r} (gated={gated}) not in {sorted(allowed)}")
    _check_inputs(x, expert_num_tokens, w13, w2, gated, w13_bias, w2_bias, lora)
    e_count, m_cap, hidden = x.shape
    inter = w2.shape[2]
    if out is None:
        out = torch.empty_like(x)
    elif out.shape != x.shape or out.dtype != x.dtype or out.device != x.device:
        raise ValueError(
            f"out must be {tuple(x.shape)} {x.dtype} on {x.device}; got {tuple(out.shape)} "
            f"{out.dtype} on {out.device}"
        )
    if e_count == 0 or m_cap == 0:
        return out
    x = x if x.stride(2) == 1 else x.contiguous()
    counts = expert_num_tokens.to(torch.int32).contiguous()  # the kernels read counts[e]
    interleaved = activation == "swigluoai"
    act = ACTIVATION_CODES[activation]

    lora13 = lora2 = None
    if lora is not None:
        ad = lora.adapters
        slot_map = lora.token_lora_mapping.to(torch.int32)
        enabled = ad.enabled.to(device=x.device, dtype=torch.int32).contiguous()  # enabled[l]
        u = batched_lora_shrink(x, ad.w13_a, slot_map, enabled, counts, 2 if gated else 1)
        lora13 = (slot_map, enabled, u, ad.w13_b)

    # GEMM1 (+ LoRA expand, bias, activation) -> a [E, M, I].
    a = torch.empty(e_count, m_cap, inter, dtype=x.dtype, device=x.device)
    _gemm(
        x,
        w13,
        w13_bias,
        a,
        counts,
        inter,
        gated=gated,
        interleaved=interleaved,
        act=act,
        lora=lora13,
        alpha=swiglu_alpha,
        limit=swiglu_limit,
    )

    if lora is not None:
        ad = lora.adapters
        w2_a = ad.w2_a.unsqueeze(0)  # [1, L, E, R, I]
        w2_b = ad.w2_b.unsqueeze(0)  # [1, L, E, H, R]
        v = batched_lora_shrink(a, w2_a, slot_map, enabled, counts, 1)
        lora2 = (slot_map, enabled, v, w2_b)

    # GEMM2 (+ LoRA expand, bias) -> out [E, M, H].
    _gemm(
        a,
        w2,
        w2_bias,
        out,
        counts,
        hidden,
        gated=False,
        interleaved=False,
        act=ACT_NONE,
        lora=lora2,
        alpha=swiglu_alpha,
        limit=swiglu_limit,
    )
    return out


class BatchedTritonExperts(FusedMoEExperts):
    """Triton experts in the batched ``[E_local, max_tokens, H]`` format, LoRA-capable.

    ``apply(x, expert_num_tokens, lora=None)`` differs from the standard signature: the
    router weights and ids were consumed by the dispatch and are applied at combine.
    """

    backend = "batched_triton"
    activation_format = "batched"
    supports_lora = True
    gated_activations = KERNEL_GATED_ACTIVATIONS
    non_gated_activations = KERNEL_NON_GATED_ACTIVATIONS

    @classmethod
    def is_available(cls) -> tuple[bool, str | None]:
        """Needs a CUDA device, or Triton's interpreter (``TRITON_INTERPRET=1``)."""
        return triton_runtime_available()

    def apply(  # type: ignore[override]
        self,
        x: torch.Tensor,
        expert_num_tokens: torch.Tensor,
        lora: MoELoRAContext | None = None,
        *,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``x`` [E, M, H], counts [E] -> [E, M, H] in x.dtype, router weight not applied."""
        c, wt = self.config, self.weights
        return batched_fused_experts(
            x,
            expert_num_tokens,
            wt["w13"],
            wt["w2"],
            activation=c.activation,
            gated=c.gated,
            w13_bias=wt["w13_bias"],
            w2_bias=wt["w2_bias"],
            lora=lora,
            swiglu_alpha=c.swiglu_alpha,
            swiglu_limit=c.swiglu_limit,
            out=out,
        )
