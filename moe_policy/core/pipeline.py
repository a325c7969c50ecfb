"""The selection algorithm's pass order, built in one place.

``Selector(pipeline=...)`` and ``Resolver(pipeline=...)`` take any sequence of pass
objects (``moe_policy.core.passes.Pass``); this is the one they use by default.
"""

from __future__ import annotations

from moe_policy.core.passes import Pass
from moe_policy.core.passes.feasibility import FeasibilityPass
from moe_policy.core.passes.lora import LoRAPass
from moe_policy.core.passes.policy_rules import RulesPass
from moe_policy.core.passes.ranking import RankingPass
from moe_policy.core.passes.request import RequestPass

DEFAULT_PIPELINE: tuple[Pass, ...] = (
    FeasibilityPass(),
    LoRAPass(),
    RulesPass(),
    RequestPass(),
    RankingPass(),
)


def pass_names(pipeline: tuple[Pass, ...] = DEFAULT_PIPELINE) -> tuple[str, ...]:
    return tuple(p.name for p in pipeline)
