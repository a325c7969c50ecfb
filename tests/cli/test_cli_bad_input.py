"""Bad input of every kind: exit 2 and one stderr line that names where the bad value came from."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cli.runner import H200, NEMOTRON_REL, run_cli

MALFORMED = "version: 1\nrules:\n  - id: x\n    when: {platform: cuda\n    effect: forbid\n"
UNKNOWN_KEY = "version: 1\nmode: warn\nmoed: strict\n"
WRONG_TYPE = "version: 1\naudit:\n  required: maybe\n"
TYPO_BACKEND = "version: 1\nbackend: flashinfer_cutlas\n"


def _write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def _no_expert_count(tmp_path: Path) -> str:
    config = json.loads(Path(NEMOTRON_REL).read_text())
    del config["n_routed_experts"]
    return _write(tmp_path, "model.json", json.dumps(config, indent=2))


# (id, policy file text or None, env, extra args, fragments expected in the error line)
CASES = [
    ("malformed-yaml", MALFORMED, {}, (), ("malformed YAML", "file:{policy}:5:11")),
    (
        "unknown-key",
        UNKNOWN_KEY,
        {},
        (),
        ("file:{policy}:3:1", "unknown key 'moed'", "did you mean 'mode'"),
    ),
    ("wrong-type", WRONG_TYPE, {}, (), ("file:{policy}:3:13", "audit.required", "'maybe'")),
    (
        "unknown-backend-in-file",
        TYPO_BACKEND,
        {},
        (),
        ("file:{policy}:2:10", "flashinfer_cutlas", "did you mean 'flashinfer_cutlass'"),
    ),
    (
        "unknown-backend-in-env",
        None,
        {"MOE_POLICY_BACKEND": "flashinfer_cutlas"},
        (),
        ("env:MOE_POLICY_BACKEND", "did you mean 'flashinfer_cutlass'"),
    ),
    (
        "bad-mode-env",
        None,
        {"MOE_POLICY_MODE": "loud"},
        (),
        ("env:MOE_POLICY_MODE", "'loud'", "warn, strict"),
    ),
    (
        "unknown-env-variable",
        None,
        {"MOE_POLICY_BAKEND": "triton"},
        (),
        ("env:MOE_POLICY_BAKEND", "did you mean 'MOE_POLICY_BACKEND'"),
    ),
    (
        "bad-flag-platform",
        None,
        {},
        ("--platform", "cdua"),
        ("cli:--platform", "did you mean 'cuda'"),
    ),
    ("bad-flag-int", None, {}, ("--tp", "two"), ("cli:--tp", "parallel.tp", "'two'")),
    (
        "bad-flag-capability",
        None,
        {},
        ("--capability", "9.x"),
        ("cli:--capability", "not a compute capability: '9.x'", "expected e.g. 9.0"),
    ),
    ("bad-flag-range", None, {}, ("--tp", "0"), ("cli:--tp", "parallel.tp must be at least 1")),
    ("bad-flag-mode", None, {}, ("--mode", "strcit"), ("cli:--mode", "did you mean 'strict'")),
    ("bad-set-syntax", None, {}, ("--set", "parallel.tp"), ("cli:--set", "KEY=VALUE")),
    (
        "bad-set-key",
        None,
        {},
        ("--set", "paralel.tp=2"),
        ("cli:--set", "did you mean 'parallel.tp'"),
    ),
    (
        "missing-policy-file",
        None,
        {},
        ("--policy", "no/such/policy.yaml"),
        ("cli:--policy", "not found"),
    ),
]


@pytest.mark.parametrize(
    ("policy", "env", "extra", "fragments"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_bad_input_exits_2_with_one_line_naming_the_origin(tmp_path, policy, env, extra, fragments):
    """Each bad input is a PolicyError: exit 2, nothing on stdout, one error line with its origin."""
    args = ["explain", "--model", NEMOTRON_REL, *H200, "--json", *extra]
    policy_path = ""
    if policy is not None:
        policy_path = _write(tmp_path, "policy.yaml", policy)
        args += ["--policy", policy_path]
    run = run_cli(*args, env=env)
    assert run.returncode == 2, run.stderr
    assert run.stdout == ""
    assert "Traceback" not in run.stderr
    [error] = run.errors()
    for fragment in fragments:
        assert fragment.format(policy=policy_path) in error, (fragment, error)


def test_model_config_without_expert_count_names_the_file(tmp_path):
    """A config.json without any expert-count key is bad input naming that file."""
    model = _no_expert_count(tmp_path)
    run = run_cli("explain", "--model", model, *H200)
    assert run.returncode == 2
    [error] = run.errors()
    assert f"file:{model}" in error and "expert count" in error and "n_routed_experts" in error


def test_missing_model_flag_is_a_usage_error():
    """argparse errors are one line and exit 2 as well."""
    run = run_cli("explain", "--platform", "cuda")
    assert run.returncode == 2
    [error] = run.errors()
    assert "--model" in error


def test_policy_files_env_names_a_missing_file(tmp_path):
    """MOE_POLICY_FILES pointing at a missing file names the variable."""
    run = run_cli(
        "explain",
        "--model",
        NEMOTRON_REL,
        *H200,
        env={"MOE_POLICY_FILES": str(tmp_path / "absent.yaml")},
    )
    assert run.returncode == 2
    [error] = run.errors()
    assert "env:MOE_POLICY_FILES" in error
