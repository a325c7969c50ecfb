"""Selection passes and the pipeline they form.

Every pass is an object with a ``name`` and one signature::

    pass_(ctx, candidates, inputs) -> (candidates, trace)

A pass removes candidates (marks them eliminated with a reason code and detail) or
reorders them, and returns trace records (rule evaluations, overrides, adaptations).
Passes read only the context, the candidates and ``inputs`` (catalog, policy, extra
checks): never the environment, files or module globals. ``DEFAULT_PIPELINE``
(``moe_policy.core.pipeline``) is the order; ``Selector(pipeline=...)`` replaces it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from moe_policy.core.catalog import Catalog
from moe_policy.core.context import SelectionContext
from moe_policy.core.decision import Adaptation, Candidate, Override, RuleRecord
from moe_policy.core.policy import Policy

TraceEntry = RuleRecord | Override | Adaptation
Candidates = tuple[Candidate, ...]
PassResult = tuple[Candidates, tuple[TraceEntry, ...]]
#: An experts class's own check: ``supports(ctx_values) -> (ok, reason)``.
ExtraCheck = Callable[[Mapping[str, object]], tuple[bool, "str | None"]]


@dataclass(frozen=True)
class PassInputs:
    """What a pass may read besides the context and the candidates."""

    catalog: Catalog
    policy: Policy
    extra_checks: Mapping[str, ExtraCheck] = field(default_factory=dict)


class Pass(Protocol):
    """One step of the selection algorithm."""

    @property
    def name(self) -> str: ...

    def __call__(
        self, ctx: SelectionContext, candidates: Candidates, inputs: PassInputs
    ) -> PassResult: ...


__all__ = ["Candidates", "ExtraCheck", "Pass", "PassInputs", "PassResult", "TraceEntry"]
