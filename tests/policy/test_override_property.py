"""Property: a selected backend differs from an explicit request only with a recorded override,
and then a warning (warn mode) or an error (strict mode) reached the caller."""

from __future__ import annotations

import warnings

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from moe_policy import (
    BackendOverrideError,
    BackendOverrideWarning,
    NoFeasibleBackendError,
    Outcome,
    Status,
)
from moe_policy.core.catalog import load_catalog
from tests.bundled import GPT_OSS, MIXTRAL, NEMOTRON, QWEN3

CATALOG = load_catalog()
contexts = st.fixed_dictionaries(
    {
        "model": st.sampled_from([NEMOTRON, MIXTRAL, QWEN3, GPT_OSS]),
        "platform": st.sampled_from(["cuda", "rocm", "cpu", "xpu", "tpu"]),
        "capability": st.sampled_from(["8.0", "9.0", "10.0", "10.3", "11.0", "12.0"]),
        "lora": st.booleans(),
        "all2all": st.sampled_from(
            ["none", "deepep_low_latency", "deepep_high_throughput", "flashinfer_nvlink_one_sided"]
        ),
        "dp": st.sampled_from([1, 2]),
        "tp": st.sampled_from([1, 2]),
        "eplb": st.booleans(),
        "batch_invariant": st.booleans(),
        "backend": st.one_of(st.none(), st.sampled_from(CATALOG.names)),
        "mode": st.sampled_from(["warn", "strict"]),
        "packages": st.one_of(
            st.none(),
            st.sampled_from([["torch", "triton"], ["torch"], ["torch", "triton", "flashinfer"]]),
        ),
    }
)


@settings(
    max_examples=250, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(case=contexts)
def test_request_differs_from_selection_only_with_an_override(make_selector, case):
    """Over random contexts and requests the override contract always holds."""
    args = dict(case)
    model = args.pop("model")
    if args["packages"] is None:
        del args["packages"]
    selector = make_selector(model, **args)
    request = selector.settings.request
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            decision = selector.select()
            raised = None
        except (BackendOverrideError, NoFeasibleBackendError) as exc:
            decision, raised = exc.decision, exc
    warned = [w for w in caught if issubclass(w.category, BackendOverrideWarning)]

    selected = [c for c in decision.candidates if c.status is Status.SELECTED]
    assert len(selected) == (0 if decision.backend is None else 1)
    for cand in decision.candidates:
        assert (cand.reason_code is not None) == (cand.status is Status.ELIMINATED)
    if decision.backend is None:
        assert isinstance(raised, NoFeasibleBackendError)
        return
    if request is None:
        assert decision.outcome is Outcome.AUTO and not decision.overrides and not warned
        return
    wanted = decision.requested.backend if decision.requested else request.backend
    if decision.backend == wanted:
        assert decision.outcome is Outcome.HONORED and not decision.overrides and not warned
        assert raised is None
    else:
        assert decision.outcome is Outcome.OVERRIDDEN
        assert [o.requested for o in decision.overrides] == [request.backend]
        assert decision.overrides[0].origin == "api"
        if args["mode"] == "strict":
            assert isinstance(raised, BackendOverrideError) and not warned
        else:
            assert raised is None and len(warned) == 1
