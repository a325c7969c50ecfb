"""Quantized models decided for vLLM through the installed console script: the model's
scheme picks vLLM's oracle for it (its catalog and built-in policy), and a scheme without
one is one error line naming where the scheme came from."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from moe_policy import PolicyError
from moe_policy.core.engines import VLLM_0_33, resolve_engine
from tests.bundled import DEEPSEEK, QWEN3, REPO
from tests.cli.runner import run_cli, validate_record

DEEPSEEK_REL = str(Path(DEEPSEEK).relative_to(REPO))
FP8_POLICY = "configs/engines/vllm-0.33/fp8-default.yaml"


def explain(*args: str) -> dict:
    run = run_cli("explain", "--engine", "vllm", "--json", *args)
    assert run.returncode == 0, run.stderr
    record = run.json()
    validate_record(record)
    return record


@pytest.mark.parametrize(
    ("args", "backend", "experts_class", "rule"),
    [
        # SM90, block fp8, tensor parallel: vLLM moves Triton to the front.
        ((), "triton", "TritonExperts", "hopper-block-fp8-tp-prefers-triton"),
        # ... and keeps it under LoRA (TritonExperts applies LoRA; the FlashInfer ones do not).
        (("--lora",), "triton", "TritonExperts", "hopper-block-fp8-tp-prefers-triton"),
        # Under expert parallelism FlashInfer CUTLASS goes first.
        (("--tp", "2", "--ep"), "flashinfer_cutlass", "FlashInferExperts",
         "hopper-block-fp8-ep-prefers-flashinfer-cutlass"),
    ],
)  # fmt: skip
def test_deepseek_v3_fp8_block_on_hopper(args, backend, experts_class, rule):
    record = explain("--model", DEEPSEEK_REL, "--platform", "cuda", "--capability", "9.0", *args)
    assert (record["backend"], record["experts_class"]) == (backend, experts_class)
    context = record["context"]
    assert context["model.quantization"]["value"] == "fp8"
    assert context["model.quant.block"]["value"] == "128x128"
    assert context["model.quant.block"]["origin"].startswith(f"file:{DEEPSEEK_REL}:")
    applied = [r["id"] for r in record["rules"] if r.get("applied")]
    assert rule in applied
    assert any(FP8_POLICY in str(r.get("origin", "")) for r in record["rules"])


def test_deepseek_v3_on_blackwell_takes_trtllm_and_lora_takes_triton():
    common = ("--model", DEEPSEEK_REL, "--platform", "cuda", "--capability", "10.0")
    assert explain(*common)["experts_class"] == "TrtLlmFp8ExpertsMonolithic"
    lora = explain(*common, "--lora")
    assert lora["backend"] == "triton"
    trtllm = next(c for c in lora["candidates"] if c["backend"] == "flashinfer_trtllm")
    assert trtllm["reason_code"] == "lora_unsupported"


def test_own_engine_still_has_no_quantized_kernel():
    run = run_cli("explain", "--model", DEEPSEEK_REL, "--platform", "cuda", "--capability", "9.0")
    assert run.returncode == 4
    assert "quantization_unsupported" in run.stdout


def test_a_scheme_without_an_oracle_description_is_one_error():
    # Every scheme the quantization reader knows has a vLLM oracle description now; a scheme
    # without one (a profile of another release, a scheme added later) is refused, naming the
    # scheme's origin, rather than decided by another oracle's rules.
    with pytest.raises(PolicyError) as raised:
        VLLM_0_33.for_quantization("int2", "file:config.json:40:5")
    message = str(raised.value)
    assert message.startswith("file:config.json:40:5: ")
    assert "has no description of its int2 MoE oracle" in message
    assert "int_wna16" in message and "w4a8_int8" in message


def test_engine_oracle_suffix():
    assert resolve_engine("vllm/fp8").catalog_path.name == "fp8-backends.yaml"
    assert resolve_engine("vllm==0.33.0/fp8") == VLLM_0_33.for_quantization("fp8")
    with pytest.raises(PolicyError, match=r"no 'fp9' oracle \(did you mean 'fp8'\?\)"):
        resolve_engine("vllm/fp9", "cli:--engine")
    with pytest.raises(PolicyError, match="engine moe_policy has no 'fp8' oracle"):
        resolve_engine("moe_policy/fp8")


def test_lint_checks_the_fp8_policy_against_its_catalog():
    run = run_cli("lint", "--engine", "vllm/fp8", FP8_POLICY)
    assert run.returncode == 0, run.stdout + run.stderr
    # deep_gemm, marlin, ... are not unquantized backends: a vLLM policy may name them (one
    # file serves every oracle), and against the unquantized catalog each is a warning.
    wrong = run_cli("lint", "--engine", "vllm", FP8_POLICY)
    assert wrong.returncode == 0 and not wrong.errors(), wrong.stdout + wrong.stderr
    assert "lists deep_gemm, a backend of another of the engine's oracles" in wrong.stdout


GPT_OSS_REL = "configs/models/gpt-oss-120b.json"


@pytest.mark.parametrize(
    ("args", "backend", "experts_class"),
    [
        # B200: TRT-LLM's mxfp4 x bf16 kernel, monolithic without all2all kernels.
        (("--capability", "10.0"), "flashinfer_trtllm", "TrtLlmMxfp4ExpertsMonolithic"),
        # H200: triton_kernels (the dry run assumes its package), modular under EP with DP.
        (("--capability", "9.0"), "triton", "OAITritonMxfp4ExpertsMonolithic"),
        (("--capability", "9.0", "--dp", "2", "--ep", "--all2all", "deepep_high_throughput"),
         "triton", "OAITritonExperts"),
        # LoRA: of the mxfp4 kernels only Marlin (and the emulation) apply adapters.
        (("--capability", "9.0", "--lora"), "marlin", "MarlinExperts"),
        # RTX 50xx (SM120): vLLM puts Triton after Marlin.
        (("--capability", "12.0"), "marlin", "MarlinExperts"),
    ],
)  # fmt: skip
def test_gpt_oss_mxfp4(args, backend, experts_class):
    record = explain("--model", GPT_OSS_REL, "--platform", "cuda", *args)
    assert (record["backend"], record["experts_class"]) == (backend, experts_class)
    context = record["context"]
    assert context["model.quantization"]["value"] == "mxfp4"
    assert context["model.quant.group_size"]["value"] == 32
    assert context["model.quantization"]["origin"].startswith(f"file:{GPT_OSS_REL}:")


def test_lint_checks_the_mxfp4_policy_against_its_catalog():
    run = run_cli("lint", "--engine", "vllm/mxfp4", "configs/engines/vllm-0.33/mxfp4-default.yaml")
    assert run.returncode == 0, run.stdout + run.stderr


NVFP4_REL = "configs/models/qwen3-30b-a3b-nvfp4.json"


@pytest.mark.parametrize(
    ("args", "backend", "experts_class"),
    [
        # B200: TRT-LLM's nvfp4 kernel, monolithic without all2all kernels, modular with them.
        (("--capability", "10.0"), "flashinfer_trtllm", "TrtLlmNvFp4ExpertsMonolithic"),
        (("--capability", "10.0", "--dp", "2", "--ep", "--all2all", "deepep_high_throughput"),
         "flashinfer_trtllm", "TrtLlmNvFp4ExpertsModular"),
        # LoRA: only Marlin's weight-only kernel applies adapters.
        (("--capability", "10.0", "--lora"), "marlin", "MarlinExperts"),
        # H200: no W4A4 kernel before SM100; Humming (the dry run assumes its package).
        (("--capability", "9.0"), "humming", "HummingGroupedExperts"),
    ],
)  # fmt: skip
def test_nvfp4_on_blackwell(args, backend, experts_class):
    record = explain("--model", NVFP4_REL, "--platform", "cuda", *args)
    assert (record["backend"], record["experts_class"]) == (backend, experts_class)
    context = record["context"]
    assert context["model.quantization"]["value"] == "nvfp4"
    assert context["model.quant.activation"]["value"] == "dynamic_group"
    assert context["model.quantization"]["origin"].startswith(f"file:{NVFP4_REL}:")


def test_a_block_that_does_not_divide_the_shard_is_refined_as_vllm_does(tmp_path):
    """Qwen3-30B-A3B-FP8 at TP 4: 768 / 4 = 192 is no multiple of 128, so vLLM refines the
    checkpoint's 128x128 blocks to 64x64, which only Triton takes (TRT-LLM would win)."""
    config = json.loads(Path(QWEN3).read_text())
    config["quantization_config"] = {  # Qwen/Qwen3-30B-A3B-FP8
        "activation_scheme": "dynamic",
        "fmt": "e4m3",
        "quant_method": "fp8",
        "weight_block_size": [128, 128],
    }
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config, indent=2))
    b200 = ("--model", str(path), "--platform", "cuda", "--capability", "10.0")
    assert explain(*b200)["backend"] == "flashinfer_trtllm"
    record = explain(*b200, "--tp", "4")
    assert record["backend"] == "triton"
    block = record["context"]["model.quant.block"]
    assert block["value"] == "64x64" and block["origin"].startswith("derived:")


def test_one_policy_serves_every_oracle_and_still_catches_typos(tmp_path):
    """A fleet's policy names fp8 backends; an unquantized model decided with it is not an
    error (the rule has nothing to reorder there), a misspelt backend still is."""
    policy = tmp_path / "fleet.yaml"
    rule = "  - {id: dg-first, when: {platform: cuda}, effect: prefer, backends: [%s], reason: r}\n"
    policy.write_text("version: 1\nrules:\n" + rule % "deep_gemm")
    h200 = ("--platform", "cuda", "--capability", "9.0", "--policy", str(policy))
    qwen3 = explain("--model", str(Path(QWEN3).relative_to(REPO)), *h200)
    assert qwen3["backend"] == "triton"
    assert explain("--model", DEEPSEEK_REL, *h200)["backend"] == "deep_gemm"
    policy.write_text("version: 1\nrules:\n" + rule % "deep_gem")
    run = run_cli("explain", "--engine", "vllm", "--model", DEEPSEEK_REL, *h200)
    assert run.returncode == 2
    column = (rule % "deep_gem").index("deep_gem") + 1
    assert run.errors() == [
        f"moe-policy: error: file:{policy}:3:{column}: rule dg-first: unknown backend "
        "'deep_gem' (did you mean 'deep_gemm'?)"
    ]
