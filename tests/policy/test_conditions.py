"""Rule conditions: operators, capability ordering, list keys, missing context."""

from __future__ import annotations

import pytest

from moe_policy.core.origin import Origin
from moe_policy.core.problems import ProblemSink
from moe_policy.core.rules import parse_conditions
from moe_policy.errors import PolicyError


def _conds(when):
    return parse_conditions(
        when, lambda path, at_key=False: Origin.file("t.yaml", 1, 1), ("when",), ProblemSink()
    )


def _holds(when, values):
    return all(c.test(values.get(c.key)) for c in _conds(when))


@pytest.mark.parametrize(
    ("when", "values", "expected"),
    [
        ({"platform": "cuda"}, {"platform": "cuda"}, True),
        ({"platform": ["rocm", "xpu"]}, {"platform": "cuda"}, False),
        ({"device.capability": {"ge": "9.0", "lt": "10.0"}}, {"device.capability": "9.0"}, True),
        ({"device.capability": {"ge": "9.0", "lt": "10.0"}}, {"device.capability": "10.0"}, False),
        ({"device.capability": {"gt": "9.0"}}, {"device.capability": "12.1"}, True),
        ({"parallel.dp": {"gt": 1}}, {"parallel.dp": 2}, True),
        (
            {"model.intermediate_size_per_partition": {"multiple_of": 128}},
            {"model.intermediate_size_per_partition": 768},
            True,
        ),
        (
            {"model.intermediate_size_per_partition": {"not_multiple_of": 128}},
            {"model.intermediate_size_per_partition": 1856},
            True,
        ),
        ({"packages": "flashinfer"}, {"packages": ("torch", "triton")}, False),
        ({"packages": {"ne": "flashinfer"}}, {"packages": ("torch", "triton")}, True),
        ({"lora.enabled": True}, {"lora.enabled": False}, False),
        ({"rocm.aiter": {"ne": True}}, {"rocm.aiter": False}, True),
        ({"device.name": {"exists": False}}, {"device.name": None}, True),
        ({"device.capability": "9.0"}, {"device.capability": None}, False),
    ],
)
def test_condition_semantics(when, values, expected):
    """Each operator means what the rules docstring says."""
    assert _holds(when, values) is expected


@pytest.mark.parametrize("written", ["9.0", 9.0])
def test_capability_values_are_normalised(written):
    """`"9.0"` and the YAML float `9.0` both read as compute capability 9.0."""
    assert _conds({"device.capability": written})[0].operand == "9.0"


@pytest.mark.parametrize(
    "written", ["90", "sm_90", "9", "9.0000001", "99999.99999", "９.0", "9.01"]
)
def test_a_capability_is_major_dot_minor_exactly(written):
    """Nothing but MAJOR.MINOR is a capability: no "90" guess, no rounding of 9.0000001."""
    with pytest.raises(PolicyError, match="not a compute capability"):
        _conds({"device.capability": written})


def test_bad_operand_type_is_an_error():
    """multiple_of needs a positive integer."""
    with pytest.raises(PolicyError, match="multiple_of needs a positive integer"):
        _conds({"model.hidden_size": {"multiple_of": "x"}})


def test_bad_choice_value_is_an_error():
    """A value outside a key's choices is refused with a suggestion."""
    with pytest.raises(
        PolicyError, match=r"platform: 'cdua' is not one of .* \(did you mean 'cuda'\?\)"
    ):
        _conds({"platform": "cdua"})


def test_missing_context_is_reported(make_selector):
    """A rule on an unknown value does not match and names the missing key."""
    from moe_policy.core.rules import Rule

    rule = Rule("r", "forbid", ("triton",), _conds({"lora.max_loras": {"gt": 2}}), "x", "t.yaml")
    assert rule.evaluate({"lora.max_loras": None}) == (False, ("lora.max_loras",))
