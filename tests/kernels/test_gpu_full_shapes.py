"""Triton fused MoE at full model shapes in bf16 on the GPU, with and without LoRA.

Nemotron-3-Nano (relu2 non-gated), Mixtral-8x7B (silu), Qwen3-30B-A3B (silu, k=8) and
gpt-oss-20b (interleaved swigluoai with biases, H = I = 2880: tails in N and K) and a
swiglustep layer of no particular model (its clamp at a limit of 1, so that it engages on
h ~ N(0, 1)), against the torch reference in fp32 on the same bf16 inputs. Also: CUDA-graph
capture and no host sync.
"""

from __future__ import annotations

import dataclasses

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from moe_policy.experts.base import ExpertsConfig  # noqa: E402
from moe_policy.experts.lora import MoELoRAAdapters  # noqa: E402
from moe_policy.experts.testing import (  # noqa: E402
    lora_context,
    make_lora,
    make_routing,
    make_weights,
    make_x,
    reference_output,
    rel_err,
    seeded,
)
from moe_policy.experts.triton.device import device_limits  # noqa: E402
from moe_policy.experts.triton.fused_moe import TritonExperts, fused_moe_triton  # noqa: E402
from moe_policy.experts.triton.launch import MoEProblem, plan_launch  # noqa: E402

pytestmark = pytest.mark.gpu

#: ||out - ref|| / ||ref|| in bf16 against the fp32 reference on the same bf16 inputs: the
#: [T*k, I] activation, the [T*k, H] partials and the output are rounded to bf16 (2^-9
#: relative each, random), LoRA's shrink output too; expected a few 1e-3.
BF16_REL_TOL = 1.5e-2

SHAPES = {
    "nemotron3-nano": ExpertsConfig(128, 2688, 1856, 6, "relu2", gated=False),
    "mixtral-8x7b": ExpertsConfig(8, 4096, 14336, 2, "silu"),
    "qwen3-30b-a3b": ExpertsConfig(128, 2048, 768, 8, "silu"),
    "gpt-oss-20b": ExpertsConfig(32, 2880, 2880, 4, "swigluoai", has_bias=True),
    "swiglustep-synthetic": ExpertsConfig(64, 2048, 1280, 8, "swiglustep", swiglu_limit=1.0),
}
TOKENS = (1, 37, 256, 1001)
LORA_TOKENS = (3, 129, 3000)  # 3000: experts span several blocks, pairs ordered by adapter
LORA_SLOTS, LORA_RANK = 4, 16


@pytest.fixture(scope="module")
def layers():
    """Weights per shape, built once per module (bf16, h ~ N(0, 1))."""
    cache: dict[str, tuple] = {}

    def get(name: str):
        if name not in cache:
            cache.clear()
            torch.cuda.empty_cache()
            cfg = SHAPES[name]
            w = make_weights(cfg, torch.bfloat16, "cuda", seed=0)
            backend = TritonExperts(cfg, w["w13"], w["w2"], w["w13_bias"], w["w2_bias"])
            cache[name] = (cfg, w, backend)
        return cache[name]

    return get


def _inputs(cfg: ExpertsConfig, t: int, seed: int):
    g = seeded(seed, "cuda")
    x = make_x(t, cfg.hidden_size, torch.bfloat16, "cuda", generator=g)
    tw, ti = make_routing(t, cfg.num_experts, cfg.top_k, "cuda", generator=g)
    return x, tw, ti


def _adapters(cfg: ExpertsConfig) -> MoELoRAAdapters:
    """Ranks below the max rank are zero-padded."""
    return make_lora(cfg, num_slots=LORA_SLOTS, max_rank=LORA_RANK, ranks=[16, 8, 16, 4],
                     dtype=torch.bfloat16, device="cuda", generator=seeded(7, "cuda"))  # fmt: skip


@pytest.mark.parametrize("t", TOKENS)
@pytest.mark.parametrize("name", list(SHAPES))
def test_full_shape_bf16(name, t, layers):
    """bf16 output within BF16_REL_TOL of the fp32 reference at the model's full shape."""
    cfg, w, backend = layers(name)
    x, tw, ti = _inputs(cfg, t, seed=t)
    out = backend.apply(x, tw, ti)
    ref = reference_output(cfg, w, x, tw, ti)
    err = rel_err(out, ref)
    assert err < BF16_REL_TOL, f"{name} T={t}: relative error {err:.2e}"


@pytest.mark.parametrize("t", LORA_TOKENS)
@pytest.mark.parametrize("name", list(SHAPES))
def test_full_shape_lora_bf16(name, t, layers):
    """LoRA (rank 16, 4 adapters, round-robin with every third token on -1) at full shape."""
    cfg, w, backend = layers(name)
    x, tw, ti = _inputs(cfg, t, seed=100 + t)
    ad = _adapters(cfg)
    idx = torch.arange(t, device="cuda")
    mapping = torch.where(idx % 3 == 0, -1, idx % LORA_SLOTS).int()
    ctx = lora_context(ad, mapping)
    out = backend.apply(x, tw, ti, ctx)
    ref = reference_output(cfg, w, x, tw, ti, ctx)
    err = rel_err(out, ref)
    assert err < BF16_REL_TOL, f"{name} T={t}: relative error {err:.2e}"
    none = mapping < 0
    # exactly zero delta: bit-identical to the base layer summing K in the same order. A base
    # call may split its last round along K (stream-K tails, Mixtral T=3000), whose parts sum
    # in another order: within a bf16 rounding of it, not bit-identical
    split = backend.apply(x, tw, ti)
    plan = plan_launch(MoEProblem.of(cfg, t, x.element_size()), device_limits(x.device))
    wt = backend.weights
    base = fused_moe_triton(x, wt["w13"], wt["w2"], tw, ti, activation=cfg.activation,
                            gated=cfg.gated, w13_bias=wt["w13_bias"], w2_bias=wt["w2_bias"],
                            swiglu_alpha=cfg.swiglu_alpha, swiglu_limit=cfg.swiglu_limit,
                            plan=dataclasses.replace(plan, stream_k=False))  # fmt: skip
    assert torch.equal(out[none], base[none]), "tokens without an adapter must get the base output"
    assert rel_err(split[none], base[none]) < 4e-3, "stream-K tails change more than rounding"
    assert rel_err(base[~none], ref[~none]) > 5 * BF16_REL_TOL, (
        "the adapters must change the output"
    )


@pytest.mark.parametrize("with_lora", [False, True])
@pytest.mark.parametrize("t", [1, 64])
def test_cuda_graph_capture_and_no_host_sync(t, with_lora, layers):
    """apply runs with sync debug mode 'error' and replays in a CUDA graph to the same result,
    replay after replay (T=1 is the decode path whose GEMM 2 sums the top k itself, with
    counters that every call re-zeroes)."""
    cfg, _w, backend = layers("qwen3-30b-a3b")
    x, tw, ti = _inputs(cfg, t, seed=5)
    ctx = (
        lora_context(_adapters(cfg), (torch.arange(t, device="cuda") % 5 - 1).int())
        if with_lora
        else None
    )
    eager = backend.apply(x, tw, ti, ctx)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        backend.apply(x, tw, ti, ctx)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        backend.apply(x, tw, ti, ctx)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = backend.apply(x, tw, ti, ctx)
    for seed in (6, 7, 8):
        x2, tw2, ti2 = _inputs(cfg, t, seed=seed)
        x.copy_(x2), tw.copy_(tw2), ti.copy_(ti2)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, backend.apply(x, tw, ti, ctx)), f"replay with seed {seed}"
        assert not torch.equal(out, eager)


@pytest.mark.parametrize("with_lora", [False, True])
@pytest.mark.parametrize("t", [1, 64, 1001])
@pytest.mark.parametrize("name", ["nemotron3-nano", "qwen3-30b-a3b"])
def test_peak_extra_memory_within_budget(name, t, with_lora, layers):
    """One call allocates at most a T*k*max(N1, H) and a T*k*I buffer in bf16 (+ T*k*R*(S+1)
    fp32 with LoRA), beyond its inputs and output, up to the allocator's 512-byte rounding of
    each of those buffers (the layer's memory budget)."""
    cfg, _w, backend = layers(name)
    x, tw, ti = _inputs(cfg, t, seed=7)
    ctx = None
    if with_lora:
        ctx = lora_context(_adapters(cfg), (torch.arange(t, device="cuda") % 5 - 1).int())
    backend.apply(x, tw, ti, ctx)  # warm: compile, autotune nothing, fill caches
    pairs = t * cfg.top_k
    budget = pairs * max(cfg.w13_rows, cfg.hidden_size) * 2 + pairs * cfg.intermediate_size * 2
    if with_lora:
        budget += pairs * LORA_RANK * ((2 if cfg.gated else 1) + 1) * 4
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    out = backend.apply(x, tw, ti, ctx)
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - before - out.numel() * out.element_size()
    assert extra <= budget + (4 if with_lora else 2) * 512, (
        f"{name} T={t} lora={with_lora}: {extra} bytes beyond a budget of {budget}"
    )
