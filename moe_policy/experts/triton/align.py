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
``num_padded``), ``num_padded [1]``, ``block_rows [max_blocks]``, with
``max_blocks = min(numel, floor(numel/BLOCK_M) + E)``, an upper bound of
``sum_e ceil(count[e]/BLOCK_M)``. Entries past ``num_padded`` are unspecified.

Adapter order (``adapter_order=(token -> LoRA slot, enabled)``, used by the LoRA path when
experts span several blocks): inside each expert, pairs with no enabled adapter come first,
then the pairs of slot 0, 1, ... (keys ``expert * SUB + slot + 1``, ``SUB`` a power of two
above the slot count), so a block holds few adapters. Counts, blocks, padding and
``block_rows`` are those of the plain alignment.

Limits. Pairs whose expert id is outside ``[0, E)`` (experts on another rank) are dropped.
The order of pairs inside one expert (or one adapter key) is not stable (GPU atomics hand
out the ranks); whole-K tiles treat rows independently, so their results do not depend on
it. ``stable=True`` (at most ``STABLE_MAX_BINS - 1`` experts, no adapter order) keeps the
pairs' own order instead: each chunk's counts are kept and every pair's rank comes from a
cumulative sum, so a GEMM that splits some tiles along K (stream-K tails) gives the same
bits on every run. ``E`` up to 1024; adapter order only while ``E`` bins times ``SUB`` stay
within ``MAX_SORT_KEYS``.
Small problems (``numel <= FUSED_MAX``) use one program of one kernel, which counts the pairs
with atomics on a zeroed row, each pair's atomic handing back its rank in its key (a
histogram's work grows with pairs times bins; a stable alignment keeps it). Up to
``ONE_PASS_MAX`` pairs and ``ONE_PASS_MAX_BINS`` bins (no adapter order, not stable) one
kernel of one program per chunk: each program counts every chunk's pairs itself (so it knows
the experts' starts and how many of each expert's pairs the earlier chunks hold, with no
other program to wait for), writes its share of the block tables and scatters its chunk from
cursors of its own. Larger ones use a zero-filled counter buffer, a counting kernel (a
histogram per chunk, or one atomic per pair where experts average few pairs), an offsets
kernel (a few programs, each recomputing the prefix sums and writing every expert's j-th
block for its share of j) and a scatter kernel. The multi-program kernels store the sentinel
padding in [bins, columns] tiles, fewer columns the more bins, that stay in registers. The
scatters' per-pair atomics take rows from one cursor per key, each on its own 128-byte line
while they take at most 32 KB (``cursor_step``).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from moe_policy.experts.triton.workspace import Alloc, fresh

#: Largest ``numel`` handled by the single-program kernel.
FUSED_MAX = 1024
#: Pairs per program of the one-launch alignment (the four-kernel one: ``count_chunk``; a
#: stable alignment takes fewer, as each program ranks its pairs with a [chunk, bins]
#: cumulative sum).
PAIRS_PER_PROGRAM = 1024
#: Largest ``numel`` and bin count of the one-launch multi-program alignment: each of its
#: programs counts every chunk, so its work grows with the chunks and the bins. On the H200 it
#: beat the four launches by up to 6 % of a small layer (Granite-3.0-1B at T=256) with up to
#: four chunks and 512 bins, and lost up to 2 % with eight chunks or 1024 bins.
ONE_PASS_MAX = 4 * PAIRS_PER_PROGRAM
ONE_PASS_MAX_BINS = 512
STABLE_PAIRS_PER_PROGRAM = 256
#: Blocks per step when ``-1`` is written past the end of ``expert_ids``.
_BLOCK_CHUNK = 64
#: Most elements of one [bins, columns] tile of sentinel stores in the multi-program kernels:
#: 16 columns of 1,024 bins spilled registers on sm_90 (816 bytes a thread in the offsets
#: kernel), and narrower tiles of 256 and 512 bins were faster too (H200: Qwen3-Next-80B's
#: alignment at T=4096 23.2 -> 19.3 us, Qwen3-30B-A3B's at T=4096 10.1 -> 9.7 us) ...
SENTINEL_TILE = 1024
#: ... but the one-program kernel takes 16 whatever the bins: one program walks every step,
#: and with 1,024 bins 2 columns a step cost it 0.8 us more than 16 did with their spills.
FUSED_SENTINEL_COLS = 16
#: int32 elements between neighbouring keys' cursors in the multi-program path: one 128-byte
#: line each, so the scatter's per-pair atomics spread over L2 instead of queueing on the few
#: lines a packed array takes ...
CURSOR_STEP = 32
#: ... within this many bytes for all cursors (closer together beyond: 2048 adapter-ordered
#: keys get 16 bytes each), so that they stay a small part of the output they are carved from.
CURSOR_BYTES = 32768
#: Programs of the multi-program offsets kernel: with 1,024 bins and 128-row blocks its 128
#: one-column sentinel steps are most of its work (H200: Qwen3-Next-80B's alignment at T=8192
#: 26.4 -> 20.0 us with 32 programs instead of 8; within noise with 64 bins).
_OFFSET_PROGRAMS = 32
#: Pairs per program of the counting and scatter kernels, from the fewest: more programs count
#: and scatter sooner, but each adds its chunk's histogram into the counters as a row of keys,
#: so the chunk is the smallest that keeps those rows within ``HISTOGRAM_ENTRIES`` (any, with
#: per-pair atomics). H200, alignment alone, 256-pair chunks against 1,024: Granite-3.0-1B at
#: T=1024 7.7 -> 6.7 us, Qwen3-Next-80B at T=1024 11.2 -> 9.7, but at T=8192 (320 rows of
#: 1,024 keys) 20.0 -> 24.3 with 32 offsets programs.
COUNT_CHUNKS = (256, 512, 1024)
HISTOGRAM_ENTRIES = 24 * 1024
#: Most (expert, adapter) keys for ordering pairs by adapter; beyond, pairs are not ordered.
MAX_SORT_KEYS = 4096
#: Most pairs per expert, on average, for which the counting kernel adds one atomic per pair
#: rather than a histogram of its chunk: a histogram's work grows with pairs times bins
#: (Qwen3-Next-80B, 1,024 bins, T=256: alignment 12.6 -> 9.3 us), atomics queue on a busy
#: expert's counter (Qwen3-30B-A3B at 256 pairs an expert: 10.1 -> 15.7 us).
PAIR_ATOMICS_MAX_PER_EXPERT = 32
#: Most bins (experts + 1, to a power of two) of a stable alignment (its ranks come from a
#: [chunk, bins] cumulative sum per program).
STABLE_MAX_BINS = 32


def cursor_step(num_keys: int) -> int:
    """int32 elements between neighbouring cursors of ``num_keys`` keys (``CURSOR_STEP`` and
    ``CURSOR_BYTES``)."""
    return max(1, min(CURSOR_STEP, CURSOR_BYTES // (4 * num_keys)))


class AlignedRouting(NamedTuple):
    """Output of :func:`moe_align` (see the module docstring)."""

    sorted_ids: torch.Tensor
    expert_ids: torch.Tensor
    num_padded: torch.Tensor
    block_rows: torch.Tensor
    block_m: int
    max_blocks: int


def stable_supported(num_experts: int) -> bool:
    """Whether ``moe_align(..., stable=True)`` takes this many experts."""
    return triton.next_power_of_2(num_experts + 1) <= STABLE_MAX_BINS


def sentinel_cols(num_bins: int) -> int:
    """Padding rows each step of the sentinel stores writes per expert (a power of two, 1 to
    16), so that a [num_bins, cols] tile stays within ``SENTINEL_TILE`` elements."""
    return max(1, min(16, SENTINEL_TILE // num_bins))


def count_chunk(numel: int, num_keys: int, pair_atomics: bool) -> int:
    """Pairs per program of the counting and scatter kernels (``COUNT_CHUNKS``)."""
    for chunk in COUNT_CHUNKS[:-1]:
        if pair_atomics or -(-numel // chunk) * num_keys <= HISTOGRAM_ENTRIES:
            return chunk
    return COUNT_CHUNKS[-1]


def max_blocks_for(numel: int, num_experts: int, block_m: int) -> int:
    """Static upper bound on the number of non-empty ``block_m`` blocks."""
    return max(1, min(numel, numel // block_m + num_experts))


@triton.jit
def _offsets_and_blocks(
    counts,
    bins,
    prog,
    num_progs,
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
    WRITE_CURSOR: tl.constexpr,
    SENT_COLS: tl.constexpr,
    CURSOR_STEP: tl.constexpr = 1,
):
    """From per-expert counts: expert_ids and block_rows, written expert-parallel (step ``j``
    writes block ``j`` of every expert that has one; program ``prog`` of ``num_progs`` takes
    every ``num_progs``-th step), ``-1`` for blocks past the end and the sentinel padding (also
    shared by step); program 0 also writes num_padded and, with WRITE_CURSOR, the cursor (start
    row of each expert). Returns the first block of each expert."""
    # block counts per expert and their exclusive prefix sums (bins >= num_experts hold
    # dropped pairs); every program recomputes them, a few hundred bins
    valid = bins < num_experts
    real = tl.where(valid, counts, 0)
    nblk = (real + BLOCK_M - 1) // BLOCK_M
    bstart = tl.cumsum(nblk, 0) - nblk
    ustart = tl.cumsum(real, 0) - real
    total = tl.sum(nblk, 0)
    if prog == 0:
        tl.store(num_padded_ptr, total * BLOCK_M)
        if WRITE_CURSOR:
            tl.store(cursor_ptr + bins * CURSOR_STEP, bstart * BLOCK_M, mask=valid)
    # sentinels after each expert's pairs, SENT_COLS padding rows per step (a [bins, BLOCK_M]
    # tile would not fit in registers for BLOCK_M = 128)
    pad_start = bstart * BLOCK_M + real
    pad_len = tl.where(valid, nblk * BLOCK_M - real, 0)
    for j0 in range(prog * SENT_COLS, BLOCK_M, num_progs * SENT_COLS):
        offs_j = j0 + tl.arange(0, SENT_COLS)
        pad_mask = offs_j[None, :] < pad_len[:, None]
        tl.store(sorted_ids_ptr + pad_start[:, None] + offs_j[None, :], numel, mask=pad_mask)
    for j in range(prog, tl.max(nblk, 0), num_progs):
        has = valid & (j < nblk)
        tl.store(expert_ids_ptr + bstart + j, bins, mask=has)
        tl.store(block_rows_ptr + bstart + j, ustart + j * BLOCK_M, mask=has)
    for b0 in range(total + prog * BLOCK_CHUNK, max_blocks, num_progs * BLOCK_CHUNK):
        offs_b = b0 + tl.arange(0, BLOCK_CHUNK)
        tl.store(expert_ids_ptr + offs_b, -1, mask=offs_b < max_blocks)
    return bstart


@triton.jit
def _pair_keys(
    offs,
    # pointers
    topk_ids_ptr,
    lora_map_ptr,
    lora_enabled_ptr,
    # sizes
    numel,
    num_experts,
    num_slots,
    # constexpr
    TOP_K: tl.constexpr,
    SUB: tl.constexpr,
):
    """(whether each pair is kept, its sort key): ``expert * SUB + s`` with ``s`` = 0 for no
    adapter (slot -1, outside [0, num_slots) or disabled) and ``slot + 1`` otherwise (SUB = 1:
    the expert alone); dropped or out-of-range pairs get key ``num_experts * SUB``."""
    in_range = offs < numel
    ids = tl.load(topk_ids_ptr + offs, mask=in_range, other=-1).to(tl.int32)
    keep = in_range & (ids >= 0) & (ids < num_experts)
    ids = tl.where(keep, ids, num_experts)
    if SUB > 1:
        slot = tl.load(lora_map_ptr + offs // TOP_K, mask=keep, other=-1)
        on = tl.load(lora_enabled_ptr + slot, mask=(slot >= 0) & (slot < num_slots), other=0)
        key = ids * SUB + tl.where(on != 0, slot + 1, 0)  # slot + 1 <= num_slots < SUB
    else:
        key = ids
    return keep, key


@triton.jit
def _stable_ranks(key, NUM_BINS: tl.constexpr):
    """Place of each pair among the earlier pairs of its key in this chunk ([CHUNK] int32): a
    cumulative sum over one-hot rows, so the order is the pairs' own (stable, no atomics);
    and the one-hot rows ([CHUNK, NUM_BINS] int32)."""
    onehot = (key[:, None] == tl.arange(0, NUM_BINS)[None, :]).to(tl.int32)
    before = tl.cumsum(onehot, 0) - onehot
    return tl.sum(before * onehot, 1), onehot


@triton.jit
def _sub_cursors(
    sub_counts,  # [NUM_BINS * SUB] pairs per (expert, adapter key)
    bstart,  # [NUM_BINS] first block of each expert
    # pointers
    cursor_ptr,  # [NUM_BINS * SUB] out
    # sizes
    num_experts,
    # constexpr
    NUM_BINS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    SUB: tl.constexpr,
    CURSOR_STEP: tl.constexpr = 1,
):
    """cursor[e * SUB + s] = first row of expert e + pairs of e with a smaller adapter key."""
    sub2 = tl.reshape(sub_counts, (NUM_BINS, SUB))
    start = bstart[:, None] * BLOCK_M + tl.cumsum(sub2, 1) - sub2
    keys = tl.arange(0, NUM_BINS)[:, None] * SUB + tl.arange(0, SUB)[None, :]
    tl.store(cursor_ptr + keys * CURSOR_STEP, start, mask=keys < num_experts * SUB)


@triton.jit(do_not_specialize=["num_slots"])
def align_fused_kernel(
    # pointers
    topk_ids_ptr,  # [numel] expert of each pair
    lora_map_ptr,  # [T] adapter slot per token (SUB > 1)
    lora_enabled_ptr,  # [L] (SUB > 1)
    sorted_ids_ptr,  # [max_blocks * BLOCK_M] out
    expert_ids_ptr,  # [max_blocks] out
    num_padded_ptr,  # [1] out
    block_rows_ptr,  # [max_blocks] out
    cursor_ptr,  # scratch: the keys' first rows [NUM_BINS * SUB], then (not STABLE) their counts
    # sizes
    numel,
    num_experts,
    max_blocks,
    num_slots,  # adapter slots (SUB > 1)
    # constexpr
    TOP_K: tl.constexpr,
    SUB: tl.constexpr,  # 1, or a power of two > adapter slots: pairs ordered by slot in an expert
    BLOCK_M: tl.constexpr,
    NUM_BINS: tl.constexpr,  # power of two > num_experts; the last bins take dropped pairs
    CHUNK: tl.constexpr,  # power of two >= numel
    BLOCK_CHUNK: tl.constexpr,
    SENT_COLS: tl.constexpr,  # FUSED_SENTINEL_COLS
    STABLE: tl.constexpr = False,  # pairs keep their order inside an expert (SUB == 1)
):
    """Whole alignment in one program (numel <= CHUNK).

    Not STABLE, the pairs are counted with atomics on a zeroed row of the scratch, which hand
    each pair its rank inside its key: work in pairs plus keys, where a histogram's grows with
    their product (10 us for 160 pairs over 512 experts on the H200)."""
    # load the pairs and their keys; dropped or out-of-range pairs go to bin num_experts
    offs = tl.arange(0, CHUNK)
    keep, key = _pair_keys(offs, topk_ids_ptr, lora_map_ptr, lora_enabled_ptr, numel,
                           num_experts, num_slots, TOP_K, SUB)  # fmt: skip
    bins = tl.arange(0, NUM_BINS)
    if STABLE:
        sub_counts = tl.histogram(key, NUM_BINS * SUB)
    else:
        count_ptr = cursor_ptr + NUM_BINS * SUB
        all_keys = tl.arange(0, NUM_BINS * SUB)
        tl.store(count_ptr + all_keys, tl.zeros((NUM_BINS * SUB,), dtype=tl.int32))
        tl.debug_barrier()
        rank = tl.atomic_add(count_ptr + key, 1, mask=keep, sem="relaxed")
        tl.debug_barrier()
        sub_counts = tl.load(count_ptr + all_keys, cache_modifier=".cg")  # the atomics' sums
    counts = tl.sum(tl.reshape(sub_counts, (NUM_BINS, SUB)), 1)  # per expert
    # offsets, padding, expert ids; cursor[key] = first free row of the key
    bstart = _offsets_and_blocks(
        counts, bins, 0, 1,
        sorted_ids_ptr, expert_ids_ptr, num_padded_ptr, block_rows_ptr, cursor_ptr,
        numel, num_experts, max_blocks, BLOCK_M, BLOCK_CHUNK, SUB == 1, SENT_COLS,
    )  # fmt: skip
    if SUB > 1:
        _sub_cursors(sub_counts, bstart, cursor_ptr, num_experts, NUM_BINS, BLOCK_M, SUB)
    tl.debug_barrier()
    # each pair takes its key's first row plus its rank (STABLE: its place in pair order)
    if STABLE:
        rank, _ = _stable_ranks(key, NUM_BINS)
    pos = tl.load(cursor_ptr + key, mask=keep, other=0) + rank
    tl.store(sorted_ids_ptr + pos, offs, mask=keep)


@triton.jit
def align_one_pass_kernel(
    # pointers
    topk_ids_ptr,  # [numel] expert of each pair
    sorted_ids_ptr,  # [max_blocks * BLOCK_M] out
    expert_ids_ptr,  # [max_blocks] out
    num_padded_ptr,  # [1] out
    block_rows_ptr,  # [max_blocks] out
    cursor_ptr,  # [programs, NUM_BINS * CURSOR_STEP] scratch, one row per program
    # sizes
    numel,
    num_experts,
    max_blocks,
    # constexpr
    TOP_K: tl.constexpr,
    BLOCK_M: tl.constexpr,
    NUM_BINS: tl.constexpr,  # power of two > num_experts; the last bins take dropped pairs
    CHUNK: tl.constexpr,  # pairs per program
    BLOCK_CHUNK: tl.constexpr,
    SENT_COLS: tl.constexpr,  # sentinel_cols(NUM_BINS)
    CURSOR_STEP: tl.constexpr = 1,
):
    """Whole alignment in one launch, chunk ``p`` in program ``p``: every program counts all
    chunks (the experts' totals, and the pairs of each expert in chunks before its own), writes
    its share of the block tables (``_offsets_and_blocks``), then its pairs take rows from its
    own cursors, which start after the earlier chunks' pairs of each expert. No program reads
    what another writes."""
    prog = tl.program_id(0)
    num_progs = tl.num_programs(0)
    bins = tl.arange(0, NUM_BINS)
    offs = prog * CHUNK + tl.arange(0, CHUNK)
    keep, key = _pair_keys(offs, topk_ids_ptr, topk_ids_ptr, topk_ids_ptr, numel, num_experts,
                           0, TOP_K, 1)  # fmt: skip
    counts = tl.histogram(key, NUM_BINS)
    before = tl.zeros((NUM_BINS,), dtype=tl.int32)
    for c in range(0, num_progs):
        if c != prog:  # the other chunks: the totals, and what the earlier ones hold
            offs_c = c * CHUNK + tl.arange(0, CHUNK)
            _, key_c = _pair_keys(offs_c, topk_ids_ptr, topk_ids_ptr, topk_ids_ptr, numel,
                                  num_experts, 0, TOP_K, 1)  # fmt: skip
            hist = tl.histogram(key_c, NUM_BINS)
            counts += hist
            before += tl.where(c < prog, hist, 0)
    bstart = _offsets_and_blocks(
        counts, bins, prog, num_progs,
        sorted_ids_ptr, expert_ids_ptr, num_padded_ptr, block_rows_ptr, cursor_ptr,
        numel, num_experts, max_blocks, BLOCK_M, BLOCK_CHUNK, False, SENT_COLS,
    )  # fmt: skip
    cursor = cursor_ptr + prog * (NUM_BINS * CURSOR_STEP)
    tl.store(cursor + bins * CURSOR_STEP, bstart * BLOCK_M + before)
    tl.debug_barrier()
    pos = tl.atomic_add(cursor + key * CURSOR_STEP, 1, mask=keep, sem="relaxed")
    tl.store(sorted_ids_ptr + pos, offs, mask=keep)


@triton.jit(do_not_specialize=["num_slots"])
def align_count_kernel(
    # pointers
    topk_ids_ptr,  # [numel]
    lora_map_ptr,
    lora_enabled_ptr,
    counts_ptr,  # [NUM_BINS * SUB] zero-filled, accumulated with atomics
    chunk_counts_ptr,  # STABLE: [chunks, NUM_BINS] out, each chunk's counts
    # sizes
    numel,
    num_experts,
    num_slots,
    # constexpr
    TOP_K: tl.constexpr,
    SUB: tl.constexpr,
    NUM_BINS: tl.constexpr,
    CHUNK: tl.constexpr,
    STABLE: tl.constexpr = False,
    PAIR_ATOMICS: tl.constexpr = False,  # one atomic per pair instead of a chunk histogram
):
    """Pair counts per key (expert, or expert and adapter) of one chunk, added into counts
    (STABLE: also kept per chunk)."""
    offs = tl.program_id(0) * CHUNK + tl.arange(0, CHUNK)
    keep, key = _pair_keys(offs, topk_ids_ptr, lora_map_ptr, lora_enabled_ptr, numel,
                            num_experts, num_slots, TOP_K, SUB)  # fmt: skip
    if PAIR_ATOMICS:
        tl.atomic_add(counts_ptr + key, 1, mask=keep, sem="relaxed")
    else:
        hist = tl.histogram(key, NUM_BINS * SUB)
        if STABLE:
            bins = tl.arange(0, NUM_BINS)
            tl.store(chunk_counts_ptr + tl.program_id(0) * NUM_BINS + bins, hist)
        # accumulate real experts only
        keys = tl.arange(0, NUM_BINS * SUB)
        tl.atomic_add(counts_ptr + keys, hist, mask=(keys < num_experts * SUB) & (hist > 0),
                      sem="relaxed")  # fmt: skip


@triton.jit
def align_offsets_kernel(
    # pointers
    counts_ptr,  # [NUM_BINS * SUB] counts per key
    sorted_ids_ptr,
    expert_ids_ptr,
    num_padded_ptr,
    block_rows_ptr,
    cursor_ptr,  # [NUM_BINS * SUB] out: first row of each key
    # sizes
    numel,
    num_experts,
    max_blocks,
    # constexpr
    SUB: tl.constexpr,
    BLOCK_M: tl.constexpr,
    NUM_BINS: tl.constexpr,
    BLOCK_CHUNK: tl.constexpr,
    SENT_COLS: tl.constexpr,  # sentinel_cols(NUM_BINS)
    CURSOR_STEP: tl.constexpr = 1,
):
    """Expert ids and block rows from the counts, steps shared by the programs; program 0
    also writes num_padded, the cursor and the sentinels."""
    bins = tl.arange(0, NUM_BINS)
    keys = tl.arange(0, NUM_BINS * SUB)
    sub_counts = tl.load(counts_ptr + keys, mask=keys < num_experts * SUB, other=0)
    counts = tl.sum(tl.reshape(sub_counts, (NUM_BINS, SUB)), 1)  # per expert
    prog = tl.program_id(0)
    bstart = _offsets_and_blocks(
        counts, bins, prog, tl.num_programs(0),
        sorted_ids_ptr, expert_ids_ptr, num_padded_ptr, block_rows_ptr, cursor_ptr,
        numel, num_experts, max_blocks, BLOCK_M, BLOCK_CHUNK, SUB == 1, SENT_COLS,
        CURSOR_STEP=CURSOR_STEP,
    )  # fmt: skip
    if SUB > 1 and prog == 0:
        _sub_cursors(sub_counts, bstart, cursor_ptr, num_experts, NUM_BINS, BLOCK_M, SUB,
                     CURSOR_STEP)  # fmt: skip


@triton.jit(do_not_specialize=["num_slots"])
def align_scatter_kernel(
    # pointers
    topk_ids_ptr,  # [numel]
    lora_map_ptr,
    lora_enabled_ptr,
    sorted_ids_ptr,  # [max_blocks * BLOCK_M] out
    cursor_ptr,  # [NUM_BINS * SUB] next free row per key (STABLE: first row, read only)
    chunk_counts_ptr,  # STABLE: [chunks, NUM_BINS] pairs per chunk and expert
    # sizes
    numel,
    num_experts,
    num_slots,
    # constexpr
    TOP_K: tl.constexpr,
    SUB: tl.constexpr,
    CHUNK: tl.constexpr,
    NUM_BINS: tl.constexpr = 1,
    STABLE: tl.constexpr = False,
    CURSOR_STEP: tl.constexpr = 1,
):
    """Each pair of one chunk takes the next free row of its key (STABLE: the row after the
    expert's pairs of earlier chunks and earlier in this chunk)."""
    chunk = tl.program_id(0)
    offs = chunk * CHUNK + tl.arange(0, CHUNK)
    keep, key = _pair_keys(offs, topk_ids_ptr, lora_map_ptr, lora_enabled_ptr, numel,
                           num_experts, num_slots, TOP_K, SUB)  # fmt: skip
    if STABLE:
        bins = tl.arange(0, NUM_BINS)
        before = tl.zeros((NUM_BINS,), dtype=tl.int32)
        for c in range(0, chunk):
            before += tl.load(chunk_counts_ptr + c * NUM_BINS + bins)
        rank, onehot = _stable_ranks(key, NUM_BINS)
        base = tl.sum(onehot * before[None, :], 1)
        pos = tl.load(cursor_ptr + key * CURSOR_STEP, mask=keep, other=0) + base + rank
    else:
        pos = tl.atomic_add(cursor_ptr + key * CURSOR_STEP, 1, mask=keep, sem="relaxed")
    tl.store(sorted_ids_ptr + pos, offs, mask=keep)


def moe_align(
    topk_ids: torch.Tensor,
    num_experts: int,
    block_m: int,
    alloc: Alloc | None = None,
    *,
    adapter_order: tuple[torch.Tensor, torch.Tensor] | None = None,
    stable: bool = False,
) -> AlignedRouting:
    """Group (token, slot) pairs by expert and pad each group to ``block_m`` (no host sync).

    ``alloc`` (shape, dtype) -> tensor provides the output and scratch buffers (default: new
    tensors); the fused MoE passes views of its idle output buffer. ``adapter_order`` =
    (token -> LoRA slot int32 [T], enabled int32 [L]): inside each expert, pairs are ordered
    by adapter (none first, then slot 0, 1, ...), so a block of a busy expert holds few
    adapters. Blocks, padding and ``block_rows`` are the same either way. ``stable``: pairs
    keep their order inside each expert, so the alignment is the same on every run (no
    adapter order; at most ``STABLE_MAX_BINS`` bins, see ``stable_supported``)."""
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
    if stable and (adapter_order is not None or not stable_supported(num_experts)):
        raise ValueError(
            f"a stable alignment takes no adapter order and at most {STABLE_MAX_BINS - 1} "
            f"experts; got {num_experts} experts"
            + (" and an adapter order" if adapter_order is not None else "")
        )
    numel = topk_ids.numel()
    take = alloc or fresh(topk_ids.device)
    max_blocks = max_blocks_for(numel, num_experts, block_m)
    sorted_ids = take((max_blocks * block_m,), torch.int32)
    expert_ids = take((max_blocks,), torch.int32)
    num_padded = take((1,), torch.int32)
    block_rows = take((max_blocks,), torch.int32)
    num_bins = triton.next_power_of_2(num_experts + 1)
    sub = 1
    lmap = len_ = topk_ids  # placeholders when pairs are not ordered by adapter
    if adapter_order is not None:
        lmap, len_ = adapter_order
        sub = triton.next_power_of_2(len_.numel() + 1)
        if len_.numel() == 0 or num_bins * sub > MAX_SORT_KEYS:
            sub, lmap, len_ = 1, topk_ids, topk_ids
    slots = len_.numel() if sub > 1 else 0
    if numel == 0:
        num_padded.zero_()
        expert_ids.fill_(-1)
        return AlignedRouting(sorted_ids, expert_ids, num_padded, block_rows, block_m, max_blocks)
    keys = dict(TOP_K=topk_ids.shape[1], SUB=sub)
    if numel <= FUSED_MAX:
        # the keys' first rows, then (not stable) the counts the atomics add up
        cursor = take(((1 if stable else 2) * num_bins * sub,), torch.int32)
        align_fused_kernel[(1,)](
            topk_ids, lmap, len_, sorted_ids, expert_ids, num_padded, block_rows, cursor,
            numel, num_experts, max_blocks, slots,
            BLOCK_M=block_m, NUM_BINS=num_bins,
            CHUNK=max(16, triton.next_power_of_2(numel)), BLOCK_CHUNK=_BLOCK_CHUNK,
            SENT_COLS=FUSED_SENTINEL_COLS,
            STABLE=stable, **keys,
        )  # fmt: skip
    elif sub == 1 and not stable and numel <= ONE_PASS_MAX and num_bins <= ONE_PASS_MAX_BINS:
        grid = (triton.cdiv(numel, PAIRS_PER_PROGRAM),)
        step = cursor_step(num_bins * grid[0])
        cursor = take((grid[0] * num_bins * step,), torch.int32)
        align_one_pass_kernel[grid](
            topk_ids, sorted_ids, expert_ids, num_padded, block_rows, cursor,
            numel, num_experts, max_blocks,
            TOP_K=topk_ids.shape[1], BLOCK_M=block_m, NUM_BINS=num_bins,
            CHUNK=PAIRS_PER_PROGRAM, BLOCK_CHUNK=_BLOCK_CHUNK, SENT_COLS=sentinel_cols(num_bins),
            CURSOR_STEP=step,
        )  # fmt: skip
    else:
        step = cursor_step(num_bins * sub)
        counts = take((num_bins * sub,), torch.int32).zero_()
        cursor = take((num_bins * sub * step,), torch.int32)  # written by the offsets kernel
        pair_atomics = not stable and numel <= PAIR_ATOMICS_MAX_PER_EXPERT * num_experts
        chunk = (STABLE_PAIRS_PER_PROGRAM if stable
                 else count_chunk(numel, num_bins * sub, pair_atomics))  # fmt: skip
        grid = (triton.cdiv(numel, chunk),)
        chunk_counts = take((grid[0] * num_bins,), torch.int32) if stable else counts
        align_count_kernel[grid](
            topk_ids, lmap, len_, counts, chunk_counts, numel, num_experts, slots,
            NUM_BINS=num_bins, CHUNK=chunk, STABLE=stable, PAIR_ATOMICS=pair_atomics, **keys,
        )  # fmt: skip
        align_offsets_kernel[(_OFFSET_PROGRAMS,)](
            counts, sorted_ids, expert_ids, num_padded, block_rows, cursor,
            numel, num_experts, max_blocks,
            SUB=sub, BLOCK_M=block_m, NUM_BINS=num_bins, BLOCK_CHUNK=_BLOCK_CHUNK,
            SENT_COLS=sentinel_cols(num_bins), CURSOR_STEP=step,
        )  # fmt: skip
        align_scatter_kernel[grid](
            topk_ids, lmap, len_, sorted_ids, cursor, chunk_counts, numel, num_experts, slots,
            CHUNK=chunk, NUM_BINS=num_bins, STABLE=stable, CURSOR_STEP=step, **keys,
        )  # fmt: skip
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
