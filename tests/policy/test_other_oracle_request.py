"""A request for a backend of the engine's other oracles (vLLM's ``marlin`` for a layer its
unquantized oracle decides, as in a GPTQ model's unquantized draft layer) is a request that
cannot run here: overridden loudly, or refused in strict mode, never an 'unknown backend'."""

from __future__ import annotations

import pytest

from moe_policy import BackendOverrideError, BackendOverrideWarning, PolicyError, Selector
from moe_policy.core.decision import Outcome, ReasonCode
from tests.bundled import MODELS, QWEN3

H200 = {"platform": "cuda", "capability": "9.0", "device_name": "NVIDIA H200"}
ENV = {"MOE_POLICY_BACKEND": "marlin"}


def test_another_oracles_backend_is_overridden_on_an_unquantized_layer():
    selector = Selector(QWEN3, environ=ENV, engine="vllm==0.33", **H200)
    with pytest.warns(BackendOverrideWarning):
        decision = selector.select()
    assert (decision.backend, decision.outcome) == ("triton", Outcome.OVERRIDDEN)
    [override] = decision.overrides
    assert (override.requested, override.selected, override.reason_code) == (
        "marlin",
        "triton",
        ReasonCode.QUANTIZATION_UNSUPPORTED,
    )
    assert (override.pass_name, override.origin) == ("request", "env:MOE_POLICY_BACKEND")
    assert "model.quantization=none" in override.detail
    assert not any(c.requested for c in decision.candidates)


def test_strict_mode_refuses_it():
    selector = Selector(QWEN3, environ={**ENV, "MOE_POLICY_MODE": "strict"}, engine="vllm==0.33",
                        **H200)  # fmt: skip
    with pytest.raises(BackendOverrideError, match=r"'marlin'.*quantization_unsupported"):
        selector.select()


def test_the_oracle_that_has_it_honours_it():
    gptq = str(MODELS / "qwen3-30b-a3b-gptq-int4.json")
    decision = Selector(gptq, environ=ENV, engine="vllm==0.33", **H200).decide()
    assert (decision.backend, decision.outcome) == ("marlin", Outcome.HONORED)


@pytest.mark.parametrize("engine", ["vllm==0.33", None])
def test_a_name_no_oracle_has_is_still_unknown(engine):
    """An engine without oracles (moe_policy's own) knows no marlin; a typo is one error."""
    value = "marlin" if engine is None else "marlinn"
    with pytest.raises(PolicyError, match=f"env:MOE_POLICY_BACKEND: unknown MoE backend '{value}'"):
        Selector(QWEN3, environ={"MOE_POLICY_BACKEND": value}, engine=engine, **H200)
