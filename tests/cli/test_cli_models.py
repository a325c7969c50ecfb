"""`moe-policy models`: the bundled model configs by the names `--model` takes, with the MoE
shape each gives a decision."""

from __future__ import annotations

import pytest

from tests.bundled import MODELS
from tests.cli.runner import H200, run_cli, validate_record

NAMES = sorted(p.stem for p in MODELS.glob("*.json"))
#: models --json field -> the context key explain records it under.
FACTS = {
    "architecture": "model.architecture",
    "num_experts": "model.num_experts",
    "top_k": "model.top_k",
    "hidden_size": "model.hidden_size",
    "intermediate_size": "model.intermediate_size",
    "activation": "model.activation",
    "gated": "model.gated",
    "dtype": "model.dtype",
    "quantization": "model.quantization",
}


@pytest.fixture(scope="module")
def listed():
    run = run_cli("models", "--json")
    assert run.returncode == 0, run.stderr
    return {entry["name"]: entry for entry in run.json()}


def test_every_bundled_config_is_listed_once(listed):
    assert sorted(listed) == NAMES
    assert len(NAMES) >= 4
    for name, entry in listed.items():
        assert entry["file"] == f"configs/models/{name}.json"


@pytest.mark.parametrize("name", NAMES)
def test_each_listed_name_is_what_explain_decides_for(listed, name):
    """`--model NAME` resolves the listed name, and the decision reads the listed shape
    (DeepSeek-V3's fp8 experts have no unquantized backend: exit 4, the record still printed)."""
    run = run_cli("explain", "--model", name, *H200, "--json")
    assert run.returncode in (0, 4), run.stderr
    record = run.json()
    validate_record(record)
    assert (record["backend"] is None) == (run.returncode == 4)
    context = record["context"]
    for field, key in FACTS.items():
        assert listed[name][field] == context[key]["value"], (name, field)
    assert f"models/{name}.json:" in context["model.num_experts"]["origin"]


def test_the_table_shows_each_model_and_its_shape(listed):
    run = run_cli("models", env={"COLUMNS": "160"})
    assert run.returncode == 0, run.stderr
    header, rule, *rows = run.stdout.splitlines()
    assert header.split() == ["name", "E", "top-k", "hidden", "intermediate", "activation", "quant"]
    assert set(rule) <= {"-", " "}
    assert [row.split()[0] for row in rows] == NAMES
    for row in rows:
        cells = row.split()
        entry = listed[cells[0]]
        assert cells[1:5] == [
            str(entry["num_experts"]),
            str(entry["top_k"]),
            str(entry["hidden_size"]),
            str(entry["intermediate_size"]),
        ]
        assert cells[-1] == entry["quantization"]
    nemotron = next(row for row in rows if row.startswith("nemotron"))
    assert "relu2 (non-gated)" in nemotron


def test_the_table_fits_80_columns_without_splitting_a_name():
    run = run_cli("models", env={"COLUMNS": "80"})
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80
    assert [line.split()[0] for line in lines[2:] if not line.startswith(" ")] == NAMES
    assert "(non-gated)" in run.stdout


def test_an_unknown_name_lists_exactly_the_listed_models():
    run = run_cli("explain", "--model", "mixtral-8x7b", *H200)
    assert run.returncode == 2 and run.stdout == ""
    (line,) = run.errors()
    assert "(did you mean 'mixtral-8x7b-instruct-v0.1'?)" in line
    assert line.endswith("bundled: " + ", ".join(NAMES))


def test_models_takes_no_model_argument():
    run = run_cli("models", "qwen3")
    assert run.returncode == 2 and run.stdout == ""
    assert run.errors() == [
        "moe-policy: error: cli:qwen3: unexpected argument (see moe-policy models --help)"
    ]
