"""Model facts from real Hugging Face configs, key variants, and bad configs."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from moe_policy.core.model import load_model, model_facts_from_mapping
from moe_policy.errors import PolicyError
from tests.bundled import DEEPSEEK, GPT_OSS, MIXTRAL, NEMOTRON, QWEN3

FIELDS = ("num_experts", "top_k", "hidden_size", "intermediate_size", "activation", "gated",
          "shared_experts", "quantization", "routing")  # fmt: skip
EXPECTED = {
    path: dict(zip(FIELDS, values, strict=True))
    for path, values in {
        NEMOTRON: (128, 6, 2688, 1856, "relu2", False, 1, "none", "deepseek_v3"),
        MIXTRAL: (8, 2, 4096, 14336, "silu", True, 0, "none", "renormalize"),
        QWEN3: (128, 8, 2048, 768, "silu", True, 0, "none", "renormalize"),
        DEEPSEEK: (256, 8, 7168, 2048, "silu", True, 1, "fp8", "deepseek_v3"),
    }.items()
}


@pytest.mark.parametrize("path", sorted(EXPECTED))
def test_real_configs(path):
    """Each bundled real config yields the published MoE shape."""
    facts = load_model(path)
    got = {key: facts.value(f"model.{key}") for key in EXPECTED[path]}
    assert got == EXPECTED[path]


def test_origins_point_at_the_key_in_the_json():
    """Nemotron's expert count comes from n_routed_experts at its line in the file."""
    facts = load_model(NEMOTRON)
    _value, origin = facts.facts["model.num_experts"]
    line = int(str(origin).split(":")[-2])
    assert '"n_routed_experts"' in Path(NEMOTRON).read_text().splitlines()[line - 1]
    assert str(facts.facts["model.activation"][1]).startswith(f"file:{NEMOTRON}:")


def test_moe_intermediate_size_wins_over_dense_intermediate_size():
    """Qwen3's intermediate_size (6144) is the dense MLP; moe_intermediate_size (768) is the expert."""
    assert load_model(QWEN3).value("model.intermediate_size") == 768


def test_gpt_oss_is_interleaved_swigluoai_with_biases():
    """A gpt-oss config (swiglu_limit) means swigluoai experts with biases."""
    facts = model_facts_from_mapping(GPT_OSS)
    assert (
        facts.value("model.activation"),
        facts.value("model.gated"),
        facts.value("model.has_bias"),
    ) == ("swigluoai", True, True)


def test_nested_text_config_and_llama4_routing():
    """Multimodal configs nest the LM under text_config; Llama-4 routes with the weight on the input."""
    config = {
        "architectures": ["Llama4ForConditionalGeneration"],
        "text_config": {
            "model_type": "llama4_text",
            "num_local_experts": 16,
            "num_experts_per_tok": 1,
            "hidden_size": 5120,
            "intermediate_size": 8192,
            "hidden_act": "silu",
        },
    }
    facts = model_facts_from_mapping(config)
    assert facts.value("model.num_experts") == 16
    assert facts.value("model.routing") == "llama4"
    assert facts.value("model.router_weight_on_input") is True


def test_dbrx_style_ffn_config():
    """DBRX keeps its MoE keys under ffn_config."""
    config = {
        "d_model": 6144,
        "ffn_config": {"moe_num_experts": 16, "moe_top_k": 4, "ffn_hidden_size": 10752},
    }
    facts = model_facts_from_mapping(config)
    assert (
        facts.value("model.num_experts"),
        facts.value("model.top_k"),
        facts.value("model.intermediate_size"),
    ) == (16, 4, 10752)


def test_yaml_model_file(tmp_path: Path):
    """A YAML file in the same keys works like config.json."""
    f = tmp_path / "model.yaml"
    f.write_text(
        "num_experts: 8\nnum_experts_per_tok: 2\nhidden_size: 64\nmoe_intermediate_size: 32\nhidden_act: gelu_pytorch_tanh\n"
    )
    facts = load_model(f)
    assert facts.value("model.activation") == "gelu_tanh"
    assert str(facts.facts["model.num_experts"][1]) == f"file:{f}:1:14"


def test_missing_expert_count_names_file_and_keys(tmp_path: Path):
    """A config without an expert count is refused, naming the file and the accepted keys."""
    config = json.loads(Path(MIXTRAL).read_text())
    del config["num_local_experts"]
    f = tmp_path / "config.json"
    f.write_text(json.dumps(config, indent=2))
    with pytest.raises(
        PolicyError,
        match=rf"^file:{re.escape(str(f))}: no expert count: expected one of num_local_experts, num_experts, n_routed_experts",
    ):
        load_model(f)


MINIMAL = {"num_experts_per_tok": 8, "hidden_size": 8, "moe_intermediate_size": 8}


@pytest.mark.parametrize(
    ("config", "message"),
    [
        # two expert-count keys that disagree, both named
        (
            {**MINIMAL, "num_experts": 64, "n_routed_experts": 128},
            r"contradictory expert count: num_experts=64 .*n_routed_experts=128",
        ),
        # an activation we do not know, at its position
        (
            {**MINIMAL, "num_experts": 4, "num_experts_per_tok": 2, "hidden_act": "mish"},
            r":1:\d+: hidden_act: unknown activation 'mish'",
        ),
    ],
)
def test_a_bad_config_is_refused_with_its_reason(tmp_path: Path, config: dict, message: str):
    f = tmp_path / "config.json"
    f.write_text(json.dumps(config))
    with pytest.raises(PolicyError, match=message):
        load_model(f)


def test_top_k_above_expert_count(tmp_path: Path):
    """top-k larger than the expert count is contradictory."""
    with pytest.raises(PolicyError, match="top-k 9 exceeds the expert count 8"):
        model_facts_from_mapping(
            {
                "num_experts": 8,
                "num_experts_per_tok": 9,
                "hidden_size": 8,
                "moe_intermediate_size": 8,
            }
        )


def test_in_memory_configs_have_api_origin():
    """A mapping passed through the API is reported as api:model."""
    with pytest.raises(PolicyError, match=r"^api:model: no expert count"):
        model_facts_from_mapping({"hidden_size": 8})
