"""Inputs for checking and timing the experts: random weights, routings, LoRA adapters and
contexts, the dtypes a device can be checked in, the reference output and an error measure.

One place for what the kernel tests and the benchmarks both build. Imports torch (it is part
of the kernels extra); nothing in ``moe_policy`` imports this module.

Every builder is seeded: the same arguments give the same tensors on every run. Builders draw
on the CPU and move the result unless given a ``generator``, whose device they then draw on
(full model shapes take seconds to draw on the CPU).
"""

from __future__ import annotations

from typing import Any

import torch

from moe_policy.experts.base import ExpertsConfig
from moe_policy.experts.lora import MoELoRAAdapters, MoELoRAContext
from moe_policy.experts.reference import fused_moe_reference

#: Whether a CUDA device runs the kernels compiled (else Triton's interpreter runs them).
ON_GPU = torch.cuda.is_available()

#: Model shapes at full size: name -> (E, k, H, I, activation, gated). ``swiglustep_synthetic``
#: is no model's layer (none with swiglustep experts is among configs/models): a layer of that
#: size, to run the clamped activation at full shape.
FULL_SHAPES = {
    "nemotron3_nano": (128, 6, 2688, 1856, "relu2", False),
    "mixtral_8x7b": (8, 2, 4096, 14336, "silu", True),
    "swiglustep_synthetic": (64, 8, 2048, 1280, "swiglustep", True),
}

#: Routing kinds of :func:`make_routing`.
ROUTING_KINDS = ("uniform", "skewed", "subset")
#: Token -> adapter slot mappings of :func:`lora_mapping`.
MAPPING_KINDS = ("same", "round_robin", "some_none", "none")


def dtypes_for_device() -> list[torch.dtype]:
    """The dtypes the kernels are checked in here: bf16 only where ``tl.dot`` is trustworthy
    (a GPU); fp16 and fp32 under the interpreter, which gets bf16 dots wrong."""
    return [torch.bfloat16, torch.float16] if ON_GPU else [torch.float16, torch.float32]


def seeded(seed: int, device: torch.device | str = "cpu") -> torch.Generator:
    """A generator on ``device`` seeded with ``seed``."""
    return torch.Generator(device=device).manual_seed(seed)


def make_weights(
    cfg: ExpertsConfig,
    dtype: torch.dtype,
    device: torch.device | str,
    seed: int = 0,
    *,
    generator: torch.Generator | None = None,
) -> dict[str, torch.Tensor | None]:
    """Random common-layout weights (and biases when ``cfg.has_bias``, else None), scaled to
    keep ``h ~ N(0, 1)``; drawn on ``device`` (or on the generator's device)."""
    g = generator if generator is not None else seeded(seed, device)
    e, h, i, n1 = cfg.num_experts, cfg.hidden_size, cfg.intermediate_size, cfg.w13_rows

    def rnd(*shape: int, scale: float) -> torch.Tensor:
        return (torch.randn(shape, generator=g, device=g.device) * scale).to(dtype).to(device)

    w13, w2 = rnd(e, n1, h, scale=h**-0.5), rnd(e, h, i, scale=i**-0.5)
    b13 = rnd(e, n1, scale=0.2) if cfg.has_bias else None
    b2 = rnd(e, h, scale=0.2) if cfg.has_bias else None
    return {"w13": w13, "w2": w2, "w13_bias": b13, "w2_bias": b2}


def make_routing(
    t: int,
    e: int,
    k: int,
    device: torch.device | str,
    kind: str = "uniform",
    seed: int = 0,
    *,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(topk_weights fp32 [T, k] summing to 1 per token, topk_ids int32 [T, k]) with distinct
    experts per token: the top k of the softmax of random logits.

    kinds: ``uniform``, ``skewed`` (slot 0 of every token on expert 0), ``subset`` (only the
    first half of the experts is used; the rest get no tokens).
    """
    g = generator if generator is not None else seeded(seed)
    logits = torch.randn(t, e, generator=g, device=g.device)
    if kind == "skewed":
        logits[:, 0] = 100.0
    elif kind == "subset":
        logits[:, max(k, e // 2) :] = -100.0
    elif kind != "uniform":
        raise ValueError(f"unknown routing kind {kind!r}; expected one of {ROUTING_KINDS}")
    w, ids = torch.topk(logits.softmax(-1), k, dim=-1)
    w = w / w.sum(-1, keepdim=True)
    return w.float().to(device).contiguous(), ids.int().to(device).contiguous()


def skewed_routing(
    t: int, e: int, k: int, device: torch.device | str, seed: int = 2
) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids int32, weights) where every token's first slot is expert 1 (full: count == T),
    expert 0 gets nothing and the other slots are distinct random experts in 2..E-1."""
    g = seeded(seed)
    rest = torch.stack([torch.randperm(e - 2, generator=g)[: k - 1] + 2 for _ in range(t)])
    ids = torch.cat([torch.ones(t, 1, dtype=torch.int64), rest], dim=1).to(torch.int32)
    w = torch.rand(t, k, generator=g)
    return ids.to(device), w.to(device)


def make_x(
    t: int,
    h: int,
    dtype: torch.dtype,
    device: torch.device | str,
    seed: int = 1,
    *,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Activations [T, H] ~ N(0, 1)."""
    g = generator if generator is not None else seeded(seed)
    return torch.randn(t, h, generator=g, device=g.device).to(dtype).to(device)


def make_lora(
    cfg: ExpertsConfig,
    *,
    num_slots: int,
    max_rank: int,
    ranks: list[int],
    dtype: torch.dtype,
    device: torch.device | str,
    disabled: tuple[int, ...] = (),
    seed: int = 2,
    scaling: float = 2.0,
    generator: torch.Generator | None = None,
) -> MoELoRAAdapters:
    """Adapters in slots 0..len(ranks)-1 with the given ranks (padded to ``max_rank``), A and B
    scaled by their fan-in; slots in ``disabled`` keep their non-zero weights but are switched
    off, so they must be ignored."""
    g = generator if generator is not None else seeded(seed)
    e, h, i, s = cfg.num_experts, cfg.hidden_size, cfg.intermediate_size, cfg.num_lora_slices
    ad = MoELoRAAdapters.allocate(
        num_slots=num_slots, num_experts=e, hidden_size=h, intermediate_size=i,
        max_rank=max_rank, num_slices=s, dtype=dtype, device=device,
    )  # fmt: skip

    def rnd(*shape: int, fan: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=g, device=g.device) / fan**0.5).to(dtype).to(device)

    for slot, r in enumerate(ranks):
        ad.set_adapter(
            slot,
            w13_a=[rnd(e, r, h, fan=h) for _ in range(s)],
            w13_b=[rnd(e, i, r, fan=r) for _ in range(s)],
            w2_a=rnd(e, r, i, fan=i),
            w2_b=rnd(e, h, r, fan=r),
            scaling=scaling,
        )
    for slot in disabled:
        ad.enabled[slot] = 0
    return ad


def lora_mapping(t: int, kind: str, num_slots: int, device: torch.device | str) -> torch.Tensor:
    """Token -> slot int32 [T]: ``same`` (all 0), ``round_robin``, ``some_none`` (every third
    token -1, no adapter), ``none`` (all -1)."""
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
        raise ValueError(f"unknown mapping kind {kind!r}; expected one of {MAPPING_KINDS}")
    return m.to(device)


def lora_context(ad: MoELoRAAdapters, mapping: torch.Tensor) -> MoELoRAContext:
    """The LoRA context of one call: the adapters and the token -> slot mapping."""
    return MoELoRAContext(ad, mapping)


def lora_in(ctx: MoELoRAContext, dtype: torch.dtype) -> MoELoRAContext:
    """The same context with the adapter weights cast to ``dtype`` (a float64 reference)."""
    ad = ctx.adapters
    cast = type(ad)(
        ad.w13_a.to(dtype), ad.w13_b.to(dtype), ad.w2_a.to(dtype), ad.w2_b.to(dtype), ad.enabled
    )
    return MoELoRAContext(cast, ctx.token_lora_mapping)


def reference_output(
    cfg: ExpertsConfig,
    weights: dict[str, Any],
    x: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    lora: MoELoRAContext | None = None,
    *,
    dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """The torch reference of ``cfg``'s layer on common-layout ``weights``; with ``dtype``
    (float64 for an exact oracle) the inputs, weights and adapters are cast to it first."""

    def cast(t: torch.Tensor | None) -> torch.Tensor | None:
        return t if t is None or dtype is None else t.to(dtype)

    return fused_moe_reference(
        cast(x), cast(weights["w13"]), cast(weights["w2"]), cast(topk_weights), topk_ids,
        activation=cfg.activation, gated=cfg.gated, w13_bias=cast(weights.get("w13_bias")),
        w2_bias=cast(weights.get("w2_bias")),
        apply_router_weight_on_input=cfg.apply_router_weight_on_input,
        lora=lora if lora is None or dtype is None else lora_in(lora, dtype),
        swiglu_alpha=cfg.swiglu_alpha, swiglu_limit=cfg.swiglu_limit,
    )  # fmt: skip


def swiglustep_float64(
    weights: dict[str, Any],
    x: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    limit: float,
) -> torch.Tensor:
    """A ``swiglustep`` MoE layer in float64, written out apart from the reference (no LoRA,
    router weight on the output): per (token, slot) pair with ``e >= 0``, ``[g; u] = W13[e] x
    + b13[e]``, ``a = min(g / (1 + exp(-g)), limit) * min(max(u, -limit), limit)``, and
    ``out[t] += w * (W2[e] a + b2[e])``. Gathers ``[T, k, 2I, H]``: tiny shapes only."""
    ids = topk_ids.long()
    e = ids.clamp_min(0)
    keep = (ids >= 0).double()[..., None] * topk_weights.double()[..., None]
    h = torch.einsum("tknh,th->tkn", weights["w13"].double()[e], x.double())
    if weights.get("w13_bias") is not None:
        h = h + weights["w13_bias"].double()[e]
    g, u = h.chunk(2, dim=-1)
    lim = torch.tensor(limit, dtype=torch.float64, device=h.device)
    a = torch.minimum(g / (1.0 + torch.exp(-g)), lim) * torch.minimum(torch.maximum(u, -lim), lim)
    y = torch.einsum("tkhi,tki->tkh", weights["w2"].double()[e], a)
    if weights.get("w2_bias") is not None:
        y = y + weights["w2_bias"].double()[e]
    return (keep * y).sum(dim=1)


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    """``||out - ref|| / ||ref||`` in float64; NaN or inf anywhere in ``out`` gives inf."""
    o, r = out.double(), ref.double()
    if not torch.isfinite(o).all():
        return float("inf")
    return float((o - r).norm() / r.norm().clamp_min(1e-30))


def cpu_grouped_mm_works() -> bool:
    """Whether this torch runs ``grouped_mm`` on CPU tensors (the grouped-GEMM backend's tests
    run there only then)."""
    from moe_policy.experts.grouped_mm import grouped_mm_fn

    gmm = grouped_mm_fn()
    if gmm is None:
        return False
    try:
        gmm(torch.ones(4, 8), torch.ones(2, 8, 8), offs=torch.tensor([2, 4], dtype=torch.int32))
    except (RuntimeError, NotImplementedError):
        return False
    return True
