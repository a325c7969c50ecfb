"""Multi-adapter LoRA in the Triton fused MoE against the torch reference.

Mappings all-same / round-robin / some -1 / none, a disabled slot, ranks below the max rank
(zero-padded), gated, non-gated, interleaved swigluoai and clamped swiglustep; tokens without
an adapter must get exactly the base output.
"""

from __future__ import annotations

import dataclasses

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from moe_policy.experts.base import ExpertsConfig  # noqa: E402
from moe_policy.experts.lora import MoELoRAAdapters  # noqa: E402
from moe_policy.experts.testing import (  # noqa: E402
    ON_GPU,
    dtypes_for_device,
    lora_context,
    lora_mapping,
    make_lora,
    make_routing,
    make_weights,
    make_x,
    reference_output,
    rel_err,
)
from moe_policy.experts.triton import config as tc  # noqa: E402
from moe_policy.experts.triton.align import moe_align  # noqa: E402
from moe_policy.experts.triton.device import DeviceLimits, device_limits  # noqa: E402
from moe_policy.experts.triton.fused_moe import TritonExperts, fused_moe_triton  # noqa: E402
from moe_policy.experts.triton.launch import MoEProblem, plan_launch  # noqa: E402
from moe_policy.experts.triton.lora import lora_shrink  # noqa: E402

#: As in test_triton_moe; bf16 also rounds the shrink output to bf16 before the expand.
REL_TOL = {torch.float32: 1e-3 if ON_GPU else 1e-5, torch.float16: 3e-3, torch.bfloat16: 2e-2}
#: fp32 shrink against a float64 matmul (tf32 dots on a GPU).
SHRINK_TOL = {torch.float32: 2e-3 if ON_GPU else 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}


CASES = [
    # id, config, T, mapping, ranks (max rank 16), disabled slots
    ("gated-same", ExpertsConfig(8, 64, 32, 2, "silu"), 9, "same", [16], ()),
    ("gated-round-robin", ExpertsConfig(8, 64, 48, 2, "silu"), 21, "round_robin", [16, 8, 16], ()),
    (
        "gated-some-none-disabled",
        ExpertsConfig(8, 48, 32, 6, "gelu"),
        13,
        "some_none",
        [8, 16, 4],
        (1,),
    ),
    (
        "nongated-relu2-rr",
        ExpertsConfig(8, 64, 48, 6, "relu2", gated=False),
        11,
        "round_robin",
        [16, 8, 8],
        (),
    ),
    (
        "nongated-k1-some-none",
        ExpertsConfig(4, 32, 64, 1, "silu", gated=False),
        26,
        "some_none",
        [4, 16, 8],
        (2,),
    ),
    (
        "swigluoai-bias-rr",
        ExpertsConfig(8, 64, 32, 4, "swigluoai", has_bias=True),
        10,
        "round_robin",
        [16, 8, 12],
        (),
    ),
    (
        "swiglustep-bias-rr",
        ExpertsConfig(8, 64, 32, 4, "swiglustep", has_bias=True),
        10,
        "round_robin",
        [16, 8, 12],
        (),
    ),
    (
        # a limit most pre-activations exceed: the w13 deltas pass through the clamps
        "swiglustep-clamp-some-none",
        ExpertsConfig(8, 48, 32, 2, "swiglustep", swiglu_limit=0.5),
        13,
        "some_none",
        [16, 8, 12],
        (2,),
    ),
    (
        "weight-on-input",
        ExpertsConfig(4, 32, 32, 1, "silu", apply_router_weight_on_input=True),
        7,
        "some_none",
        [8, 16, 16],
        (),
    ),
    ("single-token", ExpertsConfig(8, 32, 32, 2, "silu"), 1, "round_robin", [16, 16, 16], ()),
]


@pytest.mark.parametrize(("cfg", "t", "mapping", "ranks", "disabled"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])  # fmt: skip
def test_lora_matches_reference(cfg, t, mapping, ranks, disabled, device):
    """Mixed adapters, padded ranks, disabled slots and -1 tokens match the reference."""
    dtype = dtypes_for_device()[0]
    wts = make_weights(cfg, dtype, device)
    x = make_x(t, cfg.hidden_size, dtype, device)
    tw, ti = make_routing(t, cfg.num_experts, cfg.top_k, device, seed=5)
    ad = make_lora(cfg, num_slots=3, max_rank=16, ranks=ranks, dtype=dtype, device=device,
                   disabled=disabled)  # fmt: skip
    ctx = lora_context(ad, lora_mapping(t, mapping, 3, device))
    backend = TritonExperts(cfg, wts["w13"], wts["w2"], wts["w13_bias"], wts["w2_bias"])
    out = backend.apply(x, tw, ti, ctx)
    ref = reference_output(cfg, wts, x, tw, ti, ctx, dtype=torch.float64)
    err = rel_err(out, ref)
    assert err < REL_TOL[dtype], f"relative error {err:.2e}"
    # the adapters matter: the base output is measurably different where they apply
    base = backend.apply(x, tw, ti)
    active = ctx.token_lora_mapping >= 0
    for slot in disabled:
        active &= ctx.token_lora_mapping != slot
    if bool(active.any()):
        assert rel_err(base[active], ref[active]) > 10 * REL_TOL[dtype]
    # tokens without an (enabled) adapter get exactly the base output
    assert torch.equal(out[~active], base[~active])


def test_lora_split_k_shrink_matches_reference(device):
    """Long K (H, I > 128, not multiples of the tile): the shrink splits K into partial sums."""
    dtype = dtypes_for_device()[0]
    cfg = ExpertsConfig(8, 272, 160, 2, "silu")
    wts = make_weights(cfg, dtype, device)
    x = make_x(3, 272, dtype, device)
    tw, ti = make_routing(3, 8, 2, device, seed=4)
    ad = make_lora(cfg, num_slots=2, max_rank=16, ranks=[16, 8], dtype=dtype, device=device)
    ctx = lora_context(ad, lora_mapping(3, "round_robin", 2, device))
    out = TritonExperts(cfg, wts["w13"], wts["w2"]).apply(x, tw, ti, ctx)
    err = rel_err(out, reference_output(cfg, wts, x, tw, ti, ctx, dtype=torch.float64))
    assert err < REL_TOL[dtype], f"relative error {err:.2e}"


#: BLOCK_M 64: the LoRA delta is added after the main loop from operands loaded there.
TILES_64 = tc.MoEConfig(
    64, tc.GemmConfig(32, 32, 4, 4, 2, one_dot=True), tc.GemmConfig(32, 32, 4, 4, 2)
)
#: Gated GEMM 1 as two dots (gate and up accumulators apart): each takes its own delta dot.
TILES_64_TWO_DOT = tc.MoEConfig(64, tc.GemmConfig(32, 32, 4, 4, 2), tc.GemmConfig(32, 32, 4, 4, 2))
#: The same through TMA descriptors (GEMM 2 reads the expert-sorted activation as boxes).
TILES_64_TMA = tc.MoEConfig(
    64, tc.GemmConfig(32, 32, 4, 4, 2, tma=True), tc.GemmConfig(32, 32, 4, 4, 2, tma=True)
)

#: BLOCK_M 64 with 16-row tail tiles: every block of these small batches takes the tail tile.
TILES_64_TAIL = tc.MoEConfig(
    64, tc.GemmConfig(32, 32, 4, 4, 2, tma=True), tc.GemmConfig(32, 32, 4, 4, 2, tma=True),
    tail_m=16,
)  # fmt: skip


@pytest.mark.parametrize(
    ("cfg", "tiles", "max_rank", "ranks"),
    [
        (ExpertsConfig(8, 64, 48, 2, "silu"), TILES_64, 16, [16, 8, 16]),
        (ExpertsConfig(8, 48, 32, 2, "relu2", gated=False), TILES_64, 64, [64, 8, 40]),
        (ExpertsConfig(8, 48, 32, 2, "swigluoai", has_bias=True), None, 64, [64, 16, 8]),
        (
            ExpertsConfig(8, 64, 48, 2, "swiglustep", has_bias=True, swiglu_limit=0.5),
            TILES_64,
            16,
            [16, 8, 16],
        ),
        (ExpertsConfig(8, 64, 48, 2, "silu"), TILES_64_TMA, 16, [16, 8, 16]),
        (ExpertsConfig(8, 64, 48, 2, "gelu", has_bias=True), TILES_64_TWO_DOT, 16, [8, 16, 16]),
        (ExpertsConfig(8, 48, 32, 2, "relu2", gated=False), TILES_64_TMA, 32, [32, 8, 24]),
        (ExpertsConfig(8, 64, 48, 2, "silu"), TILES_64_TAIL, 16, [16, 8, 16]),
        (ExpertsConfig(8, 64, 48, 2, "silu"), TILES_64, 12, [12, 8, 4]),
        (ExpertsConfig(8, 48, 32, 2, "relu2", gated=False), None, 8, [8, 4, 8]),
    ],
    ids=[
        "bm64-one-dot",
        "bm64-rank64-chunks",
        "rank64-chunks",
        "bm64-one-dot-swiglustep-clamp",
        "bm64-tma",
        "bm64-two-dot",
        "bm64-tma-relu2",
        "bm64-tail16",
        "bm64-rank12-padded",
        "rank8-padded",
    ],
)
def test_lora_large_tiles_and_ranks(cfg, tiles, max_rank, ranks, device):
    """Large tiles, rank 64 (several slot chunks) and max ranks below the padded rank (masked
    padding) match the reference."""
    dtype = dtypes_for_device()[0]
    wts = make_weights(cfg, dtype, device)
    x = make_x(19, cfg.hidden_size, dtype, device)
    tw, ti = make_routing(19, cfg.num_experts, cfg.top_k, device, seed=9)
    ad = make_lora(cfg, num_slots=3, max_rank=max_rank, ranks=ranks, dtype=dtype, device=device)
    ctx = lora_context(ad, lora_mapping(19, "some_none", 3, device))
    backend = TritonExperts(cfg, wts["w13"], wts["w2"], wts["w13_bias"], wts["w2_bias"],
                            tile_config=tiles)  # fmt: skip
    out = backend.apply(x, tw, ti, ctx)
    err = rel_err(out, reference_output(cfg, wts, x, tw, ti, ctx, dtype=torch.float64))
    assert err < REL_TOL[dtype], f"relative error {err:.2e}"
    none = ctx.token_lora_mapping < 0
    assert torch.equal(out[none], backend.apply(x, tw, ti)[none])


@pytest.mark.parametrize("dtype", dtypes_for_device())
def test_lora_all_none_is_exactly_base(dtype, device):
    """A batch where no token has an adapter equals the LoRA-free call bit for bit."""
    cfg = ExpertsConfig(8, 48, 32, 2, "silu")
    wts = make_weights(cfg, dtype, device)
    x = make_x(17, 48, dtype, device)
    tw, ti = make_routing(17, 8, 2, device)
    ad = make_lora(cfg, num_slots=2, max_rank=16, ranks=[16, 8], dtype=dtype, device=device)
    backend = TritonExperts(cfg, wts["w13"], wts["w2"])
    out = backend.apply(x, tw, ti, lora_context(ad, lora_mapping(17, "none", 2, device)))
    assert torch.equal(out, backend.apply(x, tw, ti))


def test_lora_all_tokens_on_disabled_slot_is_exactly_base(device):
    """Tokens mapped to a disabled slot get the base output exactly."""
    dtype = dtypes_for_device()[-1]
    cfg = ExpertsConfig(4, 32, 32, 2, "relu2", gated=False)
    wts = make_weights(cfg, dtype, device)
    x = make_x(6, 32, dtype, device)
    tw, ti = make_routing(6, 4, 2, device)
    ad = make_lora(cfg, num_slots=2, max_rank=8, ranks=[8, 8], dtype=dtype, device=device,
                   disabled=(0, 1))  # fmt: skip
    backend = TritonExperts(cfg, wts["w13"], wts["w2"])
    out = backend.apply(x, tw, ti, lora_context(ad, lora_mapping(6, "round_robin", 2, device)))
    assert torch.equal(out, backend.apply(x, tw, ti))


TILES_128 = tc.MoEConfig(128, tc.GemmConfig(32, 32, 1, 4, 2), tc.GemmConfig(32, 32, 1, 4, 2))


@pytest.mark.parametrize(
    ("cfg", "one_dot"),
    [(ExpertsConfig(4, 32, 32, 2, "silu"), True), (ExpertsConfig(4, 32, 32, 2, "gelu"), False),
     (ExpertsConfig(4, 32, 32, 2, "relu2", gated=False), False)],
    ids=["one-dot", "two-dot", "non-gated"],
)  # fmt: skip
def test_lora_b_tiles_ahead_with_every_slot_in_a_block(cfg, one_dot, device, record_launches):
    """128-row tiles load the B tiles of the block's lowest and highest slots before the main
    loop and the slots in between after it; with all four slots (one disabled, some tokens
    without an adapter) in each expert's one block the result matches the reference and the
    expand without tiles ahead."""
    from moe_policy.experts.triton import fused_moe as triton_moe

    dtype = dtypes_for_device()[0]
    tiles = dataclasses.replace(
        TILES_128, gemm1=dataclasses.replace(TILES_128.gemm1, one_dot=one_dot)
    )
    wts = make_weights(cfg, dtype, device)
    x = make_x(40, 32, dtype, device)
    tw, ti = make_routing(40, 4, 2, device, seed=5)
    ad = make_lora(cfg, num_slots=4, max_rank=16, ranks=[16, 8, 16, 12], dtype=dtype,
                   device=device, disabled=(2,))  # fmt: skip
    mapping = torch.where(torch.arange(40) % 5 == 4, -1, torch.arange(40) % 4).int().to(device)
    ctx = lora_context(ad, mapping)
    backend = TritonExperts(cfg, wts["w13"], wts["w2"], tile_config=tiles)
    seen = record_launches(triton_moe, "moe_gemm_kernel")
    out = backend.apply(x, tw, ti, ctx)
    assert [kw["LORA_B_AHEAD"] for _, kw in seen] == [True, True]
    err = rel_err(out, reference_output(cfg, wts, x, tw, ti, ctx, dtype=torch.float64))
    assert err < REL_TOL[dtype], f"relative error {err:.2e}"
    problem = MoEProblem.of(cfg, 40, x.element_size(), ad.num_slots, ad.max_rank)
    plan = dataclasses.replace(plan_launch(problem, device_limits(x.device), tiles),
                               lora_b_ahead=False)  # fmt: skip
    w = backend.weights
    again = fused_moe_triton(x, w["w13"], w["w2"], tw, ti, activation=cfg.activation,
                             gated=cfg.gated, lora=ctx, plan=plan)  # fmt: skip
    assert torch.equal(out, again)
    assert [kw["LORA_B_AHEAD"] for _, kw in seen[2:]] == [False, False]


def test_lora_b_tiles_ahead_only_where_blocks_hold_few_slots_or_tiles_are_large():
    """The rule: decode (one pair per block), pairs ordered by adapter, or 128-row tiles; not
    16-64-row tiles holding every slot."""
    cfg = ExpertsConfig(4, 32, 32, 2, "silu")
    for t, naive, tiles, want in (
        (2, True, TILES_16_TMA, True),
        (3, False, TILES_16_TMA, False),
        (67, False, TILES_16_TMA, True),
        (3, False, TILES_128, True),
    ):
        plan = plan_launch(MoEProblem.of(cfg, t, 2, 2, 16), DeviceLimits(), tiles, naive)
        assert plan.lora_b_ahead is want, (t, naive)
        assert plan.adapter_order is (t == 67)
    assert not plan_launch(MoEProblem.of(cfg, 67, 2), DeviceLimits(), TILES_16_TMA).lora_b_ahead


@pytest.mark.parametrize(("t", "e"), [(3, 32), (5, 4), (67, 4)],
                         ids=["decode", "aligned", "ordered-by-adapter"])  # fmt: skip
def test_out_of_range_slots_mean_no_adapter(t, e, device):
    """Slots outside [0, L) (here L, L+5 and a large one) give exactly what -1 gives, in the
    Triton path (decode, aligned, pairs ordered by adapter) and in the reference: the kernels
    mask them instead of reading the enabled flags out of bounds."""
    dtype = dtypes_for_device()[0]
    cfg = ExpertsConfig(e, 32, 32, 2, "silu")
    wts = make_weights(cfg, dtype, device)
    x = make_x(t, 32, dtype, device)
    tw, ti = make_routing(t, e, 2, device, seed=3)
    ad = make_lora(cfg, num_slots=3, max_rank=16, ranks=[16, 8, 12], dtype=dtype, device=device)
    good = lora_mapping(t, "round_robin", 3, device)
    bad = good.clone()
    bad[0::4], bad[1::4] = 3, 8
    bad[2::4] = 1 << 20
    fixed = torch.where(bad >= 3, -1, bad).int()
    tiles = dataclasses.replace(TILES_16_TMA, tail_m=0) if t == 67 else None
    backend = TritonExperts(cfg, wts["w13"], wts["w2"], tile_config=tiles)
    out = backend.apply(x, tw, ti, lora_context(ad, bad))
    assert torch.equal(out, backend.apply(x, tw, ti, lora_context(ad, fixed)))
    assert not torch.equal(out, backend.apply(x, tw, ti, lora_context(ad, good)))
    ref_bad = reference_output(cfg, wts, x, tw, ti, lora_context(ad, bad), dtype=torch.float64)
    ref_fixed = reference_output(cfg, wts, x, tw, ti, lora_context(ad, fixed), dtype=torch.float64)
    assert torch.equal(ref_bad, ref_fixed)


@pytest.mark.parametrize(("naive", "split_k"), [(False, 1), (True, 1), (False, 3)])
def test_shrink_kernel_matches_torch(naive, split_k, device):
    """u[s, pair] = A[s, slot, expert] @ x[token] for pairs with an adapter (split-K summed)."""
    dtype = dtypes_for_device()[-1]
    t, e, k, h, r, slots = 5, 8, 2, 400, 8, 3
    _, ti = make_routing(t, e, k, device)
    x = make_x(t, h, dtype, device)
    g = torch.Generator().manual_seed(0)
    la = (torch.randn(2, slots, e, r, h, generator=g) / h**0.5).to(dtype).to(device)
    lmap = torch.tensor([0, 2, -1, 1, 0], dtype=torch.int32, device=device)
    enabled = torch.tensor([1, 0, 1], dtype=torch.int32, device=device)
    routing = moe_align(ti, e, 16)
    u = lora_shrink(
        x, la, topk_ids=ti, sorted_ids=routing.sorted_ids, expert_ids=routing.expert_ids,
        num_padded=routing.num_padded, block_rows=routing.block_rows, lora_map=lmap, lora_enabled=enabled,
        num_blocks=t * k if naive else routing.max_blocks, block_m=16, naive=naive, a_row_div=k,
        split_k=split_k,
    )  # fmt: skip
    assert u.shape[1:] == (2, t * k, r) and u.dtype == torch.float32
    assert u.shape[0] == 1 if split_k == 1 else 1 < u.shape[0] <= split_k  # parts of whole steps
    u = u.sum(0)
    for p in range(t * k):
        tok, slot, ex = p // k, int(lmap[p // k]), int(ti.flatten()[p])
        if slot < 0 or int(enabled[slot]) == 0:
            continue
        for s in range(2):
            want = la[s, slot, ex].double() @ x[tok].double()
            err = rel_err(u[s, p], want)
            assert err < SHRINK_TOL[dtype], (p, s, err)


def test_lora_shape_errors(device):
    """A LoRA context of the wrong shape or mapping dtype raises ValueError naming the shapes."""
    cfg = ExpertsConfig(4, 32, 16, 2, "silu")
    wts = make_weights(cfg, torch.float32, device)
    x = make_x(3, 32, torch.float32, device)
    tw, ti = make_routing(3, 4, 2, device)
    non_gated = ExpertsConfig(4, 32, 16, 2, "silu", gated=False)
    ad = make_lora(
        non_gated, num_slots=2, max_rank=8, ranks=[8], dtype=torch.float32, device=device
    )
    with pytest.raises(ValueError, match=r"LoRA shapes .* do not match the layer.*S=2"):
        fused_moe_triton(
            x,
            wts["w13"],
            wts["w2"],
            tw,
            ti,
            lora=lora_context(ad, lora_mapping(3, "same", 2, device)),
        )
    ad2 = make_lora(cfg, num_slots=2, max_rank=8, ranks=[8], dtype=torch.float32, device=device)
    bad_map = lora_mapping(3, "same", 2, device).long()
    with pytest.raises(
        ValueError, match=r"token_lora_mapping must be contiguous int32 \[T=3\].*int64"
    ):
        fused_moe_triton(x, wts["w13"], wts["w2"], tw, ti, lora=lora_context(ad2, bad_map))


def test_lora_device_and_enabled_errors_and_empty_batch(device):
    """Adapters or the mapping off x's device and enabled flags of the wrong length raise
    ValueError naming them (the device mistakes failed inside torch or Triton); T = 0 with an
    adapter context returns an empty output."""
    cfg = ExpertsConfig(4, 32, 16, 2, "silu")
    wts = make_weights(cfg, torch.float32, device)
    backend = TritonExperts(cfg, wts["w13"], wts["w2"])
    x = make_x(3, 32, torch.float32, device)
    tw, ti = make_routing(3, 4, 2, device)
    ad = make_lora(cfg, num_slots=2, max_rank=8, ranks=[8], dtype=torch.float32, device=device)
    m = lora_mapping(3, "same", 2, device)
    with pytest.raises(ValueError, match=r"x's device \S+; got token_lora_mapping on meta$"):
        backend.apply(x, tw, ti, lora_context(ad, m.to("meta")))
    off = dataclasses.replace(ad, w2_b=ad.w2_b.to("meta"))
    with pytest.raises(ValueError, match=r"x's device \S+; got LoRA w2_b on meta$"):
        backend.apply(x, tw, ti, lora_context(off, m))
    short = dataclasses.replace(ad, enabled=ad.enabled[:1])
    with pytest.raises(ValueError, match=r"enabled must be \[L=2\], got shape \(1,\)"):
        backend.apply(x, tw, ti, lora_context(short, m))
    out = backend.apply(x[:0], tw[:0], ti[:0], lora_context(ad, m[:0]))
    assert out.shape == (0, 32) and out.dtype == torch.float32


def test_set_adapter_and_clear_reject_bad_shapes_and_slots():
    """set_adapter refuses tensors that copy_ would broadcast over the experts ([1, r, H]: the
    same adapter silently loaded for every expert) or reject with a RuntimeError (rank or H
    mismatch); clear refuses a slot out of range (IndexError) or negative (it cleared the
    last slot)."""
    e, h, i, r = 4, 32, 16, 4
    ad = MoELoRAAdapters.allocate(num_slots=2, num_experts=e, hidden_size=h, intermediate_size=i,
                                  max_rank=8, num_slices=2, dtype=torch.float32)  # fmt: skip

    def load(w13_a=(e, r, h), w13_b=(e, i, r), w2_a=(e, r, i), w2_b=(e, h, r)):
        ad.set_adapter(1, w13_a=[torch.ones(w13_a)] * 2, w13_b=[torch.ones(w13_b)] * 2,
                       w2_a=torch.ones(w2_a), w2_b=torch.ones(w2_b))  # fmt: skip

    with pytest.raises(ValueError, match=r"adapter w13_a must be \(4, 4, 32\) .*got \(1, 4, 32\)"):
        load(w13_a=(1, r, h))
    with pytest.raises(ValueError, match=r"adapter w2_b must be \(4, 32, 4\) .*got \(4, 32, 2\)"):
        load(w2_b=(e, h, 2))
    with pytest.raises(ValueError, match=r"adapter w2_a must be \[E, r, I\], got \(4, 16\)"):
        load(w2_a=(r, i))
    assert int(ad.enabled.sum()) == 0 and not ad.w13_a.any()
    load()  # into slot 1, the one clear(-1) emptied
    for slot in (-1, 2):
        with pytest.raises(ValueError, match=rf"slot {slot} out of range 0..1"):
            ad.clear(slot)
    assert ad.enabled.tolist() == [0, 1] and bool(ad.w13_a[:, 1, :, :r].all())


#: BLOCK_M 16 tiles through TMA (gated GEMM 1 as one dot).
TILES_16_TMA = tc.MoEConfig(
    16, tc.GemmConfig(32, 32, 1, 4, 2, tma=True), tc.GemmConfig(32, 32, 1, 4, 2, tma=True)
)


def test_lora_unsplit_shrink_small_tiles_match_reference(device):
    """Enough blocks for an unsplit shrink with 16-row tiles (the decode path of real batches)."""
    cfg, tiles = ExpertsConfig(64, 32, 32, 4, "silu"), TILES_16_TMA
    from moe_policy.experts.triton.align import max_blocks_for
    from moe_policy.experts.triton.launch import SHRINK_MIN_PROGRAMS

    t = 32  # 128 pairs over 64 experts: 72 block slots, most of them used once
    assert SHRINK_MIN_PROGRAMS // max_blocks_for(t * cfg.top_k, cfg.num_experts, 16) == 1
    dtype = dtypes_for_device()[0]
    wts = make_weights(cfg, dtype, device)
    x = make_x(t, cfg.hidden_size, dtype, device)
    tw, ti = make_routing(t, cfg.num_experts, cfg.top_k, device, seed=3)
    ad = make_lora(cfg, num_slots=4, max_rank=16, ranks=[16, 8, 16, 4], dtype=dtype, device=device)
    ctx = lora_context(ad, lora_mapping(t, "some_none", 4, device))
    backend = TritonExperts(cfg, wts["w13"], wts["w2"], tile_config=tiles)
    out = backend.apply(x, tw, ti, ctx)
    err = rel_err(out, reference_output(cfg, wts, x, tw, ti, ctx, dtype=torch.float64))
    assert err < REL_TOL[dtype], f"relative error {err:.2e}"


@pytest.mark.parametrize(
    "tiles", [TILES_16_TMA, TILES_64_TWO_DOT], ids=["bm16-tma", "bm64-two-dot"]
)
def test_lora_with_pairs_ordered_by_adapter(tiles, device, monkeypatch):
    """When experts average more than a block, the alignment orders each expert's pairs by
    adapter; results match the reference and the unordered alignment."""
    from moe_policy.experts.triton import fused_moe as triton_moe

    cfg = ExpertsConfig(4, 64, 48, 2, "silu")
    t = 4 * tiles.block_m + 3  # 2 pairs per token over 4 experts: ~2 blocks per expert
    dtype = dtypes_for_device()[0]
    wts = make_weights(cfg, dtype, device)
    x = make_x(t, cfg.hidden_size, dtype, device)
    tw, ti = make_routing(t, cfg.num_experts, cfg.top_k, device, seed=8)
    ad = make_lora(cfg, num_slots=3, max_rank=16, ranks=[16, 8, 12], dtype=dtype, device=device,
                   disabled=(1,))  # fmt: skip
    ctx = lora_context(ad, lora_mapping(t, "some_none", 3, device))
    backend = TritonExperts(cfg, wts["w13"], wts["w2"], tile_config=tiles)
    orders = []
    align = triton_moe.moe_align

    def recording(*args, **kwargs):
        orders.append(kwargs.get("adapter_order") is not None)
        return align(*args, **kwargs)

    monkeypatch.setattr(triton_moe, "moe_align", recording)
    out = backend.apply(x, tw, ti, ctx)
    assert orders == [True]
    err = rel_err(out, reference_output(cfg, wts, x, tw, ti, ctx, dtype=torch.float64))
    assert err < REL_TOL[dtype], f"relative error {err:.2e}"
    monkeypatch.setattr(
        triton_moe, "moe_align", lambda *a, **k: align(*a, **{**k, "adapter_order": None})
    )
    assert rel_err(out, backend.apply(x, tw, ti, ctx).double()) < REL_TOL[dtype]
    assert orders == [True]  # the second call went around the recorder


@pytest.mark.parametrize("naive", [True, False])
def test_lora_with_dependent_launches_matches_reference(naive, device):
    """With config.pdl every kernel after the first waits on its predecessor (on the GPU);
    decode (shrink, GEMM, shrink, GEMM, sum) and aligned batches match the reference."""
    from dataclasses import replace

    cfg = ExpertsConfig(64, 32, 32, 4, "silu")
    t = 3 if naive else 40
    dtype = dtypes_for_device()[0]
    wts = make_weights(cfg, dtype, device)
    x = make_x(t, cfg.hidden_size, dtype, device)
    tw, ti = make_routing(t, cfg.num_experts, cfg.top_k, device, seed=12)
    ad = make_lora(cfg, num_slots=3, max_rank=16, ranks=[16, 8, 4], dtype=dtype, device=device)
    ctx = lora_context(ad, lora_mapping(t, "some_none", 3, device))
    conv = TritonExperts.convert_weights(cfg, wts["w13"], wts["w2"])
    out = fused_moe_triton(x, conv["w13"], conv["w2"], tw, ti,
                           config=replace(TILES_16_TMA, pdl=True), lora=ctx, naive=naive)  # fmt: skip
    err = rel_err(out, reference_output(cfg, wts, x, tw, ti, ctx, dtype=torch.float64))
    assert err < REL_TOL[dtype], f"relative error {err:.2e}"


def test_lora_strided_enabled_is_refused_and_empty_adapters_give_the_base(device):
    """A strided ``enabled`` view is refused (the kernels read enabled[slot] at unit stride: a
    [L, 2][:, 0] view enabled the wrong slots); adapters with no slot or max rank 0 give the
    base output (a guard: with no slot the B tiles ahead were addressed at slot -1)."""
    cfg = ExpertsConfig(4, 24, 16, 2, "silu")
    wts = make_weights(cfg, torch.float32, device)
    backend = TritonExperts(cfg, wts["w13"], wts["w2"])
    x = make_x(5, 24, torch.float32, device)
    tw, ti = make_routing(5, 4, 2, device)
    ad = make_lora(cfg, num_slots=3, max_rank=8, ranks=[8, 8, 8], dtype=torch.float32,
                   device=device)  # fmt: skip
    flags = torch.tensor([[1, 9], [0, 9], [1, 9]], dtype=torch.int32, device=device)[:, 0]
    m = lora_mapping(5, "round_robin", 3, device)
    with pytest.raises(
        ValueError, match=r"enabled must be contiguous int32 \[L=3\].*strides \(2,\)"
    ):
        backend.apply(x, tw, ti, lora_context(dataclasses.replace(ad, enabled=flags), m))
    base = backend.apply(x, tw, ti)
    for slots, rank in ((0, 8), (2, 0)):
        empty = MoELoRAAdapters.allocate(num_slots=slots, num_experts=4, hidden_size=24,
                                         intermediate_size=16, max_rank=rank, num_slices=2,
                                         dtype=torch.float32, device=device)  # fmt: skip
        empty.enabled.fill_(1)
        mapping = torch.zeros(5, dtype=torch.int32, device=device)
        assert torch.equal(backend.apply(x, tw, ti, lora_context(empty, mapping)), base)
