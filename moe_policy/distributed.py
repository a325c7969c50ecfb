"""The public home of the cross-rank agreement check (``check_agreement`` and its errors).

The implementation lives in :mod:`moe_policy.fleet`; this module keeps the import path
engines use stable and exports the same names.
"""

from moe_policy.fleet import distributed as implementation
from moe_policy.fleet.distributed import *  # noqa: F403

__all__ = list(implementation.__all__)
