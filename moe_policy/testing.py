"""Test helpers for engines that embed moe_policy: an isolated selector whose decisions,
events and override warnings are captured.

>>> from moe_policy.testing import isolated_selector
>>> sel = isolated_selector("configs/models/nemotron-3-nano-30b-a3b.json",
...                         backend="flashinfer_cutlass", lora=True)
>>> sel.select(0).backend
'triton'
>>> sel.event_names()
['moe_policy.request_overridden', 'moe_policy.decision']
>>> [w.override.reason_code.value for w in sel.warnings]
['lora_unsupported']

The selector reads no process environment (``environ`` is ``{}`` unless given), runs
on a pinned platform (an H200 unless told otherwise), remembers nothing between
instances (its own reporting memory) and never touches the process-wide caches, so
tests can run in any order and in parallel.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from moe_policy.api import ModelLike, Selector, explicit_entries
from moe_policy.core.decision import Decision
from moe_policy.core.origin import Origin
from moe_policy.core.passes import Pass
from moe_policy.core.pipeline import DEFAULT_PIPELINE
from moe_policy.core.platform import PlatformFacts
from moe_policy.errors import BackendOverrideWarning
from moe_policy.reporting.events import Reporter

#: The platform an isolated selector assumes unless told otherwise.
H200 = PlatformFacts("cuda", "9.0", "NVIDIA H200", origin="api")


@dataclass
class CapturingLogger:
    """A structlog-style logger that keeps each event as a dict (``event``, ``level``, fields)."""

    events: list[dict[str, Any]] = field(default_factory=list)

    def _keep(self, level: str, event: str, **fields: Any) -> None:
        self.events.append({"event": event, "level": level, **fields})

    def info(self, event: str, **fields: Any) -> None:
        self._keep("info", event, **fields)

    def warning(self, event: str, **fields: Any) -> None:
        self._keep("warning", event, **fields)

    def error(self, event: str, **fields: Any) -> None:
        self._keep("error", event, **fields)


class IsolatedSelector:
    """A :class:`~moe_policy.Selector` plus what its ``select`` calls reported."""

    def __init__(self, selector: Selector, logger: CapturingLogger) -> None:
        self.selector = selector
        self.logger = logger
        self.decisions: list[Decision] = []
        self.warnings: list[BackendOverrideWarning] = []

    @property
    def events(self) -> list[dict[str, Any]]:
        return self.logger.events

    def event_names(self) -> list[str]:
        return [e["event"] for e in self.logger.events]

    def select(self, layer_index: int | None = None, layer_kind: str | None = None) -> Decision:
        """``Selector.select``, with its decision and override warnings captured (strict
        mode and no-feasible-backend errors still raise)."""
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", BackendOverrideWarning)
            decision = self.selector.select(layer_index, layer_kind)
        for item in caught:
            if isinstance(item.message, BackendOverrideWarning):
                self.warnings.append(item.message)
            else:
                warnings.warn_explicit(item.message, item.category, item.filename, item.lineno)
        self.decisions.append(decision)
        return decision

    def decide(self, layer_index: int | None = None, layer_kind: str | None = None) -> Decision:
        """The decision alone: nothing logged, warned, raised or captured."""
        return self.selector.decide(layer_index, layer_kind)


def isolated_selector(
    model: ModelLike,
    *,
    platform: PlatformFacts = H200,
    environ: Mapping[str, str] | None = None,
    policy_files: Sequence[str] | None = None,
    overrides: Mapping[str, Any] | None = None,
    pipeline: Sequence[Pass] = DEFAULT_PIPELINE,
    **arguments: Any,
) -> IsolatedSelector:
    """A selector for ``model`` that sees only what it is given.

    ``arguments`` are the keywords of :func:`moe_policy.select_backend` (backend, mode,
    lora, tp, ep, all2all, ...); ``overrides`` sets any context or settings key by name.
    """
    logger = CapturingLogger()
    selector = Selector(
        model,
        policy_files=policy_files,
        environ=dict(environ or {}),
        explicit=explicit_entries(arguments, overrides, Origin.api()),
        platform=platform,
        reporter=Reporter(logger=logger),
        pipeline=pipeline,
    )
    return IsolatedSelector(selector, logger)


__all__ = ["H200", "CapturingLogger", "IsolatedSelector", "isolated_selector"]
