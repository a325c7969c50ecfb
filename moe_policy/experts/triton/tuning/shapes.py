"""One routed-experts layer as the tuner and the benchmarks see it, and its lower bound (``reference/moe-kernels.md`` §6), bf16 (2 bytes)::

D      = E * (1 - (1 - k/E)^T)                 expected distinct experts (uniform routing)
bytes  = D * bytes_per_expert + 2 * T * H * 2  (weights once, x in, out once)
flops  = 2 * T * k * (H * N1 + I * H)          N1 = 2I gated, I non-gated
bound  = max(bytes / copy_bandwidth, flops / matmul_rate)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: Activations the Triton kernels run, and whether each must be gated (None: either).
KERNEL_ACTIVATIONS = {"silu": None, "gelu": None, "gelu_tanh": None, "relu2": False,
                      "swigluoai": True, "swiglustep": True}  # fmt: skip


@dataclass(frozen=True)
class MoEShape:
    """One routed-experts layer."""

    name: str
    num_experts: int
    hidden: int
    inter: int
    top_k: int
    gated: bool
    activation: str
    has_bias: bool = False

    @property
    def n1(self) -> int:
        return 2 * self.inter if self.gated else self.inter

    @property
    def bytes_per_expert(self) -> int:
        return (self.n1 * self.hidden + self.hidden * self.inter) * 2


def expected_experts(shape: MoEShape, t: int) -> float:
    """Expected distinct experts touched by t tokens under uniform top-k routing."""
    e, k = shape.num_experts, shape.top_k
    return e * (1.0 - (1.0 - k / e) ** t)


def layer_bytes(shape: MoEShape, t: int) -> float:
    """Fewest HBM bytes of one layer call: touched weights once, x and out once."""
    return expected_experts(shape, t) * shape.bytes_per_expert + 2 * t * shape.hidden * 2


def layer_flops(shape: MoEShape, t: int) -> float:
    """Matmul FLOPs of one layer call (both GEMMs, all routed pairs)."""
    return 2.0 * t * shape.top_k * (shape.hidden * shape.n1 + shape.inter * shape.hidden)


#: Fixed ceilings (H200: copy TB/s, bf16 matmul TFLOP/s) of the bound ratios the docs report,
#: so that runs with their own measured ceilings compare.
FIXED_COPY_TBPS, FIXED_MATMUL_TFLOPS = 4.29, 781.0


def lower_bound_us(shape: MoEShape, t: int, copy_tbps: float, matmul_tflops: float) -> float:
    """max(memory time, compute time) in microseconds."""
    t_mem = layer_bytes(shape, t) / (copy_tbps * 1e12)
    t_cmp = layer_flops(shape, t) / (matmul_tflops * 1e12)
    return max(t_mem, t_cmp) * 1e6


def experts_config(shape: MoEShape) -> Any:
    """The :class:`~moe_policy.experts.base.ExpertsConfig` of one benchmark shape."""
    from moe_policy.experts.base import ExpertsConfig

    return ExpertsConfig(shape.num_experts, shape.hidden, shape.inter, shape.top_k,
                         shape.activation, shape.gated, shape.has_bias)  # fmt: skip
