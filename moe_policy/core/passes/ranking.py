"""Ranking: the requested backend if it survived, else the first live listed one.

Version-added: 0.1.0.
"""

from __future__ import annotations

from dataclasses import replace

from moe_policy.core.context import SelectionContext
from moe_policy.core.decision import Status
from moe_policy.core.passes import Candidates, PassInputs, PassResult

NAME = "ranking"


class RankingPass:
    """Selects the requested backend if it survived, else the first live listed one."""

    name = NAME

    def __call__(
        self, ctx: SelectionContext, candidates: Candidates, inputs: PassInputs
    ) -> PassResult:
        chosen = next((c for c in candidates if c.alive and c.requested), None)
        if chosen is None:
            chosen = next((c for c in candidates if c.alive and c.listed), None)
        if chosen is None:
            return candidates, ()
        return tuple(
            replace(c, status=Status.SELECTED) if c is chosen else c for c in candidates
        ), ()
