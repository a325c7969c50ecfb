"""int8 (w8a8) MoE models decided for vLLM through the installed console script: a
compressed-tensors W8A8 int8 checkpoint goes to vLLM's int8 oracle (its catalog and built-in
policy), with LoRA too."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.bundled import QWEN3
from tests.cli.runner import run_cli, validate_record

POLICY = "configs/engines/vllm-0.33/int8-default.yaml"
#: compressed-tensors W8A8 int8: per-channel weights, dynamic per-token activations.
W8A8 = {
    "quant_method": "compressed-tensors",
    "format": "int-quantized",
    "config_groups": {
        "group_0": {
            "targets": ["Linear"],
            "weights": {"num_bits": 8, "type": "int", "strategy": "channel", "symmetric": True,
                        "dynamic": False},
            "input_activations": {"num_bits": 8, "type": "int", "strategy": "token",
                                  "symmetric": True, "dynamic": True},
        }
    },
    "ignore": ["lm_head"],
}  # fmt: skip


@pytest.fixture
def model(tmp_path: Path) -> Path:
    config = json.loads(Path(QWEN3).read_text())
    config["quantization_config"] = W8A8
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config, indent=2))
    return path


def explain(*args: str) -> dict:
    run = run_cli("explain", "--engine", "vllm", "--json", *args)
    assert run.returncode == 0, run.stderr
    record = run.json()
    validate_record(record)
    return record


@pytest.mark.parametrize(
    ("args", "backend", "experts_class"),
    [
        (("--platform", "cuda", "--capability", "9.0"), "triton", "TritonExperts"),
        # TritonExperts applies LoRA.
        (("--platform", "cuda", "--capability", "9.0", "--lora"), "triton", "TritonExperts"),
        # DeepEP low latency delivers the batched format: Humming's batched class only.
        (("--platform", "cuda", "--capability", "9.0", "--dp", "2", "--ep", "--all2all",
          "deepep_low_latency"), "humming", "BatchedHummingGroupedExperts"),
        (("--platform", "rocm"), "triton", "TritonExperts"),
        (("--platform", "cpu", "--set", "cpu.arch=x86", "--set", "cpu.amx=true"), "cpu",
         "CPUExpertsInt8"),
    ],
)  # fmt: skip
def test_compressed_tensors_w8a8_int8(model, args, backend, experts_class):
    record = explain("--model", str(model), *args)
    assert (record["backend"], record["experts_class"]) == (backend, experts_class)
    assert [f["path"] for f in record["policy"]["files"]] == [POLICY]
    context = record["context"]
    assert context["model.quantization"]["value"] == "int8"
    assert context["model.quant.weight_scale"]["value"] == "channel"
    assert context["model.quant.activation"]["value"] == "dynamic_token"
    assert context["model.quantization"]["origin"].startswith(f"file:{model}:")


def test_before_turing_there_is_no_int8_kernel_and_the_reason_is_named(model):
    run = run_cli("explain", "--engine", "vllm", "--model", str(model), "--platform", "cuda",
                  "--capability", "7.0")  # fmt: skip
    assert run.returncode == 4, run.stdout + run.stderr
    assert "int8 tensor cores need SM75 or newer" in run.stdout + run.stderr


def test_lint_checks_the_int8_policy_against_its_catalog():
    run = run_cli("lint", "--engine", "vllm/int8", POLICY)
    assert run.returncode == 0, run.stdout + run.stderr
