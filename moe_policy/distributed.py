"""The public home of the cross-rank agreement check (``check_agreement`` and its errors).

The implementation lives in :mod:`moe_policy.fleet`; this module keeps the import path
engines use stable.
"""

from moe_policy.fleet.distributed import (
    MODES,
    RANK_LOCAL_KEYS,
    AgreementCheckError,
    AgreementReport,
    DecisionMismatchError,
    KeyDifference,
    LayerMismatch,
    Side,
    ValueGroup,
    check_agreement,
    compare_summaries,
    local_mode,
    rank_summary,
)

__all__ = [
    "MODES",
    "RANK_LOCAL_KEYS",
    "AgreementCheckError",
    "AgreementReport",
    "DecisionMismatchError",
    "KeyDifference",
    "LayerMismatch",
    "Side",
    "ValueGroup",
    "check_agreement",
    "compare_summaries",
    "local_mode",
    "rank_summary",
]
