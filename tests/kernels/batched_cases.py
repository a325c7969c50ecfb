"""Builders shared by the batched, grouped-GEMM and FlashInfer adapter tests."""

from __future__ import annotations

import torch

from moe_policy.experts.base import ExpertsConfig
from moe_policy.experts.lora import MoELoRAAdapters


def rel_l2(out: torch.Tensor, ref: torch.Tensor) -> float:
    """‖out − ref‖ / ‖ref‖ in fp32; NaN never passes."""
    o, r = out.float(), ref.float()
    assert torch.isfinite(o).all(), "non-finite output"
    return float((o - r).norm() / r.norm().clamp_min(1e-30))


def make_weights(cfg: ExpertsConfig, dtype: torch.dtype, device: str, seed: int = 0) -> dict:
    """Random weights scaled so that h and y are O(1)."""
    g = torch.Generator(device=device).manual_seed(seed)
    e, n1, h, i = cfg.num_experts, cfg.w13_rows, cfg.hidden_size, cfg.intermediate_size

    def rnd(*shape: int, scale: float) -> torch.Tensor:
        return (torch.randn(shape, generator=g, device=device, dtype=torch.float32) * scale).to(
            dtype
        )

    w = {
        "w13": rnd(e, n1, h, scale=h**-0.5),
        "w2": rnd(e, h, i, scale=i**-0.5),
        "w13_bias": None,
        "w2_bias": None,
    }
    if cfg.has_bias:
        w["w13_bias"] = rnd(e, n1, scale=0.2)
        w["w2_bias"] = rnd(e, h, scale=0.2)
    return w


def make_lora(
    cfg: ExpertsConfig,
    dtype: torch.dtype,
    device: str,
    *,
    num_slots: int = 4,
    max_rank: int = 12,
    ranks: tuple[int, ...] = (12, 5, 12),
    disabled: int = 3,
    seed: int = 1,
) -> MoELoRAAdapters:
    """Slots 0..len(ranks)-1 loaded (ranks below max_rank are padded); slot ``disabled``
    is loaded with non-zero weights and then disabled, so it must be ignored."""
    g = torch.Generator(device=device).manual_seed(seed)
    e, h, i, s = cfg.num_experts, cfg.hidden_size, cfg.intermediate_size, cfg.num_lora_slices
    ad = MoELoRAAdapters.allocate(
        num_slots=num_slots,
        num_experts=e,
        hidden_size=h,
        intermediate_size=i,
        max_rank=max_rank,
        num_slices=s,
        dtype=dtype,
        device=device,
    )

    def rnd(*shape: int, scale: float) -> torch.Tensor:
        return (torch.randn(shape, generator=g, device=device) * scale).to(dtype)

    for slot in range(num_slots):
        r = ranks[slot % len(ranks)]
        ad.set_adapter(
            slot,
            w13_a=[rnd(e, r, h, scale=h**-0.5) for _ in range(s)],
            w13_b=[rnd(e, i, r, scale=0.6 * r**-0.5) for _ in range(s)],
            w2_a=rnd(e, r, i, scale=i**-0.5),
            w2_b=rnd(e, h, r, scale=0.6 * r**-0.5),
            scaling=1.0,
        )
    ad.enabled[disabled] = 0
    return ad


def skewed_routing(
    t: int, e: int, k: int, device: str, seed: int = 2
) -> tuple[torch.Tensor, torch.Tensor]:
    """Every token's first slot is expert 1 (full: count == T), expert 0 gets nothing,
    the other slots are distinct random experts in 2..E-1."""
    g = torch.Generator().manual_seed(seed)
    rest = torch.stack([torch.randperm(e - 2, generator=g)[: k - 1] + 2 for _ in range(t)])
    ids = torch.cat([torch.ones(t, 1, dtype=torch.int64), rest], dim=1).to(torch.int32)
    w = torch.rand(t, k, generator=g)
    return ids.to(device), w.to(device)


FULL_SHAPES = {
    # name: (E, k, H, I, activation, gated)
    "nemotron3_nano": (128, 6, 2688, 1856, "relu2", False),
    "mixtral_8x7b": (8, 2, 4096, 14336, "silu", True),
}
