"""The shipped decision.v1 JSON Schema agrees with the code that writes the record."""

from __future__ import annotations

import copy

import jsonschema
import pytest

from moe_policy.core.decision import SCHEMA_VERSION, Outcome, ReasonCode, Status
from moe_policy.core.keys import CONTEXT_KEYS, LAYER_KINDS
from moe_policy.core.pipeline import pass_names
from moe_policy.core.rules import ACTIONS, EFFECTS
from tests.bundled import NEMOTRON
from tests.cli.runner import decision_schema, validate_record


@pytest.fixture
def record(make_selector, h200):
    """A real overridden record: Nemotron + LoRA on an H200 with a CUTLASS request."""
    selector = make_selector(NEMOTRON, lora=True, backend="flashinfer_cutlass", **h200)
    return selector.decide().to_dict()


def _objects(node, path="$"):
    """Every object schema (one with properties) inside ``node``, with its path."""
    if isinstance(node, dict):
        if "properties" in node:
            yield path, node
        for key, value in node.items():
            yield from _objects(value, f"{path}.{key}")
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from _objects(value, f"{path}[{index}]")


def test_schema_is_valid_draft_2020_12():
    """The schema itself passes the 2020-12 meta-schema."""
    schema = decision_schema()
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    jsonschema.Draft202012Validator.check_schema(schema)


def test_enums_are_generated_from_the_code():
    """Reason codes, statuses, outcomes, passes, effects, context keys: the schema lists exactly the code's."""
    schema = decision_schema()
    defs = schema["$defs"]
    assert defs["reason_code"]["enum"] == [code.value for code in ReasonCode]
    assert defs["pass"]["enum"] == list(pass_names())
    assert defs["context_key"]["enum"] == list(CONTEXT_KEYS)
    assert defs["candidate"]["properties"]["status"]["enum"] == [s.value for s in Status]
    assert defs["rule"]["properties"]["effect"]["enum"] == list(EFFECTS)
    assert defs["rule"]["properties"]["action"]["enum"] == list(ACTIONS)
    assert schema["properties"]["outcome"]["enum"] == [o.value for o in Outcome]
    assert schema["properties"]["layer"]["properties"]["kind"]["enum"] == list(LAYER_KINDS)
    assert schema["properties"]["schema_version"] == {"const": SCHEMA_VERSION}


def test_every_record_object_is_closed():
    """additionalProperties is false at the top level and in every nested record."""
    objects = list(_objects(decision_schema()))
    assert len(objects) >= 10
    for path, node in objects:
        if path.endswith((".if", ".then", ".else")) or ".allOf" in path or ".if." in path:
            continue  # conditional fragments refine a closed object; they are not records
        assert node.get("additionalProperties") is False, path
        assert set(node["required"]) == set(node["properties"]), path


def test_schema_covers_exactly_the_fields_to_dict_writes(record):
    """The top-level properties are the keys of Decision.to_dict(), in its order."""
    assert list(decision_schema()["properties"]) == list(record)
    validate_record(record)


@pytest.mark.parametrize(
    ("mutate", "why"),
    [
        (lambda r: r.update(extra=1), "unknown top-level field"),
        (lambda r: r["candidates"][0].update(note="x"), "unknown candidate field"),
        (
            lambda r: r["overrides"][0].update(reason_code="no_reason"),
            "reason code outside the set",
        ),
        (lambda r: r.update(schema_version=2), "another schema version"),
        (lambda r: r.update(overrides=[]), "overridden without an override entry"),
        (
            lambda r: r["context"].update({"model.experts": {"value": 1, "origin": "api"}}),
            "unknown context key",
        ),
        (lambda r: r["context"]["platform"].update(origin="somewhere"), "origin of no known kind"),
        (
            lambda r: next(c for c in r["candidates"] if c["status"] == "eliminated").update(
                reason_code=None
            ),
            "elimination without a reason code",
        ),
    ],
)
def test_invalid_records_are_rejected(record, mutate, why):
    """The schema is strict enough to catch drift between writers and readers."""
    broken = copy.deepcopy(record)
    mutate(broken)
    with pytest.raises(jsonschema.ValidationError):
        validate_record(broken)
