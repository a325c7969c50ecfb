"""API keywords and overrides pass the checks config.json values get, and model configs
given as mappings are read by type: one PolicyError naming the origin, never a silent read."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import moe_policy
from moe_policy.api import Selector
from moe_policy.core.model import model_facts_from_mapping
from moe_policy.core.platform import PlatformFacts
from moe_policy.errors import PolicyError
from tests.bundled import MIXTRAL, NEMOTRON

H200 = {"platform": "cuda", "capability": "9.0", "device_name": "NVIDIA H200"}


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"tp": 0}, r"^api: parallel.tp must be at least 1, got 0"),
        ({"tp": "2"}, r"^api: parallel.tp: expected an integer, got '2' \(a string\)"),
        ({"dp": True}, r"^api: parallel.dp: expected an integer, got True"),
        ({"lora": "false"}, r"^api: lora.enabled: expected a boolean"),
        ({"capability": "9.0000001"}, r"^api: device.capability: not a compute capability"),
        ({"capability": 99999.99999}, r"^api: device.capability: not a compute capability"),
        ({"max_lora_rank": -8}, r"^api: lora.max_rank must be at least 1"),
        ({"ep": True, "tp": 1024}, r"^api: an expert-parallel group of 1024 ranks"),
        ({"overrides": {"model.num_experts": 0}}, r"^api: model.num_experts must be at least 1"),
        (
            {"overrides": {"model.top_k": 9999}},
            r"^api: model.top_k 9999 exceeds model.num_experts 128",
        ),
        ({"overrides": {"layer.index": -5}}, r"^api: layer.index must be at least 0, got -5"),
        ({"overrides": {"parallel.tp": None}}, r"^api: parallel.tp: no value given"),
        ({"overrides": {"model.gated": True}}, r"^api: model.activation relu2 is non-gated"),
        (
            {"overrides": {"model.activation": "swigluoai"}},
            r"^api: model.activation swigluoai is gated; model.gated false contradicts it",
        ),
        (
            {"overrides": {"model.activation": "swiglustep"}},
            r"^api: model.activation swiglustep is gated; model.gated false contradicts it",
        ),
        ({"audit_log": ""}, r"^api: audit.path: an empty value is not a path"),
    ],
)
def test_select_backend_keywords_are_checked_like_config_values(arguments, message):
    with pytest.raises(PolicyError, match=message):
        moe_policy.select_backend(NEMOTRON, **{**H200, **arguments})


def test_expert_parallel_group_up_to_the_expert_count_is_fine():
    """Mixtral's 8 experts over 8 EP ranks is a deployment; over 16 it is refused."""
    assert moe_policy.select_backend(MIXTRAL, **H200, ep=True, tp=8).backend is not None
    with pytest.raises(PolicyError, match=r"group of 16 ranks .* exceeds model.num_experts 8"):
        moe_policy.select_backend(MIXTRAL, **H200, ep=True, tp=16)


@pytest.mark.parametrize("index", [-5, True, "3", 2.0])
def test_a_layer_index_is_a_non_negative_integer(index):
    selector = Selector(NEMOTRON, environ={}, **H200)
    with pytest.raises(PolicyError, match=r"^api:layer_index: layer.index"):
        selector.select(index)
    assert selector.select(3).layer_index == 3


BASE = {"num_experts": 8, "num_experts_per_tok": 2, "hidden_size": 64, "moe_intermediate_size": 32}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"is_gated": "false"}, r"is_gated: gating: expected a boolean .*'false'"),
        ({"gated": 0}, r"gated: gating: expected a boolean"),
        ({"norm_topk_prob": "false"}, r"norm_topk_prob: top-k renormalisation: expected a boolean"),
        ({"n_shared_experts": -3}, r"n_shared_experts: shared expert count: must be at least 0"),
        ({"n_shared_experts": True}, r"n_shared_experts: .*expected an integer, got True"),
        ({"n_shared_experts": 2.7}, r"n_shared_experts: .*expected an integer, got 2.7"),
        ({"n_shared_experts": "2"}, r"n_shared_experts: .*expected an integer, got '2'"),
        (
            {"shared_expert_intermediate_size": {"a": 1}},
            r"shared_expert_intermediate_size: .*\(a dict\)",
        ),
        ({"num_experts": True}, r"num_experts: expert count .*expected an integer, got True"),
        ({"num_experts": 8.0}, r"num_experts: expert count .*expected an integer, got 8.0"),
        ({"moe_intermediate_size": 10**40}, r"moe_intermediate_size: .*integer out of range"),
        (
            {"architectures": {"MixtralForCausalLM": 1}},
            r"architectures: expected a list of class names",
        ),
        ({"architectures": [7]}, r"architectures: expected a list of class names"),
        ({"model_type": ["mixtral"]}, r"model_type: expected a string"),
        ({"quantization_config": "fp8"}, r"quantization_config: expected a mapping .*'fp8'"),
        ({"scoring_func": ["sigmoid"]}, r"scoring_func: scoring function: expected a string"),
        ({"topk_method": 1}, r"topk_method: top-k method: expected a string, got 1"),
        ({"n_group": "8"}, r"n_group: expert group count: expected an integer"),
        ({"n_group": 0}, r"n_group: expert group count: must be at least 1"),
        (
            {"moe_intermediate_size": None, "intermediate_size": 14336},
            r"moe_intermediate_size: the expert intermediate size is null",
        ),
    ],
)
def test_model_fields_are_read_by_type(change, message):
    with pytest.raises(PolicyError, match=rf"^api:model: {message}"):
        model_facts_from_mapping({**BASE, **change})


def test_typed_model_fields_still_read_their_values():
    facts = model_facts_from_mapping(
        {
            **BASE,
            "is_gated": False,
            "hidden_act": "relu2",
            "n_shared_experts": 0,
            "norm_topk_prob": False,
        }
    )
    assert facts.value("model.gated") is False
    assert facts.value("model.shared_experts") == 0
    assert facts.value("model.routing") == "softmax"
    sized = model_facts_from_mapping({**BASE, "shared_expert_intermediate_size": 0})
    assert sized.value("model.shared_experts") == 0


def test_every_bundled_model_config_still_loads():
    """The typed reading refuses nothing the shipped model configs say."""
    from moe_policy.core import paths
    from moe_policy.core.model import load_model

    names = paths.bundled(paths.MODELS_DIR, ".json")
    assert names
    for name, path in names.items():
        json.loads(Path(path).read_text())
        assert load_model(path).value("model.num_experts") >= 1, name


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({"RANK": "3", "WORLD_SIZE": "8"}, (3, 8)),
        ({"RANK": "３", "WORLD_SIZE": "8"}, (None, None)),
        ({"RANK": " 3", "WORLD_SIZE": "8"}, (None, None)),
        ({"RANK": "1_0", "WORLD_SIZE": "16"}, (None, None)),
        ({"RANK": "-1", "WORLD_SIZE": "8"}, (None, None)),
        ({"RANK": "0", "WORLD_SIZE": "0"}, (None, None)),
    ],
)
def test_the_audit_reads_rank_and_world_size_as_ascii_integers(environ, expected):
    """An audit line's rank comes from RANK/WORLD_SIZE only when they are plain integers."""
    from moe_policy.reporting.audit import rank_info

    assert rank_info(environ) == expected


@pytest.mark.parametrize(
    ("facts", "message"),
    [
        (PlatformFacts("cdua", "9.0", origin="api"), r"^api: platform: 'cdua' is not one of"),
        (PlatformFacts("cuda", "9.0000001", origin="api"), r"^api: device.capability: not a"),
        (PlatformFacts("cuda", "90", origin="api"), r"^api: device.capability: not a"),
        (PlatformFacts("cuda", "9.0", packages="triton", origin="api"), r"^api: packages: "),
    ],
)
def test_pinned_platform_facts_are_typed(facts, message):
    """Facts a caller pins instead of the probe are checked like the keywords."""
    with pytest.raises(PolicyError, match=message):
        Selector(NEMOTRON, environ={}, platform=facts)


@pytest.mark.parametrize(("reported", "expected"), [("9.0", "9.0"), ("[N/A]", None), ("9", None)])
def test_a_probed_capability_that_is_not_major_minor_is_unknown_and_reported(
    monkeypatch, reported, expected
):
    """The probe never fails a selection: a capability it cannot read is None, with a problem."""
    from moe_policy.core import platform

    monkeypatch.setattr(platform, "_probe_torch_device", lambda: None)
    monkeypatch.setattr(platform, "_probe_nvidia_smi", lambda: ("cuda", reported, "NVIDIA H200"))
    facts = platform.probe()
    assert facts.capability == expected
    assert bool(facts.problems) is (expected is None)


def test_a_model_is_read_as_written(tmp_path, monkeypatch):
    """``./NAME`` and a ``Path`` are paths, never the bundled model of that name; an empty
    string is refused, never the current directory's config.json."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "config.json").write_text(Path(NEMOTRON).read_text())
    for empty in ("", "  "):
        with pytest.raises(PolicyError, match=r"^api:model: model must name .*got '"):
            moe_policy.select_backend(empty, **H200)
    for missing in ("./qwen3-30b-a3b", Path("qwen3-30b-a3b")):
        with pytest.raises(PolicyError, match=r"qwen3-30b-a3b: file not found"):
            moe_policy.select_backend(missing, **H200)
    bundled = moe_policy.select_backend("qwen3-30b-a3b", **H200)
    assert bundled.context["model.num_experts"][0] == 128
    (tmp_path / "qwen3-30b-a3b").write_text(Path(MIXTRAL).read_text())
    for local in ("./qwen3-30b-a3b", Path("qwen3-30b-a3b")):
        assert moe_policy.select_backend(local, **H200).context["model.num_experts"][0] == 8
    # The selector cache tells the bundled name from the local file of the same name.
    assert moe_policy.select_backend("qwen3-30b-a3b", **H200).context["model.num_experts"][0] == 128


def test_a_mapping_with_keys_of_mixed_types_is_decided_not_a_type_error():
    config = {**json.loads(Path(MIXTRAL).read_text()), 1: 2}
    assert moe_policy.select_backend(config, **H200).backend == "triton"


def test_one_policy_file_as_a_string_is_one_file_not_its_characters(tmp_path):
    policy = tmp_path / "strict.yaml"
    policy.write_text("version: 1\nmode: strict\n")
    for given in (str(policy), policy):
        decision = moe_policy.select_backend(MIXTRAL, policy_files=given, **H200)
        assert decision.mode == "strict"


def test_override_platform_pins_the_platform_for_its_block_only():
    """The selector cache of select_backend keys on the pinned platform: a selector built
    before the block is not reused inside it, nor one built inside it after it."""
    from moe_policy import PlatformFacts, override_platform

    cpu = PlatformFacts("cpu", packages=("torch",), origin="pinned")
    h200 = PlatformFacts("cuda", "9.0", "NVIDIA H200", ("torch", "triton"), origin="pinned")
    with override_platform(cpu):
        before = moe_policy.select_backend(MIXTRAL)
        with override_platform(h200):
            inside = moe_policy.select_backend(MIXTRAL)
        after = moe_policy.select_backend(MIXTRAL)
    assert inside.context["platform"][0] == "cuda" and inside.backend == "triton"
    assert before.context["platform"][0] == after.context["platform"][0] == "cpu"
    assert after.backend == before.backend != "triton"
