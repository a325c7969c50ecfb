"""Every piece of process-global state moe_policy keeps, in one place, with one ``reset()``.

The modules that use a piece own its behaviour (the probe, the catalog loader, the
reporter, the selector cache); the data lives here so that one call forgets all of it
(tests, a changed environment). Decision ids keep counting across resets, so an id is
never issued twice in a process.
"""

from __future__ import annotations

import itertools
import os
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from moe_policy.core.catalog import Catalog
    from moe_policy.core.platform import PlatformFacts


@dataclass
class ReportingState:
    """What the default reporter remembers: decisions seen (with counts), notices already
    shown and failed audit writes (counted per file and error kind)."""

    counts: dict[str, int] = field(default_factory=dict)
    notices_seen: set[tuple[str, str]] = field(default_factory=set)
    audit_failures: dict[tuple[str, str], int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def clear(self) -> None:
        with self.lock:
            self.counts.clear()
            self.notices_seen.clear()
            self.audit_failures.clear()


@dataclass
class ProcessState:
    """The process's caches and overrides."""

    #: Cached ``Selector`` objects of ``select_backend``/``explain``, by their arguments.
    selectors: dict[Any, Any] = field(default_factory=dict)
    selectors_lock: threading.Lock = field(default_factory=threading.Lock)
    #: The probed platform (probed once) and a pinned one (``override_platform``).
    probed_platform: PlatformFacts | None = None
    pinned_platform: PlatformFacts | None = None
    #: The built-in catalogs, parsed once, by engine profile.
    catalogs: dict[str, Catalog] = field(default_factory=dict)
    reporting: ReportingState = field(default_factory=ReportingState)
    #: (mode, priority lists, rule ids) -> (the rules, their digest), at most 256: Selectors
    #: built over the same parsed policy files compute one digest.
    policy_digests: dict[tuple[Any, ...], tuple[Any, str]] = field(default_factory=dict)
    #: Open audit sinks by (path, required): one descriptor per file per process.
    audit_sinks: dict[tuple[str, bool], Any] = field(default_factory=dict)
    #: Its own lock: a sink is opened while a selector is built, under ``selectors_lock``.
    audit_lock: threading.Lock = field(default_factory=threading.Lock)
    #: Decisions an engine integration made in this process, in order (its start-up check).
    engine_decisions: list[Any] = field(default_factory=list)
    id_prefix: str = field(default_factory=lambda: os.urandom(4).hex())
    id_counter: itertools.count[int] = field(default_factory=lambda: itertools.count(1))


STATE = ProcessState()


def next_decision_id() -> str:
    """Unique per decision in a process, unique across processes with high probability."""
    return f"{STATE.id_prefix}-{next(STATE.id_counter):08x}"


def _after_fork_in_child() -> None:
    """A forked child is a new process: its own decision-id prefix, its own reporting memory
    ("once per fingerprint per process"), and new locks (one held by another thread at the
    fork would never be released here)."""
    STATE.id_prefix = os.urandom(4).hex()
    STATE.selectors_lock = threading.Lock()
    STATE.audit_lock = threading.Lock()
    STATE.reporting.lock = threading.Lock()
    STATE.reporting.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def reset() -> None:
    """Forget cached selectors, the probed platform, the catalog and what was reported, and
    close the audit files.

    A platform pinned with ``override_platform`` stays pinned until its block ends.
    """
    with STATE.selectors_lock:
        STATE.selectors.clear()
    STATE.probed_platform = None
    STATE.catalogs.clear()
    STATE.reporting.clear()
    STATE.engine_decisions.clear()
    STATE.policy_digests.clear()
    with STATE.audit_lock:
        sinks = list(STATE.audit_sinks.values())
        STATE.audit_sinks.clear()
    for sink in sinks:
        sink.close()
