"""Interpolation that cannot exfiltrate: only audit.path may read the environment, and only
MOE_POLICY_AUDIT_DIR; anything else is one error at the value, in loading and in lint, and
the environment's value appears nowhere."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from moe_policy.core.catalog import load_catalog
from moe_policy.core.yamlio import parse_yaml_text
from moe_policy.errors import PolicyError
from moe_policy.lint.checks import lint_document
from moe_policy.settings import resolve_settings
from tests.bundled import NEMOTRON, REPO
from tests.cli.runner import H200, run_cli

SECRET_NAME = "AWS_SECRET_ACCESS_KEY"
SECRET = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYzEXAMPLEKEY"
ENV = {SECRET_NAME: SECRET}
REF = "${oc.env:AWS_SECRET_ACCESS_KEY}"
RULE = "rules:\n  - id: r\n    effect: demote\n    backends: [triton]\n    reason: plain\n"

# (id, policy text, line, col, message fragment)
REFUSED = [
    ("reason", RULE.replace("reason: plain", f"reason: 'key {REF}'"), 5, 13, "rules[0].reason:"),
    ("rule-id", RULE.replace("id: r", f"id: '{REF}'"), 2, 9, "rules[0].id:"),
    ("mode", f"mode: '{REF}'\n", 1, 7, "mode:"),
    ("backend", f"backend: '{REF}'\n", 1, 10, "backend:"),
    ("backend-list", f"priority: {{cuda: [triton, '{REF}']}}\n", 1, 27, "priority.cuda[1]:"),
    (
        "operand",
        RULE.replace("    effect", f"    when: {{device.name: '{REF}'}}\n    effect"),
        3,
        25,
        "rules[0].when.device.name:",
    ),
    (
        "audit-file-name",
        f"audit:\n  path: '/tmp/{REF}.jsonl'\n",
        2,
        9,
        f"audit.path: environment variable {SECRET_NAME} may not",
    ),
    (
        "audit-default-nests",
        f"audit:\n  path: '${{oc.env:MOE_POLICY_AUDIT_DIR,{REF}}}'\n",
        2,
        9,
        "audit.path: only ${oc.env:NAME}",
    ),
]
RESOLVERS = [
    "${oc.decode:'{a: 1}'}",
    "${oc.create:{a: 1}}",
    "${oc.deprecated:mode}",
    "${oc.select:mode,x}",
    "${oc.dict.keys:audit}",
    "${oc.dict.values:audit}",
    "${my_resolver:x}",
    "${mode}",
    "\\${oc.env:HOME}",
    "${oc.env:HOME}",
]


def _load(text: str, tmp_path: Path, environ: dict[str, str] | None = None):
    policy = tmp_path / "p.yaml"
    policy.write_text(text)
    return policy, lambda: resolve_settings(
        load_catalog(), policy_files=[str(policy)], environ=environ if environ is not None else ENV
    )


@pytest.mark.parametrize(
    ("text", "line", "col", "fragment"), [c[1:] for c in REFUSED], ids=[c[0] for c in REFUSED]
)
def test_load_and_lint_refuse_the_same_interpolation_at_the_same_place(
    tmp_path: Path, text, line, col, fragment
):
    policy, load = _load(text, tmp_path)
    with pytest.raises(PolicyError) as caught:
        load()
    where = f"file:{policy}:{line}:{col}"
    assert str(caught.value).startswith(f"{where}: {fragment}")
    assert SECRET not in str(caught.value)
    findings = lint_document(parse_yaml_text(text, str(policy)))
    refused = [f for f in findings if f.code == "interpolation-not-allowed"]
    assert [(f.origin, f.message) for f in refused] == [(where, caught.value.message)]
    assert all(SECRET not in f.message for f in findings)


@pytest.mark.parametrize("written", RESOLVERS)
def test_every_resolver_is_refused_outside_audit_path(tmp_path: Path, written: str):
    text = RULE.replace("reason: plain", f"reason: {json.dumps(written)}")
    policy, load = _load(text, tmp_path)
    with pytest.raises(
        PolicyError,
        match=rf"^file:{re.escape(str(policy))}:5:13: rules\[0\]\.reason: interpolation is not allowed",
    ):
        load()


@pytest.mark.parametrize("written", RESOLVERS)
def test_every_resolver_but_the_audit_directory_is_refused_in_audit_path(
    tmp_path: Path, written: str
):
    policy, load = _load(f"audit:\n  path: {json.dumps('/tmp/' + written)}\n", tmp_path)
    with pytest.raises(PolicyError, match=rf"^file:{re.escape(str(policy))}:2:9: audit\.path: "):
        load()


@pytest.mark.parametrize(
    ("written", "environ", "expected"),
    [
        (
            "${oc.env:MOE_POLICY_AUDIT_DIR}/d.jsonl",
            {"MOE_POLICY_AUDIT_DIR": "/srv/audit"},
            "/srv/audit/d.jsonl",
        ),
        (
            "${oc.env:MOE_POLICY_AUDIT_DIR,/fallback}/d.jsonl",
            {"MOE_POLICY_AUDIT_DIR": "/srv/a"},
            "/srv/a/d.jsonl",
        ),
        ("${oc.env:MOE_POLICY_AUDIT_DIR,/fallback}/d.jsonl", {}, "/fallback/d.jsonl"),
        (
            "${ oc.env : MOE_POLICY_AUDIT_DIR , /fb }/d.jsonl",
            {"MOE_POLICY_AUDIT_DIR": ""},
            "/fb/d.jsonl",
        ),
        ("/plain/d.jsonl", ENV, "/plain/d.jsonl"),
        # the variable's value is inserted as it is, never interpolated in turn
        (
            "${oc.env:MOE_POLICY_AUDIT_DIR}/d.jsonl",
            {"MOE_POLICY_AUDIT_DIR": REF, **ENV},
            f"{REF}/d.jsonl",
        ),
    ],
)
def test_audit_path_interpolates_the_audit_directory(tmp_path: Path, written, environ, expected):
    _, load = _load(f"audit:\n  path: {json.dumps(written)}\n", tmp_path, environ)
    assert load().value("audit.path") == expected


def test_the_audit_directory_without_a_default_must_be_set(tmp_path: Path):
    policy, load = _load("audit:\n  path: ${oc.env:MOE_POLICY_AUDIT_DIR}/d.jsonl\n", tmp_path, {})
    with pytest.raises(
        PolicyError,
        match=rf"^file:{re.escape(str(policy))}:2:9: audit\.path: MOE_POLICY_AUDIT_DIR is not set",
    ):
        load()


def test_a_literal_dollar_is_plain_text(tmp_path: Path):
    _, load = _load(RULE.replace("reason: plain", "reason: costs $5 {per} run"), tmp_path)
    [rule] = [r for r in load().rules if r.id == "r"]
    assert rule.reason == "costs $5 {per} run"


# ---------------------------------------------------------------- the console script


def _leak_check(run, *files: Path) -> None:
    assert SECRET not in run.stdout and SECRET not in run.stderr
    for path in files:
        assert not path.exists() or SECRET not in path.read_text()


@pytest.mark.parametrize(
    ("text", "line", "col"), [c[1:4] for c in REFUSED], ids=[c[0] for c in REFUSED]
)
def test_the_secret_appears_nowhere(tmp_path: Path, text, line, col):
    """explain (with an audit log) exits 2 naming the key; lint finds it; no output, no
    audit line and no file name carries the value."""
    policy = tmp_path / "p.yaml"
    policy.write_text(text)
    audit = tmp_path / "audit.jsonl"
    run = run_cli(
        "explain",
        "--model",
        str(NEMOTRON),
        *H200,
        "--json",
        "--policy",
        str(policy),
        "--audit-log",
        str(audit),
        env=ENV,
        cwd=tmp_path,
    )
    assert (run.returncode, run.stdout) == (2, ""), run.stderr
    assert run.stderr.startswith(f"moe-policy: error: file:{policy}:{line}:{col}: ")
    _leak_check(run, audit)
    lint = run_cli("lint", "--json", str(policy), env=ENV, cwd=tmp_path)
    assert lint.returncode == 1
    assert f"file:{policy}:{line}:{col}" in [f["origin"] for f in lint.json()["findings"]]
    _leak_check(lint)
    assert all(SECRET.split("/")[0] not in str(p) for p in Path("/tmp").iterdir())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.yaml"]


def test_the_shipped_audit_profile_writes_under_the_audit_directory(tmp_path: Path):
    """Set: the file is under MOE_POLICY_AUDIT_DIR. Unset: in the current directory."""
    audit_dir = tmp_path / "audit"
    audit_dir.mkdir()
    args = ("explain", "--model", str(NEMOTRON), *H200, "--json", "--profile", "audit")
    run = run_cli(*args, env={"MOE_POLICY_AUDIT_DIR": str(audit_dir), **ENV}, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    record = run.json()
    [line] = (audit_dir / "moe-policy-decisions.jsonl").read_text().splitlines()
    assert json.loads(line)["decision_id"] == record["decision_id"]
    unset = run_cli(*args, cwd=tmp_path)
    assert unset.returncode == 0, unset.stderr
    [line] = (tmp_path / "moe-policy-decisions.jsonl").read_text().splitlines()
    assert json.loads(line)["decision_id"] == unset.json()["decision_id"]
    assert (REPO / "configs/profiles/audit.yaml").read_text().count(
        "${oc.env:MOE_POLICY_AUDIT_DIR,.}"
    ) == 1
