"""The human form of ``moe-policy explain``: ladder, settings, context, candidates, rules, decision."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from moe_policy.api import Explanation
from moe_policy.cli.table import WIDTH, fill, heading, paint_column, table, value_text, wrap
from moe_policy.cli.terminal import PLAIN, Style
from moe_policy.core.decision import Candidate, Decision, RuleRecord, Status
from moe_policy.settings import Resolved, Settings

#: How the model file's origins are shortened in the context table (legend printed).
MODEL_MARK = "<model>"
#: The width of the labels of the decision block (``strict mode:`` and its gap).
LABEL = 13


@dataclass(frozen=True)
class Layout:
    """How the report is laid out: its width in columns, its colours, and whether it shows
    every detail (``explain -v``: each candidate's experts class where it has several,
    the whole sha256 of each policy file and the whole fingerprint)."""

    width: int = WIDTH
    style: Style = PLAIN
    verbose: bool = False

    def heading(self, title: str, note: str = "") -> str:
        return "\n".join(map(self.style.bold, heading(title, note, self.width).splitlines()))


def _origin_and_beaten(origin: str, resolved: Resolved | None) -> str:
    """The winning origin, then each value it beat (latest first)."""
    lines = [origin]
    if resolved is not None:
        lines.extend(f"  beat {value_text(v)} ({o})" for v, o, _layer in reversed(resolved.history))
    return "\n".join(lines)


def ladder(settings: Settings, layout: Layout = Layout()) -> str:
    """The layers, lowest first, and every policy file looked at."""
    rows = [
        (
            info.layer,
            info.path,
            "found" if info.found else "missing",
            (info.sha256 or "") if layout.verbose else (info.sha256 or "")[:12],
        )
        for info in settings.files
    ]
    return "\n".join(
        [
            layout.heading("Settings ladder", "later wins: " + " < ".join(settings.layers)),
            table(rows, ("layer", "policy file", "status", "sha256"), total=layout.width),
        ]
    )


def settings_table(settings: Settings, layout: Layout = Layout()) -> str:
    """Each settings key: winning value, its origin and the values it beat."""
    rows = [
        (key, value_text(r.value), _origin_and_beaten(r.origin, r))
        for key, r in sorted(settings.values.items())
    ]
    return "\n".join(
        [
            layout.heading("Settings", "winning value and origin; beat = the values it overrode"),
            table(rows, ("key", "value", "origin"), total=layout.width),
        ]
    )


def _model_file(explanation: Explanation) -> str | None:
    """The file the model keys were read from (a bundled name or a directory resolved)."""
    for key, (_value, origin) in sorted(explanation.decision.context.items()):
        if key.startswith("model.") and origin.startswith("file:"):
            path, sep, _position = origin[len("file:") :].rpartition(":")
            path, sep, _line = path.rpartition(":") if sep else ("", "", "")
            if sep and path:
                return path
    return None


def context_table(explanation: Explanation, model: str, layout: Layout = Layout()) -> str:
    """Every context fact with its origin (and, for flags and env, what it beat)."""
    model_file = _model_file(explanation) or model
    prefix = f"file:{model_file}:"
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
            layout.heading("Context", "the facts the decision is made from"),
            wrap(f"{MODEL_MARK} = file:{model_file}", layout.width),
            table(rows, ("key", "value", "origin"), total=layout.width),
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


def _paint_status(style: Style) -> Callable[[str], str]:
    def paint(word: str) -> str:
        if word == "SELECTED":
            return style.good(word)
        return style.dim(word) if word == "eliminated" else word

    return paint


def candidates_table(decision: Decision, layout: Layout = Layout()) -> str:
    """Every backend: status, the pass that decided it, the reason and its detail."""
    rows = [
        (
            f"{cand.backend}\n{cand.experts_class}"
            if layout.verbose and cand.experts_class
            else cand.backend,
            _status(cand),
            cand.reason_code.value if cand.reason_code else "",
            cand.detail,
        )
        for cand in decision.candidates
    ]
    return "\n".join(
        [
            layout.heading(
                "Candidates", "final order: the first live listed one runs, or the requested one"
            ),
            paint_column(
                table(rows, ("backend", "status", "reason", "detail"), total=layout.width),
                1,
                _paint_status(layout.style),
            ),
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


def rules_table(explanation: Explanation, layout: Layout = Layout()) -> str:
    """The rules in evaluation order with where they are written, and replaced rules."""
    rows = [
        (f"{r.id}\n{r.origin}", f"{r.effect} " + ", ".join(r.backends), _rule_result(r))
        for r in explanation.decision.rules
    ]
    parts = [
        layout.heading("Rules", "in order; a matched rule applies unless its action is audit"),
        paint_column(
            table(rows, ("rule / where", "effect", "result"), total=layout.width),
            2,
            lambda word: layout.style.good(word) if word == "APPLIED" else word,
        ),
    ]
    for old, new in explanation.settings.replaced_rules:
        parts.append(
            fill(
                f"rule {old.id} at {old.origin} was replaced by the one at {new.origin}",
                layout.width,
            )
        )
    return "\n".join(parts)


def decision_block(explanation: Explanation, layout: Layout = Layout()) -> str:
    """The decision, the override if any, and what strict mode would do."""
    d = explanation.decision
    style = layout.style

    def _fill(text: str, label: str, paint: Callable[[str], str] = style.bold) -> str:
        filled = fill(f"{label:<{LABEL}}{text}", layout.width, indent=LABEL)
        return paint(label) + filled[len(label) :]

    lines = [layout.heading("Decision")]
    if d.backend is None:
        lines.append(_fill("none: no backend can run this layer (exit 4)", "backend:", style.bad))
    else:
        where = "implemented here" if d.implemented_here else "provided by the engine"
        lines.append(
            _fill(
                f"{d.backend} ({d.experts_class}; {d.activation_format} format; {where})",
                "backend:",
                style.good,
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
                style.warn,
            )
        )
    lines.append(_fill(d.mode, "mode:"))
    strict = explanation.strict_outcome
    lines.append(
        _fill(strict, "strict mode:", style.bad if strict.startswith("refuse") else style.bold)
    )
    lines.append(
        _fill(
            f"{d.fingerprint if layout.verbose else d.fingerprint[:16]}  (decision id {d.decision_id}, moe_policy {d.library_version})",
            "fingerprint:",
        )
    )
    return "\n".join(lines)


def notices_block(decision: Decision, layout: Layout = Layout()) -> str:
    """Knobs that are deprecated, ignored or without effect."""
    if not decision.notices:
        return ""
    rows = [(n.origin, n.detail, n.replacement) for n in decision.notices]
    return "\n".join(
        [
            layout.heading("Notices", "settings that are deprecated, ignored or have no effect"),
            table(rows, ("origin", "detail", "use instead"), total=layout.width),
        ]
    )


def render(explanation: Explanation, model: str, layout: Layout = Layout()) -> str:
    """The whole human report, sections separated by blank lines."""
    d = explanation.decision
    sections = [
        fill(f"moe-policy explain: {model}, {d.layer_label()}", layout.width, indent=2),
        ladder(explanation.settings, layout),
        settings_table(explanation.settings, layout),
        context_table(explanation, model, layout),
        candidates_table(d, layout),
        rules_table(explanation, layout),
        notices_block(d, layout),
        decision_block(explanation, layout),
    ]
    return "\n\n".join(s for s in sections if s) + "\n"


def decision_line(decision: Decision, style: Style = PLAIN) -> str:
    """The decision in one line (``explain -q``): layer, backend, class, format, outcome;
    or that nothing can run, or what strict mode refuses."""
    head = f"{decision.layer_label()}: "
    if decision.backend is None:
        return head + style.bad("no feasible backend")
    override = decision.override
    if decision.mode == "strict" and override is not None:
        return (
            head
            + style.bad("refused in strict mode")
            + f": {override.requested} from {override.origin} ({override.reason_code.value})"
        )
    line = (
        head
        + style.good(decision.backend)
        + f" ({decision.experts_class}, {decision.activation_format} format), "
        + decision.outcome.value
    )
    if decision.requested:
        line += f" (requested {decision.requested.backend} via {decision.requested.origin})"
    for vetoed in decision.overrides:
        line += f"; {vetoed.requested}: " + style.warn(vetoed.reason_code.value)
    return line
