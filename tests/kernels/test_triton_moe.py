"""Triton fused MoE (standard format) against the torch reference; alignment checked directly.

Runs under TRITON_INTERPRET=1 where there is no GPU (fp16/fp32 only: the interpreter gets
bf16 tl.dot wrong) and compiled on a GPU (bf16/fp16).
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from moe_policy.experts.base import ExpertsConfig  # noqa: E402
from moe_policy.experts.testing import (  # noqa: E402
    ON_GPU,
    dtypes_for_device,
    make_routing,
    make_weights,
    make_x,
    reference_output,
    rel_err,
)
from moe_policy.experts.triton import config as tc  # noqa: E402
from moe_policy.experts.triton.align import FUSED_MAX, moe_align  # noqa: E402
from moe_policy.experts.triton.device import (  # noqa: E402
    DeviceLimits,
    device_limits,
    sm_count,
)
from moe_policy.experts.triton.fused_moe import TritonExperts, fused_moe_triton  # noqa: E402
from moe_policy.experts.triton.gemm import moe_gemm_kernel  # noqa: E402
from moe_policy.experts.triton.launch import MoEProblem, plan_launch  # noqa: E402

#: Relative-error bounds ||out - ref|| / ||ref|| against the float64 reference, per dtype.
#: fp32: interpreted dots are exact fp32 (tf32 on a GPU, hence 1e-3 there); fp16: the
#: intermediate activation and the [T, k, H] partials are rounded to fp16 (2^-11);
#: bf16: the same roundings at 2^-8, plus bf16 inputs of the LoRA expand.
REL_TOL = {torch.float32: 1e-3 if ON_GPU else 1e-5, torch.float16: 3e-3, torch.bfloat16: 2e-2}

#: Small tiles that force several K steps, several N tiles and partial tiles on tiny shapes.
SMALL_TILES = tc.MoEConfig(16, tc.GemmConfig(16, 32, 2, 4, 2), tc.GemmConfig(32, 16, 1, 4, 2))
#: The same with gated GEMM 1 as one [BLOCK_M, 2 BLOCK_N] dot split into gate and up columns.
SMALL_TILES_ONE_DOT = tc.MoEConfig(
    16, tc.GemmConfig(16, 32, 2, 4, 2, one_dot=True), tc.GemmConfig(32, 16, 1, 4, 2)
)
#: Weight tiles (and GEMM 2's activation tiles) through TMA descriptors; boxes run past N and
#: into the next expert's rows, and past the last row (zero-filled).
SMALL_TILES_TMA = tc.MoEConfig(
    16, tc.GemmConfig(16, 32, 2, 4, 2, tma=True), tc.GemmConfig(32, 16, 1, 4, 2, tma=True)
)


def _run(cfg: ExpertsConfig, t: int, dtype, device, *, routing="uniform", tiles=None,
         naive=None, seed=0):  # fmt: skip
    wts = make_weights(cfg, dtype, device, seed=seed)
    x = make_x(t, cfg.hidden_size, dtype, device, seed=seed + 1)
    tw, ti = make_routing(t, cfg.num_experts, cfg.top_k, device, kind=routing, seed=seed + 2)
    conv = TritonExperts.convert_weights(
        cfg, wts["w13"], wts["w2"], wts["w13_bias"], wts["w2_bias"]
    )
    out = fused_moe_triton(
        x, conv["w13"], conv["w2"], tw, ti, activation=cfg.activation, gated=cfg.gated,
        w13_bias=conv["w13_bias"], w2_bias=conv["w2_bias"],
        apply_router_weight_on_input=cfg.apply_router_weight_on_input, config=tiles, naive=naive,
        swiglu_alpha=cfg.swiglu_alpha, swiglu_limit=cfg.swiglu_limit,
    )  # fmt: skip
    ref = reference_output(cfg, wts, x, tw, ti, dtype=torch.float64)
    assert out.shape == x.shape and out.dtype == dtype
    return rel_err(out, ref)


# ---------------------------------------------------------------- alignment


def _check_alignment(ti: torch.Tensor, num_experts: int, block_m: int, routing=None) -> None:
    r = routing if routing is not None else moe_align(ti, num_experts, block_m)
    numel = ti.numel()
    flat = ti.flatten().long().cpu()
    n = int(r.num_padded)
    assert n % block_m == 0 and n <= r.max_blocks * block_m
    s = r.sorted_ids[:n].long().cpu()
    ex = r.expert_ids.long().cpu()
    valid = torch.nonzero((flat >= 0) & (flat < num_experts)).flatten()
    # every valid (token, slot) pair appears exactly once; the rest is the sentinel
    assert sorted(s[s < numel].tolist()) == valid.tolist()
    assert bool((s[s >= numel] == numel).all())
    for b in range(n // block_m):
        rows = s[b * block_m : (b + 1) * block_m]
        real = rows[rows < numel]
        assert real.numel() > 0, f"block {b} is empty"
        assert bool((flat[real] == ex[b]).all()), f"block {b} mixes experts"
        # padding only at the end of an expert's last block
        assert bool((rows[: real.numel()] < numel).all())
    assert bool((ex[n // block_m :] == -1).all())
    # block_rows: the real rows of all blocks tile 0..valid-1 once, experts in ascending order
    br = r.block_rows.long().cpu()
    pos = torch.full((numel,), -1, dtype=torch.long)
    for b in range(n // block_m):
        rows = s[b * block_m : (b + 1) * block_m]
        real = rows[rows < numel]
        pos[real] = br[b] + torch.arange(real.numel())
    assert sorted(pos[valid].tolist()) == list(range(valid.numel()))
    order = torch.argsort(pos[valid])
    assert bool((flat[valid][order].diff() >= 0).all()), "sorted rows are not grouped by expert"
    # groups are padded to the minimum: sum_e ceil(count_e / block_m) blocks
    counts = torch.bincount(flat[valid], minlength=num_experts)
    assert n == int(((counts + block_m - 1) // block_m * block_m).sum())


@pytest.mark.parametrize(
    ("t", "k", "e", "block_m", "kind"),
    [
        (1, 2, 8, 16, "uniform"),
        (7, 3, 8, 16, "uniform"),  # odd T, numel < block
        (33, 8, 8, 16, "skewed"),  # every token on expert 0
        (40, 1, 4, 64, "skewed"),  # k = 1: all pairs on one expert
        (21, 2, 64, 32, "subset"),  # many experts with no tokens
        (300, 6, 16, 128, "uniform"),  # numel > FUSED_MAX: multi-program path
        (257, 8, 128, 16, "uniform"),
    ],
)
def test_alignment_groups_pairs_by_expert(t, k, e, block_m, kind, device):
    """Each pair appears once, blocks hold one expert, padding is the sentinel, none wasted."""
    _, ti = make_routing(t, e, k, device, kind=kind)
    _check_alignment(ti, e, block_m)


@pytest.mark.parametrize(("t", "k", "e", "block_m"), [(40, 2, 4, 16), (300, 6, 16, 128)])
def test_alignment_orders_pairs_by_adapter(t, k, e, block_m, device):
    """With adapter_order, each expert's pairs come no-adapter first (unmapped or disabled
    slot), then by slot; blocks, padding and block_rows keep their invariants (fused and
    multi-program paths)."""
    _, ti = make_routing(t, e, k, device, kind="uniform", seed=3)
    slots = torch.arange(t, device=device).remainder(5).int() - 1  # -1, 0, 1, 2, 3
    enabled = torch.tensor([1, 1, 0, 1], dtype=torch.int32, device=device)  # slot 2 disabled
    r = moe_align(ti, e, block_m, adapter_order=(slots, enabled))
    _check_alignment(ti, e, block_m, routing=r)
    numel = ti.numel()
    s = r.sorted_ids[: int(r.num_padded)].long().cpu()
    flat = ti.flatten().long().cpu()
    sl = slots.long().cpu()[torch.arange(numel) // k]
    key = torch.where((sl >= 0) & (enabled.cpu()[sl.clamp(min=0)] != 0), sl + 1, 0)
    real = s[s < numel]
    assert bool(((flat[real].diff() == 0) <= (key[real].diff() >= 0)).all()), "not by adapter"
    assert int(r.num_padded) == int(moe_align(ti, e, block_m).num_padded)


def test_alignment_with_too_many_adapter_keys_stays_unordered(device):
    """Past MAX_SORT_KEYS (E bins x adapter keys) the alignment ignores adapter_order: it is
    the plain alignment, and a busy expert's pairs keep their mixed adapters."""
    from moe_policy.experts.triton.align import MAX_SORT_KEYS

    e, t = 600, 50  # 1024 bins x 8 keys for 4 slots > MAX_SORT_KEYS
    assert MAX_SORT_KEYS < 1024 * 8
    _, ti = make_routing(t, e, 4, device, kind="skewed", seed=6)  # slot 0 of every token: expert 0
    slots = torch.arange(t, device=device).remainder(4).int()
    enabled = torch.ones(4, dtype=torch.int32, device=device)
    r = moe_align(ti, e, 16, adapter_order=(slots, enabled))
    _check_alignment(ti, e, 16, routing=r)
    first = r.sorted_ids[: 4 * 16].long().cpu()  # expert 0's 50 pairs fill its first 4 blocks
    first = first[first < ti.numel()]
    assert first.numel() == t
    keys = slots.long().cpu()[first // 4]
    assert not bool((keys.diff() >= 0).all()), "pairs were ordered by adapter"


ONE_PASS = ["align_one_pass_kernel"]
FOUR_KERNELS = ["align_count_kernel", "align_offsets_kernel", "align_scatter_kernel"]


@pytest.mark.parametrize(
    ("t", "k", "e", "kind", "kernels"),
    [
        (500, 8, 16, "skewed", ONE_PASS),  # four chunks
        (1300, 3, 8, "uniform", ONE_PASS),
        (300, 7, 300, "uniform", ONE_PASS),  # 512 bins
        (400, 7, 600, "uniform", FOUR_KERNELS),  # 1024 bins: past ONE_PASS_MAX_BINS
        (700, 8, 16, "skewed", FOUR_KERNELS),  # past ONE_PASS_MAX pairs
    ],
)
def test_multi_program_alignment_over_many_chunks(t, k, e, kind, kernels, device,
                                                  record_launches):  # fmt: skip
    """Several chunks, a busy expert taking half of the pairs and a few dropped pairs in every
    chunk: the alignment's invariants hold in the one-launch path (every program counts all
    chunks) and, past ``ONE_PASS_MAX`` pairs or ``ONE_PASS_MAX_BINS`` bins, in the counting,
    offsets and scatter kernels."""
    from moe_policy.experts.triton import align

    log: list = []
    for name in ("align_one_pass_kernel", "align_count_kernel", "align_offsets_kernel",
                 "align_scatter_kernel", "align_fused_kernel"):  # fmt: skip
        record_launches(align, name, log=log)
    _, ti = make_routing(t, e, k, device, kind=kind, seed=5)
    ti[::7, -1] = -1
    assert ti.numel() > 2 * align.PAIRS_PER_PROGRAM
    _check_alignment(ti, e, 64)
    assert [name for name, _ in log] == kernels


@pytest.mark.parametrize(
    ("t", "k", "e", "kind"), [(400, 7, 600, "uniform"), (700, 8, 16, "skewed")]
)
@pytest.mark.parametrize("forced", [None, True, False])
def test_four_kernel_alignment_counts_by_histogram_or_per_pair_atomics(t, k, e, kind, forced,
                                                                       device, record_launches):  # fmt: skip
    """The counting kernel adds one atomic per pair where experts average at most
    ``PAIR_ATOMICS_MAX_PER_EXPERT`` pairs (600 experts here), else a histogram of its chunk
    (16 experts, one of them taking half of the pairs); either way counts the same, which
    the alignment's invariants check with the choice forced both ways."""
    from moe_policy.experts.triton import align

    rewrite = None if forced is None else (lambda kw: {**kw, "PAIR_ATOMICS": forced})
    log = record_launches(align, "align_count_kernel", rewrite=rewrite)
    _, ti = make_routing(t, e, k, device, kind=kind, seed=9)
    ti[::5, 0] = -1
    _check_alignment(ti, e, 32)
    [(_, kw)] = log
    assert kw["PAIR_ATOMICS"] is (t * k <= align.PAIR_ATOMICS_MAX_PER_EXPERT * e)
    assert kw["PAIR_ATOMICS"] is (e == 600)


def test_sentinel_tiles_narrow_as_bins_grow():
    """The multi-program kernels' sentinel tiles keep within ``SENTINEL_TILE`` elements from
    64 bins (expert counts up to 63) up, in power-of-two column counts from 16 down to 1."""
    from moe_policy.experts.triton import align

    cols = {b: align.sentinel_cols(b) for b in (2, 64, 128, 256, 512, 1024)}
    assert cols[2] == cols[64] == 16 and cols[1024] >= 1
    assert all(c & (c - 1) == 0 for c in cols.values())
    assert all(b * c <= align.SENTINEL_TILE for b, c in cols.items() if b >= 64)
    widths = [cols[b] for b in (64, 128, 256, 512, 1024)]
    assert widths == sorted(widths, reverse=True)


def test_counting_chunks_shrink_until_their_histograms_add_up_to_too_many_entries():
    """The counting and scatter kernels take 256 pairs a program with per-pair atomics or few
    keys, and longer chunks where the chunks' histogram rows would pass HISTOGRAM_ENTRIES."""
    from moe_policy.experts.triton.align import HISTOGRAM_ENTRIES, count_chunk

    assert count_chunk(81920, 1024, pair_atomics=True) == 256
    assert count_chunk(8192 * 8, 64, pair_atomics=False) == 256  # 256 chunks of 64 bins
    assert count_chunk(4096 * 8, 256, pair_atomics=False) == 512  # 128 x 256 > limit
    assert count_chunk(8192 * 10, 1024, pair_atomics=False) == 1024  # 160 x 1024 at 512 pairs
    assert 64 * 256 <= HISTOGRAM_ENTRIES < 128 * 256


def test_adapter_ordered_alignment_fits_in_a_small_output(device):
    """The multi-program alignment's tables, 2048 adapter-ordered cursors of 128 experts
    included, are carved out of the output of the smallest call that takes that path (T=129,
    k=8, H=1024: 258 KB), with no tensor of their own, and keep their invariants. One cursor
    per 128-byte line would have taken 256 KB alone; they share lines past 32 KB."""
    from moe_policy.experts.triton import align
    from moe_policy.experts.triton.workspace import Workspace

    t, k, e, block_m = FUSED_MAX // 8 + 1, 8, 128, 16
    assert align.cursor_step(2048) < align.CURSOR_STEP == align.cursor_step(256)
    _, ti = make_routing(t, e, k, device, seed=8)
    slots = torch.arange(t, device=device).remainder(5).int() - 1
    enabled = torch.ones(4, dtype=torch.int32, device=device)
    out = torch.empty(t, 1024, dtype=torch.float16, device=device)
    ws = Workspace(out)
    taken = []

    def take(shape, dtype):
        taken.append(ws.take(shape, dtype))
        return taken[-1]

    r = align.moe_align(ti, e, block_m, alloc=take, adapter_order=(slots, enabled))
    _check_alignment(ti, e, block_m, routing=r)
    total = sum(x.numel() * x.element_size() for x in taken)
    assert ws.carved == total, f"{total - ws.carved} bytes allocated beside the output"


def test_alignment_drops_invalid_experts(device):
    """Pairs routed outside [0, E) (experts of another rank) are left out, in both paths."""
    for t in (9, FUSED_MAX // 2 + 7):
        _, ti = make_routing(t, 8, 2, device)
        ti[::3, 0] = -1
        ti[1::5, 1] = 8
        _check_alignment(ti, 8, 16)


@pytest.mark.parametrize(
    ("t", "k", "e", "block_m"),
    [
        (9, 2, 8, 16),  # one program
        (FUSED_MAX // 2 + 7, 2, 8, 16),  # one program, nearly full
        (3000, 2, 8, 128),  # several chunks (multi-program path), Mixtral-like
        (700, 3, 16, 32),  # several chunks, 16 experts
    ],
)
def test_stable_alignment_keeps_pair_order_inside_each_expert(t, k, e, block_m, device):
    """A stable alignment is a valid alignment whose pairs are in ascending order inside each
    expert (dropped pairs left out), so it is the same on every run; it has the plain
    alignment's blocks and padding."""
    _, ti = make_routing(t, e, k, device)
    ti[::7, 0] = -1  # a pair for another rank
    r = moe_align(ti, e, block_m, stable=True)
    _check_alignment(ti, e, block_m, routing=r)
    flat = ti.flatten().long().cpu()
    n = int(r.num_padded)
    rows = r.sorted_ids[:n].long().cpu()
    real = rows[rows < ti.numel()]
    for ex in range(e):
        mine = real[flat[real] == ex]
        assert mine.tolist() == torch.nonzero(flat == ex).flatten().tolist()
    plain = moe_align(ti, e, block_m)
    assert int(plain.num_padded) == n
    assert torch.equal(plain.expert_ids.cpu(), r.expert_ids.cpu())
    assert torch.equal(moe_align(ti, e, block_m, stable=True).sorted_ids[:n], r.sorted_ids[:n])


def test_stable_alignment_limits(device):
    """Stable order takes no adapter order and at most STABLE_MAX_BINS - 1 experts."""
    from moe_policy.experts.triton.align import STABLE_MAX_BINS, stable_supported

    ti = torch.zeros(4, 2, dtype=torch.int32, device=device)
    assert stable_supported(STABLE_MAX_BINS - 1) and not stable_supported(STABLE_MAX_BINS)
    with pytest.raises(ValueError, match="at most 31 experts; got 128 experts"):
        moe_align(ti, 128, 16, stable=True)
    order = (torch.zeros(4, dtype=torch.int32, device=device),
             torch.ones(1, dtype=torch.int32, device=device))  # fmt: skip
    with pytest.raises(ValueError, match="and an adapter order"):
        moe_align(ti, 8, 16, stable=True, adapter_order=order)


def test_alignment_int64_ids(device):
    """int64 topk_ids are accepted as they are."""
    _, ti = make_routing(11, 8, 2, device)
    _check_alignment(ti.long(), 8, 16)


def test_alignment_rejects_bad_input(device):
    """Bad ids or block sizes raise ValueError naming what was received."""
    with pytest.raises(ValueError, match=r"2-D int32/int64.*\(6,\)"):
        moe_align(torch.zeros(6, dtype=torch.int32, device=device), 8, 16)
    with pytest.raises(ValueError, match="power of two, got 24"):
        moe_align(torch.zeros(2, 2, dtype=torch.int32, device=device), 8, 24)
    with pytest.raises(ValueError, match="contiguous"):
        moe_align(torch.zeros(4, 4, dtype=torch.int32, device=device)[:, :2], 8, 16)


# ---------------------------------------------------------------- GEMMs vs the reference

MODEL_CASES = [
    # id, config, T
    ("gated-silu-k2", ExpertsConfig(8, 64, 48, 2, "silu"), 17),
    ("gated-gelu-k6", ExpertsConfig(8, 96, 32, 6, "gelu"), 5),
    ("gated-gelu_tanh-k8", ExpertsConfig(8, 32, 64, 8, "gelu_tanh"), 9),
    ("nongated-relu2-k6", ExpertsConfig(8, 80, 48, 6, "relu2", gated=False), 13),
    ("nongated-silu-k1", ExpertsConfig(4, 64, 96, 1, "silu", gated=False), 40),
    ("nongated-gelu-k2", ExpertsConfig(8, 48, 32, 2, "gelu", gated=False), 3),
    ("swigluoai-bias-k4", ExpertsConfig(8, 64, 48, 4, "swigluoai", has_bias=True), 11),
    # a limit most pre-activations exceed, so that the clamp decides the result
    ("swigluoai-clamp-k2",
     ExpertsConfig(8, 64, 48, 2, "swigluoai", has_bias=True, swiglu_alpha=1.0, swiglu_limit=0.5),
     13),
    ("swiglustep-bias-k4", ExpertsConfig(8, 64, 48, 4, "swiglustep", has_bias=True), 11),
    # the same for swiglustep: silu(gate) and |up| past the limit decide the result
    ("swiglustep-clamp-k2",
     ExpertsConfig(8, 64, 48, 2, "swiglustep", has_bias=True, swiglu_limit=0.5), 13),
    ("swiglustep-weight-on-input-k1",
     ExpertsConfig(4, 32, 32, 1, "swiglustep", apply_router_weight_on_input=True,
                   swiglu_limit=0.5), 7),
    ("weight-on-input-k1", ExpertsConfig(4, 64, 32, 1, "silu", apply_router_weight_on_input=True), 19),
    ("weight-on-input-relu2",
     ExpertsConfig(8, 32, 32, 2, "relu2", gated=False, has_bias=True, apply_router_weight_on_input=True),
     7),
]  # fmt: skip


@pytest.mark.parametrize(
    ("cfg", "t"), [c[1:] for c in MODEL_CASES], ids=[c[0] for c in MODEL_CASES]
)
@pytest.mark.parametrize("dtype", dtypes_for_device())
def test_triton_matches_reference(cfg, t, dtype, device):
    """Gated and non-gated activations, top-k 1..8, biases and weight on input match the reference."""
    err = _run(cfg, t, dtype, device)
    assert err < REL_TOL[dtype], f"relative error {err:.2e}"


@pytest.mark.parametrize(
    ("t", "routing", "naive"),
    [
        (1, "uniform", None),  # one token: one pair per block, no alignment
        (1, "uniform", False),  # one token through the aligned path
        (3, "uniform", True),  # naive blocks with several tokens
        (5, "skewed", None),  # T smaller than the block, all on expert 0
        (37, "skewed", None),  # odd T, one hot expert
        (29, "subset", None),  # experts with no tokens
    ],
)
def test_triton_routing_shapes(t, routing, naive, device):
    """Tiny and odd batches, skewed routing and idle experts match the reference."""
    dtype = dtypes_for_device()[0]
    cfg = ExpertsConfig(8, 64, 32, 2, "silu")
    err = _run(cfg, t, dtype, device, routing=routing, naive=naive)
    assert err < REL_TOL[dtype], f"relative error {err:.2e}"


@pytest.mark.parametrize(
    ("act", "gated", "tiles"),
    [
        ("silu", True, SMALL_TILES),
        ("swigluoai", True, SMALL_TILES_ONE_DOT),
        ("swiglustep", True, SMALL_TILES),
        ("swiglustep", True, SMALL_TILES_ONE_DOT),
        ("gelu", True, SMALL_TILES_ONE_DOT),
        ("relu2", False, SMALL_TILES),
        ("silu", True, SMALL_TILES_TMA),
        ("swigluoai", True, SMALL_TILES_TMA),
        ("swiglustep", True, SMALL_TILES_TMA),
        ("relu2", False, SMALL_TILES_TMA),
    ],
)
def test_triton_small_tiles(act, gated, tiles, device):
    """Several K steps, N tiles and partial tiles (H, I not multiples of the tiles), two-dot,
    one-dot and TMA-fed GEMMs, match the reference."""
    dtype = dtypes_for_device()[-1]
    cfg = ExpertsConfig(6, 72, 40, 3, act, gated=gated, has_bias=True)
    err = _run(cfg, 23, dtype, device, tiles=tiles)
    assert err < REL_TOL[dtype], f"relative error {err:.2e}"


#: Tail tiles: a block with at most tail_m real rows runs a tail_m-row tile (pointer loads for
#: GEMM 2's activation even when the full tiles read it through TMA).
TAIL_TILES = tc.MoEConfig(
    32, tc.GemmConfig(16, 32, 2, 4, 2), tc.GemmConfig(32, 16, 1, 4, 2), tail_m=16
)
TAIL_TILES_TMA = tc.MoEConfig(
    64, tc.GemmConfig(16, 32, 2, 4, 2, tma=True), tc.GemmConfig(32, 16, 4, 4, 2, tma=True),
    tail_m=16,
)  # fmt: skip


def _block_fill(ti: torch.Tensor, num_experts: int, block_m: int) -> list[int]:
    """Real rows of each expert's last block (0 for experts without pairs)."""
    counts = torch.bincount(ti.flatten().long().cpu(), minlength=num_experts)
    return [int(c) - (int(c) - 1) // block_m * block_m if c else 0 for c in counts]


@pytest.mark.parametrize(
    ("act", "gated", "tiles", "t", "k"),
    [
        ("silu", True, TAIL_TILES, 150, 2),  # fused alignment
        ("relu2", False, TAIL_TILES, 150, 2),
        ("swigluoai", True, TAIL_TILES_TMA, 210, 3),
        ("silu", True, TAIL_TILES_TMA, 600, 2),  # numel > FUSED_MAX: multi-program alignment
    ],
)
def test_triton_tail_tiles_match_reference(act, gated, tiles, t, k, device):
    """Short last blocks run the tail tile, full ones the block tile; both match the reference."""
    dtype = dtypes_for_device()[-1]
    cfg = ExpertsConfig(8, 72, 40, k, act, gated=gated, has_bias=True)
    _, ti = make_routing(t, cfg.num_experts, k, device, seed=2)
    fills = _block_fill(ti, cfg.num_experts, tiles.block_m)
    # the routing exercises both paths: some last blocks fit the tail tile, some do not
    assert any(0 < f <= tiles.tail_m for f in fills), fills
    assert any(f > tiles.tail_m for f in fills), fills
    err = _run(cfg, t, dtype, device, tiles=tiles)
    assert err < REL_TOL[dtype], f"relative error {err:.2e}"


@pytest.mark.parametrize("tiles", [None, SMALL_TILES, SMALL_TILES_ONE_DOT],
                         ids=["default", "two-dot", "one-dot"])  # fmt: skip
def test_swiglustep_matches_the_float64_formula(tiles, device):
    """swiglustep at a limit of 0.5 against the float64 formula written out on its own
    (``testing.swiglustep_float64``, not the reference): the kernel clamps silu(gate) and up
    at the layer's limit, not at the default 7, with biases and an expert off this rank."""
    from moe_policy.experts.testing import swiglustep_float64

    dtype = dtypes_for_device()[-1]
    cfg = ExpertsConfig(6, 48, 40, 2, "swiglustep", has_bias=True, swiglu_limit=0.5)
    wts = make_weights(cfg, dtype, device, seed=6)
    x = make_x(19, 48, dtype, device, seed=7)
    tw, ti = make_routing(19, 6, 2, device, seed=8)
    ti[4, 1] = -1
    out = TritonExperts(cfg, wts["w13"], wts["w2"], wts["w13_bias"], wts["w2_bias"],
                        tile_config=tiles).apply(x, tw, ti)  # fmt: skip
    want = swiglustep_float64(wts, x, tw, ti, 0.5)
    assert rel_err(out, want) < REL_TOL[dtype]
    assert rel_err(swiglustep_float64(wts, x, tw, ti, 7.0), want) > 0.1  # the clamp matters


def test_tail_tiles_equal_full_tiles(device):
    """The tail tile computes the same rows as the padded block tile (same K order, fp32)."""
    cfg = ExpertsConfig(8, 64, 48, 2, "silu")
    wts = make_weights(cfg, torch.float32, device)
    conv = TritonExperts.convert_weights(cfg, wts["w13"], wts["w2"])
    x = make_x(150, 64, torch.float32, device)
    tw, ti = make_routing(150, 8, 2, device, seed=2)
    outs = [
        fused_moe_triton(x, conv["w13"], conv["w2"], tw, ti, config=c)
        for c in (TAIL_TILES, dataclasses.replace(TAIL_TILES, tail_m=0))
    ]
    assert rel_err(outs[0], outs[1].double()) < (1e-6 if not ON_GPU else 1e-3)


# rows of never-written activations (invalid experts) enter GEMM 2's TMA boxes; the
# interpreter may warn about their garbage (matmul, epilogue), whose results are never stored
@pytest.mark.filterwarnings("ignore:invalid value encountered in (matmul|multiply):RuntimeWarning")
def test_triton_invalid_expert_contributes_nothing(device):
    """A pair routed to expert -1 adds nothing, like the reference."""
    dtype = dtypes_for_device()[-1]
    cfg = ExpertsConfig(8, 32, 32, 2, "silu")
    wts = make_weights(cfg, dtype, device)
    x = make_x(6, 32, dtype, device)
    tw, ti = make_routing(6, 8, 2, device)
    ti[1, 1] = -1
    ti[4, :] = -1
    out = TritonExperts(cfg, wts["w13"], wts["w2"]).apply(x, tw, ti)
    ref = reference_output(cfg, wts, x, tw, ti, dtype=torch.float64)
    assert bool((out[4] == 0).all())
    assert rel_err(out, ref) < REL_TOL[dtype]


def test_triton_experts_class_contract(device):
    """The backend declares its name and format, and apply returns x's shape and dtype."""
    assert TritonExperts.backend == "triton"
    assert TritonExperts.activation_format == "standard"
    assert TritonExperts.supports_lora is True
    assert TritonExperts.is_available()[0]
    dtype = dtypes_for_device()[0]
    cfg = ExpertsConfig(4, 32, 32, 2, "gelu_tanh", gated=False)
    wts = make_weights(cfg, dtype, device)
    x = make_x(3, 32, dtype, device)
    tw, ti = make_routing(3, 4, 2, device)
    out = TritonExperts(cfg, wts["w13"], wts["w2"]).apply(x, tw, ti)
    assert out.shape == (3, 32) and out.dtype == dtype and out.device == x.device


def test_convert_weights_is_pure(device):
    """convert_weights leaves its inputs and the config untouched and interleaves gate/up rows."""
    cfg = ExpertsConfig(4, 16, 8, 2, "silu", has_bias=True)
    wts = make_weights(cfg, torch.float32, device)
    before = {k: v.clone() for k, v in wts.items() if v is not None}
    cfg_before = ExpertsConfig(**cfg.__dict__)
    conv = TritonExperts.convert_weights(
        cfg, wts["w13"], wts["w2"], wts["w13_bias"], wts["w2_bias"]
    )
    for k, v in before.items():
        assert torch.equal(wts[k], v), k
    assert cfg == cfg_before
    assert torch.equal(conv["w13"][:, 0::2], wts["w13"][:, :8])
    assert torch.equal(conv["w13"][:, 1::2], wts["w13"][:, 8:])
    assert torch.equal(conv["w13_bias"][:, 1::2], wts["w13_bias"][:, 8:])
    assert conv["w13"].data_ptr() != wts["w13"].data_ptr()
    oai = ExpertsConfig(4, 16, 8, 2, "swigluoai", has_bias=True)
    conv = TritonExperts.convert_weights(
        oai, wts["w13"], wts["w2"], wts["w13_bias"], wts["w2_bias"]
    )
    assert torch.equal(conv["w13"], wts["w13"])  # already interleaved
    step = ExpertsConfig(4, 16, 8, 2, "swiglustep", has_bias=True)
    conv = TritonExperts.convert_weights(
        step, wts["w13"], wts["w2"], wts["w13_bias"], wts["w2_bias"]
    )
    assert torch.equal(conv["w13"][:, 0::2], wts["w13"][:, :8])  # [gate; up]: interleaved here
    assert torch.equal(conv["w13_bias"][:, 1::2], wts["w13_bias"][:, 8:])


def test_launcher_rejects_bad_input(device):
    """Shape, dtype and stride errors raise ValueError naming what was received."""
    cfg = ExpertsConfig(4, 32, 16, 2, "silu")
    wts = make_weights(cfg, torch.float32, device)
    x = make_x(3, 32, torch.float32, device)
    tw, ti = make_routing(3, 4, 2, device)
    with pytest.raises(ValueError, match=r"shape mismatch: x \(3, 32\)"):
        fused_moe_triton(x, wts["w13"][:, :20], wts["w2"], tw, ti)
    with pytest.raises(ValueError, match=r"torch.float16"):
        fused_moe_triton(x.half(), wts["w13"], wts["w2"], tw, ti)
    with pytest.raises(ValueError, match=r"unit stride along H, got strides \(1, 3\)"):
        fused_moe_triton(x.t().contiguous().t(), wts["w13"], wts["w2"], tw, ti)
    with pytest.raises(ValueError, match=r"topk_ids/topk_weights.*\(3, 1\)"):
        fused_moe_triton(x, wts["w13"], wts["w2"], tw, ti[:, :1].contiguous())
    with pytest.raises(ValueError, match=r"'relu2' with gated=True"):
        fused_moe_triton(x, wts["w13"], wts["w2"], tw, ti, activation="relu2")
    with pytest.raises(ValueError, match=r"'swiglustep' with gated=False"):
        fused_moe_triton(x, wts["w13"][:, :16], wts["w2"], tw, ti, activation="swiglustep",
                         gated=False)  # fmt: skip
    with pytest.raises(ValueError, match=r"do not match the config"):
        TritonExperts(ExpertsConfig(4, 32, 8, 2, "silu"), wts["w13"], wts["w2"])


def test_launcher_rejects_tensors_off_xs_device_and_empty_sizes(device):
    """A weight, the routing or a bias on another device than x (meta here; a CPU weight under
    a CUDA x failed inside Triton's launcher) and E, H or I of 0 raise ValueError naming them
    (they raised NotImplementedError, ZeroDivisionError, RuntimeError or AssertionError)."""
    cfg = ExpertsConfig(4, 32, 16, 2, "silu", has_bias=True)
    wts = make_weights(cfg, torch.float32, device)
    w13, w2, b13, b2 = wts["w13"], wts["w2"], wts["w13_bias"], wts["w2_bias"]
    x = make_x(3, 32, torch.float32, device)
    tw, ti = make_routing(3, 4, 2, device)
    with pytest.raises(ValueError, match=r"on x's device \S+; got w13 on meta, w2 on meta$"):
        fused_moe_triton(x, w13.to("meta"), w2.to("meta"), tw, ti)
    with pytest.raises(ValueError, match=r"on x's device \S+; got topk_ids on meta$"):
        fused_moe_triton(x, w13, w2, tw, ti.to("meta"))
    with pytest.raises(ValueError, match=r"on x's device \S+; got w2_bias on meta$"):
        fused_moe_triton(x, w13, w2, tw, ti, w13_bias=b13, w2_bias=b2.to("meta"))
    with pytest.raises(ValueError, match="1 to 1024 experts are supported, got 0"):
        fused_moe_triton(x, w13[:0], w2[:0], tw, ti)
    with pytest.raises(ValueError, match="sizes must be positive, got H=32, I=0"):
        fused_moe_triton(x, w13[:, :0], w2[:, :, :0], tw, ti)


@pytest.mark.parametrize("naive", [None, False])
def test_empty_batch_gives_an_empty_output(naive, device):
    """T = 0 (engines call the layer with no tokens) returns [0, H] in x's dtype."""
    cfg = ExpertsConfig(4, 32, 16, 2, "silu", has_bias=True)
    wts = make_weights(cfg, torch.float16, device)
    conv = TritonExperts.convert_weights(
        cfg, wts["w13"], wts["w2"], wts["w13_bias"], wts["w2_bias"]
    )
    x = make_x(0, 32, torch.float16, device)
    tw, ti = make_routing(0, 4, 2, device)
    out = fused_moe_triton(x, conv["w13"], conv["w2"], tw, ti, w13_bias=conv["w13_bias"],
                           w2_bias=conv["w2_bias"], naive=naive)  # fmt: skip
    assert out.shape == (0, 32) and out.dtype == torch.float16 and out.device == x.device


# ---------------------------------------------------------------- configs


def test_config_keys_are_kernel_arguments():
    """Every tile-config field maps to a kernel constexpr or a launch option."""
    names = set(moe_gemm_kernel.arg_names)
    fields = set(tc.GemmConfig.__dataclass_fields__)
    launch_options = {"num_warps", "num_stages"}
    renamed = {"tma": "B_TMA"}
    for f in fields - launch_options:
        assert renamed.get(f, f.upper()) in names, f
    assert "BLOCK_M" in names
    for f in set(tc.MoEConfig.__dataclass_fields__) - {"gemm1", "gemm2"}:
        assert f.upper() in names, f


@pytest.mark.parametrize("t", [1, 16, 64, 256, 1024, 2048, 8192])
@pytest.mark.parametrize(("e", "k", "h", "i", "gated"),
                         [(128, 6, 2688, 1856, False), (8, 2, 4096, 14336, True), (128, 8, 2048, 768, True),
                          (256, 8, 7168, 2048, True)])  # fmt: skip
def test_heuristic_configs_are_sane(t, e, k, h, i, gated):
    """Heuristic tiles are powers of two, fit shared memory and grow with the batch."""
    c = tc.heuristic_config(t, e, k, h, i, gated)
    for g, b_tiles in ((c.gemm1, 2 if gated else 1), (c.gemm2, 1)):
        for v in (c.block_m, g.block_n, g.block_k):
            assert v >= 16 and v & (v - 1) == 0
        assert tc.smem_bytes(c.block_m, g, b_tiles) <= tc.SMEM_LIMIT
    per_expert = t * k / e
    if tc.is_decode_batch(t, k, e):
        assert c.block_m == 16 and c.pdl
        return
    # the block holds an expert's rows at mean + 2.5 sd; half of it would not
    rows = tc.expert_rows_quantile(t, e, k)
    assert c.block_m >= min(128, rows) and (c.block_m == 16 or c.block_m / 2 < rows)
    if per_expert >= 128:
        # persistent GEMMs where the N tiles divide I and H (Qwen3, Mixtral), else half-height
        # tiles for the experts' last blocks (Nemotron: N = 1856 and 2688 leave narrow tiles)
        divides = i % c.gemm1.block_n == 0 and h % c.gemm2.block_n == 0
        assert divides is ((e, i) != (128, 1856))
        assert c.persistent is divides
        assert c.tail_m == (0 if c.persistent else 64)
    else:
        assert not c.persistent
        assert c.tail_m == (64 if c.block_m == 128 else 0)


@pytest.mark.parametrize(("t", "e", "k", "block_m"), [
    (256, 128, 8, 32),  # 16 rows per expert on average: 16-row blocks would split most experts
    (64, 8, 2, 32), (1024, 256, 8, 64), (16, 256, 8, 16), (256, 8, 2, 128), (4096, 128, 8, 128),
])  # fmt: skip
def test_heuristic_block_holds_an_experts_rows(t, e, k, block_m):
    assert tc.heuristic_config(t, e, k, 4096, 1536, True).block_m == block_m


def test_heuristic_decode_keeps_wide_mma_unless_sms_idle():
    """Decode N tiles: ~4 programs per SM, but GEMM 2 stays 64 wide unless that leaves SMs
    idle (E=128, k=8, H=4096: 8 x 64 programs; E=16, k=2: 2 x 64 < 132 -> 32 wide)."""
    assert tc.heuristic_config(1, 128, 8, 4096, 1536, True).gemm2.block_n == 64
    assert tc.heuristic_config(1, 16, 2, 4096, 6400, True).gemm2.block_n == 32
    assert tc.heuristic_config(1, 16, 2, 4096, 6400, True, num_sms=64).gemm2.block_n == 64


def test_heuristic_short_intermediate_takes_eight_warps():
    """I <= 512 (GEMM 2 runs 4 K tiles of 128): 8 warps, 3 stages off decode."""
    c = tc.heuristic_config(64, 512, 10, 2048, 512, True)
    assert (c.gemm2.num_warps, c.gemm2.num_stages, c.gemm2.block_k) == (8, 3, 128)
    assert tc.heuristic_config(64, 512, 10, 2048, 1536, True).gemm2.num_warps == 4


def test_tuned_file_nearest_key(tmp_path, monkeypatch):
    """A tuned file is used for its (E, N, device) and the nearest token count wins."""
    cfg_small = tc.MoEConfig(16, tc.GemmConfig(32, 64), tc.GemmConfig(64, 128))
    cfg_big = tc.MoEConfig(128, tc.GemmConfig(128, 64, 8, 8, 4), tc.GemmConfig(256, 64, 8, 8, 4))
    name = tc.config_file_name(8, 96, "NVIDIA H200 NVL")
    assert name == "E=8,N=96,device_name=NVIDIA_H200.json"
    import json

    (tmp_path / name).write_text(
        json.dumps({"configs": {"1": cfg_small.to_dict(), "1024": cfg_big.to_dict()}})
    )
    monkeypatch.setattr(tc, "CONFIG_DIR", tmp_path)
    tc.load_tuned.cache_clear()
    try:
        assert tc.get_config(3, 8, 2, 64, 96, True, "NVIDIA H200") == cfg_small
        assert tc.get_config(900, 8, 2, 64, 96, True, "NVIDIA H200") == cfg_big
        assert tc.get_config(3, 8, 2, 64, 96, True, "Other GPU") == tc.heuristic_config(
            3, 8, 2, 64, 96, True
        )
    finally:
        tc.load_tuned.cache_clear()


#: Triton's max_shared_mem (opt-in bytes per block) of three parts: Hopper, A100, Ada.
SMEM_H100, SMEM_A100, SMEM_ADA = 232448, 166912, 101376


def test_smem_budget_keeps_hopper_and_shrinks_elsewhere():
    assert tc.smem_budget(SMEM_H100) == tc.SMEM_LIMIT
    assert tc.smem_budget(SMEM_A100) == SMEM_A100 - tc.SMEM_RESERVE < tc.SMEM_LIMIT
    assert tc.smem_budget(SMEM_ADA) == 72 * 1024


@pytest.mark.parametrize("smem", [SMEM_A100, SMEM_ADA])
@pytest.mark.parametrize(("e", "k", "h", "i", "gated"),
                         [(128, 6, 2688, 1856, False), (8, 2, 4096, 14336, True), (128, 8, 2048, 768, True),
                          (32, 4, 2880, 2880, True), (256, 8, 7168, 2048, True)])  # fmt: skip
def test_heuristic_fits_smaller_shared_memory(e, k, h, i, gated, smem):
    """On parts with less shared memory than Hopper every tile still fits (fewer stages first,
    then narrower tiles), and on Hopper's budget the heuristic is the default one."""
    limit = tc.smem_budget(smem)
    for t in (1, 16, 64, 256, 1024, 4096, 8192):
        c = tc.heuristic_config(t, e, k, h, i, gated, smem_limit=limit, num_sms=108)
        for g, b_tiles in ((c.gemm1, 2 if gated else 1), (c.gemm2, 1)):
            assert tc.smem_bytes(c.block_m, g, b_tiles) <= limit, (t, g)
            assert g.num_stages >= 2 and g.block_n >= 32 and g.block_k >= 32
        hopper = tc.heuristic_config(t, e, k, h, i, gated, smem_limit=tc.smem_budget(SMEM_H100),
                                     num_sms=132)  # fmt: skip
        assert hopper == tc.heuristic_config(t, e, k, h, i, gated)


def test_fit_stages_drops_stages_then_narrows_n_then_k():
    g = tc.GemmConfig(256, 128, 8, 8, 4)
    assert tc.fit_stages(128, g, 1, 10**9) == g
    two = tc.fit_stages(128, g, 1, tc.smem_bytes(128, dataclasses.replace(g, num_stages=2), 1))
    assert (two.num_stages, two.block_n, two.block_k) == (2, 256, 128)
    narrow = tc.fit_stages(128, g, 1, 2 * (128 * 128 + 64 * 128) * 2)
    assert (narrow.num_stages, narrow.block_n, narrow.block_k) == (2, 64, 128)
    floor = tc.fit_stages(128, g, 1, 1)  # nothing fits: the smallest tile, not a loop forever
    assert (floor.num_stages, floor.block_n, floor.block_k) == (2, 32, 32)


@pytest.mark.parametrize(("e", "i", "k", "h", "gated"),
                         [(128, 1856, 6, 2688, False), (8, 14336, 2, 4096, True),
                          (128, 768, 8, 2048, True), (32, 2880, 4, 2880, True)])  # fmt: skip
def test_fp32_configs_are_cut_to_fit(e, i, k, h, gated):
    """fp32 operands: the H200 files' tiles (and the heuristic's) are cut until the stages and
    the output tile fit the budget (they asked for up to 459 KB of 227 on the H200); bf16 and
    fp16 get the tuned entries untouched."""
    for t in (1, 16, 64, 256, 1024, 4096, 8192):
        for name in ("NVIDIA H200", None):
            bf16 = tc.get_config(t, e, k, h, i, gated, name)
            assert tc.get_config(t, e, k, h, i, gated, name, elem_bytes=2) == bf16
            fp32 = tc.get_config(t, e, k, h, i, gated, name, elem_bytes=4)
            assert (fp32.block_m, fp32.persistent, fp32.tail_m) == (bf16.block_m, bf16.persistent,
                                                                   bf16.tail_m)  # fmt: skip
            for g, b_tiles in ((fp32.gemm1, 2 if gated else 1), (fp32.gemm2, 1)):
                assert tc.smem_bytes(fp32.block_m, g, b_tiles, 4, True) <= tc.SMEM_LIMIT, (t, g)
                assert g.num_stages >= 2 and g.block_n >= 32 and g.block_k >= 32
    prefill = tc.get_config(4096, 8, 2, 4096, 14336, True, "NVIDIA H200", elem_bytes=4)
    assert prefill.gemm2.block_n < 256  # 128 x 256 fp32 output tile: 128 KB on its own


def test_lora_shrink_tiles_fit_the_dtype_and_part():
    """The shrink keeps its tiles in bf16 on Hopper's budget; fp32 or a smaller part first
    loses a stage, then K width (down to 16 columns)."""
    from moe_policy.experts.triton.lora import shrink_tiles

    for bm, bk in ((16, 128), (32, 128), (64, 128), (128, 64)):
        for a_cols in (64, 128):
            assert shrink_tiles(bm, 2048, a_cols, 2) == (bk, 3)
    assert shrink_tiles(16, 40, 128, 2) == (64, 3)  # short K: the next power of two
    assert shrink_tiles(16, 2048, 128, 4) == (128, 2)  # fp32 decode: 3 x 72 KB > 200 KB
    ada = tc.smem_budget(SMEM_ADA)
    assert shrink_tiles(16, 2048, 128, 2, ada) == (128, 2)
    assert shrink_tiles(16, 2048, 128, 4, ada) == (64, 2)
    assert shrink_tiles(128, 2048, 128, 4, ada) == (32, 2)
    for bm in (16, 128):
        bk, stages = shrink_tiles(bm, 2048, 128, 4, ada)
        assert stages * (bm + 128) * bk * 4 <= ada
    assert shrink_tiles(128, 2048, 128, 4, 1) == (16, 2)  # nothing fits: the floor, no loop


@pytest.mark.parametrize(("dtype", "elem"), [(torch.float16, 2), (torch.float32, 4)])
def test_plan_asks_get_config_for_the_devices_limits(monkeypatch, dtype, elem):
    """The plan's tile config is get_config's for the device's limits (off CUDA: none, the
    defaults) and the operands' element size (fp32 tiles take twice the shared memory)."""
    from moe_policy.experts.triton import device as triton_device

    assert triton_device.config_limits(torch.device("cpu")) == {}
    monkeypatch.setattr(triton_device, "cuda_limits", lambda index: {"smem_limit": index})
    assert triton_device.config_limits(torch.device("cuda", 3)) == {"smem_limit": 3}
    assert device_limits(torch.device("cpu")) == DeviceLimits(tma=not ON_GPU)  # interpreted
    problem = MoEProblem(3000, 2, 4, 64, 96, elem_bytes=elem)
    for dev in (DeviceLimits(), DeviceLimits(smem_limit=40 * 1024, num_sms=2, tile_sms=2)):
        want = tc.get_config(3000, 4, 2, 64, 96, True, smem_limit=dev.smem_limit,
                             num_sms=dev.tile_sms, elem_bytes=elem)  # fmt: skip
        assert plan_launch(problem, dev).config == want
    assert (
        plan_launch(problem, DeviceLimits(smem_limit=40 * 1024)).config
        != plan_launch(problem, DeviceLimits()).config
    )


def test_tuned_key_between_two_entries():
    """Nearest in log scale, compared exactly; halfway, the upper entry if it has prefill tiles
    (BLOCK_M >= 64), else the lower."""
    decode = tc.MoEConfig(16, tc.GemmConfig(32, 64), tc.GemmConfig(64, 128))
    small = tc.MoEConfig(32, tc.GemmConfig(32, 64), tc.GemmConfig(64, 128))
    big = tc.MoEConfig(128, tc.GemmConfig(128, 64, 8, 8, 4), tc.GemmConfig(256, 64, 8, 8, 4))
    table = {1: decode, 16: decode, 64: small, 256: big, 1024: big}
    pick = {t: tc.nearest_tuned_key(table, t) for t in (0, 1, 2, 4, 5, 31, 32, 33, 100,
                                                              128, 129, 511, 512, 5000)}  # fmt: skip
    assert pick == {0: 1, 1: 1, 2: 1, 4: 1, 5: 16, 31: 16, 32: 16, 33: 64, 100: 64,
                    128: 256, 129: 256, 511: 256, 512: 1024, 5000: 1024}  # fmt: skip


def test_config_from_dict_rejects_unknown_keys():
    """A malformed tuned entry raises ValueError naming it."""
    with pytest.raises(ValueError, match="bad MoE config"):
        tc.MoEConfig.from_dict(
            {"block_m": 16, "gemm1": {"block_n": 32, "BLOCK_K": 64}, "gemm2": {}}
        )
    good = TAIL_TILES.to_dict()
    with pytest.raises(ValueError, match=r"unknown keys \['tail'\]"):
        tc.MoEConfig.from_dict({**good, "tail": 16})


def test_config_tail_round_trips_and_validates():
    """tail_m survives the JSON form, is left out when off, and bad tails are refused."""
    assert tc.MoEConfig.from_dict(TAIL_TILES_TMA.to_dict()) == TAIL_TILES_TMA
    plain = dataclasses.replace(TAIL_TILES, tail_m=0)
    assert "tail_m" not in plain.to_dict()
    assert tc.MoEConfig.from_dict(plain.to_dict()) == plain
    for bad in (8, 24, 32):  # below 16, not a power of two, more than block_m / 2 (= 16)
        with pytest.raises(ValueError, match=r"tail_m must be .* \[16, block_m/2=16\], got"):
            dataclasses.replace(TAIL_TILES, tail_m=bad)


def test_config_pdl_round_trips_and_validates(device):
    """pdl survives the JSON form, is left out when off and refuses a non-boolean; calls with
    it match the reference (dependent launches on a Hopper GPU, none under the interpreter)."""
    on = dataclasses.replace(TAIL_TILES, pdl=True)
    assert on.to_dict()["pdl"] is True and "pdl" not in TAIL_TILES.to_dict()
    assert tc.MoEConfig.from_dict(on.to_dict()) == on
    with pytest.raises(ValueError, match="pdl must be true or false, got 'yes'"):
        tc.MoEConfig.from_dict({**TAIL_TILES.to_dict(), "pdl": "yes"})
    dtype = dtypes_for_device()[-1]
    for cfg, t, naive in ((ExpertsConfig(8, 72, 40, 2, "silu"), 150, None),
                          (ExpertsConfig(64, 64, 48, 4, "relu2", gated=False), 3, True)):  # fmt: skip
        err = _run(cfg, t, dtype, device, tiles=on, naive=naive)
        assert err < REL_TOL[dtype], f"{cfg.activation} T={t}: relative error {err:.2e}"


def test_config_trigger_round_trips_and_validates(device):
    """trigger is left out when unset (the rule decides), survives the JSON form as true and
    as false, refuses a non-boolean; a decode call with it forced matches the reference."""
    assert "trigger" not in TAIL_TILES.to_dict()
    for value in (True, False):
        cfg = dataclasses.replace(TAIL_TILES, pdl=True, trigger=value)
        assert cfg.to_dict()["trigger"] is value
        assert tc.MoEConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ValueError, match="trigger must be true or false, got 1"):
        tc.MoEConfig.from_dict({**TAIL_TILES.to_dict(), "trigger": 1})
    dtype = dtypes_for_device()[-1]
    tiles = dataclasses.replace(TAIL_TILES, pdl=True, trigger=True)
    err = _run(ExpertsConfig(64, 64, 48, 4, "silu"), 3, dtype, device, tiles=tiles, naive=True)
    assert err < REL_TOL[dtype], f"relative error {err:.2e}"


def test_experts_package_import_is_light():
    """Importing moe_policy.experts pulls in neither torch nor triton."""
    code = "import sys, moe_policy.experts; print('torch' in sys.modules, 'triton' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_tma_descriptor_only_where_tma_can_serve(device):
    """TMA is planned when the tiles ask, the box fits (at most 256 rows) and the device has
    TMA; the launcher then uses it where the rows are 16-byte aligned and the tensor is
    contiguous; otherwise pointers serve."""
    from moe_policy.experts.triton import fused_moe as tm

    def gemm1(block_n, tma=True, device_tma=True):
        tiles = tc.MoEConfig(16, tc.GemmConfig(block_n, 16, tma=tma), tc.GemmConfig(32, 16))
        problem = MoEProblem(3, 2, 4, 72, 32, gated=False)
        return plan_launch(problem, DeviceLimits(tma=device_tma), tiles).gemm1

    assert gemm1(32).b_tma and not gemm1(32, tma=False).b_tma  # not asked
    assert not gemm1(32, device_tma=False).b_tma
    assert not gemm1(512).b_tma  # box taller than 256 rows
    w = torch.zeros(4, 64, 72, dtype=torch.float16, device=device)
    assert tm.weight_descriptor(w, gemm1(32)) is not None
    assert tm.weight_descriptor(w, gemm1(32, tma=False)) is None
    odd = torch.zeros(4, 64, 70, dtype=torch.float16, device=device)  # 140-byte rows
    assert tm.weight_descriptor(odd, gemm1(32)) is None
    assert tm.weight_descriptor(w.transpose(1, 2), gemm1(32)) is None  # not contiguous


def test_tma_tiles_fall_back_on_unaligned_rows(device):
    """Tiles asking for TMA on rows TMA cannot address still match the reference."""
    dtype = dtypes_for_device()[0]
    cfg = ExpertsConfig(6, 70, 36, 3, "silu")  # fp16 rows of 140 bytes
    err = _run(cfg, 23, dtype, device, tiles=SMALL_TILES_TMA)
    assert err < REL_TOL[dtype], f"relative error {err:.2e}"


@pytest.mark.parametrize(
    ("cfg", "t"),
    [
        (ExpertsConfig(64, 72, 40, 8, "silu"), 2),  # H not a multiple of GEMM 2's N tile
        (ExpertsConfig(64, 64, 48, 6, "relu2", gated=False), 3),
        (ExpertsConfig(32, 32, 32, 2, "swigluoai", has_bias=True), 4),
        (ExpertsConfig(64, 48, 32, 4, "silu", apply_router_weight_on_input=True), 1),
    ],
)
@pytest.mark.parametrize("dtype", dtypes_for_device())
# GEMM 2's TMA box spans the rows after the pair's own, some never written (invalid experts):
# the interpreter warns about their garbage (matmul, epilogue), whose results are never stored
@pytest.mark.filterwarnings("ignore:invalid value encountered in (matmul|multiply):RuntimeWarning")
def test_decode_fused_sum_equals_sum_kernel(cfg, t, dtype, device, record_launches):
    """Decode (one pair per block): GEMM 2's last-arriving pair per token and N tile writes the
    top-k sum; bit-identical to the separate sum kernel, invalid experts included, and every
    call re-zeroes its counters (the same output twice)."""
    wts = make_weights(cfg, dtype, device)
    conv = TritonExperts.convert_weights(
        cfg, wts["w13"], wts["w2"], wts["w13_bias"], wts["w2_bias"]
    )
    x = make_x(t, cfg.hidden_size, dtype, device)
    tw, ti = make_routing(t, cfg.num_experts, cfg.top_k, device, seed=t)
    ti[0, -1] = -1  # one invalid slot
    if t > 2:
        ti[2, :] = cfg.num_experts  # a token with no valid expert at all

    def run(plan=None):
        return fused_moe_triton(
            x, conv["w13"], conv["w2"], tw, ti, activation=cfg.activation, gated=cfg.gated,
            w13_bias=conv["w13_bias"], w2_bias=conv["w2_bias"],
            apply_router_weight_on_input=cfg.apply_router_weight_on_input, naive=True, plan=plan,
        )  # fmt: skip

    sums = _count_sum_launches(record_launches)
    fused = run()
    assert torch.equal(run(), fused)
    assert sums == []  # GEMM 2 summed; no sum kernel ran
    plan = plan_launch(MoEProblem.of(cfg, t, x.element_size()), device_limits(x.device), naive=True)
    assert plan.fused_sum
    assert torch.equal(run(plan=dataclasses.replace(plan, fused_sum=False)), fused)
    assert len(sums) == 1
    if t > 2:
        assert bool((fused[2] == 0).all())
    ref = reference_output(cfg, wts, x, tw, ti, dtype=torch.float64)
    assert rel_err(fused, ref) < REL_TOL[dtype]


def test_decode_fused_sum_needs_whole_counter_words(device, record_launches):
    """An odd hidden size in 16-bit (rows not a whole number of int32 words) keeps the sum
    kernel and still matches the reference."""
    dtype = dtypes_for_device()[0]
    cfg = ExpertsConfig(32, 33, 32, 2, "silu")
    wts = make_weights(cfg, dtype, device)
    conv = TritonExperts.convert_weights(cfg, wts["w13"], wts["w2"])
    x = make_x(2, 33, dtype, device)
    tw, ti = make_routing(2, 32, 2, device)
    sums = _count_sum_launches(record_launches)
    out = fused_moe_triton(x, conv["w13"], conv["w2"], tw, ti, naive=True)
    assert len(sums) == 1
    ref = reference_output(cfg, wts, x, tw, ti, dtype=torch.float64)
    assert rel_err(out, ref) < REL_TOL[dtype]


def _count_sum_launches(record_launches) -> list:
    """Record each launch of the separate top-k sum kernel."""
    from moe_policy.experts.triton import fused_moe as triton_moe

    return record_launches(triton_moe, "moe_sum_kernel")


#: N tiles of 64 columns over N = 64*k + 24 (GEMM 1, I = 88) and + 8 (GEMM 2, H = 200): the last
#: tile is at most half full and runs 32 and 16 wide.
N_TAIL_TILES = tc.MoEConfig(
    32, tc.GemmConfig(64, 32, 2, 4, 2, tma=True), tc.GemmConfig(64, 32, 2, 4, 2, tma=True)
)


@pytest.mark.parametrize(
    ("act", "gated", "tiles"),
    [
        ("silu", True, N_TAIL_TILES),  # one-dot gated through TMA; the tail tile by pointers
        ("gelu", True, dataclasses.replace(N_TAIL_TILES, gemm1=tc.GemmConfig(64, 32, 2, 4, 2))),
        ("relu2", False, N_TAIL_TILES),
    ],
    ids=["one-dot-tma", "two-dot", "nongated"],
)
def test_narrow_last_n_tile_matches_wide_one(act, gated, tiles, device, record_launches):
    """A last N tile at most half full runs a narrow tile; results match the reference and
    the full-width tile, with bias and LoRA too."""
    from moe_policy.experts.lora import MoELoRAContext
    from moe_policy.experts.testing import lora_mapping, make_lora
    from moe_policy.experts.triton import fused_moe as triton_moe

    dtype = dtypes_for_device()[-1]
    cfg = ExpertsConfig(8, 200, 88, 2, act, gated=gated, has_bias=True)
    wts = make_weights(cfg, dtype, device)
    conv = TritonExperts.convert_weights(
        cfg, wts["w13"], wts["w2"], wts["w13_bias"], wts["w2_bias"]
    )
    x = make_x(70, 200, dtype, device)
    tw, ti = make_routing(70, 8, 2, device, seed=4)
    ad = make_lora(cfg, num_slots=2, max_rank=16, ranks=[16, 8], dtype=dtype, device=device)
    ctx = MoELoRAContext(ad, lora_mapping(70, "some_none", 2, device))
    gemms = record_launches(triton_moe, "moe_gemm_kernel")

    def run(lora=None, plan=None):
        return fused_moe_triton(
            x, conv["w13"], conv["w2"], tw, ti, activation=act, gated=gated,
            w13_bias=conv["w13_bias"], w2_bias=conv["w2_bias"], config=tiles, lora=lora,
            plan=plan,
        )  # fmt: skip

    narrow, narrow_lora = run(), run(ctx)
    assert [kw["TAIL_N"] for _, kw in gemms] == [32, 16, 32, 16]

    def wide_plan(lora=None):
        rank = (ad.num_slots, ad.max_rank) if lora is not None else ()
        plan = plan_launch(MoEProblem.of(cfg, 70, x.element_size(), *rank),
                           device_limits(x.device), tiles)  # fmt: skip
        return dataclasses.replace(plan, narrow_n=False)

    wide, wide_lora = run(plan=wide_plan()), run(ctx, plan=wide_plan(ctx))
    assert [kw["TAIL_N"] for _, kw in gemms[4:]] == [0, 0, 0, 0]
    tol = 1e-6 if not ON_GPU else 1e-3
    assert rel_err(narrow, wide.double()) < tol
    assert rel_err(narrow_lora, wide_lora.double()) < tol
    assert (
        rel_err(narrow, reference_output(cfg, wts, x, tw, ti, dtype=torch.float64)) < REL_TOL[dtype]
    )


# ---------------------------------------------------------------- persistent GEMMs

#: Persistent GEMMs on small tiles: off the GPU a "device" has 4 SMs, so 4 programs each walk
#: many tiles (N tiles of both GEMMs, blocks of several experts, empty ones skipped).
PERSISTENT_TILES = tc.MoEConfig(
    32, tc.GemmConfig(16, 32, 2, 4, 2, tma=True), tc.GemmConfig(32, 16, 3, 4, 2, tma=True),
    persistent=True,
)  # fmt: skip


def _layer_call(x, conv, tw, ti, act, gated, on_input):
    """config -> fused_moe_triton on these inputs and converted weights (with biases)."""

    def run(c, plan=None):
        return fused_moe_triton(
            x, conv["w13"], conv["w2"], tw, ti, activation=act, gated=gated,
            w13_bias=conv["w13_bias"], w2_bias=conv["w2_bias"],
            apply_router_weight_on_input=on_input, config=c, plan=plan,
        )  # fmt: skip

    return run


@pytest.mark.parametrize(
    ("act", "gated", "tiles", "routing", "on_input"),
    [
        ("silu", True, PERSISTENT_TILES, "uniform", False),  # one-dot gated through TMA
        ("gelu", True, dataclasses.replace(
            PERSISTENT_TILES, gemm1=tc.GemmConfig(16, 32, 2, 4, 2)), "skewed", False),  # two-dot
        ("relu2", False, PERSISTENT_TILES, "subset", True),  # idle experts, weight on input
        ("silu", True, dataclasses.replace(  # I = 40 = 32 + 8: narrow GEMM-1 tiles too
            PERSISTENT_TILES, gemm1=tc.GemmConfig(32, 32, 2, 4, 2, tma=True)), "uniform", False),
    ],
    ids=["one-dot-tma", "two-dot-skewed", "nongated-idle-experts", "narrow-last-n-tiles"],
)  # fmt: skip
def test_persistent_gemms_equal_one_program_per_tile(act, gated, tiles, routing, on_input,
                                                     device, monkeypatch, record_launches):  # fmt: skip
    """Persistent GEMMs (one program per SM walking the tiles) compute what one program per
    tile computes, bit for bit in fp32 off the GPU, and match the reference."""
    from moe_policy.experts.triton import fused_moe as triton_moe

    dtype = dtypes_for_device()[-1]
    cfg = ExpertsConfig(8, 72, 40, 3, act, gated=gated, has_bias=True,
                        apply_router_weight_on_input=on_input)  # fmt: skip
    wts = make_weights(cfg, dtype, device)
    conv = TritonExperts.convert_weights(
        cfg, wts["w13"], wts["w2"], wts["w13_bias"], wts["w2_bias"]
    )
    t = 2000 if ON_GPU else 90  # more tiles than SMs either way
    x = make_x(t, 72, dtype, device)
    tw, ti = make_routing(t, 8, 3, device, kind=routing, seed=5)
    gemms = record_launches(triton_moe, "moe_gemm_kernel")

    run = _layer_call(x, conv, tw, ti, act, gated, on_input)

    persistent = run(tiles)
    per_tile = run(dataclasses.replace(tiles, persistent=False))
    sms = sm_count(x.device)
    assert [kw["PERSISTENT"] for _, kw in gemms] == [True, True, False, False]
    # H = 72 = 2 x 32 + 8 leaves GEMM 2 a narrow last N tile (16 wide), persistent or not;
    # GEMM 1 has one where its tile is 32 wide (I = 40)
    narrow1 = 16 if tiles.gemm1.block_n == 32 else 0
    assert [kw["TAIL_N"] for _, kw in gemms] == [narrow1, 16, narrow1, 16]
    assert all(kw["_grid"][0] > sms for _, kw in gemms[2:])  # one program per tile
    assert [kw["_grid"] for _, kw in gemms[:2]] == [(sms,), (sms,)]  # one per SM
    if ON_GPU:
        assert rel_err(persistent, per_tile.double()) < 1e-3
    else:
        assert torch.equal(persistent, per_tile)
    assert (
        rel_err(persistent, reference_output(cfg, wts, x, tw, ti, dtype=torch.float64))
        < REL_TOL[dtype]
    )


@pytest.mark.filterwarnings("ignore:invalid value encountered in (matmul|multiply):RuntimeWarning")
@pytest.mark.parametrize("case", ["k1", "some-invalid", "all-invalid"])
def test_persistent_gemms_edge_routings(case, device):
    """Persistent GEMMs with k = 1 (GEMM 2 writes the output), with pairs routed to experts
    of another rank (-1, dropped by the alignment) and with no local pair at all (no live
    block: every program's loop is empty) equal the per-tile kernels and the reference."""
    dtype = dtypes_for_device()[-1]
    k = 1 if case == "k1" else 2
    cfg = ExpertsConfig(8, 64, 48, k, "silu", has_bias=True)
    wts = make_weights(cfg, dtype, device)
    conv = TritonExperts.convert_weights(
        cfg, wts["w13"], wts["w2"], wts["w13_bias"], wts["w2_bias"]
    )
    x = make_x(70, 64, dtype, device)
    tw, ti = make_routing(70, 8, k, device, seed=9)
    if case == "some-invalid":
        ti[::3, 0] = -1
    elif case == "all-invalid":
        ti.fill_(-1)

    def run(c):
        return fused_moe_triton(x, conv["w13"], conv["w2"], tw, ti, w13_bias=conv["w13_bias"],
                                w2_bias=conv["w2_bias"], config=c)  # fmt: skip

    persistent = run(PERSISTENT_TILES)
    per_tile = run(dataclasses.replace(PERSISTENT_TILES, persistent=False))
    if ON_GPU:
        assert rel_err(persistent, per_tile.double()) < 1e-3
    else:
        assert torch.equal(persistent, per_tile)
    if case == "all-invalid":
        assert not bool(persistent.any())
    else:
        assert (
            rel_err(persistent, reference_output(cfg, wts, x, tw, ti, dtype=torch.float64))
            < REL_TOL[dtype]
        )


@pytest.mark.parametrize(
    ("act", "gated", "k", "on_input", "t"),
    # off the GPU (4 "SMs") these T give 9 live 32-row blocks: 27 GEMM-1 tiles (a last round
    # of 3, run whole) and 18 GEMM-2 tiles (a last round of 2, split in two along K)
    [("silu", True, 3, False, 71), ("relu2", False, 2, True, 95), ("gelu", True, 1, False, 189)],
    ids=["one-dot-gated", "nongated-weight-on-input", "k1-direct"],
)
def test_stream_k_tails_match_whole_tiles(
    act, gated, k, on_input, t, device, monkeypatch, record_launches
):
    """Persistent GEMMs whose last round of tiles is split along K over all programs compute
    what whole tiles compute (up to fp32 summation order), match the reference, give the same
    bits on every run, read no partial tile they did not write (the workspace starts as NaN)
    and leave their arrival counters zero."""
    from moe_policy.experts.triton import fused_moe as triton_moe

    dtype = dtypes_for_device()[-1]
    cfg = ExpertsConfig(8, 72, 40, k, act, gated=gated, has_bias=True,
                        apply_router_weight_on_input=on_input)  # fmt: skip
    wts = make_weights(cfg, dtype, device)
    conv = TritonExperts.convert_weights(
        cfg, wts["w13"], wts["w2"], wts["w13_bias"], wts["w2_bias"]
    )
    t = 2000 if ON_GPU else t
    x = make_x(t, 72, dtype, device)
    tw, ti = make_routing(t, 8, k, device, seed=11)
    live_m = int(moe_align(ti, 8, PERSISTENT_TILES.block_m).num_padded) // 32
    sms = sm_count(x.device)
    rest = [(live_m * n) % sms for n in (3, 2)]  # last-round tiles; N tiles: 40/16, 72/32
    partial_round = any(0 < r <= sms // 2 for r in rest)  # split along K in 2 or more parts
    assert partial_round or ON_GPU
    made = []

    def buffers(elems, programs, dev):
        ws, cnt = (
            torch.full((elems,), float("nan"), device=dev),
            torch.zeros(programs, dtype=torch.int32, device=dev),
        )
        made.append((ws, cnt))
        return ws, cnt

    monkeypatch.setattr(triton_moe, "stream_k_buffers", buffers)
    gemms = record_launches(triton_moe, "moe_gemm_kernel")

    run = _layer_call(x, conv, tw, ti, act, gated, on_input)
    # stream-K whether or not the memory budget of these small shapes has room for it
    plan = plan_launch(MoEProblem.of(cfg, t, x.element_size()), device_limits(x.device),
                       PERSISTENT_TILES)  # fmt: skip
    assert plan.persistent
    split = run(PERSISTENT_TILES, plan=dataclasses.replace(plan, stream_k=True))
    again = run(PERSISTENT_TILES, plan=dataclasses.replace(plan, stream_k=True))
    assert [kw["STREAM_K"] for _, kw in gemms] == [True, True, True, True]
    whole = run(PERSISTENT_TILES, plan=dataclasses.replace(plan, stream_k=False))
    assert [kw["STREAM_K"] for _, kw in gemms[4:]] == [False, False]
    assert torch.equal(split, again)
    assert not bool(split.isnan().any())
    assert rel_err(split, whole.double()) < (1e-3 if ON_GPU else 1e-6)
    assert (
        rel_err(split, reference_output(cfg, wts, x, tw, ti, dtype=torch.float64)) < REL_TOL[dtype]
    )
    ws, cnt = made[0]
    assert not bool(cnt.any())  # every split tile's last arrival zeroed its counter
    # tiles of the partial round were split and their partial sums went through the workspace
    assert bool(ws.isnan().all()) is not partial_round


def test_stream_k_needs_room_in_the_memory_budget(device, record_launches):
    """The stream-K workspace is allocated only inside the layer's memory budget: what one
    ``numel x max(N1, H)`` buffer leaves beside GEMM 2's ``numel x H`` output (all of it
    when k = 1, where GEMM 2 writes the layer output)."""
    from moe_policy.experts.triton import fused_moe as triton_moe
    from moe_policy.experts.triton import launch

    assert launch.stream_k_headroom_bytes(2048, 28672, 4096, 2, False) == 2048 * 24576 * 2
    assert launch.stream_k_headroom_bytes(100, 1536, 2048, 2, False) == 0  # Qwen3: N1 < H
    assert launch.stream_k_headroom_bytes(100, 1536, 2048, 2, True) == 100 * 2048 * 2
    assert launch.stream_k_workspace_elems(132, 128, 256) == 132 * 128 * 256
    cfg = ExpertsConfig(8, 72, 40, 3, "silu", has_bias=False)
    wts = make_weights(cfg, torch.float32, device)
    conv = TritonExperts.convert_weights(cfg, wts["w13"], wts["w2"])
    x = make_x(90, 72, torch.float32, device)
    tw, ti = make_routing(90, 8, 3, device, seed=11)
    gemms = record_launches(triton_moe, "moe_gemm_kernel")
    fused_moe_triton(x, conv["w13"], conv["w2"], tw, ti, config=PERSISTENT_TILES)
    # 270 pairs x (80 - 72) columns x 4 bytes is less than 4 programs' partial tiles
    assert [kw["STREAM_K"] for _, kw in gemms] == [False, False]


def test_persistent_config_is_ignored_at_decode_and_with_lora(device, record_launches):
    """Decode batches (one pair per block) and LoRA calls launch one program per tile even
    when the config asks for persistent GEMMs; a plan without them launches none."""
    from moe_policy.experts.lora import MoELoRAContext
    from moe_policy.experts.testing import lora_mapping, make_lora
    from moe_policy.experts.triton import fused_moe as triton_moe

    dtype = dtypes_for_device()[-1]
    cfg = ExpertsConfig(8, 64, 32, 2, "silu")
    wts = make_weights(cfg, dtype, device)
    conv = TritonExperts.convert_weights(cfg, wts["w13"], wts["w2"])
    ad = make_lora(cfg, num_slots=2, max_rank=16, ranks=[16, 8], dtype=dtype, device=device)
    gemms = record_launches(triton_moe, "moe_gemm_kernel")

    def run(t, lora=False, naive=None, plan=None):
        x = make_x(t, 64, dtype, device)
        tw, ti = make_routing(t, 8, 2, device, seed=6)
        ctx = MoELoRAContext(ad, lora_mapping(t, "round_robin", 2, device)) if lora else None
        out = fused_moe_triton(x, conv["w13"], conv["w2"], tw, ti, config=PERSISTENT_TILES,
                               lora=ctx, naive=naive, plan=plan)  # fmt: skip
        ref = reference_output(cfg, wts, x, tw, ti, dtype=torch.float64) if not lora else None
        assert ref is None or rel_err(out, ref) < REL_TOL[dtype]
        launched = [kw["PERSISTENT"] for _, kw in gemms]
        gemms.clear()
        return launched

    assert run(40) == [True, True]
    assert run(2, naive=True) == [False, False]
    assert run(40, lora=True) == [False, False]
    plan = plan_launch(MoEProblem.of(cfg, 40, conv["w13"].element_size()),
                       device_limits(conv["w13"].device), PERSISTENT_TILES)  # fmt: skip
    assert run(40, plan=dataclasses.replace(plan, persistent=False)) == [False, False]


def test_persistent_entry_run_per_tile_takes_the_default_tail_tiles(device, record_launches):
    """A persistent entry has no tail tiles (its loop cannot run them); run per tile, as with
    LoRA or in a plan without persistent GEMMs, it takes the default tails of its block
    height."""
    from moe_policy.experts.lora import MoELoRAContext
    from moe_policy.experts.testing import lora_mapping, make_lora
    from moe_policy.experts.triton import fused_moe as triton_moe

    dtype = dtypes_for_device()[-1]
    cfg = ExpertsConfig(4, 32, 32, 2, "silu")
    wts = make_weights(cfg, dtype, device)
    conv = TritonExperts.convert_weights(cfg, wts["w13"], wts["w2"])
    tiles = tc.MoEConfig(128, tc.GemmConfig(16, 32, 2, 4, 2, tma=True),
                         tc.GemmConfig(32, 32, 2, 4, 2, tma=True), persistent=True)  # fmt: skip
    ad = make_lora(cfg, num_slots=2, max_rank=16, ranks=[16, 8], dtype=dtype, device=device)
    t = 90  # two blocks per expert on average: full ones and short last ones
    x = make_x(t, 32, dtype, device)
    tw, ti = make_routing(t, 4, 2, device, seed=3)
    ctx = MoELoRAContext(ad, lora_mapping(t, "round_robin", 2, device))
    gemms = record_launches(triton_moe, "moe_gemm_kernel")

    def launched(lora=None, plan=None):
        out = fused_moe_triton(x, conv["w13"], conv["w2"], tw, ti, config=tiles, lora=lora,
                               plan=plan)  # fmt: skip
        got = [(kw["PERSISTENT"], kw["TAIL_M"]) for _, kw in gemms]
        gemms.clear()
        return out, got

    base, got = launched()
    assert got == [(True, 0)] * 2
    assert (
        rel_err(base, reference_output(cfg, wts, x, tw, ti, dtype=torch.float64)) < REL_TOL[dtype]
    )
    assert launched(ctx)[1] == [(False, tc.default_tail_m(128))] * 2
    plan = plan_launch(MoEProblem.of(cfg, t, x.element_size()), device_limits(x.device), tiles)
    per_tile, got = launched(plan=dataclasses.replace(plan, persistent=False))
    assert got == [(False, 64)] * 2
    tol = 1e-3 if ON_GPU else 1e-6
    assert rel_err(per_tile, base.double()) < tol


def test_config_persistent_round_trips_and_validates():
    """persistent survives the JSON form, is left out when off, refuses a non-boolean and
    refuses tail tiles, which the persistent loop does not run."""
    assert tc.MoEConfig.from_dict(PERSISTENT_TILES.to_dict()) == PERSISTENT_TILES
    assert PERSISTENT_TILES.to_dict()["persistent"] is True
    assert "persistent" not in dataclasses.replace(PERSISTENT_TILES, persistent=False).to_dict()
    with pytest.raises(ValueError, match="persistent must be true or false, got 'on'"):
        tc.MoEConfig.from_dict({**PERSISTENT_TILES.to_dict(), "persistent": "on"})
    with pytest.raises(ValueError, match="persistent GEMMs run no tail tiles: set tail_m to 0"):
        dataclasses.replace(PERSISTENT_TILES, tail_m=16)


@pytest.mark.parametrize(("hip", "cap", "expected"),
                         [(None, (9, 0), True), (None, (10, 0), True), (None, (8, 9), False),
                          ("6.2", (9, 4), False)])  # fmt: skip
def test_tma_and_dependent_launches_only_on_nvidia_hopper(monkeypatch, hip, cap, expected):
    """ROCm builds of torch report MI300-class GPUs as compute capability 9.4: no TMA or
    dependent launches there (ROCm's Triton rejects the launch option by name)."""
    from moe_policy.experts.triton import device as triton_device

    monkeypatch.setattr(torch.version, "hip", hip)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index: cap)
    assert triton_device.has_tma.__wrapped__(0) is expected
    assert triton_device.pdl_launch(False) == {}
    assert triton_device.pdl_launch(True) == {"launch_pdl": True}


def test_user_tuned_dir_wins_over_shipped_files(tmp_path, monkeypatch):
    """MOE_POLICY_TUNED_CONFIG_DIR: its file for (E, N, device) wins; without one there (or
    with the variable unset) the shipped file stays the fallback; a broken file is named."""
    shipped = tc.get_config(64, 128, 8, 2048, 768, True, "NVIDIA H200")
    mine = tc.MoEConfig(32, tc.GemmConfig(32, 64), tc.GemmConfig(64, 64))
    import json

    name = tc.config_file_name(128, 768, "NVIDIA H200")
    monkeypatch.setenv(tc.TUNED_DIR_ENV, str(tmp_path))
    tc.load_tuned.cache_clear()
    try:
        assert tc.get_config(64, 128, 8, 2048, 768, True, "NVIDIA H200") == shipped
        (tmp_path / name).write_text(json.dumps({"configs": {"64": mine.to_dict()}}))
        tc.load_tuned.cache_clear()
        assert tc.get_config(64, 128, 8, 2048, 768, True, "NVIDIA H200") == mine
        (tmp_path / name).write_text("{not json")
        tc.load_tuned.cache_clear()
        with pytest.raises(ValueError, match=r"E=128,N=768.*not a tuned config file"):
            tc.get_config(64, 128, 8, 2048, 768, True, "NVIDIA H200")
    finally:
        tc.load_tuned.cache_clear()


@pytest.mark.parametrize(
    ("where", "value", "want"),
    [
        ("block_m", 3, "block_m must be a power of two from 16 to 256, got 3"),
        ("block_m", 32.5, "block_m must be a power of two from 16 to 256, got 32.5"),
        ("block_m", "32", "block_m must be a power of two from 16 to 256, got '32'"),
        ("tail_m", 16.0, "tail_m must be 0 or a power of two in [16, block_m/2=16], got 16.0"),
        ("tail_m", 8, "tail_m must be 0 or a power of two in [16, block_m/2=16], got 8"),
        ("block_n", 24, "block_n must be a power of two from 16 to 512, got 24"),
        ("block_k", "64", "block_k must be a power of two from 16 to 512, got '64'"),
        ("num_warps", 3, "num_warps must be 1, 2, 4, 8 or 16, got 3"),
        ("num_stages", 0, "num_stages must be an integer from 1 to 8, got 0"),
        ("group_m", True, "group_m must be an integer >= 1, got True"),
        ("tma", "yes", "tma must be true or false, got 'yes'"),
    ],
)
def test_a_tuned_file_with_values_no_kernel_takes_is_refused_when_read(tmp_path, monkeypatch,
                                                                       where, value, want):  # fmt: skip
    """A tuned file is user input: a tile Triton would reject (or fail on) inside a launch is
    one error naming the file and the value when the file is read."""
    import json

    cfg = tc.MoEConfig(32, tc.GemmConfig(32, 64), tc.GemmConfig(64, 64)).to_dict()
    (cfg if where in ("block_m", "tail_m") else cfg["gemm2"])[where] = value
    name = tc.config_file_name(128, 768, "NVIDIA H200")
    (tmp_path / name).write_text(json.dumps({"configs": {"64": cfg}}))
    monkeypatch.setenv(tc.TUNED_DIR_ENV, str(tmp_path))
    tc.load_tuned.cache_clear()
    try:
        with pytest.raises(ValueError) as err:
            tc.get_config(64, 128, 8, 2048, 768, True, "NVIDIA H200")
    finally:
        tc.load_tuned.cache_clear()
    assert str(err.value).startswith(f"{tmp_path / name}: not a tuned config file")
    assert want in str(err.value)
