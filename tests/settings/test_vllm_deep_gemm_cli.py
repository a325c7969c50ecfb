"""vLLM's DeepGEMM switches in a dry run, end to end: the console script with the variables in
the subprocess environment (docs/policy.md, Environment variables; docs/vllm.md, What
changes). The environment layer reads them as vLLM's fp8 oracle does, the same derivation the
plugin uses (moe_policy.settings.vllm_switches)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.cli.runner import explain_record, run_cli, settings_rows

DEEPSEEK = ("--engine", "vllm", "--model", "configs/models/deepseek-v3.json")  # fp8, 128x128
QWEN = ("--engine", "vllm", "--model", "configs/models/qwen3-30b-a3b.json")  # unquantized
H200 = ("--platform", "cuda", "--capability", "9.0")
BOTH_ON = {"VLLM_USE_DEEP_GEMM": "1", "VLLM_MOE_USE_DEEP_GEMM": "1"}
#: DeepEP low latency: vLLM's prepare/finalize delivers the batched format.
BATCHED = ("--set", "parallel.dp=2", "--set", "parallel.ep=true",
           "--set", "parallel.all2all=deepep_low_latency")  # fmt: skip


def _names(record: dict[str, Any]) -> list[str]:
    return [n["name"] for n in record["notices"]]


def _settings_row(text: str, key: str) -> str:
    """The Settings table's row for ``key`` and its indented lines, blanks collapsed."""
    return " ".join(" ".join(settings_rows(text, key)).split())


@pytest.mark.parametrize(
    ("env", "origin"),
    [
        (BOTH_ON, "env:VLLM_USE_DEEP_GEMM"),
        ({"VLLM_MOE_USE_DEEP_GEMM": "1"}, "env:VLLM_MOE_USE_DEEP_GEMM"),  # the other defaults on
        ({"VLLM_USE_DEEP_GEMM": "2"}, "env:VLLM_USE_DEEP_GEMM"),  # vLLM: bool(int())
    ],
)
def test_fp8_deep_gemm_switches_request_deep_gemm_in_the_environment_layer(
    env: dict[str, str], origin: str
) -> None:
    """As vLLM's fp8 oracle: set and on, the switches request DeepGEMM, with the variable as
    origin; no notice claims they have no effect on this fp8 model."""
    run, record = explain_record(*DEEPSEEK, *H200, env=env)
    assert record["backend"] == "deep_gemm"
    assert record["outcome"] == "honored"
    assert record["requested"] == {"backend": "deep_gemm", "origin": origin, "adapted_from": None}
    assert _names(record) == []
    assert "knob_ignored" not in run.stderr
    text = run_cli("explain", *DEEPSEEK, *H200, env={**env, "COLUMNS": "400"}).stdout
    assert f"backend deep_gemm {origin}" in _settings_row(text, "backend")


def test_under_the_batched_format_the_request_is_batched_deep_gemm() -> None:
    """vLLM swaps in BatchedDeepGemmExperts under the batched format; the dry run adapts the
    request the same way, keeping the variable as its origin."""
    _, record = explain_record(*DEEPSEEK, *H200, *BATCHED, env=BOTH_ON)
    assert record["backend"] == "batched_deep_gemm"
    assert record["requested"] == {
        "backend": "batched_deep_gemm",
        "origin": "env:VLLM_USE_DEEP_GEMM",
        "adapted_from": "deep_gemm",
    }
    [adaptation] = record["adaptations"]
    assert adaptation["origin"] == "env:VLLM_USE_DEEP_GEMM"


def test_moe_policy_backend_beats_the_deep_gemm_switches() -> None:
    """Both are the environment layer; MOE_POLICY_BACKEND is read after vLLM's switches (as
    after VLLM_ROCM_USE_AITER), and the DeepGEMM request is shown as a value it beat."""
    env = {**BOTH_ON, "MOE_POLICY_BACKEND": "triton"}
    _, record = explain_record(*DEEPSEEK, *H200, env=env)
    assert record["backend"] == "triton"
    assert record["requested"]["origin"] == "env:MOE_POLICY_BACKEND"
    text = run_cli("explain", *DEEPSEEK, *H200, env={**env, "COLUMNS": "400"}).stdout
    assert "triton env:MOE_POLICY_BACKEND beat deep_gemm (env:VLLM_USE_DEEP_GEMM)" in (
        _settings_row(text, "backend")
    )


def test_an_explicit_backend_beats_both() -> None:
    env = {**BOTH_ON, "MOE_POLICY_BACKEND": "triton"}
    args = (*DEEPSEEK, *H200, "--backend", "flashinfer_cutlass")
    _, record = explain_record(*args, env=env)
    assert record["backend"] == "flashinfer_cutlass"
    assert record["requested"]["origin"] == "cli:--backend"
    text = run_cli("explain", *args, env={**env, "COLUMNS": "400"}).stdout
    row = _settings_row(text, "backend")
    order = ["flashinfer_cutlass cli:--backend", "beat triton (env:MOE_POLICY_BACKEND)",
             "beat deep_gemm (env:VLLM_USE_DEEP_GEMM)"]  # fmt: skip
    positions = [row.find(part) for part in order]
    assert -1 not in positions and positions == sorted(positions), row


@pytest.mark.parametrize("name", ["VLLM_USE_DEEP_GEMM", "VLLM_MOE_USE_DEEP_GEMM"])
def test_a_switch_set_off_takes_deep_gemm_out(name: str) -> None:
    """Set to 0, either switch takes DeepGEMM out of the fp8 oracle's reach: the ``packages``
    fact names the switch, and a request for DeepGEMM is overridden."""
    _, record = explain_record(*DEEPSEEK, *H200, "--backend", "deep_gemm", env={name: "0"})
    packages = record["context"]["packages"]
    assert "deep_gemm" not in packages["value"]
    assert f"deep_gemm switched off by env:{name}" in packages["origin"]
    assert record["outcome"] == "overridden"
    [deep_gemm] = [c for c in record["candidates"] if c["backend"] == "deep_gemm"]
    assert deep_gemm["reason_code"] == "package_unavailable"
    assert _names(record) == []


def test_a_value_vllm_cannot_read_is_an_error_naming_the_variable() -> None:
    run = run_cli("explain", *DEEPSEEK, *H200, "-q", env={"VLLM_MOE_USE_DEEP_GEMM": "on"})
    assert run.returncode == 2
    assert "env:VLLM_MOE_USE_DEEP_GEMM: VLLM_MOE_USE_DEEP_GEMM='on' is not a value vLLM reads" in (
        run.stderr
    )


@pytest.mark.parametrize(
    ("args", "where"),
    [
        (QWEN, "this layer goes to vLLM's unquantized oracle"),
        (("--engine", "vllm", "--model", "configs/models/gpt-oss-120b.json"),
         "this layer goes to vLLM's mxfp4 oracle"),
        (QWEN[2:], "this decision is for the moe_policy engine"),
    ],
)  # fmt: skip
def test_where_the_switches_have_no_effect_a_notice_says_who_reads_them(
    args: tuple[str, ...], where: str
) -> None:
    """Only where the oracle deciding the layer does not read them: an unquantized layer,
    another oracle, or this package's own engine."""
    run, record = explain_record(*args, *H200, env=BOTH_ON)
    assert record["requested"] is None
    details = {n["name"]: n["detail"] for n in record["notices"]}
    # VLLM_USE_DEEP_GEMM also drives dense fp8 GEMMs: no notice for it
    assert details == {
        "VLLM_MOE_USE_DEEP_GEMM": "has no effect on the MoE backend choice: it is read only by "
        f"vLLM's fp8 MoE oracle, and {where}",
    }
    assert "FP8 MoE only" not in run.stderr
