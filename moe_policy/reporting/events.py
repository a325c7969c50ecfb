"""Structured events, warnings and strict errors for decisions.

Event names are part of the contract: ``moe_policy.decision`` (info, once per
fingerprint per process, with a count), ``moe_policy.request_overridden``
(warning), ``moe_policy.request_adapted`` (info), ``moe_policy.knob_ignored``
(warning), ``moe_policy.rule_audit`` (info), ``moe_policy.no_feasible_backend``
(error), ``moe_policy.audit_failed`` (warning); the vLLM plugin adds
``moe_policy.settings_invalid`` (error, at plugin load); the cross-rank check adds
``moe_policy.agreement`` (info), ``moe_policy.decision_mismatch`` (error, or warning
under ``consistency: warn``) and ``moe_policy.decision_inputs_differ`` (warning).
The library never configures logging: without a structlog configuration in the process the
events are records of the stdlib logger ``moe_policy`` (see ``get_logger``).
"""

from __future__ import annotations

import importlib.util
import logging
import os
import sys
import warnings
from collections.abc import MutableMapping
from typing import Any

from moe_policy.core.decision import Decision, Outcome
from moe_policy.core.paths import PACKAGE_DIR
from moe_policy.core.state import STATE, ReportingState
from moe_policy.errors import BackendOverrideError, BackendOverrideWarning, NoFeasibleBackendError
from moe_policy.reporting.audit import AuditSink, AuditWriteError, audit_record

LOGGER_NAME = "moe_policy"


def get_logger() -> Any:
    """Where events go: through the process's structlog pipeline when the application
    configured structlog, otherwise to the stdlib logger ``moe_policy``.

    Nothing is configured globally either way. In an engine that logs with the stdlib
    (vLLM, SGLang), events are records of the ``moe_policy`` logger at their level, so
    the engine's handlers, levels and formatters apply; each record carries the event's
    fields as ``record.moe_policy`` for structured handlers.
    """
    import structlog

    if structlog.is_configured():
        return structlog.get_logger(LOGGER_NAME)
    return structlog.wrap_logger(
        logging.getLogger(LOGGER_NAME),
        processors=[structlog.stdlib.filter_by_level, _to_stdlib_record],
        wrapper_class=structlog.stdlib.BoundLogger,
    )


def _to_stdlib_record(_logger: Any, _method: str, event_dict: MutableMapping[str, Any]) -> Any:
    """``moe_policy.decision backend=triton ...`` as the message, the fields as ``extra``;
    the record's file and line are moe_policy's call, not structlog's (``stacklevel``)."""
    fields = dict(event_dict)
    event = fields.pop("event", "")
    text = " ".join(f"{key}={_plain(value)}" for key, value in sorted(fields.items()))
    extra = {LOGGER_NAME: {"event": event, **fields}}
    return (f"{event} {text}".rstrip(),), {"extra": extra, "stacklevel": _structlog_frames()}


def _structlog_frames() -> int:
    """How many structlog frames lie between the logging call and moe_policy's caller."""
    frame, count = sys._getframe(2), 0  # above this function and the processor
    while frame is not None and frame.f_code.co_filename.startswith(_STRUCTLOG_DIR):
        count += 1
        frame = frame.f_back  # type: ignore[assignment]
    return max(count, 1)


_STRUCTLOG_DIR = os.path.dirname(importlib.util.find_spec("structlog").origin or "")  # type: ignore[union-attr]


def _plain(value: Any) -> str:
    """The value as one token: quoted when empty or holding whitespace or a control
    character, so a newline in a value (a path, an origin) never starts a forged line."""
    text = str(value)
    if not text or any(c.isspace() or not c.isprintable() for c in text):
        return repr(text)
    return text


def warn_at_caller(warning: Warning) -> None:
    """Issue ``warning`` pointing at the first frame outside moe_policy."""
    if sys.version_info >= (3, 12):
        warnings.warn(warning, skip_file_prefixes=(str(PACKAGE_DIR),))
        return
    level, frame = 2, sys._getframe(1)  # level 1 is this function, 2 its caller
    while frame is not None and frame.f_code.co_filename.startswith(str(PACKAGE_DIR)):
        level += 1
        frame = frame.f_back  # type: ignore[assignment]
    warnings.warn(warning, stacklevel=level)


class Reporter:
    """Logs, audits, warns or raises for decisions; remembers what it has shown in ``memory``
    (the process-wide reporter's memory is ``STATE.reporting``; a fresh one by default)."""

    def __init__(self, memory: ReportingState | None = None, logger: Any = None) -> None:
        self.memory = memory if memory is not None else ReportingState()
        #: Where events go: a structlog-style logger (``info``/``warning``/``error`` with
        #: the event name and fields); ``None`` is the ``moe_policy`` logger.
        self.logger = logger

    def log(self) -> Any:
        return self.logger if self.logger is not None else get_logger()

    @property
    def counts(self) -> dict[str, int]:
        return self.memory.counts

    def reset(self) -> None:
        self.memory.clear()

    def report(self, decision: Decision, audit: AuditSink | None = None) -> int:
        """Log (deduplicated), audit (never deduplicated), warn or raise. Returns the count."""
        with self.memory.lock:
            count = self.memory.counts.get(decision.fingerprint, 0) + 1
            self.memory.counts[decision.fingerprint] = count
        if count == 1:
            self._log_first(decision)
        if audit is not None:
            self._audit(decision, count, audit)
        if decision.backend is None:
            raise NoFeasibleBackendError(decision)
        if decision.outcome is Outcome.OVERRIDDEN and decision.override is not None:
            if decision.mode == "strict":
                raise BackendOverrideError(decision, decision.override)
            warn_at_caller(BackendOverrideWarning(decision.override))
        return count

    def _log_first(self, decision: Decision) -> None:
        log = self.log()
        # Each notice is claimed under the lock and logged outside it (a handler may re-enter).
        with self.memory.lock:
            fresh = {
                (n.name, n.origin): n
                for n in decision.notices
                if (n.name, n.origin) not in self.memory.notices_seen
            }
            self.memory.notices_seen.update(fresh)
        for notice in fresh.values():
            log.warning(
                notice.event,
                knob=notice.name,
                origin=notice.origin,
                detail=notice.detail,
                replacement=notice.replacement,
            )
        for rule in decision.rules:
            if rule.action == "audit" and rule.matched:
                log.info(
                    "moe_policy.rule_audit",
                    rule=rule.id,
                    effect=rule.effect,
                    backends=list(rule.backends),
                    origin=rule.origin,
                    fingerprint=decision.fingerprint[:16],
                )
        for adaptation in decision.adaptations:
            log.info(
                "moe_policy.request_adapted",
                requested=adaptation.requested,
                adapted_to=adaptation.adapted_to,
                origin=adaptation.origin,
                detail=adaptation.reason,
            )
        for override in decision.overrides:
            log.warning(
                "moe_policy.request_overridden",
                requested=override.requested,
                origin=override.origin,
                selected=override.selected,
                reason_code=override.reason_code.value,
                detail=override.detail,
                pass_name=override.pass_name,
                rule=override.rule,
                mode=decision.mode,
                layer_kind=decision.layer_kind,
                layer_index=decision.layer_index,
                fingerprint=decision.fingerprint[:16],
            )
        if decision.backend is None:
            log.error(
                "moe_policy.no_feasible_backend",
                candidates={
                    c.backend: c.reason_code.value for c in decision.candidates if c.reason_code
                },
                fingerprint=decision.fingerprint[:16],
            )
            return
        log.info(
            "moe_policy.decision",
            backend=decision.backend,
            experts_class=decision.experts_class,
            activation_format=decision.activation_format,
            outcome=decision.outcome.value,
            requested=decision.requested.backend if decision.requested else None,
            layer_kind=decision.layer_kind,
            layer_index=decision.layer_index,
            fingerprint=decision.fingerprint[:16],
            count=1,
            summary=decision.describe(),
        )

    def _audit(self, decision: Decision, count: int, sink: AuditSink) -> None:
        error = sink.write(audit_record(decision, count))
        if error is None:
            return
        if sink.required:
            raise AuditWriteError.at(sink.path, error)
        key = (sink.path, type(error).__name__)
        with self.memory.lock:
            failures = self.memory.audit_failures.get(key, 0) + 1
            self.memory.audit_failures[key] = failures
        # every lost line is reported (a decision is made once per layer build, not per
        # token); ``failures`` counts them per file and error kind
        self.log().warning(
            "moe_policy.audit_failed",
            path=sink.path,
            error=str(error),
            decision_id=decision.decision_id,
            failures=failures,
            detail="decision returned without an audit line",
        )


#: The process-wide reporter; what it remembers is process state (``moe_policy.reset()``).
REPORTER = Reporter(STATE.reporting)
