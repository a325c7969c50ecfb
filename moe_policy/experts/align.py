"""Token/expert alignment on the GPU for the Triton fused-MoE kernels.

Math. ``topk_ids`` ``[T, k]`` is read as ``numel = T*k`` (token, slot) pairs; pair ``i``
belongs to token ``i // k`` and expert ``e_i = topk_ids.flat[i]``. The pairs are grouped by
expert and each expert's group is padded up to a multiple of ``BLOCK_M``::

    padded[e]      = ceil(count[e] / BLOCK_M) * BLOCK_M
    start[e]       = sum_{e' < e} padded[e']
    sorted_ids[start[e] + rank_i] = i            # rank_i: place of pair i inside its expert
    sorted_ids[start[e] + count[e] + j] = numel  # sentinel padding, j < padded[e] - count[e]
    expert_ids[b]  = e  for every block b inside [start[e], start[e] + padded[e]) / BLOCK_M
    num_padded     = sum_e padded[e]
    block_rows[b]  = ustart[e] + b*BLOCK_M - start[e]   # ustart[e] = sum_{e' < e} count[e']

``block_rows`` places each block in the *unpadded* expert-sorted order: row ``block_rows[b] + r``
holds the pair ``sorted_ids[b*BLOCK_M + r]`` for the block's real rows. GEMM 1 writes its output
there and GEMM 2 reads contiguous tiles of it (a TMA box may run into the next expert's rows;
those results are masked on store), so the intermediate needs ``numel`` rows, not ``num_padded``.

Layout of the outputs (all int32, sizes static so that no host synchronisation is needed):
``sorted_ids [max_blocks * BLOCK_M]``, ``expert_ids [max_blocks]`` (``-1`` past
``num_padded``), ``num_padded [1]``, ``block_rows [max_blocks]``, with ``max_blocks = min(numel, floor(numel/BLOCK_M) + E)``,
an upper bound of ``sum_e ceil(count[e]/BLOCK_M)``. Entries past ``num_padded`` are unspecified.

Limits. Pairs whose expert id is outside ``[0, E)`` (experts on another rank) are dropped.
The order of pairs inside one expert is not stable (GPU atomics hand out the ranks); the
GEMMs treat rows independently, so results do not depend on it. ``E`` up to 1024.
Small problems (``numel <= FUSED_MAX``) use one program of one kernel; larger ones use a
zero-filled counter buffer, a counting kernel, an offsets kernel (one chunk of blocks per
program, each recomputing the prefix sums) and a scatter kernel.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

#: Largest ``numel`` handled by the single-program kernel.
FUSED_MAX = 1024
#: Pairs per program in the multi-program path.
_CHUNK = 1024
#: Blocks per step when ``expert_ids`` is written.
_BLOCK_CHUNK = 64


class AlignedRouting(NamedTuple):
    """Output of :func:`moe_align` (see the module docstring)."""

    sorted_ids: torch.Tensor
    expert_ids: torch.Tensor
    num_padded: torch.Tensor
    block_rows: torch.Tensor
    block_m: int
    max_blocks: int


def max_blocks_for(numel: int, num_experts: int, block_m: int) -> int:
    """Static upper bound on the number of non-empty ``block_m`` blocks."""
    return max(1, min(numel, numel // block_m + num_experts))


@triton.jit
def _offsets_and_blocks(
    counts,
    bins,
    first_chunk,
    num_chunks,
    write_head,
    # pointers
    sorted_ids_ptr,
    expert_ids_ptr,
    num_padded_ptr,
    block_rows_ptr,
    cursor_ptr,
    # sizes
    numel,
    num_experts,
    max_blocks,
    # constexpr
    BLOCK_M: tl.constexpr,
    BLOCK_CHUNK: tl.constexpr,
):
    """From per-expert counts, for blocks of chunks ``first_chunk ..+ num_chunks``: expert_ids,
    block_rows and the sentinel padding; with ``write_head`` also num_padded and cursor (the
    start of each expert). Every program recomputes the prefix sums (a few hundred bins)."""
    # padded sizes and their exclusive prefix sum (bins >= num_experts hold dropped pairs)
    valid = bins < num_experts
    real = tl.where(valid, counts, 0)
    padded = ((real + BLOCK_M - 1) // BLOCK_M) * BLOCK_M
    ends = tl.cumsum(padded, 0)
    total = tl.sum(padded, 0)
    if write_head:
        tl.store(num_padded_ptr, total)
        tl.store(cursor_ptr + bins, ends - padded, mask=valid)
    # per block: its expert (experts whose padded range ends at or before it), that expert's
    # padded and unpadded starts and its count; rows past the count get the sentinel
    offs_j = tl.arange(0, BLOCK_M)
    for c in range(first_chunk, first_chunk + num_chunks):
        offs_b = c * BLOCK_CHUNK + tl.arange(0, BLOCK_CHUNK)
        b_mask = offs_b < max_blocks
        first_row = offs_b * BLOCK_M
        live = first_row < total
        ended = (ends[None, :] <= first_row[:, None]) & valid[None, :]
        expert = tl.sum(ended.to(tl.int32), 1)
        tl.store(expert_ids_ptr + offs_b, tl.where(live, expert, -1), mask=b_mask)
        pstart = tl.sum(tl.where(ended, padded[None, :], 0), 1)
        ustart = tl.sum(tl.where(ended, real[None, :], 0), 1)
        tl.store(block_rows_ptr + offs_b, ustart + first_row - pstart, mask=b_mask)
        count = tl.sum(tl.where(bins[None, :] == expert[:, None], real[None, :], 0), 1)
        in_block = first_row - pstart  # rows of this expert before the block
        pad = (b_mask & live)[:, None] & (in_block[:, None] + offs_j[None, :] >= count[:, None])
        tl.store(sorted_ids_ptr + first_row[:, None] + offs_j[None, :], numel, mask=pad)


@triton.jit
def _align_fused_kernel(
    # pointers
    topk_ids_ptr,  # [numel] expert of each pair
    sorted_ids_ptr,  # [max_blocks * BLOCK_M] out
    expert_ids_ptr,  # [max_blocks] out
    num_padded_ptr,  # [1] out
    block_rows_ptr,  # [max_blocks] out
    cursor_ptr,  # [NUM_BINS] scratch
    # sizes
    numel,
    num_experts,
    max_blocks,
    # constexpr
    BLOCK_M: tl.constexpr,
    NUM_BINS: tl.constexpr,  # power of two > num_experts; the last bins take dropped pairs
    CHUNK: tl.constexpr,  # power of two >= numel
    BLOCK_CHUNK: tl.constexpr,
):
    """Whole alignment in one program (numel <= CHUNK)."""
    # load the pairs; dropped or out-of-range pairs go to bin num_experts
    offs = tl.arange(0, CHUNK)
    in_range = offs < numel
    ids = tl.load(topk_ids_ptr + offs, mask=in_range, other=-1).to(tl.int32)
    keep = in_range & (ids >= 0) & (ids < num_experts)
    ids = tl.where(keep, ids, num_experts)
    bins = tl.arange(0, NUM_BINS)
    counts = tl.histogram(ids, NUM_BINS)
    # offsets, padding, expert ids; cursor[e] = start of expert e
    _offsets_and_blocks(
        counts, bins, 0, tl.cdiv(max_blocks, BLOCK_CHUNK), True,
        sorted_ids_ptr, expert_ids_ptr, num_padded_ptr, block_rows_ptr, cursor_ptr,
        numel, num_experts, max_blocks, BLOCK_M, BLOCK_CHUNK,
    )  # fmt: skip
    tl.debug_barrier()
    # each pair takes the next free row of its expert
    pos = tl.atomic_add(cursor_ptr + ids, 1, mask=keep, sem="relaxed")
    tl.store(sorted_ids_ptr + pos, offs, mask=keep)


@triton.jit
def _align_count_kernel(
    # pointers
    topk_ids_ptr,  # [numel]
    counts_ptr,  # [NUM_BINS] zero-filled, accumulated with atomics
    # sizes
    numel,
    num_experts,
    # constexpr
    NUM_BINS: tl.constexpr,
    CHUNK: tl.constexpr,
):
    """Per-expert pair counts of one chunk, added into counts."""
    # histogram of this chunk
    offs = tl.program_id(0) * CHUNK + tl.arange(0, CHUNK)
    in_range = offs < numel
    ids = tl.load(topk_ids_ptr + offs, mask=in_range, other=-1).to(tl.int32)
    keep = in_range & (ids >= 0) & (ids < num_experts)
    ids = tl.where(keep, ids, num_experts)
    hist = tl.histogram(ids, NUM_BINS)
    # accumulate real experts only
    bins = tl.arange(0, NUM_BINS)
    tl.atomic_add(counts_ptr + bins, hist, mask=(bins < num_experts) & (hist > 0), sem="relaxed")


@triton.jit
def _align_offsets_kernel(
    # pointers
    counts_ptr,  # [NUM_BINS] per-expert counts
    sorted_ids_ptr,
    expert_ids_ptr,
    num_padded_ptr,
    block_rows_ptr,
    cursor_ptr,  # [NUM_BINS] out: start of each expert
    # sizes
    numel,
    num_experts,
    max_blocks,
    # constexpr
    BLOCK_M: tl.constexpr,
    NUM_BINS: tl.constexpr,
    BLOCK_CHUNK: tl.constexpr,
):
    """One chunk of blocks per program: expert ids, block rows and sentinels from the counts;
    program 0 also writes num_padded and the cursor."""
    pid = tl.program_id(0)
    bins = tl.arange(0, NUM_BINS)
    counts = tl.load(counts_ptr + bins, mask=bins < num_experts, other=0)
    _offsets_and_blocks(
        counts, bins, pid, 1, pid == 0,
        sorted_ids_ptr, expert_ids_ptr, num_padded_ptr, block_rows_ptr, cursor_ptr,
        numel, num_experts, max_blocks, BLOCK_M, BLOCK_CHUNK,
    )  # fmt: skip


@triton.jit
def _align_scatter_kernel(
    # pointers
    topk_ids_ptr,  # [numel]
    sorted_ids_ptr,  # [max_blocks * BLOCK_M] out
    cursor_ptr,  # [NUM_BINS] next free row per expert
    # sizes
    numel,
    num_experts,
    # constexpr
    CHUNK: tl.constexpr,
):
    """Each pair of one chunk takes the next free row of its expert."""
    offs = tl.program_id(0) * CHUNK + tl.arange(0, CHUNK)
    in_range = offs < numel
    ids = tl.load(topk_ids_ptr + offs, mask=in_range, other=-1).to(tl.int32)
    keep = in_range & (ids >= 0) & (ids < num_experts)
    pos = tl.atomic_add(cursor_ptr + ids, 1, mask=keep, sem="relaxed")
    tl.store(sorted_ids_ptr + pos, offs, mask=keep)


def moe_align(topk_ids: torch.Tensor, num_experts: int, block_m: int) -> AlignedRouting:
    """Group (token, slot) pairs by expert and pad each group to ``block_m`` (no host sync)."""
    if topk_ids.dim() != 2 or topk_ids.dtype not in (torch.int32, torch.int64):
        raise ValueError(
            f"topk_ids must be a 2-D int32/int64 tensor [T, k], got shape "
            f"{tuple(topk_ids.shape)} dtype {topk_ids.dtype}"
        )
    if not topk_ids.is_contiguous():
        raise ValueError(f"topk_ids must be contiguous, got strides {topk_ids.stride()}")
    if block_m < 1 or block_m & (block_m - 1):
        raise ValueError(f"block_m must be a power of two, got {block_m}")
    if not 0 < num_experts <= 1024:
        raise ValueError(f"num_experts must be in 1..1024, got {num_experts}")
    numel = topk_ids.numel()
    dev = topk_ids.device
    max_blocks = max_blocks_for(numel, num_experts, block_m)
    sorted_ids = torch.empty(max_blocks * block_m, dtype=torch.int32, device=dev)
    expert_ids = torch.empty(max_blocks, dtype=torch.int32, device=dev)
    num_padded = torch.empty(1, dtype=torch.int32, device=dev)
    block_rows = torch.empty(max_blocks, dtype=torch.int32, device=dev)
    num_bins = triton.next_power_of_2(num_experts + 1)
    if numel == 0:
        num_padded.zero_()
        expert_ids.fill_(-1)
        return AlignedRouting(sorted_ids, expert_ids, num_padded, block_rows, block_m, max_blocks)
    if numel <= FUSED_MAX:
        cursor = torch.empty(num_bins, dtype=torch.int32, device=dev)
        _align_fused_kernel[(1,)](
            topk_ids, sorted_ids, expert_ids, num_padded, block_rows, cursor,
            numel, num_experts, max_blocks,
            BLOCK_M=block_m, NUM_BINS=num_bins,
            CHUNK=max(16, triton.next_power_of_2(numel)), BLOCK_CHUNK=_BLOCK_CHUNK,
        )  # fmt: skip
    else:
        scratch = torch.zeros(2 * num_bins, dtype=torch.int32, device=dev)
        counts, cursor = scratch[:num_bins], scratch[num_bins:]
        grid = (triton.cdiv(numel, _CHUNK),)
        _align_count_kernel[grid](
            topk_ids, counts, numel, num_experts, NUM_BINS=num_bins, CHUNK=_CHUNK
        )
        _align_offsets_kernel[(triton.cdiv(max_blocks, _BLOCK_CHUNK),)](
            counts, sorted_ids, expert_ids, num_padded, block_rows, cursor,
            numel, num_experts, max_blocks,
            BLOCK_M=block_m, NUM_BINS=num_bins, BLOCK_CHUNK=_BLOCK_CHUNK,
        )  # fmt: skip
        _align_scatter_kernel[grid](topk_ids, sorted_ids, cursor, numel, num_experts, CHUNK=_CHUNK)
    return AlignedRouting(sorted_ids, expert_ids, num_padded, block_rows, block_m, max_blocks)


@triton.jit
def block_pairs(
    pid_m,
    # pointers
    sorted_ids_ptr,
    expert_ids_ptr,
    num_padded_ptr,
    block_rows_ptr,
    topk_ids_ptr,
    # sizes
    numel,
    num_experts,
    # constexpr
    BLOCK_M: tl.constexpr,
    NAIVE: tl.constexpr,  # block b holds pair b alone; no alignment ran
):
    """Pairs ``[BLOCK_M]`` (``numel`` = empty row), their expert, whether the block is live and
    its first row in the unpadded expert-sorted order (``pid_m`` itself in NAIVE mode)."""
    offs = tl.arange(0, BLOCK_M)
    if NAIVE:
        pairs = tl.where(offs == 0, pid_m, numel)
        expert = tl.load(topk_ids_ptr + pid_m).to(tl.int32)
        live = (pid_m < numel) & (expert >= 0) & (expert < num_experts)
        row0 = pid_m
    else:
        live = pid_m * BLOCK_M < tl.load(num_padded_ptr)
        pairs = tl.load(sorted_ids_ptr + pid_m * BLOCK_M + offs)  # in bounds: pid_m < max_blocks
        expert = tl.load(expert_ids_ptr + pid_m)
        row0 = tl.load(block_rows_ptr + pid_m)
    return pairs, expert, live, row0
