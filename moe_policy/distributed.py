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

Importing this module never imports torch; ``check_agreement`` does, lazily.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import os
import socket
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from moe_policy.audit import AuditSink, AuditWriteError
from moe_policy.context import CONTEXT_KEYS, LAYER_KINDS
from moe_policy.decision import Decision, canonical_json
from moe_policy.errors import MoEPolicyError, PolicyError
from moe_policy.events import get_logger

SUMMARY_VERSION = 1
MODES = ("error", "warn")
#: Context keys that legitimately differ between ranks (compared through the layer signature).
RANK_LOCAL_KEYS = frozenset(key for key, spec in CONTEXT_KEYS.items() if spec.rank_local)

Signature = tuple[str, "int | None"]


# --- Results --------------------------------------------------------------------------


class DecisionMismatchError(MoEPolicyError, RuntimeError):
    """Ranks decided different backends for the same MoE layer (raised on every rank)."""

    def __init__(self, report: AgreementReport) -> None:
        self.report = report
        super().__init__(report.message)


@dataclass(frozen=True)
class ValueGroup:
    """One value of a differing input, the ranks that have it and where it came from."""

    value: Any
    ranks: tuple[int, ...]
    origins: tuple[str, ...] = ()
    #: For list values (``packages``): members other ranks have and these lack.
    lacking: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"value": self.value, "ranks": list(self.ranks), "origins": list(self.origins),
                "lacking": list(self.lacking)}


@dataclass(frozen=True)
class KeyDifference:
    """An input that differs: a context key, ``request``, ``mode``, ``policy.files``, ``rule <id>``."""

    key: str
    values: tuple[ValueGroup, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"key": self.key, "values": [v.to_dict() for v in self.values]}


@dataclass(frozen=True)
class Side:
    """Ranks that decided one way for a layer."""

    backend: str | None
    experts_class: str | None
    activation_format: str
    fingerprint: str
    ranks: tuple[int, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"backend": self.backend, "experts_class": self.experts_class,
                "activation_format": self.activation_format, "fingerprint": self.fingerprint,
                "ranks": list(self.ranks)}


@dataclass(frozen=True)
class LayerMismatch:
    """Layers (same pattern of sides and differences) on which ranks differ."""

    layers: tuple[Signature, ...]
    sides: tuple[Side, ...]
    differences: tuple[KeyDifference, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"layers": [list(s) for s in self.layers], "sides": [s.to_dict() for s in self.sides],
                "differences": [d.to_dict() for d in self.differences]}


@dataclass(frozen=True)
class AgreementReport:
    """The verdict, identical on every rank (except ``rank``)."""

    agreed: bool
    mode: str
    rank: int
    ranks: tuple[int, ...]
    hosts: Mapping[int, str]
    layers: int
    shared_layers: int
    ranks_without_layers: tuple[int, ...]
    mismatches: tuple[LayerMismatch, ...] = ()
    inputs_differ: tuple[LayerMismatch, ...] = ()
    consistency: tuple[ValueGroup, ...] = ()
    message: str = ""

    @property
    def world_size(self) -> int:
        return len(self.ranks)

    def to_dict(self) -> dict[str, Any]:
        return {
            "agreed": self.agreed, "mode": self.mode, "rank": self.rank,
            "world_size": self.world_size, "ranks": list(self.ranks),
            "hosts": {str(r): h for r, h in sorted(self.hosts.items())},
            "layers": self.layers, "shared_layers": self.shared_layers,
            "ranks_without_layers": list(self.ranks_without_layers),
            "mismatches": [m.to_dict() for m in self.mismatches],
            "inputs_differ": [m.to_dict() for m in self.inputs_differ],
            "consistency": [v.to_dict() for v in self.consistency],
            "message": self.message,
        }


# --- Summaries (what each rank contributes) ---------------------------------------------


def hostname() -> str:
    """This host's name (a function so tests can stand in for other hosts)."""
    return socket.gethostname()


def _inputs_key(d: Decision) -> Any:
    """What the comparison reads from a decision, hashable (layers with equal inputs share it)."""
    return (
        tuple((k, v, o) for k, (v, o) in d.context.items() if k not in RANK_LOCAL_KEYS),
        (d.requested.backend, d.requested.origin) if d.requested else None,
        d.mode,
        tuple(d.policy_files),
        tuple((r.id, r.effect, r.action, r.backends, r.matched, r.applied, r.origin) for r in d.rules),
        d.library_version,
    )


def _jsonable(value: Any) -> Any:
    return [_jsonable(v) for v in value] if isinstance(value, (tuple, list)) else value


def _inputs(key: Any) -> dict[str, Any]:
    context, request, mode, files, rules, version = key
    return {
        "context": {k: [_jsonable(v), o] for k, v, o in sorted(context)},
        "request": _jsonable(request), "mode": mode, "policy": _jsonable(files),
        "rules": [[rid, effect, action, list(backends), matched, applied, origin]
                  for rid, effect, action, backends, matched, applied, origin in rules],
        "library_version": version,
    }


def local_mode(decisions: Sequence[Decision], mode: str | None) -> tuple[str, str] | None:
    """This rank's consistency mode and its origin; None when it has nothing to say."""
    if mode is not None:
        if mode not in MODES:
            raise PolicyError(f"consistency mode: expected one of {', '.join(MODES)}, got {mode!r}", "api:mode")
        return mode, "api:mode"
    found = [d.run_settings["consistency"] for d in decisions if "consistency" in d.run_settings]
    if not found:
        return None
    return min(found, key=lambda item: MODES.index(str(item[0])))


def rank_summary(
    decisions: Sequence[Decision], *, rank: int, host: str, mode: tuple[str, str] | None
) -> dict[str, Any]:
    """The compact, JSON-serialisable summary one rank contributes to the gather."""
    layers = []
    refs: dict[Any, int] = {}
    for d in decisions:
        try:
            ref = refs.setdefault(_inputs_key(d), len(refs))
        except TypeError:  # an unhashable context value: key by its canonical JSON instead
            ref = refs.setdefault(canonical_json(_inputs(_inputs_key(d))), len(refs))
        layers.append([d.layer_kind, d.layer_index, d.fingerprint, d.backend, d.experts_class,
                       d.activation_format, ref])
    inputs = [_inputs(key) if isinstance(key, tuple) else json.loads(key) for key in refs]
    return {"v": SUMMARY_VERSION, "rank": rank, "host": host,
            "consistency": list(mode) if mode else None, "layers": layers, "inputs": inputs}


# --- Comparison (pure: the same gathered data gives the same verdict on every rank) -----


def compare_summaries(summaries: Sequence[Mapping[str, Any]], *, rank: int) -> AgreementReport:
    """Compare every rank's summary; the verdict and message do not depend on ``rank``."""
    ranks = tuple(sorted(int(s["rank"]) for s in summaries))
    hosts = {int(s["rank"]): str(s["host"]) for s in summaries}
    by_rank = {int(s["rank"]): s for s in summaries}
    modes = [(r, by_rank[r]["consistency"]) for r in ranks]
    stated = [m[0] for _, m in modes if m]
    mode = "warn" if stated and all(m == "warn" for m in stated) else "error"
    by_sig: dict[Signature, list[tuple[int, list[Any]]]] = {}
    for r in ranks:
        for layer in by_rank[r]["layers"]:
            by_sig.setdefault((str(layer[0]), layer[1]), []).append((r, layer))
    mismatched: dict[str, list[tuple[Signature, tuple[Side, ...], tuple[KeyDifference, ...]]]] = {}
    differing: dict[str, list[tuple[Signature, tuple[Side, ...], tuple[KeyDifference, ...]]]] = {}
    for sig in sorted(by_sig, key=_sig_order):
        entries = by_sig[sig]
        outcomes = {tuple(layer[3:6]) for _, layer in entries}
        prints = {layer[2] for _, layer in entries}
        if len(outcomes) == 1 and len(prints) == 1:
            continue
        sides = _sides(entries)
        diffs = _differences([(r, by_rank[r]["inputs"][layer[6]]) for r, layer in entries])
        target = mismatched if len(outcomes) > 1 else differing
        pattern = canonical_json([s.to_dict() for s in sides] + [d.to_dict() for d in diffs])
        target.setdefault(pattern, []).append((sig, sides, diffs))
    consistency = _consistency_groups(modes) if len(set(stated)) > 1 else ()
    report = AgreementReport(
        agreed=not mismatched, mode=mode, rank=rank, ranks=ranks, hosts=hosts, layers=len(by_sig),
        shared_layers=sum(1 for e in by_sig.values() if len(e) > 1),
        ranks_without_layers=tuple(r for r in ranks if not by_rank[r]["layers"]),
        mismatches=_grouped(mismatched), inputs_differ=_grouped(differing), consistency=consistency,
    )
    return _with_message(report)


def _sig_order(sig: Signature) -> tuple[int, str, int]:
    kind = LAYER_KINDS.index(sig[0]) if sig[0] in LAYER_KINDS else len(LAYER_KINDS)
    return kind, sig[0], -1 if sig[1] is None else int(sig[1])


def _sides(entries: Sequence[tuple[int, list[Any]]]) -> tuple[Side, ...]:
    groups: dict[tuple[Any, ...], list[int]] = {}
    for r, layer in entries:
        groups.setdefault((layer[3], layer[4], layer[5], layer[2]), []).append(r)
    sides = [Side(b, ec, fmt, fp, tuple(sorted(rs))) for (b, ec, fmt, fp), rs in groups.items()]
    return tuple(sorted(sides, key=lambda s: s.ranks))


def _grouped(patterns: Mapping[str, list[tuple[Signature, tuple[Side, ...], tuple[KeyDifference, ...]]]]
             ) -> tuple[LayerMismatch, ...]:
    out = [LayerMismatch(tuple(sig for sig, _, _ in items), items[0][1], items[0][2])
           for items in patterns.values()]
    return tuple(sorted(out, key=lambda m: _sig_order(m.layers[0])))


def _consistency_groups(modes: Sequence[tuple[int, Any]]) -> tuple[ValueGroup, ...]:
    groups: dict[Any, tuple[list[int], set[str]]] = {}
    for r, m in modes:
        if m:  # a rank without decisions states no mode
            ranks, origins = groups.setdefault(m[0], ([], set()))
            ranks.append(r)
            origins.add(str(m[1]))
    return tuple(sorted((ValueGroup(v, tuple(rs), tuple(sorted(os_))) for v, (rs, os_) in groups.items()),
                        key=lambda g: g.ranks))


def _differences(per_rank: Sequence[tuple[int, Mapping[str, Any]]]) -> tuple[KeyDifference, ...]:
    """Every input whose value differs between the given ranks, with the ranks on each side."""
    facets: dict[str, list[tuple[int, Any, str | None]]] = {}

    def add(key: str, r: int, value: Any, origin: str | None) -> None:
        facets.setdefault(key, []).append((r, value, origin))

    for r, inputs in per_rank:
        for key, (value, origin) in inputs["context"].items():
            add(key, r, value, origin)
        request = inputs.get("request")
        add("request", r, request[0] if request else None, request[1] if request else None)
        add("mode", r, inputs.get("mode"), None)
        add("library_version", r, inputs.get("library_version"), None)
        policy = inputs.get("policy") or []
        add("policy.files", r, [sha for _, sha in policy], ", ".join(str(p) for p, _ in policy) or None)
        for rule in inputs.get("rules") or []:
            add(f"rule {rule[0]}", r, rule[1:6], rule[6])
    all_ranks = [r for r, _ in per_rank]
    diffs = []
    for key in sorted(facets, key=_key_order):
        items = facets[key]
        for r in all_ranks:  # a rule present on some ranks only: absent elsewhere
            if key.startswith("rule ") and r not in {i[0] for i in items}:
                items.append((r, None, None))
        groups: dict[str, tuple[Any, list[int], set[str]]] = {}
        for r, value, origin in items:
            _, rs, origins = groups.setdefault(canonical_json(value), (value, [], set()))
            rs.append(r)
            if origin:
                origins.add(origin)
        if len(groups) < 2:
            continue
        is_list = key in CONTEXT_KEYS and CONTEXT_KEYS[key].type == "list"
        union = {str(v) for value, _, _ in groups.values() if is_list and value for v in value}
        values = [
            ValueGroup(value, tuple(sorted(rs)), tuple(sorted(origins)),
                       tuple(sorted(union - {str(v) for v in value or ()})) if is_list else ())
            for value, rs, origins in groups.values()
        ]
        diffs.append(KeyDifference(key, tuple(sorted(values, key=lambda g: g.ranks))))
    return tuple(diffs)


def _key_order(key: str) -> tuple[int, str]:
    first = ("request", "mode", "policy.files", "library_version")
    if key in first:
        return first.index(key), key
    return (len(first) + 1 if key.startswith("rule ") else len(first)), key


# --- Messages ----------------------------------------------------------------------------


def compress(numbers: Iterable[int]) -> str:
    """``[0, 1, 2, 3, 7]`` -> ``"0–3, 7"``."""
    values = sorted(set(numbers))
    parts: list[str] = []
    i = 0
    while i < len(values):
        j = i
        while j + 1 < len(values) and values[j + 1] == values[j] + 1:
            j += 1
        parts.append(str(values[i]) if i == j else f"{values[i]}–{values[j]}")
        i = j + 1
    return ", ".join(parts)


def format_ranks(ranks: Sequence[int], hosts: Mapping[int, str]) -> str:
    """``ranks 4–7 (host-b)``; several hosts: ``ranks 0–3 (host-a), 8–11 (host-c)``."""
    by_host: dict[str, list[int]] = {}
    for r in sorted(ranks):
        by_host.setdefault(hosts.get(r, "?"), []).append(r)
    word = "rank" if len(ranks) == 1 else "ranks"
    return word + " " + ", ".join(f"{compress(rs)} ({host})" for host, rs in by_host.items())


def format_layers(layers: Sequence[Signature]) -> str:
    """``layers moe 0–47, draft 48``; a layer without index is ``layer moe``."""
    by_kind: dict[str, list[int | None]] = {}
    for kind, index in layers:
        by_kind.setdefault(kind, []).append(index)
    parts = []
    for kind, indexes in by_kind.items():
        known = [i for i in indexes if i is not None]
        text = kind + (f" {compress(known)}" if known else "")
        parts.append(text)
    word = "layer" if len(layers) == 1 else "layers"
    return f"{word} {', '.join(parts)}"


def _value_text(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, list):
        return "[" + ", ".join(str(v) for v in value) + "]"
    return str(value)


def format_difference(diff: KeyDifference, hosts: Mapping[int, str]) -> str:
    """``packages: [torch, triton] (probe) on ranks 4–7 (host-b), lacking flashinfer; ...``."""
    parts = []
    for group in diff.values:
        value = group.value
        if diff.key == "policy.files" and isinstance(value, list):
            value = [str(v)[:12] for v in value]
        elif diff.key.startswith("rule ") and isinstance(value, list):
            value = f"{value[0]} {value[2]} ({'matched' if value[3] else 'not matched'})"
        text = f"{_value_text(value)}"
        if group.origins:
            text += f" from {', '.join(group.origins)}"
        text += f" on {format_ranks(group.ranks, hosts)}"
        if group.lacking:
            text += f", lacking {', '.join(group.lacking)}"
        parts.append(text)
    return f"`{diff.key}`: " + "; ".join(parts)


def _with_message(report: AgreementReport) -> AgreementReport:
    lines: list[str] = []
    if report.mismatches:
        count = sum(len(m.layers) for m in report.mismatches)
        lines.append(
            f"MoE backends disagree across ranks on {count} layer(s) "
            f"(consistency: {report.mode}; {len(report.ranks)} ranks):"
        )
        lines.extend(_mismatch_lines(report.mismatches, report.hosts))
    elif report.inputs_differ:
        count = sum(len(m.layers) for m in report.inputs_differ)
        lines.append(f"MoE backends agree, but decision inputs differ across ranks on {count} layer(s):")
        lines.extend(_mismatch_lines(report.inputs_differ, report.hosts))
    else:
        lines.append(
            f"MoE backends agree across {len(report.ranks)} ranks on {report.shared_layers} shared "
            f"layer(s) of {report.layers}"
        )
    if report.consistency:
        groups = "; ".join(
            f"{g.value}" + (f" from {', '.join(g.origins)}" if g.origins else "")
            + f" on {format_ranks(g.ranks, report.hosts)}"
            for g in report.consistency
        )
        lines.append(f"  `consistency` differs: {groups}; the strictest ({report.mode}) applies on every rank")
    if report.mismatches and report.mode == "error":
        lines.append("  Every rank raises this error; set `consistency: warn` to log it instead.")
    return replace(report, message="\n".join(lines))


def _mismatch_lines(mismatches: Sequence[LayerMismatch], hosts: Mapping[int, str]) -> list[str]:
    lines = []
    for m in mismatches:
        lines.append(f"- {format_layers(m.layers)}:")
        for side in m.sides:
            extra = "" if side.experts_class is None else f" ({side.experts_class}, {side.activation_format})"
            lines.append(f"    {side.backend}{extra} on {format_ranks(side.ranks, hosts)} "
                         f"[fingerprint {side.fingerprint[:12]}]")
        if m.differences:
            lines.extend(f"    differs: {format_difference(d, hosts)}" for d in m.differences)
        else:
            lines.append("    differs: only in what the fingerprint hashes beyond the record "
                         "(policy rule conditions or the backend catalog)")
    return lines


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
    """
    decisions = list(decisions)
    mine = local_mode(decisions, mode)
    rank = _global_rank()
    summary = rank_summary(decisions, rank=rank, host=hostname(), mode=mine)
    report = compare_summaries(_all_gather(summary, group), rank=rank)
    _log(report)
    _audit(report, decisions, audit, mine)
    if not report.agreed and report.mode == "error":
        raise DecisionMismatchError(report)
    return report


def _global_rank() -> int:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return int(dist.get_rank())
    return 0


def _all_gather(summary: dict[str, Any], group: Any) -> list[dict[str, Any]]:
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        if group is not None:
            raise PolicyError("a process group was given but torch.distributed is not initialised", "api:group")
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
    if current == 0 and local.isdigit():
        return int(local) % max(1, int(torch.cuda.device_count()))
    return current


# --- Reporting -------------------------------------------------------------------------------


def _log(report: AgreementReport) -> None:
    log = get_logger()
    fields = {
        "agreed": report.agreed, "mode": report.mode, "rank": report.rank,
        "world_size": report.world_size, "layers": report.layers,
        "shared_layers": report.shared_layers,
        "ranks_without_layers": list(report.ranks_without_layers),
    }
    if report.mismatches:
        event = log.error if report.mode == "error" else log.warning
        event("moe_policy.decision_mismatch",
              mismatched_layers=sum(len(m.layers) for m in report.mismatches),
              mismatches=[m.to_dict() for m in report.mismatches], detail=report.message, **fields)
        return
    if report.inputs_differ:
        log.warning("moe_policy.decision_inputs_differ",
                    layers_with_differing_inputs=sum(len(m.layers) for m in report.inputs_differ),
                    differences=[m.to_dict() for m in report.inputs_differ], detail=report.message,
                    rank=report.rank, world_size=report.world_size)
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


def _audit(report: AgreementReport, decisions: Sequence[Decision], audit: AuditSink | str | None,
           mode: tuple[str, str] | None) -> None:
    sink = audit
    if sink is None:
        settings = next(
            (d.run_settings for d in decisions if d.run_settings.get("audit.path", (None,))[0]), None
        )
        if settings is None:
            return
        sink = AuditSink(str(settings["audit.path"][0]), bool(settings.get("audit.required", (False,))[0]))
    elif isinstance(sink, str):
        sink = AuditSink(sink)
    error = sink.write(agreement_record(report, mode))
    if audit is None or isinstance(audit, str):
        sink.close()
    if error is None:
        return
    if sink.required:
        raise AuditWriteError(f"audit log {sink.path!r} could not be written: {error}")
    get_logger().warning("moe_policy.audit_failed", path=sink.path, error=str(error),
                         detail="agreement outcome returned without an audit line")


__all__ = [
    "MODES", "RANK_LOCAL_KEYS", "AgreementReport", "DecisionMismatchError", "KeyDifference",
    "LayerMismatch", "Side", "ValueGroup", "check_agreement", "compare_summaries", "rank_summary",
]
