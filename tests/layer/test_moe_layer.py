"""MoELayer closes the loop: config -> decision -> kernel -> output, checked against the reference."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from moe_policy import BackendOverrideWarning  # noqa: E402
from moe_policy.experts.lora import MoELoRAContext  # noqa: E402
from moe_policy.experts.reference import fused_moe_reference  # noqa: E402
from moe_policy.layer import BackendNotImplementedError, MoELayer  # noqa: E402

ON_GPU = torch.cuda.is_available()
DEVICE = "cuda" if ON_GPU else "cpu"
# Interpreted Triton: fp16 operands, fp32 accumulation -> ~1e-3 relative error; bf16 on the GPU.
DTYPE = torch.bfloat16 if ON_GPU else torch.float16
RTOL = 2e-2 if ON_GPU else 5e-3

SMALL_NEMOTRON = {  # Nemotron-shaped (relu2, non-gated, shared expert) at a tiny size for the CPU.
    "architectures": ["NemotronHForCausalLM"],
    "model_type": "nemotron_h",
    "n_routed_experts": 8,
    "num_experts_per_tok": 3,
    "hidden_size": 64,
    "moe_intermediate_size": 48,
    "mlp_hidden_act": "relu2",
    "torch_dtype": "bfloat16" if ON_GPU else "float16",
}
DRY = {
    "platform": "cuda",
    "capability": "9.0",
    "device_name": "NVIDIA H200",
    "packages": ["torch", "triton"],
}


def _weights(e, n1, h, i, seed=0):
    g = torch.Generator(device="cpu").manual_seed(seed)
    w13 = (torch.randn(e, n1, h, generator=g) / h**0.5).to(DEVICE, DTYPE)
    w2 = (torch.randn(e, h, i, generator=g) / i**0.5).to(DEVICE, DTYPE)
    return w13, w2


def _routing(t, e, k, seed=1):
    g = torch.Generator(device="cpu").manual_seed(seed)
    ids = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(t)]).to(
        DEVICE, torch.int32
    )
    weights = torch.softmax(torch.randn(t, k, generator=g), dim=1).to(DEVICE)
    return weights, ids


def _adapter(e, h, i, rank, seed):
    g = torch.Generator(device="cpu").manual_seed(seed)
    r = lambda *s: (torch.randn(*s, generator=g) * 0.1).to(DEVICE, DTYPE)  # noqa: E731
    return {
        "w13_a": [r(e, rank, h)],
        "w13_b": [r(e, i, rank)],
        "w2_a": r(e, rank, i),
        "w2_b": r(e, h, rank),
    }


def _rel_err(out, ref):
    return ((out.float() - ref.float()).norm() / ref.float().norm()).item()


@pytest.mark.parametrize("all2all", ["none", "deepep_low_latency"])
def test_lora_layer_runs_the_policy_choice_and_matches_the_reference(all2all):
    """LoRA + FlashInfer request: the policy picks triton (batched_triton under DeepEP-LL) and the output matches."""
    e, k, h, i, t = 8, 3, 64, 48, 13
    w13, w2 = _weights(e, i, h, i)
    with pytest.warns(BackendOverrideWarning):
        layer = MoELayer.build(
            SMALL_NEMOTRON,
            w13,
            w2,
            environ={"MOE_POLICY_BACKEND": "flashinfer_cutlass"},
            lora=True,
            max_loras=2,
            max_lora_rank=8,
            all2all=all2all,
            **DRY,
        )
    expected = "batched_triton" if all2all == "deepep_low_latency" else "triton"
    assert layer.decision.backend == expected
    assert (
        layer.decision.override is not None
        and layer.decision.override.origin == "env:MOE_POLICY_BACKEND"
    )
    layer.load_adapter(0, **_adapter(e, h, i, 8, seed=2))
    layer.load_adapter(1, **_adapter(e, h, i, 4, seed=3))
    x = torch.randn(t, h, device=DEVICE, dtype=DTYPE)
    weights, ids = _routing(t, e, k)
    mapping = torch.tensor(
        [0, 1, -1, 0, 1, -1, 0, 1, 0, 0, -1, 1, 1][:t], dtype=torch.int32, device=DEVICE
    )
    out = layer(x, weights, ids, mapping)
    ref = fused_moe_reference(
        x,
        w13,
        w2,
        weights,
        ids,
        activation="relu2",
        gated=False,
        lora=MoELoRAContext(layer.lora, mapping),
    )
    assert _rel_err(out, ref) < RTOL


def test_reference_backend_on_request():
    """An explicit request for the reference backend is honoured and runs anywhere."""
    e, k, h, i, t = 8, 3, 64, 48, 5
    w13, w2 = _weights(e, i, h, i)
    layer = MoELayer.build(SMALL_NEMOTRON, w13, w2, environ={}, backend="reference", **DRY)
    weights, ids = _routing(t, e, k)
    x = torch.randn(t, h, device=DEVICE, dtype=DTYPE)
    assert layer.decision.backend == "reference"
    torch.testing.assert_close(
        layer(x, weights, ids),
        fused_moe_reference(x, w13, w2, weights, ids, activation="relu2", gated=False),
    )


def test_a_decided_backend_without_an_implementation_is_a_clear_error():
    """flashinfer_trtllm can be decided (SM100 dry run) but has no implementation here."""
    e, h, i = 8, 64, 48
    w13, w2 = _weights(e, i, h, i)
    with pytest.raises(
        BackendNotImplementedError,
        match=r"the policy chose 'flashinfer_trtllm' \(TrtLlmBf16Experts\), which has no implementation in this process",
    ):
        MoELayer.build(
            SMALL_NEMOTRON, w13, w2, environ={}, platform="cuda", capability="10.0", dtype="bf16"
        )


def test_weights_must_match_the_model():
    """Weights of the wrong shape are refused before anything runs."""
    w13, w2 = _weights(8, 40, 64, 48)
    with pytest.raises(ValueError, match="w13"):
        MoELayer.build(SMALL_NEMOTRON, w13, w2, environ={}, **DRY)


def test_mapping_without_lora_is_an_error():
    """A token->adapter mapping on a layer without LoRA is refused, not ignored."""
    from moe_policy.errors import MoEPolicyError

    w13, w2 = _weights(8, 48, 64, 48)
    layer = MoELayer.build(SMALL_NEMOTRON, w13, w2, environ={}, **DRY)
    weights, ids = _routing(4, 8, 3)
    with pytest.raises(MoEPolicyError, match="LoRA is not enabled"):
        layer(
            torch.randn(4, 64, device=DEVICE, dtype=DTYPE),
            weights,
            ids,
            torch.zeros(4, dtype=torch.int32, device=DEVICE),
        )


SMALL_SWIGLUSTEP = {  # gated swiglustep experts ([gate; up], clamped at 7) at a tiny size
    "model_type": "step3p5",
    "num_local_experts": 8,
    "num_experts_per_tok": 2,
    "hidden_size": 64,
    "moe_intermediate_size": 48,
    "hidden_act": "swiglustep",
    "torch_dtype": "bfloat16" if ON_GPU else "float16",
}


@pytest.mark.parametrize(
    ("extra", "expected"),
    [({}, "triton"), ({"all2all": "deepep_low_latency"}, "batched_triton"),
     ({"backend": "reference"}, "reference")],
    ids=["standard", "batched", "reference"],
)  # fmt: skip
def test_a_swiglustep_model_builds_and_runs_what_the_policy_decides(extra, expected):
    """Gated swiglustep: the catalog gives it to triton, batched_triton and the reference, and
    each builds and matches the reference (the decision once raised 'not a gated activation')."""
    e, k, h, i, t = 8, 2, 64, 48, 9
    w13, w2 = _weights(e, 2 * i, h, i)
    layer = MoELayer.build(SMALL_SWIGLUSTEP, w13, w2, environ={}, **DRY, **extra)
    assert layer.decision.backend == expected
    assert (layer.config.activation, layer.config.gated) == ("swiglustep", True)
    # pre-activations well past the limit of 7, so that the clamps decide part of the output
    x = 12.0 * torch.randn(t, h, device=DEVICE, dtype=DTYPE)
    weights, ids = _routing(t, e, k)
    ref = fused_moe_reference(x, w13, w2, weights, ids, activation="swiglustep")
    assert _rel_err(layer(x, weights, ids), ref) < RTOL
    unclamped = fused_moe_reference(x, w13, w2, weights, ids, activation="swiglustep",
                                    swiglu_limit=1e4)  # fmt: skip
    assert _rel_err(unclamped, ref) > 0.05


SMALL_GPT_OSS = {  # gpt-oss-shaped (swigluoai with expert biases), unquantized, tiny
    "model_type": "gpt_oss",
    "num_local_experts": 8,
    "num_experts_per_tok": 2,
    "hidden_size": 64,
    "intermediate_size": 48,
    "torch_dtype": "bfloat16" if ON_GPU else "float16",
}


@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_a_model_with_biases_is_never_built_without_them(backend):
    """model.has_bias (gpt-oss): the reference backend once built without the biases and
    silently computed a bias-free MoE; every backend now refuses."""
    w13, w2 = _weights(8, 96, 64, 48)
    with pytest.raises(ValueError, match=r"model\.has_bias true"):
        MoELayer.build(SMALL_GPT_OSS, w13, w2, environ={}, backend=backend, **DRY)


def test_biases_for_a_model_without_them_are_refused():
    """Biases given to a layer decided for a model without biases are not silently added
    (nor dropped by a backend that does not pass biases)."""
    w13, w2 = _weights(8, 48, 64, 48)
    b13 = torch.zeros(8, 48, device=DEVICE, dtype=DTYPE)
    b2 = torch.zeros(8, 64, device=DEVICE, dtype=DTYPE)
    with pytest.raises(ValueError, match=r"model\.has_bias false"):
        MoELayer.build(SMALL_NEMOTRON, w13, w2, b13, b2, environ={}, **DRY)


def test_weights_of_another_dtype_than_the_decision_are_refused():
    """The backend was chosen for model.dtype: weights of another dtype are an error naming both."""
    w13, w2 = _weights(8, 48, 64, 48)
    with pytest.raises(ValueError, match=r"model\.dtype fp32"):
        MoELayer.build(SMALL_NEMOTRON, w13, w2, environ={}, dtype="fp32", **DRY)


def test_an_engine_provided_backend_names_the_engine():
    """A vLLM-profile decision names vLLM's backend: the error says which engine it is for."""
    from moe_policy import Selector

    w13, w2 = _weights(8, 48, 64, 48)
    selector = Selector(SMALL_NEMOTRON, environ={}, engine="vllm", **DRY)
    with pytest.raises(BackendNotImplementedError, match=r"'triton' .* for engine 'vllm'"):
        MoELayer(selector, w13, w2)
