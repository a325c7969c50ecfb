"""Triton helpers shared by the fused and the batched kernels: the activation codes, the
router-weight positions and the activation itself."""

from __future__ import annotations

import triton
import triton.language as tl

from moe_policy.experts.base import GATED_ACTIVATIONS, NON_GATED_ACTIVATIONS

#: Activation codes of the kernels' ``ACT`` constexpr (0 = none: GEMM 2).
ACT_NONE = 0
ACTIVATION_CODES = {"silu": 1, "gelu": 2, "gelu_tanh": 3, "relu2": 4, "swigluoai": 5,
                    "swiglustep": 6}  # fmt: skip
#: What the kernels run, per gating: the activations of ``ACTIVATION_CODES`` that are gated
#: (``[gate; up]`` or, for ``swigluoai``, interleaved w13 rows) or non-gated.
KERNEL_GATED_ACTIVATIONS = frozenset(a for a in ACTIVATION_CODES if a in GATED_ACTIVATIONS)
KERNEL_NON_GATED_ACTIVATIONS = frozenset(a for a in ACTIVATION_CODES if a in NON_GATED_ACTIVATIONS)
#: Router-weight positions of the kernels' ``WEIGHT_POS`` constexpr: not applied, before the
#: bias (the weight on the input), after it (on the output).
WEIGHT_NONE, WEIGHT_INPUT, WEIGHT_OUTPUT = 0, 1, 2


@triton.jit
def activation(g, u, alpha, limit, ACT: tl.constexpr, GATED: tl.constexpr):
    """``act(g) * u`` gated, ``act(g)`` non-gated, in fp32 (``ACT`` from ``ACTIVATION_CODES``).

    ``swigluoai`` is gpt-oss's clamped variant, ``(clamp(u, +-limit) + 1) * g' * sigmoid(alpha
    * g')`` with ``g' = min(g, limit)``; ``swiglustep`` clamps after the SiLU instead,
    ``min(silu(g), limit) * clamp(u, +-limit)`` (gated only). ``alpha`` and ``limit`` may be
    constexprs or runtime scalars."""
    if ACT == 5:
        g = tl.minimum(g, limit)
        u = tl.minimum(tl.maximum(u, -limit), limit)
        out = (u + 1.0) * g * tl.sigmoid(alpha * g)
    elif ACT == 6:
        s = tl.minimum(g * tl.sigmoid(g), limit)
        out = s * tl.minimum(tl.maximum(u, -limit), limit)
    else:
        if ACT == 1:
            y = g * tl.sigmoid(g)
        elif ACT == 2:
            y = 0.5 * g * (1.0 + tl.math.erf(g * 0.7071067811865476))
        elif ACT == 3:
            inner = 0.7978845608028654 * (g + 0.044715 * g * g * g)
            y = g * tl.sigmoid(2.0 * inner)  # 0.5 * (1 + tanh(z)) == sigmoid(2 z)
        elif ACT == 4:
            r = tl.maximum(g, 0.0)
            y = r * r
        else:
            y = g
        if GATED:  # noqa: SIM108 (a constexpr branch: only one side is compiled)
            out = y * u
        else:
            out = y
    return out
