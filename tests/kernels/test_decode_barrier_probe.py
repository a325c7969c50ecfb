"""The one-kernel decode probe (``benchmarks/decode_barrier_probe.py``) computes the layer.

Off a GPU its two phases run as two interpreted launches (the barrier needs co-resident
programs); on the GPU the same cases run as one cooperative kernel with the grid barrier."""

from __future__ import annotations

import os
import sys

import pytest
import torch
from moe_cases import ON_GPU, make_routing, make_weights, make_x

from moe_policy.experts.base import ExpertsConfig
from moe_policy.experts.reference import fused_moe_reference
from moe_policy.experts.triton.fused_moe import ACTIVATION_CODES, TritonExperts

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))
import decode_barrier_probe as probe

CASES = [  # activation, gated, bias, router weight on the input
    ("silu", True, False, False),
    ("relu2", False, False, False),
    ("swigluoai", True, True, False),
    ("gelu", True, False, True),
]


def _run(cfg, w, x, tw, ti, dcfg, **kw):
    conv = TritonExperts.convert_weights(cfg, w["w13"], w["w2"], w["w13_bias"], w["w2_bias"])
    return probe.fused_moe_decode(
        x, conv["w13"], conv["w2"], tw, ti, act_code=ACTIVATION_CODES[cfg.activation],
        gated=cfg.gated, w13_bias=conv["w13_bias"], w2_bias=conv["w2_bias"],
        weight_pos=1 if cfg.apply_router_weight_on_input else 2, config=dcfg, **kw,
    )  # fmt: skip


@pytest.mark.parametrize(("act", "gated", "bias", "on_input"), CASES)
@pytest.mark.parametrize(("t", "k", "e"), [(1, 4, 8), (3, 2, 8)])
def test_probe_matches_reference(act, gated, bias, on_input, t, k, e, device):
    """Several I steps (48 / 16) and H steps (64 / 32), top-k 2 and 4, every activation form;
    one token's first slot routed to an invalid expert adds nothing."""
    cfg = ExpertsConfig(e, 64, 48, k, act, gated, bias, on_input)
    dtype = torch.float32
    w = make_weights(cfg, dtype, device)
    tw, ti = make_routing(t, e, k, device)
    ti[-1, 0] = -1
    x = make_x(t, 64, dtype, device)
    dcfg = probe.DecodeConfig(block_n1=8, block_k1=32, block_n2=16, block_i2=16)
    out = _run(cfg, w, x, tw, ti, dcfg)
    ref = fused_moe_reference(
        x, w["w13"], w["w2"], tw, ti, activation=act, gated=gated,
        w13_bias=w["w13_bias"], w2_bias=w["w2_bias"], apply_router_weight_on_input=on_input,
    )  # fmt: skip
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)


def test_probe_output_is_repeatable(device):
    """The top-k sum runs in slot order in one program per output tile: no atomics on data,
    so two calls give the same bits."""
    cfg = ExpertsConfig(8, 64, 48, 2)
    w = make_weights(cfg, torch.float32, device)
    tw, ti = make_routing(2, 8, 2, device)
    x = make_x(2, 64, torch.float32, device)
    dcfg = probe.DecodeConfig(block_n1=8, block_k1=32, block_n2=16, block_i2=16)
    both = _run(cfg, w, x, tw, ti, dcfg, split_phases=True)
    again = _run(cfg, w, x, tw, ti, dcfg, split_phases=True)
    assert torch.equal(both, again)
    assert both.abs().max() > 0


@pytest.mark.skipif(not ON_GPU, reason="the grid barrier needs co-resident programs (a GPU)")
def test_barrier_kernel_equals_split_phases_and_resets(device):
    """One cooperative kernel gives the split phases' output, call after call (the counters
    reset themselves), and refuses to allocate its counters inside a graph capture."""
    cfg = ExpertsConfig(16, 256, 128, 4)
    w = make_weights(cfg, torch.bfloat16, device)
    tw, ti = make_routing(1, 16, 4, device)
    x = make_x(1, 256, torch.bfloat16, device)
    dcfg = probe.DecodeConfig()
    split = _run(cfg, w, x, tw, ti, dcfg, split_phases=True)
    for _ in range(3):
        assert torch.equal(_run(cfg, w, x, tw, ti, dcfg, split_phases=False), split)
    assert probe._BARRIERS[str(x.device)].tolist() == [0, 0]
