"""The documented precedence, end to end: real policy files, the console script, and the
variables in the subprocess environment (docs/policy.md, Precedence and Environment
variables)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.cli.runner import H200, explain_record, run_cli, settings_rows

QWEN = "configs/models/qwen3-30b-a3b.json"
ROCM = ("--platform", "rocm", "--capability", "9.4")


def test_a_key_in_two_files_then_env_then_flag_keeps_every_beaten_origin(tmp_path: Path) -> None:
    """built-in < file a < file b < environment < --backend, each beaten value shown with its
    origin; the request's origin in the record is the flag's."""
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_text("backend: flashinfer_cutlass\n")
    b.write_text("backend: flashinfer_trtllm\n")
    env = {"MOE_POLICY_FILES": f"{a}{os.pathsep}{b}", "MOE_POLICY_BACKEND": "reference"}
    run = run_cli("explain", "--model", QWEN, *H200, "--backend", "triton", env=env)
    assert run.returncode == 0, run.stderr
    # wrapped cells split paths anywhere: compare with every blank removed
    text = "".join("".join(settings_rows(run.stdout, "backend")).split())
    order = [
        "triton cli:--backend",
        "beat reference (env:MOE_POLICY_BACKEND)",
        f"beat flashinfer_trtllm (file:{b}:1:10)",
        f"beat flashinfer_cutlass (file:{a}:1:10)",
        "beat auto (file:configs/default.yaml:",
    ]
    positions = [text.find("".join(part.split())) for part in order]
    assert -1 not in positions and positions == sorted(positions), text
    _, record = explain_record("--model", QWEN, *H200, "--backend", "triton", env=env)
    assert record["requested"]["origin"] == "cli:--backend"


def test_profile_alone_replaces_moe_policy_files(tmp_path: Path) -> None:
    """`--profile` files are files given explicitly: MOE_POLICY_FILES is ignored, with a
    notice, and the mode it set does not apply."""
    site = tmp_path / "site.yaml"
    site.write_text("consistency: warn\n")
    _, record = explain_record(
        "--model", QWEN, *H200, "--profile", "strict", env={"MOE_POLICY_FILES": str(site)}
    )
    assert [f["path"] for f in record["policy"]["files"]] == [
        "configs/default.yaml",
        "configs/profiles/strict.yaml",
    ]
    assert record["mode"] == "strict"
    [notice] = record["notices"]
    assert notice["name"] == "MOE_POLICY_FILES"
    assert notice["detail"] == "ignored: policy files were given explicitly (cli:--profile)"


def test_moe_policy_backend_beats_the_aiter_request() -> None:
    """Both are the environment layer; MOE_POLICY_BACKEND is read after vLLM's switch, and the
    AITER request is shown as a value it beat."""
    env = {"VLLM_ROCM_USE_AITER": "1", "MOE_POLICY_BACKEND": "triton"}
    args = ("--engine", "vllm", "--model", QWEN, *ROCM)
    _, record = explain_record(*args, env=env)
    assert record["requested"]["origin"] == "env:MOE_POLICY_BACKEND"
    assert record["context"]["rocm.aiter"] == {"value": True, "origin": "env:VLLM_ROCM_USE_AITER"}
    run = run_cli("explain", *args, env={**env, "COLUMNS": "400"})
    text = " ".join(" ".join(settings_rows(run.stdout, "backend")).split())
    assert "triton env:MOE_POLICY_BACKEND beat aiter (env:VLLM_ROCM_USE_AITER)" in text, text


@pytest.mark.parametrize("name", ["VLLM_ROCM_USE_AITER", "VLLM_BATCH_INVARIANT"])
def test_an_empty_vllm_switch_is_an_error_not_ignored(name: str) -> None:
    """Only MOE_POLICY_* variables set empty are ignored; a vLLM switch set empty is an error
    naming it."""
    run = run_cli("explain", "--model", QWEN, *ROCM, "-q", env={name: ""})
    assert run.returncode == 2
    assert f"env:{name}: expected true, false, 1 or 0, got ''" in run.stderr


def test_a_misspelt_engine_variable_is_an_error_even_when_engine_is_given() -> None:
    """--engine beats MOE_POLICY_ENGINE, but a misspelt variable is still bad input."""
    run = run_cli(
        "explain", "--engine", "vllm", "--model", QWEN, *H200, env={"MOE_POLICY_ENGINE": "vlm"}
    )
    assert run.returncode == 2
    assert run.errors() == [
        "moe-policy: error: env:MOE_POLICY_ENGINE: unknown engine 'vlm' (did you mean "
        "'vllm'?); known: moe_policy, vllm"
    ]
    ok = run_cli(
        "explain", "--engine", "moe_policy", "--model", QWEN, *H200, "-q",
        env={"MOE_POLICY_ENGINE": "vllm"},
    )  # fmt: skip
    assert ok.returncode == 0, ok.stderr


def test_a_strict_refusal_names_where_strict_mode_was_set(tmp_path: Path) -> None:
    """The refusal says which layer set strict, so the user knows where a mode: warn must go
    to win (a policy file would lose to MOE_POLICY_MODE)."""
    run = run_cli(
        "explain", "--model", QWEN, *H200, "--lora", "--backend", "flashinfer_cutlass",
        env={"MOE_POLICY_MODE": "strict"},
    )  # fmt: skip
    assert run.returncode == 3
    [error] = run.errors()
    assert (
        "but mode is strict (set by env:MOE_POLICY_MODE; mode: warn in a layer that beats" in error
    )
