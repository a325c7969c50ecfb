"""W4A8 int8 (int4 weights, int8 activations) MoE models decided for vLLM through the
installed console script: vLLM runs them on Arm CPUs only, with its w4a8_int8 oracle."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.bundled import QWEN3
from tests.cli.runner import run_cli, validate_record

POLICY = "configs/engines/vllm-0.33/w4a8_int8-default.yaml"
W4A8_INT8 = {
    "quant_method": "compressed-tensors",
    "format": "pack-quantized",
    "config_groups": {
        "group_0": {
            "targets": ["Linear"],
            "weights": {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 128,
                        "symmetric": True, "dynamic": False},
            "input_activations": {"num_bits": 8, "type": "int", "strategy": "token",
                                  "symmetric": True, "dynamic": True},
        }
    },
}  # fmt: skip


@pytest.fixture
def model(tmp_path: Path) -> Path:
    config = json.loads(Path(QWEN3).read_text())
    config["quantization_config"] = W4A8_INT8
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config, indent=2))
    return path


def test_an_arm_cpu_runs_it(model):
    run = run_cli("explain", "--engine", "vllm", "--json", "--model", str(model), "--platform",
                  "cpu", "--set", "cpu.arch=arm")  # fmt: skip
    assert run.returncode == 0, run.stderr
    record = run.json()
    validate_record(record)
    assert (record["backend"], record["experts_class"]) == ("cpu", "CPUExpertsInt4")
    assert [f["path"] for f in record["policy"]["files"]] == [POLICY]
    assert record["context"]["model.quantization"]["value"] == "w4a8_int8"


@pytest.mark.parametrize(
    "args",
    [
        ("--platform", "cpu", "--set", "cpu.arch=x86"),  # the kernels are Arm-only
        ("--platform", "cpu", "--set", "cpu.arch=arm", "--tp", "2", "--ep"),  # no EP
        ("--platform", "cuda", "--capability", "9.0"),  # vLLM has no GPU W4A8 int8 kernel
    ],
)
def test_elsewhere_there_is_no_backend(model, args):
    run = run_cli("explain", "--engine", "vllm", "--model", str(model), *args)
    assert run.returncode == 4, run.stdout + run.stderr


def test_lint_checks_the_w4a8_int8_policy_against_its_catalog():
    run = run_cli("lint", "--engine", "vllm/w4a8_int8", POLICY)
    assert run.returncode == 0, run.stdout + run.stderr
