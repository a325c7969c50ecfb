"""Triton fused MoE, standard ``[T, H]`` format, with optional multi-adapter LoRA.

Math, per token ``t`` and routed slot ``j`` (pair ``i = t*k + j``, expert ``e``, weight ``w``)::

    h      = W13[e] x[t] + dLoRA13            (x w + ... when the weight is on the input)
    a_i    = act(h + b13[e])                  GEMM 1, activation fused in its epilogue
    y_i    = w * (W2[e] a_i + b2[e] + dLoRA2) GEMM 2, router weight fused in its epilogue
    out[t] = sum_j y_{t*k+j}                  top-k sum (deterministic, fixed order)

Pipeline: ``moe_align`` (pairs grouped by expert, padded to BLOCK_M; skipped for tiny batches,
where block ``b`` holds pair ``b`` alone) -> [LoRA shrink of x] -> GEMM 1 + activation
(+ LoRA expand) -> [LoRA shrink of a] -> GEMM 2 + bias + weight (+ LoRA expand) -> top-k sum
(skipped when k = 1: GEMM 2 then writes the output; at decode without LoRA GEMM 2's last pair
of each token and N tile writes the sum, see ``_moe_gemm_kernel``).

Weight layout expected by the kernels (``TritonExperts.convert_weights`` produces it from the
common layout): gated ``w13 [E, 2I, H]`` interleaved, gate of column ``n`` at row ``2n`` and up
at ``2n + 1`` (``swigluoai``'s own layout; the ``[gate; up]`` layout of the other gated
activations is interleaved), or ``[E, I, H]`` non-gated; ``w2 [E, H, I]``; biases ``[E, N1]``
(interleaved like w13) and ``[E, H]``. A gated GEMM-1 program reads the gate and the up rows of
the same columns (one ``2 BLOCK_N`` wide dot, split into even and odd columns, or two dots), so
the activation is applied in registers and only ``[numel, I]`` is written, in the alignment's
expert-sorted order (``block_rows``), so GEMM 2 and the LoRA shrink read contiguous rows.

Operand loads: pointers, or on Hopper and newer TMA descriptors when the tile config asks
(``GemmConfig.tma``) and rows are 16-byte aligned: the weights viewed as ``[E*N_B, K]`` (a box
may run into the next expert's rows; those columns are masked on store) and, in GEMM 2, the
sorted activation (rows past the block's expert are computed and not stored).

Dependent launches (Hopper+; ``MoEConfig.pdl``, and every LoRA call via ``LORA_PDL``): every
kernel after the call's first starts while its predecessor drains and waits on it
(``gdc_wait``) before it reads; a LoRA shrink waits, then lets the next GEMM launch, and that
GEMM streams its weights and waits only before the LoRA expand; a decode GEMM 1 may let
GEMM 2 launch at its start (``MoEConfig.trigger``), so GEMM 2's programs take SMs it leaves
free. Every program of a kernel waits, so each kernel ends after its predecessor and the chain
stays ordered.

Persistent GEMMs (``MoEConfig.persistent``, aligned batches without LoRA): one program per SM
walks the tiles ``pid, pid + P, ...``; Triton flattens the tile loop and the K loop into one
software-pipelined loop, so the next tile's loads are in flight during this tile's epilogue
(no tail tiles there); a narrow last N tile (``TAIL_N``) runs in a second loop, one per block.
A last round that fills at most half the programs is split along K (``STREAM_K_TAILS``,
``_stream_k_tail``) where the partial tiles fit the memory budget and the alignment can be
stable (few experts): Mixtral's K = 14336 tiles otherwise leave most SMs idle for a whole
tile.

Limits: bf16/fp16/fp32 activations and weights of one dtype; ``E <= 1024``; no host
synchronisation (grids come from static bounds, empty blocks exit early), so ``apply`` can be
captured in a CUDA graph. Workspace: ``[T*k, I]`` + ``[T*k, H]`` in the compute dtype (the
second is skipped when k = 1). The alignment's int32 tables and, with LoRA, the fp32 shrink
outputs (``[S, T*k, R]`` and ``[T*k, R]``, times the split-K parts, at most 8, when fewer than
``SHRINK_MIN_PROGRAMS`` blocks exist) are carved out of the output and the ``[T*k, H]`` buffer
while those are idle (``workspace.Workspace``); only what does not fit, or everything when
k = 1, is allocated on its own. Stream-K tails add one fp32 tile per SM and a counter each.
"""

from __future__ import annotations

import os
from functools import lru_cache
from typing import Any

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from moe_policy.experts.base import (
    ExpertsConfig,
    FusedMoEExperts,
    check_common_layout,
    contiguous_layout,
)
from moe_policy.experts.lora import MoELoRAContext
from moe_policy.experts.triton.align import block_pairs, moe_align, stable_supported
from moe_policy.experts.triton.config import (
    SMEM_LIMIT,
    GemmConfig,
    MoEConfig,
    default_tail_m,
    get_config,
    is_decode_batch,
)
from moe_policy.experts.triton.device import (
    config_limits,
    pdl_launch,
    sm_count,
    triton_runtime_available,
)
from moe_policy.experts.triton.lora import (
    MAX_RANK,
    lora_b_ahead,
    lora_block_sizes,
    lora_expand_loop,
    lora_shrink,
    lora_slots,
)
from moe_policy.experts.triton.workspace import Workspace

#: Activation codes of the GEMM-1 epilogue (0 = none, used by GEMM 2).
ACTIVATION_CODES = {"silu": 1, "gelu": 2, "gelu_tanh": 3, "relu2": 4, "swigluoai": 5}
#: Router-weight position codes: not applied / before the bias (on input) / after it (on output).
_WEIGHT_NONE, _WEIGHT_INPUT, _WEIGHT_OUTPUT = 0, 1, 2
_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
#: Below this many M blocks the LoRA shrink splits K (up to 8 parts) to fill the GPU.
SHRINK_MIN_PROGRAMS = 128
#: LoRA calls launch every kernel after the first as a programmatic dependent whatever the
#: config says: each shrink lets the next GEMM start at once, and the GEMM streams its weights
#: before it waits for the shrink output (H200, 2026-11-29: LoRA T=1 7-24% faster, T=16-256
#: 0.4-6%). False leaves it to ``MoEConfig.pdl``.
LORA_PDL = True
#: Narrow tiles for a last N tile that is at most half full (N not a multiple of BLOCK_N).
N_TAIL_TILES = True
#: LoRA: both GEMMs load the B tiles of each block's lowest and highest adapter slot before
#: the main loop, so their latency hides behind it, where a block holds few slots (decode,
#: pairs ordered by adapter) or the main loop is long (128-row tiles). H200: -1 to -4% there;
#: with 16-32-row tiles holding all four slots, +2.5 to +5.7% (Qwen3 T=64/256), so not there.
LORA_B_AHEAD = True
#: Decode (one pair per block, k > 1): GEMM 2 writes the top-k sum itself (its last pair per
#: token and N tile sums), instead of a separate sum kernel. False restores the sum kernel.
FUSED_DECODE_SUM = True
#: Persistent GEMMs where the config asks (``MoEConfig.persistent``); False ignores it.
PERSISTENT_GEMMS = True
#: Persistent GEMMs run a narrow last N tile (``N_TAIL_TILES``) in a second loop after the
#: full-width tiles; False runs it full width, masked, in the one loop.
PERSISTENT_NARROW_N = True
#: Persistent GEMMs split a last round of tiles that fills at most half the programs along K
#: (stream-K) where the partial tiles fit the memory budget and the alignment can be stable
#: (at most 31 experts); False leaves the idle programs idle.
STREAM_K_TAILS = True


@triton.jit
def _apply_act(
    g, u, ACT: tl.constexpr, GATED: tl.constexpr, ALPHA: tl.constexpr, LIMIT: tl.constexpr
):
    """Activation in fp32: ``act(g) * u`` gated, ``act(g)`` non-gated."""
    if ACT == 5:
        g = tl.minimum(g, LIMIT)
        u = tl.minimum(tl.maximum(u, -LIMIT), LIMIT)
        out = (u + 1.0) * g * tl.sigmoid(ALPHA * g)
    else:
        if ACT == 1:
            y = g * tl.sigmoid(g)
        elif ACT == 2:
            y = 0.5 * g * (1.0 + tl.math.erf(g * 0.7071067811865476))
        elif ACT == 3:
            inner = 0.7978845608028654 * (g + 0.044715 * g * g * g)
            y = g * tl.sigmoid(2.0 * inner)  # 0.5 * (1 + tanh(z)) == sigmoid(2 z)
        else:
            r = tl.maximum(g, 0.0)
            y = r * r
        if GATED:  # noqa: SIM108 (a constexpr branch: only one side is compiled)
            out = y * u
        else:
            out = y
    return out


@triton.jit
def _tile_mainloop(
    pairs,
    expert,
    row0,
    n0,
    a_ptr,
    b_ptr,
    a_desc,
    b_desc,
    N,
    K,
    numel,
    stride_am,
    stride_ak,
    stride_be,
    stride_bn,
    stride_bk,
    kk_lo,  # first and end BLOCK_K step of the K range (stream-K parts take a share)
    kk_hi,
    A_ROW_DIV: tl.constexpr,
    A_SORTED: tl.constexpr,
    A_TMA: tl.constexpr,
    B_TMA: tl.constexpr,
    GATED: tl.constexpr,
    ONE_DOT: tl.constexpr,
    EVEN_K: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """fp32 accumulators of one tile over K steps ``[kk_lo, kk_hi)``: ``[BLOCK_M, B_COLS]`` and,
    in the two-dot gated form, the up rows' ``[BLOCK_M, BLOCK_N]`` (zeros otherwise)."""
    pair_mask = pairs < numel
    # operands: A rows of this block (tokens of x, or GEMM 1's expert-sorted output), B tile of
    # this expert, [BLOCK_K, B_COLS]; gated one-dot tiles hold the interleaved gate/up rows of
    # the same columns. Pointer tiles wrap N (stores are masked); TMA boxes may run into the
    # next expert's rows or past the end (zero-filled), both masked on store too.
    offs_k = tl.arange(0, BLOCK_K)
    offs_n = n0 + tl.arange(0, BLOCK_N)
    offs_bn = offs_n % N
    B_COLS: tl.constexpr = 2 * BLOCK_N if (GATED and ONE_DOT) else BLOCK_N
    if A_SORTED:
        a_rows = row0.to(tl.int64) + tl.arange(0, BLOCK_M)
    else:
        a_rows = (pairs // A_ROW_DIV).to(tl.int64)
    a_ptrs = a_ptr + a_rows[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_base = b_ptr + expert.to(tl.int64) * stride_be
    if GATED and ONE_DOT:
        rows_b = (2 * n0 + tl.arange(0, B_COLS)) % (2 * N)
    elif GATED:
        rows_b = 2 * offs_bn  # gate rows; up rows are the next ones
    else:
        rows_b = offs_bn
    b_ptrs = b_base + rows_b[None, :] * stride_bn + offs_k[:, None] * stride_bk
    b_row0 = expert * (2 * N if GATED else N) + n0 * (B_COLS // BLOCK_N)  # TMA: row of [E*N_B, K]

    # main loop, fp32 accumulation; the two-dot gated form adds a second dot for the up rows
    acc_b = tl.zeros((BLOCK_M, B_COLS), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    a_ptrs += kk_lo * BLOCK_K * stride_ak
    b_ptrs += kk_lo * BLOCK_K * stride_bk
    for kk in range(kk_lo, kk_hi):
        k_mask = offs_k < K - kk * BLOCK_K
        if A_TMA:
            a = a_desc.load([row0, kk * BLOCK_K])
        elif EVEN_K:
            a = tl.load(a_ptrs, mask=pair_mask[:, None], other=0.0)
        else:
            a = tl.load(a_ptrs, mask=pair_mask[:, None] & k_mask[None, :], other=0.0)
        if B_TMA:
            b = b_desc.load([b_row0, kk * BLOCK_K]).T
        elif EVEN_K:
            b = tl.load(b_ptrs)
        else:
            b = tl.load(b_ptrs, mask=k_mask[:, None], other=0.0)
        acc_b = tl.dot(a, b, acc_b)
        if GATED and not ONE_DOT:
            if EVEN_K:
                b_u = tl.load(b_ptrs + stride_bn)
            else:
                b_u = tl.load(b_ptrs + stride_bn, mask=k_mask[:, None], other=0.0)
            acc_u = tl.dot(a, b_u, acc_u)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    return acc_b, acc_u


@triton.jit
def _tile_epilogue(
    acc_b,
    acc_u,
    pairs,
    expert,
    row0,
    n0,
    c_ptr,
    bias_ptr,
    topk_w_ptr,
    N,
    numel,
    stride_cm,
    stride_cn,
    stride_bias_e,
    stride_bias_n,
    C_SORTED: tl.constexpr,
    C_ROW_DIV: tl.constexpr,
    GATED: tl.constexpr,
    ACT: tl.constexpr,
    ALPHA: tl.constexpr,
    LIMIT: tl.constexpr,
    WEIGHT_POS: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    ONE_DOT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """Gate/up split, router weight, bias and activation on a tile's accumulators; store."""
    pair_mask = pairs < numel
    offs_n = n0 + tl.arange(0, BLOCK_N)
    offs_bn = offs_n % N
    if GATED and ONE_DOT:  # even columns are gate, odd columns up
        acc, acc_u = tl.split(tl.reshape(acc_b, (BLOCK_M, BLOCK_N, 2)))
    else:
        acc = acc_b

    # epilogue 2: router weight, bias, activation (the order of the reference)
    if WEIGHT_POS != 0:
        w = tl.load(topk_w_ptr + pairs, mask=pair_mask, other=0.0).to(tl.float32)
    if WEIGHT_POS == 1:
        acc = acc * w[:, None]
        acc_u = acc_u * w[:, None]
    if HAS_BIAS:
        bias_ptrs = bias_ptr + expert.to(tl.int64) * stride_bias_e
        if GATED:  # interleaved like w13: gate 2n, up 2n + 1
            acc += tl.load(bias_ptrs + (2 * offs_bn) * stride_bias_n).to(tl.float32)[None, :]
            acc_u += tl.load(bias_ptrs + (2 * offs_bn + 1) * stride_bias_n).to(tl.float32)[None, :]
        else:
            acc += tl.load(bias_ptrs + offs_bn * stride_bias_n).to(tl.float32)[None, :]
    if ACT != 0:
        acc = _apply_act(acc, acc_u, ACT, GATED, ALPHA, LIMIT)
    if WEIGHT_POS == 2:
        acc = acc * w[:, None]

    # store the rows of real pairs (by pair, token or expert-sorted position)
    if C_SORTED:
        c_rows = row0.to(tl.int64) + tl.arange(0, BLOCK_M)
    else:
        c_rows = (pairs // C_ROW_DIV).to(tl.int64)
    c_ptrs = c_ptr + c_rows[:, None] * stride_cm + offs_n[None, :] * stride_cn
    c_mask = pair_mask[:, None] & (offs_n[None, :] < N)
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=c_mask)


@triton.jit
def _moe_tile(
    pairs,  # [BLOCK_M] pair of each row, numel = padding
    expert,
    row0,  # first row of the block in the unpadded expert-sorted order
    n0,  # first output column of the tile
    # pointers and descriptors: as in _moe_gemm_kernel
    a_ptr,
    b_ptr,
    c_ptr,
    a_desc,
    b_desc,
    bias_ptr,
    topk_w_ptr,
    lora_u_ptr,
    lora_b_ptr,
    lora_map_ptr,
    lora_enabled_ptr,
    # sizes
    N,
    K,
    numel,
    num_slots,
    lora_rank,
    # strides
    stride_am,
    stride_ak,
    stride_be,
    stride_bn,
    stride_bk,
    stride_cm,
    stride_cn,
    stride_bias_e,
    stride_bias_n,
    stride_uk,
    stride_us,
    stride_um,
    stride_ur,
    stride_lbs,
    stride_lbl,
    stride_lbe,
    stride_lbn,
    stride_lbr,
    # constexpr
    A_ROW_DIV: tl.constexpr,
    A_SORTED: tl.constexpr,
    A_TMA: tl.constexpr,
    B_TMA: tl.constexpr,
    C_SORTED: tl.constexpr,
    C_ROW_DIV: tl.constexpr,
    TOP_K: tl.constexpr,
    GATED: tl.constexpr,
    ACT: tl.constexpr,
    ALPHA: tl.constexpr,
    LIMIT: tl.constexpr,
    WEIGHT_POS: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    HAS_LORA: tl.constexpr,
    ONE_DOT: tl.constexpr,
    EVEN_K: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_R: tl.constexpr,
    U_SPLIT: tl.constexpr,
    RANK_MASK: tl.constexpr,
    WAIT_LORA: tl.constexpr,  # dependent launch: wait for the shrink output only here
    LORA_B_AHEAD: tl.constexpr,  # LoRA B tiles of the block's lowest/highest slot before the loop
):
    """One BLOCK_M x BLOCK_N tile of one expert's GEMM with the fused epilogue."""
    pair_mask = pairs < numel

    # LoRA: slot of each row and, per accumulator column, its output column and slice (a
    # one-dot gated tile interleaves gate and up)
    if HAS_LORA:
        slot = lora_slots(pairs, pair_mask, lora_map_ptr, lora_enabled_ptr, num_slots, TOP_K)
        if GATED and ONE_DOT:
            cols_lb = tl.arange(0, 2 * BLOCK_N)
            n_lb = (n0 + cols_lb // 2) % N
            slice_lb = cols_lb % 2
        else:
            n_lb = (n0 + tl.arange(0, BLOCK_N)) % N
            slice_lb = n_lb * 0
        dt = b_ptr.dtype.element_ty
        if LORA_B_AHEAD:
            s_lo, s_hi, b_lo, b_hi = lora_b_ahead(
                slot, expert, n_lb, slice_lb, lora_b_ptr, num_slots, lora_rank,
                stride_lbs, stride_lbl, stride_lbe, stride_lbn, stride_lbr,
                BLOCK_R, 2 if (GATED and ONE_DOT) else 1, dt, RANK_MASK,
            )  # fmt: skip
        else:
            s_lo = 0
            s_hi = -1
            b_lo = 0.0
            b_hi = 0.0

    acc_b, acc_u = _tile_mainloop(
        pairs, expert, row0, n0, a_ptr, b_ptr, a_desc, b_desc, N, K, numel,
        stride_am, stride_ak, stride_be, stride_bn, stride_bk, 0, tl.cdiv(K, BLOCK_K),
        A_ROW_DIV, A_SORTED, A_TMA, B_TMA, GATED, ONE_DOT, EVEN_K, BLOCK_M, BLOCK_N, BLOCK_K,
    )  # fmt: skip
    # epilogue 1: LoRA delta u @ B^T for rows with an adapter (exactly zero for the others),
    # one small dot per slot present, into the accumulators as the MMA left them (before a
    # one-dot tile's gate/up split)
    if WAIT_LORA:
        gdc_wait()
    if HAS_LORA:
        acc_b = lora_expand_loop(
            acc_b, slot, pairs, n_lb, slice_lb, expert, lora_u_ptr, lora_b_ptr,
            num_slots, lora_rank, stride_uk, stride_us, stride_um, stride_ur,
            stride_lbs, stride_lbl, stride_lbe, stride_lbn, stride_lbr, s_lo, s_hi, b_lo, b_hi,
            BLOCK_R, 2 if (GATED and ONE_DOT) else 1, U_SPLIT, dt, RANK_MASK, LORA_B_AHEAD,
        )  # fmt: skip
        if GATED and not ONE_DOT:  # (the tiles ahead are the gate slice's: not used here)
            acc_u = lora_expand_loop(
                acc_u, slot, pairs, n_lb, slice_lb, expert, lora_u_ptr + stride_us,
                lora_b_ptr + stride_lbs, num_slots, lora_rank,
                stride_uk, stride_us, stride_um, stride_ur,
                stride_lbs, stride_lbl, stride_lbe, stride_lbn, stride_lbr, s_lo, s_hi, b_lo, b_hi,
                BLOCK_R, 1, U_SPLIT, dt, RANK_MASK, False,
            )  # fmt: skip
    _tile_epilogue(
        acc_b, acc_u, pairs, expert, row0, n0, c_ptr, bias_ptr, topk_w_ptr, N, numel,
        stride_cm, stride_cn, stride_bias_e, stride_bias_n,
        C_SORTED, C_ROW_DIV, GATED, ACT, ALPHA, LIMIT, WEIGHT_POS, HAS_BIAS, ONE_DOT,
        BLOCK_M, BLOCK_N,
    )  # fmt: skip


@triton.jit(do_not_specialize=["numel", "num_blocks", "num_slots", "lora_rank"])
def _moe_gemm_kernel(
    # pointers
    a_ptr,  # A: x [T, K] (GEMM 1; row = pair // A_ROW_DIV) or act [numel, K] (GEMM 2, sorted)
    b_ptr,  # B: weights [E, N_B, K]; gated GEMM 1 reads rows 2n (gate) and 2n + 1 (up)
    c_ptr,  # C: [numel or T, N] output: sorted rows (GEMM 1), pairs or tokens (GEMM 2)
    a_desc,  # TMA descriptor of A [rows, K], box [BLOCK_M, BLOCK_K] (A_TMA), else None
    b_desc,  # TMA descriptor of B viewed as [E*N_B, K], box [B_COLS, BLOCK_K] (B_TMA), else None
    bias_ptr,  # [E, N_B] (HAS_BIAS)
    topk_w_ptr,  # [numel] router weights
    topk_ids_ptr,  # [numel] experts (NAIVE mode)
    sorted_ids_ptr,  # alignment: pairs grouped by expert
    expert_ids_ptr,  # alignment: expert of each block
    num_padded_ptr,  # alignment: rows in use
    block_rows_ptr,  # alignment: first expert-sorted row of each block
    lora_u_ptr,  # [U_SPLIT, S, numel, R] fp32 shrink output, split-K partials (HAS_LORA)
    lora_b_ptr,  # [S, L, E, N, R] LoRA B (HAS_LORA)
    lora_map_ptr,  # [T] int32 slot per token
    lora_enabled_ptr,  # [L] int32
    sum_ptr,  # [T, N] layer output, unit stride along N (SUM_K: the fused top-k sum)
    cnt_ptr,  # the output's bytes as int32: one arrival counter per (token, N tile)
    sk_ws_ptr,  # STREAM_K: [programs, BLOCK_M, B_COLS] fp32 partial tiles
    sk_cnt_ptr,  # STREAM_K: [programs] int32 arrival counters, zero between uses
    # sizes
    N,
    K,
    numel,
    num_experts,
    num_blocks,  # static bound on M blocks (grid rows)
    num_slots,
    lora_rank,
    num_tokens,  # T (ZERO_CNT)
    n_cnt,  # counters per token = GEMM-2 N tiles (ZERO_CNT)
    # strides (elements between neighbours along each dimension)
    stride_am,
    stride_ak,
    stride_be,
    stride_bn,
    stride_bk,
    stride_cm,
    stride_cn,
    stride_bias_e,
    stride_bias_n,
    stride_uk,
    stride_us,
    stride_um,
    stride_ur,
    stride_lbs,
    stride_lbl,
    stride_lbe,
    stride_lbn,
    stride_lbr,
    stride_st,  # output rows
    stride_cnt_t,  # counter rows (int32 elements)
    cnt_step,  # int32 elements between the counters of neighbouring N tiles
    # constexpr
    A_ROW_DIV: tl.constexpr,  # top_k for GEMM 1 (rows of x)
    A_SORTED: tl.constexpr,  # A rows in expert-sorted order (GEMM 2): block_rows + r
    A_TMA: tl.constexpr,  # A tiles through a_desc (A_SORTED only)
    B_TMA: tl.constexpr,  # B tiles through b_desc (not with the two-dot gated form)
    C_SORTED: tl.constexpr,  # C rows in expert-sorted order (GEMM 1)
    C_ROW_DIV: tl.constexpr,  # otherwise C row = pair // C_ROW_DIV (1, or top_k = 1: token)
    TOP_K: tl.constexpr,  # pairs per token (LoRA token mapping)
    GATED: tl.constexpr,
    ACT: tl.constexpr,  # ACTIVATION_CODES value, 0 = none
    ALPHA: tl.constexpr,
    LIMIT: tl.constexpr,
    WEIGHT_POS: tl.constexpr,  # 0 none, 1 before bias (on input), 2 after bias (on output)
    HAS_BIAS: tl.constexpr,
    HAS_LORA: tl.constexpr,
    NAIVE: tl.constexpr,
    ONE_DOT: tl.constexpr,  # gated: one [BLOCK_M, 2 BLOCK_N] dot instead of two
    EVEN_K: tl.constexpr,  # K % BLOCK_K == 0: no K masks
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_R: tl.constexpr,  # LoRA rank, padded to a power of two >= 16
    U_SPLIT: tl.constexpr,  # split-K partials in the LoRA shrink output
    RANK_MASK: tl.constexpr,  # LoRA max rank < BLOCK_R: padding ranks are masked
    GROUP_M: tl.constexpr,
    TAIL_M: tl.constexpr,  # 0, or: blocks with <= TAIL_M real rows run a TAIL_M-row tile
    SUM_K: tl.constexpr,  # NAIVE GEMM 2 with k > 1: the token's last pair sums (0 = off)
    ZERO_CNT: tl.constexpr,  # GEMM 1 before a SUM_K GEMM 2: counters to zero, padded (0 = off)
    PDL: tl.constexpr,  # launched as a programmatic dependent: wait before the first read
    PDL_LATE: tl.constexpr,  # with LoRA after a triggering shrink: wait before the expand only
    TAIL_N: tl.constexpr,  # 0, or: the last N tile (at most half full) runs TAIL_N wide
    TRIGGER: tl.constexpr,  # let the next kernel (a dependent launch) start once all have begun
    LORA_B_AHEAD: tl.constexpr,  # LoRA: B tiles of the block's lowest/highest slot before the loop
    PERSISTENT: tl.constexpr,  # aligned, no tail tiles: each program loops over tiles (flattened)
    STREAM_K: tl.constexpr,  # PERSISTENT: the last, partial round of tiles split along K
):
    """Program -> (block, N tile); runs the block's tile (a TAIL_M-row one for a short block,
    a TAIL_N-wide one, with pointer loads, for the last N tile of a full block).

    Fused decode sum (NAIVE, one pair per block): GEMM 1's first program zeroes one int32
    arrival counter per (token, GEMM-2 N tile), kept in the first bytes of that output tile; in
    GEMM 2 each pair's program stores its row, then counts itself in; the last of the token's
    pairs sums their rows in slot order (as ``_moe_sum_kernel``) and overwrites the tile,
    counter included. No extra buffer, no state across calls, no launch for the sum."""
    # program -> (block of pairs, N tile), grouped so that GROUP_M blocks share B tiles in L2
    if PDL and not PDL_LATE:
        gdc_wait()
    if TRIGGER:
        gdc_launch_dependents()
    pid = tl.program_id(0)
    if PERSISTENT:
        # persistent: program p of P walks tiles p, p + P, ... of the live blocks (grouped as
        # below); the tile loop and the K loop are flattened into one pipelined loop, so the
        # next tile's loads are in flight during this tile's epilogue
        live_m = tl.load(num_padded_ptr) // BLOCK_M
        num_p = tl.num_programs(0)
        # with a narrow last N tile (TAIL_N), the full-width tiles first, then one narrow
        # tile per block in a second loop
        n_full = N // BLOCK_N if TAIL_N > 0 else tl.cdiv(N, BLOCK_N)
        # stream-K: whole rounds of tiles one per program, then a last round of at most half
        # the programs' count split along K (a fuller one runs whole, in this loop)
        n_round = live_m * n_full
        if STREAM_K:
            rest = n_round % num_p
            split = (rest > 0) & (2 * rest <= num_p) & (tl.cdiv(K, BLOCK_K) >= 2)
            n_round -= tl.where(split, rest, 0)
        for tile in tl.range(pid, n_round, num_p, flatten=True):
            tile_m, tile_n = _grouped_tile(tile, live_m, n_full * BLOCK_N, BLOCK_N, GROUP_M)
            pairs_p, expert_p, _, row0_p = block_pairs(
                tile_m, sorted_ids_ptr, expert_ids_ptr, num_padded_ptr, block_rows_ptr,
                topk_ids_ptr, numel, num_experts, BLOCK_M, False,
            )  # fmt: skip
            _moe_tile(
                pairs_p, expert_p, row0_p, tile_n * BLOCK_N,
                a_ptr, b_ptr, c_ptr, a_desc, b_desc,
                bias_ptr, topk_w_ptr, lora_u_ptr, lora_b_ptr, lora_map_ptr, lora_enabled_ptr,
                N, K, numel, num_slots, lora_rank,
                stride_am, stride_ak, stride_be, stride_bn, stride_bk, stride_cm, stride_cn,
                stride_bias_e, stride_bias_n, stride_uk, stride_us, stride_um, stride_ur,
                stride_lbs, stride_lbl, stride_lbe, stride_lbn, stride_lbr,
                A_ROW_DIV, A_SORTED, A_TMA, B_TMA, C_SORTED, C_ROW_DIV, TOP_K, GATED, ACT, ALPHA,
                LIMIT, WEIGHT_POS, HAS_BIAS, HAS_LORA, ONE_DOT, EVEN_K,
                BLOCK_M, BLOCK_N, BLOCK_K, BLOCK_R, U_SPLIT, RANK_MASK, PDL_LATE, LORA_B_AHEAD,
            )  # fmt: skip
        if STREAM_K:
            _stream_k_tail(
                pid, num_p, n_round, live_m * n_full - n_round, live_m, n_full,
                a_ptr, b_ptr, c_ptr, a_desc, b_desc, bias_ptr, topk_w_ptr, topk_ids_ptr,
                sorted_ids_ptr, expert_ids_ptr, num_padded_ptr, block_rows_ptr,
                sk_ws_ptr, sk_cnt_ptr, N, K, numel, num_experts,
                stride_am, stride_ak, stride_be, stride_bn, stride_bk, stride_cm, stride_cn,
                stride_bias_e, stride_bias_n,
                A_ROW_DIV, A_SORTED, A_TMA, B_TMA, C_SORTED, C_ROW_DIV, GATED, ACT, ALPHA, LIMIT,
                WEIGHT_POS, HAS_BIAS, ONE_DOT, EVEN_K, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M,
            )  # fmt: skip
        if TAIL_N > 0:
            # narrow tiles continue the round robin where the full ones stopped, so programs
            # that had one full tile fewer take them first (all alike after a stream-K tail)
            first = (pid + num_p - n_round % num_p) % num_p
            for tile_m in range(first, live_m, num_p):
                pairs_p, expert_p, _, row0_p = block_pairs(
                    tile_m, sorted_ids_ptr, expert_ids_ptr, num_padded_ptr, block_rows_ptr,
                    topk_ids_ptr, numel, num_experts, BLOCK_M, False,
                )  # fmt: skip
                _moe_tile(
                    pairs_p, expert_p, row0_p, n_full * BLOCK_N,
                    a_ptr, b_ptr, c_ptr, a_desc, b_desc,
                    bias_ptr, topk_w_ptr, lora_u_ptr, lora_b_ptr, lora_map_ptr, lora_enabled_ptr,
                    N, K, numel, num_slots, lora_rank,
                    stride_am, stride_ak, stride_be, stride_bn, stride_bk, stride_cm, stride_cn,
                    stride_bias_e, stride_bias_n, stride_uk, stride_us, stride_um, stride_ur,
                    stride_lbs, stride_lbl, stride_lbe, stride_lbn, stride_lbr,
                    A_ROW_DIV, A_SORTED, A_TMA, False, C_SORTED, C_ROW_DIV, TOP_K, GATED, ACT,
                    ALPHA, LIMIT, WEIGHT_POS, HAS_BIAS, HAS_LORA, ONE_DOT, EVEN_K,
                    BLOCK_M, TAIL_N, BLOCK_K, BLOCK_R, U_SPLIT, RANK_MASK, PDL_LATE, LORA_B_AHEAD,
                )  # fmt: skip
        return
    if ZERO_CNT > 0:  # noqa: SIM102 (constexpr test)
        if pid == 0:
            offs_cnt = tl.arange(0, ZERO_CNT)
            for tok in range(0, num_tokens):
                tl.store(
                    cnt_ptr + tok * stride_cnt_t + offs_cnt * cnt_step,
                    tl.zeros((ZERO_CNT,), dtype=tl.int32),
                    mask=offs_cnt < n_cnt,
                )
    num_pid_n = tl.cdiv(N, BLOCK_N)
    pid_m, pid_n = _grouped_tile(pid, num_blocks, N, BLOCK_N, GROUP_M)
    pairs, expert, live, row0 = block_pairs(
        pid_m, sorted_ids_ptr, expert_ids_ptr, num_padded_ptr, block_rows_ptr, topk_ids_ptr,
        numel, num_experts, BLOCK_M, NAIVE,
    )  # fmt: skip
    if not live:
        if PDL_LATE:  # every program waits, so the kernel ends after its predecessor
            gdc_wait()
        if SUM_K > 0:  # an invalid expert still counts as arrived
            _sum_when_last(
                pid_m, pid_n, c_ptr, sum_ptr, cnt_ptr, topk_ids_ptr, N, num_experts,
                stride_cm, stride_cn, stride_st, stride_cnt_t, cnt_step, SUM_K, BLOCK_N,
            )  # fmt: skip
        return
    if TAIL_M > 0:  # noqa: SIM102 (constexpr test: the short tile is compiled only when on)
        if tl.sum((pairs < numel).to(tl.int32), 0) <= TAIL_M:
            # real pairs come first in a block, so the short tile takes the block's first rows
            pairs_t = tl.load(sorted_ids_ptr + pid_m * BLOCK_M + tl.arange(0, TAIL_M))
            _moe_tile(
                pairs_t, expert, row0, pid_n * BLOCK_N, a_ptr, b_ptr, c_ptr, a_desc, b_desc, bias_ptr,
                topk_w_ptr, lora_u_ptr, lora_b_ptr, lora_map_ptr, lora_enabled_ptr,
                N, K, numel, num_slots, lora_rank,
                stride_am, stride_ak, stride_be, stride_bn, stride_bk, stride_cm, stride_cn,
                stride_bias_e, stride_bias_n, stride_uk, stride_us, stride_um, stride_ur,
                stride_lbs, stride_lbl, stride_lbe, stride_lbn, stride_lbr,
                A_ROW_DIV, A_SORTED, False, B_TMA, C_SORTED, C_ROW_DIV, TOP_K, GATED, ACT, ALPHA,
                LIMIT, WEIGHT_POS, HAS_BIAS, HAS_LORA, ONE_DOT, EVEN_K,
                TAIL_M, BLOCK_N, BLOCK_K, BLOCK_R, U_SPLIT, RANK_MASK, PDL_LATE, LORA_B_AHEAD,
            )  # fmt: skip
            return
    if TAIL_N > 0:  # noqa: SIM102 (constexpr test: the narrow tile is compiled only when on)
        if pid_n == num_pid_n - 1:
            # the last N tile holds at most half a tile of columns: a TAIL_N-wide tile
            _moe_tile(
                pairs, expert, row0, pid_n * BLOCK_N, a_ptr, b_ptr, c_ptr, a_desc, b_desc, bias_ptr,
                topk_w_ptr, lora_u_ptr, lora_b_ptr, lora_map_ptr, lora_enabled_ptr,
                N, K, numel, num_slots, lora_rank,
                stride_am, stride_ak, stride_be, stride_bn, stride_bk, stride_cm, stride_cn,
                stride_bias_e, stride_bias_n, stride_uk, stride_us, stride_um, stride_ur,
                stride_lbs, stride_lbl, stride_lbe, stride_lbn, stride_lbr,
                A_ROW_DIV, A_SORTED, A_TMA, False, C_SORTED, C_ROW_DIV, TOP_K, GATED, ACT, ALPHA,
                LIMIT, WEIGHT_POS, HAS_BIAS, HAS_LORA, ONE_DOT, EVEN_K,
                BLOCK_M, TAIL_N, BLOCK_K, BLOCK_R, U_SPLIT, RANK_MASK, PDL_LATE, LORA_B_AHEAD,
            )  # fmt: skip
            if SUM_K > 0:
                _sum_when_last(
                    pid_m, pid_n, c_ptr, sum_ptr, cnt_ptr, topk_ids_ptr, N, num_experts,
                    stride_cm, stride_cn, stride_st, stride_cnt_t, cnt_step, SUM_K, BLOCK_N,
                )  # fmt: skip
            return
    _moe_tile(
        pairs, expert, row0, pid_n * BLOCK_N, a_ptr, b_ptr, c_ptr, a_desc, b_desc, bias_ptr,
        topk_w_ptr, lora_u_ptr, lora_b_ptr, lora_map_ptr, lora_enabled_ptr,
        N, K, numel, num_slots, lora_rank,
        stride_am, stride_ak, stride_be, stride_bn, stride_bk, stride_cm, stride_cn,
        stride_bias_e, stride_bias_n, stride_uk, stride_us, stride_um, stride_ur,
        stride_lbs, stride_lbl, stride_lbe, stride_lbn, stride_lbr,
        A_ROW_DIV, A_SORTED, A_TMA, B_TMA, C_SORTED, C_ROW_DIV, TOP_K, GATED, ACT, ALPHA,
        LIMIT, WEIGHT_POS, HAS_BIAS, HAS_LORA, ONE_DOT, EVEN_K,
        BLOCK_M, BLOCK_N, BLOCK_K, BLOCK_R, U_SPLIT, RANK_MASK, PDL_LATE, LORA_B_AHEAD,
    )  # fmt: skip
    if SUM_K > 0:
        _sum_when_last(
            pid_m, pid_n, c_ptr, sum_ptr, cnt_ptr, topk_ids_ptr, N, num_experts,
            stride_cm, stride_cn, stride_st, stride_cnt_t, cnt_step, SUM_K, BLOCK_N,
        )  # fmt: skip


@triton.jit
def _stream_k_tail(
    pid,
    num_p,
    first_tile,  # tiles before this one ran whole, one per program
    n_tiles,  # tiles left, fewer than programs
    live_m,
    n_full,
    a_ptr,
    b_ptr,
    c_ptr,
    a_desc,
    b_desc,
    bias_ptr,
    topk_w_ptr,
    topk_ids_ptr,
    sorted_ids_ptr,
    expert_ids_ptr,
    num_padded_ptr,
    block_rows_ptr,
    ws_ptr,  # [num_p, BLOCK_M, B_COLS] fp32
    cnt_ptr,  # [num_p] int32, zero on entry; left zero
    N,
    K,
    numel,
    num_experts,
    stride_am,
    stride_ak,
    stride_be,
    stride_bn,
    stride_bk,
    stride_cm,
    stride_cn,
    stride_bias_e,
    stride_bias_n,
    A_ROW_DIV: tl.constexpr,
    A_SORTED: tl.constexpr,
    A_TMA: tl.constexpr,
    B_TMA: tl.constexpr,
    C_SORTED: tl.constexpr,
    C_ROW_DIV: tl.constexpr,
    GATED: tl.constexpr,
    ACT: tl.constexpr,
    ALPHA: tl.constexpr,
    LIMIT: tl.constexpr,
    WEIGHT_POS: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    ONE_DOT: tl.constexpr,
    EVEN_K: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
):
    """The last, partial round of tiles (fewer than programs), split along K into ``S`` equal
    parts, ``S = programs // tiles``: program ``s * tiles + j`` runs part ``s`` of tile ``j``,
    so the programs of one N column of a group run the same K range together and share the
    expert's weight tiles in L2. With ``S`` = 1 each tile runs whole. Split tiles: every part
    stores its partial sums, and the last to arrive adds the ``S`` parts in order
    (deterministic) and runs the epilogue; no program waits on another (the interpreter runs
    programs one by one)."""
    steps = tl.cdiv(K, BLOCK_K)
    n_div = tl.maximum(n_tiles, 1)
    per = tl.cdiv(steps, tl.maximum(num_p // n_div, 1))  # K steps per part
    parts = tl.cdiv(steps, per)  # every part non-empty
    part = pid // n_div
    j = pid % n_div
    if (part < parts) & (j < n_tiles):
        lo = part * per
        hi = tl.minimum(lo + per, steps)
        tile_m, tile_n = _grouped_tile(first_tile + j, live_m, n_full * BLOCK_N, BLOCK_N, GROUP_M)
        pairs, expert, _, row0 = block_pairs(
            tile_m, sorted_ids_ptr, expert_ids_ptr, num_padded_ptr, block_rows_ptr,
            topk_ids_ptr, numel, num_experts, BLOCK_M, False,
        )  # fmt: skip
        acc_b, acc_u = _tile_mainloop(
            pairs, expert, row0, tile_n * BLOCK_N, a_ptr, b_ptr, a_desc, b_desc, N, K, numel,
            stride_am, stride_ak, stride_be, stride_bn, stride_bk, lo, hi,
            A_ROW_DIV, A_SORTED, A_TMA, B_TMA, GATED, ONE_DOT, EVEN_K, BLOCK_M, BLOCK_N, BLOCK_K,
        )  # fmt: skip
        last = parts == 1
        if not last:
            B_COLS: tl.constexpr = 2 * BLOCK_N if (GATED and ONE_DOT) else BLOCK_N
            offs = tl.arange(0, BLOCK_M)[:, None] * B_COLS + tl.arange(0, B_COLS)[None, :]
            tl.store(ws_ptr + pid.to(tl.int64) * (BLOCK_M * B_COLS) + offs, acc_b)
            tl.debug_barrier()  # every thread's partial before the counter's release
            last = tl.atomic_add(cnt_ptr + j, 1, sem="acq_rel", scope="gpu") == parts - 1
            if last:
                acc_b = tl.zeros((BLOCK_M, B_COLS), dtype=tl.float32)
                for q in range(0, parts):
                    src = (q * n_tiles + j).to(tl.int64) * (BLOCK_M * B_COLS)
                    acc_b += tl.load(ws_ptr + src + offs, cache_modifier=".cg")
                tl.store(cnt_ptr + j, 0)  # zero again for the next use
        if last:
            _tile_epilogue(
                acc_b, acc_u, pairs, expert, row0, tile_n * BLOCK_N, c_ptr, bias_ptr,
                topk_w_ptr, N, numel, stride_cm, stride_cn, stride_bias_e, stride_bias_n,
                C_SORTED, C_ROW_DIV, GATED, ACT, ALPHA, LIMIT, WEIGHT_POS, HAS_BIAS, ONE_DOT,
                BLOCK_M, BLOCK_N,
            )  # fmt: skip


@triton.jit
def _grouped_tile(tile, num_m, N, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """Tile -> (M block, N tile), GROUP_M blocks at a time, so that they share B tiles in L2."""
    tiles_in_group = GROUP_M * tl.cdiv(N, BLOCK_N)
    first_m = (tile // tiles_in_group) * GROUP_M
    size_m = min(num_m - first_m, GROUP_M)
    return first_m + ((tile % tiles_in_group) % size_m), (tile % tiles_in_group) // size_m


@triton.jit
def _sum_when_last(
    pair,
    pid_n,
    c_ptr,
    sum_ptr,
    cnt_ptr,
    topk_ids_ptr,
    N,
    num_experts,
    stride_cm,
    stride_cn,
    stride_st,
    stride_cnt_t,
    cnt_step,
    TOP_K: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """Count ``pair`` in at its token's N tile; the token's last pair writes the top-k sum.

    The CTA barrier orders every thread's stores of the tile before the counter's release;
    the last arriver's acquire orders the other pairs' rows before its loads, which bypass L1."""
    tok = pair // TOP_K
    tl.debug_barrier()
    cnt = cnt_ptr + tok * stride_cnt_t + pid_n * cnt_step
    if tl.atomic_add(cnt, 1, sem="acq_rel", scope="gpu") == TOP_K - 1:
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        acc = tl.zeros((BLOCK_N,), dtype=tl.float32)
        for j in tl.static_range(TOP_K):
            e = tl.load(topk_ids_ptr + tok * TOP_K + j)
            n_lim = N * ((e >= 0) & (e < num_experts)).to(tl.int32)  # 0 skips an invalid slot
            row = c_ptr + (tok * TOP_K + j).to(tl.int64) * stride_cm
            v = tl.load(
                row + offs_n * stride_cn, mask=offs_n < n_lim, other=0.0, cache_modifier=".cg"
            )
            acc += v.to(tl.float32)
        out = sum_ptr + tok.to(tl.int64) * stride_st + offs_n
        tl.store(out, acc.to(sum_ptr.dtype.element_ty), mask=offs_n < N)


@triton.jit
def _moe_sum_kernel(
    # pointers
    c_ptr,  # [T, TOP_K, H] weighted expert outputs
    topk_ids_ptr,  # [T, TOP_K] (pairs of experts outside [0, E) are skipped)
    out_ptr,  # [T, H]
    # sizes
    H,
    num_experts,
    # strides
    stride_ct,
    stride_ck,
    stride_ch,
    stride_ot,
    stride_oh,
    # constexpr
    TOP_K: tl.constexpr,
    BLOCK_H: tl.constexpr,
    PDL: tl.constexpr,  # launched as a programmatic dependent: wait before the first read
):
    """out[t, h] = sum_j c[t, j, h] over valid slots, in slot order (fp32)."""
    if PDL:
        gdc_wait()
    t = tl.program_id(0).to(tl.int64)
    offs_h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    h_mask = offs_h < H
    acc = tl.zeros((BLOCK_H,), dtype=tl.float32)
    for j in tl.static_range(TOP_K):
        e = tl.load(topk_ids_ptr + t * TOP_K + j)
        h_lim = H * ((e >= 0) & (e < num_experts)).to(tl.int32)  # 0 skips an invalid slot
        v = tl.load(
            c_ptr + t * stride_ct + j * stride_ck + offs_h * stride_ch,
            mask=offs_h < h_lim,
            other=0.0,
        )
        acc += v.to(tl.float32)
    tl.store(
        out_ptr + t * stride_ot + offs_h * stride_oh, acc.to(out_ptr.dtype.element_ty), mask=h_mask
    )


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise ValueError(msg)


def _check_lora(lora: MoELoRAContext, t: int, e: int, h: int, i: int, gated: bool) -> None:
    ad = lora.adapters
    s = 2 if gated else 1
    shapes = (
        tuple(ad.w13_a.shape),
        tuple(ad.w13_b.shape),
        tuple(ad.w2_a.shape),
        tuple(ad.w2_b.shape),
    )
    if ad.w13_a.dim() != 5:
        raise ValueError(f"LoRA w13_a must be [S, L, E, R, H], got {shapes[0]}")
    _, slots, _, r, _ = ad.w13_a.shape
    want = ((s, slots, e, r, h), (s, slots, e, i, r), (slots, e, r, i), (slots, e, h, r))
    _check(
        shapes == want,
        f"LoRA shapes (w13_a, w13_b, w2_a, w2_b) {shapes} do not match the layer; "
        f"expected {want} (S={s}, L={slots}, E={e}, R={r}, H={h}, I={i})",
    )
    _check(r <= MAX_RANK, f"LoRA max rank {r} exceeds {MAX_RANK}")
    m = lora.token_lora_mapping
    _check(
        m.dim() == 1 and m.shape[0] == t and m.dtype == torch.int32 and m.is_contiguous(),
        f"token_lora_mapping must be contiguous int32 [T={t}], got shape {tuple(m.shape)} "
        f"dtype {m.dtype} strides {m.stride()}",
    )
    en = ad.enabled
    _check(
        en.dim() == 1 and en.shape[0] == slots and en.dtype == torch.int32,
        f"enabled must be int32 [L={slots}], got shape {tuple(en.shape)} dtype {en.dtype}",
    )


#: TMA box sides are at most 256 elements.
_TMA_MAX_BOX = 256


@lru_cache(maxsize=16)
def _has_tma(index: int) -> bool:
    """An NVIDIA GPU of compute capability 9 or newer: TMA descriptors and dependent launches.
    ROCm builds of torch report AMD's gfx9 parts (MI300X: 9.4) as capability 9 too."""
    return torch.version.hip is None and torch.cuda.get_device_capability(index)[0] >= 9


def _pdl_usable(x: torch.Tensor) -> bool:
    """Programmatic dependent launch: a Hopper or newer GPU, not Triton's interpreter."""
    if x.device.type != "cuda" or os.environ.get("TRITON_INTERPRET") == "1":
        return False
    return _has_tma(x.device.index if x.device.index is not None else torch.cuda.current_device())


def _tma_device(t: torch.Tensor) -> bool:
    """``t`` lives where TMA descriptors work: a Hopper or newer GPU, or the interpreter."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        return True
    if t.device.type == "cuda":
        return _has_tma(t.device.index if t.device.index is not None else 0)
    return False


def _tma_usable(t: torch.Tensor) -> bool:
    """A TMA device (``_tma_device``), unit inner stride, 16-byte aligned base and rows."""
    es = t.element_size()
    return (
        _tma_device(t)
        and t.stride(-1) == 1
        and (t.stride(-2) * es) % 16 == 0
        and t.data_ptr() % 16 == 0
        and all((st * es) % 16 == 0 for st in t.stride()[:-1])
    )


def _descriptor(t2d: torch.Tensor, rows: int, g: GemmConfig) -> Any:
    """TMA descriptor of a 2-D ``[rows_total, K]`` tensor with box ``[rows, g.block_k]``."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    return TensorDescriptor.from_tensor(t2d, [rows, g.block_k])


def _weight_descriptor(w: torch.Tensor, rows: int, g: GemmConfig) -> Any:
    """Descriptor of ``w`` [E, N_B, K] viewed as [E*N_B, K] when ``g.tma`` asks and TMA can serve."""
    if not g.tma or rows > _TMA_MAX_BOX or g.block_k > _TMA_MAX_BOX or not w.is_contiguous():
        return None
    if not _tma_usable(w):
        return None
    return _descriptor(w.view(-1, w.shape[-1]), rows, g)


def fused_moe_triton(
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
    config: MoEConfig | None = None,
    naive: bool | None = None,
) -> torch.Tensor:
    """Fused MoE on ``x`` [T, H]; gated w13 interleaved (gate even rows); returns [T, H]."""
    # check shapes, dtypes and strides
    _check(x.dim() == 2 and w13.dim() == 3 and w2.dim() == 3,
           f"expected x [T, H], w13 [E, N1, H], w2 [E, H, I]; got x {tuple(x.shape)}, "
           f"w13 {tuple(w13.shape)}, w2 {tuple(w2.shape)}")  # fmt: skip
    t, h = x.shape
    e, n1, h13 = w13.shape
    i = w2.shape[2]
    want_n1 = 2 * i if gated else i
    _check(
        h13 == h and n1 == want_n1 and tuple(w2.shape[:2]) == (e, h),
        f"shape mismatch: x {tuple(x.shape)}, w13 {tuple(w13.shape)} (want [E, {want_n1}, {h}]), "
        f"w2 {tuple(w2.shape)} (want [{e}, {h}, I])",
    )
    _check(
        x.dtype in _DTYPES and w13.dtype == x.dtype and w2.dtype == x.dtype,
        f"x, w13, w2 must share one of {_DTYPES}; got {x.dtype}, {w13.dtype}, {w2.dtype}",
    )
    _check(x.stride(1) == 1, f"x must have unit stride along H, got strides {x.stride()}")
    _check(
        topk_ids.dim() == 2 and topk_ids.shape == topk_weights.shape and topk_ids.shape[0] == t
        and topk_ids.dtype in (torch.int32, torch.int64) and topk_weights.is_floating_point()
        and topk_ids.is_contiguous() and topk_weights.is_contiguous(),
        f"topk_ids/topk_weights must be contiguous [T={t}, k] int and float; got "
        f"{tuple(topk_ids.shape)} {topk_ids.dtype} strides {topk_ids.stride()}, "
        f"{tuple(topk_weights.shape)} {topk_weights.dtype} strides {topk_weights.stride()}",
    )  # fmt: skip
    _check(e <= 1024, f"at most 1024 experts are supported, got {e}")
    act = ACTIVATION_CODES.get(activation)
    _check(
        act is not None
        and (activation != "swigluoai" or gated)
        and (activation != "relu2" or not gated),
        f"activation {activation!r} with gated={gated} is not supported",
    )
    if w13_bias is not None or w2_bias is not None:
        _check(
            w13_bias is not None and w2_bias is not None
            and tuple(w13_bias.shape) == (e, n1) and tuple(w2_bias.shape) == (e, h),
            f"biases must both be given as [E, N1]=[{e}, {n1}] and [E, H]=[{e}, {h}]; got "
            f"{None if w13_bias is None else tuple(w13_bias.shape)}, "
            f"{None if w2_bias is None else tuple(w2_bias.shape)}",
        )  # fmt: skip
    if lora is not None:
        _check_lora(lora, t, e, h, i, gated)
    k = topk_ids.shape[1]
    numel = t * k
    out = (
        torch.empty(t, h, dtype=x.dtype, device=x.device)
        if k > 1
        else torch.zeros(t, h, dtype=x.dtype, device=x.device)
    )
    if numel == 0:
        return out

    # scratch: with k > 1 the output is written only by the last kernel (the top-k sum), so the
    # routing tables and the w2 LoRA shrink output live in it until then, and GEMM 2's output
    # buffer (written by GEMM 2) holds the w13 LoRA shrink output, read by GEMM 1 only; new
    # tensors where they do not fit
    direct = k == 1
    c2 = out if direct else torch.empty(numel, h, dtype=x.dtype, device=x.device)
    work = Workspace(None if direct else out, x.device)
    work13 = Workspace(None if direct else c2, x.device)

    # routing: align pairs by expert, or one pair per block for tiny batches
    limits = config_limits(x.device)
    cfg = config or get_config(t, e, k, h, i, gated, elem_bytes=x.element_size(), **limits)
    bm = cfg.block_m
    if naive is None:
        naive = is_decode_batch(t, k, e)
    # persistent GEMMs (config.persistent: one program per SM walks the tiles) for aligned
    # batches without LoRA (with LoRA the expand's loop keeps the tile loop from being
    # flattened: H200 3-27% slower)
    persist = PERSISTENT_GEMMS and cfg.persistent and not naive and lora is None
    # stream-K tails of persistent GEMMs: partial tiles for one program per SM, where they fit
    # the memory the two activation buffers leave of issue 4's budget, with a stable alignment
    # (a pair's sums must not depend on which block the atomics put it in) and not in the
    # two-dot gated form (its up rows would need a second partial)
    g1 = cfg.gemm1
    one_dot1 = gated and (g1.one_dot or g1.tma)  # a TMA box holds gate and up rows together
    stream_k = persist and STREAM_K_TAILS and (one_dot1 or not gated) and stable_supported(e)
    if stream_k:  # (decode never gets here: no device query on its path)
        sk_elems = stream_k_workspace_elems(
            sm_count(x.device), bm, max((2 if gated else 1) * g1.block_n, cfg.gemm2.block_n)
        )
        stream_k = 4 * sk_elems <= stream_k_headroom_bytes(numel, n1, h, x.element_size(), direct)
    if naive:
        num_blocks = numel
        sorted_ids = expert_ids = num_padded = block_rows = topk_ids  # unused placeholders
    else:
        # with LoRA and experts averaging more than a block, pairs are ordered by adapter
        # inside each expert, so a busy expert's blocks hold few adapters (the expand runs one
        # small dot per adapter in a block): 3-9% faster on the H200 at T >= 1024; with one
        # block per expert nothing is gained and the ordering costs 1-2%
        order = None
        if lora is not None and numel > e * bm:
            order = (lora.token_lora_mapping, lora.adapters.enabled)
        routing = moe_align(topk_ids, e, bm, alloc=work.take, adapter_order=order, stable=stream_k)
        num_blocks = routing.max_blocks
        sorted_ids, expert_ids, num_padded, block_rows = (
            routing.sorted_ids,
            routing.expert_ids,
            routing.num_padded,
            routing.block_rows,
        )
    route = (topk_weights, topk_ids, sorted_ids, expert_ids, num_padded, block_rows)
    # LoRA B tiles before the main loop (LORA_B_AHEAD): one pair per block (decode), pairs
    # ordered by adapter (few slots per block), or 128-row tiles (a long loop to hide behind)
    b_ahead = LORA_B_AHEAD and lora is not None and (naive or numel > e * bm or bm >= 128)
    # programmatic dependent launches (config.pdl): every kernel after the call's first
    pdl = (cfg.pdl or (LORA_PDL and lora is not None)) and _pdl_usable(x)

    # decode without LoRA: GEMM 2 sums the top k itself, with arrival counters in the output's
    # first bytes of each (token, N tile). With LoRA the output holds the w2 shrink output
    # (split-K parts that fit no budget elsewhere), so the sum kernel stays: on the H200 the
    # fusion took 6% off Qwen3-30B-A3B at T=1, nothing elsewhere, and a smaller w2 shrink split
    # made LoRA 4-6% slower on Nemotron and Mixtral
    g2 = cfg.gemm2
    fused_sum = (
        FUSED_DECODE_SUM and naive and not direct and lora is None
        and (h * out.element_size()) % 4 == 0
    )  # fmt: skip
    sum_args = None
    if fused_sum:
        words = out.element_size() * out.stride(0) // 4
        n_cnt = triton.cdiv(h, g2.block_n)
        cnt_step = g2.block_n * out.element_size() // 4
        sum_args = (out, out.view(torch.int32), t, n_cnt, out.stride(0), words, cnt_step)

    # LoRA: shrink of x for every w13 slice
    has_lora = lora is not None
    if lora is not None:
        ad = lora.adapters
        lmap, len_, slots, rank = lora.token_lora_mapping, ad.enabled, ad.num_slots, ad.max_rank
        shrink_args = dict(
            topk_ids=topk_ids, sorted_ids=sorted_ids, expert_ids=expert_ids,
            num_padded=num_padded, block_rows=block_rows, lora_map=lmap, lora_enabled=len_,
            num_blocks=num_blocks, block_m=bm, naive=naive, alloc=work.take,
            smem_limit=limits.get("smem_limit", SMEM_LIMIT),
        )  # fmt: skip
        split = max(1, min(8, SHRINK_MIN_PROGRAMS // max(1, num_blocks)))
        u13 = lora_shrink(
            x,
            ad.w13_a,
            a_row_div=k,
            split_k=split,
            pdl=pdl and not naive,
            trigger=pdl,
            **{**shrink_args, "alloc": work13.take},
        )  # type: ignore[arg-type]
        lb13 = ad.w13_b
    else:
        lmap = len_ = topk_ids
        slots, rank, split = 0, 1, 1
        u13 = lb13 = x
    block_r = lora_block_sizes(rank, slots)[0]

    # GEMM 1 + activation -> act [numel, I], rows in expert-sorted order
    act_out = torch.empty(numel, i, dtype=x.dtype, device=x.device)
    b1_desc = _weight_descriptor(w13, (2 if one_dot1 else 1) * g1.block_n, g1)
    # a persistent entry run per tile (with LoRA, or the switch off) takes the default tail
    # tiles its persistent loop cannot run (H200, LoRA: -2 to -4% at Qwen3 T=4096/8192 and
    # Mixtral T=1024/4096, ab_lora_tiles_h200.txt)
    if naive:
        tail_m = 0
    elif cfg.persistent and not persist:
        tail_m = default_tail_m(bm)
    else:
        tail_m = cfg.tail_m
    # decode with dependent launches: GEMM 1 lets GEMM 2 launch at once (GEMM 2 waits before
    # it reads), so its programs start on SMs GEMM 1 leaves free (config.trigger; by default
    # when GEMM 1 runs at most one program per SM. H200: Qwen3-30B-A3B T=1 -3%; with more
    # programs than SMs it needs a GEMM-2 tile that fits beside them, so tuned files say)
    trigger1 = (
        pdl and naive and not has_lora
        and (cfg.trigger if cfg.trigger is not None
             else numel * triton.cdiv(i, g1.block_n) <= sm_count(x.device))
    )  # fmt: skip
    sk = _stream_k_buffers(sk_elems, sm_count(x.device), x.device) if stream_k else None
    common = dict(
        route=route, lora_args=(lmap, len_, slots, rank), numel=numel, num_experts=e, sk=sk,
        num_blocks=num_blocks, NAIVE=naive, BLOCK_M=bm, BLOCK_R=block_r, RANK_MASK=rank < block_r,
        TOP_K=k,
        ALPHA=float(swiglu_alpha), LIMIT=float(swiglu_limit), HAS_LORA=has_lora, TAIL_M=tail_m,
        sum_args=sum_args,
    )  # fmt: skip
    _launch_gemm(
        x, w13, act_out, None, b1_desc, w13_bias, u13, lb13, g1,
        A_ROW_DIV=k, A_SORTED=False, C_SORTED=True, C_ROW_DIV=1, GATED=gated, ACT=act,
        WEIGHT_POS=_WEIGHT_INPUT if apply_router_weight_on_input else _WEIGHT_NONE,
        ONE_DOT=one_dot1, SUM_K=0, PERSISTENT=persist,
        ZERO_CNT=triton.next_power_of_2(sum_args[3]) if sum_args else 0,
        PDL=pdl and (not naive or has_lora), PDL_LATE=pdl and has_lora, TRIGGER=trigger1,
        LORA_B_AHEAD=b_ahead, **common,
    )  # fmt: skip

    # LoRA: shrink of the activation for w2
    if lora is not None:
        u2 = lora_shrink(
            act_out,
            lora.adapters.w2_a.unsqueeze(0),
            a_sorted=True,
            split_k=split,
            pdl=pdl,
            trigger=pdl,
            **shrink_args,
        )  # type: ignore[arg-type]
        lb2 = lora.adapters.w2_b.unsqueeze(0)
    else:
        u2 = lb2 = x

    # GEMM 2 + bias + router weight -> [numel, H] by pair, or the output directly when k == 1
    b2_desc = _weight_descriptor(w2, g2.block_n, g2)
    a2_tma = b2_desc is not None and bm <= _TMA_MAX_BOX and _tma_usable(act_out)
    a2_desc = _descriptor(act_out, bm, g2) if a2_tma else None
    _launch_gemm(
        act_out, w2, c2, a2_desc, b2_desc, w2_bias, u2, lb2, g2,
        A_ROW_DIV=1, A_SORTED=True, C_SORTED=False, C_ROW_DIV=1, GATED=False, ACT=0,
        WEIGHT_POS=_WEIGHT_NONE if apply_router_weight_on_input else _WEIGHT_OUTPUT,
        ONE_DOT=False, SUM_K=k if fused_sum else 0, ZERO_CNT=0, PDL=pdl, PERSISTENT=persist,
        PDL_LATE=pdl and has_lora, TRIGGER=False, LORA_B_AHEAD=b_ahead, **common,
    )  # fmt: skip
    if direct or fused_sum:
        return out

    # top-k sum in slot order
    block_h = min(1024, triton.next_power_of_2(h))
    c3 = c2.view(t, k, h)
    _moe_sum_kernel[(t, triton.cdiv(h, block_h))](
        c3, topk_ids, out, h, e,
        c3.stride(0), c3.stride(1), c3.stride(2), out.stride(0), out.stride(1),
        TOP_K=k, BLOCK_H=block_h, PDL=pdl, num_warps=4, **pdl_launch(pdl),
    )  # fmt: skip
    return out


def _launch_gemm(
    a: torch.Tensor,
    w: torch.Tensor,
    c: torch.Tensor,
    a_desc: Any,
    b_desc: Any,
    bias: torch.Tensor | None,
    u: torch.Tensor,
    lb: torch.Tensor,
    g: GemmConfig,
    *,
    route: tuple[torch.Tensor, ...],
    lora_args: tuple[torch.Tensor, torch.Tensor, int, int],
    numel: int,
    num_experts: int,
    num_blocks: int,
    sum_args: tuple[Any, ...] | None,
    sk: tuple[torch.Tensor, torch.Tensor] | None,
    **constexprs: Any,
) -> None:
    """One grouped GEMM: ``c = epilogue(a @ w[e]^T)`` over the aligned blocks (see the kernel)."""
    n, k_dim = w.shape[1] // (2 if constexprs["GATED"] else 1), w.shape[2]
    lmap, len_, slots, rank = lora_args
    has_lora = constexprs["HAS_LORA"]
    sum_out, cnt, num_tokens, n_cnt, stride_st, stride_cnt_t, cnt_step = sum_args or (
        c, route[1], 0, 0, 0, 0, 0,
    )  # fmt: skip
    tiles = num_blocks * triton.cdiv(n, g.block_n)
    persist = constexprs["PERSISTENT"]
    grid = min(tiles, sm_count(a.device)) if persist else tiles
    _moe_gemm_kernel[(grid,)](
        a, w, c, a_desc, b_desc, bias if bias is not None else a, *route, u, lb, lmap, len_,
        sum_out, cnt, *(sk or (c, cnt)),
        n, k_dim, numel, num_experts, num_blocks, slots, rank, num_tokens, n_cnt,
        a.stride(0), a.stride(1), w.stride(0), w.stride(1), w.stride(2), c.stride(0), c.stride(1),
        *(bias.stride() if bias is not None else (0, 0)),
        *(u.stride() if has_lora else (0, 0, 0, 0)),
        *(lb.stride() if has_lora else (0, 0, 0, 0, 0)), stride_st, stride_cnt_t, cnt_step,
        A_TMA=a_desc is not None, B_TMA=b_desc is not None, HAS_BIAS=bias is not None,
        EVEN_K=k_dim % g.block_k == 0, U_SPLIT=u.shape[0] if has_lora else 1,
        BLOCK_N=g.block_n, BLOCK_K=g.block_k, GROUP_M=g.group_m,
        TAIL_N=_narrow_tail(n, g.block_n) if PERSISTENT_NARROW_N or not persist else 0,
        STREAM_K=sk is not None,
        num_warps=g.num_warps, num_stages=g.num_stages, **pdl_launch(constexprs["PDL"]),
        **constexprs,
    )  # fmt: skip


def stream_k_workspace_elems(programs: int, block_m: int, b_cols: int) -> int:
    """fp32 elements of the stream-K partial tiles: one per program."""
    return programs * block_m * b_cols


def stream_k_headroom_bytes(numel: int, n1: int, h: int, elem: int, direct: bool) -> int:
    """Bytes issue 4's budget (one ``numel x max(N1, H)`` and one ``numel x I`` buffer) leaves
    beside the call's own: its ``numel x H`` GEMM-2 output (none when k = 1, ``direct``)."""
    return numel * (max(n1, h) - (0 if direct else h)) * elem


def _stream_k_buffers(
    elems: int, programs: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Partial tiles (uninitialised) and zeroed arrival counters for stream-K tails."""
    return (
        torch.empty(elems, dtype=torch.float32, device=device),
        torch.zeros(programs, dtype=torch.int32, device=device),
    )


def _narrow_tail(n: int, block_n: int) -> int:
    """Width of the narrow last N tile (the remainder's next power of two, at least 16) when
    that is at most half a tile, else 0 (``N_TAIL_TILES``)."""
    rem = n % block_n
    width = max(16, triton.next_power_of_2(rem)) if rem else 0
    return width if N_TAIL_TILES and 2 * width <= block_n else 0


def _interleave_rows(w: torch.Tensor) -> torch.Tensor:
    """[gate; up] rows along dim 1 -> gate at even rows, up at odd rows (a new tensor)."""
    e, n1 = w.shape[0], w.shape[1]
    half = n1 // 2
    return torch.stack([w[:, :half], w[:, half:]], dim=2).reshape(e, n1, *w.shape[2:]).contiguous()


class TritonExperts(FusedMoEExperts):
    """Triton fused MoE (standard format) with multi-adapter LoRA; CUDA-graph capturable."""

    backend = "triton"
    activation_format = "standard"
    supports_lora = True

    @classmethod
    def is_available(cls) -> tuple[bool, str | None]:
        """Needs a CUDA device (or Triton's interpreter, TRITON_INTERPRET=1)."""
        return triton_runtime_available()

    def __init__(
        self,
        config: ExpertsConfig,
        w13: torch.Tensor,
        w2: torch.Tensor,
        w13_bias: torch.Tensor | None = None,
        w2_bias: torch.Tensor | None = None,
        *,
        tile_config: MoEConfig | None = None,
    ) -> None:
        super().__init__(config, w13, w2, w13_bias, w2_bias)
        self.tile_config = tile_config

    @staticmethod
    def convert_weights(
        config: ExpertsConfig,
        w13: torch.Tensor,
        w2: torch.Tensor,
        w13_bias: torch.Tensor | None = None,
        w2_bias: torch.Tensor | None = None,
    ) -> dict[str, Any]:
        """Common layout -> interleaved gated w13 (gate even rows, up odd rows); inputs untouched."""
        c = config
        check_common_layout(c, w13, w2, w13_bias, w2_bias)
        if c.gated and c.activation != "swigluoai":  # swigluoai is interleaved already
            w13 = _interleave_rows(w13)
            if w13_bias is not None:
                w13_bias = _interleave_rows(w13_bias.unsqueeze(-1)).squeeze(-1)
        return contiguous_layout(w13, w2, w13_bias, w2_bias)

    def apply(
        self,
        x: torch.Tensor,
        topk_weights: torch.Tensor,
        topk_ids: torch.Tensor,
        lora: MoELoRAContext | None = None,
    ) -> torch.Tensor:
        """Run the routed experts on ``x`` [T, H]; returns [T, H] in ``x.dtype``."""
        c, wt = self.config, self.weights
        return fused_moe_triton(
            x, wt["w13"], wt["w2"], topk_weights, topk_ids,
            activation=c.activation, gated=c.gated,
            w13_bias=wt["w13_bias"], w2_bias=wt["w2_bias"],
            apply_router_weight_on_input=c.apply_router_weight_on_input,
            lora=lora, swiglu_alpha=c.swiglu_alpha, swiglu_limit=c.swiglu_limit,
            config=self.tile_config,
        )  # fmt: skip
