"""What a policy change does to every deployment: the deployment matrix and the plan.

``load_matrix`` reads a deployment matrix (YAML); ``plan`` decides every deployment,
platform and layer kind under two policy sets and returns only what changes.
"""

from __future__ import annotations

from moe_policy.planning.matrix import DEFAULT_MATRIX, Deployment, load_matrix
from moe_policy.planning.plan import Cell, Change, Outcome, Plan, Planner, plan

__all__ = [
    "DEFAULT_MATRIX",
    "Cell",
    "Change",
    "Deployment",
    "Outcome",
    "Plan",
    "Planner",
    "load_matrix",
    "plan",
]
