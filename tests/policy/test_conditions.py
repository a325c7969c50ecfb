"""Rule conditions (operators, capability ordering, list keys, missing context) and rule
effects on the ranking."""

from __future__ import annotations

import pytest

from moe_policy import Outcome, Status
from moe_policy.core.origin import Origin
from moe_policy.core.problems import ProblemSink
from moe_policy.core.rules import parse_conditions
from moe_policy.errors import PolicyError
from tests.bundled import QWEN3


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
        # on a list key, in/not_in test overlap: one shared package is enough
        (
            {"packages": {"in": ["aiter", "flashinfer"]}},
            {"packages": ("torch", "flashinfer")},
            True,
        ),
        ({"packages": {"in": ["aiter", "vllm"]}}, {"packages": ("torch", "flashinfer")}, False),
        (
            {"packages": {"not_in": ["aiter", "flashinfer"]}},
            {"packages": ("torch", "flashinfer")},
            False,
        ),
        ({"packages": {"not_in": ["aiter"]}}, {"packages": ("torch", "flashinfer")}, True),
        ({"parallel.tp": {"le": 2}}, {"parallel.tp": 2}, True),
        ({"parallel.tp": {"le": 2}}, {"parallel.tp": 4}, False),
        ({"device.capability": {"le": "9.0"}}, {"device.capability": "9.0"}, True),
        ({"device.capability": {"le": "9.0"}}, {"device.capability": "10.0"}, False),
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


SM90 = {"platform": "cuda", "capability": "9.0"}
SM120 = {"platform": "cuda", "capability": "12.0"}


def _with_rule(make_selector, tmp_path, rule: str, **args):
    """The decision for Qwen3 under one extra policy rule (a YAML flow mapping)."""
    policy = tmp_path / "p.yaml"
    policy.write_text(f"rules:\n  - {rule}\n")
    return make_selector(QWEN3, policy_files=[str(policy)], **args).decide()


def test_exists_false_matches_an_unknown_value(make_selector, tmp_path):
    """`exists: false` holds where the value is unknown, and the key is not missing context."""
    rule = (
        "{id: unnamed, when: {device.name: {exists: false}}, effect: prefer, "
        "backends: [reference], reason: x}"
    )
    decision = _with_rule(make_selector, tmp_path, rule, **SM90)
    record = next(r for r in decision.rules if r.id == "unnamed")
    assert (record.matched, record.applied, record.missing_context) == (True, True, ())
    assert decision.backend == "reference"
    named = _with_rule(make_selector, tmp_path, rule, device_name="NVIDIA H200", **SM90)
    assert not next(r for r in named.rules if r.id == "unnamed").matched
    assert named.backend == "triton"


@pytest.mark.parametrize(
    "order", [("triton", "flashinfer_cutlass"), ("flashinfer_cutlass", "triton")]
)
def test_prefer_puts_its_backends_first_in_the_order_written(make_selector, tmp_path, order):
    """On SM120 the priority list has CUTLASS before Triton; a prefer rule's own order wins."""
    rule = f"{{id: mine, effect: prefer, backends: [{', '.join(order)}], reason: x}}"
    assert _with_rule(make_selector, tmp_path, rule, **SM120).backend == order[0]


def test_unlisted_backends_run_only_on_request(make_selector):
    """With only torch on the target every listed CUDA backend is out; the feasible unlisted
    ones (torch_grouped_mm, reference) are not picked automatically, only when requested."""
    decision = make_selector(QWEN3, packages=["torch"], **SM90).decide()
    assert decision.backend is None
    for backend in ("torch_grouped_mm", "reference"):
        cand = decision.candidate(backend)
        assert (cand.status, cand.listed) == (Status.FEASIBLE, False)
    requested = make_selector(QWEN3, packages=["torch"], backend="reference", **SM90).decide()
    assert (requested.backend, requested.outcome) == ("reference", Outcome.HONORED)


def test_prefer_makes_an_unlisted_backend_rankable(make_selector, tmp_path):
    """A prefer rule naming a backend outside the priority list asks for it by name."""
    rule = "{id: mine, effect: prefer, backends: [torch_grouped_mm], reason: x}"
    decision = _with_rule(make_selector, tmp_path, rule, **SM90)
    assert decision.backend == "torch_grouped_mm"
    assert decision.candidate("torch_grouped_mm").listed


def test_demote_does_not_make_an_unlisted_backend_rankable(make_selector, tmp_path):
    """Demoting an unlisted backend does not ask for it: it still runs only on request."""
    rule = "{id: mine, effect: demote, backends: [reference], reason: x}"
    decision = _with_rule(make_selector, tmp_path, rule, packages=["torch"], **SM90)
    assert decision.backend is None
    reference = decision.candidate("reference")
    assert (reference.status, reference.listed) == (Status.FEASIBLE, False)
