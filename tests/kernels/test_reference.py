"""The torch reference agrees with a brute-force per-token loop in float64."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from moe_policy.experts.base import ExpertsConfig  # noqa: E402
from moe_policy.experts.lora import MoELoRAContext  # noqa: E402
from moe_policy.experts.reference import (  # noqa: E402
    ReferenceExperts,
    apply_activation,
    fused_moe_reference,
)
from moe_policy.experts.testing import (  # noqa: E402
    lora_mapping,
    make_lora,
    make_routing,
    make_weights,
    make_x,
    rel_err,
    swiglustep_float64,
)

#: Both sides compute in float64 from the same inputs; only summation order differs.
FP64_TOL = 1e-12


def _act_scalar(v: float, name: str) -> float:
    if name == "silu":
        return v / (1.0 + math.exp(-v))
    if name == "gelu":
        return 0.5 * v * (1.0 + math.erf(v / math.sqrt(2.0)))
    if name == "gelu_tanh":
        return 0.5 * v * (1.0 + math.tanh(math.sqrt(2.0 / math.pi) * (v + 0.044715 * v**3)))
    if name == "relu2":
        return max(v, 0.0) ** 2
    raise AssertionError(name)


def _brute_force(cfg: ExpertsConfig, wts: dict, x, tw, ti, lora: MoELoRAContext | None):
    """One token, one slot, one output element at a time (float64, python scalars for the act)."""
    w13, w2 = wts["w13"].double(), wts["w2"].double()
    b13 = wts["w13_bias"].double() if wts["w13_bias"] is not None else None
    b2 = wts["w2_bias"].double() if wts["w2_bias"] is not None else None
    i_sz = cfg.intermediate_size
    out = torch.zeros(x.shape, dtype=torch.float64)
    for t in range(x.shape[0]):
        for j in range(ti.shape[1]):
            e, w = int(ti[t, j]), float(tw[t, j])
            if e < 0:
                continue
            xin = x[t].double() * (w if cfg.apply_router_weight_on_input else 1.0)
            h = w13[e] @ xin
            slot = -1 if lora is None else int(lora.token_lora_mapping[t])
            use = slot >= 0 and int(lora.adapters.enabled[slot]) == 1  # type: ignore[union-attr]
            if use:
                ad = lora.adapters  # type: ignore[union-attr]
                deltas = [ad.w13_b[s, slot, e].double() @ (ad.w13_a[s, slot, e].double() @ xin)
                          for s in range(ad.num_slices)]  # fmt: skip
                if cfg.activation == "swigluoai":
                    h[0::2] += deltas[0]
                    h[1::2] += deltas[1]
                else:
                    h += torch.cat(deltas)
            if b13 is not None:
                h = h + b13[e]
            a = torch.empty(i_sz, dtype=torch.float64)
            for c in range(i_sz):
                if cfg.activation == "swigluoai":
                    g, u = min(float(h[2 * c]), cfg.swiglu_limit), float(h[2 * c + 1])
                    u = max(-cfg.swiglu_limit, min(u, cfg.swiglu_limit))
                    a[c] = (u + 1.0) * g / (1.0 + math.exp(-cfg.swiglu_alpha * g))
                elif cfg.activation == "swiglustep":  # [gate; up], the clamp after the SiLU
                    lim = cfg.swiglu_limit
                    g = min(_act_scalar(float(h[c]), "silu"), lim)
                    a[c] = g * max(-lim, min(float(h[i_sz + c]), lim))
                elif cfg.gated:
                    a[c] = _act_scalar(float(h[c]), cfg.activation) * float(h[i_sz + c])
                else:
                    a[c] = _act_scalar(float(h[c]), cfg.activation)
            y = w2[e] @ a
            if b2 is not None:
                y = y + b2[e]
            if use:
                y = y + ad.w2_b[slot, e].double() @ (ad.w2_a[slot, e].double() @ a)
            out[t] += y if cfg.apply_router_weight_on_input else w * y
    return out


CASES = [
    # (activation, gated, has_bias, weight_on_input)
    ("silu", True, False, False),
    ("gelu", True, False, False),
    ("gelu_tanh", True, True, False),
    ("swigluoai", True, True, False),
    ("swiglustep", True, True, False),
    ("swiglustep", True, False, True),
    ("relu2", False, False, False),
    ("silu", False, True, False),
    ("gelu", False, False, True),
    ("gelu_tanh", False, False, False),
    ("silu", True, False, True),
]


@pytest.mark.parametrize(("activation", "gated", "has_bias", "on_input"), CASES)
@pytest.mark.parametrize("with_lora", [False, True])
def test_reference_matches_brute_force(activation, gated, has_bias, on_input, with_lora):
    """Every activation, biases and weight-on-input, with and without mixed LoRA, match the loop."""
    k = 1 if on_input else 3
    cfg = ExpertsConfig(6, 12, 8, k, activation, gated, has_bias, on_input)
    wts = make_weights(cfg, torch.float64, "cpu")
    x = make_x(7, 12, torch.float64, "cpu")
    tw, ti = make_routing(7, 6, k, "cpu", seed=3)
    ti[2, 0] = -1  # an expert on another rank contributes nothing
    lora = None
    if with_lora:
        # slot 1 rank 2 < max rank 4 (padded); slot 2 disabled; tokens 0, 3, 6 have no adapter
        ad = make_lora(cfg, num_slots=3, max_rank=4, ranks=[4, 2, 3], dtype=torch.float64,
                       device="cpu", disabled=(2,))  # fmt: skip
        lora = MoELoRAContext(ad, lora_mapping(7, "some_none", 3, "cpu"))
    ref = fused_moe_reference(
        x, wts["w13"], wts["w2"], tw.double(), ti, activation=activation, gated=gated,
        w13_bias=wts["w13_bias"], w2_bias=wts["w2_bias"], apply_router_weight_on_input=on_input,
        lora=lora,
    )  # fmt: skip
    brute = _brute_force(cfg, wts, x, tw.double(), ti, lora)
    assert ref.dtype == torch.float64
    torch.testing.assert_close(ref, brute, rtol=FP64_TOL, atol=FP64_TOL)


@pytest.mark.parametrize("with_lora", [False, True])
def test_reference_swiglustep_clamps_at_the_layer_limit(with_lora):
    """swiglustep at a limit of 0.5, which most SiLU outputs and up values exceed: the
    reference follows the brute-force loop (and, without LoRA, the separate float64 formula)
    at that limit, and differs from the result at the default 7."""
    cfg = ExpertsConfig(6, 12, 8, 3, "swiglustep", True, True, swiglu_limit=0.5)
    wts = make_weights(cfg, torch.float64, "cpu")
    x = make_x(9, 12, torch.float64, "cpu") * 3.0  # |up| and silu(gate) well past the limit
    tw, ti = make_routing(9, 6, 3, "cpu", seed=4)
    ti[5, 1] = -1
    lora = None
    if with_lora:
        ad = make_lora(cfg, num_slots=2, max_rank=4, ranks=[4, 3], dtype=torch.float64,
                       device="cpu")  # fmt: skip
        lora = MoELoRAContext(ad, lora_mapping(9, "some_none", 2, "cpu"))

    def ref(limit: float) -> torch.Tensor:
        return fused_moe_reference(
            x, wts["w13"], wts["w2"], tw.double(), ti, activation="swiglustep",
            w13_bias=wts["w13_bias"], w2_bias=wts["w2_bias"], lora=lora, swiglu_limit=limit,
        )  # fmt: skip

    # the clamps decide: a good share of the pre-activations is past the limit on both sides
    h = torch.einsum("eoh,th->teo", wts["w13"], x) + wts["w13_bias"]
    gate, up = h[..., :8], h[..., 8:]
    assert float((torch.nn.functional.silu(gate) > 0.5).double().mean()) > 0.2
    assert float((up.abs() > 0.5).double().mean()) > 0.5
    out = ref(0.5)
    torch.testing.assert_close(out, _brute_force(cfg, wts, x, tw.double(), ti, lora),
                               rtol=FP64_TOL, atol=FP64_TOL)  # fmt: skip
    if lora is None:
        formula = swiglustep_float64(wts, x, tw, ti, 0.5)
        torch.testing.assert_close(out, formula, rtol=FP64_TOL, atol=FP64_TOL)
    assert rel_err(out, ref(7.0)) > 0.1


def test_apply_activation_swiglustep_elementwise():
    """The activation alone, against values worked out by hand in float64: [gate; up] halves,
    min(silu(gate), limit) * clamp(up, -limit, limit); alpha plays no part."""
    gate = [-3.0, 0.0, 1.0, 10.0, 7.5]
    up = [9.0, -9.0, 0.3, 2.0, -7.25]
    h = torch.tensor([gate + up], dtype=torch.float64)
    want = []
    for g, u in zip(gate, up, strict=True):
        s = min(g / (1.0 + math.exp(-g)), 7.0)
        want.append(s * max(-7.0, min(u, 7.0)))
    got = apply_activation(h, "swiglustep", True, alpha=0.1, limit=7.0)
    torch.testing.assert_close(got, torch.tensor([want], dtype=torch.float64), rtol=1e-15,
                               atol=1e-15)  # fmt: skip
    # silu(10) = 9.9995 is clamped to 7, up 9 and -9 to +-7: only the limit sets those
    assert got[0, 3].item() == 7.0 * 2.0 and got[0, 0].item() == pytest.approx(
        -3.0 / (1.0 + math.exp(3.0)) * 7.0, rel=1e-15
    )
    with pytest.raises(ValueError, match="swiglustep"):
        apply_activation(h, "swiglustep", False)


def test_reference_experts_backend_matches_function():
    """ReferenceExperts.apply is the reference function with the config's options."""
    cfg = ExpertsConfig(4, 8, 6, 2, "swigluoai", True, True)
    wts = make_weights(cfg, torch.float64, "cpu")
    x = make_x(5, 8, torch.float64, "cpu")
    tw, ti = make_routing(5, 4, 2, "cpu")
    backend = ReferenceExperts(cfg, wts["w13"], wts["w2"], wts["w13_bias"], wts["w2_bias"])
    got = backend.apply(x, tw, ti)
    want = _brute_force(cfg, wts, x, tw.double(), ti, None)
    torch.testing.assert_close(got, want, rtol=FP64_TOL, atol=FP64_TOL)


def test_reference_rejects_bad_input():
    """Caller mistakes raise one ValueError naming the argument; before, swapped topk_weights
    and topk_ids, a [N1] bias (one scalar added per expert) and adapters of another layer
    ran silently, and the rest failed with IndexError or RuntimeError inside torch."""
    cfg = ExpertsConfig(4, 16, 8, 2, "silu")
    wts = make_weights(cfg, torch.float32, "cpu")
    w13, w2 = wts["w13"], wts["w2"]
    x = make_x(3, 16, torch.float32, "cpu")
    tw, ti = make_routing(3, 4, 2, "cpu")
    with pytest.raises(ValueError, match=r"topk_ids int; got .*topk_weights \(3, 2\) torch.int32"):
        fused_moe_reference(x, w13, w2, ti, tw)
    with pytest.raises(ValueError, match=r"expected w13_bias \(4, 16\), got \(16,\)"):
        fused_moe_reference(x, w13, w2, tw, ti, w13_bias=torch.zeros(16))
    with pytest.raises(
        ValueError, match=r"shape mismatch \(gated=True\): expected w13 \[4, 16, 16\]"
    ):
        fused_moe_reference(x, w13[:, :12], w2, tw, ti)
    with pytest.raises(ValueError, match=r"expected x \[T, H\], .*topk_ids \(3,\) torch.int32"):
        fused_moe_reference(x, w13, w2, tw[:, 0], ti[:, 0])
    with pytest.raises(ValueError, match=r"both be \[T=3, k\]; .*topk_ids \(2, 2\)"):
        fused_moe_reference(x, w13, w2, tw[:2], ti[:2])
    with pytest.raises(ValueError, match=r"on x's device cpu; got w2 on meta$"):
        fused_moe_reference(x, w13, w2.to("meta"), tw, ti)
    other = make_lora(ExpertsConfig(8, 16, 8, 2), num_slots=1, max_rank=4, ranks=[4],
                      dtype=torch.float32, device="cpu")  # fmt: skip
    with pytest.raises(ValueError, match=r"LoRA shapes .* do not match the layer.*E=4"):
        fused_moe_reference(x, w13, w2, tw, ti, lora=MoELoRAContext(other, torch.zeros(3).int()))
    ad = make_lora(cfg, num_slots=2, max_rank=4, ranks=[4], dtype=torch.float32, device="cpu")
    with pytest.raises(
        ValueError, match=r"token_lora_mapping must be int \[T=3\], got shape \(2,\)"
    ):
        fused_moe_reference(x, w13, w2, tw, ti, lora=MoELoRAContext(ad, torch.zeros(2).int()))
    out = fused_moe_reference(x[:0], w13, w2, tw[:0], ti[:0])
    assert out.shape == (0, 16) and out.dtype == torch.float32
