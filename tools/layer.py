"""One Triton MoE layer of a benchmark shape for the tuning tools: built once per shape, called
with any config, and a worker that compiles configs into Triton's on-disk cache (GPU)."""

from __future__ import annotations

from typing import Any

from benchmarks.common import (
    SHAPES,
    MoEShape,
    experts_config,
    lora_contexts,
    routing_sets,
    shape_adapters,
    shape_weights,
)
from moe_policy.experts.triton.config import MoEConfig
from moe_policy.experts.triton.tuning.inputs import call_layer

_STATE: dict[str, Any] = {}


def layer(shape: MoEShape) -> Any:
    """The :class:`TritonExperts` of ``shape`` (random bf16 weights on the GPU); the last
    shape's layer is kept, so that a tool that walks one shape after another builds each once."""
    from moe_policy.experts.triton.fused_moe import TritonExperts

    if _STATE.get("name") != shape.name:
        import torch

        _STATE.clear()
        torch.cuda.empty_cache()
        w = shape_weights(shape)
        backend = TritonExperts(experts_config(shape), w["w13"], w["w2"], w["w13_bias"],
                                w["w2_bias"])  # fmt: skip
        _STATE.update(name=shape.name, backend=backend)
    return _STATE["backend"]


def layer_lora(shape: MoEShape, t: int, n: int) -> list[Any]:
    """``n`` LoRA contexts of the benchmark adapters for ``shape`` at ``t`` tokens."""
    return lora_contexts(shape_adapters(shape), t, n)


def compile_configs(task: tuple[str, int, list[dict[str, Any]], bool]) -> int:
    """Worker process: run each config of ``(shape name, tokens, config dicts, with LoRA)`` once,
    so that it lands in Triton's on-disk cache; returns how many failed."""
    import torch

    name, t, cfgs, lora = task
    shape = SHAPES[name]
    backend = layer(shape)
    x, tw, ti = routing_sets(shape, t, 1)[0]
    ctx = layer_lora(shape, t, 1)[0] if lora else None
    bad = 0
    for d in cfgs:
        try:
            call_layer(backend, MoEConfig.from_dict(d), x, tw, ti, lora=ctx)
        except Exception:
            bad += 1
    torch.cuda.synchronize()
    return bad
