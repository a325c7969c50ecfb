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
    ("bad-flag-int", None, {}, ("--tp", "two"), ("--tp", "parallel.tp", "'two'")),
    (
        "bad-flag-capability",
        None,
        {},
        ("--capability", "9.x"),
        ("--capability", "not a compute capability: '9.x'", "expected MAJOR.MINOR"),
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


# --- typed values: nothing truthy, no int()/float() guesses, overrides checked like config.json

RULE = "version: 1\nrules:\n  - id: r\n    when: {when}\n    effect: forbid\n    backends: [triton]\n    reason: x\n"

# (id, the rule's `when`, fragment of the error) -- the error is at line 4, the `when` line
TYPED_RULES = [
    ("exists-quoted-false", '{device.name: {exists: "false"}}', "exists: expected a boolean"),
    ("exists-number", "{device.name: {exists: 0}}", "exists: expected a boolean"),
    ("null-never-matches", "{platform: null}", "a null operand never matches"),
    ("null-in-list", "{platform: [cuda, null]}", "a null operand never matches"),
    ("order-on-string-key", "{platform: {gt: cuda}}", "a str key has no order"),
    ("order-on-bool-key", "{lora.enabled: {lt: true}}", "a bool key has no order"),
    ("list-operand-on-int-key", "{parallel.tp: {gt: [1]}}", "parallel.tp: expected an integer"),
    ("dict-operand-on-int-key", "{parallel.tp: {eq: {a: 1}}}", "parallel.tp: expected an integer"),
    ("multiple-of-on-string-key", "{platform: {multiple_of: 2}}", "applies to integer keys only"),
    ("bool-for-int", "{parallel.tp: true}", "parallel.tp: expected an integer, got True"),
    ("string-for-bool", '{lora.enabled: "false"}', "lora.enabled: expected a boolean"),
    ("number-for-string", "{device.name: 1}", "device.name: expected a string"),
    ("dict-for-package", "{packages: {eq: {a: 1}}}", "packages: expected a package name"),
    ("empty-in", "{platform: {in: []}}", "needs a non-empty list"),
    ("empty-operators", "{platform: {}}", "an empty mapping of operators"),
    ("capability-digits", '{device.capability: {ge: "9.0000001"}}', "not a compute capability"),
    ("negative-size", "{parallel.tp: {ge: -1}}", "parallel.tp must be at least 1"),
]


@pytest.mark.parametrize(
    ("when", "fragment"), [c[1:] for c in TYPED_RULES], ids=[c[0] for c in TYPED_RULES]
)
def test_a_rule_lint_passes_is_a_rule_explain_loads(tmp_path, when, fragment):
    """One validator: every operand explain refuses, lint reports as an error at the same
    file:line:col with the same message (lint can never pass a file that explain rejects)."""
    policy = _write(tmp_path, "policy.yaml", RULE.format(when=when))
    explain = run_cli("explain", "--model", NEMOTRON_REL, *H200, "--json", "--policy", policy)
    assert explain.returncode == 2, explain.stderr
    assert explain.stdout == "" and "Traceback" not in explain.stderr
    [error] = explain.errors()
    assert f"file:{policy}:4:" in error and fragment in error, error

    lint = run_cli("lint", "--json", policy)
    assert lint.returncode == 1, lint.stderr
    assert "Traceback" not in lint.stderr
    errors = [f for f in lint.json()["findings"] if f["severity"] == "error"]
    assert [
        f"file:{policy}:{f['location'].removeprefix(policy + ':')}: {f['message']}" for f in errors
    ] == [error.removeprefix("moe-policy: error: ")]


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("version: true\n", "version: expected 1, got True"),
        ("version: 1.0\n", "expected 1, got 1.0"),
    ],
)
def test_the_policy_version_is_the_integer_1(tmp_path, text, fragment):
    """`version: true` is not version 1 (True == 1 in Python)."""
    policy = _write(tmp_path, "policy.yaml", text)
    run = run_cli("explain", "--model", NEMOTRON_REL, *H200, "--policy", policy)
    assert run.returncode == 2
    [error] = run.errors()
    assert f"file:{policy}:1:10" in error and fragment in error


# (id, flags, fragments of the one error line)
TYPED_FLAGS = [
    ("full-width-digit", ("--tp", "２"), ("--tp", "parallel.tp", "ASCII decimal digits", "'２'")),
    ("underscore-digits", ("--dp", "1_000"), ("--dp", "parallel.dp", "'1_000'")),
    ("float-for-int", ("--max-loras", "2.0"), ("--max-loras", "lora.max_loras", "'2.0'")),
    ("huge-int", ("--tp", "9" * 5000), ("--tp", "integer out of range")),
    ("capability-7-digits", ("--capability", "9.0000001"), ("--capability", "'9.0000001'")),
    ("capability-huge", ("--capability", "99999.99999"), ("--capability", "'99999.99999'")),
    ("capability-no-dot", ("--capability", "90"), ("--capability", "expected MAJOR.MINOR")),
    ("empty-audit-log", ("--audit-log", ""), ("cli:--audit-log", "an empty value is not a path")),
    (
        "empty-device-name",
        ("--device-name", ""),
        ("cli:--device-name", "device.name: an empty value is not a device name"),
    ),
    (
        "blank-device-name",
        ("--device-name", "   "),
        ("cli:--device-name", "device.name: an empty value is not a device name"),
    ),
    (
        "capability-on-tpu",
        ("--platform", "tpu"),
        ("cli:--capability", "platform tpu (cli:--platform)", "has no compute capability"),
    ),
    (
        "capability-on-cpu",
        ("--platform", "cpu"),
        ("cli:--capability", "platform cpu (cli:--platform)", "has no compute capability"),
    ),
    (
        "capability-set-on-xpu",
        ("--platform", "xpu", "--set", "device.capability=9.0"),
        ("cli:--set", "platform xpu (cli:--platform)", "has no compute capability"),
    ),
    ("set-empty", ("--set", "parallel.tp="), ("cli:--set", "parallel.tp: no value after '='")),
    (
        "set-empty-audit-path",
        ("--set", "audit.path="),
        ("cli:--set", "audit.path: no value after '=' (null switches it off)"),
    ),
    (
        "set-null-context",
        ("--set", "parallel.tp=null"),
        ("cli:--set", "parallel.tp: no value given"),
    ),
    (
        "set-interpolation",
        ("--set", "packages=[${oc.env:HOME}]"),
        ("cli:--set", "interpolation (${...}) is not supported"),
    ),
    ("set-yaml-yes", ("--set", "lora.enabled=yes"), ("cli:--set", "expected true, false, 1 or 0")),
    ("set-underscore", ("--set", "parallel.tp=1_000"), ("cli:--set", "ASCII decimal digits")),
    ("set-huge-int", ("--set", "parallel.tp=" + "9" * 5000), ("cli:--set", "integer out of range")),
    ("set-list-for-int", ("--set", "parallel.tp=[1]"), ("cli:--set", "'[1]'")),
    (
        "set-no-experts",
        ("--set", "model.num_experts=0"),
        ("cli:--set", "model.num_experts must be at least 1"),
    ),
    (
        "set-top-k",
        ("--set", "model.top_k=9999"),
        ("cli:--set", "model.top_k 9999 exceeds model.num_experts 128"),
    ),
    (
        "set-fewer-experts",
        ("--set", "model.num_experts=4"),
        ("cli:--set", "model.top_k 6 exceeds model.num_experts 4"),
    ),
    (
        "set-layer-index",
        ("--set", "layer.index=-5"),
        ("cli:--set", "layer.index must be at least 0, got -5"),
    ),
    (
        "set-negative-shared",
        ("--set", "model.shared_experts=-3"),
        ("cli:--set", "must be at least 0"),
    ),
    (
        "ep-over-experts",
        ("--ep", "--tp", "1024"),
        ("cli:--tp", "1024 ranks", "exceeds model.num_experts 128"),
    ),
]


@pytest.mark.parametrize(
    ("extra", "fragments"), [c[1:] for c in TYPED_FLAGS], ids=[c[0] for c in TYPED_FLAGS]
)
def test_flags_and_overrides_are_typed_and_checked(extra, fragments):
    """The console script refuses each value with exit 2 and one line naming the flag."""
    run = run_cli("explain", "--model", NEMOTRON_REL, *H200, "--json", *extra)
    assert run.returncode == 2, run.stderr
    assert run.stdout == "" and "Traceback" not in run.stderr
    [error] = run.errors()
    assert len(error) < 400, error
    for fragment in fragments:
        assert fragment in error, (fragment, error)


def test_typed_flags_still_take_good_values():
    """The happy path: ASCII integers, MAJOR.MINOR, --set of each type, null switching the audit off."""
    run = run_cli(
        "explain", "--model", NEMOTRON_REL, "--platform", "cuda", "--capability", "10.0",
        "--tp", "2", "--dp", "+1", "--json",
        "--set", "lora.enabled=true", "--set", "lora.max_rank=64", "--set", "packages=[triton, torch]",
        "--set", "device.name='NVIDIA B200'", "--set", "audit.path=null",
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    context = run.json()["context"]
    assert context["parallel.tp"]["value"] == 2 and context["parallel.dp"]["value"] == 1
    assert context["device.capability"]["value"] == "10.0"
    assert context["lora.enabled"]["value"] is True and context["lora.max_rank"]["value"] == 64
    assert context["packages"]["value"] == ["torch", "triton"]
    assert context["device.name"]["value"] == "NVIDIA B200"


# (id, change to the bundled Nemotron config.json, fragments of the error)
TYPED_MODEL_FIELDS = [
    ("gated-string", {"is_gated": "false"}, ("is_gated: gating: expected a boolean", "'false'")),
    (
        "shared-negative",
        {"n_shared_experts": -3},
        ("n_shared_experts", "must be at least 0, got -3"),
    ),
    (
        "shared-bool",
        {"n_shared_experts": True},
        ("n_shared_experts", "expected an integer, got True"),
    ),
    (
        "shared-float",
        {"n_shared_experts": 2.7},
        ("n_shared_experts", "expected an integer, got 2.7"),
    ),
    (
        "shared-size-list",
        {"n_shared_experts": None, "shared_expert_intermediate_size": [1]},
        ("shared_expert_intermediate_size", "(a list)"),
    ),
    (
        "architectures-dict",
        {"architectures": {"a": 1}},
        ("architectures: expected a list of class names",),
    ),
    (
        "quantization-string",
        {"quantization_config": "fp8"},
        ("quantization_config: expected a mapping", "'fp8'"),
    ),
    (
        "moe-size-null",
        {"moe_intermediate_size": None},
        ("moe_intermediate_size: the expert intermediate size is null",),
    ),
    (
        "experts-bool",
        {"n_routed_experts": True},
        ("n_routed_experts", "expected an integer, got True"),
    ),
]


@pytest.mark.parametrize(
    ("change", "fragments"),
    [c[1:] for c in TYPED_MODEL_FIELDS],
    ids=[c[0] for c in TYPED_MODEL_FIELDS],
)
def test_model_fields_are_typed(tmp_path, change, fragments):
    """A config.json field of the wrong type is bad input (exit 2) naming the file and key,
    never read by truthiness, int() or str() (and a non-mapping quantization is not exit 4)."""
    config = json.loads(Path(NEMOTRON_REL).read_text())
    for key, value in change.items():
        if value is None and key != "moe_intermediate_size":
            config.pop(key, None)
        else:
            config[key] = value
    model = _write(tmp_path, "config.json", json.dumps(config, indent=2))
    run = run_cli("explain", "--model", model, *H200, "--json")
    assert run.returncode == 2, run.stderr
    assert run.stdout == "" and "Traceback" not in run.stderr
    [error] = run.errors()
    assert f"file:{model}:" in error, error
    for fragment in fragments:
        assert fragment in error, (fragment, error)


def test_an_empty_audit_path_in_a_policy_file_is_an_error(tmp_path):
    """`audit.path: ''` does not switch the audit off silently: an error at its position."""
    policy = _write(tmp_path, "policy.yaml", "version: 1\naudit:\n  path: ''\n")
    run = run_cli("explain", "--model", NEMOTRON_REL, *H200, "--policy", policy)
    assert run.returncode == 2
    [error] = run.errors()
    assert f"file:{policy}:3:9" in error and "audit.path: an empty value is not a path" in error
    lint = run_cli("lint", "--json", policy)
    assert lint.returncode == 1
    [finding] = lint.json()["findings"]
    assert finding["location"] == f"{policy}:3:9" and "an empty value" in finding["message"]


@pytest.mark.parametrize("version", ["0.３３", "².33", "0.33²"])
def test_an_engine_version_is_ascii_digits(version):
    """`str.isdigit` takes full-width and superscript digits; the engine version does not."""
    run = run_cli("explain", "--model", NEMOTRON_REL, *H200, "--engine", f"vllm=={version}")
    assert run.returncode == 2 and "Traceback" not in run.stderr
    [error] = run.errors()
    assert "cli:--engine" in error and "is not MAJOR.MINOR" in error


@pytest.mark.parametrize("form", ["text", "json", "lines", "github", "sarif"])
def test_lint_reports_a_path_with_digit_like_characters(tmp_path, form):
    """A path whose parts look like line:col to str.isdigit (`x:²:³`) is reported, not a traceback."""
    path = str(tmp_path / "x:²:³")
    run = run_cli("lint", "--format", form, path)
    assert run.returncode == 1, run.stderr
    assert "Traceback" not in run.stderr and "file-not-found" in run.stdout


def test_null_is_the_explicit_off_switch_for_a_profiles_audit(tmp_path):
    """`--set audit.path=null` switches the audit profile's log off; an empty path would be an error."""
    env = {"MOE_POLICY_AUDIT_DIR": str(tmp_path)}
    on = run_cli("explain", "--model", NEMOTRON_REL, *H200, "--profile", "audit", "--json", env=env)
    assert on.returncode == 0, on.stderr
    assert (tmp_path / "moe-policy-decisions.jsonl").is_file()
    (tmp_path / "moe-policy-decisions.jsonl").unlink()
    off = run_cli(
        "explain", "--model", NEMOTRON_REL, *H200, "--profile", "audit", "--json",
        "--set", "audit.path=null", env=env,
    )  # fmt: skip
    assert off.returncode == 0, off.stderr
    assert list(tmp_path.iterdir()) == []


def test_a_capability_is_taken_on_cuda_and_rocm():
    """A ROCm GPU has a capability too (torch reports gfx942 as 9.4); without a capability
    any platform decides."""
    rocm = run_cli(
        "explain", "--model", NEMOTRON_REL, "--platform", "rocm", "--capability", "9.4", "-q"
    )
    assert rocm.returncode == 0, rocm.stderr
    cpu = run_cli("explain", "--model", NEMOTRON_REL, "--platform", "cpu", "--json")
    assert cpu.returncode == 0, cpu.stderr
    assert cpu.json()["context"]["device.capability"]["value"] is None


@pytest.mark.parametrize("files", [("",), ("configs/default.yaml", "   ")], ids=["empty", "blank"])
def test_lint_refuses_an_empty_path_naming_the_argument(files):
    """`lint ""` names the argument and says the path is empty (not `file not found` at `-`)."""
    run = run_cli("lint", *files)
    assert run.returncode == 2 and run.stdout == "" and "Traceback" not in run.stderr
    assert run.stderr.splitlines() == [
        f"moe-policy: error: cli:FILE: argument {len(files)} of {len(files)} is an empty path "
        "(give a policy YAML file)"
    ]
