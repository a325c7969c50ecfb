"""The policy file's JSON Schema: the shipped policies name it and validate, it knows exactly
the keys the loader reads, and what it rejects the loader (lint) rejects too."""

from __future__ import annotations

import json

import jsonschema
import pytest
import yaml

import moe_policy
from moe_policy.core.catalog import load_catalog
from moe_policy.core.engines import PROFILES
from moe_policy.core.keys import CONTEXT_KEYS, PLATFORMS
from moe_policy.core.rules import ACTIONS, EFFECTS, OPERATORS, RULE_KEYS
from moe_policy.lint import lint_paths
from moe_policy.settings.schema import AUDIT_KEYS, CONSISTENCY, MODES, TOP_LEVEL_KEYS
from tests.bundled import REPO

SCHEMA_FILE = REPO / "moe_policy/schemas/policy.v1.json"
SCHEMA = json.loads(SCHEMA_FILE.read_text())
DEFS = SCHEMA["$defs"]
#: Every policy file the package ships (the built-in layers and the profiles).
SHIPPED = sorted(
    [
        REPO / "configs/default.yaml",
        *(REPO / "configs/profiles").glob("*.yaml"),
        *(REPO / "configs/engines").glob("*/*default.yaml"),
    ]
)
TYPE_DEFS = {
    "int": "condition_integer",
    "bool": "condition_boolean",
    "capability": "condition_capability",
    "list": "condition_list",
    "str": "condition_text",
}


def validator():
    jsonschema.Draft202012Validator.check_schema(SCHEMA)
    return jsonschema.Draft202012Validator(SCHEMA)


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: str(p.relative_to(REPO)))
def test_each_shipped_policy_names_the_schema_and_validates(path):
    first = path.read_text().splitlines()[0]
    prefix = "# yaml-language-server: $schema="
    assert first.startswith(prefix), first
    assert (path.parent / first.removeprefix(prefix)).resolve() == SCHEMA_FILE.resolve()
    validator().validate(yaml.safe_load(path.read_text()))


def test_the_bundled_copy_is_the_repository_configs():
    """moe_policy/_configs is what the package reads; in a checkout it is configs/ itself."""
    bundled = REPO / "moe_policy/_configs"
    for path in SHIPPED:
        copy = bundled / path.relative_to(REPO / "configs")
        assert copy.read_bytes() == path.read_bytes(), copy


def test_the_schema_has_the_loaders_keys():
    assert list(SCHEMA["properties"]) == list(TOP_LEVEL_KEYS)
    assert list(SCHEMA["properties"]["audit"]["properties"]) == list(AUDIT_KEYS)
    assert list(SCHEMA["properties"]["priority"]["properties"]) == list(PLATFORMS)
    assert SCHEMA["properties"]["mode"]["enum"] == list(MODES)
    assert SCHEMA["properties"]["consistency"]["enum"] == list(CONSISTENCY)
    rule = DEFS["rule"]["properties"]
    assert list(rule) == list(RULE_KEYS)
    assert rule["effect"]["enum"] == list(EFFECTS)
    assert rule["action"]["enum"] == list(ACTIONS)


def test_the_schema_knows_every_context_key_with_its_type_and_choices():
    when = DEFS["when"]["properties"]
    assert list(when) == list(CONTEXT_KEYS)
    for key, spec in CONTEXT_KEYS.items():
        if spec.choices:
            assert DEFS["choice"][key]["enum"] == list(spec.choices), key
            ops = when[key]["anyOf"][2]["properties"]
        else:
            assert when[key]["$ref"] == f"#/$defs/{TYPE_DEFS[spec.type]}", key
            ops = DEFS[TYPE_DEFS[spec.type]]["anyOf"][2]["properties"]
        assert set(ops) <= set(OPERATORS), key
        assert {"eq", "ne", "in", "not_in", "exists"} <= set(ops), key
    assert set(DEFS["condition_integer"]["anyOf"][2]["properties"]) == set(OPERATORS)


def test_the_backend_names_are_every_engines_catalog():
    """Every engine's backends, those of its quantized oracles (``vllm/fp8``) included."""
    engines = [
        profile.for_quantization(scheme)
        for profiles in PROFILES.values()
        for p in profiles
        for profile, scheme in ((p, "none"), *((p, s) for s in p.oracles))
    ]
    assert len(engines) > len(PROFILES)
    names = {name for engine in engines for name in load_catalog(engine).names}
    assert set(DEFS["backend"]["enum"]) == names


def test_the_api_and_the_command_hand_out_this_file():
    assert moe_policy.schema("policy") == SCHEMA


RULE = {"id": "r", "effect": "forbid", "backends": ["triton"], "reason": "why"}


@pytest.mark.parametrize(
    ("policy", "code"),
    [
        ({"version": 2}, "invalid-value"),
        ({"mod": "strict"}, "unknown-key"),
        ({"mode": "strictt"}, "invalid-value"),
        ({"backend": "flashinfer_cutlas"}, "unknown-backend"),
        ({"audit": {"paht": "x.jsonl"}}, "unknown-key"),
        ({"audit": {"required": "sometimes"}}, "invalid-value"),
        ({"priority": {"gpu": ["triton"]}}, "unknown-key"),
        ({"priority": {"cuda": ["tritn"]}}, "unknown-backend"),
        ({"priority": {"cuda": ["triton", "triton"]}}, "duplicate-backend"),
        ({"rules": [{**RULE, "backends": ["triton", "triton"]}]}, "duplicate-backend"),
        ({"rules": [{**RULE, "efect": "forbid"}]}, "unknown-key"),
        ({"rules": [{**RULE, "effect": "ban"}]}, "invalid-value"),
        ({"rules": [{**RULE, "backends": []}]}, "missing-field"),
        ({"rules": [{k: v for k, v in RULE.items() if k != "reason"}]}, "missing-field"),
        ({"rules": [{**RULE, "when": {"model.experts": 8}}]}, "unknown-context-key"),
        ({"rules": [{**RULE, "when": {"platform": "gpu"}}]}, "invalid-value"),
        ({"rules": [{**RULE, "when": {"parallel.tp": {"gte": 2}}}]}, "unknown-operator"),
        ({"rules": [{**RULE, "when": {"parallel.tp": {"multiple_of": 0}}}]}, "invalid-value"),
        ({"rules": [{**RULE, "when": {"lora.enabled": "maybe"}}]}, "invalid-value"),
        # typed values: nothing truthy, no order on strings, MAJOR.MINOR exactly
        ({"version": True}, "invalid-value"),
        ({"audit": {"required": "yes"}}, "invalid-value"),
        ({"audit": {"path": ""}}, "invalid-value"),
        ({"rules": [{**RULE, "when": {"device.name": {"exists": "false"}}}]}, "invalid-value"),
        ({"rules": [{**RULE, "when": {"lora.enabled": "true"}}]}, "invalid-value"),
        ({"rules": [{**RULE, "when": {"platform": {"gt": "cuda"}}}]}, "invalid-value"),
        ({"rules": [{**RULE, "when": {"lora.enabled": {"lt": True}}}]}, "invalid-value"),
        ({"rules": [{**RULE, "when": {"platform": None}}]}, "invalid-value"),
        ({"rules": [{**RULE, "when": {"platform": []}}]}, "invalid-value"),
        ({"rules": [{**RULE, "when": {"parallel.tp": {"gt": [1]}}}]}, "invalid-value"),
        ({"rules": [{**RULE, "when": {"parallel.tp": "2"}}]}, "invalid-value"),
        ({"rules": [{**RULE, "when": {"device.name": 7}}]}, "invalid-value"),
        ({"rules": [{**RULE, "when": {"device.capability": "90"}}]}, "invalid-value"),
        ({"rules": [{**RULE, "when": {"device.capability": "9.0000001"}}]}, "invalid-value"),
    ],
)
def test_what_the_schema_rejects_the_loader_rejects(tmp_path, policy, code):
    """A broken policy fails the schema, and lint (the loader's own parser) finds the same."""
    assert not validator().is_valid(policy), policy
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(policy))
    findings = lint_paths([str(path)])
    assert code in {f.code for f in findings if f.severity == "error"}, findings


@pytest.mark.parametrize(
    "policy",
    [
        None,
        {"version": 1, "mode": "strict", "consistency": "warn"},
        {"audit": {"path": "${oc.env:MOE_POLICY_AUDIT_DIR,.}/a.jsonl", "required": True}},
        {"backend": "auto", "priority": {"cuda": ["triton", "batched_triton"]}},
        {
            "rules": [
                {
                    **RULE,
                    "action": "audit",
                    "link": "https://example.org/pr/1",
                    "when": {
                        "device.capability": {"ge": "9.0", "lt": 10.0},
                        "parallel.tp": {"multiple_of": 2},
                        "packages": "flashinfer",
                        "model.activation": ["silu", "relu2"],
                        "layer.index": {"exists": True},
                    },
                }
            ]
        },
    ],
)
def test_what_the_loader_accepts_the_schema_accepts(tmp_path, policy):
    validator().validate(policy)
    path = tmp_path / "policy.yaml"
    path.write_text(yaml.safe_dump(policy))
    assert [f for f in lint_paths([str(path)]) if f.severity == "error"] == []
