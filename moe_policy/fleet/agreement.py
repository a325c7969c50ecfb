"""Cross-rank agreement, the pure part: rank summaries in, one verdict and message out.

``moe_policy.fleet.distributed.check_agreement`` gathers one :func:`rank_summary` per rank
and calls :func:`compare_summaries` on every rank; the same gathered data gives the
same verdict and the same message everywhere. Layers are matched by signature
``(layer.kind, layer.index)``; ``layer.index`` is the rank-local context key and is
never compared as an input. No torch here.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from moe_policy.core.canonical import canonical_json
from moe_policy.core.decision import Decision
from moe_policy.core.keys import CONTEXT_KEYS, LAYER_KINDS
from moe_policy.errors import PolicyError

SUMMARY_VERSION = 1
MODES = ("error", "warn")
#: Context keys that legitimately differ between ranks (compared through the layer signature).
RANK_LOCAL_KEYS = frozenset(key for key, spec in CONTEXT_KEYS.items() if spec.rank_local)

Signature = tuple[str, "int | None"]


# --- Results --------------------------------------------------------------------------


@dataclass(frozen=True)
class ValueGroup:
    """One value of a differing input, the ranks that have it and where it came from."""

    value: Any
    ranks: tuple[int, ...]
    origins: tuple[str, ...] = ()
    #: For list values (``packages``): members other ranks have and these lack.
    lacking: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "value": self.value,
            "ranks": list(self.ranks),
            "origins": list(self.origins),
            "lacking": list(self.lacking),
        }


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
        return {
            "backend": self.backend,
            "experts_class": self.experts_class,
            "activation_format": self.activation_format,
            "fingerprint": self.fingerprint,
            "ranks": list(self.ranks),
        }


@dataclass(frozen=True)
class LayerMismatch:
    """Layers (same pattern of sides and differences) on which ranks differ."""

    layers: tuple[Signature, ...]
    sides: tuple[Side, ...]
    differences: tuple[KeyDifference, ...]

    def to_dict(self) -> dict[str, Any]:
        return {
            "layers": [list(s) for s in self.layers],
            "sides": [s.to_dict() for s in self.sides],
            "differences": [d.to_dict() for d in self.differences],
        }


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
            "agreed": self.agreed,
            "mode": self.mode,
            "rank": self.rank,
            "world_size": self.world_size,
            "ranks": list(self.ranks),
            "hosts": {str(r): h for r, h in sorted(self.hosts.items())},
            "layers": self.layers,
            "shared_layers": self.shared_layers,
            "ranks_without_layers": list(self.ranks_without_layers),
            "mismatches": [m.to_dict() for m in self.mismatches],
            "inputs_differ": [m.to_dict() for m in self.inputs_differ],
            "consistency": [v.to_dict() for v in self.consistency],
            "message": self.message,
        }


# --- Summaries (what each rank contributes) ---------------------------------------------


def _inputs_key(d: Decision) -> Any:
    """What the comparison reads from a decision, hashable (layers with equal inputs share it)."""
    return (
        tuple((k, v, o) for k, (v, o) in d.context.items() if k not in RANK_LOCAL_KEYS),
        (d.requested.backend, d.requested.origin) if d.requested else None,
        d.mode,
        tuple(d.policy_files),
        tuple(
            (r.id, r.effect, r.action, r.backends, r.matched, r.applied, r.origin) for r in d.rules
        ),
        d.library_version,
    )


def _jsonable(value: Any) -> Any:
    return [_jsonable(v) for v in value] if isinstance(value, (tuple, list)) else value


def _inputs(key: Any) -> dict[str, Any]:
    context, request, mode, files, rules, version = key
    return {
        "context": {k: [_jsonable(v), o] for k, v, o in sorted(context)},
        "request": _jsonable(request),
        "mode": mode,
        "policy": _jsonable(files),
        "rules": [
            [rid, effect, action, list(backends), matched, applied, origin]
            for rid, effect, action, backends, matched, applied, origin in rules
        ],
        "library_version": version,
    }


def local_mode(decisions: Sequence[Decision], mode: str | None) -> tuple[str, str] | None:
    """This rank's consistency mode and its origin; None when it has nothing to say."""
    if mode is not None:
        if mode not in MODES:
            raise PolicyError(
                f"consistency mode: expected one of {', '.join(MODES)}, got {mode!r}", "api:mode"
            )
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
        layers.append(
            [
                d.layer_kind,
                d.layer_index,
                d.fingerprint,
                d.backend,
                d.experts_class,
                d.activation_format,
                ref,
            ]
        )
    inputs = [_inputs(key) if isinstance(key, tuple) else json.loads(key) for key in refs]
    return {
        "v": SUMMARY_VERSION,
        "rank": rank,
        "host": host,
        "consistency": list(mode) if mode else None,
        "layers": layers,
        "inputs": inputs,
    }


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
        agreed=not mismatched,
        mode=mode,
        rank=rank,
        ranks=ranks,
        hosts=hosts,
        layers=len(by_sig),
        shared_layers=sum(1 for e in by_sig.values() if len(e) > 1),
        ranks_without_layers=tuple(r for r in ranks if not by_rank[r]["layers"]),
        mismatches=_grouped(mismatched),
        inputs_differ=_grouped(differing),
        consistency=consistency,
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


def _grouped(
    patterns: Mapping[str, list[tuple[Signature, tuple[Side, ...], tuple[KeyDifference, ...]]]],
) -> tuple[LayerMismatch, ...]:
    out = [
        LayerMismatch(tuple(sig for sig, _, _ in items), items[0][1], items[0][2])
        for items in patterns.values()
    ]
    return tuple(sorted(out, key=lambda m: _sig_order(m.layers[0])))


def _consistency_groups(modes: Sequence[tuple[int, Any]]) -> tuple[ValueGroup, ...]:
    groups: dict[Any, tuple[list[int], set[str]]] = {}
    for r, m in modes:
        if m:  # a rank without decisions states no mode
            ranks, origins = groups.setdefault(m[0], ([], set()))
            ranks.append(r)
            origins.add(str(m[1]))
    return tuple(
        sorted(
            (ValueGroup(v, tuple(rs), tuple(sorted(os_))) for v, (rs, os_) in groups.items()),
            key=lambda g: g.ranks,
        )
    )


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
        add(
            "policy.files",
            r,
            [sha for _, sha in policy],
            ", ".join(str(p) for p, _ in policy) or None,
        )
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
            ValueGroup(
                value,
                tuple(sorted(rs)),
                tuple(sorted(origins)),
                tuple(sorted(union - {str(v) for v in value or ()})) if is_list else (),
            )
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
    """Integers as ranges.

    >>> compress([7, 0, 1, 2, 3])
    '0–3, 7'
    """
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
        lines.append(
            f"MoE backends agree, but decision inputs differ across ranks on {count} layer(s):"
        )
        lines.extend(_mismatch_lines(report.inputs_differ, report.hosts))
    else:
        lines.append(
            f"MoE backends agree across {len(report.ranks)} ranks on {report.shared_layers} shared "
            f"layer(s) of {report.layers}"
        )
    if report.consistency:
        groups = "; ".join(
            f"{g.value}"
            + (f" from {', '.join(g.origins)}" if g.origins else "")
            + f" on {format_ranks(g.ranks, report.hosts)}"
            for g in report.consistency
        )
        lines.append(
            f"  `consistency` differs: {groups}; the strictest ({report.mode}) applies on every rank"
        )
    if report.mismatches and report.mode == "error":
        lines.append("  Every rank raises this error; set `consistency: warn` to log it instead.")
    return replace(report, message="\n".join(lines))


def _mismatch_lines(mismatches: Sequence[LayerMismatch], hosts: Mapping[int, str]) -> list[str]:
    lines = []
    for m in mismatches:
        lines.append(f"- {format_layers(m.layers)}:")
        for side in m.sides:
            extra = (
                ""
                if side.experts_class is None
                else f" ({side.experts_class}, {side.activation_format})"
            )
            lines.append(
                f"    {side.backend}{extra} on {format_ranks(side.ranks, hosts)} "
                f"[fingerprint {side.fingerprint[:12]}]"
            )
        if m.differences:
            lines.extend(f"    differs: {format_difference(d, hosts)}" for d in m.differences)
        else:
            lines.append(
                "    differs: only in what the fingerprint hashes beyond the record "
                "(policy rule conditions or the backend catalog)"
            )
    return lines
