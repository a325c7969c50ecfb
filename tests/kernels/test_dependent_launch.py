"""The launch plan of dependent launches (PDL), checked on any machine.

Correctness with programmatic dependent launch rests on one invariant: in a call, every kernel
after the first is launched as a dependent and waits on its predecessor before it reads what
that predecessor (or anything before it) wrote; a GEMM with LoRA may wait late (before the
expand) only when its predecessor is a LoRA shrink that triggers it after its own wait. The
kernels run here, planned for a device with dependent launches, with the PDL switches
recorded and then cleared (Triton's interpreter has no
grid-dependency ops); the GPU tests run them for real.
"""

from __future__ import annotations

import dataclasses

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from moe_policy.experts.base import ExpertsConfig  # noqa: E402
from moe_policy.experts.testing import (  # noqa: E402
    dtypes_for_device,
    lora_context,
    lora_mapping,
    make_lora,
    make_routing,
    make_weights,
    make_x,
)
from moe_policy.experts.triton import config as tc  # noqa: E402
from moe_policy.experts.triton import fused_moe as triton_moe  # noqa: E402
from moe_policy.experts.triton import lora as triton_lora  # noqa: E402
from moe_policy.experts.triton.device import device_limits  # noqa: E402
from moe_policy.experts.triton.fused_moe import TritonExperts, fused_moe_triton  # noqa: E402
from moe_policy.experts.triton.launch import MoEProblem, plan_launch  # noqa: E402

_SWITCHES = {"PDL": False, "PDL_LATE": False, "TRIGGER": False, "launch_pdl": False}


_NAMES = {"lora_shrink_kernel": "shrink", "moe_gemm_kernel": "gemm", "moe_sum_kernel": "sum"}


def _record(record_launches) -> list[tuple[str, dict]]:
    """Record every launch of the call's kernels; run them with the PDL switches off."""
    log: list[tuple[str, dict]] = []

    def plain(kwargs: dict) -> dict:
        return {**kwargs, **{k: v for k, v in _SWITCHES.items() if k in kwargs}}

    for module, attr in ((triton_lora, "lora_shrink_kernel"), (triton_moe, "moe_gemm_kernel"),
                         (triton_moe, "moe_sum_kernel")):  # fmt: skip
        record_launches(module, attr, log=log, rewrite=plain)
    return log


def _plan(log: list[tuple[str, dict]]) -> list[tuple[str, dict]]:
    """The launches as (kernel, PDL switches as launched), emptying the log."""
    plan = [(_NAMES[attr], {k: kw.get(k, False) for k in _SWITCHES}) for attr, kw in log]
    log.clear()
    return plan


TILES = tc.MoEConfig(16, tc.GemmConfig(32, 32, 1, 4, 2), tc.GemmConfig(32, 32, 1, 4, 2))


def _call(t: int, *, lora: bool, pdl: bool, naive: bool, trigger: bool | None = None,
          sms: int | None = None, change: dict | None = None):  # fmt: skip
    """One call planned for a device with dependent launches (and ``sms`` SMs), the plan's
    decisions replaced by ``change``."""
    cfg = ExpertsConfig(64, 32, 32, 4, "silu")
    dtype = dtypes_for_device()[-1]
    device = "cuda" if torch.cuda.is_available() else "cpu"
    wts = make_weights(cfg, dtype, device)
    conv = TritonExperts.convert_weights(cfg, wts["w13"], wts["w2"])
    x = make_x(t, 32, dtype, device)
    tw, ti = make_routing(t, 64, 4, device, seed=1)
    ctx, slots = None, ()
    if lora:
        ad = make_lora(cfg, num_slots=2, max_rank=16, ranks=[16, 8], dtype=dtype, device=device)
        ctx = lora_context(ad, lora_mapping(t, "round_robin", 2, device))
        slots = (ad.num_slots, ad.max_rank)
    dev = device_limits(x.device)
    dev = dataclasses.replace(dev, pdl=True, num_sms=sms or dev.num_sms)
    tiles = dataclasses.replace(TILES, pdl=pdl, trigger=trigger)
    plan = plan_launch(MoEProblem.of(cfg, t, x.element_size(), *slots), dev, tiles, naive)
    plan = dataclasses.replace(plan, **(change or {}))
    return fused_moe_triton(x, conv["w13"], conv["w2"], tw, ti, lora=ctx, plan=plan)


def _names(plan):
    return [name for name, _ in plan]


def test_decode_lora_every_kernel_after_the_first_waits(record_launches):
    """Decode with LoRA (dependent launches whatever the config says): the x shrink runs first as a
    plain launch that triggers GEMM 1; GEMM 1 and GEMM 2 wait late, the w2 shrink and the sum
    wait at once, and each shrink triggers its GEMM after its own wait."""
    log = _record(record_launches)
    _call(3, lora=True, pdl=False, naive=True)
    plan = _plan(log)
    assert _names(plan) == ["shrink", "gemm", "shrink", "gemm", "sum"]
    (_, s13), (_, g1), (_, s2), (_, g2), (_, sm) = plan
    assert not s13["launch_pdl"] and not s13["PDL"] and s13["TRIGGER"]
    for gemm in (g1, g2):
        assert gemm["launch_pdl"] and gemm["PDL"] and gemm["PDL_LATE"]
    assert s2["launch_pdl"] and s2["PDL"] and s2["TRIGGER"]
    assert sm["launch_pdl"] and sm["PDL"]


def test_aligned_lora_waits_on_the_alignment(record_launches):
    """With the alignment in front, the x shrink is a dependent too and waits at once."""
    log = _record(record_launches)
    _call(40, lora=True, pdl=False, naive=False)
    plan = _plan(log)
    assert _names(plan) == ["shrink", "gemm", "shrink", "gemm", "sum"]
    assert plan[0][1]["launch_pdl"] and plan[0][1]["PDL"] and plan[0][1]["TRIGGER"]
    assert all(sw["launch_pdl"] and sw["PDL"] for _, sw in plan)


def test_without_lora_pdl_follows_the_config(record_launches):
    """No LoRA: no dependent launch unless the config asks; with pdl on, decode GEMM 1 is the
    call's first kernel (plain) and GEMM 2, which sums the top k itself, waits at once."""
    log = _record(record_launches)
    _call(3, lora=False, pdl=False, naive=True)
    plan = _plan(log)
    assert _names(plan) == ["gemm", "gemm"]  # GEMM 2 writes the top-k sum (decode)
    assert not any(sw["launch_pdl"] or sw["PDL"] for _, sw in plan)
    _call(3, lora=False, pdl=True, naive=True)
    (_, g1), (_, g2) = _plan(log)
    assert not g1["launch_pdl"] and not g1["PDL"]
    assert g2["launch_pdl"] and g2["PDL"] and not g2["PDL_LATE"] and not g2["TRIGGER"]
    _call(40, lora=False, pdl=True, naive=False)
    plan = _plan(log)
    assert _names(plan) == ["gemm", "gemm", "sum"]
    assert all(sw["launch_pdl"] and sw["PDL"] and not sw["PDL_LATE"] for _, sw in plan)


def test_decode_gemm1_lets_gemm2_start_only_when_its_grid_leaves_sms_idle(record_launches):
    """Decode with pdl: GEMM 1 triggers GEMM 2 at its start when its programs (12 pairs x 1 N
    tile here) fit on the SMs at once; with more programs, or without pdl, nothing triggers."""
    log = _record(record_launches)
    _call(3, lora=False, pdl=True, naive=True, sms=12)
    (_, g1), (_, g2) = _plan(log)
    assert g1["TRIGGER"] and not g1["PDL"]
    assert g2["PDL"] and g2["launch_pdl"] and not g2["TRIGGER"]
    _call(3, lora=False, pdl=True, naive=True, sms=11)
    assert not any(sw["TRIGGER"] for _, sw in _plan(log))
    _call(3, lora=False, pdl=False, naive=True, sms=1000)
    assert not any(sw["TRIGGER"] for _, sw in _plan(log))
    _call(40, lora=False, pdl=True, naive=False, sms=1000)  # aligned: waits on the alignment
    assert not any(sw["TRIGGER"] for _, sw in _plan(log))


def test_config_trigger_overrides_the_rule(record_launches):
    """config.trigger True triggers however many programs GEMM 1 has, False never does; both
    only at decode with dependent launches and without LoRA."""
    log = _record(record_launches)
    _call(3, lora=False, pdl=True, naive=True, trigger=True, sms=1)
    (_, g1), (_, g2) = _plan(log)
    assert g1["TRIGGER"] and not g2["TRIGGER"] and g2["PDL"]
    for kw in (dict(pdl=False, naive=True), dict(pdl=True, naive=False)):
        _call(3 if kw["naive"] else 40, lora=False, trigger=True, sms=1, **kw)
        assert not any(sw["TRIGGER"] for name, sw in _plan(log) if name == "gemm")
    _call(3, lora=True, pdl=True, naive=True, trigger=True, sms=1)  # LoRA: the shrinks trigger
    assert [sw["TRIGGER"] for name, sw in _plan(log) if name == "gemm"] == [False, False]
    _call(3, lora=False, pdl=True, naive=True, trigger=False, sms=1000)
    assert not any(sw["TRIGGER"] for _, sw in _plan(log))


def test_lora_plan_without_dependent_launches_launches_none(record_launches):
    """A LoRA call's plan asks for dependent launches whatever the config says; with the
    plan's ``pdl`` off, nothing is launched dependent and nothing triggers."""
    log = _record(record_launches)
    _call(3, lora=True, pdl=False, naive=True, change={"pdl": False})
    plan = _plan(log)
    assert not any(sw["launch_pdl"] or sw["PDL"] or sw["TRIGGER"] for _, sw in plan)
