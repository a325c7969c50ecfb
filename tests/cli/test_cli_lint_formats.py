"""`moe-policy lint --format`: the same findings as JSON, as compiler lines for editors, as
GitHub Actions annotations and as SARIF 2.1.0 (checked against the OASIS schema); and the
pre-commit hook that runs it."""

from __future__ import annotations

import hashlib
import json
import re
import shlex
from pathlib import Path
from urllib.parse import unquote, urlparse

import jsonschema
import pytest
import yaml

from moe_policy._version import __version__
from moe_policy.cli.lint import FORMATS
from moe_policy.lint.formats import RENDERERS
from tests.bundled import REPO
from tests.cli.runner import SCRIPT, run_cli

FIXTURES = REPO / "tests" / "fixtures"
STRUCTURAL = str((FIXTURES / "lint" / "structural.yaml").relative_to(REPO))
CONFLICTING = str((FIXTURES / "lint" / "conflicting.yaml").relative_to(REPO))
SARIF_SCHEMA = FIXTURES / "sarif" / "sarif-schema-2.1.0.json"
SARIF_SHA256 = "c3b4bb2d6093897483348925aaa73af03b3e3f4bd4ca38cef26dcb4212a2682e"
CLEAN = ["configs/default.yaml", "configs/profiles/strict.yaml"]


def findings_of(*files: str) -> list[dict]:
    """The findings as `--json` reports them (the reference for every other format)."""
    run = run_cli("lint", "--json", *files)
    return run.json()["findings"]


def split_location(location: str) -> tuple[str, int, int]:
    path, line, col = location.rsplit(":", 2)
    return path, int(line), int(col)


def test_every_format_is_rendered():
    assert set(FORMATS) == {"text", *RENDERERS}


@pytest.mark.parametrize("fmt", FORMATS)
def test_each_format_exits_1_on_an_error_and_0_on_clean_files(fmt):
    assert run_cli("lint", "--format", fmt, STRUCTURAL).returncode == 1
    clean = run_cli("lint", "--format", fmt, *CLEAN)
    assert clean.returncode == 0, clean.stdout
    assert clean.stderr == ""


def test_json_is_the_same_as_the_json_flag():
    assert (
        run_cli("lint", "--format", "json", STRUCTURAL).json()
        == run_cli("lint", "--json", STRUCTURAL).json()
    )
    both = run_cli("lint", "--json", "--format", "sarif", STRUCTURAL)
    assert both.returncode == 2 and both.stdout == ""
    assert "--format" in both.stderr and "--json" in both.stderr


def test_an_unknown_format_is_one_error():
    run = run_cli("lint", "--format", "junit", STRUCTURAL)
    assert run.returncode == 2 and run.stdout == ""
    (line,) = run.stderr.splitlines()
    assert "'junit'" in line and "sarif" in line


def test_lines_are_path_line_col_severity_message_code():
    """One line per finding in the compiler format editors parse, then the summary."""
    expected = findings_of(STRUCTURAL, CONFLICTING)
    run = run_cli("lint", "--format", "lines", STRUCTURAL, CONFLICTING)
    *lines, summary = run.stdout.splitlines()
    assert summary.startswith("2 files checked: ")
    assert len(lines) == len(expected) >= 8
    pattern = re.compile(r"^(.+):(\d+):(\d+): (error|warning): (.+) \[([a-z-]+)\]$")
    for line, finding in zip(lines, expected, strict=True):
        match = pattern.match(line)
        assert match, line
        path, row, col, severity, message, code = match.groups()
        assert (path, int(row), int(col)) == split_location(finding["location"])
        assert (severity, code) == (finding["severity"], finding["code"])
        assert message == " ".join(finding["message"].split())
    assert any(f["severity"] == "warning" for f in expected)


WORKFLOW_COMMAND = re.compile(r"^::(error|warning) ([^:]*)::(.*)$")


def decode(text: str) -> str:
    """What the Actions runner makes of an escaped value (its documented percent codes)."""
    for code, char in (("%0D", "\r"), ("%0A", "\n"), ("%3A", ":"), ("%2C", ","), ("%25", "%")):
        text = text.replace(code, char)
    return text


def parse_annotation(line: str) -> tuple[str, dict[str, str], str]:
    match = WORKFLOW_COMMAND.match(line)
    assert match, line
    command, props, message = match.groups()
    fields = dict(item.split("=", 1) for item in props.split(","))
    assert all("," not in v and ":" not in v for v in fields.values())
    return command, {k: decode(v) for k, v in fields.items()}, decode(message)


def test_github_annotations_carry_file_line_col_and_code():
    expected = findings_of(STRUCTURAL, CONFLICTING)
    run = run_cli("lint", "--format", "github", STRUCTURAL, CONFLICTING)
    *lines, summary = run.stdout.splitlines()
    assert summary.startswith("2 files checked: ")
    assert len(lines) == len(expected)
    for line, finding in zip(lines, expected, strict=True):
        command, fields, message = parse_annotation(line)
        path, row, col = split_location(finding["location"])
        assert command == finding["severity"]
        assert fields == {"file": path, "line": str(row), "col": str(col), "title": finding["code"]}
        assert message == finding["message"]


def test_github_escapes_what_would_end_a_property_or_the_message(tmp_path):
    """A path with ',' and ':' and a message with '%' survive the workflow-command syntax."""
    odd = tmp_path / "team,a:b"
    odd.mkdir()
    policy = odd / "p.yaml"
    policy.write_text("version: 1\n'50%': 1\n")
    run = run_cli("lint", "--format", "github", str(policy))
    assert run.returncode == 1
    (line, _summary) = run.stdout.splitlines()
    command, fields, message = parse_annotation(line)
    assert (command, fields["file"], fields["line"], fields["col"]) == (
        "error",
        str(policy),
        "2",
        "1",
    )
    assert "'50%'" in message and "%25" in line


@pytest.fixture(scope="module")
def sarif_validator():
    """The OASIS SARIF 2.1.0 schema (draft-04), the copy checked byte for byte."""
    assert hashlib.sha256(SARIF_SCHEMA.read_bytes()).hexdigest() == SARIF_SHA256
    schema = json.loads(SARIF_SCHEMA.read_text())
    jsonschema.Draft4Validator.check_schema(schema)
    return jsonschema.Draft4Validator(
        schema, format_checker=jsonschema.Draft4Validator.FORMAT_CHECKER
    )


def test_sarif_validates_and_says_what_json_says(sarif_validator, tmp_path):
    absolute = tmp_path / "abs.yaml"
    absolute.write_text("version: 1\nmod: strict\n")
    files = (STRUCTURAL, CONFLICTING, str(absolute))
    expected = findings_of(*files)
    run = run_cli("lint", "--format", "sarif", *files)
    assert run.returncode == 1
    log = run.json()
    sarif_validator.validate(log)
    assert log["version"] == "2.1.0"
    (sarif_run,) = log["runs"]
    driver = sarif_run["tool"]["driver"]
    assert (driver["name"], driver["version"]) == ("moe-policy", __version__)
    rules = [rule["id"] for rule in driver["rules"]]
    assert rules == sorted({f["code"] for f in expected})
    root = sarif_run["originalUriBaseIds"]["%SRCROOT%"]["uri"]
    assert Path(unquote(urlparse(root).path)) == REPO
    results = sarif_run["results"]
    assert len(results) == len(expected)
    for result, finding in zip(results, expected, strict=True):
        assert result["ruleId"] == finding["code"] == rules[result["ruleIndex"]]
        assert result["level"] == finding["severity"]
        assert result["message"]["text"] == finding["message"]
        (location,) = result["locations"]
        artifact = location["physicalLocation"]["artifactLocation"]
        region = location["physicalLocation"]["region"]
        if artifact.get("uriBaseId") == "%SRCROOT%":
            path = str(Path(unquote(artifact["uri"])))
        else:
            path = unquote(urlparse(artifact["uri"]).path)
        assert (path, region["startLine"], region["startColumn"]) == split_location(
            finding["location"]
        )
    assert {r["ruleId"] for r in results if "abs.yaml" in json.dumps(r)} == {"unknown-key"}


def test_sarif_of_clean_files_validates_with_no_results(sarif_validator):
    run = run_cli("lint", "--format", "sarif", *CLEAN)
    assert run.returncode == 0
    sarif_validator.validate(run.json())
    assert run.json()["runs"][0]["results"] == []


def test_a_broken_sarif_log_fails_the_schema(sarif_validator):
    """The schema is the real one: a result without a message is not SARIF."""
    log = run_cli("lint", "--format", "sarif", STRUCTURAL).json()
    del log["runs"][0]["results"][0]["message"]
    with pytest.raises(jsonschema.ValidationError):
        sarif_validator.validate(log)


def test_text_keeps_the_table_and_the_summary():
    """With room for the messages beside the findings the table has four columns; with
    less, each message goes under its finding's row."""
    run = run_cli("lint", STRUCTURAL, env={"COLUMNS": "160"})
    assert run.returncode == 1
    assert run.stdout.splitlines()[0].split()[:4] == ["location", "severity", "code", "message"]
    assert run.stdout.rstrip().splitlines()[-1].startswith("1 file checked: ")
    narrow = run_cli("lint", STRUCTURAL, env={"COLUMNS": "80"}).stdout.splitlines()
    assert narrow[0].split() == ["location", "severity", "code"]
    assert narrow[3].startswith("    unknown key 'moed'")


# -- the pre-commit hook -------------------------------------------------------------------


@pytest.fixture(scope="module")
def hook():
    hooks = yaml.safe_load((REPO / ".pre-commit-hooks.yaml").read_text())
    assert isinstance(hooks, list)
    (found,) = [h for h in hooks if h["id"] == "moe-policy-lint"]
    return found


def test_the_hook_definition_has_what_pre_commit_requires(hook):
    assert {"id", "name", "entry", "language"} <= set(hook)
    assert hook["language"] == "python"  # pre-commit pip-installs this package: no torch
    assert shlex.split(hook["entry"])[:2] == ["moe-policy", "lint"]


@pytest.mark.parametrize(
    ("path", "matches"),
    [
        ("policy.yaml", True),
        ("deploy/policy-serving.yml", True),
        ("policies/h200.yaml", True),
        ("deploy/moe-policies/b200.yaml", True),
        ("moe-policy.yaml", True),
        ("serving.moe-policy.yaml", True),
        ("k8s/deployment.yaml", False),
        (".github/workflows/ci.yml", False),
        ("configs/matrices/default.yaml", False),
        ("policy.json", False),
    ],
)
def test_the_hook_picks_policy_files(hook, path, matches):
    assert bool(re.search(hook["files"], path)) is matches


def test_the_hook_entry_runs_on_the_files_it_is_given(hook):
    """pre-commit appends the staged file names to the entry: a clean file passes, a broken
    one fails with its findings as PATH:LINE:COL lines."""
    program, *args = shlex.split(hook["entry"])
    assert Path(str(SCRIPT)).name == program
    assert run_cli(*args, *CLEAN).returncode == 0
    run = run_cli(*args, STRUCTURAL)
    assert run.returncode == 1
    assert f"{STRUCTURAL}:3:1: error: " in run.stdout


def test_a_finding_without_a_line_keeps_its_file(tmp_path, sarif_validator):
    """A file that cannot be read has no line or column: every format still names the file."""
    missing = str(tmp_path / "missing.yaml")
    lines = run_cli("lint", "--format", "lines", missing)
    assert lines.returncode == 1
    assert lines.stdout.splitlines()[0] == f"{missing}: error: file not found [file-not-found]"
    github = run_cli("lint", "--format", "github", missing)
    command, fields, message = parse_annotation(github.stdout.splitlines()[0])
    assert (command, fields, message) == (
        "error",
        {"file": missing, "title": "file-not-found"},
        "file not found",
    )
    log = run_cli("lint", "--format", "sarif", missing).json()
    sarif_validator.validate(log)
    (result,) = log["runs"][0]["results"]
    physical = result["locations"][0]["physicalLocation"]
    assert "region" not in physical
    assert unquote(urlparse(physical["artifactLocation"]["uri"]).path) == missing
