"""Model facts from real Hugging Face configs, key variants, and bad configs."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from moe_policy.core.model import load_model, model_facts_from_mapping
from moe_policy.errors import PolicyError
from tests.bundled import DEEPSEEK, GPT_OSS, MIXTRAL, NEMOTRON, QWEN3
from tests.model_errors import line_col, load_error, value_at

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


def test_swiglustep_with_a_swiglu_limit_stays_swiglustep():
    """swiglustep clamps with a limit too: a swiglu_limit beside it is not gpt-oss's
    swigluoai (interleaved rows, biases), and swiglustep is gated."""
    config = {**GPT_OSS, "model_type": "step3p5", "hidden_act": "swiglustep"}
    facts = model_facts_from_mapping(config)
    assert (
        facts.value("model.activation"),
        facts.value("model.gated"),
        facts.value("model.has_bias"),
    ) == ("swiglustep", True, False)
    with pytest.raises(PolicyError, match="swiglustep is gated; `gated: false` contradicts it"):
        model_facts_from_mapping({**config, "is_gated": False})


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


def _qwen3_with(tmp_path: Path, **changes: object) -> Path:
    config = json.loads(Path(QWEN3).read_text())
    config.update(changes)
    f = tmp_path / "config.json"
    f.write_text(json.dumps(config, indent=2))
    return f


#: (changes to Qwen3's config, the key the origin points at, message)
REFUSED = {
    # M1: a scoring function or top-k method vLLM would not run (or would misread)
    "scoring_func misspelled": (
        {"scoring_func": "sigmod"}, '"scoring_func": ',
        "scoring_func: unknown scoring function 'sigmod' (did you mean 'sigmoid'?) "
        "(known: softmax, sigmoid, sqrtsoftplus)",
    ),
    "scoring_func miscased": (
        {"scoring_func": "Sigmoid"}, '"scoring_func": ',
        "scoring_func: unknown scoring function 'Sigmoid' (did you mean 'sigmoid'?) "
        "(known: softmax, sigmoid, sqrtsoftplus)",
    ),
    "topk_method misspelled": (
        {"topk_method": "noaux-tc"}, '"topk_method": ',
        "topk_method: unknown top-k method 'noaux-tc' (did you mean 'noaux_tc'?) "
        "(known: greedy, group_limited_greedy, noaux_tc)",
    ),
    # M2: torch_dtype and dtype that disagree
    "contradictory dtypes": (
        {"torch_dtype": "bfloat16", "dtype": "float16"}, '"torch_dtype": ',
        "contradictory dtype: torch_dtype='bfloat16' (file:{f}:{torch_dtype}), "
        "dtype='float16' (file:{f}:{dtype})",
    ),
    # M4: a nested language-model config that is not a mapping
    "text_config a list": (
        {"text_config": [1, 2]}, '"text_config": ',
        "text_config: expected a mapping of the language model's settings, got [1, 2] (a list)",
    ),
    "llm_config a string": (
        {"llm_config": "qwen3"}, '"llm_config": ',
        "llm_config: expected a mapping of the language model's settings, "
        "got 'qwen3' (a string)",
    ),
    "language_config a number": (
        {"language_config": 3}, '"language_config": ',
        "language_config: expected a mapping of the language model's settings, got 3",
    ),
    # M5: an empty architectures list
    "architectures empty": (
        {"architectures": []}, '"architectures": ',
        'architectures: the list is empty (expected a list of class names, '
        'e.g. ["Qwen3MoeForCausalLM"])',
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", list(REFUSED))
def test_a_wrong_value_is_refused_at_its_key(tmp_path: Path, case: str):
    changes, key, message = REFUSED[case]
    f = _qwen3_with(tmp_path, **changes)
    text = f.read_text()
    expected = message.format(
        f=f, torch_dtype=value_at(text, '"torch_dtype": '), dtype=value_at(text, '"dtype": ')
    ) if "{f}" in message else message  # fmt: skip
    assert load_error(f) == (f"file:{f}:{value_at(text, key)}", expected)


@pytest.mark.parametrize(
    ("changes", "routing"),
    [
        ({"scoring_func": "softmax"}, "renormalize"),
        ({"scoring_func": "sigmoid"}, "sigmoid"),
        ({"scoring_func": "sqrtsoftplus"}, "renormalize"),  # DeepSeek-V4
        ({"topk_method": "greedy"}, "renormalize"),  # DeepSeek-V2-Lite
        ({"topk_method": "group_limited_greedy"}, "renormalize"),  # DeepSeek-V2
        ({"topk_method": "noaux_tc", "scoring_func": "sigmoid"}, "deepseek_v3"),
        ({"topk_method": None}, "renormalize"),  # vLLM's Mistral-format configs
    ],
)
def test_the_scoring_functions_and_top_k_methods_of_public_configs_load(
    tmp_path: Path, changes: dict, routing: str
):
    assert load_model(_qwen3_with(tmp_path, **changes)).value("model.routing") == routing


@pytest.mark.parametrize(
    ("changes", "dtype", "key"),
    [
        ({"torch_dtype": "bfloat16", "dtype": "bfloat16"}, "bf16", '"torch_dtype": '),
        ({"torch_dtype": "bfloat16", "dtype": "torch.bfloat16"}, "bf16", '"torch_dtype": '),
        ({"torch_dtype": None, "dtype": "float16"}, "fp16", '"dtype": '),  # newer HF configs
    ],
)
def test_dtype_keys_that_agree_load(tmp_path: Path, changes: dict, dtype: str, key: str):
    f = _qwen3_with(tmp_path, **changes)
    value, origin = load_model(f).facts["model.dtype"]
    assert (value, str(origin)) == (dtype, f"file:{f}:{value_at(f.read_text(), key)}")


def test_a_null_text_config_is_no_text_config(tmp_path: Path):
    assert load_model(_qwen3_with(tmp_path, text_config=None)).value("model.num_experts") == 128


@pytest.mark.parametrize(
    ("literal", "shown"),
    [("NaN", "NaN (not a number)"), ("Infinity", "Infinity (not a finite number)"),
     ("-Infinity", "-Infinity (not a finite number)")],
)  # fmt: skip
def test_a_json_nan_is_not_a_number_not_a_string(tmp_path: Path, literal: str, shown: str):
    """Y2: Python's json writes NaN and Infinity bare (and reads them as floats)."""
    f = _qwen3_with(tmp_path)
    f.write_text(f.read_text().replace('"num_experts": 128', f'"num_experts": {literal}'))
    position = value_at(f.read_text(), '"num_experts": ')
    assert load_error(f) == (
        f"file:{f}:{position}",
        f"num_experts: expert count (a positive integer): got {shown}",
    )


def test_a_quoted_nan_in_json_is_still_a_string(tmp_path: Path):
    f = _qwen3_with(tmp_path, num_experts="NaN")
    assert load_error(f)[1] == (
        "num_experts: expert count (a positive integer): expected an integer, got 'NaN' (a string)"
    )


def test_a_nan_in_a_quantization_list_is_not_a_number(tmp_path: Path):
    f = _qwen3_with(
        tmp_path, quantization_config={"quant_method": "fp8", "weight_block_size": [128, 128]}
    )
    f.write_text(f.read_text().replace("128,\n      128", "128,\n      NaN"))
    text = f.read_text()
    assert load_error(f) == (
        f"file:{f}:{line_col(text, text.index('NaN'))}",
        "quantization_config.weight_block_size.1: expected a positive integer, "
        "got NaN (not a number)",
    )


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("config.json", '{"num_experts": 8,, }', "malformed JSON: did not find expected node "
         "content (while parsing a flow node)"),
        ("model.yaml", "a: [1,\n", "malformed YAML: did not find expected node content "
         "(while parsing a flow node)"),
        ("config.json", '{"a": "\x07"}', "malformed JSON: character U+0007 is not allowed "
         "(control characters are not allowed)"),
    ],
)  # fmt: skip
def test_a_parse_error_names_the_file_format(tmp_path: Path, name: str, text: str, message: str):
    """Y3: a .json file is malformed JSON, a .yaml file malformed YAML."""
    f = tmp_path / name
    f.write_text(text)
    assert load_error(f)[1] == message


@pytest.mark.parametrize(
    ("written", "shown"),
    [("on", "on (YAML reads it as the boolean true)"), ("no", "no (YAML reads it as the "
     "boolean false)"), ("true", "true (a boolean)"), ("7", "7")],
)  # fmt: skip
def test_a_yaml_activation_that_is_not_a_string_is_shown_as_written(
    tmp_path: Path, written: str, shown: str
):
    """Y4: `hidden_act: on` is a boolean in YAML, reported as the file writes it."""
    f = tmp_path / "model.yaml"
    f.write_text(
        "num_experts: 8\nnum_experts_per_tok: 2\nhidden_size: 64\nmoe_intermediate_size: 32\n"
        f"hidden_act: {written}\n"
    )
    assert load_error(f) == (
        f"file:{f}:5:13",
        f"hidden_act: expected an activation name (a string), got {shown}",
    )
