"""The user story through the installed CLI: Nemotron-3-Nano with LoRA on an H200 (the demo)."""

from __future__ import annotations

import json

from tests.bundled import DEEPSEEK, NEMOTRON
from tests.cli.runner import H200, NEMOTRON_REL, explain_record, run_cli, validate_record

CUTLASS_ENV = {"MOE_POLICY_BACKEND": "flashinfer_cutlass"}
AUDIT_KEYS = {"timestamp", "host", "pid", "rank", "world_size", "count"}


def test_env_request_with_lora_is_overridden_to_triton_with_a_warning_event(tmp_path):
    """H200 + LoRA + env request for CUTLASS: Triton runs, exit 0, override event and audit line."""
    audit = tmp_path / "audit.jsonl"
    lora_args = ("--model", NEMOTRON_REL, *H200, "--lora")
    run, record = explain_record(*lora_args, "--audit-log", str(audit), env=CUTLASS_ENV)
    assert record["backend"] == "triton"
    assert record["outcome"] == "overridden"
    assert record["requested"] == {
        "backend": "flashinfer_cutlass",
        "origin": "env:MOE_POLICY_BACKEND",
        "adapted_from": None,
    }
    [override] = record["overrides"]
    assert (
        override["requested"],
        override["selected"],
        override["reason_code"],
        override["pass"],
        override["origin"],
    ) == ("flashinfer_cutlass", "triton", "lora_unsupported", "lora", "env:MOE_POLICY_BACKEND")
    assert record["context"]["lora.enabled"] == {"value": True, "origin": "cli:--lora"}
    assert record["context"]["device.capability"] == {"value": "9.0", "origin": "cli:--capability"}
    events = {e["event"]: e for e in run.events()}
    warning = events["moe_policy.request_overridden"]
    assert (warning["level"], warning["origin"], warning["reason_code"], warning["selected"]) == (
        "warning",
        "env:MOE_POLICY_BACKEND",
        "lora_unsupported",
        "triton",
    )
    assert events["moe_policy.decision"]["backend"] == "triton"
    assert run.errors() == []  # the override is an event, not a stray text line
    [line] = audit.read_text().splitlines()
    audited = json.loads(line)
    assert set(audited) >= AUDIT_KEYS and audited["count"] == 1
    validate_record({k: v for k, v in audited.items() if k not in AUDIT_KEYS})
    assert audited["fingerprint"] == record["fingerprint"]


def test_strict_mode_refuses_the_same_request_with_exit_3():
    """The same run in strict mode prints the record, then refuses on stderr naming the origin."""
    run = run_cli(
        "explain",
        "--model",
        NEMOTRON_REL,
        *H200,
        "--lora",
        "--mode",
        "strict",
        "--json",
        env=CUTLASS_ENV,
    )
    assert run.returncode == 3
    record = run.json()
    validate_record(record)
    assert (record["mode"], record["outcome"], record["backend"]) == (
        "strict",
        "overridden",
        "triton",
    )
    [error] = run.errors()
    assert "env:MOE_POLICY_BACKEND" in error and "lora_unsupported" in error
    assert "Traceback" not in run.stderr
    assert "moe_policy.request_overridden" in run.event_names()


def test_strict_mode_from_a_profile_file_refuses_too():
    """`mode: strict` from configs/profiles/strict.yaml has the same effect as --mode strict."""
    run = run_cli(
        "explain",
        "--model",
        NEMOTRON_REL,
        *H200,
        "--lora",
        "--json",
        "--policy",
        "configs/profiles/strict.yaml",
        env=CUTLASS_ENV,
    )
    assert run.returncode == 3
    record = run.json()
    assert record["mode"] == "strict"
    assert [f["path"] for f in record["policy"]["files"]] == [
        "configs/default.yaml",
        "configs/profiles/strict.yaml",
    ]


def test_without_lora_the_request_is_honoured_without_a_warning():
    """No LoRA: FlashInfer CUTLASS runs relu2 experts on SM90, as requested; no override event."""
    run = run_cli("explain", "--model", NEMOTRON_REL, *H200, "--json", env=CUTLASS_ENV)
    assert run.returncode == 0, run.stderr
    record = run.json()
    validate_record(record)
    assert (record["backend"], record["outcome"], record["overrides"]) == (
        "flashinfer_cutlass",
        "honored",
        [],
    )
    assert "moe_policy.request_overridden" not in run.event_names()
    assert [e["level"] for e in run.events()] == ["info"]


def test_lora_with_deepep_low_latency_runs_batched_triton():
    """LoRA plus the batched all2all keeps the batched format: batched_triton, never triton."""
    run = run_cli(
        "explain",
        "--model",
        NEMOTRON_REL,
        *H200,
        "--lora",
        "--ep",
        "--tp",
        "2",
        "--all2all",
        "deepep_low_latency",
        "--json",
    )
    assert run.returncode == 0, run.stderr
    record = run.json()
    validate_record(record)
    assert (record["backend"], record["activation_format"], record["outcome"]) == (
        "batched_triton",
        "batched",
        "auto",
    )
    triton = next(c for c in record["candidates"] if c["backend"] == "triton")
    assert triton["reason_code"] == "activation_format_mismatch"


def test_human_output_shows_ladder_context_candidates_rules_and_strict_outcome():
    """The default report names the origins, the rule that reordered and strict mode; fits 100 columns."""
    run = run_cli("explain", "--model", NEMOTRON_REL, *H200, "--lora", env=CUTLASS_ENV)
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert max(len(line) for line in lines) <= 100
    for fragment in (
        "configs/default.yaml",
        "env:MOE_POLICY_BACKEND",
        "cli:--lora",
        "lora_unsupported",
        "lora-prefers-triton",
        "file:configs/default.yaml:",
        "hopper-demotes-flashinfer",
        "refuse:",
        "device_capability_unsupported",
        "beat auto (file:configs/default.yaml:",
    ):
        assert fragment in run.stdout, fragment


def test_absolute_and_relative_model_paths_decide_alike():
    """The fingerprint does not depend on how the model path is spelled."""
    rel = run_cli("explain", "--model", NEMOTRON_REL, *H200, "--json").json()
    absolute = run_cli("explain", "--model", NEMOTRON, *H200, "--json").json()
    assert rel["fingerprint"] == absolute["fingerprint"]
    assert rel["decision_id"] != absolute["decision_id"]


def test_quantized_model_has_no_unquantized_backend_exit_4():
    """DeepSeek-V3 is FP8: every unquantized backend is eliminated, so nothing runs (exit 4)."""
    run = run_cli("explain", "--model", DEEPSEEK, *H200, "--json")
    assert run.returncode == 4
    record = run.json()
    validate_record(record)
    assert record["backend"] is None
    assert record["context"]["model.quantization"]["value"] == "fp8"
    codes = {c["backend"]: c["reason_code"] for c in record["candidates"]}
    assert all(c["status"] == "eliminated" for c in record["candidates"])
    # Every backend that runs on an SM90 CUDA device fails on the quantization; the rest
    # never run there at all.
    assert {b for b, code in codes.items() if code == "quantization_unsupported"} == {
        "triton",
        "batched_triton",
        "flashinfer_cutlass",
        "torch_grouped_mm",
        "reference",
    }
    assert set(codes.values()) == {
        "quantization_unsupported",
        "platform_unsupported",
        "device_capability_unsupported",
    }
    [error] = run.errors()
    assert "no MoE backend" in error and "quantization_unsupported" in error
    assert "moe_policy.no_feasible_backend" in run.event_names()
