"""moe_policy.testing: an isolated selector for engine authors' tests."""

from __future__ import annotations

import pytest

from moe_policy import BackendOverrideError, PlatformFacts, PolicyError
from moe_policy.core.state import STATE
from moe_policy.testing import isolated_selector

pytestmark = pytest.mark.usefixtures("clean_policy_env")


@pytest.fixture
def clean_policy_env(monkeypatch):
    """A hostile process environment: the isolated selector must not read it."""
    monkeypatch.setenv("MOE_POLICY_BACKEND", "reference")
    monkeypatch.setenv("MOE_POLICY_MODE", "strict")


def test_captures_the_override_warning_event_and_decision(nemotron):
    sel = isolated_selector(nemotron, backend="flashinfer_cutlass", lora=True)
    decision = sel.select(3)
    assert (decision.backend, decision.outcome.value, decision.layer_index) == (
        "triton",
        "overridden",
        3,
    )
    assert sel.decisions == [decision]
    [warning] = sel.warnings
    assert warning.override.origin == "api"
    assert warning.override.reason_code.value == "lora_unsupported"
    [overridden] = [e for e in sel.events if e["event"] == "moe_policy.request_overridden"]
    assert overridden["level"] == "warning" and overridden["requested"] == "flashinfer_cutlass"
    assert sel.event_names()[-1] == "moe_policy.decision"


def test_reads_no_process_environment_and_leaves_process_state_alone(nemotron):
    sel = isolated_selector(nemotron)
    decision = sel.select()
    assert decision.requested is None and decision.mode == "warn"
    assert STATE.selectors == {} and STATE.reporting.counts == {}


def test_environment_given_explicitly_is_read(nemotron):
    sel = isolated_selector(nemotron, environ={"MOE_POLICY_BACKEND": "torch_grouped_mm"})
    decision = sel.select()
    assert decision.backend == "torch_grouped_mm"
    assert decision.requested is not None
    assert decision.requested.origin == "env:MOE_POLICY_BACKEND"


def test_pinned_platform_decides(mixtral):
    sel = isolated_selector(mixtral, platform=PlatformFacts("cpu", origin="api"))
    decision = sel.select()
    assert decision.backend == "cpu"
    assert decision.context["platform"] == ("cpu", "api")


def test_repeats_are_logged_once_per_selector(nemotron):
    first = isolated_selector(nemotron)
    for index in range(3):
        first.select(index)
    assert first.event_names().count("moe_policy.decision") == 1
    second = isolated_selector(nemotron)
    second.select(0)
    assert second.event_names().count("moe_policy.decision") == 1


def test_strict_mode_still_raises(nemotron):
    sel = isolated_selector(nemotron, backend="flashinfer_cutlass", lora=True, mode="strict")
    with pytest.raises(BackendOverrideError):
        sel.select()


def test_unknown_keyword_is_a_policy_error(nemotron):
    with pytest.raises(PolicyError, match="did you mean 'backend'"):
        isolated_selector(nemotron, backnd="triton")


def test_a_custom_pipeline_changes_the_decision_and_the_fingerprint(nemotron):
    from moe_policy.core.pipeline import DEFAULT_PIPELINE

    without_rules = tuple(p for p in DEFAULT_PIPELINE if p.name != "policy_rules")
    default = isolated_selector(nemotron, dp=2).decide()
    custom = isolated_selector(nemotron, dp=2, pipeline=without_rules).decide()
    assert default.fingerprint != custom.fingerprint
    assert not custom.rules and default.rules


def test_selector_takes_the_deployment_keywords_directly(qwen3):
    from moe_policy import Selector

    sel = Selector(qwen3, environ={}, platform="cuda", capability="9.0", lora=True, tp=2)
    decision = sel.decide(0)
    assert decision.backend == "triton"
    assert decision.context["parallel.tp"] == (2, "api")
    assert decision.context["platform"] == ("cuda", "api")
    with pytest.raises(PolicyError, match="did you mean 'lora'"):
        Selector(qwen3, environ={}, lorra=True)


def test_a_pipeline_without_the_request_pass_is_refused(nemotron):
    from moe_policy.core.pipeline import DEFAULT_PIPELINE

    without_request = tuple(p for p in DEFAULT_PIPELINE if p.name != "request")
    with pytest.raises(ValueError, match="has no RequestPass: an explicit backend request"):
        isolated_selector(nemotron, pipeline=without_request)


def test_a_request_dropped_by_a_late_pass_is_an_error_not_a_silent_override(nemotron):
    from moe_policy.core.passes.feasibility import FeasibilityPass
    from moe_policy.core.passes.lora import LoRAPass
    from moe_policy.core.passes.ranking import RankingPass
    from moe_policy.core.passes.request import RequestPass

    # The request is marked before LoRA eliminates flashinfer_cutlass: no pass records why.
    early_request = (FeasibilityPass(), RequestPass(), LoRAPass(), RankingPass())
    sel = isolated_selector(
        nemotron, backend="flashinfer_cutlass", lora=True, pipeline=early_request
    )
    with pytest.raises(ValueError, match="chose triton over the request for flashinfer_cutlass"):
        sel.decide()
    in_order = isolated_selector(
        nemotron,
        backend="flashinfer_cutlass",
        lora=True,
        pipeline=(*early_request[:1], LoRAPass(), RequestPass(), RankingPass()),
    ).decide()
    assert in_order.outcome.value == "overridden"
    assert in_order.override is not None
    assert in_order.override.reason_code.value == "lora_unsupported"
