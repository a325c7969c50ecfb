"""W4A8 (int4 weights, fp8 activations) MoE models decided for vLLM through the installed
console script: a compressed-tensors W4A8 checkpoint goes to vLLM's w4a8 oracle (its catalog
and built-in policy)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.bundled import QWEN3
from tests.cli.runner import run_cli, validate_record

POLICY = "configs/engines/vllm-0.33/w4a8-default.yaml"
#: compressed-tensors W4A8: int4 weights in symmetric groups of 128, per-token fp8 activations.
W4A8 = {
    "quant_method": "compressed-tensors",
    "format": "pack-quantized",
    "config_groups": {
        "group_0": {
            "targets": ["Linear"],
            "weights": {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 128,
                        "symmetric": True, "dynamic": False},
            "input_activations": {"num_bits": 8, "type": "float", "strategy": "token",
                                  "symmetric": True, "dynamic": True},
        }
    },
    "ignore": ["lm_head"],
}  # fmt: skip


@pytest.fixture
def model(tmp_path: Path) -> Path:
    config = json.loads(Path(QWEN3).read_text())
    config["quantization_config"] = W4A8
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config, indent=2))
    return path


@pytest.mark.parametrize(
    ("args", "backend"),
    [
        # H100/H200: vLLM's CUTLASS int4 x fp8 grouped GEMMs.
        (("--capability", "9.0"), "vllm_cutlass"),
        # Elsewhere on CUDA only Humming (the dry run assumes its package).
        (("--capability", "10.0"), "humming"),
        # fp16 models: CUTLASS takes bf16 only.
        (("--capability", "9.0", "--dtype", "fp16"), "humming"),
    ],
)
def test_compressed_tensors_w4a8(model, args, backend):
    run = run_cli("explain", "--engine", "vllm", "--json", "--model", str(model),
                  "--platform", "cuda", *args)  # fmt: skip
    assert run.returncode == 0, run.stderr
    record = run.json()
    validate_record(record)
    assert record["backend"] == backend
    assert [f["path"] for f in record["policy"]["files"]] == [POLICY]
    context = record["context"]
    assert context["model.quantization"]["value"] == "w4a8_fp8"
    assert context["model.quant.activation"]["value"] == "dynamic_token"


def test_lora_finds_no_w4a8_kernel_and_says_why(model):
    # Neither CUTLASS nor Humming applies LoRA adapters.
    run = run_cli("explain", "--engine", "vllm", "--model", str(model), "--platform", "cuda",
                  "--capability", "9.0", "--lora")  # fmt: skip
    assert run.returncode == 4, run.stdout + run.stderr
    assert "lora" in (run.stdout + run.stderr).lower()


def test_lint_checks_the_w4a8_policy_against_its_catalog():
    run = run_cli("lint", "--engine", "vllm/w4a8", POLICY)
    assert run.returncode == 0, run.stdout + run.stderr
