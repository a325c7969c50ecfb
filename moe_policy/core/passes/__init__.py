"""Selection passes. Every pass has one signature, ``Pass``::

    (ctx, candidates) -> (candidates, trace)

A pass removes candidates (marks them eliminated with a reason code and detail) or
reorders them, and returns trace records (rule evaluations, overrides,
adaptations). Passes read only the context and the candidates: never the
environment, files or module globals. The order is ``resolve.PIPELINE``.
"""

from __future__ import annotations

from collections.abc import Callable

from moe_policy.core.context import SelectionContext
from moe_policy.core.decision import Adaptation, Candidate, Override, RuleRecord

TraceEntry = RuleRecord | Override | Adaptation
Candidates = tuple[Candidate, ...]
PassResult = tuple[Candidates, tuple[TraceEntry, ...]]
Pass = Callable[[SelectionContext, Candidates], PassResult]

__all__ = ["Candidates", "Pass", "PassResult", "TraceEntry"]
