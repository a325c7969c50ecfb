"""Policy files: YAML through OmegaConf, positions from the YAML nodes, later files win."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from moe_policy.core.catalog import load_catalog
from moe_policy.errors import PolicyError
from moe_policy.settings import resolve_settings


def _settings(*files: Path, environ=None):
    return resolve_settings(
        load_catalog(), policy_files=[str(f) for f in files], environ=environ or {}
    )


def test_later_file_wins_and_history_keeps_the_beaten_values(tmp_path: Path):
    """Two files set `mode`; the second wins; the first and the built-in are in the history."""
    a = tmp_path / "a.yaml"
    b = tmp_path / "b.yaml"
    a.write_text("mode: strict\n")
    b.write_text("version: 1\nmode: warn\n")
    resolved = _settings(a, b).values["mode"]
    assert (resolved.value, resolved.origin) == ("warn", f"file:{b}:2:7")
    assert [(v, o) for v, o, _ in resolved.history] == [
        ("warn", resolved.history[0][1]),
        ("strict", f"file:{a}:1:7"),
    ]
    assert resolved.history[0][1].startswith("file:configs/default.yaml:")


def test_audit_path_interpolates_the_audit_directory(tmp_path: Path):
    """audit.path's ${oc.env:MOE_POLICY_AUDIT_DIR} reads the environment the settings get."""
    f = tmp_path / "p.yaml"
    f.write_text("audit:\n  path: ${oc.env:MOE_POLICY_AUDIT_DIR}/decisions.jsonl\n")
    settings = _settings(f, environ={"MOE_POLICY_AUDIT_DIR": "/var/log/moe"})
    assert settings.value("audit.path") == "/var/log/moe/decisions.jsonl"


def test_rule_with_same_id_replaces_the_builtin_one(tmp_path: Path):
    """Reusing a built-in rule id replaces it (e.g. to put it in audit action)."""
    f = tmp_path / "p.yaml"
    f.write_text(
        "rules:\n"
        "  - id: hopper-demotes-flashinfer\n"
        "    when: {platform: cuda, device.capability: '9.0'}\n"
        "    effect: demote\n"
        "    backends: [flashinfer_trtllm, flashinfer_cutlass]\n"
        "    reason: audit first\n"
        "    action: audit\n"
    )
    settings = _settings(f)
    rule = next(r for r in settings.rules if r.id == "hopper-demotes-flashinfer")
    assert rule.action == "audit" and rule.origin == f"file:{f}:2:5"
    assert [old.origin.split(":")[1] for old, _new in settings.replaced_rules] == [
        "configs/default.yaml"
    ]


def test_a_replaced_rule_keeps_its_place_in_the_order(tmp_path: Path):
    """Rules apply in order; a file replacing a built-in rule takes that rule's place, so the
    later built-in rules still come after it."""
    builtin = [r.id for r in _settings().rules]
    f = tmp_path / "p.yaml"
    f.write_text(
        f"rules:\n  - {{id: {builtin[0]}, effect: prefer, backends: [flashinfer_cutlass], "
        "reason: ours}\n"
    )
    settings = _settings(f)
    assert [r.id for r in settings.rules] == builtin
    assert settings.rules[0].origin == f"file:{f}:2:5"


def test_missing_policy_file_names_where_it_was_listed(tmp_path: Path):
    """A listed file that does not exist is an error naming the list's origin."""
    missing = tmp_path / "nope.yaml"
    with pytest.raises(
        PolicyError,
        match=rf"^env:MOE_POLICY_FILES: policy file '{re.escape(str(missing))}' not found$",
    ):
        resolve_settings(load_catalog(), environ={"MOE_POLICY_FILES": str(missing)})


def test_malformed_yaml_names_file_line_col(tmp_path: Path):
    """A YAML syntax error is a PolicyError at file:line:col."""
    f = tmp_path / "bad.yaml"
    f.write_text("mode: warn\nrules: [\n  {id: x\n")
    with pytest.raises(PolicyError, match=rf"^file:{re.escape(str(f))}:\d+:\d+: malformed YAML: "):
        _settings(f)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        # a misspelt top-level key: its position and a suggestion
        ("mode: warn\nbakend: triton\n", r"2:1: unknown key 'bakend' \(did you mean 'backend'\?\)"),
        # a value of the wrong type: the key, the value and the position
        ("mode: 3\n", r"1:7: mode: expected one of warn, strict, got 3$"),
        # a misspelt backend name
        (
            "backend: flashinfer_cutlas\n",
            r"1:10: unknown MoE backend 'flashinfer_cutlas' \(did you mean 'flashinfer_cutlass'\?\)",
        ),
    ],
)
def test_a_bad_value_names_its_position(tmp_path: Path, text: str, message: str):
    f = tmp_path / "p.yaml"
    f.write_text(text)
    with pytest.raises(PolicyError, match=rf"^file:{re.escape(str(f))}:{message}"):
        _settings(f)


def test_rule_condition_on_unknown_context_key(tmp_path: Path):
    """A condition on a key outside the vocabulary is an error with a suggestion."""
    f = tmp_path / "p.yaml"
    f.write_text(
        "rules:\n  - {id: r, when: {paralel.tp: 2}, effect: forbid, backends: [triton], reason: x}\n"
    )
    with pytest.raises(
        PolicyError,
        match=r"2:20: condition on unknown context key 'paralel.tp' \(did you mean 'parallel.tp'\?\)",
    ):
        _settings(f)


def test_duplicate_yaml_key_is_an_error(tmp_path: Path):
    """YAML silently keeps the last duplicate key; we refuse it."""
    f = tmp_path / "p.yaml"
    f.write_text("mode: warn\nmode: strict\n")
    with pytest.raises(PolicyError, match=r"2:1: duplicate key 'mode' \(first defined at line 1\)"):
        _settings(f)


def test_nested_sections_report_unknown_names_and_wrong_types():
    """audit/priority sub-keys and rule effect/action are checked with codes, positions and suggestions."""
    from moe_policy.core.problems import ProblemSink
    from moe_policy.core.yamlio import parse_yaml_text
    from moe_policy.settings.schema import parse_policy_document

    text = (
        "audit: {pth: x}\n"
        "priority: {cdua: [triton]}\n"
        "rules: [{id: a, effect: forbd, action: adit, backends: [triton], reason: r}]\n"
    )
    sink = ProblemSink(strict=False)
    parse_policy_document(parse_yaml_text(text, "p.yaml"), load_catalog(), sink)
    assert [(p.code, p.origin, p.message) for p in sink.problems] == [
        ("unknown-key", "file:p.yaml:1:9", "unknown key 'audit.pth' (did you mean 'path'?)"),
        (
            "unknown-key",
            "file:p.yaml:2:12",
            "priority: unknown platform 'cdua' (did you mean 'cuda'?)",
        ),
        (
            "invalid-value",
            "file:p.yaml:3:25",
            "rule a: effect must be one of forbid, require, prefer, demote, got 'forbd' (did you mean 'forbid'?)",
        ),
        (
            "invalid-value",
            "file:p.yaml:3:40",
            "rule a: action must be one of enforce, audit, got 'adit' (did you mean 'audit'?)",
        ),
    ]
    sink = ProblemSink(strict=False)
    parse_policy_document(parse_yaml_text("audit: 3\n", "p.yaml"), load_catalog(), sink)
    assert [(p.code, p.message) for p in sink.problems] == [
        ("invalid-type", "audit: expected a mapping with path, required, got 3"),
    ]
