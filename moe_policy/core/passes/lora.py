"""LoRA: with adapters on, eliminate every backend that cannot apply them.

The activation format still holds (feasibility already removed the other format),
so LoRA plus a batched format leaves a batched backend with LoRA, never a standard
one. A backend with conditional LoRA support (FlashInfer TRT-LLM's LoRA class)
stays only where all of its catalog conditions hold, and then names that class. Version-added:
0.1.0.
"""

from __future__ import annotations

from dataclasses import replace

from moe_policy.core.context import SelectionContext
from moe_policy.core.decision import ReasonCode
from moe_policy.core.passes import Candidates, PassInputs, PassResult

NAME = "lora"


def _describe(cond_key: str, op: str, operand: object, value: object) -> str:
    shown = list(operand) if isinstance(operand, tuple) else operand
    return f"{cond_key} {op} {shown} (is {value})"


class LoRAPass:
    """Eliminates LoRA-incapable backends when ``lora.enabled`` is true."""

    name = NAME

    def __call__(
        self, ctx: SelectionContext, candidates: Candidates, inputs: PassInputs
    ) -> PassResult:
        if not ctx.get("lora.enabled"):
            return candidates, ()
        out = []
        for cand in candidates:
            if cand.alive:
                spec = inputs.catalog.spec(cand.backend)
                if spec.lora == "false":
                    cand = cand.eliminate(
                        NAME,
                        ReasonCode.LORA_UNSUPPORTED,
                        f"{cand.backend} cannot apply LoRA adapters to the experts",
                    )
                elif (
                    spec.lora_rank_multiple
                    and (ctx.get("lora.max_rank") or 0) % spec.lora_rank_multiple
                ):
                    cand = cand.eliminate(
                        NAME,
                        ReasonCode.LORA_UNSUPPORTED,
                        f"lora.max_rank {ctx.get('lora.max_rank')} is not a multiple of {spec.lora_rank_multiple}",
                    )
                elif spec.lora == "conditional":
                    failing = [
                        _describe(c.key, c.op, c.operand, ctx.get(c.key))
                        for c in spec.lora_conditions
                        if not c.test(ctx.get(c.key))
                    ]
                    if failing:
                        cand = cand.eliminate(
                            NAME,
                            ReasonCode.LORA_UNSUPPORTED,
                            f"LoRA class {spec.lora_experts_class} needs " + "; ".join(failing),
                        )
                    elif spec.lora_experts_class:
                        cand = replace(cand, experts_class=spec.lora_experts_class)
            out.append(cand)
        return tuple(out), ()
