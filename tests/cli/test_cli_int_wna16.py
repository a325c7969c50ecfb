"""GPTQ and AWQ weight-only integer MoE models decided for vLLM through the installed console
script: int4 weights, and int8 weights with unquantized activations, go to vLLM's int_wna16
oracle (its catalog and built-in policy), with LoRA too."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from moe_policy.core.engines import VLLM_0_33, oracle_for
from tests.bundled import QWEN3
from tests.cli.runner import run_cli, validate_record

GPTQ_REL = "configs/models/qwen3-30b-a3b-gptq-int4.json"
POLICY = "configs/engines/vllm-0.33/int_wna16-default.yaml"


def explain(*args: str) -> dict:
    run = run_cli("explain", "--engine", "vllm", "--json", *args)
    assert run.returncode == 0, run.stderr
    record = run.json()
    validate_record(record)
    return record


@pytest.mark.parametrize(
    ("args", "backend", "experts_class", "rule"),
    [
        # A100: Marlin's weight-only kernels (TRT-LLM MxInt4 is SM100 only).
        (("--capability", "8.0"), "marlin", "MarlinExperts", None),
        # H200: vLLM moves Humming ahead of Marlin (the dry run assumes its package).
        (("--capability", "9.0"), "humming", "HummingGroupedExperts",
         "hopper-prefers-humming-over-marlin"),
        # LoRA: Humming applies no adapters; Marlin does.
        (("--capability", "9.0", "--lora"), "marlin", "MarlinExperts",
         "hopper-prefers-humming-over-marlin"),
        # B200: GPTQ may load expert bias, which TRT-LLM's MxInt4 kernel does not apply.
        (("--capability", "10.0"), "marlin", "MarlinExperts", None),
        # TP 8: 768 / 8 = 96 is no multiple of the 128-wide groups, so no Marlin: Humming.
        (("--capability", "8.0", "--tp", "8"), "humming", "HummingGroupedExperts", None),
        # DeepEP low latency delivers the batched format.
        (("--capability", "8.0", "--tp", "2", "--dp", "2", "--ep", "--all2all",
          "deepep_low_latency"), "batched_marlin", "BatchedMarlinExperts", None),
    ],
)  # fmt: skip
def test_qwen3_gptq_int4(args, backend, experts_class, rule):
    record = explain("--model", GPTQ_REL, "--platform", "cuda", *args)
    assert (record["backend"], record["experts_class"]) == (backend, experts_class)
    assert [f["path"] for f in record["policy"]["files"]] == [POLICY]
    context = record["context"]
    assert context["model.quantization"]["value"] == "int4"
    assert context["model.quant.format"]["value"] == "gptq"
    assert context["model.quant.group_size"]["value"] == 128
    assert context["model.quantization"]["origin"].startswith(f"file:{GPTQ_REL}:")
    applied = [r["id"] for r in record["rules"] if r["applied"]]
    assert applied == ([rule] if rule else [])


def test_the_lora_explanation_names_the_backends_lora_removed():
    run = run_cli("explain", "--engine", "vllm", "--model", GPTQ_REL, "--platform", "cuda",
                  "--capability", "9.0", "--lora")  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert "marlin" in run.stdout and "humming" in run.stdout


def test_an_explicit_request_vllm_cannot_run_falls_back_with_a_warning_or_fails_strict():
    # Triton WNA16 does not apply the expert bias a GPTQ layer may carry.
    args = ("--model", GPTQ_REL, "--platform", "cuda", "--capability", "8.0", "--backend", "triton")
    record = explain(*args)
    assert record["backend"] == "marlin"
    strict = run_cli("explain", "--engine", "vllm", "--set", "mode=strict", *args)
    assert strict.returncode != 0
    error = strict.stderr.splitlines()[-1]
    assert error.startswith(
        "moe-policy: error: requested MoE backend 'triton' (from cli:--backend)"
    )
    assert "expert bias" in error


@pytest.mark.parametrize(
    ("args", "backend"),
    [
        # zentorch's DA8W4 kernel first (the dry run assumes the package), ...
        ((), "zen_cpu"),
        # ... but it needs every expert on the rank; then vLLM's AMX kernels.
        (("--tp", "2", "--ep", "--set", "cpu.arch=x86", "--set", "cpu.amx=true"), "cpu"),
    ],
)
def test_cpu(args, backend):
    assert explain("--model", GPTQ_REL, "--platform", "cpu", *args)["backend"] == backend


def test_cpu_without_amx_under_ep_has_no_backend_and_says_why():
    run = run_cli("explain", "--engine", "vllm", "--model", GPTQ_REL, "--platform", "cpu",
                  "--tp", "2", "--ep")  # fmt: skip
    assert run.returncode == 4, run.stdout + run.stderr
    assert "AMX" in run.stdout + run.stderr
    assert "every expert resident on the rank" in run.stdout + run.stderr


def test_weight_only_int8_goes_to_the_int_wna16_oracle_and_w8a8_does_not():
    assert oracle_for("int4") == oracle_for("int8", "none") == "int_wna16"
    assert oracle_for("int8", "dynamic_token") == "int8"
    assert VLLM_0_33.for_quantization("int8", activation="none").quantization == "int_wna16"


def test_lint_checks_the_int_wna16_policy_against_its_catalog():
    run = run_cli("lint", "--engine", "vllm/int_wna16", POLICY)
    assert run.returncode == 0, run.stdout + run.stderr


def test_a_weight_only_checkpoint_of_another_format_is_refused_with_the_reason(tmp_path):
    # compressed-tensors W4A16: vLLM's compressed-tensors WNA16 method, which the profile
    # does not describe, so no backend is decided by the GPTQ/AWQ rules.
    config = json.loads(Path(QWEN3).read_text())
    config["quantization_config"] = {
        "quant_method": "compressed-tensors",
        "format": "pack-quantized",
        "config_groups": {"group_0": {
            "targets": ["Linear"],
            "weights": {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 128,
                        "symmetric": True, "dynamic": False}}},
    }  # fmt: skip
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config, indent=2))
    run = run_cli("explain", "--engine", "vllm", "--model", str(path), "--platform", "cuda",
                  "--capability", "9.0")  # fmt: skip
    assert run.returncode == 4, run.stdout + run.stderr
    assert "describes the GPTQ and AWQ methods' int_wna16 layers only" in run.stdout + run.stderr
