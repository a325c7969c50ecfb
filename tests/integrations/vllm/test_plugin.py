"""The vLLM plugin through vLLM's own plugin loader and its own UnquantizedFusedMoEMethod.

Only the platform, the FlashInfer/AITER probes and the environment are faked (as vLLM's
own tests do); the loader, the method, the oracle and the experts classes are vLLM's.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from importlib.metadata import entry_points
from types import SimpleNamespace

import pytest

pytest.importorskip("vllm")

import vllm.plugins
from vllm.config import DeviceConfig, VllmConfig, set_current_vllm_config
from vllm.model_executor.layers.fused_moe import unquantized_fused_moe_method as method
from vllm.model_executor.layers.fused_moe.oracle import int8 as int8_oracle
from vllm.model_executor.layers.fused_moe.oracle import int_wna16 as wna16_oracle
from vllm.model_executor.layers.fused_moe.oracle import mxfp8 as mxfp8_oracle
from vllm.model_executor.layers.fused_moe.oracle import nvfp4 as nvfp4_oracle
from vllm.model_executor.layers.fused_moe.oracle import unquantized as oracle
from vllm.model_executor.layers.fused_moe.oracle import w4a8 as w4a8_oracle
from vllm.model_executor.layers.quantization import fp8 as fp8_method
from vllm.model_executor.layers.quantization import mxfp4 as mxfp4_method

from moe_policy import BackendOverrideError, BackendOverrideWarning, PolicyError
from moe_policy.core.state import STATE
from moe_policy.integrations.vllm import plugin, selection
from tests.integrations.vllm.harness import MODELS, Case, faked_platform, moe_config

VLLM_SELECT = oracle.select_unquantized_moe_backend
VLLM_SELECT_FP8 = fp8_method.select_fp8_moe_backend
VLLM_SELECT_MXFP4 = mxfp4_method.select_mxfp4_moe_backend
VLLM_SELECT_NVFP4 = nvfp4_oracle.select_nvfp4_moe_backend
VLLM_SELECT_WNA16 = wna16_oracle.select_wna16_moe_backend
VLLM_SELECT_MXFP8 = mxfp8_oracle.select_mxfp8_moe_backend
VLLM_SELECT_INT8 = int8_oracle.select_int8_moe_backend
VLLM_SELECT_W4A8 = w4a8_oracle.select_w4a8_moe_backend
ENTRY = "moe_policy.integrations.vllm.plugin:register"
#: Nemotron-3-Nano's routed experts (non-gated relu2) with LoRA on an H200.
NEMOTRON_LORA = Case(
    name="nemotron/h200/lora", capability=(9, 0), lora=True, **MODELS["nemotron-3-nano"]
)


@pytest.fixture(scope="module")
def installed_entry_point(tmp_path_factory) -> Iterator[None]:
    """The ``moe_policy`` entry point in ``vllm.general_plugins`` (a package install has it;
    a checkout on PYTHONPATH gets an equivalent distribution for the duration)."""
    found = [e for e in entry_points(group="vllm.general_plugins") if e.name == "moe_policy"]
    if found:
        assert found[0].value == ENTRY
        yield
        return
    root = tmp_path_factory.mktemp("dist")
    info = root / "moe_policy_plugin-0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: moe-policy-plugin\nVersion: 0\n")
    (info / "entry_points.txt").write_text(f"[vllm.general_plugins]\nmoe_policy = {ENTRY}\n")
    sys.path.insert(0, str(root))
    yield
    sys.path.remove(str(root))


@pytest.fixture
def clean(monkeypatch) -> Iterator[None]:
    """No policy variables, a fresh loader, vLLM's own selector back after each test."""
    for name in [n for n in os.environ if n.startswith("MOE_POLICY_")]:
        monkeypatch.delenv(name)
    monkeypatch.setattr(vllm.plugins, "plugins_loaded", False)
    STATE.selectors.clear()
    STATE.reporting.clear()
    yield
    method.select_unquantized_moe_backend = VLLM_SELECT
    oracle.select_unquantized_moe_backend = VLLM_SELECT
    for module in _fp8_callers():
        module.select_fp8_moe_backend = VLLM_SELECT_FP8
    for name in plugin.MXFP4_CALLERS:
        if name in sys.modules:
            sys.modules[name].select_mxfp4_moe_backend = VLLM_SELECT_MXFP4
    for name in plugin.NVFP4_CALLERS:
        if name in sys.modules:
            sys.modules[name].select_nvfp4_moe_backend = VLLM_SELECT_NVFP4
    for name in plugin.MXFP8_CALLERS:
        if name in sys.modules:
            sys.modules[name].select_mxfp8_moe_backend = VLLM_SELECT_MXFP8
    for name in plugin.INT8_CALLERS:
        if name in sys.modules:
            sys.modules[name].select_int8_moe_backend = VLLM_SELECT_INT8
    for name in plugin.W4A8_CALLERS:
        if name in sys.modules:
            sys.modules[name].select_w4a8_moe_backend = VLLM_SELECT_W4A8
    for name in plugin.WNA16_CALLERS:
        if name in sys.modules:
            sys.modules[name].select_wna16_moe_backend = VLLM_SELECT_WNA16
    STATE.selectors.clear()


def _fp8_callers() -> list[object]:
    """The loaded modules that bind vLLM's fp8 selector by name."""
    return [sys.modules[name] for name in plugin.FP8_CALLERS if name in sys.modules]


def load_plugins(monkeypatch, selected: str | None = "moe_policy") -> None:
    if selected is None:
        monkeypatch.delenv("VLLM_PLUGINS", raising=False)
    else:
        monkeypatch.setenv("VLLM_PLUGINS", selected)
    vllm.plugins.load_general_plugins()


@contextmanager
def layer_build(case: Case, env: dict[str, str]) -> Iterator[None]:
    """vLLM's config context and the case's fake platform, with ``env`` set inside it."""
    config = VllmConfig(device_config=DeviceConfig(device="cpu"))
    with set_current_vllm_config(config), faked_platform(case):
        os.environ.update(env)
        yield


def build_method(case: Case, env: dict[str, str]) -> tuple[object, list[warnings.WarningMessage]]:
    with layer_build(case, env), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        built = method.UnquantizedFusedMoEMethod(moe_config(case))
    return built, caught


pytestmark = pytest.mark.usefixtures("installed_entry_point", "clean")


def test_the_loader_installs_the_selector_once(monkeypatch):
    load_plugins(monkeypatch)
    installed = method.select_unquantized_moe_backend
    assert getattr(installed, plugin.MARK) is True
    assert oracle.select_unquantized_moe_backend is installed
    plugin.register()  # vLLM loads plugins in several places; a second call changes nothing
    assert method.select_unquantized_moe_backend is installed


def test_disabled_plugin_leaves_vllm_as_it_is(monkeypatch):
    load_plugins(monkeypatch, selected="some_other_plugin")
    assert method.select_unquantized_moe_backend is VLLM_SELECT
    built, _ = build_method(NEMOTRON_LORA, {"MOE_POLICY_BACKEND": "flashinfer_cutlass"})
    assert built.unquantized_backend is oracle.UnquantizedMoeBackend.TRITON


def test_an_overridden_request_is_warned_audited_and_named(monkeypatch, tmp_path, caplog):
    load_plugins(monkeypatch)
    audit = tmp_path / "audit.jsonl"
    env = {"MOE_POLICY_BACKEND": "flashinfer_cutlass", "MOE_POLICY_AUDIT_LOG": str(audit)}
    built, caught = build_method(NEMOTRON_LORA, env)
    assert built.unquantized_backend is oracle.UnquantizedMoeBackend.TRITON
    assert built.experts_cls.__name__ == "TritonExperts"
    [warning] = [w.message for w in caught if isinstance(w.message, BackendOverrideWarning)]
    assert warning.override.origin == "env:MOE_POLICY_BACKEND"
    assert warning.override.reason_code.value == "lora_unsupported"
    [line] = audit.read_text().splitlines()
    record = json.loads(line)
    assert (record["backend"], record["outcome"]) == ("triton", "overridden")
    requested = record["requested"]
    assert (requested["backend"], requested["origin"]) == (
        "flashinfer_cutlass",
        "env:MOE_POLICY_BACKEND",
    )
    assert record["context"]["engine"]["value"] == "vllm"


def test_strict_mode_fails_the_layer_build_with_the_policy_message(monkeypatch):
    load_plugins(monkeypatch)
    env = {"MOE_POLICY_BACKEND": "flashinfer_cutlass", "MOE_POLICY_MODE": "strict"}
    with pytest.raises(
        BackendOverrideError, match=r"'flashinfer_cutlass' \(from env:MOE_POLICY_BACKEND\)"
    ):
        build_method(NEMOTRON_LORA, env)


def test_bad_settings_are_reported_when_vllm_loads_the_plugin(monkeypatch, caplog):
    """A bad MOE_POLICY_* value shows in the log as vLLM loads the plugin, before any model is
    downloaded; routing is installed all the same, so the first MoE layer stops on it (vLLM's
    loader only logs what a plugin raises: raising would leave vLLM's own selection running)."""
    monkeypatch.setenv("MOE_POLICY_MODE", "strictt")
    with caplog.at_level(logging.ERROR, logger="moe_policy"):
        load_plugins(monkeypatch)
    [record] = [r for r in caplog.records if r.getMessage().startswith("moe_policy.settings_")]
    fields = record.moe_policy  # type: ignore[attr-defined]
    assert (fields["event"], fields["origin"]) == (
        "moe_policy.settings_invalid",
        "env:MOE_POLICY_MODE",
    )
    assert "strictt" in fields["error"]
    assert method.select_unquantized_moe_backend is not VLLM_SELECT
    with pytest.raises(PolicyError, match=r"^env:MOE_POLICY_MODE: "):
        build_method(QWEN3_H200, {})


def test_good_settings_are_not_reported_at_load(monkeypatch, caplog):
    monkeypatch.setenv("MOE_POLICY_MODE", "strict")
    with caplog.at_level(logging.DEBUG, logger="moe_policy"):
        load_plugins(monkeypatch)
    assert not [r for r in caplog.records if "settings_invalid" in r.getMessage()]


def test_a_typo_in_the_backend_variable_is_one_clear_error(monkeypatch):
    load_plugins(monkeypatch)
    with pytest.raises(
        PolicyError, match=r"^env:MOE_POLICY_BACKEND: .*did you mean 'flashinfer_cutlass'"
    ):
        build_method(NEMOTRON_LORA, {"MOE_POLICY_BACKEND": "flashinfer_cutlas"})


def test_a_broken_policy_file_names_its_line(monkeypatch, tmp_path):
    load_plugins(monkeypatch)
    policy = tmp_path / "serving.yaml"
    policy.write_text("version: 1\nmode: stric\n")
    with pytest.raises(PolicyError, match=r"serving.yaml:2:\d+"):
        build_method(NEMOTRON_LORA, {"MOE_POLICY_FILES": str(policy)})


def test_lora_with_deepep_low_latency_is_refused_at_selection(monkeypatch):
    """vLLM 0.33's LoRA layer asserts allgather_reducescatter under EP; the plugin says so at
    selection, naming where the all2all kind came from."""
    load_plugins(monkeypatch)
    case = Case(
        name="qwen3/lora/ep-ll", lora=True, ep=True, dp=2, all2all="deepep_low_latency",
        **MODELS["qwen3-30b-a3b"],
    )  # fmt: skip
    with pytest.raises(
        PolicyError, match=r"^vllm:parallel_config.all2all_backend: .*allgather_reducescatter"
    ):
        build_method(case, {})


def test_layers_with_one_signature_share_one_resolution(monkeypatch):
    load_plugins(monkeypatch)
    with layer_build(NEMOTRON_LORA, {}):
        config = moe_config(NEMOTRON_LORA)
        for _ in range(48):
            method.UnquantizedFusedMoEMethod(config)
    [selector] = [s for k, s in STATE.selectors.items() if k[0] == "vllm"]
    assert selector.resolver.resolutions == 1
    assert len(selection.decisions()) == 48


def test_events_reach_vllms_handler(monkeypatch, capsys):
    """As in `vllm serve`: vLLM's handler on its logger, none on the root logger."""
    import logging

    load_plugins(monkeypatch)
    vllm_logger = logging.getLogger("vllm")
    handler = logging.StreamHandler(sys.stderr)
    monkeypatch.setattr(vllm_logger, "handlers", [handler])
    monkeypatch.setattr(vllm_logger, "level", logging.INFO)  # vLLM's configure_logging
    monkeypatch.setattr(logging.getLogger(), "handlers", [])
    moe_logger = logging.getLogger("moe_policy")
    monkeypatch.setattr(moe_logger, "handlers", [])
    monkeypatch.setattr(moe_logger, "propagate", True)
    monkeypatch.setattr(moe_logger, "level", logging.NOTSET)
    import structlog

    structlog.reset_defaults()
    build_method(NEMOTRON_LORA, {"MOE_POLICY_BACKEND": "flashinfer_cutlass"})
    err = capsys.readouterr().err
    assert "moe_policy.request_overridden" in err and "reason_code=lora_unsupported" in err
    assert err.count("moe_policy.decision ") == 1
    assert moe_logger.propagate is True


def test_the_cost_benchmark_runs_and_writes_its_figures(tmp_path):
    import subprocess

    out = tmp_path / "cost.json"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.vllm_plugin",
            "--layers",
            "4",
            "--loads",
            "2",
            "--out",
            str(out),
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    result = json.loads(out.read_text())
    assert result["layers"] == 4 and result["loads"] == 2
    assert result["plugin_ms_median"] > 0 and result["vllm_ms_median"] > 0


#: DeepSeek-V3's routed experts with its fp8 128x128 blocks, on an H200.
DEEPSEEK_FP8 = Case(name="deepseek-v3/fp8/h200", quant="fp8-block", **MODELS["deepseek-v3"])


def build_fp8_method(case: Case, env: dict[str, str]) -> tuple[object, list]:
    """vLLM's own Fp8MoEMethod for the case's layer (a block-fp8 checkpoint's config)."""
    config = fp8_method.Fp8Config(
        is_checkpoint_fp8_serialized=True, activation_scheme="dynamic", weight_block_size=[128, 128]
    )
    with layer_build(case, env), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        built = fp8_method.Fp8MoEMethod(config, SimpleNamespace(moe_config=moe_config(case)))
    return built, caught


def test_the_fp8_selector_is_installed_where_vllm_calls_it(monkeypatch):
    load_plugins(monkeypatch)
    callers = _fp8_callers()
    assert fp8_method in callers and len(callers) >= 3
    installed = fp8_method.select_fp8_moe_backend
    assert getattr(installed, plugin.MARK) is True
    assert all(module.select_fp8_moe_backend is installed for module in callers)


def test_an_fp8_layer_is_decided_warned_and_audited(monkeypatch, tmp_path):
    load_plugins(monkeypatch)
    audit = tmp_path / "audit.jsonl"
    env = {"MOE_POLICY_BACKEND": "flashinfer_trtllm", "MOE_POLICY_AUDIT_LOG": str(audit)}
    built, caught = build_fp8_method(DEEPSEEK_FP8, env)
    # TRT-LLM runs on the SM100 family only: the policy's SM90 block-fp8 choice runs instead.
    assert built.fp8_backend.name == "TRITON"
    assert built.experts_cls.__name__ == "TritonExperts"
    [warning] = [w.message for w in caught if isinstance(w.message, BackendOverrideWarning)]
    assert warning.override.reason_code.value == "device_capability_unsupported"
    [line] = audit.read_text().splitlines()
    context = json.loads(line)["context"]
    assert context["model.quantization"] == {"value": "fp8", "origin": "vllm:weight_key"}
    assert context["model.quant.block"]["value"] == "128x128"
    assert context["model.quant.activation"]["value"] == "dynamic_group"


def test_an_fp8_layer_in_strict_mode_refuses_like_vllm(monkeypatch):
    load_plugins(monkeypatch)
    env = {"MOE_POLICY_BACKEND": "flashinfer_trtllm", "MOE_POLICY_MODE": "strict"}
    with pytest.raises(BackendOverrideError, match="flashinfer_trtllm"):
        build_fp8_method(DEEPSEEK_FP8, env)


def test_without_the_plugin_vllm_decides_fp8_itself(monkeypatch):
    load_plugins(monkeypatch, selected="some_other_plugin")
    assert fp8_method.select_fp8_moe_backend is VLLM_SELECT_FP8
    built, _ = build_fp8_method(DEEPSEEK_FP8, {"MOE_POLICY_BACKEND": "flashinfer_trtllm"})
    assert built.fp8_backend.name == "TRITON"  # vLLM's own SM90 block-fp8 choice


#: DeepSeek-V3's fp8 layer on an H200 with DeepGEMM installed and vLLM's DeepGEMM switches on.
DEEPSEEK_FP8_DEEP_GEMM = dataclasses.replace(
    DEEPSEEK_FP8,
    name="deepseek-v3/fp8/h200/deep_gemm-switches",
    deep_gemm=True,
    env=(("VLLM_USE_DEEP_GEMM", "1"), ("VLLM_MOE_USE_DEEP_GEMM", "1")),
)


def _audited(path) -> dict:
    [line] = path.read_text().splitlines()
    return json.loads(line)


def test_the_deep_gemm_switches_request_deep_gemm_from_the_environment_layer(monkeypatch, tmp_path):
    """Alone, the switches make the plugin take DeepGEMM, as vLLM's fp8 oracle does, with the
    variable as the request's origin (the environment layer, as in a dry run)."""
    load_plugins(monkeypatch)
    audit = tmp_path / "audit.jsonl"
    built, caught = build_fp8_method(DEEPSEEK_FP8_DEEP_GEMM, {"MOE_POLICY_AUDIT_LOG": str(audit)})
    assert built.fp8_backend.name == "DEEPGEMM"
    assert not [w for w in caught if isinstance(w.message, BackendOverrideWarning)]
    record = _audited(audit)
    assert (record["backend"], record["outcome"]) == ("deep_gemm", "honored")
    assert record["requested"]["origin"] == "env:VLLM_USE_DEEP_GEMM"
    assert record["notices"] == []  # no "has no effect" for switches the fp8 oracle reads


def test_moe_policy_backend_beats_the_deep_gemm_switches_inside_vllm(monkeypatch, tmp_path):
    """MOE_POLICY_BACKEND is read after vLLM's switches in the environment layer, so it wins
    over DeepGEMM inside vLLM too: honoured where it runs, no warning."""
    load_plugins(monkeypatch)
    audit = tmp_path / "audit.jsonl"
    env = {"MOE_POLICY_BACKEND": "triton", "MOE_POLICY_AUDIT_LOG": str(audit)}
    built, caught = build_fp8_method(DEEPSEEK_FP8_DEEP_GEMM, env)
    assert built.fp8_backend.name == "TRITON"
    assert not [w for w in caught if isinstance(w.message, BackendOverrideWarning)]
    record = _audited(audit)
    assert (record["backend"], record["outcome"]) == ("triton", "honored")
    assert record["requested"]["origin"] == "env:MOE_POLICY_BACKEND"


def test_an_unrunnable_moe_policy_backend_over_the_switches_is_warned_not_deep_gemm(
    monkeypatch, tmp_path
):
    """MOE_POLICY_BACKEND that cannot run here is the request overridden (warned, named), the
    policy's choice runs; the DeepGEMM switches it beat do not come back."""
    load_plugins(monkeypatch)
    audit = tmp_path / "audit.jsonl"
    env = {"MOE_POLICY_BACKEND": "flashinfer_trtllm", "MOE_POLICY_AUDIT_LOG": str(audit)}
    built, caught = build_fp8_method(DEEPSEEK_FP8_DEEP_GEMM, env)
    [warning] = [w.message for w in caught if isinstance(w.message, BackendOverrideWarning)]
    assert warning.override.origin == "env:MOE_POLICY_BACKEND"
    assert warning.override.reason_code.value == "device_capability_unsupported"
    record = _audited(audit)
    assert record["outcome"] == "overridden"
    assert record["requested"]["backend"] == "flashinfer_trtllm"
    assert built.fp8_backend.name == "TRITON"  # the SM90 block-fp8 rule, not the switches
    with pytest.raises(BackendOverrideError, match=r"\(from env:MOE_POLICY_BACKEND\)"):
        build_fp8_method(DEEPSEEK_FP8_DEEP_GEMM, {**env, "MOE_POLICY_MODE": "strict"})


def test_moe_backend_beats_moe_policy_backend_and_the_switches(monkeypatch, tmp_path):
    load_plugins(monkeypatch)
    audit = tmp_path / "audit.jsonl"
    case = dataclasses.replace(DEEPSEEK_FP8_DEEP_GEMM, moe_backend="flashinfer_cutlass")
    env = {"MOE_POLICY_BACKEND": "triton", "MOE_POLICY_AUDIT_LOG": str(audit)}
    built, _ = build_fp8_method(case, env)
    assert built.fp8_backend.name == "FLASHINFER_CUTLASS"
    assert _audited(audit)["requested"]["origin"] == "vllm:--moe-backend"


def test_a_gpt_oss_layer_is_decided_through_the_policy(monkeypatch, tmp_path):
    """vLLM's own GptOssMxfp4MoEMethod on a B200: TRT-LLM's mxfp4 x bf16 kernel, audited."""
    from tests.integrations.vllm.harness import vllm_config

    load_plugins(monkeypatch)
    assert getattr(mxfp4_method.select_mxfp4_moe_backend, plugin.MARK) is True
    case = Case(name="gpt-oss/b200", quant="mxfp4", capability=(10, 0), **MODELS["gpt-oss-20b"])
    audit = tmp_path / "audit.jsonl"
    monkeypatch.setenv("MOE_POLICY_AUDIT_LOG", str(audit))
    with faked_platform(case), set_current_vllm_config(vllm_config(case)):
        built = mxfp4_method.GptOssMxfp4MoEMethod(moe_config(case))
    assert built.mxfp4_backend.name == "FLASHINFER_TRTLLM_MXFP4_BF16"
    assert built.experts_cls.__name__ == "TrtLlmMxfp4ExpertsMonolithic"
    [line] = audit.read_text().splitlines()
    record = json.loads(line)
    assert record["backend"] == "flashinfer_trtllm"
    assert record["context"]["model.quantization"]["value"] == "mxfp4"


def test_the_nvfp4_selector_is_installed_where_vllm_calls_it(monkeypatch):
    from vllm.model_executor.layers.quantization import modelopt

    load_plugins(monkeypatch)
    installed = modelopt.select_nvfp4_moe_backend
    assert getattr(installed, plugin.MARK) is True
    assert nvfp4_oracle.select_nvfp4_moe_backend is installed


def test_the_wna16_selector_is_installed_in_the_gptq_and_awq_methods_only(monkeypatch):
    from vllm.model_executor.layers.quantization import auto_awq, auto_gptq
    from vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors_moe import (
        compressed_tensors_moe_wna16 as ct_wna16,
    )

    load_plugins(monkeypatch)
    for module in (auto_gptq, auto_awq):
        assert getattr(module.select_wna16_moe_backend, plugin.MARK) is True
    # compressed-tensors (and MoeWNA16, Quark) layers keep vLLM's own selection
    assert ct_wna16.select_wna16_moe_backend is VLLM_SELECT_WNA16
    assert wna16_oracle.select_wna16_moe_backend is VLLM_SELECT_WNA16


def build_gptq_method(case: Case, env: dict[str, str]) -> object:
    """vLLM's own AutoGPTQMoEMethod for the case's layer (it selects on construction)."""
    from vllm.model_executor.layers.quantization.auto_gptq import (
        AutoGPTQConfig,
        AutoGPTQMoEMethod,
    )

    from tests.integrations.vllm.harness import QUANTS

    with layer_build(case, env):
        config = AutoGPTQConfig.from_config(QUANTS[str(case.quant)])
        return AutoGPTQMoEMethod(config, moe_config(case))


QWEN3_GPTQ = Case(name="qwen3-gptq", **MODELS["qwen3-30b-a3b"], platform="cuda",
                  capability=(8, 0), quant="gptq-int4")  # fmt: skip


def test_a_gptq_layer_is_decided_warned_and_audited(monkeypatch, tmp_path):
    load_plugins(monkeypatch)
    audit = tmp_path / "audit.jsonl"
    env = {"MOE_POLICY_BACKEND": "triton", "MOE_POLICY_AUDIT_LOG": str(audit)}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        built = build_gptq_method(QWEN3_GPTQ, env)
    # GPTQ layers may carry expert bias, which Triton WNA16 does not apply: Marlin runs.
    assert built.wna16_moe_backend.name == "MARLIN"
    assert built.experts_cls.__name__ == "MarlinExperts"
    [warning] = [w.message for w in caught if isinstance(w.message, BackendOverrideWarning)]
    assert warning.override.reason_code.value == "quantization_unsupported"
    [line] = audit.read_text().splitlines()
    context = json.loads(line)["context"]
    assert context["model.quantization"] == {"value": "int4", "origin": "vllm:quant_config"}
    assert context["model.quant.format"]["value"] == "gptq"
    assert context["model.quant.group_size"]["value"] == 128


def test_a_gptq_layer_in_strict_mode_refuses_like_vllm(monkeypatch):
    load_plugins(monkeypatch)
    env = {"MOE_POLICY_BACKEND": "triton", "MOE_POLICY_MODE": "strict"}
    with pytest.raises(BackendOverrideError, match="triton"):
        build_gptq_method(QWEN3_GPTQ, env)


def test_an_unknown_moe_backend_for_a_gptq_layer_is_one_error_with_a_did_you_mean(monkeypatch):
    load_plugins(monkeypatch)
    case = Case(**{**QWEN3_GPTQ.__dict__, "moe_backend": "marlim"})
    with pytest.raises(PolicyError) as raised:
        build_gptq_method(case, {})
    assert "vllm:--moe-backend" in str(raised.value) and "'marlin'" in str(raised.value)


def test_an_mxfp8_layer_is_decided_through_the_policy_and_audited(monkeypatch, tmp_path):
    from vllm.model_executor.layers.quantization import modelopt

    load_plugins(monkeypatch)
    installed = modelopt.select_mxfp8_moe_backend
    assert getattr(installed, plugin.MARK) is True
    assert mxfp8_oracle.select_mxfp8_moe_backend is installed
    audit = tmp_path / "audit.jsonl"
    case = Case(name="qwen3-mxfp8", **MODELS["qwen3-30b-a3b"], platform="cuda",
                capability=(10, 0), quant="mxfp8", lora=True)  # fmt: skip
    with layer_build(case, {"MOE_POLICY_AUDIT_LOG": str(audit)}):
        backend, experts = installed(config=moe_config(case))
    # LoRA: neither TRT-LLM nor DeepGEMM applies adapters; Marlin does.
    assert (backend.name, experts.__name__) == ("MARLIN", "MarlinExperts")
    [line] = audit.read_text().splitlines()
    context = json.loads(line)["context"]
    assert context["model.quantization"] == {"value": "mxfp8", "origin": "vllm:weight_key"}
    assert context["model.quant.activation"]["value"] == "dynamic_group"


def test_an_int8_layer_is_decided_through_the_policy_and_audited(monkeypatch, tmp_path):
    from vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors_moe import (
        compressed_tensors_moe_w8a8_int8 as ct_int8,
    )
    from vllm.model_executor.layers.quantization.utils import quant_utils as qk

    load_plugins(monkeypatch)
    installed = ct_int8.select_int8_moe_backend
    assert getattr(installed, plugin.MARK) is True
    assert int8_oracle.select_int8_moe_backend is installed
    audit = tmp_path / "audit.jsonl"
    case = Case(name="qwen3-w8a8", **MODELS["qwen3-30b-a3b"], platform="cuda",
                capability=(9, 0), quant="int8-channel-token", moe_backend="humming")  # fmt: skip
    env = {"MOE_POLICY_AUDIT_LOG": str(audit)}
    with layer_build(case, env), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        backend, experts = installed(
            config=moe_config(case),
            weight_key=qk.kInt8StaticChannelSym,
            activation_key=qk.kInt8DynamicTokenSym,
        )
    # humming is not installed here: vLLM would fail start-up; warn mode runs Triton.
    assert (backend.name, experts.__name__) == ("TRITON", "TritonExperts")
    assert any(isinstance(w.message, BackendOverrideWarning) for w in caught)
    [line] = audit.read_text().splitlines()
    context = json.loads(line)["context"]
    assert context["model.quantization"] == {"value": "int8", "origin": "vllm:weight_key"}
    assert context["model.quant.activation"]["value"] == "dynamic_token"


def test_a_w4a8_layer_is_decided_through_the_policy_and_audited(monkeypatch, tmp_path):
    from vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors_moe import (
        compressed_tensors_moe_w4a8_fp8 as ct_w4a8,
    )

    load_plugins(monkeypatch)
    installed = ct_w4a8.select_w4a8_moe_backend
    assert getattr(installed, plugin.MARK) is True
    assert w4a8_oracle.select_w4a8_moe_backend is installed
    audit = tmp_path / "audit.jsonl"
    case = Case(name="qwen3-w4a8", **MODELS["qwen3-30b-a3b"], platform="cuda",
                capability=(9, 0), quant="w4a8-fp8")  # fmt: skip
    with layer_build(case, {"MOE_POLICY_AUDIT_LOG": str(audit)}):
        backend, experts = installed(config=moe_config(case))
    assert (backend.name, experts.__name__) == ("CUTLASS", "CutlassExpertsW4A8Fp8")
    [line] = audit.read_text().splitlines()
    context = json.loads(line)["context"]
    assert context["model.quantization"] == {"value": "w4a8_fp8", "origin": "vllm:weight_key"}
    assert context["model.quant.group_size"]["value"] == 128


def test_the_w4a8_int8_selector_is_installed_where_vllm_calls_it(monkeypatch):
    from vllm.model_executor.layers.fused_moe.oracle import w4a8_int8 as w4a8_int8_oracle
    from vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors_moe import (
        compressed_tensors_moe_w4a8_int8 as ct_w4a8_int8,
    )

    original = w4a8_int8_oracle.select_w4a8_int8_moe_backend
    monkeypatch.setattr(ct_w4a8_int8, "select_w4a8_int8_moe_backend", original)
    monkeypatch.setattr(w4a8_int8_oracle, "select_w4a8_int8_moe_backend", original)
    load_plugins(monkeypatch)
    installed = ct_w4a8_int8.select_w4a8_int8_moe_backend
    assert getattr(installed, plugin.MARK) is True
    assert w4a8_int8_oracle.select_w4a8_int8_moe_backend is installed


# --- start-up failures as a deployment meets them ------------------------------------------

#: Qwen3-30B-A3B's routed experts on one H200, no parallelism: vLLM's prepare/finalize is the
#: standard one (MoEPrepareAndFinalizeNoDPEP).
QWEN3_H200 = Case(name="qwen3/h200", **MODELS["qwen3-30b-a3b"])


def build_kernel(case: Case, built: object) -> object:
    """vLLM's own make_unquantized_moe_kernel for what the method selected: its
    prepare/finalize, then the experts class (no GPU needed on this path)."""
    from vllm.model_executor.layers.fused_moe.config import FUSED_MOE_UNQUANTIZED_CONFIG

    with layer_build(case, {}):
        return oracle.make_unquantized_moe_kernel(
            FUSED_MOE_UNQUANTIZED_CONFIG,
            moe_config(case),
            built.unquantized_backend,  # type: ignore[attr-defined]
            built.experts_cls,  # type: ignore[attr-defined]
        )


@pytest.mark.parametrize(
    ("case", "env", "origin"),
    [
        (QWEN3_H200, {"MOE_POLICY_BACKEND": "batched_triton"}, "env:MOE_POLICY_BACKEND"),
        (Case(**{**QWEN3_H200.__dict__, "moe_backend": "batched_triton"}), {},
         "vllm:--moe-backend"),
    ],
)  # fmt: skip
def test_batched_triton_without_a_batched_prepare_finalize_is_a_request_that_cannot_run(
    monkeypatch, case, env, origin
):
    """vLLM builds the batched format only under DeepEP low-latency / NIXL-EP (or on XPU for
    --moe-backend batched_triton): elsewhere BatchedTritonExperts cannot be built. The plugin
    warns and runs a class whose kernel builds; strict mode refuses, naming the request."""
    load_plugins(monkeypatch)
    built, caught = build_method(case, env)
    assert built.unquantized_backend is oracle.UnquantizedMoeBackend.TRITON
    [warning] = [w.message for w in caught if isinstance(w.message, BackendOverrideWarning)]
    assert warning.override.origin == origin
    assert warning.override.reason_code.value == "activation_format_mismatch"
    build_kernel(case, built)  # vLLM builds it
    STATE.selectors.clear()
    with pytest.raises(BackendOverrideError, match=rf"'batched_triton' \(from {origin}\)"):
        build_method(case, {**env, "MOE_POLICY_MODE": "strict"})


def test_vllms_own_batched_triton_pick_is_what_the_plugin_refuses(monkeypatch):
    """Without the plugin vLLM 0.33 picks BatchedTritonExperts for --moe-backend batched_triton
    on CUDA, and fails building its kernel (after loading the weights)."""
    load_plugins(monkeypatch, selected="some_other_plugin")
    case = Case(**{**QWEN3_H200.__dict__, "moe_backend": "batched_triton"})
    built, _ = build_method(case, {})
    assert built.experts_cls.__name__ == "BatchedTritonExperts"
    with pytest.raises(TypeError, match="max_num_tokens"):
        build_kernel(case, built)


def test_batched_triton_on_xpu_keeps_vllms_batched_prepare_finalize(monkeypatch):
    load_plugins(monkeypatch)
    case = Case(**{**QWEN3_H200.__dict__, "platform": "xpu", "capability": None,
                   "moe_backend": "batched_triton"})  # fmt: skip
    built, caught = build_method(case, {})
    assert built.experts_cls.__name__ == "BatchedTritonExperts"
    assert not [w for w in caught if isinstance(w.message, BackendOverrideWarning)]
    kernel = build_kernel(case, built)
    assert type(kernel.prepare_finalize).__name__ == "BatchedPrepareAndFinalize"


def test_batched_triton_from_the_environment_on_xpu_is_decided_in_vllms_format(monkeypatch):
    """MOE_POLICY_BACKEND=batched_triton on XPU without vLLM's --moe-backend: vLLM builds the
    standard prepare/finalize, so the plugin decides in that format (the profile alone would
    take the request for --moe-backend's): warned, and a standard-format class (building
    XPU's kernel needs XPU's compiled ops)."""
    import vllm.model_executor.layers.fused_moe.modular_kernel as mk

    load_plugins(monkeypatch)
    case = Case(**{**QWEN3_H200.__dict__, "platform": "xpu", "capability": None})
    built, caught = build_method(case, {"MOE_POLICY_BACKEND": "batched_triton"})
    [warning] = [w.message for w in caught if isinstance(w.message, BackendOverrideWarning)]
    assert warning.override.reason_code.value == "activation_format_mismatch"
    assert warning.override.origin == "env:MOE_POLICY_BACKEND"
    standard = mk.FusedMoEActivationFormat.Standard
    assert built.experts_cls.activation_format() == standard  # type: ignore[attr-defined]


def test_lora_under_a_batched_prepare_finalize_gets_no_standard_class(monkeypatch):
    """XPU's batched prepare/finalize (--moe-backend batched_triton) with LoRA: no batched
    class applies LoRA, and a standard one (vLLM's LoRA branch returns TritonExperts) would not
    build. The format is kept: no backend, every candidate named."""
    from moe_policy import NoFeasibleBackendError

    load_plugins(monkeypatch)
    case = Case(**{**QWEN3_H200.__dict__, "platform": "xpu", "capability": None,
                   "moe_backend": "batched_triton", "lora": True})  # fmt: skip
    with pytest.raises(NoFeasibleBackendError) as raised:
        build_method(case, {})
    text = str(raised.value)
    assert "batched_triton: lora_unsupported" in text
    assert "triton: activation_format_mismatch" in text
    context = raised.value.decision.context
    fmt, origin = context["parallel.activation_format"]
    assert (fmt, origin.startswith("derived:")) == ("batched", True) and "XPU" in origin


def test_layers_that_differ_only_in_hash_routing_are_decided_apart(monkeypatch):
    """DeepSeek-V4's first layers route by hash, the rest by score: vLLM's monolithic TRT-LLM
    kernel refuses hash routing. A layer must not reuse a decision made for another layer
    whose FusedMoEConfig differs, whatever the build order."""
    load_plugins(monkeypatch)
    case = Case(**{**QWEN3_H200.__dict__, "capability": (10, 0)})
    with layer_build(case, {}):
        plain, hashed = moe_config(case), moe_config(case)
        hashed.has_hash_routing = True
        first = method.UnquantizedFusedMoEMethod(plain)
        second = method.UnquantizedFusedMoEMethod(hashed)
        fmt = selection._activation_format(hashed, False)
        cls = second.experts_cls
        assert cls.is_supported_config(cls, hashed, None, None, fmt) == (True, None)
        assert VLLM_SELECT(hashed) == (second.unquantized_backend, second.experts_cls)
    assert first.experts_cls.__name__ == "TrtLlmBf16ExpertsMonolithic"
    assert second.experts_cls.__name__ == "FlashInferExperts"


def test_a_class_vllm_refuses_for_the_layer_is_never_handed_over(monkeypatch):
    """The last line of defence: the class handed back is asked vLLM's is_supported_config for
    the layer being built; a refusal is an error naming vLLM's reason."""
    from vllm.model_executor.layers.fused_moe.experts.trtllm_bf16_moe import (
        TrtLlmBf16ExpertsMonolithic,
    )

    case = Case(**{**QWEN3_H200.__dict__, "capability": (10, 0)})
    with layer_build(case, {}):
        config = moe_config(case)
        backend, _ = selection.select_unquantized_moe_backend(config)
        [decision] = selection.decisions()[-1:]
        assert decision.experts_class == "TrtLlmBf16ExpertsMonolithic"
        config.has_hash_routing = True
        selector = selection.selector_for(config)  # another signature: nothing verified yet
        with pytest.raises(PolicyError, match=r"^vllm:is_supported_config: .*hash routing"):
            selection._buildable_class(
                selector, backend, [TrtLlmBf16ExpertsMonolithic], decision, lambda: config
            )


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("moe_policy", r"MOE_POLICY_ENGINE='moe_policy' names moe_policy, .*vllm==0\.33 profile"),
        ("vllm==0.30", r"no profile describes vllm 0\.30"),
        ("vlm", r"unknown engine 'vlm' \(did you mean 'vllm'\?\)"),
    ],
)
def test_moe_policy_engine_naming_another_engine_is_an_error_not_ignored(
    monkeypatch, value, message
):
    load_plugins(monkeypatch)
    with pytest.raises(PolicyError, match=rf"^env:MOE_POLICY_ENGINE: {message}"):
        build_method(QWEN3_H200, {"MOE_POLICY_ENGINE": value})


def test_moe_policy_engine_naming_this_vllm_is_accepted(monkeypatch):
    load_plugins(monkeypatch)
    built, _ = build_method(QWEN3_H200, {"MOE_POLICY_ENGINE": "vllm==0.33.0"})
    assert built.unquantized_backend is oracle.UnquantizedMoeBackend.TRITON


def test_another_oracles_backend_from_the_environment_is_overridden_on_an_unquantized_layer(
    monkeypatch,
):
    """MOE_POLICY_BACKEND=marlin, set for a GPTQ model, on an unquantized layer (a draft layer,
    say): warned as a request that cannot run here, and a kernel vLLM builds."""
    load_plugins(monkeypatch)
    built, caught = build_method(QWEN3_H200, {"MOE_POLICY_BACKEND": "marlin"})
    [warning] = [w.message for w in caught if isinstance(w.message, BackendOverrideWarning)]
    assert warning.override.reason_code.value == "quantization_unsupported"
    assert warning.override.origin == "env:MOE_POLICY_BACKEND"
    assert built.unquantized_backend is oracle.UnquantizedMoeBackend.TRITON
    build_kernel(QWEN3_H200, built)


def test_a_required_audit_that_cannot_be_written_names_where_it_was_set(monkeypatch, tmp_path):
    load_plugins(monkeypatch)
    env = {"MOE_POLICY_AUDIT_LOG": str(tmp_path / "missing" / "audit.jsonl"),
           "MOE_POLICY_AUDIT_REQUIRED": "1"}  # fmt: skip
    with pytest.raises(OSError) as raised:
        build_method(QWEN3_H200, env)
    text = str(raised.value)
    assert text.startswith("env:MOE_POLICY_AUDIT_LOG: audit log ")
    assert "No such file or directory" in text
    assert text.endswith("(the audit is required by env:MOE_POLICY_AUDIT_REQUIRED)")


def test_a_required_audit_set_in_a_policy_file_names_its_lines(monkeypatch, tmp_path):
    load_plugins(monkeypatch)
    policy = tmp_path / "serving.yaml"
    policy.write_text(f"version: 1\naudit:\n  path: {tmp_path}\n  required: true\n")
    with pytest.raises(OSError, match=r"^file:.*serving\.yaml:3:\d+: .*serving\.yaml:4:\d+\)$"):
        build_method(QWEN3_H200, {"MOE_POLICY_FILES": str(policy)})


def test_prefill_context_parallelism_is_refused_naming_it(monkeypatch):
    """vLLM flattens PCP ranks into the experts' shards and all2all kernels, which the
    profile's layout facts do not describe: one error, not a decision on wrong facts."""
    import dataclasses

    load_plugins(monkeypatch)
    with layer_build(QWEN3_H200, {}):
        config = moe_config(QWEN3_H200)
        config.moe_parallel_config = dataclasses.replace(
            config.moe_parallel_config, pcp_size=2, tp_size=2
        )
        with pytest.raises(
            PolicyError, match=r"^vllm:parallel_config.prefill_context_parallel_size: "
        ):
            method.UnquantizedFusedMoEMethod(config)


def test_events_reach_the_applications_own_handlers_once(monkeypatch):
    """An application that configured the root logger (a log shipper, pytest's capture) gets
    moe_policy's records through propagation; they are not also copied into vLLM's handler,
    and the plugin changes no logger's propagation."""
    import logging

    class Collect(logging.Handler):
        def __init__(self) -> None:
            super().__init__()
            self.records: list[logging.LogRecord] = []

        def emit(self, record: logging.LogRecord) -> None:
            self.records.append(record)

    load_plugins(monkeypatch)
    app, vllm_side = Collect(), Collect()
    monkeypatch.setattr(logging.getLogger(), "handlers", [app])
    monkeypatch.setattr(logging.getLogger("vllm"), "handlers", [vllm_side])
    moe_logger = logging.getLogger("moe_policy")
    monkeypatch.setattr(moe_logger, "handlers", [])
    monkeypatch.setattr(moe_logger, "propagate", True)
    monkeypatch.setattr(moe_logger, "level", logging.INFO)
    import structlog

    structlog.reset_defaults()
    build_method(NEMOTRON_LORA, {"MOE_POLICY_BACKEND": "flashinfer_cutlass"})
    events = [r.getMessage().split()[0] for r in app.records if r.name == "moe_policy"]
    assert "moe_policy.request_overridden" in events and "moe_policy.decision" in events
    assert vllm_side.records == []
    assert moe_logger.propagate is True
