"""Structured events, deduplication, caching and the no-feasible-backend error."""

from __future__ import annotations

import warnings

import pytest
from structlog.testing import capture_logs

from moe_policy import BackendOverrideWarning, NoFeasibleBackendError, ReasonCode
from tests.bundled import DEEPSEEK, NEMOTRON


def test_hundred_layers_with_one_signature_cost_one_resolution(make_selector, h200):
    """100 layers that differ only by index run the passes once and log the decision once."""
    sel = make_selector(NEMOTRON, **h200)
    with capture_logs() as logs:
        decisions = [sel.select(i) for i in range(100)]
    assert sel.resolver.resolutions == 1
    assert {d.backend for d in decisions} == {"triton"}
    assert [d.layer_index for d in decisions] == list(range(100))
    assert len({d.decision_id for d in decisions}) == 100
    assert [e for e in logs if e["event"] == "moe_policy.decision"] == [
        {
            "event": "moe_policy.decision",
            "log_level": "info",
            "backend": "triton",
            "experts_class": "TritonExperts",
            "activation_format": "standard",
            "outcome": "auto",
            "requested": None,
            "layer_kind": "moe",
            "layer_index": 0,
            "fingerprint": decisions[0].fingerprint[:16],
            "count": 1,
            "summary": decisions[0].describe(),
        }
    ]
    assert sel.reporter.counts[decisions[0].fingerprint] == 100


def test_a_decision_from_the_cache_is_a_decision_of_its_own(make_selector, h200):
    """The default layer kind spelt out has the same signature: answered from the cache
    (one resolution), yet a separate decision with its own id."""
    sel = make_selector(NEMOTRON, **h200)
    first, second = sel.decide(), sel.decide(layer_kind="moe")
    assert sel.resolver.resolutions == 1
    assert first.fingerprint == second.fingerprint
    assert first.decision_id != second.decision_id


def test_draft_layers_are_a_separate_signature(make_selector, h200, tmp_path):
    """A rule on layer.kind treats MTP draft layers differently."""
    policy = tmp_path / "p.yaml"
    policy.write_text(
        "rules:\n  - {id: draft-ref, when: {layer.kind: draft}, effect: prefer, backends: [flashinfer_cutlass], reason: x}\n"
    )
    sel = make_selector(NEMOTRON, policy_files=[str(policy)], **h200)
    assert sel.select(3).backend == "triton"
    assert sel.select(52, "draft").backend == "flashinfer_cutlass"


def test_knob_ignored_event_for_a_vllm_variable_that_does_nothing(make_selector, h200):
    """VLLM_MOE_FORCE_MARLIN is reported once as knob_ignored with its origin."""
    sel = make_selector(NEMOTRON, environ={"VLLM_MOE_FORCE_MARLIN": "1"}, **h200)
    with capture_logs() as logs:
        sel.select(0)
        sel.select(1)
    events = [e for e in logs if e["event"] == "moe_policy.knob_ignored"]
    assert len(events) == 1
    assert (events[0]["knob"], events[0]["origin"], events[0]["log_level"]) == (
        "VLLM_MOE_FORCE_MARLIN",
        "env:VLLM_MOE_FORCE_MARLIN",
        "warning",
    )


def test_removed_flashinfer_knob_event_names_the_replacement(make_selector, h200):
    """The removed vLLM FlashInfer switch changes nothing and its event says so."""
    sel = make_selector(
        NEMOTRON,
        environ={"VLLM_USE_FLASHINFER_MOE_FP16": "1", "VLLM_FLASHINFER_MOE_BACKEND": "throughput"},
        **h200,
    )
    with capture_logs() as logs:
        decision = sel.select()
    assert decision.backend == "triton" and decision.requested is None
    events = [e for e in logs if e["event"] == "moe_policy.knob_ignored"]
    assert sorted(e["knob"] for e in events) == [
        "VLLM_FLASHINFER_MOE_BACKEND",
        "VLLM_USE_FLASHINFER_MOE_FP16",
    ]
    assert {e["replacement"] for e in events} == {"MOE_POLICY_BACKEND or vLLM's --moe-backend"}


def test_audit_rule_is_recorded_and_changes_nothing(make_selector, h200, tmp_path):
    """A rule in audit action logs what it would have done; the decision is unchanged."""
    policy = tmp_path / "p.yaml"
    policy.write_text(
        "rules:\n  - {id: no-triton, effect: forbid, backends: [triton], reason: trial, action: audit}\n"
    )
    sel = make_selector(NEMOTRON, policy_files=[str(policy)], **h200)
    with capture_logs() as logs:
        decision = sel.select()
    assert decision.backend == "triton"
    record = next(r for r in decision.rules if r.id == "no-triton")
    assert (record.matched, record.applied) == (True, False)
    assert [e["rule"] for e in logs if e["event"] == "moe_policy.rule_audit"] == ["no-triton"]


def test_no_feasible_backend_lists_every_backend(make_selector, h200):
    """DeepSeek-V3 is fp8: every unquantized backend is eliminated, and the error says why, each."""
    sel = make_selector(DEEPSEEK, **h200)
    with capture_logs() as logs, pytest.raises(NoFeasibleBackendError) as info:
        sel.select()
    decision = info.value.decision
    assert decision.backend is None
    assert len(decision.candidates) == len(sel.catalog.names)
    for cand in decision.candidates:
        assert f"  - {cand.backend}: " in str(info.value)
    assert decision.candidate("triton").reason_code is ReasonCode.QUANTIZATION_UNSUPPORTED
    assert [e["log_level"] for e in logs if e["event"] == "moe_policy.no_feasible_backend"] == [
        "error"
    ]


def test_override_warning_points_at_the_caller(make_selector, h200):
    """BackendOverrideWarning is attributed to the caller's file, not to moe_policy."""
    sel = make_selector(NEMOTRON, backend="flashinfer_cutlass", lora=True, **h200)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sel.select()
    hits = [w for w in caught if issubclass(w.category, BackendOverrideWarning)]
    assert len(hits) == 1 and hits[0].filename == __file__


def test_warning_filter_as_error_works(make_selector, h200):
    """`-W error::moe_policy.BackendOverrideWarning` turns the override into an exception."""
    sel = make_selector(NEMOTRON, backend="flashinfer_cutlass", lora=True, **h200)
    with warnings.catch_warnings():
        warnings.simplefilter("error", BackendOverrideWarning)
        with pytest.raises(BackendOverrideWarning):
            sel.select()


def test_module_level_select_backend_caches_its_selector(h200, monkeypatch):
    """select_backend reuses one Selector for the same arguments and environment."""
    import moe_policy
    from moe_policy.core.state import STATE

    for name in [n for n in __import__("os").environ if n.startswith(("MOE_POLICY_", "VLLM_"))]:
        monkeypatch.delenv(name)
    first = moe_policy.select_backend(NEMOTRON, layer_index=0, **h200)
    second = moe_policy.select_backend(NEMOTRON, layer_index=1, **h200)
    assert len(STATE.selectors) == 1
    assert first.fingerprint == second.fingerprint
    monkeypatch.setenv("MOE_POLICY_MODE", "strict")
    moe_policy.select_backend(NEMOTRON, layer_index=0, **h200)
    assert len(STATE.selectors) == 2


def test_unknown_api_argument(h200):
    """A misspelt keyword is a PolicyError with a suggestion."""
    import moe_policy

    with pytest.raises(
        moe_policy.PolicyError,
        match=r"unknown argument 'max_lora_rnk' \(did you mean 'max_lora_rank'\?\)",
    ):
        moe_policy.select_backend(NEMOTRON, max_lora_rnk=8, **h200)
