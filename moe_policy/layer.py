"""MoELayer: asks the policy once, converts the weights for the chosen backend, runs it.

Config -> decision -> kernel -> output in one module::

    layer = MoELayer.build("configs/models/nemotron-3-nano-30b-a3b.json", w13, w2, lora=True,
                           max_loras=4, max_lora_rank=16)
    layer.load_adapter(0, w13_a=[...], w13_b=[...], w2_a=..., w2_b=...)
    out = layer(x, topk_weights, topk_ids, token_lora_mapping)
    layer.decision.to_dict()   # why this backend

Routing (router GEMM, top-k) stays with the engine. Under a batched activation
format (``parallel.all2all: deepep_low_latency``) the layer emulates the
dispatch/combine of a single rank around the batched experts, so the same call
works in both formats; a real deployment's all2all replaces that emulation.
Importing this module imports torch (the policy path never does).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, cast

import torch

from moe_policy.api import Selector, explicit_entries
from moe_policy.core.decision import Decision
from moe_policy.core.origin import Origin
from moe_policy.errors import MoEPolicyError
from moe_policy.experts.base import ExpertsConfig, FusedMoEExperts
from moe_policy.experts.lora import MoELoRAAdapters, MoELoRAContext


class BackendNotImplementedError(MoEPolicyError, RuntimeError):
    """The policy decided a backend that this process cannot run."""


#: ``model.dtype`` -> the torch dtype the layer's weights must have.
_TORCH_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def check_weights_match_context(
    config: ExpertsConfig,
    model_dtype: str | None,
    w13: torch.Tensor,
    w13_bias: torch.Tensor | None,
    w2_bias: torch.Tensor | None,
) -> None:
    """ValueError unless the weights are what the decision was made for: biases exactly
    when ``model.has_bias`` (a backend may not pass biases, or drop missing ones), and the
    ``model.dtype`` the backend was chosen for."""
    given = [n for n, b in (("w13_bias", w13_bias), ("w2_bias", w2_bias)) if b is not None]
    if config.has_bias and len(given) != 2:
        raise ValueError(
            f"the model has expert biases (model.has_bias true): pass both w13_bias and "
            f"w2_bias; got {', '.join(given) or 'neither'}"
        )
    if not config.has_bias and given:
        raise ValueError(
            f"{' and '.join(given)} given, but the decision was made for a model without "
            "expert biases (model.has_bias false; set it to build a layer with biases)"
        )
    want = _TORCH_DTYPES.get(str(model_dtype)) if model_dtype is not None else None
    if want is not None and w13.dtype != want:
        raise ValueError(
            f"weights are {w13.dtype} but the decision was made for model.dtype {model_dtype} "
            f"({want}): pass dtype= to match the weights, or convert them"
        )


def experts_config(selector: Selector) -> ExpertsConfig:
    """The experts' shape and math on this rank, from the decision's context."""
    v = selector.context.values
    return ExpertsConfig(
        num_experts=int(v["model.local_experts"]),
        hidden_size=int(v["model.hidden_size"]),
        intermediate_size=int(v["model.intermediate_size_per_partition"]),
        top_k=int(v["model.top_k"]),
        activation=str(v["model.activation"]),
        gated=bool(v["model.gated"]),
        has_bias=bool(v.get("model.has_bias")),
        apply_router_weight_on_input=bool(v.get("model.router_weight_on_input")),
    )


class MoELayer(torch.nn.Module):
    """The routed experts of one MoE layer, on the backend the policy chose."""

    def __init__(
        self,
        selector: Selector,
        w13: torch.Tensor,
        w2: torch.Tensor,
        w13_bias: torch.Tensor | None = None,
        w2_bias: torch.Tensor | None = None,
        *,
        layer_index: int | None = None,
        layer_kind: str | None = None,
    ) -> None:
        super().__init__()
        self.selector = selector
        self.decision: Decision = selector.select(layer_index, layer_kind)
        self.config = experts_config(selector)
        backend = self.decision.backend
        assert backend is not None  # select() raised otherwise
        try:
            experts_cls = cast(type[FusedMoEExperts], selector.catalog.load_experts_class(backend))
        except LookupError as exc:
            engine = selector.engine.name
            for_engine = "" if engine == "moe_policy" else f" for engine {engine!r}"
            raise BackendNotImplementedError(
                f"the policy chose {backend!r} ({self.decision.experts_class}){for_engine}, "
                f"which has no implementation in this process: {exc}"
            ) from None
        ok, why = experts_cls.is_available()
        if not ok:
            raise BackendNotImplementedError(
                f"the policy chose {backend!r}, which cannot run here: {why}"
            )
        check_weights_match_context(
            self.config, selector.context.values.get("model.dtype"), w13, w13_bias, w2_bias
        )
        self.experts: FusedMoEExperts = experts_cls(self.config, w13, w2, w13_bias, w2_bias)
        self.batched = self.decision.activation_format == "batched"
        ctx = selector.context.values
        self.lora: MoELoRAAdapters | None = None
        if ctx.get("lora.enabled"):
            if not experts_cls.supports_lora:
                raise BackendNotImplementedError(
                    f"{backend!r} was chosen with LoRA on but its class cannot apply LoRA"
                )
            self.lora = MoELoRAAdapters.allocate(
                num_slots=int(ctx.get("lora.max_loras") or 1),
                num_experts=self.config.num_experts,
                hidden_size=self.config.hidden_size,
                intermediate_size=self.config.intermediate_size,
                max_rank=int(ctx.get("lora.max_rank") or 16),
                num_slices=self.config.num_lora_slices,
                dtype=w13.dtype,
                device=w13.device,
            )

    @classmethod
    def build(
        cls,
        model: Any,
        w13: torch.Tensor,
        w2: torch.Tensor,
        w13_bias: torch.Tensor | None = None,
        w2_bias: torch.Tensor | None = None,
        *,
        policy_files: Sequence[str] | None = None,
        environ: Mapping[str, str] | None = None,
        overrides: Mapping[str, Any] | None = None,
        layer_index: int | None = None,
        layer_kind: str | None = None,
        **deployment: Any,
    ) -> MoELayer:
        """A layer with its own Selector; ``deployment`` takes select_backend's keywords."""
        selector = Selector(
            model,
            policy_files=policy_files,
            environ=environ,
            explicit=explicit_entries(deployment, overrides, Origin.api()),
        )
        return cls(
            selector, w13, w2, w13_bias, w2_bias, layer_index=layer_index, layer_kind=layer_kind
        )

    def load_adapter(self, slot: int, **weights: Any) -> None:
        """Load one adapter into a slot (see ``MoELoRAAdapters.set_adapter``)."""
        if self.lora is None:
            raise MoEPolicyError("LoRA is not enabled for this layer (lora.enabled is false)")
        self.lora.set_adapter(slot, **weights)

    def forward(
        self,
        x: torch.Tensor,
        topk_weights: torch.Tensor,
        topk_ids: torch.Tensor,
        token_lora_mapping: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``x`` [T, H] routed by ``topk_ids``/``topk_weights`` [T, k] -> [T, H]."""
        if token_lora_mapping is not None and self.lora is None:
            raise MoEPolicyError(
                "a token_lora_mapping was given but LoRA is not enabled for this layer"
            )
        if not self.batched:
            lora = (
                MoELoRAContext(self.lora, token_lora_mapping)
                if token_lora_mapping is not None and self.lora
                else None
            )
            return self.experts.apply(x, topk_weights, topk_ids, lora)
        return self._forward_batched(x, topk_weights, topk_ids, token_lora_mapping)

    def _forward_batched(
        self,
        x: torch.Tensor,
        topk_weights: torch.Tensor,
        topk_ids: torch.Tensor,
        token_lora_mapping: torch.Tensor | None,
    ) -> torch.Tensor:
        from moe_policy.experts.batched_format import combine_from_batched, dispatch_to_batched

        on_input = self.config.apply_router_weight_on_input
        dispatch = dispatch_to_batched(
            x,
            topk_ids,
            self.config.num_experts,
            max(1, x.shape[0]),
            token_lora_mapping,
            input_weights=topk_weights if on_input else None,
        )
        lora = None
        if self.lora is not None and dispatch.lora_mapping is not None:
            lora = MoELoRAContext(self.lora, dispatch.lora_mapping)
        # Batched experts take (x [E, M, H], counts [E], lora): the format's own signature.
        yb = cast(Any, self.experts).apply(dispatch.x, dispatch.expert_num_tokens, lora)
        return combine_from_batched(
            yb, dispatch.index_map, topk_weights, x.shape[0], apply_router_weight=not on_input
        )
