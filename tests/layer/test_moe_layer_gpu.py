"""End to end on the GPU at the full Nemotron-3-Nano shape: policy -> MoELayer -> output vs reference."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from moe_policy import BackendOverrideWarning  # noqa: E402
from moe_policy.experts.lora import MoELoRAContext  # noqa: E402
from moe_policy.experts.reference import fused_moe_reference  # noqa: E402
from moe_policy.layer import MoELayer  # noqa: E402
from tests.bundled import NEMOTRON  # noqa: E402

pytestmark = pytest.mark.gpu

E, K, H, I = 128, 6, 2688, 1856  # noqa: E741 (the model's own symbols)
SLOTS, RANK = 4, 16
# bf16 operands, fp32 accumulation, two GEMMs + relu2: ~5e-3 relative error expected.
BF16_RTOL = 2e-2
DRY = {"platform": "cuda", "capability": "9.0", "device_name": "NVIDIA H200"}


def _setup(t: int):
    g = torch.Generator(device="cuda").manual_seed(0)
    w13 = torch.randn(E, I, H, device="cuda", generator=g, dtype=torch.bfloat16) / H**0.5
    w2 = torch.randn(E, H, I, device="cuda", generator=g, dtype=torch.bfloat16) / I**0.5
    x = torch.randn(t, H, device="cuda", generator=g, dtype=torch.bfloat16)
    logits = torch.randn(t, E, device="cuda", generator=g)
    weights, ids = torch.topk(torch.softmax(logits, dim=1), K, dim=1)
    mapping = (
        torch.arange(t, device="cuda", dtype=torch.int32) % (SLOTS + 1)
    ) - 1  # round robin with -1
    return w13, w2, x, weights / weights.sum(1, keepdim=True), ids.to(torch.int32), mapping


def _adapter(seed: int):
    g = torch.Generator(device="cuda").manual_seed(seed)
    r = lambda *s: torch.randn(*s, device="cuda", generator=g, dtype=torch.bfloat16) * 0.05  # noqa: E731
    return {
        "w13_a": [r(E, RANK, H)],
        "w13_b": [r(E, I, RANK)],
        "w2_a": r(E, RANK, I),
        "w2_b": r(E, H, RANK),
        "scaling": 2.0,
    }


@pytest.mark.parametrize(
    ("all2all", "backend"), [("none", "triton"), ("deepep_low_latency", "batched_triton")]
)
@pytest.mark.parametrize("t", [1, 77, 512])
def test_nemotron_lora_layer_matches_reference(all2all, backend, t):
    """The user story on real hardware: FlashInfer requested, LoRA on -> Triton family runs and is right."""
    w13, w2, x, weights, ids, mapping = _setup(t)
    with pytest.warns(BackendOverrideWarning):
        layer = MoELayer.build(
            NEMOTRON,
            w13,
            w2,
            environ={"MOE_POLICY_BACKEND": "flashinfer_cutlass"},
            lora=True,
            max_loras=SLOTS,
            max_lora_rank=RANK,
            all2all=all2all,
            **DRY,
        )
    assert layer.decision.backend == backend
    for slot in range(SLOTS):
        layer.load_adapter(slot, **_adapter(10 + slot))
    out = layer(x, weights, ids, mapping)
    ref = fused_moe_reference(
        x,
        w13,
        w2,
        weights,
        ids,
        activation="relu2",
        gated=False,
        lora=MoELoRAContext(layer.lora, mapping),
    )
    err = ((out.float() - ref.float()).norm() / ref.float().norm()).item()
    assert err < BF16_RTOL, err
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("backend", ["torch_grouped_mm", "reference"])
def test_other_implemented_backends_on_request(backend):
    """Every decided backend implemented here runs through MoELayer without LoRA and matches."""
    w13, w2, x, weights, ids, _ = _setup(256)
    layer = MoELayer.build(NEMOTRON, w13, w2, environ={}, backend=backend, **DRY)
    assert layer.decision.backend == backend
    out = layer(x, weights, ids)
    ref = fused_moe_reference(x, w13, w2, weights, ids, activation="relu2", gated=False)
    err = ((out.float() - ref.float()).norm() / ref.float().norm()).item()
    assert err < BF16_RTOL, err
