"""Cross-rank agreement: every rank runs the same backend for each MoE layer, or start-up fails.

Call :func:`check_agreement` once, at an initialisation point that every rank of the
group reaches (after the MoE layers are built, before the first forward), with that
rank's per-layer decisions. It costs one collective round (``all_gather_object``, on
gloo or NCCL); each rank contributes a compact summary, and every rank compares the
same gathered data, so every rank reaches the same verdict and none waits on another.

What is compared
    Layers are matched by their signature ``(layer.kind, layer.index)`` and compared
    only among the ranks that hold them. The ranks *disagree* on a layer when its
    backend, experts class or activation format differ: that is what makes
    all-to-all and collective layouts diverge. When the backends agree but the
    fingerprints differ (some input differs without changing the outcome, e.g. a
    package no candidate needs), the check passes and logs
    ``moe_policy.decision_inputs_differ`` (warning), because that rank is one
    policy change away from disagreeing.

Rank-local context keys
    ``layer.index`` is rank-local (``CONTEXT_KEYS[key].rank_local``): under pipeline
    parallelism each stage owns a different layer range. It is left out of the
    fingerprint unless a policy rule decides on it, and it is compared through the
    signature: ranks that share no layer never disagree, and a rank without MoE
    layers (an empty list) only takes part in the collective. Every other context
    key is compared by value; origins (file paths, env names) are reported, never
    compared. Host name, rank, pid, time and policy-file paths are not inputs.

Mode
    ``consistency: error`` (default) raises :class:`DecisionMismatchError` on every
    rank; ``consistency: warn`` logs ``moe_policy.decision_mismatch`` (warning)
    instead. The mode comes from ``mode=`` or the decisions' ``consistency``
    setting; when ranks' modes differ, the strictest applies on every rank. The
    outcome is logged (``moe_policy.agreement``, info) and written to the audit sink
    as a ``kind: "agreement"`` record (one line per rank).

Importing this module never imports torch; ``check_agreement`` does, lazily (without
torch installed it checks this process alone).
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import os
import socket
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from moe_policy.core.decision import Decision
from moe_policy.core.values import is_decimal
from moe_policy.errors import MoEPolicyError, PolicyError
from moe_policy.fleet.agreement import (
    MODES,
    RANK_LOCAL_KEYS,
    AgreementReport,
    KeyDifference,
    LayerMismatch,
    Side,
    ValueGroup,
    compare_summaries,
    local_mode,
    rank_summary,
)
from moe_policy.reporting.audit import AuditSink, AuditWriteError
from moe_policy.reporting.events import get_logger


class DecisionMismatchError(MoEPolicyError, RuntimeError):
    """Ranks decided different backends for the same MoE layer (raised on every rank)."""

    def __init__(self, report: AgreementReport) -> None:
        self.report = report
        super().__init__(report.message)


class AgreementCheckError(MoEPolicyError, RuntimeError):
    """The check could not run on some rank (raised on every rank, after the one round)."""


def hostname() -> str:
    """This host's name (a function so tests can stand in for other hosts)."""
    return socket.gethostname()


# --- The collective ------------------------------------------------------------------------


def check_agreement(
    decisions: Iterable[Decision],
    group: Any = None,
    *,
    mode: str | None = None,
    audit: AuditSink | str | None = None,
) -> AgreementReport:
    """Gather every rank's decisions in one collective round and compare them per layer.

    Args:
        decisions: this rank's per-layer decisions; empty for a stage without MoE layers.
        group: a ``torch.distributed`` process group (default: the world).
        mode: ``error`` or ``warn``; default: the decisions' ``consistency`` setting.
        audit: a sink or path for the ``kind: "agreement"`` record; default: the
            decisions' ``audit.path`` setting.

    Raises:
        DecisionMismatchError: on every rank, when ranks run different backends for a
            layer and the (strictest) mode is ``error``.
        AgreementCheckError: on every rank, when some rank could not build its summary
            (e.g. a bad ``mode=``); that rank re-raises its own error. Either way every
            rank has taken part in the collective, so none is left waiting.
    """
    rank = _global_rank()
    failure: Exception | None = None
    sink: AuditSink | None = None
    try:
        # Inside the try: a generator of ``selector.select(i)`` calls may raise here (strict
        # mode, no feasible backend), and this rank must still take part in the gather.
        mine_decisions = list(decisions)
        mine = local_mode(mine_decisions, mode)
        summary = rank_summary(mine_decisions, rank=rank, host=hostname(), mode=mine)
        # A required audit this rank cannot open fails every rank, not this one alone.
        sink = _agreement_sink(mine_decisions, audit)
        if sink is not None and sink.required and (error := sink.check()) is not None:
            raise AuditWriteError.at(sink.path, error)
    except Exception as exc:  # reported to every rank through the gather, then raised
        failure, mine = exc, None
        summary = {"rank": rank, "host": hostname(), "problem": f"{type(exc).__name__}: {exc}"}
        if sink is not None and sink is not audit:
            sink.close()
    gathered = _all_gather(summary, group)
    if failure is not None:
        raise failure
    problems = [s for s in gathered if "problem" in s]
    if problems:
        raise AgreementCheckError(
            "; ".join(
                f"the agreement check failed on rank {s['rank']} ({s['host']}): {s['problem']}"
                for s in problems
            )
        )
    report = compare_summaries(gathered, rank=rank)
    _log(report)
    if sink is not None:
        _audit(report, sink, mine, close=sink is not audit)
    if not report.agreed and report.mode == "error":
        raise DecisionMismatchError(report)
    return report


def _initialised_dist() -> Any:
    """``torch.distributed`` when a process group is up; None without one (or without torch:
    the base install has none, and then this process is a group of one)."""
    try:
        import torch.distributed as dist
    except ImportError:
        return None
    return dist if dist.is_available() and dist.is_initialized() else None


def _global_rank() -> int:
    dist = _initialised_dist()
    return 0 if dist is None else int(dist.get_rank())


def _all_gather(summary: dict[str, Any], group: Any) -> list[dict[str, Any]]:
    dist = _initialised_dist()
    if dist is None:
        if group is not None:
            raise PolicyError(
                "a process group was given but torch.distributed is not initialised", "api:group"
            )
        return [summary]
    if group is not None and dist.get_rank(group) < 0:
        raise PolicyError("this rank is not a member of the given process group", "api:group")
    gathered: list[Any] = [None] * dist.get_world_size(group)
    with _collective_device(dist, group):
        dist.all_gather_object(gathered, summary, group=group)
    return gathered


@contextlib.contextmanager
def _collective_device(dist: Any, group: Any) -> Iterator[None]:
    """Pin the CUDA device for an NCCL-only group's object collective (gloo: nothing to do)."""
    backend = str(dist.get_backend(group)).lower()
    if "nccl" not in backend or "gloo" in backend:
        yield
        return
    import torch

    with torch.cuda.device(nccl_device(dist, torch, group)):
        yield


def nccl_device(dist: Any, torch: Any, group: Any) -> int:
    """The group's bound device, else a device set by the engine, else LOCAL_RANK's, else 0."""
    pg = group if group is not None else dist.group.WORLD
    bound = getattr(pg, "bound_device_id", None)
    if bound is not None and bound.index is not None:
        return int(bound.index)
    current = int(torch.cuda.current_device())
    local = os.environ.get("LOCAL_RANK", "")
    if current == 0 and is_decimal(local):
        return int(local) % max(1, int(torch.cuda.device_count()))
    return current


# --- Reporting -------------------------------------------------------------------------------


def _log(report: AgreementReport) -> None:
    log = get_logger()
    fields = {
        "agreed": report.agreed,
        "mode": report.mode,
        "rank": report.rank,
        "world_size": report.world_size,
        "layers": report.layers,
        "shared_layers": report.shared_layers,
        "ranks_without_layers": list(report.ranks_without_layers),
    }
    if report.mismatches:
        event = log.error if report.mode == "error" else log.warning
        event(
            "moe_policy.decision_mismatch",
            mismatched_layers=sum(len(m.layers) for m in report.mismatches),
            mismatches=[m.to_dict() for m in report.mismatches],
            detail=report.message,
            **fields,
        )
        return
    if report.inputs_differ:
        log.warning(
            "moe_policy.decision_inputs_differ",
            layers_with_differing_inputs=sum(len(m.layers) for m in report.inputs_differ),
            differences=[m.to_dict() for m in report.inputs_differ],
            detail=report.message,
            rank=report.rank,
            world_size=report.world_size,
        )
    log.info("moe_policy.agreement", **fields)


def agreement_record(report: AgreementReport, mode: tuple[str, str] | None) -> dict[str, Any]:
    """The audit line: ``kind: "agreement"``, the outcome, counts, mode, rank and world size."""
    return {
        "kind": "agreement",
        "schema_version": 1,
        "timestamp": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="microseconds"),
        "host": report.hosts.get(report.rank, hostname()),
        "pid": os.getpid(),
        "rank": report.rank,
        "world_size": report.world_size,
        "agreed": report.agreed,
        "mode": report.mode,
        "local_mode": None if mode is None else {"value": mode[0], "origin": mode[1]},
        "layers": report.layers,
        "shared_layers": report.shared_layers,
        "mismatched_layers": [list(sig) for m in report.mismatches for sig in m.layers],
        "inputs_differ_layers": [list(sig) for m in report.inputs_differ for sig in m.layers],
        "ranks_without_layers": list(report.ranks_without_layers),
        "message": None if report.agreed and not report.inputs_differ else report.message,
    }


def _agreement_sink(
    decisions: Sequence[Decision], audit: AuditSink | str | None
) -> AuditSink | None:
    """The sink for the agreement line: ``audit=``, else the decisions' ``audit.path``."""
    if isinstance(audit, AuditSink):
        return audit
    if isinstance(audit, str):
        return AuditSink(audit)
    settings = next(
        (d.run_settings for d in decisions if d.run_settings.get("audit.path", (None,))[0]),
        None,
    )
    if settings is None:
        return None
    return AuditSink(
        str(settings["audit.path"][0]), bool(settings.get("audit.required", (False,))[0])
    )


def _audit(
    report: AgreementReport, sink: AuditSink, mode: tuple[str, str] | None, *, close: bool
) -> None:
    error = sink.write(agreement_record(report, mode))
    if close:
        sink.close()
    if error is None:
        return
    if sink.required:
        raise AuditWriteError.at(sink.path, error)
    get_logger().warning(
        "moe_policy.audit_failed",
        path=sink.path,
        error=str(error),
        detail="agreement outcome returned without an audit line",
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
