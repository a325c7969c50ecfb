"""Off the bf16 H200 path, on the GPU: other dtypes, unaligned rows, other parts' tiles.

fp32 and fp16 layers at full model shapes: the configs (tuned files and heuristic) are planned
for 2-byte elements; fp32 doubles every tile, so the launcher must cut them for the dtype it
runs, or the launch fails for want of shared memory. Standard format with and without LoRA,
and the batched format, at decode and prefill sizes, against the fp32 reference.

Rows that are not 16-byte multiples (H or I odd multiples of 4 elements in bf16): TMA
descriptors cannot describe them, so the launcher falls back to pointer loads on Hopper too;
the heuristic's tiles run with N and K tails.

Tiles planned for an Ada part (L40S: 72 KB budget, no TMA, no dependent launches) run here
as that part would run them, so the cut tiles are checked for correctness at full shapes
(their fit is checked by compiling, tools/smem_check.py).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from moe_policy.experts.base import ExpertsConfig  # noqa: E402
from moe_policy.experts.lora import MoELoRAContext  # noqa: E402
from moe_policy.experts.testing import (  # noqa: E402
    make_lora,
    make_routing,
    make_weights,
    reference_output,
    rel_err,
)
from moe_policy.experts.triton.batched import BatchedTritonExperts  # noqa: E402
from moe_policy.experts.triton.device import DeviceLimits, tma_layout  # noqa: E402
from moe_policy.experts.triton.fused_moe import TritonExperts  # noqa: E402

pytestmark = pytest.mark.gpu

SHAPES = {
    "mixtral-8x7b": ExpertsConfig(8, 4096, 14336, 2, "silu"),
    "qwen3-30b-a3b": ExpertsConfig(128, 2048, 768, 8, "silu"),
}
#: fp32 operands go through tl.dot as tf32 (10-bit mantissa), fp16 ones are rounded at the
#: activation and the partial sums: a few 1e-3 relative, as bf16 in test_gpu_full_shapes.
REL_TOL = {torch.float32: 1e-2, torch.float16: 1e-2}


@pytest.fixture(scope="module")
def layers():
    cache: dict = {}

    def get(name: str, dtype: torch.dtype):
        if (name, dtype) not in cache:
            cache.clear()
            torch.cuda.empty_cache()
            cfg = SHAPES[name]
            cache[(name, dtype)] = (cfg, make_weights(cfg, dtype, "cuda", seed=3),
                                    _adapters(cfg, dtype))  # fmt: skip
        return cache[(name, dtype)]

    return get


def _adapters(cfg: ExpertsConfig, dtype: torch.dtype):
    """4 slots, ranks 16/8/16/16, slot 3 disabled."""
    return make_lora(cfg, num_slots=4, max_rank=16, ranks=[16, 8, 16, 16], disabled=(3,),
                     dtype=dtype, device="cuda")  # fmt: skip


def _call_inputs(cfg: ExpertsConfig, t: int, dtype: torch.dtype, ad, use_lora: bool):
    """(x, topk_weights, topk_ids, LoRA context or None): tokens cycle through -1 and slots 0-3."""
    w, ids = make_routing(t, cfg.num_experts, cfg.top_k, "cuda", seed=t)
    x = torch.randn(t, cfg.hidden_size, device="cuda").to(dtype)
    mapping = ((torch.arange(t, device="cuda") % 5) - 1).int()
    return x, w, ids, MoELoRAContext(ad, mapping) if use_lora else None


def _reference(cfg, wt, x, w, ids, lora=None):
    old = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        return reference_output(cfg, wt, x, w, ids, lora)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old


@pytest.mark.parametrize("use_lora", [False, True], ids=["base", "lora"])
@pytest.mark.parametrize("t", [1, 1001])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("name", list(SHAPES))
def test_standard_format(name, dtype, t, use_lora, layers):
    cfg, wt, ad = layers(name, dtype)
    x, w, ids, lora = _call_inputs(cfg, t, dtype, ad, use_lora)
    out = TritonExperts(cfg, wt["w13"], wt["w2"]).apply(x, w, ids, lora)
    err = rel_err(out, _reference(cfg, wt, x, w, ids, lora))
    assert out.dtype == dtype and err < REL_TOL[dtype], f"{name} T={t}: {err:.2e}"


@pytest.mark.parametrize("use_lora", [False, True], ids=["base", "lora"])
@pytest.mark.parametrize("rows", [16, 512])
@pytest.mark.parametrize("name", list(SHAPES))
def test_batched_format_fp32(name, rows, use_lora, layers):
    """Every expert holds ``rows`` tokens (counts below the capacity for half of them)."""
    cfg, wt, ad = layers(name, torch.float32)
    e, h = cfg.num_experts, cfg.hidden_size
    x = torch.randn(e, rows, h, device="cuda")
    counts = torch.full((e,), rows, dtype=torch.int32, device="cuda")
    counts[::2] = rows // 2
    slot_map = ((torch.arange(e * rows, device="cuda") % 5) - 1).int().view(e, rows)
    lora = MoELoRAContext(ad, slot_map) if use_lora else None
    out = BatchedTritonExperts(cfg, wt["w13"], wt["w2"]).apply(x, counts, lora)
    # reference: each expert's valid rows as tokens routed to that expert alone (weight 1)
    valid = torch.arange(rows, device="cuda")[None, :] < counts[:, None]
    ids = torch.arange(e, device="cuda").repeat_interleave(rows).view(e, rows)[valid][:, None]
    xs = x[valid]
    ref_lora = MoELoRAContext(ad, slot_map[valid]) if use_lora else None
    ref = _reference(cfg, wt, xs, torch.ones_like(ids, dtype=torch.float32), ids.int(), ref_lora)
    err = rel_err(out[valid], ref)
    assert err < REL_TOL[torch.float32], f"{name} rows={rows}: {err:.2e}"


#: H*2 and I*2 bytes are not multiples of 16: no TMA for the weights or the activations.
ODD = {
    "gated": ExpertsConfig(16, 1004, 740, 4, "silu"),
    "non-gated": ExpertsConfig(16, 1004, 740, 4, "relu2", gated=False),
    # the clamp at a limit of 1 engages on h ~ N(0, 1)
    "swiglustep": ExpertsConfig(16, 1004, 740, 4, "swiglustep", swiglu_limit=1.0),
}


@pytest.mark.parametrize("use_lora", [False, True], ids=["base", "lora"])
@pytest.mark.parametrize("t", [1, 300, 2000])
@pytest.mark.parametrize("name", list(ODD))
def test_unaligned_rows_take_pointer_loads(name, t, use_lora):
    from moe_policy.experts.triton import fused_moe as triton_moe

    cfg = ODD[name]
    wt = make_weights(cfg, torch.bfloat16, "cuda", seed=5)
    assert not tma_layout(wt["w2"].view(-1, cfg.intermediate_size))
    x, w, ids, lora = _call_inputs(cfg, t, torch.bfloat16, _adapters(cfg, torch.bfloat16), use_lora)
    conv = TritonExperts.convert_weights(cfg, wt["w13"], wt["w2"])
    out = triton_moe.fused_moe_triton(x, conv["w13"], conv["w2"], w, ids,
                                      activation=cfg.activation, gated=cfg.gated, lora=lora,
                                      swiglu_limit=cfg.swiglu_limit)  # fmt: skip
    err = rel_err(out, _reference(cfg, wt, x, w, ids, lora))
    assert err < 1.5e-2, f"{name} T={t}: {err:.2e}"


#: An L40S (sm_89: 99 KB opt-in -> a 72 KB budget, 142 SMs, no TMA, no dependent launches).
ADA = DeviceLimits(num_sms=142, smem_limit=101376 - 27 * 1024, device_name="NVIDIA L40S",
                   tile_sms=142)  # fmt: skip
FULL = {
    "nemotron3-nano": ExpertsConfig(128, 2688, 1856, 6, "relu2", gated=False),
    "qwen3-30b-a3b": ExpertsConfig(128, 2048, 768, 8, "silu"),
}


@pytest.mark.parametrize("use_lora", [False, True], ids=["base", "lora"])
@pytest.mark.parametrize("t", [1, 300, 3000])
@pytest.mark.parametrize("name", list(FULL))
def test_tiles_planned_for_an_ada_part_compute_correctly(name, t, use_lora, monkeypatch):
    """The launcher as an L40S runs it (its 72 KB budget, so narrower tiles and fewer stages;
    no TMA, no dependent launches), executed on this GPU at full shapes: the cut tiles and
    the pointer-load path give the reference's result."""
    from moe_policy.experts.triton import fused_moe as triton_moe

    monkeypatch.setattr(triton_moe, "device_limits", lambda device: ADA)
    cfg = FULL[name]
    wt = make_weights(cfg, torch.bfloat16, "cuda", seed=9)
    x, w, ids, lora = _call_inputs(cfg, t, torch.bfloat16, _adapters(cfg, torch.bfloat16), use_lora)
    out = TritonExperts(cfg, wt["w13"], wt["w2"]).apply(x, w, ids, lora)
    err = rel_err(out, _reference(cfg, wt, x, w, ids, lora))
    assert err < 1.5e-2, f"{name} T={t}: {err:.2e}"
