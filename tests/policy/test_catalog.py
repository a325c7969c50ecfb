"""The capability catalog, the priority lists and the experts registry agree."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from moe_policy.core.catalog import check_registry, load_catalog, parse_catalog
from moe_policy.core.yamlio import parse_yaml_text
from moe_policy.errors import PolicyError

REPO = Path(__file__).resolve().parents[2]


def test_registry_matches_catalog():
    """Every built-in implementation named in backends.yaml exists and defines its class."""
    assert check_registry(load_catalog()) == []


def test_every_unquantized_backend_of_the_reference_is_declared():
    """The vLLM unquantized backends plus ours are all in the catalog."""
    names = set(load_catalog().names)
    assert {
        "triton",
        "batched_triton",
        "flashinfer_cutlass",
        "flashinfer_trtllm",
        "aiter",
        "cpu",
        "xpu",
        "tpu",
        "oot",
        "torch_grouped_mm",
        "reference",
    } <= names


def test_lora_capable_backends():
    """LoRA: our Triton backends and the reference; TRT-LLM conditionally; the rest not."""
    catalog = load_catalog()
    assert {s.name: s.lora for s in catalog} == {
        "triton": "true",
        "batched_triton": "true",
        "flashinfer_cutlass": "false",
        "flashinfer_trtllm": "conditional",
        "aiter": "false",
        "cpu": "false",
        "xpu": "false",
        "tpu": "delegated",
        "oot": "delegated",
        "torch_grouped_mm": "true",
        "reference": "true",
    }


def test_implemented_here_have_classes_with_the_same_backend_name():
    """Each implementation module declares `backend = '<name>'` for its catalog entry."""
    for spec in load_catalog():
        if spec.implementation is None:
            continue
        module = spec.implementation.split(":")[0]
        source = (REPO / (module.replace(".", "/") + ".py")).read_text()
        assert re.search(rf"backend\s*(:\s*[^=]+)?=\s*[\"']{spec.name}[\"']", source), spec.name


def test_unknown_catalog_key_names_its_position():
    """A typo in the catalog is an error at file:line:col."""
    text = "backends:\n  triton:\n    platfroms: [cuda]\n"
    with pytest.raises(
        PolicyError,
        match=r"^file:x.yaml:3:5: backend 'triton': unknown key 'platfroms' \(did you mean 'platforms'\?\)",
    ):
        parse_catalog(parse_yaml_text(text, "x.yaml"))


def test_registry_drift_is_named():
    """An implementation pointing at a missing module is reported by name."""
    text = "backends:\n  triton:\n    implementation: moe_policy.experts.nope:TritonExperts\n    platforms: [cuda]\n"
    catalog = parse_catalog(parse_yaml_text(text, "x.yaml"))
    assert check_registry(catalog) == [
        "triton: module 'moe_policy.experts.nope' of 'moe_policy.experts.nope:TritonExperts' not found"
    ]


@pytest.mark.parametrize(
    ("field", "message"),
    [
        ("bias: 'false'", r"bias: expected a boolean"),
        ("delegated: 1", r"delegated: expected a boolean"),
        ("batch_invariant: yes please", r"batch_invariant: expected a boolean"),
        ("parallel: {eplb: 'no'}", r"parallel.eplb: expected a boolean"),
    ],
)
def test_catalog_flags_are_booleans(field, message):
    """A catalog flag is true or false; the string 'false' is not read as true."""
    text = f"backends:\n  triton:\n    platforms: [cuda]\n    {field}\n"
    with pytest.raises(PolicyError, match=rf"^file:x.yaml:2:3: {message}"):
        parse_catalog(parse_yaml_text(text, "x.yaml"))
