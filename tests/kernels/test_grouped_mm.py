"""torch grouped-GEMM backend: availability reasons, pure conversion, the pipeline's math
(on the CPU where torch's CPU grouped_mm exists) and full shapes on an SM90+ GPU."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from moe_policy.experts.base import ExpertsConfig
from moe_policy.experts.grouped_mm import (
    TorchGroupedMMExperts,
    check_config,
    grouped_mm_fn,
    grouped_mm_fused_moe,
)
from moe_policy.experts.lora import MoELoRAAdapters, MoELoRAContext
from moe_policy.experts.reference import fused_moe_reference
from moe_policy.experts.testing import (
    FULL_SHAPES,
    cpu_grouped_mm_works,
    make_lora,
    make_weights,
    reference_output,
    rel_err,
    swiglustep_float64,
)

#: fp32 on the CPU: same fp32 products as the reference, summed in another order.
CPU_FP32_REL_L2 = 1e-5
#: bf16 on the GPU: h, a, the LoRA shrink output and the grouped GEMM outputs are bf16.
GPU_BF16_REL_L2 = 1e-2

ACTIVATIONS = [
    ("silu", True, False),
    ("gelu", True, True),
    ("gelu_tanh", True, False),
    ("swigluoai", True, True),
    ("swiglustep", True, True),
    ("relu2", False, False),
    ("silu", False, True),
    ("gelu", False, False),
    ("gelu_tanh", False, False),
]


def _skip_unless_available() -> None:
    ok, reason = TorchGroupedMMExperts.is_available()
    if not ok:
        pytest.skip(reason or "torch_grouped_mm unavailable")


def test_availability_has_a_reason() -> None:
    """is_available() is (True, None) or (False, a reason naming what is missing)."""
    ok, reason = TorchGroupedMMExperts.is_available()
    assert (ok and reason is None) or (not ok and isinstance(reason, str) and reason)
    if not torch.cuda.is_available():
        assert not ok and ("CUDA" in reason or "grouped_mm" in reason)


def test_class_contract_and_declared_limits() -> None:
    """Catalog attributes and the static checks: bf16 only, sizes and LoRA rank % 8."""
    assert TorchGroupedMMExperts.backend == "torch_grouped_mm"
    assert TorchGroupedMMExperts.activation_format == "standard"
    assert TorchGroupedMMExperts.supports_lora is True
    cfg = ExpertsConfig(8, 64, 48, 2)
    assert check_config(cfg, torch.bfloat16) == (True, None)
    assert check_config(cfg, torch.float16)[0] is False
    assert check_config(ExpertsConfig(8, 64, 44, 2), "bfloat16")[0] is False
    assert check_config(cfg, "bf16", lora_max_rank=12)[0] is False
    assert check_config(cfg, "bf16", lora_max_rank=16) == (True, None)
    assert TorchGroupedMMExperts.supports({"dtype": "float16"})[0] is False
    assert TorchGroupedMMExperts.supports(
        {"dtype": "bfloat16", "hidden_size": 2688, "intermediate_size": 1856}
    ) == (True, None)
    assert TorchGroupedMMExperts.supports({"lora_enabled": True, "lora_max_rank": 4})[0] is False


def test_convert_weights_is_pure() -> None:
    """convert_weights leaves inputs untouched and keeps the common layout."""
    cfg = ExpertsConfig(4, 32, 16, 2, activation="swigluoai", has_bias=True)
    w13, w2 = torch.randn(4, 32, 32), torch.randn(4, 32, 16)
    b13, b2 = torch.randn(4, 32), torch.randn(4, 32)
    before = [t.clone() for t in (w13, w2, b13, b2)]
    conv = TorchGroupedMMExperts.convert_weights(cfg, w13, w2, b13, b2)
    for t, b in zip((w13, w2, b13, b2), before, strict=True):
        assert torch.equal(t, b)
    assert torch.equal(conv["w13"], w13) and torch.equal(conv["w2_bias"], b2)
    with pytest.raises(ValueError, match="expected w13"):
        TorchGroupedMMExperts.convert_weights(cfg, w13[:, :16], w2)


def test_apply_rejects_what_it_does_not_support() -> None:
    """apply raises ValueError on non-bf16 dtypes and non-CUDA tensors."""
    cfg = ExpertsConfig(4, 32, 16, 2)
    ex = TorchGroupedMMExperts(cfg, torch.randn(4, 32, 32), torch.randn(4, 32, 16))
    ids = torch.zeros(3, 2, dtype=torch.int32)
    with pytest.raises(ValueError, match="bf16"):
        ex.apply(torch.randn(3, 32), torch.rand(3, 2), ids)
    ex16 = TorchGroupedMMExperts(
        cfg, torch.randn(4, 32, 32).bfloat16(), torch.randn(4, 32, 16).bfloat16()
    )
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA"):
            ex16.apply(torch.randn(3, 32).bfloat16(), torch.rand(3, 2), ids)


@pytest.mark.skipif(not cpu_grouped_mm_works(), reason="this torch has no CPU grouped_mm")
@pytest.mark.parametrize("use_lora", [False, True], ids=["base", "lora"])
@pytest.mark.parametrize(("activation", "gated", "has_bias"), ACTIVATIONS)
def test_pipeline_matches_reference_on_cpu(
    activation: str, gated: bool, has_bias: bool, use_lora: bool
) -> None:
    """The sort / grouped GEMM / LoRA-group / un-permute pipeline equals the reference (fp32)."""
    e, h, i, k, t = 6, 48, 40, 2, 20
    cfg = ExpertsConfig(e, h, i, k, activation=activation, gated=gated, has_bias=has_bias)
    wt = make_weights(cfg, torch.float32, "cpu", seed=3)
    g = torch.Generator().manual_seed(4)
    x = torch.randn(t, h, generator=g)
    ids = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(t)]).to(torch.int32)
    ids[:, 0] = 1  # expert 1 takes every token; some experts stay empty
    ids[ids == 0] = 5
    ids[3, 1] = -1  # an expert on another rank
    w = torch.rand(t, k, generator=g)
    lora = None
    if use_lora:
        ad = make_lora(cfg, num_slots=4, max_rank=16, ranks=[16, 8, 16, 16], disabled=(3,),
                       dtype=torch.float32, device="cpu")  # fmt: skip
        lora = MoELoRAContext(ad, (torch.arange(t, dtype=torch.int32) % 5) - 1)
    kw = dict(
        activation=activation,
        gated=gated,
        w13_bias=wt["w13_bias"],
        w2_bias=wt["w2_bias"],
        lora=lora,
    )
    out = grouped_mm_fused_moe(x, wt["w13"], wt["w2"], w, ids, **kw)
    ref = fused_moe_reference(x, wt["w13"], wt["w2"], w, ids, **kw)
    assert rel_err(out, ref) < CPU_FP32_REL_L2
    if use_lora:
        base = fused_moe_reference(x, wt["w13"], wt["w2"], w, ids, **{**kw, "lora": None})
        assert rel_err(base, ref) > 1e-2


@pytest.mark.skipif(not cpu_grouped_mm_works(), reason="this torch has no CPU grouped_mm")
@pytest.mark.parametrize("use_lora", [False, True], ids=["base", "lora"])
def test_pipeline_swiglustep_clamps_at_the_layer_limit_on_cpu(use_lora: bool) -> None:
    """swiglustep at a limit of 0.5 (most silu(gate) and |up| past it): the pipeline follows
    the reference at that limit, not at 7, and without LoRA the float64 formula written out
    apart from the reference."""
    e, h, i, k, t = 6, 48, 40, 2, 20
    cfg = ExpertsConfig(e, h, i, k, activation="swiglustep", has_bias=True, swiglu_limit=0.5)
    wt = make_weights(cfg, torch.float32, "cpu", seed=6)
    g = torch.Generator().manual_seed(7)
    x = torch.randn(t, h, generator=g)
    ids = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(t)]).to(torch.int32)
    ids[2, 0] = -1
    w = torch.rand(t, k, generator=g)
    lora = None
    if use_lora:
        ad = make_lora(cfg, num_slots=3, max_rank=8, ranks=[8, 4, 8], disabled=(2,),
                       dtype=torch.float32, device="cpu")  # fmt: skip
        lora = MoELoRAContext(ad, (torch.arange(t, dtype=torch.int32) % 4) - 1)
    kw = dict(activation="swiglustep", w13_bias=wt["w13_bias"], w2_bias=wt["w2_bias"], lora=lora)
    out = grouped_mm_fused_moe(x, wt["w13"], wt["w2"], w, ids, swiglu_limit=0.5, **kw)
    ref = fused_moe_reference(x, wt["w13"], wt["w2"], w, ids, swiglu_limit=0.5, **kw)
    assert rel_err(out, ref) < CPU_FP32_REL_L2
    at_7 = fused_moe_reference(x, wt["w13"], wt["w2"], w, ids, swiglu_limit=7.0, **kw)
    assert rel_err(at_7, ref) > 0.1
    if not use_lora:
        assert rel_err(out, swiglustep_float64(wt, x, w, ids, 0.5)) < CPU_FP32_REL_L2


@pytest.mark.skipif(not cpu_grouped_mm_works(), reason="this torch has no CPU grouped_mm")
def test_pipeline_router_weight_on_input_on_cpu() -> None:
    """Top-1 with the weight on the input (Llama-4 style), with LoRA."""
    cfg = ExpertsConfig(4, 32, 24, 1, apply_router_weight_on_input=True)
    wt = make_weights(cfg, torch.float32, "cpu", seed=5)
    x = torch.randn(10, 32)
    ids = (torch.arange(10) % 4).to(torch.int32).unsqueeze(1)
    w = torch.rand(10, 1)
    ad = make_lora(cfg, num_slots=2, max_rank=8, ranks=[8, 8], disabled=(1,), dtype=torch.float32,
                   device="cpu")  # fmt: skip
    lora = MoELoRAContext(ad, (torch.arange(10, dtype=torch.int32) % 3) - 1)
    kw = dict(activation="silu", apply_router_weight_on_input=True, lora=lora)
    out = grouped_mm_fused_moe(x, wt["w13"], wt["w2"], w, ids, **kw)
    ref = fused_moe_reference(x, wt["w13"], wt["w2"], w, ids, **kw)
    assert rel_err(out, ref) < CPU_FP32_REL_L2


@pytest.mark.skipif(grouped_mm_fn() is None, reason="this torch has no grouped_mm")
def test_pipeline_rejects_bad_input() -> None:
    """Caller mistakes raise one ValueError naming the argument (they raised IndexError or
    RuntimeError from inside torch's grouped_mm, indexing or reshapes)."""
    cfg = ExpertsConfig(4, 32, 16, 2)
    wt = make_weights(cfg, torch.float32, "cpu")
    w13, w2 = wt["w13"], wt["w2"]
    x = torch.randn(3, 32)
    ids = torch.tensor([[0, 1], [2, 3], [1, 0]], dtype=torch.int32)
    w = torch.rand(3, 2)
    with pytest.raises(ValueError, match=r"share one of .*; got x torch.float16, weights \[torch"):
        grouped_mm_fused_moe(x.half(), w13, w2, w, ids)
    with pytest.raises(ValueError, match=r"expected x \[T, H\], .*topk_ids \(3,\)"):
        grouped_mm_fused_moe(x, w13, w2, w[:, 0], ids[:, 0])
    with pytest.raises(ValueError, match=r"both be \[T=3, k\]; .*topk_ids \(2, 2\)"):
        grouped_mm_fused_moe(x, w13, w2, w[:2], ids[:2])
    with pytest.raises(ValueError, match=r"expected w13_bias \(4, 32\), got \(3, 32\)"):
        grouped_mm_fused_moe(x, w13, w2, w, ids, w13_bias=torch.zeros(3, 32))
    with pytest.raises(ValueError, match=r"shape mismatch \(gated=True\)"):
        grouped_mm_fused_moe(x, w13[:, :16], w2, w, ids)
    ad = make_lora(cfg, num_slots=2, max_rank=8, ranks=[8], dtype=torch.float32, device="cpu")
    short = MoELoRAContext(dataclasses.replace(ad, enabled=ad.enabled[:1]), ids[:, 0])
    with pytest.raises(ValueError, match=r"enabled must be \[L=2\], got shape \(1,\)"):
        grouped_mm_fused_moe(x, w13, w2, w, ids, lora=short)
    half = dataclasses.replace(ad, w2_b=ad.w2_b.half())
    with pytest.raises(ValueError, match=r"LoRA weights must share one of .*torch.float16\]"):
        grouped_mm_fused_moe(x, w13, w2, w, ids, lora=MoELoRAContext(half, ids[:, 0]))


@pytest.mark.skipif(not cpu_grouped_mm_works(), reason="this torch has no CPU grouped_mm")
def test_pipeline_empty_batch_on_cpu() -> None:
    """T = 0 returns an empty [0, H] output, with and without LoRA."""
    cfg = ExpertsConfig(4, 32, 16, 2)
    wt = make_weights(cfg, torch.float32, "cpu")
    ad = make_lora(cfg, num_slots=2, max_rank=8, ranks=[8], dtype=torch.float32, device="cpu")
    for lora in (None, MoELoRAContext(ad, torch.zeros(0, dtype=torch.int32))):
        out = grouped_mm_fused_moe(torch.randn(0, 32), wt["w13"], wt["w2"], torch.rand(0, 2),
                                   torch.zeros(0, 2, dtype=torch.int32), lora=lora)  # fmt: skip
        assert out.shape == (0, 32) and out.dtype == torch.float32


# ---------------------------------------------------------------------------------------
# GPU (SM90+, bf16): skipped with is_available()'s reason elsewhere.
# ---------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("use_lora", [False, True], ids=["base", "lora"])
@pytest.mark.parametrize("num_tokens", [5, 256])
@pytest.mark.parametrize("model", list(FULL_SHAPES))
def test_full_shape_gpu(model: str, num_tokens: int, use_lora: bool) -> None:
    """Full Nemotron-3-Nano / Mixtral layers in bf16, uniform routing, vs the reference."""
    _skip_unless_available()
    e, k, h, i, act, gated = FULL_SHAPES[model]
    cfg = ExpertsConfig(e, h, i, k, activation=act, gated=gated)
    wt = make_weights(cfg, torch.bfloat16, "cuda", seed=11)
    ad = (
        make_lora(
            cfg,
            num_slots=4,
            max_rank=16,
            ranks=[16, 8, 16, 16],
            disabled=(3,),
            dtype=torch.bfloat16,
            device="cuda",
        )
        if use_lora
        else None
    )
    g = torch.Generator(device="cuda").manual_seed(num_tokens)
    x = torch.randn(num_tokens, h, device="cuda", generator=g).to(torch.bfloat16)
    ids = (
        torch.rand(num_tokens, e, device="cuda", generator=g).argsort(dim=1)[:, :k].to(torch.int32)
    )
    w = torch.rand(num_tokens, k, device="cuda", generator=g)
    token_lora = (torch.arange(num_tokens, device="cuda", dtype=torch.int32) % 5) - 1
    lora = MoELoRAContext(ad, token_lora) if ad is not None else None
    out = TorchGroupedMMExperts(cfg, wt["w13"], wt["w2"]).apply(x, w, ids, lora)
    ref = reference_output(cfg, wt, x, w, ids, lora)
    err = rel_err(out, ref)
    print(f"grouped_mm {model} T={num_tokens} lora={use_lora}: rel_err={err:.2e}")
    assert err < GPU_BF16_REL_L2


@pytest.mark.gpu
def test_swigluoai_bias_and_cuda_graph_gpu() -> None:
    """gpt-oss-style layer (interleaved swigluoai, biases, -1 ids, LoRA) eagerly and replayed
    from a CUDA graph (no host sync in the pipeline)."""
    _skip_unless_available()
    e, h, i, k, t = 16, 256, 128, 4, 48
    cfg = ExpertsConfig(e, h, i, k, activation="swigluoai", has_bias=True)
    wt = make_weights(cfg, torch.bfloat16, "cuda", seed=12)
    ad = make_lora(cfg, num_slots=3, max_rank=16, ranks=[16, 8, 16], disabled=(2,),
                   dtype=torch.bfloat16, device="cuda")  # fmt: skip
    x = torch.randn(t, h, device="cuda").to(torch.bfloat16)
    ids = torch.rand(t, e, device="cuda").argsort(dim=1)[:, :k].to(torch.int32)
    ids[::7, -1] = -1
    w = torch.rand(t, k, device="cuda")
    lora = MoELoRAContext(ad, (torch.arange(t, device="cuda", dtype=torch.int32) % 4) - 1)
    ex = TorchGroupedMMExperts(cfg, wt["w13"], wt["w2"], wt["w13_bias"], wt["w2_bias"])
    ref = reference_output(cfg, wt, x, w, ids, lora)
    assert rel_err(ex.apply(x, w, ids, lora), ref) < GPU_BF16_REL_L2
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        ex.apply(x, w, ids, lora)  # warm up on a side stream before capture
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = ex.apply(x, w, ids, lora)
    x.copy_(torch.randn(t, h, device="cuda").to(torch.bfloat16))
    graph.replay()
    ref2 = reference_output(cfg, wt, x, w, ids, lora)
    assert rel_err(out, ref2) < GPU_BF16_REL_L2


@pytest.mark.skipif(not cpu_grouped_mm_works(), reason="this torch has no CPU grouped_mm")
def test_pipeline_adapters_without_slots_or_rank_give_the_base_on_cpu() -> None:
    """Adapters with no slot or max rank 0 add nothing (they raised IndexError and a reshape
    RuntimeError)."""
    cfg = ExpertsConfig(4, 32, 16, 2)
    wt = make_weights(cfg, torch.float32, "cpu")
    x = torch.randn(5, 32)
    ids = torch.tensor([[0, 1], [2, 3], [1, 1], [3, 0], [2, -1]], dtype=torch.int32)
    w = torch.rand(5, 2)
    base = grouped_mm_fused_moe(x, wt["w13"], wt["w2"], w, ids)
    for slots, rank in ((0, 8), (2, 0)):
        ad = MoELoRAAdapters.allocate(num_slots=slots, num_experts=4, hidden_size=32,
                                      intermediate_size=16, max_rank=rank, num_slices=2,
                                      dtype=torch.float32)  # fmt: skip
        ad.enabled.fill_(1)
        lora = MoELoRAContext(ad, torch.zeros(5, dtype=torch.int32))
        assert torch.equal(grouped_mm_fused_moe(x, wt["w13"], wt["w2"], w, ids, lora=lora), base)
