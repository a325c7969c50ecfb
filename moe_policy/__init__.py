"""moe_policy: declared, explainable, auditable selection of fused-MoE kernel backends.

>>> import moe_policy
>>> e = moe_policy.explain("configs/models/mixtral-8x7b-instruct-v0.1.json",
...                        platform="cuda", capability="9.0")
>>> e.decision.backend, e.decision.outcome.value
('triton', 'auto')

Importing the package never imports torch or triton; the kernels live in
``moe_policy.experts`` and are imported only when a layer runs.
"""

from moe_policy._version import __version__
from moe_policy.api import Explanation, Selector, explain, reset, select_backend
from moe_policy.core.decision import (
    Candidate,
    Decision,
    Outcome,
    Override,
    ReasonCode,
    Request,
    Status,
)
from moe_policy.core.platform import PlatformFacts, override_platform
from moe_policy.errors import (
    BackendOverrideError,
    BackendOverrideWarning,
    MoEPolicyError,
    NoFeasibleBackendError,
    PolicyError,
)
from moe_policy.schemas import schema

__all__ = [
    "BackendOverrideError",
    "BackendOverrideWarning",
    "Candidate",
    "Decision",
    "Explanation",
    "MoEPolicyError",
    "NoFeasibleBackendError",
    "Outcome",
    "Override",
    "PlatformFacts",
    "PolicyError",
    "ReasonCode",
    "Request",
    "Selector",
    "Status",
    "__version__",
    "explain",
    "override_platform",
    "reset",
    "schema",
    "select_backend",
]
