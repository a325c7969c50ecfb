"""The decision record: what was chosen for one MoE layer, why, and from which inputs.

``Decision.to_dict()`` is an artifact format: its field names are API, versioned by
``SCHEMA_VERSION`` and validated against ``schemas/decision.v1.json``. A schema change
bumps the version and gets a CHANGELOG entry under "Policy semantics".
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any

from moe_policy.core.canonical import canonical
from moe_policy.core.state import next_decision_id

SCHEMA_VERSION = 1


class ReasonCode(str, Enum):
    """Why a backend was eliminated (a closed set: tests and tools match codes, never text).

    "Cannot run" codes come from the catalog and the experts classes; ``policy_forbid`` and
    ``policy_require`` mean a policy rule chose not to, although the backend could run.
    """

    PLATFORM_UNSUPPORTED = "platform_unsupported"
    #: The platform matches but the compute capability is outside the backend's range.
    DEVICE_CAPABILITY_UNSUPPORTED = "device_capability_unsupported"
    PACKAGE_UNAVAILABLE = "package_unavailable"
    DTYPE_UNSUPPORTED = "dtype_unsupported"
    QUANTIZATION_UNSUPPORTED = "quantization_unsupported"
    ACTIVATION_UNSUPPORTED = "activation_unsupported"
    #: The model's experts are non-gated (e.g. relu2) and the backend only runs gated ones.
    NON_GATED_UNSUPPORTED = "non_gated_unsupported"
    #: The deployment's activation format (standard / batched) is not the backend's.
    ACTIVATION_FORMAT_MISMATCH = "activation_format_mismatch"
    #: All2all kind, EPLB or parallel sizes the backend cannot run with.
    PARALLEL_CONFIG_UNSUPPORTED = "parallel_config_unsupported"
    EXPERT_COUNT_UNSUPPORTED = "expert_count_unsupported"
    SHAPE_ALIGNMENT_UNSUPPORTED = "shape_alignment_unsupported"
    BATCH_INVARIANCE_UNSUPPORTED = "batch_invariance_unsupported"
    LORA_UNSUPPORTED = "lora_unsupported"
    #: An experts class's own ``supports(ctx)`` check refused.
    IMPLEMENTATION_UNSUPPORTED = "implementation_unsupported"
    POLICY_FORBID = "policy_forbid"
    POLICY_REQUIRE = "policy_require"


class Outcome(str, Enum):
    """``auto``: no request; ``honored``: the request runs; ``overridden``: it could not."""

    AUTO = "auto"
    HONORED = "honored"
    OVERRIDDEN = "overridden"


class Status(str, Enum):
    SELECTED = "selected"
    FEASIBLE = "feasible"
    ELIMINATED = "eliminated"


@dataclass(frozen=True)
class Candidate:
    """One backend's verdict. An elimination must carry a code and a detail; others none."""

    backend: str
    status: Status
    pass_name: str | None = None
    reason_code: ReasonCode | None = None
    detail: str | None = None
    rule: str | None = None
    listed: bool = True
    requested: bool = False
    #: For backends with several experts classes: the one the engine would build here.
    experts_class: str | None = None

    def __post_init__(self) -> None:
        if self.status is Status.ELIMINATED:
            if self.reason_code is None or not self.detail or self.pass_name is None:
                raise ValueError(
                    f"eliminating {self.backend!r} needs a pass, a reason code and a detail"
                )
        elif self.reason_code is not None:
            raise ValueError(f"{self.backend!r} is {self.status.value} but carries a reason code")

    @property
    def alive(self) -> bool:
        return self.status is not Status.ELIMINATED

    def eliminate(
        self, pass_name: str, code: ReasonCode, detail: str, rule: str | None = None
    ) -> Candidate:
        return replace(
            self,
            status=Status.ELIMINATED,
            pass_name=pass_name,
            reason_code=code,
            detail=detail,
            rule=rule,
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "status": self.status.value,
            "pass": self.pass_name,
            "reason_code": self.reason_code.value if self.reason_code else None,
            "detail": self.detail,
            "rule": self.rule,
            "listed": self.listed,
            "requested": self.requested,
            "experts_class": self.experts_class,
        }


@dataclass(frozen=True)
class Request:
    """An explicit backend request and where it came from."""

    backend: str
    origin: str
    adapted_from: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"backend": self.backend, "origin": self.origin, "adapted_from": self.adapted_from}


@dataclass(frozen=True)
class Adaptation:
    """A request rewritten to fit the deployment (``triton`` under the batched format)."""

    requested: str
    adapted_to: str
    reason: str
    origin: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "requested": self.requested,
            "adapted_to": self.adapted_to,
            "reason": self.reason,
            "origin": self.origin,
        }


@dataclass(frozen=True)
class Override:
    """An explicit request that could not be honoured, and what ran instead."""

    requested: str
    selected: str | None
    reason_code: ReasonCode
    detail: str
    pass_name: str
    origin: str
    rule: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "requested": self.requested,
            "selected": self.selected,
            "reason_code": self.reason_code.value,
            "detail": self.detail,
            "pass": self.pass_name,
            "origin": self.origin,
            "rule": self.rule,
        }


@dataclass(frozen=True)
class RuleRecord:
    """A policy rule as evaluated for this context."""

    id: str
    effect: str
    action: str
    matched: bool
    applied: bool
    backends: tuple[str, ...]
    reason: str
    origin: str
    missing_context: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "effect": self.effect,
            "action": self.action,
            "matched": self.matched,
            "applied": self.applied,
            "backends": list(self.backends),
            "reason": self.reason,
            "origin": self.origin,
            "missing_context": list(self.missing_context),
        }


@dataclass(frozen=True)
class Notice:
    """A setting that is deprecated, unknown or has no effect (``moe_policy.knob_ignored``)."""

    name: str
    origin: str
    detail: str
    replacement: str | None = None
    event: str = "moe_policy.knob_ignored"

    def to_dict(self) -> dict[str, Any]:
        return {
            "event": self.event,
            "name": self.name,
            "origin": self.origin,
            "detail": self.detail,
            "replacement": self.replacement,
        }


@dataclass(frozen=True)
class Decision:
    """The record of one layer's backend decision."""

    fingerprint: str
    backend: str | None
    experts_class: str | None
    implemented_here: bool
    activation_format: str
    outcome: Outcome
    requested: Request | None
    overrides: tuple[Override, ...]
    candidates: tuple[Candidate, ...]
    rules: tuple[RuleRecord, ...]
    context: Mapping[str, tuple[Any, str]]
    policy_files: tuple[tuple[str, str], ...]
    mode: str
    library_version: str
    layer_kind: str
    layer_index: int | None
    notices: tuple[Notice, ...] = ()
    adaptations: tuple[Adaptation, ...] = ()
    decision_id: str = field(default_factory=next_decision_id)
    #: Settings that act after the decision (``consistency``, ``audit.path``, ``audit.required``):
    #: key -> (value, origin). Not decisive, so outside the fingerprint; not in ``to_dict()`` (v1).
    run_settings: Mapping[str, tuple[Any, str]] = field(default_factory=dict)

    def for_layer(self, index: int | None, index_origin: str = "api") -> Decision:
        """The same decision relabelled for another layer of the same signature."""
        context = self.context
        if context.get("layer.index", (None, ""))[0] != index:
            context = {**context, "layer.index": (index, index_origin)}
        return replace(self, layer_index=index, context=context, decision_id=next_decision_id())

    @property
    def override(self) -> Override | None:
        return self.overrides[0] if self.overrides else None

    def candidate(self, backend: str) -> Candidate:
        for cand in self.candidates:
            if cand.backend == backend:
                return cand
        raise KeyError(backend)

    def layer_label(self) -> str:
        index = "" if self.layer_index is None else f" {self.layer_index}"
        return f"layer {self.layer_kind}{index}"

    def to_dict(self) -> dict[str, Any]:
        """The versioned record (``explain --json``, audit lines)."""
        return {
            "schema_version": SCHEMA_VERSION,
            "decision_id": self.decision_id,
            "fingerprint": self.fingerprint,
            "backend": self.backend,
            "experts_class": self.experts_class,
            "implemented_here": self.implemented_here,
            "activation_format": self.activation_format,
            "outcome": self.outcome.value,
            "requested": self.requested.to_dict() if self.requested else None,
            "overrides": [o.to_dict() for o in self.overrides],
            "candidates": [c.to_dict() for c in self.candidates],
            "rules": [r.to_dict() for r in self.rules],
            "context": {
                key: {"value": canonical(value), "origin": origin}
                for key, (value, origin) in sorted(self.context.items())
            },
            "policy": {"files": [{"path": p, "sha256": h} for p, h in self.policy_files]},
            "notices": [n.to_dict() for n in self.notices],
            "adaptations": [a.to_dict() for a in self.adaptations],
            "mode": self.mode,
            "library_version": self.library_version,
            "layer": {"kind": self.layer_kind, "index": self.layer_index},
        }

    def describe(self) -> str:
        """One line for logs: chosen backend, request, runners-up and rejections."""
        parts = [f"MoE {self.layer_label()}: {self.backend} ({self.activation_format} format)"]
        if self.requested is not None:
            parts.append(f"requested {self.requested.backend} via {self.requested.origin}")
        if self.outcome is Outcome.OVERRIDDEN and self.override is not None:
            parts.append(f"OVERRIDDEN: {self.override.reason_code.value}")
        alive = [c.backend for c in self.candidates if c.status is Status.FEASIBLE]
        if alive:
            parts.append("also feasible: " + ", ".join(alive))
        gone = [
            f"{c.backend}={c.reason_code.value}"
            for c in self.candidates
            if c.status is Status.ELIMINATED and c.reason_code is not None
        ]
        if gone:
            parts.append("eliminated: " + ", ".join(gone))
        return "; ".join(parts)
