"""The catalog declares for each backend implemented here exactly the activations its experts
class runs, so a decision is always buildable (the catalog once gave ``triton`` gated
swiglustep, which its kernels did not run: the decision raised in ``MoELayer.build``).

What a class accepts is found by building it (``ExpertsConfig`` and the class's ``__init__``,
tiny weights) for every activation name the catalog may use, gated and not; that the
declared ones compute the right thing is checked by running them where this machine can
(reference, Triton under its interpreter, torch's CPU grouped GEMM) against the reference.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from moe_policy.core.catalog import load_catalog  # noqa: E402
from moe_policy.core.keys import ACTIVATIONS  # noqa: E402
from moe_policy.experts.base import ExpertsConfig, FusedMoEExperts  # noqa: E402
from moe_policy.experts.testing import (  # noqa: E402
    ON_GPU,
    cpu_grouped_mm_works,
    make_routing,
    make_weights,
    make_x,
    reference_output,
    rel_err,
)

CATALOG = load_catalog()
#: Catalog backends with an ``implementation:`` in this package.
IMPLEMENTED = [spec.name for spec in CATALOG if spec.implementation is not None]
#: Tiny layer: E, H, I, k (and T tokens for the runs).
E, H, I, K, T = 4, 32, 16, 2, 7  # noqa: E741


def _experts_class(name: str) -> type[FusedMoEExperts]:
    cls = CATALOG.load_experts_class(name)
    assert issubclass(cls, FusedMoEExperts) and cls.backend == name
    return cls


def _builds(cls: type[FusedMoEExperts], activation: str, gated: bool) -> bool:
    """Whether a layer of this activation can be built: the config and the class accept it."""
    try:
        cfg = ExpertsConfig(E, H, I, K, activation=activation, gated=gated)
    except ValueError:
        return False
    wts = make_weights(cfg, torch.float32, "cpu")
    try:
        cls(cfg, wts["w13"], wts["w2"])
    except ValueError as exc:
        assert activation in str(exc), f"refused for another reason: {exc}"
        return False
    return True


def test_the_implemented_backends_are_found():
    assert {"triton", "batched_triton", "reference"} <= set(IMPLEMENTED)


@pytest.mark.parametrize("name", IMPLEMENTED)
def test_catalog_activations_equal_what_the_class_builds(name):
    """Gated and non-gated lists: the catalog's equal the names the class builds, out of every
    activation the catalog may name; its class constants say the same."""
    spec, cls = CATALOG.spec(name), _experts_class(name)
    for gated, declared, constant in (
        (True, spec.gated_activations, cls.gated_activations),
        (False, spec.non_gated_activations, cls.non_gated_activations),
    ):
        assert len(set(declared)) == len(declared), f"{name}: a name listed twice: {declared}"
        builds = {a for a in ACTIVATIONS if _builds(cls, a, gated)}
        kind = "gated" if gated else "non_gated"
        assert set(declared) == builds, (
            f"{name}: catalog activations.{kind} {sorted(declared)} but {cls.__name__} builds "
            f"{sorted(builds)}"
        )
        assert set(constant) == builds


def _run(name: str, cfg: ExpertsConfig, wts: dict, x, tw, ti) -> torch.Tensor:
    """The backend's output on this machine (batched: dispatch, apply, combine)."""
    cls = _experts_class(name)
    if name == "torch_grouped_mm":  # the class runs CUDA bf16 only; its pipeline runs here
        from moe_policy.experts.grouped_mm import grouped_mm_fused_moe

        return grouped_mm_fused_moe(
            x, wts["w13"], wts["w2"], tw, ti, activation=cfg.activation, gated=cfg.gated,
            w13_bias=wts["w13_bias"], w2_bias=wts["w2_bias"], swiglu_alpha=cfg.swiglu_alpha,
            swiglu_limit=cfg.swiglu_limit,
        )  # fmt: skip
    experts = cls(cfg, wts["w13"], wts["w2"], wts["w13_bias"], wts["w2_bias"])
    if cls.activation_format == "batched":
        from moe_policy.experts.batched_format import combine_from_batched, dispatch_to_batched

        d = dispatch_to_batched(x, ti, cfg.num_experts, x.shape[0])
        yb = experts.apply(d.x, d.expert_num_tokens)  # type: ignore[call-arg]
        return combine_from_batched(yb, d.index_map, tw, x.shape[0])
    return experts.apply(x, tw, ti)


def _runnable_here(name: str) -> str | None:
    """Why ``name`` cannot run on this machine, or None."""
    if name == "flashinfer_cutlass":
        return "FlashInfer's CUTLASS MoE needs a CUDA GPU and flashinfer"
    if name == "torch_grouped_mm":
        ok = cpu_grouped_mm_works()
        return None if ok else "this torch has no CPU grouped_mm"
    ok, reason = _experts_class(name).is_available()
    return None if ok else reason


RUNS = [
    pytest.param(name, activation, gated,
                 id=f"{name}-{'gated' if gated else 'nongated'}-{activation}")
    for name in IMPLEMENTED
    for gated, acts in ((True, CATALOG.spec(name).gated_activations),
                        (False, CATALOG.spec(name).non_gated_activations))
    for activation in acts
]  # fmt: skip


@pytest.mark.parametrize(("name", "activation", "gated"), RUNS)
def test_declared_activations_run_and_match_the_reference(name, activation, gated, device):
    """Every declared activation runs (fp32, biases, a clamp limit of 1 so that the clamped
    ones clamp) and matches the float64 reference."""
    reason = _runnable_here(name)
    if reason is not None:
        pytest.skip(reason)
    on = "cpu" if name == "torch_grouped_mm" else device  # the pipeline in fp32: the CPU's
    cfg = ExpertsConfig(E, H, I, K, activation=activation, gated=gated, has_bias=True,
                        swiglu_limit=1.0)  # fmt: skip
    wts = make_weights(cfg, torch.float32, on)
    x = make_x(T, H, torch.float32, on) * 2.0
    tw, ti = make_routing(T, E, K, on, seed=3)
    out = _run(name, cfg, wts, x, tw, ti)
    ref = reference_output(cfg, wts, x, tw, ti, dtype=torch.float64)
    assert out.shape == x.shape
    assert rel_err(out, ref) < (1e-3 if ON_GPU else 1e-4)  # tf32 dots on a GPU


def test_tuner_kernel_activations_agree_with_the_triton_classes():
    """The tuner's table of what the Triton kernels run (``tuning.shapes.KERNEL_ACTIVATIONS``:
    True gated only, False non-gated only, None either) says what the classes build."""
    from moe_policy.experts.triton.batched import BatchedTritonExperts
    from moe_policy.experts.triton.fused_moe import TritonExperts
    from moe_policy.experts.triton.tuning.shapes import KERNEL_ACTIVATIONS

    for cls in (TritonExperts, BatchedTritonExperts):
        table = {
            a: (None if a in cls.non_gated_activations else True)
            if a in cls.gated_activations
            else False
            for a in cls.gated_activations | cls.non_gated_activations
        }
        assert table == KERNEL_ACTIVATIONS, cls.__name__
