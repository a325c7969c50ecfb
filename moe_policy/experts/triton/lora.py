"""Multi-adapter LoRA for the Triton fused MoE: a shrink kernel and an expand fused into the GEMMs.

Math, per (token, slot) pair ``i`` with token ``t = i // k``, expert ``e`` and adapter slot
``l = token_lora_mapping[t]`` (``-1`` or a disabled slot = no adapter)::

    shrink:  u[s, i, :] = A[s, l, e] @ a_i                 # [R]; a_i = x[t] (w13) or i's act row (w2)
    expand:  acc[i, n] += sum_r u[s, i, r] * B[s, l, e, n, r]   # inside the GEMM epilogue

Layout (``lora.py``): ``w13_a [S, L, E, R, H]``, ``w13_b [S, L, E, I, R]``, ``w2_a [L, E, R, I]``,
``w2_b [L, E, H, R]``; ``enabled [L]`` int32; ``u`` is ``[S, numel, R]`` float32. The shrink
uses "slot-expanded" columns: column ``c`` of a ``[BLOCK_M, L*R]`` tile stands for (slot
``c // R``, rank ``c % R``), so one dot serves every adapter of a block and each row keeps its
own slot's columns; it reuses the MoE alignment (blocks of one expert) and grid axis 1 splits
``L*R`` into chunks of at most 64 columns (one chunk for 4 adapters of rank 16). The expand, in
the GEMM epilogue, is one small dot per slot present in the block (faster than a slot-expanded
dot, whose wide operands spill or stall the pipeline). A and B rows of slots absent from a block
are not read.
Rows without an adapter are never written in ``u`` and never read: their delta is exactly zero.

Limits: ``S`` in {1, 2}; rank ``R`` <= 128 (padded to a power of two >= 16 in registers);
the expand adds ``u`` (cast to the compute dtype) times ``B`` with fp32 accumulation.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from moe_policy.experts.triton.align import block_pairs
from moe_policy.experts.triton.config import SMEM_LIMIT
from moe_policy.experts.triton.device import pdl_launch
from moe_policy.experts.triton.workspace import Alloc, fresh

#: Largest supported max rank.
MAX_RANK = 128


@triton.jit
def lora_slots(
    pairs,
    pair_mask,
    # pointers
    lora_map_ptr,  # [T] int32 slot per token
    lora_enabled_ptr,  # [L] int32
    num_slots,  # L
    # constexpr
    TOP_K: tl.constexpr,  # pairs per token
):
    """Adapter slot of each pair row, ``-1`` when none, outside ``[0, L)`` or disabled."""
    slot = tl.load(lora_map_ptr + pairs // TOP_K, mask=pair_mask, other=-1)
    on = tl.load(lora_enabled_ptr + slot, mask=(slot >= 0) & (slot < num_slots), other=0)
    return tl.where(on != 0, slot, -1)


def lora_block_sizes(rank: int, num_slots: int) -> tuple[int, int, int]:
    """(BLOCK_R, LR_BLOCK, chunks): padded rank, slot-expanded columns per chunk, chunk count."""
    block_r = max(16, triton.next_power_of_2(rank))
    total = triton.next_power_of_2(max(1, num_slots)) * block_r
    lr_block = max(block_r, min(total, 64))
    return block_r, lr_block, triton.cdiv(num_slots * block_r, lr_block)


@triton.jit
def _lora_b_tile(
    expert,
    offs_n,
    col_slice,
    lb_ptr,
    rank,
    stride_lbs,
    stride_lbe,
    stride_lbn,
    stride_lbr,
    BLOCK_R: tl.constexpr,
    NUM_SLICES: tl.constexpr,
    RANK_MASK: tl.constexpr,
):
    """Pointers (slot 0) and mask of the ``[NUM_SLICES * BLOCK_R, BLOCK_N]`` B tile of
    ``expert`` (add ``slot * stride_lbl`` for a slot)."""
    q = tl.arange(0, NUM_SLICES * BLOCK_R)
    q_slice = q // BLOCK_R
    q_r = q % BLOCK_R
    b_ptrs = lb_ptr + expert.to(tl.int64) * stride_lbe
    b_ptrs += (q_slice * stride_lbs + q_r * stride_lbr)[:, None] + offs_n[None, :] * stride_lbn
    # one slice: q_slice is all zero, a mask constant along K (two: B is zero across slices)
    b_mask = q_slice[:, None] == col_slice[None, :] if NUM_SLICES == 2 else (q_slice == 0)[:, None]
    if RANK_MASK:
        b_mask = b_mask & (q_r < rank)[:, None]
    return b_ptrs, b_mask


@triton.jit
def lora_b_ahead(
    slot,
    expert,
    offs_n,
    col_slice,
    lb_ptr,
    num_slots,
    rank,
    stride_lbs,
    stride_lbl,
    stride_lbe,
    stride_lbn,
    stride_lbr,
    BLOCK_R: tl.constexpr,
    NUM_SLICES: tl.constexpr,
    DTYPE: tl.constexpr,
    RANK_MASK: tl.constexpr,
):
    """The B tiles of the lowest and the highest slot present in the block, loaded before the
    main loop so that their latency hides behind it: ``(s_lo, s_hi, b_lo, b_hi)``; ``s_lo`` is
    ``num_slots`` and ``s_hi`` -1 when no row has an adapter (the tiles, loaded from a valid
    slot, then go unused)."""
    s_lo = tl.min(tl.where(slot >= 0, slot, num_slots), 0)
    s_hi = tl.max(slot, 0)
    b_ptrs, b_mask = _lora_b_tile(
        expert, offs_n, col_slice, lb_ptr, rank, stride_lbs, stride_lbe, stride_lbn, stride_lbr,
        BLOCK_R, NUM_SLICES, RANK_MASK,
    )  # fmt: skip
    b_lo = tl.load(b_ptrs + tl.minimum(s_lo, num_slots - 1) * stride_lbl, mask=b_mask, other=0.0)
    b_hi = tl.load(b_ptrs + tl.maximum(s_hi, 0) * stride_lbl, mask=b_mask, other=0.0)
    return s_lo, s_hi, b_lo.to(DTYPE), b_hi.to(DTYPE)


@triton.jit
def _slot_dot(acc, u, slot, sid, b, DTYPE: tl.constexpr):
    """``acc + u @ b`` over the rows of slot ``sid`` (skipped when the block has none)."""
    sel = slot == sid
    if tl.sum(sel.to(tl.int32), 0) > 0:
        acc = tl.dot(tl.where(sel[:, None], u, 0.0).to(DTYPE), b, acc)
    return acc


@triton.jit
def lora_expand_loop(
    acc,
    slot,
    pairs,
    offs_n,
    col_slice,
    expert,
    # pointers
    u_ptr,  # [U_SPLIT, S, numel, R] float32 shrink output, first slice of this call
    lb_ptr,  # B, [S, L, E, N, R], first slice of this call
    # sizes
    num_slots,
    rank,
    # strides
    stride_uk,
    stride_us,
    stride_um,
    stride_ur,
    stride_lbs,
    stride_lbl,
    stride_lbe,
    stride_lbn,
    stride_lbr,
    # B tiles loaded ahead (lora_b_ahead; used when B_AHEAD)
    s_lo,
    s_hi,
    b_lo,
    b_hi,
    # constexpr
    BLOCK_R: tl.constexpr,
    NUM_SLICES: tl.constexpr,  # 2: acc columns interleave two slices (col_slice says which)
    U_SPLIT: tl.constexpr,
    DTYPE: tl.constexpr,  # compute dtype of the dot
    RANK_MASK: tl.constexpr,  # rank < BLOCK_R: mask the padding ranks
    B_AHEAD: tl.constexpr,  # the lowest and highest slots' B tiles come in b_lo / b_hi
):
    """``acc + u @ B[slot, expert]^T`` for rows with an adapter: one small dot per slot present.

    Accumulator column ``c`` is output column ``offs_n[c]`` of slice ``col_slice[c]``; with two
    slices the dot's K axis holds one slice's ranks, then the other's, and B is zero where the
    slices differ, so a one-dot gated tile takes its gate and up deltas in its own accumulator
    layout (before the gate/up split). Ranks are contiguous along K and the masks are constant
    along runs of them, so u and B load as vectors."""
    q = tl.arange(0, NUM_SLICES * BLOCK_R)
    q_slice = q // BLOCK_R
    q_r = q % BLOCK_R
    u_mask = (slot >= 0)[:, None]
    u_ptrs = u_ptr + pairs.to(tl.int64)[:, None] * stride_um
    u_ptrs += (q_slice * stride_us + q_r * stride_ur)[None, :]
    if RANK_MASK:
        u_mask = u_mask & (q_r < rank)[None, :]
    b_ptrs, b_mask = _lora_b_tile(
        expert, offs_n, col_slice, lb_ptr, rank, stride_lbs, stride_lbe, stride_lbn, stride_lbr,
        BLOCK_R, NUM_SLICES, RANK_MASK,
    )  # fmt: skip
    u = tl.load(u_ptrs, mask=u_mask, other=0.0)
    for sp in tl.static_range(1, U_SPLIT):
        u += tl.load(u_ptrs + sp * stride_uk, mask=u_mask, other=0.0)
    if B_AHEAD:  # blocks ordered by adapter hold one or two slots: both tiles are here
        acc = _slot_dot(acc, u, slot, s_lo, b_lo, DTYPE)
        if s_hi > s_lo:
            acc = _slot_dot(acc, u, slot, s_hi, b_hi, DTYPE)
        first = s_lo + 1
        last = s_hi
    else:
        first = 0
        last = num_slots
    for sid in range(first, last):  # slots in between: B loaded here, when present
        sel = slot == sid
        if tl.sum(sel.to(tl.int32), 0) > 0:
            b_s = tl.load(b_ptrs + sid * stride_lbl, mask=b_mask, other=0.0).to(DTYPE)
            acc = tl.dot(tl.where(sel[:, None], u, 0.0).to(DTYPE), b_s, acc)
    return acc


@triton.jit
def _own_slot_columns(
    acc, hit, BLOCK_M: tl.constexpr, LR_BLOCK: tl.constexpr, BLOCK_R: tl.constexpr
):
    """[BLOCK_M, LR_BLOCK] slot-expanded columns -> [BLOCK_M, BLOCK_R]: each row's own slot."""
    if LR_BLOCK == BLOCK_R:
        return acc
    own = tl.where(hit, acc, 0.0)
    return tl.sum(tl.reshape(own, (BLOCK_M, LR_BLOCK // BLOCK_R, BLOCK_R)), axis=1)


def shrink_tiles(
    block_m: int, k_dim: int, a_cols: int, elem: int, smem_limit: int = SMEM_LIMIT
) -> tuple[int, int]:
    """(BLOCK_K, stages) of the LoRA shrink: 128-wide K steps for blocks of up to 64 rows, 64
    above, 3 stages; fewer stages (down to 2), then narrower K steps (down to 16), while a
    stage's activation rows and ``a_cols`` A columns of ``elem`` bytes, times the stages, exceed
    ``smem_limit``. Cut only in fp32 or on a part with less than Hopper's shared memory: bf16
    decode blocks take 3 x 36 KB, 128-row blocks 3 x 32 KB; fp32 decode blocks 3 x 72 KB."""
    block_k = max(16, min(128 if block_m <= 64 else 64, triton.next_power_of_2(k_dim)))
    stages = 3
    while stages * (block_m + a_cols) * block_k * elem > smem_limit:
        if stages > 2:
            stages -= 1
        elif block_k > 16:
            block_k //= 2
        else:
            break
    return block_k, stages


@triton.jit(do_not_specialize=["numel", "rank", "num_slots"])
def lora_shrink_kernel(
    # pointers
    a_ptr,  # activations: x [T, K] (w13) or act [numel, K] (w2)
    la_ptr,  # A: [S, L, E, R, K]
    u_ptr,  # out: [S, numel, R] float32
    topk_ids_ptr,
    sorted_ids_ptr,
    expert_ids_ptr,
    num_padded_ptr,
    block_rows_ptr,
    lora_map_ptr,
    lora_enabled_ptr,
    # sizes
    K,
    numel,
    num_experts,
    rank,
    num_slots,
    # strides (elements between neighbours along each dimension)
    stride_am,
    stride_ak,
    stride_las,
    stride_lal,
    stride_lae,
    stride_lar,
    stride_lak,
    stride_uk,
    stride_us,
    stride_um,
    stride_ur,
    # constexpr
    A_ROW_DIV: tl.constexpr,  # activation row = pair // A_ROW_DIV (top_k for x)
    A_SORTED: tl.constexpr,  # activation rows in expert-sorted order (act): block_rows + r
    TOP_K: tl.constexpr,  # pairs per token (for the token -> slot mapping)
    NUM_SLICES: tl.constexpr,
    NAIVE: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_R: tl.constexpr,
    LR_BLOCK: tl.constexpr,  # slot-expanded columns of this program (grid axis 1 = chunk)
    BLOCK_K: tl.constexpr,
    K_STEPS: tl.constexpr,  # BLOCK_K steps per program; grid axis 2 = split-K part
    RANK_MASK: tl.constexpr,  # rank < BLOCK_R: padding ranks are not stored
    PDL: tl.constexpr,  # launched as a programmatic dependent: wait before the first read
    TRIGGER: tl.constexpr,  # then let the next kernel (a GEMM waiting late) launch at once
):
    """u[s, pair] = a[row] @ A[s, slot, expert]^T for the block's rows whose slot is in the chunk."""
    if PDL:
        gdc_wait()
    if TRIGGER:
        gdc_launch_dependents()
    # block -> pairs, expert and slots; exit when no row's slot is in this chunk
    pid_m = tl.program_id(0)
    c0 = tl.program_id(1) * LR_BLOCK
    part = tl.program_id(2)
    pairs, expert, live, row0 = block_pairs(
        pid_m, sorted_ids_ptr, expert_ids_ptr, num_padded_ptr, block_rows_ptr, topk_ids_ptr,
        numel, num_experts, BLOCK_M, NAIVE,
    )  # fmt: skip
    if not live:
        return
    pair_mask = pairs < numel
    slot = lora_slots(pairs, pair_mask, lora_map_ptr, lora_enabled_ptr, num_slots, TOP_K)
    rows = pair_mask & (slot >= c0 // BLOCK_R) & (slot < (c0 + LR_BLOCK) // BLOCK_R)
    if tl.sum(rows.to(tl.int32), 0) == 0:
        return
    # slot-expanded columns: (slot c // BLOCK_R, rank index c % BLOCK_R), used ones only
    cols = c0 + tl.arange(0, LR_BLOCK)
    col_slot = cols // BLOCK_R
    col_r = cols % BLOCK_R
    hit = (slot[:, None] == col_slot[None, :]) & (col_r < rank)[None, :]
    col_ok = tl.max(hit.to(tl.int32), 0) > 0
    # pointers to the activation rows and to A[s, col_slot, expert, col_r, :] read as [K, cols]
    k0 = part * K_STEPS * BLOCK_K
    offs_k = tl.arange(0, BLOCK_K)
    if A_SORTED:
        a_rows = row0.to(tl.int64) + tl.arange(0, BLOCK_M)
    else:
        a_rows = (pairs // A_ROW_DIV).to(tl.int64)
    a_ptrs = a_ptr + a_rows[:, None] * stride_am + (k0 + offs_k)[None, :] * stride_ak
    la_ptrs = la_ptr + expert.to(tl.int64) * stride_lae + col_slot[None, :] * stride_lal
    la_ptrs += col_r[None, :] * stride_lar + (k0 + offs_k)[:, None] * stride_lak
    # accumulate over K in fp32, one accumulator per slice
    acc0 = tl.zeros((BLOCK_M, LR_BLOCK), dtype=tl.float32)
    acc1 = tl.zeros((BLOCK_M, LR_BLOCK), dtype=tl.float32)
    for kk in range(0, K_STEPS):
        k_mask = offs_k < K - k0 - kk * BLOCK_K
        a = tl.load(a_ptrs, mask=rows[:, None] & k_mask[None, :], other=0.0)
        w_mask = k_mask[:, None] & col_ok[None, :]
        w0 = tl.load(la_ptrs, mask=w_mask, other=0.0)
        acc0 = tl.dot(a, w0.to(a.dtype), acc0)
        if NUM_SLICES == 2:
            w1 = tl.load(la_ptrs + stride_las, mask=w_mask, other=0.0)
            acc1 = tl.dot(a, w1.to(a.dtype), acc1)
        a_ptrs += BLOCK_K * stride_ak
        la_ptrs += BLOCK_K * stride_lak
    # each row keeps the columns of its own slot (this split-K part's partial sum), gathered
    # into BLOCK_R columns so that the store is one row-masked vector store per row
    offs_r = tl.arange(0, BLOCK_R)
    u_ptrs = u_ptr + part * stride_uk + pairs.to(tl.int64)[:, None] * stride_um
    u_ptrs += offs_r[None, :] * stride_ur
    u_mask = rows[:, None]
    if RANK_MASK:
        u_mask = u_mask & (offs_r < rank)[None, :]
    tl.store(u_ptrs, _own_slot_columns(acc0, hit, BLOCK_M, LR_BLOCK, BLOCK_R), mask=u_mask)
    if NUM_SLICES == 2:
        u1 = _own_slot_columns(acc1, hit, BLOCK_M, LR_BLOCK, BLOCK_R)
        tl.store(u_ptrs + stride_us, u1, mask=u_mask)


def lora_shrink(
    a: torch.Tensor,
    lora_a: torch.Tensor,
    *,
    topk_ids: torch.Tensor,
    sorted_ids: torch.Tensor,
    expert_ids: torch.Tensor,
    num_padded: torch.Tensor,
    block_rows: torch.Tensor,
    lora_map: torch.Tensor,
    lora_enabled: torch.Tensor,
    num_blocks: int,
    block_m: int,
    naive: bool,
    a_row_div: int = 1,
    a_sorted: bool = False,
    split_k: int = 1,
    alloc: Alloc | None = None,
    pdl: bool = False,
    trigger: bool = False,
    smem_limit: int = SMEM_LIMIT,
) -> torch.Tensor:
    """Shrink ``a`` by ``lora_a`` ([S, L, E, R, K]); returns u [split_k, S, numel, R] fp32.

    ``a`` rows are tokens (``pair // a_row_div``) or, with ``a_sorted``, pairs in the unpadded
    expert-sorted order of the alignment (GEMM 1's output). With ``split_k > 1`` each part
    holds a partial sum over a slice of K (the expand adds them in order); used when there are
    too few blocks to fill the GPU (decode). ``pdl``: launched as a dependent that waits on its
    predecessor first; ``trigger``: then lets the next kernel launch at once (a GEMM that waits
    for this output only before its expand). Its tiles are cut to ``smem_limit`` bytes of shared
    memory (``shrink_tiles``)."""
    if lora_a.dim() != 5:
        raise ValueError(f"lora_a must be [S, L, E, R, K], got shape {tuple(lora_a.shape)}")
    s, slots, num_experts, rank, k_dim = lora_a.shape
    if a.dim() != 2 or a.shape[1] != k_dim:
        raise ValueError(
            f"activations {tuple(a.shape)} do not match lora_a {tuple(lora_a.shape)} (K={k_dim})"
        )
    if s not in (1, 2) or rank > MAX_RANK:
        raise ValueError(f"lora_a has {s} slices and rank {rank}; expected 1-2 and <= {MAX_RANK}")
    top_k = topk_ids.shape[1]
    numel = topk_ids.numel()
    block_r, lr_block, chunks = lora_block_sizes(rank, slots)
    block_k, stages = shrink_tiles(block_m, k_dim, s * lr_block, a.element_size(), smem_limit)
    steps = triton.cdiv(k_dim, block_k)
    k_steps = triton.cdiv(steps, max(1, min(split_k, steps)))
    parts = triton.cdiv(steps, k_steps)
    u = (alloc or fresh(a.device))((parts, s, numel, rank), torch.float32)
    if numel == 0 or slots == 0:
        return u
    lora_shrink_kernel[(num_blocks, chunks, parts)](
        a, lora_a, u, topk_ids, sorted_ids, expert_ids, num_padded, block_rows,
        lora_map, lora_enabled,
        k_dim, numel, num_experts, rank, slots,
        a.stride(0), a.stride(1),
        lora_a.stride(0), lora_a.stride(1), lora_a.stride(2), lora_a.stride(3), lora_a.stride(4),
        u.stride(0), u.stride(1), u.stride(2), u.stride(3),
        A_ROW_DIV=a_row_div, A_SORTED=a_sorted, TOP_K=top_k, NUM_SLICES=s, NAIVE=naive,
        BLOCK_M=block_m, BLOCK_R=block_r, LR_BLOCK=lr_block, BLOCK_K=block_k, K_STEPS=k_steps,
        RANK_MASK=rank < block_r, PDL=pdl, TRIGGER=trigger,
        num_warps=4 if block_m <= 64 else 8, num_stages=stages, **pdl_launch(pdl),
    )  # fmt: skip
    return u
