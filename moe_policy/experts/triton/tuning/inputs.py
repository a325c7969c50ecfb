"""Random inputs of one layer shape on the GPU (weights, LoRA adapters, routing) and one layer
call with a given tile config: what the tuner and the benchmarks time."""

from __future__ import annotations

from typing import Any

from moe_policy.experts.triton.tuning.shapes import MoEShape, experts_config

#: LoRA of the benchmarks and tools: 4 adapter slots of rank 16, tokens round-robin over them.
LORA_SLOTS, LORA_RANK = 4, 16


def shape_weights(
    shape: MoEShape, device: str = "cuda", seed: int = 0, dtype: Any = None
) -> dict[str, Any]:
    """Random weights of ``shape`` (``dtype``, default bf16) in the common layout (biases where
    it has them), drawn on ``device``."""
    import torch

    from moe_policy.experts.testing import make_weights, seeded

    return make_weights(experts_config(shape), dtype or torch.bfloat16, device,
                        generator=seeded(seed, device))  # fmt: skip


def shape_adapters(shape: MoEShape, device: str = "cuda", seed: int = 1, dtype: Any = None) -> Any:
    """``LORA_SLOTS`` random adapters (``dtype``, default bf16) of rank ``LORA_RANK`` for
    ``shape`` (scaling 1)."""
    import torch

    from moe_policy.experts.testing import make_lora, seeded

    return make_lora(experts_config(shape), num_slots=LORA_SLOTS, max_rank=LORA_RANK,
                     ranks=[LORA_RANK] * LORA_SLOTS, dtype=dtype or torch.bfloat16, device=device,
                     scaling=1.0, generator=seeded(seed, device))  # fmt: skip


def routing_sets(
    shape: MoEShape,
    t: int,
    n: int,
    device: str = "cuda",
    seed: int = 0,
    dtype: Any = None,
    num_experts: int | None = None,
) -> list[tuple[Any, Any, Any]]:
    """``n`` inputs of one layer call at ``t`` tokens: (x [t, H] in ``dtype``, default bf16,
    topk_weights, topk_ids) with uniform routing over ``num_experts`` (default the shape's),
    each set its own (so that consecutive calls touch different experts)."""
    import torch

    from moe_policy.experts.testing import make_routing, make_x, seeded

    g = seeded(seed + t, device)
    e = num_experts or shape.num_experts
    sets = []
    for _ in range(n):
        x = make_x(t, shape.hidden, dtype or torch.bfloat16, device, generator=g)
        tw, ti = make_routing(t, e, shape.top_k, device, generator=g)
        sets.append((x, tw, ti))
    return sets


def lora_contexts(adapters: Any, t: int, n: int, device: str = "cuda") -> list[Any]:
    """``n`` LoRA contexts of ``adapters`` for ``t`` tokens, round-robin over the slots."""
    from moe_policy.experts.testing import lora_context, lora_mapping

    mapping = lora_mapping(t, "round_robin", LORA_SLOTS, device)
    return [lora_context(adapters, mapping) for _ in range(n)]


def call_layer(backend: Any, cfg: Any, x: Any, tw: Any, ti: Any, lora: Any = None) -> Any:
    """One layer call of ``backend`` (a ``TritonExperts``) with the tile config ``cfg``
    (a ``MoEConfig``) instead of the shipped one."""
    from moe_policy.experts.triton.fused_moe import fused_moe_triton

    c, w = backend.config, backend.weights
    return fused_moe_triton(
        x, w["w13"], w["w2"], tw, ti, activation=c.activation, gated=c.gated,
        w13_bias=w["w13_bias"], w2_bias=w["w2_bias"], config=cfg, lora=lora,
    )  # fmt: skip
