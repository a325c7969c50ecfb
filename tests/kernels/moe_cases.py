"""Builders shared by the kernel tests: weights, routings, LoRA adapters, error measure."""

from __future__ import annotations

from collections.abc import Callable

import torch

from moe_policy.experts.base import ExpertsConfig
from moe_policy.experts.lora import MoELoRAAdapters, MoELoRAContext

ON_GPU = torch.cuda.is_available()


def dtypes_for_device() -> list[torch.dtype]:
    """bf16 only where tl.dot is trustworthy (the GPU); fp16/fp32 under the interpreter."""
    return [torch.bfloat16, torch.float16] if ON_GPU else [torch.float16, torch.float32]


def make_weights(
    cfg: ExpertsConfig, dtype: torch.dtype, device: str, seed: int = 0
) -> dict[str, torch.Tensor | None]:
    """Random common-layout weights (and biases when cfg.has_bias), scaled to keep h ~ N(0, 1);
    drawn on ``device`` (full GPU shapes would take seconds on the CPU)."""
    g = torch.Generator(device=device).manual_seed(seed)
    e, h, i, n1 = cfg.num_experts, cfg.hidden_size, cfg.intermediate_size, cfg.w13_rows

    def rnd(*shape: int, scale: float) -> torch.Tensor:
        return (torch.randn(shape, generator=g, device=device) * scale).to(dtype)

    w13, w2 = rnd(e, n1, h, scale=h**-0.5), rnd(e, h, i, scale=i**-0.5)
    b13 = rnd(e, n1, scale=0.2) if cfg.has_bias else None
    b2 = rnd(e, h, scale=0.2) if cfg.has_bias else None
    return {"w13": w13, "w2": w2, "w13_bias": b13, "w2_bias": b2}


def make_routing(
    t: int, e: int, k: int, device: str, kind: str = "uniform", seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """(topk_weights fp32 [T, k], topk_ids int32 [T, k]) with distinct experts per token.

    kinds: ``uniform`` (top-k of random logits), ``skewed`` (slot 0 of every token on expert 0),
    ``subset`` (only the first half of the experts is used; the rest get no tokens).
    """
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(t, e, generator=g)
    if kind == "skewed":
        logits[:, 0] = 100.0
    elif kind == "subset":
        logits[:, max(k, e // 2) :] = -100.0
    elif kind != "uniform":
        raise ValueError(f"unknown routing kind {kind!r}")
    probs = logits.softmax(-1)
    w, ids = torch.topk(probs, k, dim=-1)
    w = w / w.sum(-1, keepdim=True)
    return w.float().to(device), ids.int().to(device)


def make_x(t: int, h: int, dtype: torch.dtype, device: str, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(t, h, generator=g).to(dtype).to(device)


def make_lora(
    cfg: ExpertsConfig,
    *,
    num_slots: int,
    max_rank: int,
    ranks: list[int],
    dtype: torch.dtype,
    device: str,
    disabled: tuple[int, ...] = (),
    seed: int = 2,
) -> MoELoRAAdapters:
    """Adapters in slots 0..len(ranks)-1 with the given ranks (padded to max_rank); slots in
    ``disabled`` keep their non-zero weights but are switched off, so they must be ignored."""
    g = torch.Generator().manual_seed(seed)
    e, h, i, s = cfg.num_experts, cfg.hidden_size, cfg.intermediate_size, cfg.num_lora_slices
    ad = MoELoRAAdapters.allocate(
        num_slots=num_slots, num_experts=e, hidden_size=h, intermediate_size=i,
        max_rank=max_rank, num_slices=s, dtype=dtype, device=device,
    )  # fmt: skip
    for slot, r in enumerate(ranks):
        rnd = lambda *shape, fan: (torch.randn(*shape, generator=g) / fan**0.5).to(dtype).to(device)  # noqa: E731
        ad.set_adapter(
            slot,
            w13_a=[rnd(e, r, h, fan=h) for _ in range(s)],
            w13_b=[rnd(e, i, r, fan=r) for _ in range(s)],
            w2_a=rnd(e, r, i, fan=i),
            w2_b=rnd(e, h, r, fan=r),
            scaling=2.0,
        )
    for slot in disabled:
        ad.enabled[slot] = 0
    return ad


def lora_mapping(t: int, kind: str, num_slots: int, device: str) -> torch.Tensor:
    """Token -> slot: ``same`` (all 0), ``round_robin``, ``some_none`` (every third -1), ``none``."""
    idx = torch.arange(t)
    if kind == "same":
        m = torch.zeros(t, dtype=torch.int32)
    elif kind == "round_robin":
        m = (idx % num_slots).int()
    elif kind == "some_none":
        m = torch.where(idx % 3 == 0, -1, idx % num_slots).int()
    elif kind == "none":
        m = torch.full((t,), -1, dtype=torch.int32)
    else:
        raise ValueError(f"unknown mapping kind {kind!r}")
    return m.to(device)


def lora_context(ad: MoELoRAAdapters, mapping: torch.Tensor) -> MoELoRAContext:
    return MoELoRAContext(ad, mapping)


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| in float64; NaN anywhere gives inf."""
    o, r = out.double(), ref.double()
    if not torch.isfinite(o).all():
        return float("inf")
    return float((o - r).norm() / r.norm().clamp_min(1e-30))


def skewed_routing(
    t: int, e: int, k: int, device: str, seed: int = 2
) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids int32, weights) where every token's first slot is expert 1 (full: count == T),
    expert 0 gets nothing and the other slots are distinct random experts in 2..E-1."""
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


def record_launches(
    monkeypatch, module, attr: str, *, log: list | None = None,
    rewrite: Callable[[dict], dict] | None = None,
) -> list[tuple[str, dict]]:  # fmt: skip
    """Replace the Triton kernel ``module.attr`` by a recorder for this test: each launch
    appends ``(attr, kwargs)`` to ``log`` (a new list when None, returned; the launch grid is
    kwargs ``"_grid"``) and runs the kernel, with its keyword arguments passed through
    ``rewrite`` when given."""
    launches: list[tuple[str, dict]] = [] if log is None else log
    kernel = getattr(module, attr)

    class Recorder:
        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                launches.append((attr, {**kwargs, "_grid": grid}))
                return kernel[grid](*args, **(rewrite(kwargs) if rewrite else kwargs))

            return launch

    monkeypatch.setattr(module, attr, Recorder())
    return launches
