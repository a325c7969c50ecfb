"""FlashInfer CUTLASS adapter on the CPU: layout conversion and argument mapping against a
fake of only the call boundary (``flashinfer.fused_moe.cutlass_fused_moe``), which computes
FlashInfer's math from the *converted* layout, so a wrong half-swap fails. GPU validation of
the adapter against the real FlashInfer is pending (it cannot be installed on the GPU here)."""

from __future__ import annotations

import enum
import importlib.util
import sys
import types
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from moe_policy.experts.base import ExpertsConfig
from moe_policy.experts.flashinfer_cutlass import FlashInferCutlassExperts, swap_gate_up
from moe_policy.experts.lora import MoELoRAAdapters, MoELoRAContext
from moe_policy.experts.testing import (
    make_weights,
    reference_output,
    rel_err,
)

#: bf16 inputs (the adapter's dtypes); the fake and the reference both accumulate in fp64/fp32,
#: so the difference is the final rounding of the output to bf16 (2^-9 relative).
BF16_REL_L2 = 1e-2


class FakeActivationType(enum.IntEnum):
    """Stand-in for FlashInfer's enum (member names as in flashinfer; values arbitrary)."""

    Gelu = 0
    Relu = 1
    Silu = 2
    Swiglu = 3
    Geglu = 4
    SwigluBias = 5
    Relu2 = 6
    Identity = 7


def fake_cutlass_fused_moe(calls: list[dict[str, Any]]):
    """A ``cutlass_fused_moe`` with FlashInfer's parameter names: records its arguments and
    computes FlashInfer's math (fc1 = [up; gate] for Swiglu) from what it was given."""

    def cutlass_fused_moe(
        input,
        token_selected_experts,
        token_final_scales,
        fc1_expert_weights,
        fc2_expert_weights,
        output_dtype,
        quant_scales,
        fc1_expert_biases=None,
        fc2_expert_biases=None,
        input_sf=None,
        swiglu_alpha=None,
        swiglu_beta=None,
        swiglu_limit=None,
        tp_size=1,
        tp_rank=0,
        ep_size=1,
        ep_rank=0,
        cluster_size=1,
        cluster_rank=0,
        output=None,
        enable_alltoall=False,
        use_deepseek_fp8_block_scale=False,
        use_w4_group_scaling=False,
        use_mxfp8_act_scaling=False,
        min_latency_mode=False,
        use_packed_weights=False,
        tune_max_num_tokens=8192,
        enable_pdl=None,
        activation_type=FakeActivationType.Swiglu,
    ) -> list[torch.Tensor]:
        calls.append(dict(locals()))
        x = input.double()
        out = torch.zeros(x.shape[0], fc2_expert_weights.shape[1], dtype=torch.float64)
        for t in range(x.shape[0]):
            for j in range(token_selected_experts.shape[1]):
                e = int(token_selected_experts[t, j])
                h = fc1_expert_weights[e].double() @ x[t]
                if activation_type == FakeActivationType.Swiglu:
                    up, gate = h.chunk(2)  # FlashInfer's w31: up rows first
                    a = F.silu(gate) * up
                elif activation_type == FakeActivationType.Relu2:
                    a = torch.relu(h).square()
                else:
                    raise NotImplementedError(activation_type)
                y = fc2_expert_weights[e].double() @ a
                out[t] += float(token_final_scales[t, j]) * y
        output.copy_(out.to(output_dtype))
        return [output]

    return cutlass_fused_moe


@pytest.fixture
def fake_flashinfer(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """Inject fake ``flashinfer`` and ``flashinfer.fused_moe`` modules; returns the call log."""
    calls: list[dict[str, Any]] = []
    pkg = types.ModuleType("flashinfer")
    pkg.__path__ = []  # a package
    fused_moe = types.ModuleType("flashinfer.fused_moe")
    fused_moe.cutlass_fused_moe = fake_cutlass_fused_moe(calls)
    fused_moe.ActivationType = FakeActivationType
    pkg.fused_moe = fused_moe
    monkeypatch.setitem(sys.modules, "flashinfer", pkg)
    monkeypatch.setitem(sys.modules, "flashinfer.fused_moe", fused_moe)
    return calls


def test_module_import_does_not_import_flashinfer() -> None:
    """Importing the adapter module never imports flashinfer (lazy import only)."""
    import moe_policy.experts.flashinfer_cutlass  # noqa: F401

    assert "flashinfer" not in sys.modules


def test_is_available_reason_without_flashinfer() -> None:
    """Without the package, is_available() says so."""
    if importlib.util.find_spec("flashinfer") is not None:
        pytest.skip("flashinfer is installed here")
    ok, reason = FlashInferCutlassExperts.is_available()
    assert not ok and "flashinfer" in reason


def test_is_available_with_fake_flashinfer_needs_cuda(fake_flashinfer: list) -> None:
    """With the package importable but no GPU, the reason is the device."""
    if torch.cuda.is_available():
        pytest.skip("has a GPU")
    ok, reason = FlashInferCutlassExperts.is_available()
    assert not ok and "CUDA" in reason


def test_class_contract_and_supports() -> None:
    """Declared without LoRA; supports() vetoes LoRA, unsupported activations and biases."""
    assert FlashInferCutlassExperts.backend == "flashinfer_cutlass"
    assert FlashInferCutlassExperts.activation_format == "standard"
    assert FlashInferCutlassExperts.supports_lora is False
    sup = FlashInferCutlassExperts.supports
    assert sup({"activation": "silu", "gated": True}) == (True, None)
    assert sup({"activation": "relu2", "gated": False}) == (True, None)
    assert sup({"lora_enabled": True})[0] is False
    assert sup({"activation": "swigluoai", "gated": True})[0] is False
    assert sup({"has_bias": True})[0] is False


def test_gated_conversion_puts_up_first_and_is_pure() -> None:
    """w13 [gate; up] -> fc1 [up; gate] in new tensors; the inputs are untouched."""
    e, h, i = 3, 8, 5
    cfg = ExpertsConfig(e, h, i, 2, activation="silu")
    w13, w2 = torch.randn(e, 2 * i, h), torch.randn(e, h, i)
    before = (w13.clone(), w2.clone())
    conv = FlashInferCutlassExperts.convert_weights(cfg, w13, w2)
    assert torch.equal(conv["fc1"][:, :i], w13[:, i:]) and torch.equal(
        conv["fc1"][:, i:], w13[:, :i]
    )
    assert torch.equal(conv["fc2"], w2) and conv["activation_type"] == "Swiglu"
    assert torch.equal(w13, before[0]) and torch.equal(w2, before[1])
    assert conv["fc1"].data_ptr() != w13.data_ptr() and conv["fc2"].data_ptr() != w2.data_ptr()
    assert torch.equal(swap_gate_up(swap_gate_up(w13, i), i), w13)


def test_non_gated_relu2_keeps_layout() -> None:
    """Non-gated relu2: fc1 is w13 [E, I, H] unchanged (a copy), activation Relu2."""
    cfg = ExpertsConfig(3, 8, 5, 2, activation="relu2", gated=False)
    w13, w2 = torch.randn(3, 5, 8), torch.randn(3, 8, 5)
    conv = FlashInferCutlassExperts.convert_weights(cfg, w13, w2)
    assert torch.equal(conv["fc1"], w13) and conv["fc1"].data_ptr() != w13.data_ptr()
    assert conv["activation_type"] == "Relu2"


@pytest.mark.parametrize(
    ("cfg", "match"),
    [
        (ExpertsConfig(4, 8, 4, 2, activation="swigluoai"), "gated silu and non-gated relu2"),
        (ExpertsConfig(4, 8, 4, 2, activation="gelu"), "gated silu and non-gated relu2"),
        (ExpertsConfig(4, 8, 4, 2, activation="silu", gated=False), "gated silu"),
        (ExpertsConfig(4, 8, 4, 2, has_bias=True), "biases"),
        (ExpertsConfig(4, 8, 4, 2, apply_router_weight_on_input=True), "top_k == 1"),
    ],
)
def test_unsupported_configs_raise(cfg: ExpertsConfig, match: str) -> None:
    """What the adapter does not declare is refused at conversion."""
    w13 = torch.zeros(4, cfg.w13_rows, 8)
    with pytest.raises(ValueError, match=match):
        FlashInferCutlassExperts.convert_weights(cfg, w13, torch.zeros(4, 8, 4))


@pytest.mark.parametrize(
    ("activation", "gated", "top_k", "weight_on_input"),
    [("silu", True, 2, False), ("relu2", False, 3, False), ("silu", True, 1, True)],
)
def test_apply_maps_arguments_and_matches_reference(
    fake_flashinfer: list, activation: str, gated: bool, top_k: int, weight_on_input: bool
) -> None:
    """Arguments reach cutlass_fused_moe with FlashInfer's names and dtypes; the fake's
    FlashInfer math on the converted weights equals the reference on the common layout."""
    e, h, i, t = 5, 16, 12, 7
    cfg = ExpertsConfig(
        e,
        h,
        i,
        top_k,
        activation=activation,
        gated=gated,
        apply_router_weight_on_input=weight_on_input,
    )
    wt = make_weights(cfg, torch.bfloat16, "cpu", seed=8)
    x = torch.randn(t, h).to(torch.bfloat16)
    ids = torch.stack([torch.randperm(e)[:top_k] for _ in range(t)]).to(torch.int64)
    w = torch.rand(t, top_k, dtype=torch.float64)
    ex = FlashInferCutlassExperts(cfg, wt["w13"], wt["w2"])
    out = ex.apply(x, w, ids)

    (call,) = fake_flashinfer
    assert call["token_selected_experts"].dtype == torch.int32
    assert torch.equal(call["token_selected_experts"], ids.to(torch.int32))
    assert call["token_final_scales"].dtype == torch.float32
    assert call["output_dtype"] == x.dtype and call["quant_scales"] is None
    assert call["output"] is out  # the preallocated buffer, returned as element 0
    expected = FakeActivationType.Swiglu if gated else FakeActivationType.Relu2
    assert call["activation_type"] == expected
    assert call["fc1_expert_weights"] is ex.weights["fc1"]
    if weight_on_input:
        assert torch.all(call["token_final_scales"] == 1)
    ref = reference_output(cfg, wt, x, w.float(), ids)
    assert rel_err(out, ref) < BF16_REL_L2


def test_unswapped_layout_would_fail(fake_flashinfer: list) -> None:
    """Sensitivity check: feeding the common [gate; up] layout to FlashInfer's math is wrong."""
    e, h, i, t = 4, 16, 12, 6
    cfg = ExpertsConfig(e, h, i, 2, activation="silu")
    wt = make_weights(cfg, torch.bfloat16, "cpu", seed=9)
    x = torch.randn(t, h).to(torch.bfloat16)
    ids = torch.stack([torch.randperm(e)[:2] for _ in range(t)]).to(torch.int32)
    w = torch.rand(t, 2)
    ex = FlashInferCutlassExperts(cfg, wt["w13"], wt["w2"])
    ex.weights["fc1"] = wt["w13"]  # simulate a missing half-swap
    ref = reference_output(cfg, wt, x, w, ids)
    assert rel_err(ex.apply(x, w, ids), ref) > 0.1


def test_lora_context_raises_clear_error(fake_flashinfer: list) -> None:
    """apply with a LoRA context refuses, naming the backends that can do LoRA."""
    cfg = ExpertsConfig(4, 16, 8, 2)
    wt = make_weights(cfg, torch.bfloat16, "cpu")
    ad = MoELoRAAdapters.allocate(
        num_slots=1, num_experts=4, hidden_size=16, intermediate_size=8, max_rank=4, num_slices=2
    )
    ex = FlashInferCutlassExperts(cfg, wt["w13"], wt["w2"])
    with pytest.raises(ValueError, match="does not support LoRA"):
        ex.apply(
            torch.randn(3, 16).bfloat16(),
            torch.rand(3, 2),
            torch.zeros(3, 2, dtype=torch.int32),
            MoELoRAContext(ad, torch.zeros(3, dtype=torch.int32)),
        )
    assert fake_flashinfer == []


def test_apply_rejects_swapped_routing_and_devices_and_skips_empty_batches(
    fake_flashinfer: list,
) -> None:
    """topk_weights and topk_ids swapped (both were cast and run silently) or on another
    device than x raise ValueError; T = 0 returns an empty output without calling
    FlashInfer (CUTLASS rejects an empty input's null data pointer, sgl-project/sglang#38773)."""
    cfg = ExpertsConfig(4, 16, 8, 2)
    wt = make_weights(cfg, torch.bfloat16, "cpu")
    ex = FlashInferCutlassExperts(cfg, wt["w13"], wt["w2"])
    x = torch.randn(3, 16).bfloat16()
    w, ids = torch.rand(3, 2), torch.tensor([[0, 1], [2, 3], [1, 0]], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"topk_ids must be int; got torch.float32"):
        ex.apply(x, ids, w)
    with pytest.raises(ValueError, match=r"topk_weights must be float; got torch.int32"):
        ex.apply(x, ids, ids)
    with pytest.raises(ValueError, match=r"on x's device cpu; got topk_ids on meta$"):
        ex.apply(x, w, ids.to("meta"))
    out = ex.apply(x[:0], w[:0], ids[:0])
    assert out.shape == (0, 16) and out.dtype == torch.bfloat16
    assert fake_flashinfer == []
