"""The experts' quantization read from real ``quantization_config`` shapes, with origins;
unknown schemes are one error naming the key."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from moe_policy import PolicyError
from moe_policy.core.model import load_model, model_facts_from_mapping
from tests.bundled import DEEPSEEK, MODELS, QWEN3
from tests.model_errors import load_error, value_at

GPT_OSS_120B = str(MODELS / "gpt-oss-120b.json")

#: quantization_config sections as public checkpoints ship them.
REAL: dict[str, dict[str, Any]] = {
    # Qwen/Qwen3-30B-A3B-FP8
    "hf-fp8-block": {
        "activation_scheme": "dynamic",
        "fmt": "e4m3",
        "quant_method": "fp8",
        "weight_block_size": [128, 128],
    },
    # RedHatAI/Llama-4-Scout-17B-16E-Instruct-FP8-dynamic
    "ct-fp8-channel-token": {
        "config_groups": {
            "group_0": {
                "input_activations": {"dynamic": True, "num_bits": 8, "strategy": "token",
                                      "symmetric": True, "type": "float"},
                "targets": ["Linear"],
                "weights": {"dynamic": False, "num_bits": 8, "observer": "minmax",
                            "strategy": "channel", "symmetric": True, "type": "float"},
            }
        },
        "format": "float-quantized",
        "quant_method": "compressed-tensors",
    },
    # RedHatAI/Qwen3-30B-A3B-NVFP4
    "ct-nvfp4": {
        "config_groups": {
            "group_0": {
                "input_activations": {"dynamic": "local", "group_size": 16, "num_bits": 4,
                                      "strategy": "tensor_group", "symmetric": True, "type": "float"},
                "targets": ["Linear"],
                "weights": {"dynamic": False, "group_size": 16, "num_bits": 4,
                            "strategy": "tensor_group", "symmetric": True, "type": "float"},
            }
        },
        "format": "nvfp4-pack-quantized",
        "quant_method": "compressed-tensors",
    },
    # RedHatAI/Qwen3-30B-A3B-quantized.w4a16
    "ct-w4a16": {
        "config_groups": {
            "group_0": {
                "input_activations": None,
                "targets": ["Linear"],
                "weights": {"dynamic": False, "group_size": 128, "num_bits": 4,
                            "strategy": "group", "symmetric": True, "type": "int"},
            }
        },
        "format": "pack-quantized",
        "quant_method": "compressed-tensors",
    },
    # nvidia/Qwen3-30B-A3B-FP4 (config.json form of ModelOpt's settings)
    "modelopt-nvfp4": {"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16,
                       "kv_cache_quant_algo": None},
    # nvidia/Llama-4-Scout-17B-16E-Instruct-FP8
    "modelopt-fp8": {"quant_method": "modelopt", "quant_algo": "FP8", "kv_cache_quant_algo": "FP8"},
    # Qwen/Qwen3-30B-A3B-GPTQ-Int4
    "gptq-int4": {"bits": 4, "group_size": 128, "desc_act": False, "sym": True,
                  "quant_method": "gptq", "damp_percent": 0.01},
    # Qwen/Qwen3-30B-A3B-AWQ style
    "awq-int4": {"bits": 4, "group_size": 128, "quant_method": "awq", "version": "gemm",
                 "zero_point": True},
}  # fmt: skip

EXPECTED = {
    # scheme, weight scale, block, group size, activation, symmetric, format
    "hf-fp8-block": ("fp8", "block", "128x128", None, "dynamic_group", True, "fp8"),
    "ct-fp8-channel-token": ("fp8", "channel", None, None, "dynamic_token", True, "compressed-tensors"),
    "ct-nvfp4": ("nvfp4", "group", None, 16, "dynamic_group", True, "compressed-tensors"),
    "ct-w4a16": ("int4", "group", None, 128, "none", True, "compressed-tensors"),
    "modelopt-nvfp4": ("nvfp4", "group", None, 16, "dynamic_group", True, "modelopt"),
    "modelopt-fp8": ("fp8", "tensor", None, None, "static_tensor", True, "modelopt"),
    "gptq-int4": ("int4", "group", None, 128, "none", True, "gptq"),
    "awq-int4": ("int4", "group", None, 128, "none", False, "awq"),
}  # fmt: skip
KEYS = (
    "model.quantization",
    "model.quant.weight_scale",
    "model.quant.block",
    "model.quant.group_size",
    "model.quant.activation",
    "model.quant.symmetric",
    "model.quant.format",
)


def _with(quantization: Any, key: str = "quantization_config") -> dict[str, Any]:
    config = json.loads(Path(QWEN3).read_text())
    config[key] = quantization
    return config


def _values(facts: Any) -> tuple[Any, ...]:
    return tuple(facts.value(key) for key in KEYS)


@pytest.mark.parametrize("name", sorted(REAL))
def test_real_quantization_configs(name):
    assert _values(model_facts_from_mapping(_with(REAL[name]))) == EXPECTED[name]


def test_bundled_deepseek_v3_is_fp8_block_scaled_with_origins():
    facts = load_model(DEEPSEEK)
    assert _values(facts) == ("fp8", "block", "128x128", None, "dynamic_group", True, "fp8")
    text = Path(DEEPSEEK).read_text().splitlines()
    origin = str(facts.facts["model.quant.block"][1])
    assert origin.startswith("file:")
    line = int(origin.split(":")[-2])
    assert '"weight_block_size"' in text[line - 1]
    activation = str(facts.facts["model.quant.activation"][1])
    assert '"activation_scheme"' in text[int(activation.split(":")[-2]) - 1]


def test_bundled_gpt_oss_is_weight_only_mxfp4():
    facts = load_model(GPT_OSS_120B)
    assert _values(facts) == ("mxfp4", "group", None, 32, "none", True, "mxfp4")
    assert facts.value("model.activation") == "swigluoai"


def test_unquantized_model():
    facts = load_model(QWEN3)
    assert facts.value("model.quantization") == "none"
    assert facts.value("model.quant.activation") == "none"


def test_mlx_quantization_key():
    # mlx-community/Qwen3-30B-A3B-4bit: affine 4-bit groups of 64.
    facts = model_facts_from_mapping(_with({"group_size": 64, "bits": 4}, key="quantization"))
    assert _values(facts) == ("int4", "group", None, 64, "none", False, "mlx")


def test_modelopt_sidecar_beside_config(tmp_path):
    (tmp_path / "config.json").write_text(Path(QWEN3).read_text())
    (tmp_path / "hf_quant_config.json").write_text(
        json.dumps(
            {
                "producer": {"name": "modelopt", "version": "0.29.0"},
                "quantization": {"quant_algo": "NVFP4", "kv_cache_quant_algo": None,
                                 "group_size": 16, "exclude_modules": ["lm_head"]},
            }
        )
    )  # fmt: skip
    facts = load_model(tmp_path)
    assert facts.value("model.quantization") == "nvfp4"
    assert str(facts.facts["model.quantization"][1]).startswith(
        f"file:{tmp_path / 'hf_quant_config.json'}:"
    )


def test_mixed_precision_takes_the_experts_algorithm(tmp_path):
    layers = {
        f"layers.{i}.ffn.experts": {"quant_algo": "NVFP4", "group_size": 16} for i in range(3)
    }
    quant = {"quant_method": "modelopt", "quant_algo": "MIXED_PRECISION",
             "quantized_layers": {**layers, "layers.0.attn.wq": {"quant_algo": "FP8"}}}  # fmt: skip
    assert model_facts_from_mapping(_with(quant)).value("model.quantization") == "nvfp4"


BAD = {
    "unknown method": ({"quant_method": "fp9"}, "unknown quant_method 'fp9' (did you mean 'fp8'?)"),
    "not a mapping": ("fp8", "expected a mapping"),
    "no method": ({"activation_scheme": "dynamic"}, "no `quant_method`"),
    "block shape": (
        {"quant_method": "fp8", "weight_block_size": [128]},
        "quantization_config.weight_block_size: expected [block_n, block_k]",
    ),
    "block zero": (
        {"quant_method": "fp8", "weight_block_size": [128, 0]},
        "quantization_config.weight_block_size.1: expected a positive integer",
    ),
    "static block": (
        {"quant_method": "fp8", "activation_scheme": "static", "weight_block_size": [128, 128]},
        "contradicts weight_block_size",
    ),
    "modelopt algo": (
        {"quant_method": "modelopt", "quant_algo": "NVFP5"},
        "unknown ModelOpt quant_algo 'NVFP5' (did you mean 'NVFP4'?)",
    ),
    "gptq bits": ({"quant_method": "gptq", "bits": 3, "group_size": 128}, "3-bit integer weights"),
    "ct weights": (
        {"quant_method": "compressed-tensors", "config_groups": {"g": {"targets": ["Linear"],
         "weights": {"num_bits": 6, "type": "float", "strategy": "group", "group_size": 32}}}},
        "no MoE quantization scheme for 6-bit float weights",
    ),
    "ct groups": ({"quant_method": "compressed-tensors"}, "non-empty `config_groups`"),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(BAD))
def test_unknown_or_broken_schemes_are_one_error_naming_the_key(case, tmp_path):
    quant, message = BAD[case]
    path = tmp_path / "config.json"
    path.write_text(json.dumps(_with(quant), indent=2))
    with pytest.raises(PolicyError) as info:
        load_model(path)
    text = str(info.value)
    assert message in text
    assert f"file:{path}:" in text  # file:line:col of the key


@pytest.mark.parametrize(
    ("where", "name"),
    [
        ((), "compression_config"),  # older compressed-tensors exports; vLLM reads it too
        (("text_config",), "quantization_config"),
        (("language_config",), "quantization_config"),
    ],
)
def test_a_quantization_mapping_elsewhere_is_read_not_passed_over(where, name, tmp_path):
    """A model quantized in another key of its config is not read as unquantized."""
    config = json.loads(Path(QWEN3).read_text())
    node = config
    for part in where:
        node = node.setdefault(part, {})
    node[name] = {"quant_method": "fp8", "weight_block_size": [128, 128]}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config, indent=2))
    facts = load_model(path)
    assert facts.value("model.quantization") == "fp8"
    assert facts.value("model.quant.block") == "128x128"
    assert str(facts.facts["model.quant.block"][1]).startswith(f"file:{path}:")


def test_a_nested_quantization_that_is_not_a_mapping_is_an_error(tmp_path):
    config = json.loads(Path(QWEN3).read_text())
    config["text_config"] = {"quantization_config": "fp8"}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config, indent=2))
    with pytest.raises(PolicyError) as info:
        load_model(path)
    assert "text_config.quantization_config: expected a mapping (with quant_method)" in str(
        info.value
    )
    assert f"file:{path}:" in str(info.value)


# --- a present value of the wrong type or spelling is one error naming its key ------------------


def _ct(weights: dict[str, Any], acts: Any = None, targets: Any = ("Linear",)) -> dict[str, Any]:
    group = {"targets": list(targets) if isinstance(targets, tuple) else targets,
             "weights": weights, "input_activations": acts}  # fmt: skip
    return {"quant_method": "compressed-tensors", "config_groups": {"g": group}}


W4 = {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 128}
CT_W = "quantization_config.config_groups.g.weights"
GPTQ = {"quant_method": "gptq", "bits": 4, "group_size": 128, "sym": True}
AWQ = {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True}

#: case -> (quantization_config, the key (and value) the origin points at, message)
WRONG_VALUES: dict[str, tuple[Any, str, str]] = {
    # Q1: booleans are booleans, never read by truthiness
    "gptq sym 'false'": (
        {**GPTQ, "sym": "false"}, '"sym": ',
        "quantization_config.sym: expected a boolean (true or false, unquoted), "
        "got 'false' (a string)",
    ),
    "gptq sym 0": (
        {**GPTQ, "sym": 0}, '"sym": ',
        "quantization_config.sym: expected a boolean (true or false, unquoted), got 0",
    ),
    "awq zero_point 'false'": (
        {**AWQ, "zero_point": "false"}, '"zero_point": ',
        "quantization_config.zero_point: expected a boolean (true or false, unquoted), "
        "got 'false' (a string)",
    ),
    "ct symmetric 'false'": (
        _ct({**W4, "symmetric": "false"}), '"symmetric": ',
        f"{CT_W}.symmetric: expected a boolean (true or false, unquoted), got 'false' (a string)",
    ),
    "ct dynamic 'locale'": (
        _ct({"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16},
            {"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16,
             "dynamic": "locale"}),
        '"dynamic": ',
        "quantization_config.config_groups.g.input_activations.dynamic: expected true, false "
        "or 'local', got 'locale' (a string)",
    ),
    "ct dynamic 'false'": (
        _ct({"num_bits": 8, "type": "float", "strategy": "channel"},
            {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": "false"}),
        '"dynamic": ',
        "quantization_config.config_groups.g.input_activations.dynamic: expected true, false "
        "or 'local', got 'false' (a string)",
    ),
    # Q2: a present AWQ bit width is never replaced by 4
    "awq bits 0": (
        {**AWQ, "bits": 0}, '"bits": ',
        "quantization_config.bits: 0-bit integer weights are not a MoE scheme vLLM's oracles "
        "select (4 or 8)",
    ),
    "awq bits false": (
        {**AWQ, "bits": False}, '"bits": ',
        "quantization_config.bits: expected an integer, got false (a boolean)",
    ),
    "awq bits null": (
        {**AWQ, "bits": None}, '"bits": ',
        "quantization_config.bits: expected an integer, got None",
    ),
    "awq bits missing": (
        {k: v for k, v in AWQ.items() if k != "bits"}, '"quantization_config": ',
        "quantization_config: missing key `w_bit` (or `bits`): the integer weights' bit width "
        "(4 or 8)",
    ),
    # Q3: a present fp8 activation scheme is one of vLLM's, as vLLM spells it
    "fp8 scheme ''": (
        {"quant_method": "fp8", "activation_scheme": "", "weight_block_size": [128, 128]},
        '"activation_scheme": ',
        "quantization_config.activation_scheme: unknown fp8 activation scheme '' "
        "(known: dynamic, static)",
    ),
    "fp8 scheme false": (
        {"quant_method": "fp8", "activation_scheme": False, "weight_block_size": [128, 128]},
        '"activation_scheme": ',
        "quantization_config.activation_scheme: expected fp8 activation scheme "
        "(dynamic or static), got false (a boolean)",
    ),
    "fp8 scheme null": (
        {"quant_method": "fp8", "activation_scheme": None},
        '"activation_scheme": ',
        "quantization_config.activation_scheme: expected fp8 activation scheme "
        "(dynamic or static), got None",
    ),
    "fp8 scheme miscased": (
        {"quant_method": "fp8", "activation_scheme": "Dynamic"},
        '"activation_scheme": ',
        "quantization_config.activation_scheme: unknown fp8 activation scheme 'Dynamic' "
        "(did you mean 'dynamic'?) (known: dynamic, static)",
    ),
    "fp8 scheme misspelled": (
        {"quant_method": "fp8", "activation_scheme": "dynamc"},
        '"activation_scheme": ',
        "quantization_config.activation_scheme: unknown fp8 activation scheme 'dynamc' "
        "(did you mean 'dynamic'?) (known: dynamic, static)",
    ),
    # Q4: an integer is an integer (8.0 and true are not)
    "gptq bits 4.0": (
        {**GPTQ, "bits": 4.0}, '"bits": ', "quantization_config.bits: expected an integer, got 4.0"
    ),
    "gptq group_size -1.0": (
        {**GPTQ, "group_size": -1.0}, '"group_size": ',
        "quantization_config.group_size: expected an integer, got -1.0",
    ),
    "awq group_size 128.0": (
        {**AWQ, "group_size": 128.0}, '"group_size": ',
        "quantization_config.group_size: expected an integer, got 128.0",
    ),
    "ct num_bits 8.0": (
        _ct({"num_bits": 8.0, "type": "int", "strategy": "channel"}), '"num_bits": ',
        f"{CT_W}.num_bits: expected an integer, got 8.0",
    ),
    "ct num_bits true": (
        _ct({**W4, "num_bits": True}), '"num_bits": ',
        f"{CT_W}.num_bits: expected an integer, got true (a boolean)",
    ),
    "ct group_size 16.0": (
        _ct({"num_bits": 4, "type": "float", "strategy": "tensor_group", "group_size": 16.0}),
        '"group_size": ', f"{CT_W}.group_size: expected an integer, got 16.0",
    ),
    "ct activation num_bits 8.0": (
        _ct({"num_bits": 8, "type": "float", "strategy": "channel"},
            {"num_bits": 8.0, "type": "float", "strategy": "token", "dynamic": True}),
        '"num_bits": 8.0',
        "quantization_config.config_groups.g.input_activations.num_bits: expected an integer, "
        "got 8.0",
    ),
    # Q5: GPTQ without a bit width says so (vLLM's AutoGPTQConfig requires `bits` too)
    "gptq bits missing": (
        {k: v for k, v in GPTQ.items() if k != "bits"}, '"quantization_config": ',
        "quantization_config: missing key `bits`: the integer weights' bit width (4 or 8)",
    ),
    # Q6: targets is a list
    "ct targets a string": (
        _ct(W4, targets="Linear"), '"targets": ',
        "quantization_config.config_groups.g.targets: expected a list of the layers this group "
        "quantizes (e.g. [\"Linear\"]), got 'Linear' (a string)",
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", list(WRONG_VALUES))
def test_a_wrong_value_is_one_error_naming_its_key_never_a_default(case, tmp_path):
    quant, key, message = WRONG_VALUES[case]
    path = tmp_path / "config.json"
    path.write_text(json.dumps(_with(quant), indent=2))
    origin, got = load_error(path)
    assert (origin, got) == (f"file:{path}:{value_at(path.read_text(), key)}", message)


@pytest.mark.parametrize(
    ("quant", "symmetric"),
    [
        ({**GPTQ, "sym": False}, False),
        ({**GPTQ, "sym": True}, True),
        ({k: v for k, v in GPTQ.items() if k != "sym"}, True),  # AutoGPTQ's default
        ({**AWQ, "zero_point": False}, True),
        ({**AWQ, "zero_point": True}, False),
        (_ct({**W4, "symmetric": False}), False),
        (_ct(W4), True),  # compressed-tensors' default
    ],
)
def test_real_booleans_set_symmetry(quant, symmetric):
    assert model_facts_from_mapping(_with(quant)).value("model.quant.symmetric") is symmetric


@pytest.mark.parametrize(
    ("quant", "expected"),
    [
        (AWQ, ("int4", 128)),
        ({"quant_method": "awq", "w_bit": 4, "q_group_size": 64, "zero_point": True}, ("int4", 64)),
        ({**AWQ, "w_bit": 8, "bits": None}, ("int8", 128)),  # vLLM reads w_bit first
        ({**GPTQ, "bits": 8, "group_size": -1}, ("int8", None)),
        (_ct({"type": "int", "strategy": "channel"}), ("int8", None)),  # num_bits defaults to 8
    ],
)
def test_integer_bit_widths_and_group_sizes(quant, expected):
    facts = model_facts_from_mapping(_with(quant))
    assert (facts.value("model.quantization"), facts.value("model.quant.group_size")) == expected


def test_an_absent_fp8_activation_scheme_is_dynamic():
    facts = model_facts_from_mapping(_with({"quant_method": "fp8"}))
    assert facts.value("model.quant.activation") == "dynamic_tensor"
