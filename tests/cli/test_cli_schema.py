"""The shipped decision.v1 JSON Schema agrees with the code that writes the record."""

from __future__ import annotations

import copy
import json

import jsonschema
import pytest

import moe_policy
import moe_policy.schemas
from moe_policy.core.decision import SCHEMA_VERSION, Outcome, ReasonCode, Status
from moe_policy.core.keys import CONTEXT_KEYS, LAYER_KINDS
from moe_policy.core.pipeline import pass_names
from moe_policy.core.rules import ACTIONS, EFFECTS
from tests.bundled import NEMOTRON, REPO
from tests.cli.runner import H200, decision_schema, explain_record, run_cli, validate_record

#: What an audit line adds to the decision record.
AUDIT_FIELDS = ("timestamp", "host", "pid", "rank", "world_size", "count")


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


# -- the audit line: decision and agreement kinds ------------------------------------------


def _audit_validator():
    """A validator of the audit schema as ``moe_policy.schema`` hands it out (self-contained)."""
    schema = moe_policy.schema("audit")
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def _lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_audit_lines_of_real_selections_validate(tmp_path, h200):
    """select_backend's audit lines (an override, an auto decision, a repeat) pass the schema."""
    log = tmp_path / "audit.jsonl"
    with pytest.warns(moe_policy.BackendOverrideWarning):
        moe_policy.select_backend(
            NEMOTRON, lora=True, backend="flashinfer_cutlass", audit_log=str(log), **h200
        )
    for _ in range(2):
        moe_policy.select_backend(NEMOTRON, audit_log=str(log), **h200)
    lines = _lines(log)
    assert [line["outcome"] for line in lines] == ["overridden", "auto", "auto"]
    assert [line["count"] for line in lines] == [1, 1, 2]
    validator = _audit_validator()
    for line in lines:
        validator.validate(line)
    # The decision record alone fails the audit schema: the audit fields are required.
    record = {k: v for k, v in lines[0].items() if k not in AUDIT_FIELDS}
    validate_record(record)
    assert not validator.is_valid(record)


def test_the_cli_audit_lines_validate(tmp_path):
    """`explain --audit-log` (flag) and MOE_POLICY_AUDIT_LOG (env) each append a valid line."""
    log = tmp_path / "audit.jsonl"
    _, record = explain_record("--model", "qwen3-30b-a3b", *H200, "--lora", "--audit-log", str(log))
    explain_record("--model", "qwen3-30b-a3b", *H200, env={"MOE_POLICY_AUDIT_LOG": str(log)})
    lines = _lines(log)
    assert len(lines) == 2
    assert {k: v for k, v in lines[0].items() if k not in AUDIT_FIELDS} == {
        **record,
        "decision_id": lines[0]["decision_id"],
    }
    for line in lines:
        _audit_validator().validate(line)


def test_agreement_lines_validate(tmp_path, h200):
    """check_agreement's line (one rank) and a disagreement's line pass the agreement kind."""
    from moe_policy.distributed import check_agreement
    from moe_policy.fleet.agreement import compare_summaries, local_mode, rank_summary
    from moe_policy.fleet.distributed import agreement_record

    log = tmp_path / "audit.jsonl"
    selector = moe_policy.Selector(NEMOTRON, environ={}, **h200)
    decisions = [selector.decide(i) for i in range(3)]
    check_agreement(decisions, audit=str(log))
    (agreed,) = _lines(log)
    assert agreed["kind"] == "agreement" and agreed["agreed"] is True
    validator = _audit_validator()
    validator.validate(agreed)

    other = moe_policy.Selector(
        NEMOTRON, environ={"MOE_POLICY_BACKEND": "flashinfer_cutlass"}, **h200
    )
    per_rank = [decisions, [other.decide(i) for i in range(3)]]
    summaries = [
        rank_summary(d, rank=r, host=f"host-{r}", mode=local_mode(d, "warn"))
        for r, d in enumerate(per_rank)
    ]
    report = compare_summaries(summaries, rank=1)
    assert not report.agreed
    line = json.loads(json.dumps(agreement_record(report, ("warn", "api:mode"))))
    validator.validate(line)
    assert line["mismatched_layers"] == [["moe", 0], ["moe", 1], ["moe", 2]]

    for mutate in (
        lambda r: r.update(kind="agreed"),
        lambda r: r.update(agreed="yes"),
        lambda r: r.update(extra=1),
        lambda r: r.update(mismatched_layers=[["expert", 0]]),
        lambda r: r.update(agreed=True),  # agreed with mismatched layers
        lambda r: r.pop("world_size"),
    ):
        broken = copy.deepcopy(line)
        mutate(broken)
        assert not validator.is_valid(broken), broken


def test_the_audit_schema_lists_exactly_what_is_written(tmp_path, h200):
    """The decision kind is the record's fields plus the audit fields, each record field a
    reference to decision.v1 (one definition); the agreement kind is agreement_record's keys."""
    from moe_policy.fleet.agreement import compare_summaries, rank_summary
    from moe_policy.fleet.distributed import agreement_record
    from moe_policy.reporting.audit import audit_record

    shipped = json.loads((REPO / "moe_policy/schemas/audit.v1.json").read_text())
    decision = moe_policy.explain(NEMOTRON, **h200).decision
    written = audit_record(decision, 1)
    line = shipped["$defs"]["decision_line"]["properties"]
    assert list(line) == list(decision.to_dict()) + list(AUDIT_FIELDS)
    assert set(written) == set(line)
    for name in decision.to_dict():
        assert line[name] == {"$ref": f"decision.v1.json#/properties/{name}"}
    report = compare_summaries([rank_summary([decision], rank=0, host="h", mode=None)], rank=0)
    agreement = shipped["$defs"]["agreement_line"]
    assert list(agreement["properties"]) == list(agreement_record(report, None))
    assert set(agreement["required"]) == set(agreement["properties"])


def test_the_shipped_audit_file_resolves_against_its_neighbour():
    """The file in the package refers to decision.v1.json by a relative $ref; a validator
    given both files resolves it, as moe_policy.schema() does by bundling."""
    from referencing import Registry
    from referencing.jsonschema import DRAFT202012

    folder = REPO / "moe_policy/schemas"
    decision = json.loads((folder / "decision.v1.json").read_text())
    audit = json.loads((folder / "audit.v1.json").read_text())
    registry = Registry().with_resource(decision["$id"], DRAFT202012.create_resource(decision))
    validator = jsonschema.Draft202012Validator(audit, registry=registry)
    bundled = moe_policy.schema("audit")
    assert bundled["$defs"]["decision.v1.json"] == decision
    assert {k: v for k, v in bundled.items() if k != "$defs"} == {
        k: v for k, v in audit.items() if k != "$defs"
    }
    broken = {"kind": "agreement"}
    assert not validator.is_valid(broken)


# -- moe_policy.schema() and `moe-policy schema` ---------------------------------------------


@pytest.mark.parametrize("name", moe_policy.schemas.NAMES)
def test_the_schema_command_prints_what_the_api_returns(name):
    run = run_cli("schema", name)
    assert run.returncode == 0, run.stderr
    assert run.json() == moe_policy.schema(name)
    jsonschema.Draft202012Validator.check_schema(run.json())


def test_schema_returns_a_fresh_copy():
    first = moe_policy.schema("decision")
    first["title"] = "changed"
    assert moe_policy.schema("decision")["title"] != "changed"


def test_an_unknown_schema_name_is_one_error():
    with pytest.raises(
        moe_policy.PolicyError, match=r"unknown schema 'polcy' \(did you mean 'policy'\?\)"
    ):
        moe_policy.schema("polcy")
    run = run_cli("schema", "polcy")
    assert run.returncode == 2 and run.stdout == ""
    (line,) = run.errors()
    assert line.startswith("moe-policy") and "error:" in line and "'polcy'" in line
