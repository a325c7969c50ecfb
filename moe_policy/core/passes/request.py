"""Request: honour an explicit backend request when it survived the earlier passes.

``triton`` under the batched format becomes ``batched_triton``, and ``deep_gemm``
``batched_deep_gemm`` (an adaptation, recorded) where the catalog has it, as vLLM's fp8
oracle swaps the classes. A request for an eliminated backend becomes an
override carrying that backend's reason code, the pass that eliminated it, and the
request's origin; so does a request for a backend of the engine's other oracles
(``quantization_unsupported``: vLLM's ``marlin`` asked for an unquantized layer).
Version-added: 0.1.0.
"""

from __future__ import annotations

from dataclasses import replace

from moe_policy.core.context import SelectionContext
from moe_policy.core.decision import Adaptation, Override, ReasonCode
from moe_policy.core.keys import format_cause
from moe_policy.core.passes import Candidates, PassInputs, PassResult, TraceEntry

NAME = "request"
#: Standard-format backends and their batched-format counterparts.
BATCHED_COUNTERPART = {"triton": "batched_triton", "deep_gemm": "batched_deep_gemm"}


class RequestPass:
    """Marks the requested backend; a request for an eliminated one becomes an override."""

    name = NAME

    def __call__(
        self, ctx: SelectionContext, candidates: Candidates, inputs: PassInputs
    ) -> PassResult:
        request = ctx.request
        if request is None:
            return candidates, ()
        trace: list[TraceEntry] = []
        wanted = request.backend
        if (
            ctx.format == "batched"
            and wanted in BATCHED_COUNTERPART
            and BATCHED_COUNTERPART[wanted] in inputs.catalog
        ):
            adapted = BATCHED_COUNTERPART[wanted]
            trace.append(
                Adaptation(
                    wanted,
                    adapted,
                    f"the deployment delivers the batched format ({format_cause(ctx.values)}); "
                    f"{adapted} is {wanted}'s batched counterpart",
                    request.origin,
                )
            )
            wanted = adapted
        if wanted not in inputs.catalog:  # a backend of the engine's other oracles
            trace.append(
                Override(
                    requested=request.backend,
                    selected=None,
                    reason_code=ReasonCode.QUANTIZATION_UNSUPPORTED,
                    detail=f"{wanted} belongs to another of the engine's oracles, not the "
                    f"one deciding this layer (model.quantization="
                    f"{ctx.get('model.quantization')}), whose backends are "
                    f"{', '.join(inputs.catalog.names)}",
                    pass_name=NAME,
                    origin=request.origin,
                )
            )
        out = []
        for cand in candidates:
            if cand.backend == wanted:
                cand = replace(cand, requested=True)
                if not cand.alive:
                    assert cand.reason_code is not None and cand.detail and cand.pass_name
                    trace.append(
                        Override(
                            requested=request.backend,
                            selected=None,
                            reason_code=cand.reason_code,
                            detail=cand.detail,
                            pass_name=cand.pass_name,
                            origin=request.origin,
                            rule=cand.rule,
                        )
                    )
            out.append(cand)
        return tuple(out), tuple(trace)
