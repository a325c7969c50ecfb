"""Run the passes over a frozen context and build the Decision; cache by fingerprint.

``Resolver.resolve`` is pure over its inputs: the catalog, policy and pipeline it was
built with and the SelectionContext it is given. No probing, no env or file reads.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from moe_policy._version import __version__
from moe_policy.core.canonical import canonical_json, sha256_hex
from moe_policy.core.catalog import Catalog
from moe_policy.core.context import SelectionContext
from moe_policy.core.decision import (
    Adaptation,
    Decision,
    Outcome,
    Override,
    Request,
    RuleRecord,
    Status,
)
from moe_policy.core.keys import CONTEXT_KEYS
from moe_policy.core.passes import ExtraCheck, Pass, PassInputs, TraceEntry
from moe_policy.core.passes.feasibility import seed_candidates
from moe_policy.core.passes.request import RequestPass
from moe_policy.core.pipeline import DEFAULT_PIPELINE, pass_names
from moe_policy.core.policy import Policy


class Resolver:
    """Decides backends for contexts under one catalog, one policy and one pipeline."""

    def __init__(
        self,
        catalog: Catalog,
        policy: Policy,
        extra_checks: Mapping[str, ExtraCheck] | None = None,
        pipeline: Sequence[Pass] = DEFAULT_PIPELINE,
    ) -> None:
        self.catalog = catalog
        self.policy = policy
        self.inputs = PassInputs(catalog, policy, dict(extra_checks or {}))
        self.passes: tuple[Pass, ...] = tuple(pipeline)
        if not any(isinstance(p, RequestPass) for p in self.passes):
            raise ValueError(
                f"the selection pipeline ({', '.join(pass_names(self.passes)) or 'empty'}) "
                "has no RequestPass: an explicit backend request would be dropped without "
                "an override record or warning"
            )
        #: Rank-local keys enter the fingerprint only when a rule decides on them.
        ruled = {key for rule in policy.rules for key in rule.keys}
        self.excluded_keys = frozenset(
            key for key, spec in CONTEXT_KEYS.items() if spec.rank_local and key not in ruled
        )
        self._cache: dict[str, Decision] = {}
        #: How many contexts ran the passes (the rest were answered from the cache).
        self.resolutions = 0

    def fingerprint(self, ctx: SelectionContext) -> str:
        """sha256 over what decides: context values, request, mode, policy, version."""
        decisive: dict[str, Any] = {
            "context": {k: v for k, v in ctx.values.items() if k not in self.excluded_keys},
            "request": ctx.request.backend if ctx.request else None,
            "mode": ctx.mode,
            "policy": self.policy.digest,
            "catalog": self.catalog.sha256,
            "library_version": __version__,
        }
        if self.passes != DEFAULT_PIPELINE:
            decisive["pipeline"] = [p.name for p in self.passes]
        return sha256_hex(canonical_json(decisive))

    def resolve(self, ctx: SelectionContext) -> Decision:
        """The decision for ``ctx`` (a cached one relabelled when the signature repeats)."""
        fingerprint = self.fingerprint(ctx)
        cached = self._cache.get(fingerprint)
        if cached is not None:
            return cached.for_layer(
                ctx.get("layer.index"), ctx.origins.get("layer.index", "default")
            )
        decision = self._run(ctx, fingerprint)
        self._cache[fingerprint] = decision
        return decision

    def _run(self, ctx: SelectionContext, fingerprint: str) -> Decision:
        self.resolutions += 1
        candidates = seed_candidates(
            self.catalog, ctx, self.policy.priority(str(ctx.get("platform")))
        )
        trace: list[TraceEntry] = []
        for run_pass in self.passes:
            candidates, entries = run_pass(ctx, candidates, self.inputs)
            trace.extend(entries)
        selected = next((c for c in candidates if c.status is Status.SELECTED), None)
        backend = selected.backend if selected else None
        overrides = tuple(replace(t, selected=backend) for t in trace if isinstance(t, Override))
        adaptations = [t for t in trace if isinstance(t, Adaptation)]
        request: Request | None = ctx.request
        if request is not None and adaptations:
            request = replace(
                request, adapted_from=request.backend, backend=adaptations[0].adapted_to
            )
        if request is None:
            outcome = Outcome.AUTO
        elif overrides or backend != request.backend:
            outcome = Outcome.OVERRIDDEN
            if not overrides:
                raise ValueError(
                    f"the selection pipeline ({', '.join(pass_names(self.passes))}) chose "
                    f"{backend} over the request for {request.backend} without recording "
                    "why: put RequestPass after every pass that eliminates candidates"
                )
        else:
            outcome = Outcome.HONORED
        experts_class = None
        if backend is not None:
            spec = self.catalog.spec(backend)
            experts_class = selected.experts_class if selected else None
            experts_class = experts_class or spec.experts_class
        return Decision(
            fingerprint=fingerprint,
            backend=backend,
            experts_class=experts_class,
            implemented_here=backend is not None
            and self.catalog.implementation(backend) is not None,
            activation_format=ctx.format,
            outcome=outcome,
            requested=request,
            overrides=overrides,
            candidates=candidates,
            rules=tuple(t for t in trace if isinstance(t, RuleRecord)),
            adaptations=tuple(adaptations),
            context=ctx.items_with_origin(),
            policy_files=self.policy.files,
            mode=ctx.mode,
            library_version=__version__,
            layer_kind=str(ctx.get("layer.kind") or "moe"),
            layer_index=ctx.get("layer.index"),
            notices=self.policy.notices,
            run_settings=self.policy.run_settings,
        )
