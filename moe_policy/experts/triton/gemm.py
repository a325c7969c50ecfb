"""The kernels of the standard-format Triton fused MoE: the grouped GEMM and the top-k sum.

``moe_gemm_kernel`` runs both GEMMs of the layer (``fused_moe.fused_moe_triton`` launches it
twice, as ``launch.plan_launch`` says): each program maps to a (block of pairs, N tile), or,
persistent, walks tiles ``pid, pid + P, ...``; a tile is a main loop over K
(``_tile_mainloop``), the LoRA expand, and an epilogue with the gate/up split, router weight,
bias and activation (``_tile_epilogue``). ``moe_sum_kernel`` sums a token's k rows in slot
order when GEMM 2 did not.

A tile's runtime arguments travel as three tuples, unpacked where they are used:

* ``mm``: the GEMM operands, ``(a_ptr, b_ptr, a_desc, b_desc, stride_am, stride_ak,
  stride_be, stride_bn, stride_bk)``;
* ``ep``: the epilogue's, ``(c_ptr, bias_ptr, topk_w_ptr, stride_cm, stride_cn,
  stride_bias_e, stride_bias_n)``;
* ``lo``: the LoRA expand's, ``(u_ptr, b_ptr, map_ptr, enabled_ptr, num_slots, rank,
  stride_uk, stride_us, stride_um, stride_ur, stride_lbs, stride_lbl, stride_lbe, stride_lbn,
  stride_lbr)``;

and the alignment's as ``al``: ``(sorted_ids_ptr, expert_ids_ptr, num_padded_ptr,
block_rows_ptr, topk_ids_ptr, numel, num_experts)``. The constexprs that every tile of a launch
shares travel as one constexpr tuple ``TILE`` (``moe_gemm_kernel`` documents its order); a tile's
own (``A_TMA``, ``B_TMA``, its rows and columns) are passed beside it.
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from moe_policy.experts.triton.align import block_pairs
from moe_policy.experts.triton.jit import activation
from moe_policy.experts.triton.lora import lora_b_ahead, lora_expand_loop, lora_slots


@triton.jit
def _tile_mainloop(
    pairs,
    expert,
    row0,
    n0,
    mm,
    N,
    K,
    numel,
    kk_lo,  # first and end BLOCK_K step of the K range (stream-K parts take a share)
    kk_hi,
    TILE: tl.constexpr,
    A_TMA: tl.constexpr,
    B_TMA: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """fp32 accumulators of one tile over K steps ``[kk_lo, kk_hi)``: ``[BLOCK_M, B_COLS]`` and,
    in the two-dot gated form, the up rows' ``[BLOCK_M, BLOCK_N]`` (zeros otherwise)."""
    A_ROW_DIV: tl.constexpr = TILE[0]
    A_SORTED: tl.constexpr = TILE[1]
    GATED: tl.constexpr = TILE[5]
    ONE_DOT: tl.constexpr = TILE[12]
    EVEN_K: tl.constexpr = TILE[13]
    BLOCK_K: tl.constexpr = TILE[14]
    a_ptr, b_ptr, a_desc, b_desc, stride_am, stride_ak, stride_be, stride_bn, stride_bk = mm
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
    ep,
    N,
    numel,
    TILE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """Gate/up split, router weight, bias and activation on a tile's accumulators; store."""
    C_SORTED: tl.constexpr = TILE[2]
    C_ROW_DIV: tl.constexpr = TILE[3]
    GATED: tl.constexpr = TILE[5]
    ACT: tl.constexpr = TILE[6]
    ALPHA: tl.constexpr = TILE[7]
    LIMIT: tl.constexpr = TILE[8]
    WEIGHT_POS: tl.constexpr = TILE[9]
    HAS_BIAS: tl.constexpr = TILE[10]
    ONE_DOT: tl.constexpr = TILE[12]
    c_ptr, bias_ptr, topk_w_ptr, stride_cm, stride_cn, stride_bias_e, stride_bias_n = ep
    pair_mask = pairs < numel
    offs_n = n0 + tl.arange(0, BLOCK_N)
    offs_bn = offs_n % N
    if GATED and ONE_DOT:  # even columns are gate, odd columns up
        acc, acc_u = tl.split(tl.reshape(acc_b, (BLOCK_M, BLOCK_N, 2)))
    else:
        acc = acc_b

    # router weight, bias, activation (the order of the reference)
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
        acc = activation(acc, acc_u, ALPHA, LIMIT, ACT, GATED)
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
    pairs,  # [TILE_M] pair of each row, numel = padding
    expert,
    row0,  # first row of the block in the unpadded expert-sorted order
    n0,  # first output column of the tile
    mm,
    ep,
    lo,
    N,
    K,
    numel,
    TILE: tl.constexpr,
    A_TMA: tl.constexpr,  # the tile's own: a short or narrow tile loads by pointers
    B_TMA: tl.constexpr,
    TILE_M: tl.constexpr,
    TILE_N: tl.constexpr,
):
    """One ``TILE_M x TILE_N`` tile of one expert's GEMM with the fused epilogue."""
    TOP_K: tl.constexpr = TILE[4]
    GATED: tl.constexpr = TILE[5]
    HAS_LORA: tl.constexpr = TILE[11]
    ONE_DOT: tl.constexpr = TILE[12]
    BLOCK_K: tl.constexpr = TILE[14]
    BLOCK_R: tl.constexpr = TILE[15]
    U_SPLIT: tl.constexpr = TILE[16]
    RANK_MASK: tl.constexpr = TILE[17]
    WAIT_LORA: tl.constexpr = TILE[18]  # dependent launch: wait for the shrink output only here
    LORA_B_AHEAD: tl.constexpr = TILE[19]  # LoRA B tiles of the lowest/highest slot, ahead
    pair_mask = pairs < numel

    # LoRA: slot of each row and, per accumulator column, its output column and slice (a
    # one-dot gated tile interleaves gate and up)
    if HAS_LORA:
        (lu_ptr, lb_ptr, lmap_ptr, len_ptr, num_slots, rank, stride_uk, stride_us, stride_um,
         stride_ur, stride_lbs, stride_lbl, stride_lbe, stride_lbn, stride_lbr) = lo  # fmt: skip
        slot = lora_slots(pairs, pair_mask, lmap_ptr, len_ptr, num_slots, TOP_K)
        if GATED and ONE_DOT:
            cols_lb = tl.arange(0, 2 * TILE_N)
            n_lb = (n0 + cols_lb // 2) % N
            slice_lb = cols_lb % 2
        else:
            n_lb = (n0 + tl.arange(0, TILE_N)) % N
            slice_lb = n_lb * 0
        dt = mm[1].dtype.element_ty  # B's: the compute dtype
        if LORA_B_AHEAD:
            s_lo, s_hi, b_lo, b_hi = lora_b_ahead(
                slot, expert, n_lb, slice_lb, lb_ptr, num_slots, rank,
                stride_lbs, stride_lbl, stride_lbe, stride_lbn, stride_lbr,
                BLOCK_R, 2 if (GATED and ONE_DOT) else 1, dt, RANK_MASK,
            )  # fmt: skip
        else:
            s_lo = 0
            s_hi = -1
            b_lo = 0.0
            b_hi = 0.0

    acc_b, acc_u = _tile_mainloop(
        pairs, expert, row0, n0, mm, N, K, numel, 0, tl.cdiv(K, BLOCK_K), TILE, A_TMA, B_TMA,
        TILE_M, TILE_N,
    )  # fmt: skip
    # LoRA delta u @ B^T for rows with an adapter (exactly zero for the others), one small dot
    # per slot present, into the accumulators as the MMA left them (before a one-dot tile's
    # gate/up split)
    if WAIT_LORA:
        gdc_wait()
    if HAS_LORA:
        acc_b = lora_expand_loop(
            acc_b, slot, pairs, n_lb, slice_lb, expert, lu_ptr, lb_ptr,
            num_slots, rank, stride_uk, stride_us, stride_um, stride_ur,
            stride_lbs, stride_lbl, stride_lbe, stride_lbn, stride_lbr, s_lo, s_hi, b_lo, b_hi,
            BLOCK_R, 2 if (GATED and ONE_DOT) else 1, U_SPLIT, dt, RANK_MASK, LORA_B_AHEAD,
        )  # fmt: skip
        if GATED and not ONE_DOT:  # (the tiles ahead are the gate slice's: not used here)
            acc_u = lora_expand_loop(
                acc_u, slot, pairs, n_lb, slice_lb, expert, lu_ptr + stride_us,
                lb_ptr + stride_lbs, num_slots, rank,
                stride_uk, stride_us, stride_um, stride_ur,
                stride_lbs, stride_lbl, stride_lbe, stride_lbn, stride_lbr, s_lo, s_hi, b_lo, b_hi,
                BLOCK_R, 1, U_SPLIT, dt, RANK_MASK, False,
            )  # fmt: skip
    _tile_epilogue(acc_b, acc_u, pairs, expert, row0, n0, ep, N, numel, TILE, TILE_M, TILE_N)


@triton.jit
def _block(tile_m, al, BLOCK_M: tl.constexpr, NAIVE: tl.constexpr):
    """(pairs, expert, live, row0) of M block ``tile_m`` (``align.block_pairs``)."""
    sorted_ids_ptr, expert_ids_ptr, num_padded_ptr, block_rows_ptr, topk_ids_ptr, numel, e = al
    return block_pairs(
        tile_m, sorted_ids_ptr, expert_ids_ptr, num_padded_ptr, block_rows_ptr, topk_ids_ptr,
        numel, e, BLOCK_M, NAIVE,
    )  # fmt: skip


@triton.jit(do_not_specialize=["numel", "num_blocks", "num_slots", "lora_rank"])
def moe_gemm_kernel(
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
    ACT: tl.constexpr,  # jit.ACTIVATION_CODES value, 0 = none
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
    pairs sums their rows in slot order (as ``moe_sum_kernel``) and overwrites the tile,
    counter included. No extra buffer, no state across calls, no launch for the sum."""
    mm = (a_ptr, b_ptr, a_desc, b_desc, stride_am, stride_ak, stride_be, stride_bn, stride_bk)
    ep = (c_ptr, bias_ptr, topk_w_ptr, stride_cm, stride_cn, stride_bias_e, stride_bias_n)
    lo = (lora_u_ptr, lora_b_ptr, lora_map_ptr, lora_enabled_ptr, num_slots, lora_rank,
          stride_uk, stride_us, stride_um, stride_ur,
          stride_lbs, stride_lbl, stride_lbe, stride_lbn, stride_lbr)  # fmt: skip
    al = (sorted_ids_ptr, expert_ids_ptr, num_padded_ptr, block_rows_ptr, topk_ids_ptr, numel,
          num_experts)  # fmt: skip
    sums = (c_ptr, sum_ptr, cnt_ptr, topk_ids_ptr, N, num_experts, stride_cm, stride_cn,
            stride_st, stride_cnt_t, cnt_step)  # fmt: skip
    # the constexprs every tile shares, in this order (the helpers take them by index)
    TILE: tl.constexpr = (
        A_ROW_DIV, A_SORTED, C_SORTED, C_ROW_DIV, TOP_K, GATED, ACT, ALPHA, LIMIT,  # 0-8
        WEIGHT_POS, HAS_BIAS, HAS_LORA, ONE_DOT, EVEN_K, BLOCK_K, BLOCK_R, U_SPLIT,  # 9-16
        RANK_MASK, PDL_LATE, LORA_B_AHEAD,  # 17-19
    )  # fmt: skip
    if PDL and not PDL_LATE:
        gdc_wait()
    if TRIGGER:
        gdc_launch_dependents()
    pid = tl.program_id(0)
    if PERSISTENT:
        # program p of P walks tiles p, p + P, ... of the live blocks (grouped as below); the
        # tile loop and the K loop are flattened into one pipelined loop, so the next tile's
        # loads are in flight during this tile's epilogue
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
            pairs_p, expert_p, _, row0_p = _block(tile_m, al, BLOCK_M, False)
            _moe_tile(pairs_p, expert_p, row0_p, tile_n * BLOCK_N, mm, ep, lo, N, K, numel,
                      TILE, A_TMA, B_TMA, BLOCK_M, BLOCK_N)  # fmt: skip
        if STREAM_K:
            _stream_k_tail(
                pid, num_p, n_round, live_m * n_full - n_round, live_m, n_full,
                mm, ep, al, sk_ws_ptr, sk_cnt_ptr, N, K, numel, TILE, A_TMA, B_TMA,
                BLOCK_M, BLOCK_N, GROUP_M,
            )  # fmt: skip
        if TAIL_N > 0:
            # narrow tiles continue the round robin where the full ones stopped, so programs
            # that had one full tile fewer take them first (all alike after a stream-K tail)
            first = (pid + num_p - n_round % num_p) % num_p
            for tile_m in range(first, live_m, num_p):
                pairs_p, expert_p, _, row0_p = _block(tile_m, al, BLOCK_M, False)
                _moe_tile(pairs_p, expert_p, row0_p, n_full * BLOCK_N, mm, ep, lo, N, K, numel,
                          TILE, A_TMA, False, BLOCK_M, TAIL_N)  # fmt: skip
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
    # program -> (block of pairs, N tile), grouped so that GROUP_M blocks share B tiles in L2
    num_pid_n = tl.cdiv(N, BLOCK_N)
    pid_m, pid_n = _grouped_tile(pid, num_blocks, N, BLOCK_N, GROUP_M)
    pairs, expert, live, row0 = _block(pid_m, al, BLOCK_M, NAIVE)
    if not live:
        if PDL_LATE:  # every program waits, so the kernel ends after its predecessor
            gdc_wait()
        if SUM_K > 0:  # an invalid expert still counts as arrived
            _sum_when_last(pid_m, pid_n, sums, SUM_K, BLOCK_N)
        return
    # the tile of this program: a short one for a block of at most TAIL_M real rows (they come
    # first in a block, so it takes the block's first rows), a narrow one for the last N tile
    # when that holds at most half a tile of columns, else the full tile
    if TAIL_M > 0:  # noqa: SIM102 (constexpr test: the short tile is compiled only when on)
        if tl.sum((pairs < numel).to(tl.int32), 0) <= TAIL_M:
            pairs_t = tl.load(sorted_ids_ptr + pid_m * BLOCK_M + tl.arange(0, TAIL_M))
            _moe_tile(pairs_t, expert, row0, pid_n * BLOCK_N, mm, ep, lo, N, K, numel,
                      TILE, False, B_TMA, TAIL_M, BLOCK_N)  # fmt: skip
            return
    if TAIL_N > 0:  # noqa: SIM102 (constexpr test: the narrow tile is compiled only when on)
        if pid_n == num_pid_n - 1:
            _moe_tile(pairs, expert, row0, pid_n * BLOCK_N, mm, ep, lo, N, K, numel,
                      TILE, A_TMA, False, BLOCK_M, TAIL_N)  # fmt: skip
            if SUM_K > 0:
                _sum_when_last(pid_m, pid_n, sums, SUM_K, BLOCK_N)
            return
    _moe_tile(pairs, expert, row0, pid_n * BLOCK_N, mm, ep, lo, N, K, numel,
              TILE, A_TMA, B_TMA, BLOCK_M, BLOCK_N)  # fmt: skip
    if SUM_K > 0:
        _sum_when_last(pid_m, pid_n, sums, SUM_K, BLOCK_N)


@triton.jit
def _stream_k_tail(
    pid,
    num_p,
    first_tile,  # tiles before this one ran whole, one per program
    n_tiles,  # tiles left, fewer than programs
    live_m,
    n_full,
    mm,
    ep,
    al,
    ws_ptr,  # [num_p, BLOCK_M, B_COLS] fp32
    cnt_ptr,  # [num_p] int32, zero on entry; left zero
    N,
    K,
    numel,
    TILE: tl.constexpr,
    A_TMA: tl.constexpr,
    B_TMA: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    GROUP_M: tl.constexpr,
):
    """The last, partial round of tiles (fewer than programs), split along K into ``S`` equal
    parts, ``S = programs // tiles``: program ``s * tiles + j`` runs part ``s`` of tile ``j``,
    so the programs of one N column of a group run the same K range together and share the
    expert's weight tiles in L2. With ``S`` = 1 each tile runs whole. Split tiles: every part
    stores its partial sums, and the last to arrive adds the ``S`` parts in order
    (deterministic) and runs the epilogue; no program waits on another (the interpreter runs
    programs one by one)."""
    GATED: tl.constexpr = TILE[5]
    ONE_DOT: tl.constexpr = TILE[12]
    BLOCK_K: tl.constexpr = TILE[14]
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
        pairs, expert, _, row0 = _block(tile_m, al, BLOCK_M, False)
        acc_b, acc_u = _tile_mainloop(
            pairs, expert, row0, tile_n * BLOCK_N, mm, N, K, numel, lo, hi, TILE, A_TMA, B_TMA,
            BLOCK_M, BLOCK_N,
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
            _tile_epilogue(acc_b, acc_u, pairs, expert, row0, tile_n * BLOCK_N, ep, N, numel, TILE,
                           BLOCK_M, BLOCK_N)  # fmt: skip


@triton.jit
def _grouped_tile(tile, num_m, N, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """Tile -> (M block, N tile), GROUP_M blocks at a time, so that they share B tiles in L2."""
    tiles_in_group = GROUP_M * tl.cdiv(N, BLOCK_N)
    first_m = (tile // tiles_in_group) * GROUP_M
    size_m = min(num_m - first_m, GROUP_M)
    return first_m + ((tile % tiles_in_group) % size_m), (tile % tiles_in_group) // size_m


@triton.jit
def _sum_when_last(pair, pid_n, sums, TOP_K: tl.constexpr, BLOCK_N: tl.constexpr):
    """Count ``pair`` in at its token's N tile; the token's last pair writes the top-k sum.

    ``sums``: ``(c_ptr, sum_ptr, cnt_ptr, topk_ids_ptr, N, num_experts, stride_cm, stride_cn,
    stride_st, stride_cnt_t, cnt_step)``. The CTA barrier orders every thread's stores of the
    tile before the counter's release; the last arriver's acquire orders the other pairs' rows
    before its loads, which bypass L1."""
    (c_ptr, sum_ptr, cnt_ptr, topk_ids_ptr, N, num_experts, stride_cm, stride_cn, stride_st,
     stride_cnt_t, cnt_step) = sums  # fmt: skip
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
def moe_sum_kernel(
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
