"""mxfp8 MoE models decided for vLLM through the installed console script: a ModelOpt MXFP8
checkpoint goes to vLLM's mxfp8 oracle (its catalog and built-in policy), with LoRA too."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.bundled import QWEN3
from tests.cli.runner import run_cli, validate_record

POLICY = "configs/engines/vllm-0.33/mxfp8-default.yaml"
#: ModelOpt's MXFP8 export of a model (hf_quant_config's quant_algo in config.json).
MXFP8 = {"quant_method": "modelopt", "quant_algo": "MXFP8", "producer": {"name": "modelopt"},
         "ignore": ["lm_head"]}  # fmt: skip


@pytest.fixture
def model(tmp_path: Path) -> Path:
    config = json.loads(Path(QWEN3).read_text())
    config["quantization_config"] = MXFP8
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
    ("args", "backend", "experts_class", "rule"),
    [
        # B200: TRT-LLM's fp8 kernels take mxfp8 blocks; monolithic without all2all kernels ...
        (("--platform", "cuda", "--capability", "10.0"), "flashinfer_trtllm",
         "TrtLlmFp8ExpertsMonolithic", None),
        # ... modular with them.
        (("--platform", "cuda", "--capability", "10.0", "--dp", "2", "--ep", "--all2all",
          "deepep_v2"), "flashinfer_trtllm", "TrtLlmFp8ExpertsModular", None),
        # LoRA: neither TRT-LLM nor DeepGEMM applies adapters; Marlin does.
        (("--platform", "cuda", "--capability", "10.0", "--lora"), "marlin", "MarlinExperts",
         None),
        # H100: Humming ahead of Marlin (the dry run assumes its package).
        (("--platform", "cuda", "--capability", "9.0"), "humming", "HummingGroupedExperts",
         "hopper-prefers-humming-over-marlin"),
        (("--platform", "cuda", "--capability", "9.0", "--lora"), "marlin", "MarlinExperts",
         "hopper-prefers-humming-over-marlin"),
        # No mxfp8 kernel on a CPU: vLLM's emulation runs anywhere.
        (("--platform", "cpu",), "emulation", "Mxfp8EmulationTritonExperts", None),
        (("--platform", "xpu",), "xpu", "XPUExpertsMxFp8", None),
    ],
)  # fmt: skip
def test_modelopt_mxfp8(model, args, backend, experts_class, rule):
    record = explain("--model", str(model), *args)
    assert (record["backend"], record["experts_class"]) == (backend, experts_class)
    assert [f["path"] for f in record["policy"]["files"]] == [POLICY]
    context = record["context"]
    assert context["model.quantization"]["value"] == "mxfp8"
    assert context["model.quant.activation"]["value"] == "dynamic_group"
    assert context["model.quantization"]["origin"].startswith(f"file:{model}:")
    assert [r["id"] for r in record["rules"] if r["applied"]] == ([rule] if rule else [])


def test_deep_gemm_runs_where_trtllm_cannot(model):
    # DeepEP high throughput: neither of TRT-LLM's classes runs with it; DeepGEMM does.
    record = explain("--model", str(model), "--platform", "cuda", "--capability", "10.0",
                     "--dp", "2", "--ep", "--all2all", "deepep_high_throughput")  # fmt: skip
    assert record["backend"] == "deep_gemm"


def test_lint_checks_the_mxfp8_policy_against_its_catalog():
    run = run_cli("lint", "--engine", "vllm/mxfp8", POLICY)
    assert run.returncode == 0, run.stdout + run.stderr
