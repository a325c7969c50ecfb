"""The human form of ``moe-policy explain``: ladder, settings, context, candidates, rules, decision."""

from __future__ import annotations

import textwrap

from moe_policy.api import Explanation
from moe_policy.cli.table import WIDTH, heading, table, value_text
from moe_policy.core.decision import Candidate, Decision, RuleRecord, Status
from moe_policy.settings import Resolved, Settings

#: How the model file's origins are shortened in the context table (legend printed).
MODEL_MARK = "<model>"


def _origin_and_beaten(origin: str, resolved: Resolved | None) -> str:
    """The winning origin, then each value it beat (latest first)."""
    lines = [origin]
    if resolved is not None:
        lines.extend(f"  beat {value_text(v)} ({o})" for v, o, _layer in reversed(resolved.history))
    return "\n".join(lines)


def ladder(settings: Settings) -> str:
    """The layers, lowest first, and every policy file looked at."""
    rows = [
        (info.layer, info.path, "found" if info.found else "missing", (info.sha256 or "")[:12])
        for info in settings.files
    ]
    return "\n".join(
        [
            heading("Settings ladder", "later wins: " + " < ".join(settings.layers)),
            table(rows, ("layer", "policy file", "status", "sha256"), (12, 58, 8, 12)),
        ]
    )


def settings_table(settings: Settings) -> str:
    """Each settings key: winning value, its origin and the values it beat."""
    rows = [
        (key, value_text(r.value), _origin_and_beaten(r.origin, r))
        for key, r in sorted(settings.values.items())
    ]
    return "\n".join(
        [
            heading("Settings", "winning value and origin; beat = the values it overrode"),
            table(rows, ("key", "value", "origin"), (16, 30, 50)),
        ]
    )


def context_table(explanation: Explanation, model: str) -> str:
    """Every context fact with its origin (and, for flags and env, what it beat)."""
    prefix = f"file:{model}:"
    rows = []
    for key, (value, origin) in sorted(explanation.decision.context.items()):
        shown = MODEL_MARK + origin[len(prefix) - 1 :] if origin.startswith(prefix) else origin
        rows.append(
            (
                key,
                value_text(value),
                _origin_and_beaten(shown, explanation.settings.context.get(key)),
            )
        )
    return "\n".join(
        [
            heading("Context", "the facts the decision is made from"),
            f"{MODEL_MARK} = file:{model}",
            table(rows, ("key", "value", "origin"), (37, 20, 39)),
        ]
    )


def _status(cand: Candidate) -> str:
    lines = ["SELECTED" if cand.status is Status.SELECTED else cand.status.value]
    if cand.pass_name:
        lines.append(f"in {cand.pass_name}")
    if cand.requested:
        lines.append("(requested)")
    if not cand.listed and cand.status is not Status.ELIMINATED:
        lines.append("(request only)")
    return "\n".join(lines)


def candidates_table(decision: Decision) -> str:
    """Every backend: status, the pass that decided it, the reason and its detail."""
    rows = [
        (
            cand.backend,
            _status(cand),
            cand.reason_code.value if cand.reason_code else "",
            cand.detail,
        )
        for cand in decision.candidates
    ]
    return "\n".join(
        [
            heading(
                "Candidates", "final order: the first live listed one runs, or the requested one"
            ),
            table(rows, ("backend", "status", "reason", "detail"), (18, 15, 29, 32)),
        ]
    )


def _rule_result(rule: RuleRecord) -> str:
    if rule.missing_context:
        return "not matched:\nmissing context\n" + "\n".join(rule.missing_context)
    if not rule.matched:
        return "not matched"
    if rule.action == "audit":
        return "matched\n(audit only:\nchanged nothing)"
    return "APPLIED"


def rules_table(explanation: Explanation) -> str:
    """The rules in evaluation order with where they are written, and replaced rules."""
    rows = [
        (f"{r.id}\n{r.origin}", f"{r.effect} " + ", ".join(r.backends), _rule_result(r))
        for r in explanation.decision.rules
    ]
    parts = [
        heading("Rules", "in order; a matched rule applies unless its action is audit"),
        table(rows, ("rule / where", "effect", "result"), (52, 26, 16)),
    ]
    for old, new in explanation.settings.replaced_rules:
        parts.append(
            _fill(f"rule {old.id} at {old.origin} was replaced by the one at {new.origin}")
        )
    return "\n".join(parts)


def _fill(text: str, label: str = "") -> str:
    return textwrap.fill(
        f"{label:<13}{text}" if label else text,
        WIDTH,
        subsequent_indent=" " * 13,
        break_on_hyphens=False,
    )


def decision_block(explanation: Explanation) -> str:
    """The decision, the override if any, and what strict mode would do."""
    d = explanation.decision
    lines = [heading("Decision")]
    if d.backend is None:
        lines.append(_fill("none: no backend can run this layer (exit 4)", "backend:"))
    else:
        where = "implemented here" if d.implemented_here else "provided by the engine"
        lines.append(
            _fill(
                f"{d.backend} ({d.experts_class}; {d.activation_format} format; {where})",
                "backend:",
            )
        )
    requested = (
        f" (requested {d.requested.backend} via {d.requested.origin})" if d.requested else ""
    )
    lines.append(_fill(f"{d.outcome.value}{requested}", "outcome:"))
    for a in d.adaptations:
        lines.append(_fill(f"{a.requested} -> {a.adapted_to}: {a.reason}", "adapted:"))
    for o in d.overrides:
        rule = f", rule {o.rule}" if o.rule else ""
        lines.append(
            _fill(
                f"{o.requested} -> {o.selected or 'nothing'}: {o.reason_code.value} (pass {o.pass_name}{rule}): "
                f"{o.detail}",
                "override:",
            )
        )
    lines.append(_fill(d.mode, "mode:"))
    lines.append(_fill(explanation.strict_outcome, "strict mode:"))
    lines.append(
        _fill(
            f"{d.fingerprint[:16]}  (decision id {d.decision_id}, moe_policy {d.library_version})",
            "fingerprint:",
        )
    )
    return "\n".join(lines)


def notices_block(decision: Decision) -> str:
    """Knobs that are deprecated, ignored or without effect."""
    if not decision.notices:
        return ""
    rows = [(n.origin, n.detail, n.replacement) for n in decision.notices]
    return "\n".join(
        [
            heading("Notices", "settings that are deprecated, ignored or have no effect"),
            table(rows, ("origin", "detail", "use instead"), (34, 34, 26)),
        ]
    )


def render(explanation: Explanation, model: str) -> str:
    """The whole human report, sections separated by blank lines."""
    d = explanation.decision
    sections = [
        _fill(f"moe-policy explain: {model}, {d.layer_label()}"),
        ladder(explanation.settings),
        settings_table(explanation.settings),
        context_table(explanation, model),
        candidates_table(d),
        rules_table(explanation),
        notices_block(d),
        decision_block(explanation),
    ]
    return "\n\n".join(s for s in sections if s) + "\n"
