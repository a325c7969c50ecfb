"""The deployment matrix's JSON Schema: the bundled matrix validates, and the schema knows
exactly the keys the loader reads (editors and CI can check a matrix before plan runs)."""

from __future__ import annotations

import json

import jsonschema
import pytest
import yaml

from moe_policy.planning import matrix
from tests.bundled import REPO

SCHEMA = json.loads((REPO / "moe_policy/schemas/matrix.v1.json").read_text())


def test_the_bundled_matrix_validates_and_names_its_schema():
    text = (REPO / "configs/matrices/default.yaml").read_text()
    assert text.startswith(
        "# yaml-language-server: $schema=../../moe_policy/schemas/matrix.v1.json"
    )
    jsonschema.validate(yaml.safe_load(text), SCHEMA)


def test_the_schema_has_the_loaders_keys():
    deployment = SCHEMA["$defs"]["deployment"]["properties"]
    assert set(deployment) == set(matrix.DEPLOYMENT_KEYS)
    assert set(SCHEMA["$defs"]["platform"]["properties"]) == set(matrix.PLATFORM_KEYS)
    assert set(deployment["parallel"]["properties"]) == set(matrix.PARALLEL_KEYS)
    assert set(deployment["lora"]["oneOf"][1]["properties"]) == set(matrix.LORA_KEYS)


@pytest.mark.parametrize(
    "bad",
    [
        {"deployments": [{"name": "a", "model": "m", "platforms": {"platform": "gpu"}}]},
        {"deployments": [{"name": "a", "model": "m", "platforms": {"platform": "cpu"}, "tp": 2}]},
        {"deployment": []},
    ],
)
def test_typos_fail_the_schema(bad):
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, SCHEMA)


def test_the_bundled_matrix_plans_every_shipped_model():
    """Each model in configs/models/ is in the bundled matrix, with and without LoRA."""
    shipped = {p.stem for p in (REPO / "configs/models").glob("*.json")}
    deployments = yaml.safe_load((REPO / "configs/matrices/default.yaml").read_text())[
        "deployments"
    ]
    for lora in (False, True):
        assert {d["model"] for d in deployments if d.get("lora", False) is lora} == shipped
