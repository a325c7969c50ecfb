"""The merged policy a resolver decides under, as one value (built by the settings layer).

The resolver and its passes read this, never the settings sources: the rules in force,
the priority list per platform, a digest of what decides, the policy files read, the
notices to show, and the settings a decision carries for what comes after it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from moe_policy.core.decision import Notice
from moe_policy.core.rules import Rule


@dataclass(frozen=True)
class Policy:
    rules: tuple[Rule, ...] = ()
    #: Platform -> backends in priority order.
    priorities: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    #: sha256 of what decides (rules, priority lists, mode): part of every fingerprint.
    digest: str = ""
    #: ``(path, sha256)`` of each policy file that was read.
    files: tuple[tuple[str, str], ...] = ()
    notices: tuple[Notice, ...] = ()
    #: Settings a decision carries for the agreement check and the audit: key -> (value, origin).
    run_settings: Mapping[str, tuple[Any, str]] = field(default_factory=dict)

    def priority(self, platform: str) -> tuple[str, ...]:
        return tuple(self.priorities.get(platform, ()))
