"""explain inputs: --set of nested keys, ROCm AITER env semantics, every bundled model config."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.bundled import MIXTRAL, MODELS, REPO
from tests.cli.runner import H200, NEMOTRON_REL, explain_record, run_cli, validate_record


def test_set_nested_keys_and_a_list_with_their_origin():
    """`--set parallel.tp=2` and `--set packages=[...]` land in the context as cli:--set."""
    run = run_cli(
        "explain",
        "--model",
        NEMOTRON_REL,
        *H200,
        "--json",
        "--set",
        "parallel.tp=2",
        "--set",
        "packages=[triton,torch]",
    )
    assert run.returncode == 0, run.stderr
    record = run.json()
    validate_record(record)
    context = record["context"]
    assert context["parallel.tp"] == {"value": 2, "origin": "cli:--set"}
    assert context["packages"] == {"value": ["torch", "triton"], "origin": "cli:--set"}
    assert context["model.intermediate_size_per_partition"]["value"] == 1856 // 2
    cutlass = next(c for c in record["candidates"] if c["backend"] == "flashinfer_cutlass")
    assert (cutlass["reason_code"], cutlass["pass"]) == ("package_unavailable", "feasibility")


def test_set_overrides_a_settings_key_after_the_named_flags():
    """`--set mode=strict` is a settings key too; it is applied after --mode, so it wins."""
    run = run_cli(
        "explain",
        "--model",
        NEMOTRON_REL,
        *H200,
        "--json",
        "--lora",
        "--backend",
        "flashinfer_cutlass",
        "--mode",
        "warn",
        "--set",
        "mode=strict",
    )
    assert run.returncode == 3
    record = run.json()
    assert record["mode"] == "strict"
    assert record["requested"]["origin"] == "cli:--backend"


def test_later_policy_files_win(tmp_path):
    """--policy is repeatable: the later file's mode wins over the strict profile's."""
    relaxed = tmp_path / "relaxed.yaml"
    relaxed.write_text("version: 1\nmode: warn\n")
    run = run_cli(
        "explain",
        "--model",
        NEMOTRON_REL,
        *H200,
        "--lora",
        "--backend",
        "flashinfer_cutlass",
        "--policy",
        "configs/profiles/strict.yaml",
        "--policy",
        str(relaxed),
        "--json",
    )
    assert run.returncode == 0, run.stderr
    record = run.json()
    assert (record["mode"], record["outcome"], record["requested"]["origin"]) == (
        "warn",
        "overridden",
        "cli:--backend",
    )
    assert [f["path"] for f in record["policy"]["files"]] == [
        "configs/default.yaml",
        "configs/profiles/strict.yaml",
        str(relaxed),
    ]


def test_rocm_aiter_env_is_honoured_for_a_gated_silu_model():
    """VLLM_ROCM_USE_AITER=1 requests aiter; Mixtral's gated SiLU experts run on it."""
    _, record = explain_record(
        "--model", MIXTRAL, "--platform", "rocm", env={"VLLM_ROCM_USE_AITER": "1"}
    )
    assert (record["backend"], record["outcome"]) == ("aiter", "honored")
    assert record["requested"]["origin"] == "env:VLLM_ROCM_USE_AITER"
    assert record["context"]["rocm.aiter"] == {"value": True, "origin": "env:VLLM_ROCM_USE_AITER"}


def test_rocm_aiter_env_is_overridden_for_non_gated_relu2_experts():
    """Nemotron's relu2 experts are non-gated: aiter cannot run them, Triton does, with a warning."""
    aiter = {"VLLM_ROCM_USE_AITER": "1"}
    run, record = explain_record("--model", NEMOTRON_REL, "--platform", "rocm", env=aiter)
    assert (record["backend"], record["outcome"]) == ("triton", "overridden")
    [override] = record["overrides"]
    assert (override["requested"], override["reason_code"], override["origin"]) == (
        "aiter",
        "non_gated_unsupported",
        "env:VLLM_ROCM_USE_AITER",
    )
    assert "moe_policy.request_overridden" in run.event_names()


#: What an H200 dry run picks for each bundled model (None: nothing can run it).
EXPECTED_H200 = {
    "nemotron-3-nano-30b-a3b.json": "triton",
    "mixtral-8x7b-instruct-v0.1.json": "triton",
    "qwen3-30b-a3b.json": "triton",
    "deepseek-v3.json": None,  # FP8-quantized: every unquantized backend is eliminated
}


@pytest.mark.parametrize("model", sorted(p.name for p in Path(MODELS).glob("*.json")))
def test_every_bundled_model_gives_a_valid_record(model):
    """Each real config in configs/models/ explains on an H200 with a schema-valid record."""
    run = run_cli("explain", "--model", str(Path(MODELS, model).relative_to(REPO)), *H200, "--json")
    record = run.json()
    validate_record(record)
    assert record["context"]["model.num_experts"]["origin"].startswith(
        f"file:configs/models/{model}:"
    )
    expected = EXPECTED_H200.get(model, record["backend"])
    assert record["backend"] == expected
    assert run.returncode == (0 if expected is not None else 4)


def test_unwritable_audit_log_warns_and_a_required_one_fails(tmp_path):
    """--audit-log into a missing directory: exit 0 with moe_policy.audit_failed; required: exit 2."""
    target = str(tmp_path / "missing" / "audit.jsonl")
    run = run_cli("explain", "--model", NEMOTRON_REL, *H200, "--json", "--audit-log", target)
    assert run.returncode == 0, run.stderr
    [failed] = [e for e in run.events() if e["event"] == "moe_policy.audit_failed"]
    assert (failed["level"], failed["path"]) == ("warning", target)
    required = run_cli(
        "explain",
        "--model",
        NEMOTRON_REL,
        *H200,
        "--json",
        "--audit-log",
        target,
        "--set",
        "audit.required=true",
    )
    assert required.returncode == 2
    [error] = required.errors()
    assert error.startswith("moe-policy: error: cli:--audit-log:") and target in error


def test_a_bundled_model_by_name_and_a_model_directory(tmp_path):
    """--model takes a bundled config's name or a Hugging Face model directory, run from
    anywhere (here: a temporary directory)."""
    _, by_name = explain_record("--model", "qwen3-30b-a3b", *H200)
    assert by_name["context"]["model.num_experts"]["value"] == 128
    model_dir = tmp_path / "Qwen3-30B-A3B"
    model_dir.mkdir()
    (model_dir / "config.json").write_text((REPO / "configs/models/qwen3-30b-a3b.json").read_text())
    run = run_cli("explain", "--model", str(model_dir), *H200, "--json", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert run.json()["context"]["model.num_experts"]["origin"].startswith(
        f"file:{model_dir / 'config.json'}:"
    )


def test_an_unknown_model_name_lists_the_bundled_ones(tmp_path):
    run = run_cli("explain", "--model", "qwen3-30b", *H200)
    assert run.returncode == 2
    [line] = run.errors()
    assert "(did you mean 'qwen3-30b-a3b'?)" in line and "bundled: deepseek-v3," in line
    empty = run_cli("explain", "--model", str(tmp_path), *H200)
    assert empty.returncode == 2
    assert empty.errors() == [
        f"moe-policy: error: file:{tmp_path}: model directory '{tmp_path}' has no config.json"
    ]


def test_an_empty_model_is_an_error_not_the_current_directory(tmp_path):
    """`--model ""` names no model: it is refused, never read as `.` (whose config.json
    would then be decided on without a word)."""
    (tmp_path / "config.json").write_text((REPO / "configs/models/qwen3-30b-a3b.json").read_text())
    run = run_cli("explain", "--model", "", *H200, cwd=tmp_path)
    assert run.returncode == 2
    assert run.errors() == [
        "moe-policy: error: cli:--model: an empty value is not a model (give a config.json, "
        "a model directory or a bundled model's name)"
    ]


def test_a_relative_path_is_a_path_not_a_bundled_name(tmp_path):
    """`./qwen3-30b-a3b` is a file in the current directory: missing, it is an error, not
    the bundled model of that name."""
    run = run_cli("explain", "--model", "./qwen3-30b-a3b", *H200, cwd=tmp_path)
    assert run.returncode == 2
    assert run.errors() == ["moe-policy: error: file:./qwen3-30b-a3b: file not found"]
    (tmp_path / "qwen3-30b-a3b").write_text(
        (REPO / "configs/models/mixtral-8x7b-instruct-v0.1.json").read_text()
    )
    local = run_cli("explain", "--model", "./qwen3-30b-a3b", *H200, "--json", cwd=tmp_path)
    assert local.returncode == 0, local.stderr
    assert local.json()["context"]["model.num_experts"]["value"] == 8


def test_bundled_profiles_by_name():
    strict = run_cli(
        "explain", "--model", NEMOTRON_REL, *H200, "--lora", "--backend", "flashinfer_cutlass",
        "--profile", "strict",
    )  # fmt: skip
    assert strict.returncode == 3
    typo = run_cli("explain", "--model", NEMOTRON_REL, "--profile", "stric")
    assert typo.returncode == 2
    assert typo.errors() == [
        "moe-policy: error: cli:--profile: unknown profile 'stric' (did you mean 'strict'?); "
        "bundled: audit, prefer-trtllm-lora, strict"
    ]


def test_bundled_files_are_named_as_in_any_install(tmp_path: Path):
    """A bundled profile and model named from anywhere show as configs/..., never as the
    install's own path, in the record and in the report's origins."""
    args = ("explain", "--model", "qwen3-30b-a3b", *H200, "--profile", "strict")
    record = run_cli(*args, "--json", cwd=tmp_path)
    assert record.returncode == 0, record.stderr
    files = [f["path"] for f in json.loads(record.stdout)["policy"]["files"]]
    assert files == ["configs/default.yaml", "configs/profiles/strict.yaml"]
    report = run_cli(*args, cwd=tmp_path)
    assert "file:configs/profiles/strict.yaml:" in report.stdout
    assert "<model> = file:configs/models/qwen3-30b-a3b.json" in report.stdout
    assert "_configs" not in report.stdout + report.stderr
