"""Batched-format Triton experts against the reference: dispatch -> batched apply -> combine.

Interpreted (CPU, TRITON_INTERPRET=1) at tiny sizes; full Nemotron-3-Nano and Mixtral shapes
on the GPU (``-m gpu``).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from moe_policy.experts.base import ExpertsConfig
from moe_policy.experts.batched_format import combine_from_batched, dispatch_to_batched
from moe_policy.experts.lora import MoELoRAAdapters, MoELoRAContext
from moe_policy.experts.testing import (
    FULL_SHAPES,
    ON_GPU,
    dtypes_for_device,
    make_lora,
    make_weights,
    make_x,
    reference_output,
    rel_err,
    skewed_routing,
    swiglustep_float64,
)
from moe_policy.experts.triton.batched import (
    BatchedTritonExperts,
    batched_fused_experts,
    batched_lora_shrink,
    gemm_config,
    shrink_split_k,
)

# Relative L2 error bounds vs the fp32 reference. The kernel rounds the activation a
# (GEMM2's input) and the output to the working dtype once each: ~2^-11 relative per
# rounding in fp16, ~2^-8 in bf16. The interpreter's fp32 tl.dot is exact fp32.
REL_L2 = {torch.float32: 1e-4, torch.float16: 3e-3, torch.bfloat16: 1e-2}

# (activation, gated, has_bias) swept on the CPU.
ACTIVATIONS = [
    ("silu", True, False),
    ("gelu", True, False),
    ("swigluoai", True, True),
    ("swiglustep", True, True),
    ("relu2", False, False),
    ("gelu_tanh", False, True),
    ("silu", False, False),
]


def run_batched(
    experts: BatchedTritonExperts,
    x: torch.Tensor,
    ids: torch.Tensor,
    w: torch.Tensor,
    max_tokens: int,
    token_lora: torch.Tensor | None,
    adapters: MoELoRAAdapters | None,
) -> tuple[torch.Tensor, torch.Tensor, object]:
    """Dispatch, apply (output poisoned with NaN first), combine; returns (out, yb, dispatch)."""
    cfg = experts.config
    d = dispatch_to_batched(x, ids, cfg.num_experts, max_tokens, token_lora)
    lora = MoELoRAContext(adapters, d.lora_mapping) if adapters is not None else None
    yb = torch.full_like(d.x, float("nan"))
    experts.apply(d.x, d.expert_num_tokens, lora, out=yb)
    return combine_from_batched(yb, d.index_map, w, x.shape[0]), yb, d


def _reference_cases() -> list:
    """Every activation in every device dtype without LoRA; with LoRA, every activation in the
    first dtype and gated silu in the second (the interpreter is slow: keep CI short)."""
    d0, d1 = dtypes_for_device()
    cases = [(*a, d, False) for a in ACTIVATIONS for d in (d0, d1)]
    cases += [(*a, d0, True) for a in ACTIVATIONS] + [("silu", True, False, d1, True)]
    return [
        pytest.param(
            *c,
            id=f"{c[0]}-{'gated' if c[1] else 'nongated'}"
            f"{'-bias' if c[2] else ''}-{str(c[3])[6:]}-{'lora' if c[4] else 'base'}",
        )
        for c in cases
    ]


@pytest.mark.parametrize(
    ("activation", "gated", "has_bias", "dtype", "use_lora"), _reference_cases()
)
def test_matches_reference(
    activation: str, gated: bool, has_bias: bool, dtype: torch.dtype, use_lora: bool, device: str
) -> None:
    """Batched Triton (empty expert, full expert, 2 M-blocks, N/K tails) equals the reference."""
    e, h, i, k, t = 6, 80, 40, 2, 40
    cfg = ExpertsConfig(e, h, i, k, activation=activation, gated=gated, has_bias=has_bias)
    wt = make_weights(cfg, dtype, device)
    x = make_x(t, h, dtype, device)
    ids, w = skewed_routing(t, e, k, device)
    token_lora = (torch.arange(t, device=device, dtype=torch.int32) % 5) - 1  # -1, 0..3
    ad = make_lora(cfg, num_slots=4, max_rank=12, ranks=[12, 5, 12, 12], disabled=(3,),
                   dtype=dtype, device=device) if use_lora else None  # fmt: skip
    experts = BatchedTritonExperts(cfg, wt["w13"], wt["w2"], wt["w13_bias"], wt["w2_bias"])

    out, yb, d = run_batched(experts, x, ids, w, t, token_lora if use_lora else None, ad)
    ref = reference_output(
        cfg, wt, x, w, ids, MoELoRAContext(ad, token_lora) if ad is not None else None
    )
    counts = d.expert_num_tokens.tolist()
    assert counts[0] == 0 and counts[1] == t  # empty and full experts
    valid = d.index_map >= 0
    assert torch.isfinite(yb[valid]).all(), "a valid row was not written"
    assert rel_err(out, ref) < REL_L2[dtype]
    if use_lora:  # the adapters must matter, or this test proves nothing
        base = reference_output(cfg, wt, x, w, ids)
        assert rel_err(base, ref) > 20 * REL_L2[dtype]


@pytest.mark.parametrize("use_lora", [False, True], ids=["base", "lora"])
@pytest.mark.parametrize("activation", ["swigluoai", "swiglustep"])
def test_swiglu_clamp_limit_is_applied(activation: str, use_lora: bool, device: str) -> None:
    """swigluoai and swiglustep clamp at the layer's swiglu_limit: with a limit of 0.5 most
    pre-activations are clamped, and the result follows the reference at that limit, not at
    the default 7 (a launcher once passed another value in its place)."""
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    e, h, i, k, t = 6, 80, 40, 2, 40
    cfg = ExpertsConfig(e, h, i, k, activation=activation, has_bias=True, swiglu_limit=0.5)
    wt = make_weights(cfg, dtype, device)
    x = make_x(t, h, dtype, device)
    ids, w = skewed_routing(t, e, k, device)
    token_lora = (torch.arange(t, device=device, dtype=torch.int32) % 5) - 1
    ad = make_lora(cfg, num_slots=4, max_rank=12, ranks=[12, 5, 12, 12], disabled=(3,),
                   dtype=dtype, device=device) if use_lora else None  # fmt: skip
    experts = BatchedTritonExperts(cfg, wt["w13"], wt["w2"], wt["w13_bias"], wt["w2_bias"])
    out, _, _ = run_batched(experts, x, ids, w, t, token_lora if use_lora else None, ad)

    def ref(limit: float) -> torch.Tensor:
        return reference_output(
            dataclasses.replace(cfg, swiglu_limit=limit), wt, x, w, ids,
            MoELoRAContext(ad, token_lora) if ad else None,
        )  # fmt: skip

    assert rel_err(out, ref(0.5)) < REL_L2[dtype]
    assert rel_err(ref(7.0), ref(0.5)) > 20 * REL_L2[dtype]
    if activation == "swiglustep" and not use_lora:  # and the float64 formula, apart from ref
        assert rel_err(out, swiglustep_float64(wt, x, w, ids, 0.5)) < REL_L2[dtype]


@pytest.mark.parametrize("gated", [True, False], ids=["gated", "non_gated"])
def test_unmapped_and_disabled_rows_get_exactly_zero_delta(gated: bool, device: str) -> None:
    """Rows with slot -1 or a disabled slot equal the no-LoRA output bit for bit."""
    dtype = dtypes_for_device()[0]
    e, h, i, k, t = 5, 64, 32, 2, 24
    cfg = ExpertsConfig(e, h, i, k, activation="silu" if gated else "relu2", gated=gated)
    wt = make_weights(cfg, dtype, device, seed=3)
    x = torch.randn(t, h, device=device).to(dtype)
    ids, _w = skewed_routing(t, e, k, device, seed=4)
    token_lora = (torch.arange(t, device=device, dtype=torch.int32) % 5) - 1
    ad = make_lora(cfg, num_slots=4, max_rank=12, ranks=[12, 5, 12, 12], disabled=(2,),
                   dtype=dtype, device=device)  # fmt: skip
    experts = BatchedTritonExperts(cfg, wt["w13"], wt["w2"])
    d = dispatch_to_batched(x, ids, e, t, token_lora)
    base = experts.apply(d.x, d.expert_num_tokens)
    with_lora = experts.apply(d.x, d.expert_num_tokens, MoELoRAContext(ad, d.lora_mapping))
    valid = d.index_map >= 0
    no_delta = valid & ((d.lora_mapping == -1) | (d.lora_mapping == 2))
    has_delta = valid & ~no_delta
    assert no_delta.any() and has_delta.any()
    assert torch.equal(base[no_delta], with_lora[no_delta])
    assert not torch.allclose(base[has_delta], with_lora[has_delta])


def test_router_weight_on_input(device: str) -> None:
    """Top-1 with the weight on the input: rows pre-scaled at dispatch, combine unweighted."""
    dtype = dtypes_for_device()[0]
    e, h, i, t = 4, 64, 32, 12
    cfg = ExpertsConfig(e, h, i, 1, activation="silu", apply_router_weight_on_input=True)
    wt = make_weights(cfg, dtype, device, seed=5)
    x = torch.randn(t, h, device=device).to(dtype)
    ids = (torch.arange(t, device=device) % e).to(torch.int32).unsqueeze(1)
    w = torch.rand(t, 1, device=device)
    token_lora = (torch.arange(t, device=device, dtype=torch.int32) % 3) - 1
    ad = make_lora(cfg, num_slots=2, max_rank=8, ranks=[8, 8], disabled=(1,), dtype=dtype,
                   device=device)  # fmt: skip
    d = dispatch_to_batched(x, ids, e, t, token_lora, input_weights=w)
    yb = BatchedTritonExperts(cfg, wt["w13"], wt["w2"]).apply(
        d.x, d.expert_num_tokens, MoELoRAContext(ad, d.lora_mapping)
    )
    out = combine_from_batched(yb, d.index_map, w, t, apply_router_weight=False)
    ref = reference_output(cfg, wt, x, w, ids, MoELoRAContext(ad, token_lora))
    # x * w is rounded to the working dtype at dispatch: one more rounding than the reference.
    assert rel_err(out, ref) < 2 * REL_L2[dtype]


@pytest.mark.parametrize("split_k", [1, 3])
def test_lora_shrink_split_k(split_k: int, device: str) -> None:
    """The shrink with K split over programs (atomic adds) equals x A^T per row's slot;
    rows of -1 / disabled slots and rows past the count are left alone."""
    dtype = dtypes_for_device()[0]
    e, m, k, num_slots, r = 3, 20, 200, 3, 12
    g = torch.Generator().manual_seed(6)
    x = torch.randn(e, m, k, generator=g).to(device=device, dtype=dtype)
    a = (torch.randn(2, num_slots, e, r, k, generator=g) * k**-0.5).to(device=device, dtype=dtype)
    slots = torch.randint(-1, num_slots, (e, m), generator=g, dtype=torch.int32).to(device)
    enabled = torch.tensor([1, 0, 1], dtype=torch.int32, device=device)
    counts = torch.tensor([0, m, 7], dtype=torch.int32, device=device)
    u = batched_lora_shrink(x, a, slots, enabled, counts, 2, split_k=split_k)
    for ex in range(e):
        for row in range(int(counts[ex])):
            slot = int(slots[ex, row])
            if slot < 0 or not int(enabled[slot]):
                continue
            want = a[:, slot, ex].float() @ x[ex, row].float()  # [2, R]
            torch.testing.assert_close(u[:, ex, row], want, rtol=REL_L2[dtype], atol=REL_L2[dtype])
    assert shrink_split_k(16, 14336, 64, 80, 132) > 1  # Mixtral w2: few programs, long K
    assert shrink_split_k(2048, 2688, 64, 400, 132) == 1  # many programs already
    assert shrink_split_k(128, 2688, 128, 1, 132) == 6  # decode: split as far as allowed


def test_launcher_rejects_bad_inputs(device: str) -> None:
    """Shape, dtype and LoRA-mapping errors raise ValueError naming what was received."""
    dtype = dtypes_for_device()[0]
    cfg = ExpertsConfig(4, 32, 16, 2, activation="silu")
    wt = make_weights(cfg, dtype, device)
    x = torch.zeros(4, 8, 32, device=device, dtype=dtype)
    counts = torch.zeros(4, device=device, dtype=torch.int32)
    with pytest.raises(ValueError, match=r"expert_num_tokens must be \[E=4\]"):
        batched_fused_experts(x, counts[:3], wt["w13"], wt["w2"])
    with pytest.raises(ValueError, match="shape mismatch"):
        batched_fused_experts(x, counts, wt["w13"], wt["w2"], gated=False, activation="relu2")
    with pytest.raises(ValueError, match="must share one of"):
        batched_fused_experts(
            x.float() if dtype != torch.float32 else x.half(), counts, wt["w13"], wt["w2"]
        )
    ad = make_lora(cfg, num_slots=2, max_rank=8, ranks=[8, 8], disabled=(1,), dtype=dtype,
                   device=device)  # fmt: skip
    with pytest.raises(ValueError, match=r"batched LoRA mapping must be \[E, M\]"):
        batched_fused_experts(
            x,
            counts,
            wt["w13"],
            wt["w2"],
            lora=MoELoRAContext(ad, torch.zeros(8, dtype=torch.int32)),
        )
    with pytest.raises(ValueError, match="not in"):
        batched_fused_experts(x, counts, wt["w13"], wt["w2"], activation="relu2")


def test_launcher_rejects_short_enabled_and_tensors_off_xs_device(device: str) -> None:
    """Enabled flags shorter than the slots (the kernels read enabled[slot] past the end) and
    a bias, the output, the adapters or the mapping on another device than x (they reached
    torch or Triton) raise ValueError naming them; an empty batch returns its output."""
    dtype = dtypes_for_device()[0]
    cfg = ExpertsConfig(4, 32, 16, 2, activation="silu")
    wt = make_weights(cfg, dtype, device)
    x = torch.zeros(4, 8, 32, device=device, dtype=dtype)
    counts = torch.tensor([3, 0, 8, 1], device=device, dtype=torch.int32)
    ad = make_lora(cfg, num_slots=2, max_rank=8, ranks=[8, 8], dtype=dtype, device=device)
    slots = torch.zeros(4, 8, dtype=torch.int32, device=device)
    with pytest.raises(ValueError, match=r"LoRA enabled must be \[L=2\]; got \(1,\)"):
        short = dataclasses.replace(ad, enabled=ad.enabled[:1])
        batched_fused_experts(x, counts, wt["w13"], wt["w2"], lora=MoELoRAContext(short, slots))
    with pytest.raises(ValueError, match=r"x's device \S+; got w2_bias on meta$"):
        batched_fused_experts(x, counts, wt["w13"], wt["w2"],
                              w2_bias=torch.zeros(4, 32, device="meta"))  # fmt: skip
    off = dataclasses.replace(ad, w13_b=ad.w13_b.to("meta"))
    with pytest.raises(ValueError, match=r"x's device \S+; got LoRA w13_b on meta$"):
        batched_fused_experts(x, counts, wt["w13"], wt["w2"], lora=MoELoRAContext(off, slots))
    with pytest.raises(ValueError, match=r"x's device \S+; got token_lora_mapping on meta$"):
        lora = MoELoRAContext(ad, slots.to("meta"))
        batched_fused_experts(x, counts, wt["w13"], wt["w2"], lora=lora)
    with pytest.raises(ValueError, match=r"out must be \(4, 8, 32\) .* on meta$"):
        batched_fused_experts(
            x, counts, wt["w13"], wt["w2"], out=torch.empty_like(x, device="meta")
        )
    empty = batched_fused_experts(x[:, :0], counts, wt["w13"], wt["w2"])
    assert empty.shape == (4, 0, 32)


@pytest.mark.parametrize("gated", [False, True])
def test_gemm_tiles_fit_the_devices_shared_memory(gated: bool) -> None:
    """Hopper's budget leaves every tile as listed; Ada's 72 KB cuts the gated decode tiles
    (108-120 KB) to fit, fewer stages first."""
    from moe_policy.experts.triton.config import SMEM_LIMIT, GemmConfig, smem_budget, smem_bytes

    def smem(c: dict) -> int:
        g = GemmConfig(c["BLOCK_N"], c["BLOCK_K"], 1, c["num_warps"], c["num_stages"])
        return smem_bytes(c["BLOCK_M"], g, 2 if gated else 1)

    ada = smem_budget(101376)
    for m in (1, 16, 64, 256, 4096):
        hopper = gemm_config(m, 4096, 2048, gated, SMEM_LIMIT)
        assert hopper == gemm_config(m, 4096, 2048, gated)
        small = gemm_config(m, 4096, 2048, gated, ada)
        assert smem(small) <= ada and small["BLOCK_M"] == hopper["BLOCK_M"]
        assert small["num_stages"] >= 2 and small["num_warps"] == hopper["num_warps"]
        if smem(hopper) <= ada:
            assert small == hopper
    assert gemm_config(16, 4096, 2048, True, ada) != gemm_config(16, 4096, 2048, True)


def test_class_contract_and_pure_conversion() -> None:
    """Catalog attributes; convert_weights leaves its inputs untouched."""
    assert BatchedTritonExperts.backend == "batched_triton"
    assert BatchedTritonExperts.activation_format == "batched"
    assert BatchedTritonExperts.supports_lora is True
    ok, reason = BatchedTritonExperts.is_available()
    assert ok or reason
    cfg = ExpertsConfig(4, 32, 16, 2)
    w13, w2 = torch.randn(4, 32, 32), torch.randn(4, 32, 16)
    before = (w13.clone(), w2.clone())
    conv = BatchedTritonExperts.convert_weights(cfg, w13, w2)
    assert torch.equal(w13, before[0]) and torch.equal(w2, before[1])
    assert torch.equal(conv["w13"], w13) and torch.equal(conv["w2"], w2)
    with pytest.raises(ValueError, match="expected w13"):
        BatchedTritonExperts.convert_weights(cfg, w13[:, :16], w2)


# ---------------------------------------------------------------------------------------
# GPU: full model shapes, bf16.
# ---------------------------------------------------------------------------------------
#: bf16 bound for full shapes: K up to 14336 in fp32 accumulation; a and out rounded to bf16.
GPU_BF16_REL_L2 = 1e-2


@pytest.fixture(scope="module")
def full_layers() -> dict:
    return {}


def _full_layer(cache: dict, name: str) -> tuple[ExpertsConfig, dict, MoELoRAAdapters]:
    if name not in cache:
        cache.clear()  # one full layer on the GPU at a time
        e, k, h, i, act, gated = FULL_SHAPES[name]
        cfg = ExpertsConfig(e, h, i, k, activation=act, gated=gated)
        wt = make_weights(cfg, torch.bfloat16, "cuda", seed=11)
        ad = make_lora(cfg, num_slots=4, max_rank=16, ranks=[16, 8, 16, 16], disabled=(3,),
                       dtype=torch.bfloat16, device="cuda")  # fmt: skip
        cache[name] = (cfg, wt, ad)
    return cache[name]


@pytest.mark.gpu
@pytest.mark.parametrize("use_lora", [False, True], ids=["base", "lora"])
@pytest.mark.parametrize("num_tokens", [5, 256])
@pytest.mark.parametrize("model", list(FULL_SHAPES))
def test_full_shape_gpu(model: str, num_tokens: int, use_lora: bool, full_layers: dict) -> None:
    """Full Nemotron-3-Nano / Mixtral layers in bf16, uniform routing, vs the reference."""
    cfg, wt, ad = _full_layer(full_layers, model)
    t, e, k = num_tokens, cfg.num_experts, cfg.top_k
    g = torch.Generator(device="cuda").manual_seed(num_tokens)
    x = torch.randn(t, cfg.hidden_size, device="cuda", generator=g).to(torch.bfloat16)
    ids = torch.rand(t, e, device="cuda", generator=g).argsort(dim=1)[:, :k].to(torch.int32)
    w = torch.rand(t, k, device="cuda", generator=g)
    token_lora = (torch.arange(t, device="cuda", dtype=torch.int32) % 5) - 1
    max_tokens = int(torch.bincount(ids.flatten().long(), minlength=e).max())
    experts = BatchedTritonExperts(cfg, wt["w13"], wt["w2"])
    out, _, _ = run_batched(
        experts, x, ids, w, max_tokens, token_lora if use_lora else None, ad if use_lora else None
    )
    ref = reference_output(cfg, wt, x, w, ids, MoELoRAContext(ad, token_lora) if use_lora else None)
    err = rel_err(out, ref)
    print(f"{model} T={t} lora={use_lora}: rel_err={err:.2e}")
    assert err < GPU_BF16_REL_L2


@pytest.mark.gpu
@pytest.mark.skipif(not ON_GPU, reason="needs a CUDA GPU")
def test_cuda_graph_replay_follows_device_counts() -> None:
    """apply is capturable: a graph captured once gives the right answer for new counts/rows."""
    dtype = torch.bfloat16
    e, h, i, k, t, m = 8, 256, 128, 2, 64, 64
    cfg = ExpertsConfig(e, h, i, k, activation="silu")
    wt = make_weights(cfg, dtype, "cuda", seed=7)
    ad = make_lora(cfg, num_slots=3, max_rank=16, ranks=[16, 8, 16], disabled=(2,), dtype=dtype,
                   device="cuda")  # fmt: skip
    experts = BatchedTritonExperts(cfg, wt["w13"], wt["w2"])
    xb = torch.zeros(e, m, h, device="cuda", dtype=dtype)
    counts = torch.zeros(e, device="cuda", dtype=torch.int32)
    slots = torch.full((e, m), -1, device="cuda", dtype=torch.int32)
    lora = MoELoRAContext(ad, slots)
    yb = torch.empty_like(xb)
    experts.apply(xb, counts, lora, out=yb)  # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        experts.apply(xb, counts, lora, out=yb)
    for seed in (0, 1):
        g = torch.Generator(device="cuda").manual_seed(seed)
        x = torch.randn(t, h, device="cuda", generator=g).to(dtype)
        ids = torch.rand(t, e, device="cuda", generator=g).argsort(dim=1)[:, :k].to(torch.int32)
        w = torch.rand(t, k, device="cuda", generator=g)
        token_lora = (torch.arange(t, device="cuda", dtype=torch.int32) + seed) % 4 - 1
        d = dispatch_to_batched(x, ids, e, m, token_lora)
        xb.copy_(d.x)
        counts.copy_(d.expert_num_tokens)
        slots.copy_(d.lora_mapping)
        graph.replay()
        out = combine_from_batched(yb, d.index_map, w, t)
        ref = reference_output(cfg, wt, x, w, ids, MoELoRAContext(ad, token_lora))
        assert rel_err(out, ref) < GPU_BF16_REL_L2


def test_counts_above_capacity_and_strided_counts_and_enabled(device: str) -> None:
    """A count above M is taken as M (its rows past M were the next expert's: x read from and
    out written to them), and a strided ``expert_num_tokens`` or ``enabled`` view is read by
    element, not as if contiguous (the kernels read counts[e] and enabled[l] at unit stride)."""
    dtype = dtypes_for_device()[-1]
    cfg = ExpertsConfig(3, 24, 16, 1)
    wt = make_weights(cfg, dtype, device)
    x = make_x(12, 24, dtype, device).view(3, 4, 24)
    counts = torch.tensor([4, 1, 2], dtype=torch.int32, device=device)
    want = batched_fused_experts(x, counts, wt["w13"], wt["w2"])
    out = torch.full_like(x, 7.0)
    batched_fused_experts(x, torch.tensor([6, 1, 2], dtype=torch.int32, device=device),
                          wt["w13"], wt["w2"], out=out)  # fmt: skip
    assert torch.equal(out[0], want[0]) and torch.equal(out[1, :1], want[1, :1])
    assert bool((out[1, 1:] == 7.0).all()), "expert 0's rows past M landed in expert 1's"

    strided = torch.stack([counts, torch.zeros_like(counts)], 1)[:, 0]
    valid = torch.arange(4, device=device)[None, :] < counts[:, None]
    got = batched_fused_experts(x, strided, wt["w13"], wt["w2"])
    assert torch.equal(got[valid], want[valid])

    ad = make_lora(cfg, num_slots=3, max_rank=8, ranks=[8, 8, 8], disabled=(1,), dtype=dtype,
                   device=device)  # fmt: skip
    slots = torch.tensor([[0, 1, 2, -1]] * 3, dtype=torch.int32, device=device)
    flags = torch.tensor([[1, 9], [0, 9], [1, 9]], dtype=torch.int32, device=device)[:, 0]
    base = batched_fused_experts(x, counts, wt["w13"], wt["w2"], lora=MoELoRAContext(ad, slots))
    view = dataclasses.replace(ad, enabled=flags)
    got = batched_fused_experts(x, counts, wt["w13"], wt["w2"], lora=MoELoRAContext(view, slots))
    assert torch.equal(got[valid], base[valid])
