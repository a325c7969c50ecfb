"""The experts interface every fused-MoE backend implementation provides.

Common weight layout (as checkpoints and vLLM hold it):

* ``w13``: ``[E, 2I, H]`` for gated activations, gate rows ``0..I-1`` then up rows
  ``I..2I-1`` (``swiglustep`` too; ``swigluoai`` interleaves them instead: even rows gate,
  odd rows up);
  ``[E, I, H]`` for non-gated activations.
* ``w2``: ``[E, H, I]``.
* optional biases ``w13_bias`` ``[E, N1]`` and ``w2_bias`` ``[E, H]``.

Each backend converts this layout to its own with a pure ``convert_weights``
(new tensors, the inputs and the config untouched) and computes, per token ``t``::

    out[t] = sum_k w[t,k] * W2[e](act(W13[e] x[t] + dLoRA13)) + w[t,k] * dLoRA2

with ``e = topk_ids[t, k]`` and ``w = topk_weights``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    import torch

    from moe_policy.experts.lora import MoELoRAContext

#: Activations applied as ``act(gate) * up`` on a ``[gate; up]`` w13 output. Two clamp at
#: ``swiglu_limit``: ``swigluoai`` (gpt-oss; interleaved w13, see above) and ``swiglustep``
#: (``min(silu(gate), limit) * clamp(up, -limit, limit)``, Step-3.5's experts).
GATED_ACTIVATIONS = frozenset({"silu", "gelu", "gelu_tanh", "swigluoai", "swiglustep"})
#: Activations applied elementwise on a single ``[I]`` w13 output.
NON_GATED_ACTIVATIONS = frozenset({"silu", "gelu", "gelu_tanh", "relu2"})


@dataclass(frozen=True)
class ExpertsConfig:
    """Shape and math of one MoE layer's routed experts (per partition)."""

    num_experts: int
    hidden_size: int
    intermediate_size: int
    top_k: int
    activation: str = "silu"
    gated: bool = True
    has_bias: bool = False
    apply_router_weight_on_input: bool = False
    #: ``swigluoai``'s sigmoid scale; ``swiglu_limit``: the clamp of ``swigluoai`` and
    #: ``swiglustep`` (vLLM's fused MoE runs both at 7.0).
    swiglu_alpha: float = 1.702
    swiglu_limit: float = 7.0

    def __post_init__(self) -> None:
        allowed = GATED_ACTIVATIONS if self.gated else NON_GATED_ACTIVATIONS
        if self.activation not in allowed:
            kind = "gated" if self.gated else "non-gated"
            raise ValueError(
                f"activation {self.activation!r} is not a {kind} activation; "
                f"expected one of {sorted(allowed)}"
            )
        for name in ("num_experts", "hidden_size", "intermediate_size", "top_k"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.top_k > self.num_experts:
            raise ValueError(f"top_k={self.top_k} exceeds num_experts={self.num_experts}")

    @property
    def w13_rows(self) -> int:
        """Rows of w13 per expert: 2I gated, I non-gated."""
        return 2 * self.intermediate_size if self.gated else self.intermediate_size

    @property
    def num_lora_slices(self) -> int:
        """LoRA slices on w13: gate and up when gated, one otherwise."""
        return 2 if self.gated else 1


def check_common_layout(
    config: ExpertsConfig,
    w13: torch.Tensor,
    w2: torch.Tensor,
    w13_bias: torch.Tensor | None = None,
    w2_bias: torch.Tensor | None = None,
) -> None:
    """ValueError naming what arrived when the weights are not ``config``'s common layout."""
    e, n1, h, i = config.num_experts, config.w13_rows, config.hidden_size, config.intermediate_size
    if tuple(w13.shape) != (e, n1, h) or tuple(w2.shape) != (e, h, i):
        raise ValueError(
            f"expected w13 {(e, n1, h)} and w2 {(e, h, i)}: weights w13 {tuple(w13.shape)}, "
            f"w2 {tuple(w2.shape)} do not match the config {config}"
        )
    if config.has_bias and (w13_bias is None or w2_bias is None):
        raise ValueError(f"has_bias=True needs w13_bias [{e}, {n1}] and w2_bias [{e}, {h}]")
    check_bias_shapes(e, n1, h, w13_bias, w2_bias)


def check_bias_shapes(
    e: int, n1: int, h: int, w13_bias: torch.Tensor | None, w2_bias: torch.Tensor | None
) -> None:
    """ValueError unless each bias given is [E, N1] (w13) or [E, H] (w2)."""
    for name, bias, shape in (("w13_bias", w13_bias, (e, n1)), ("w2_bias", w2_bias, (e, h))):
        if bias is not None and tuple(bias.shape) != shape:
            raise ValueError(f"expected {name} {shape}, got {tuple(bias.shape)}")


def check_devices(x: torch.Tensor, **tensors: torch.Tensor | None) -> None:
    """ValueError naming each of ``tensors`` (None skipped) that is not on ``x``'s device."""
    off = [
        f"{n} on {t.device}" for n, t in tensors.items() if t is not None and t.device != x.device
    ]
    if off:
        raise ValueError(f"all tensors must be on x's device {x.device}; got {', '.join(off)}")


def contiguous_layout(
    w13: torch.Tensor,
    w2: torch.Tensor,
    w13_bias: torch.Tensor | None = None,
    w2_bias: torch.Tensor | None = None,
) -> dict[str, Any]:
    """The weights as contiguous tensors (no copy when they already are)."""
    return {
        "w13": w13.contiguous(),
        "w2": w2.contiguous(),
        "w13_bias": None if w13_bias is None else w13_bias.contiguous(),
        "w2_bias": None if w2_bias is None else w2_bias.contiguous(),
    }


class FusedMoEExperts(ABC):
    """A backend's experts computation in the standard ``[T, H]`` activation format."""

    #: Catalog name of the backend this class implements (``configs/backends.yaml``).
    backend: ClassVar[str]
    #: ``standard`` ([T, H] tokens) or ``batched`` ([E, max_tokens, H]).
    activation_format: ClassVar[str] = "standard"
    #: Whether ``apply`` accepts a LoRA context.
    supports_lora: ClassVar[bool] = False
    #: Activations the class runs, gated and non-gated (its catalog entry's ``activations``
    #: list the same; ``tests/kernels/test_catalog_matches_kernels.py`` checks it). Subsets
    #: of ``GATED_ACTIVATIONS`` / ``NON_GATED_ACTIVATIONS``; ``__init__`` refuses the others.
    gated_activations: ClassVar[frozenset[str]] = GATED_ACTIVATIONS
    non_gated_activations: ClassVar[frozenset[str]] = NON_GATED_ACTIVATIONS

    @classmethod
    def supports(cls, ctx: Mapping[str, Any]) -> tuple[bool, str | None]:
        """Extra feasibility check beyond the catalog; ``ctx`` maps context keys to values."""
        return True, None

    @classmethod
    def runs_activation(cls, config: ExpertsConfig) -> tuple[bool, str | None]:
        """Whether this class runs ``config``'s activation (with its gating); reason when not."""
        allowed = cls.gated_activations if config.gated else cls.non_gated_activations
        if config.activation in allowed:
            return True, None
        kind = "gated" if config.gated else "non-gated"
        return False, (
            f"{cls.__name__} does not run {kind} activation "
            f"{config.activation!r}; it runs {sorted(allowed)}"
        )

    @classmethod
    def is_available(cls) -> tuple[bool, str | None]:
        """Whether this process can run the class (packages, device); reason when not."""
        return True, None

    def __init__(
        self,
        config: ExpertsConfig,
        w13: torch.Tensor,
        w2: torch.Tensor,
        w13_bias: torch.Tensor | None = None,
        w2_bias: torch.Tensor | None = None,
    ) -> None:
        ok, reason = self.runs_activation(config)
        if not ok:
            raise ValueError(reason)
        self.config = config
        self.weights = self.convert_weights(config, w13, w2, w13_bias, w2_bias)

    @staticmethod
    def convert_weights(
        config: ExpertsConfig,
        w13: torch.Tensor,
        w2: torch.Tensor,
        w13_bias: torch.Tensor | None = None,
        w2_bias: torch.Tensor | None = None,
    ) -> dict[str, Any]:
        """Common layout -> this backend's layout; pure (never mutates inputs or config).

        The default checks the common layout and keeps it, contiguous (no copy when it
        already is); backends with their own layout override it."""
        check_common_layout(config, w13, w2, w13_bias, w2_bias)
        return contiguous_layout(w13, w2, w13_bias, w2_bias)

    @abstractmethod
    def apply(
        self,
        x: torch.Tensor,
        topk_weights: torch.Tensor,
        topk_ids: torch.Tensor,
        lora: MoELoRAContext | None = None,
    ) -> torch.Tensor:
        """Run the routed experts on ``x`` [T, H]; returns [T, H] in ``x.dtype``."""
