"""Feasibility: eliminate every backend that cannot run this context (catalog facts).

The first failing check names the reason. Version-added: 0.1.0.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from moe_policy.core.catalog import BackendSpec, Catalog, Requirement
from moe_policy.core.context import SelectionContext
from moe_policy.core.decision import Candidate, Status
from moe_policy.core.decision import ReasonCode as R
from moe_policy.core.keys import format_cause, parse_capability
from moe_policy.core.passes import Candidates, PassInputs, PassResult

NAME = "feasibility"


def capability_ok(spec: BackendSpec, capability: str | None) -> tuple[bool, str]:
    if not (spec.capability_min or spec.capability_max or spec.capability_any_of):
        return True, ""
    if capability is None:
        return False, "compute capability unknown (give device.capability / --capability)"
    cap = parse_capability(capability)
    if spec.capability_min and cap < parse_capability(spec.capability_min):
        return False, f"compute capability {capability} < {spec.capability_min}"
    if spec.capability_max and cap > parse_capability(spec.capability_max):
        return False, f"compute capability {capability} > {spec.capability_max}"
    if spec.capability_any_of:
        for pattern in spec.capability_any_of:
            major, _, minor = pattern.partition(".")
            if int(major) == cap[0] and (minor in ("*", "x") or int(minor) == cap[1]):
                return True, ""
        return False, f"compute capability {capability} not in {', '.join(spec.capability_any_of)}"
    return True, ""


def first_failure(
    requirements: tuple[Requirement, ...], values: Mapping[str, object]
) -> tuple[R, str] | None:
    """The first requirement that fails for ``values``, as (reason code, detail)."""
    for requirement in requirements:
        detail = requirement.failure(values)
        if detail is not None:
            return requirement.reason, detail
    return None


def pick_class(
    spec: BackendSpec, values: Mapping[str, object]
) -> tuple[str | None, tuple[R, str] | None]:
    """The first of ``spec``'s experts classes whose requirements hold (an engine tries them
    in order), or the last one's failure; a backend without classes has its one class."""
    if not spec.classes:
        return spec.experts_class, None
    failure: tuple[R, str] | None = None
    for cls in spec.classes:
        failure = first_failure(cls.requires, values)
        if failure is None:
            return cls.name, None
        failure = (failure[0], f"{cls.name}: {failure[1]}")
    return None, failure


def check_backend(spec: BackendSpec, ctx: SelectionContext) -> tuple[R, str] | None:
    """The first reason ``spec`` cannot run ``ctx``, or None when it can."""
    v = ctx.values
    platform = v.get("platform")
    if platform not in spec.platforms:
        return R.PLATFORM_UNSUPPORTED, f"platform {platform} (runs on {', '.join(spec.platforms)})"
    if platform == "cuda":
        ok, why = capability_ok(spec, v.get("device.capability"))
        if not ok:
            return R.DEVICE_CAPABILITY_UNSUPPORTED, why
    packages = v.get("packages")
    if packages is not None:
        missing = [p for p in spec.packages if p not in packages]
        if missing:
            return R.PACKAGE_UNAVAILABLE, f"not importable on the target: {', '.join(missing)}"
    if spec.delegated:
        return None
    quant = v.get("model.quantization")
    if quant not in spec.quantization:
        return (
            R.QUANTIZATION_UNSUPPORTED,
            f"quantization {quant} (serves {', '.join(spec.quantization)})",
        )
    dtype = v.get("model.dtype")
    if dtype not in spec.dtypes:
        return R.DTYPE_UNSUPPORTED, f"dtype {dtype} (supports {', '.join(spec.dtypes)})"
    act, gated = v.get("model.activation"), v.get("model.gated")
    if gated:
        if act not in spec.gated_activations:
            return (
                R.ACTIVATION_UNSUPPORTED,
                f"gated {act} (gated: {', '.join(spec.gated_activations) or 'none'})",
            )
    else:
        if not spec.non_gated_activations:
            return R.NON_GATED_UNSUPPORTED, f"non-gated {act} experts; runs gated activations only"
        if act not in spec.non_gated_activations:
            return (
                R.ACTIVATION_UNSUPPORTED,
                f"non-gated {act} (non-gated: {', '.join(spec.non_gated_activations)})",
            )
    fmt = v.get("parallel.activation_format")
    if spec.activation_format != "any" and fmt != spec.activation_format:
        return (
            R.ACTIVATION_FORMAT_MISMATCH,
            f"deployment delivers the {fmt} format ({format_cause(v)}); "
            f"backend takes {spec.activation_format}",
        )
    all2all = v.get("parallel.all2all_active", v.get("parallel.all2all"))
    if all2all in spec.all2all_exclude:
        return R.PARALLEL_CONFIG_UNSUPPORTED, f"all2all {all2all} is not supported"
    if v.get("parallel.eplb") and not spec.eplb:
        return R.PARALLEL_CONFIG_UNSUPPORTED, "EPLB is not supported"
    if v.get("model.has_bias") and not spec.bias:
        return R.ACTIVATION_UNSUPPORTED, "expert biases are not supported"
    local = v.get("model.local_experts")
    if spec.max_experts is not None and local is not None and local > spec.max_experts:
        return R.EXPERT_COUNT_UNSUPPORTED, f"{local} local experts > {spec.max_experts}"
    inter = v.get("model.intermediate_size_per_partition")
    if spec.intermediate_multiple and inter is not None and inter % spec.intermediate_multiple:
        return (
            R.SHAPE_ALIGNMENT_UNSUPPORTED,
            f"intermediate size per partition {inter} is not a multiple of {spec.intermediate_multiple}",
        )
    hidden = v.get("model.hidden_size")
    if spec.hidden_multiple and hidden is not None and hidden % spec.hidden_multiple:
        return (
            R.SHAPE_ALIGNMENT_UNSUPPORTED,
            f"hidden size {hidden} is not a multiple of {spec.hidden_multiple}",
        )
    if v.get("batch_invariant") and not spec.batch_invariant:
        return (
            R.BATCH_INVARIANCE_UNSUPPORTED,
            "batch-invariant kernels required; this backend is not",
        )
    return first_failure(spec.requires, v)


class FeasibilityPass:
    """Checks each live candidate against its catalog entry and any extra check."""

    name = NAME

    def __call__(
        self, ctx: SelectionContext, candidates: Candidates, inputs: PassInputs
    ) -> PassResult:
        out = []
        for cand in candidates:
            if cand.alive:
                spec = inputs.catalog.spec(cand.backend)
                verdict = check_backend(spec, ctx)
                if verdict is None:
                    experts_class, verdict = pick_class(spec, ctx.values)
                    if verdict is None and experts_class != spec.experts_class:
                        cand = replace(cand, experts_class=experts_class)
                if verdict is None and cand.backend in inputs.extra_checks:
                    ok, why = inputs.extra_checks[cand.backend](ctx.values)
                    if not ok:
                        verdict = (
                            R.IMPLEMENTATION_UNSUPPORTED,
                            why or "refused by the experts class",
                        )
                if verdict is not None:
                    cand = cand.eliminate(NAME, verdict[0], verdict[1])
            out.append(cand)
        return tuple(out), ()


def seed_candidates(
    catalog: Catalog, ctx: SelectionContext, priority: tuple[str, ...]
) -> Candidates:
    """Every catalog backend once: the platform's priority list first, the rest unlisted.

    A backend listed twice keeps its first place: loading refuses such a list, but a
    ``Policy`` built in code is not loaded, and a decision record names each backend once."""
    listed = [
        Candidate(name, Status.FEASIBLE) for name in dict.fromkeys(priority) if name in catalog
    ]
    rest = [
        Candidate(name, Status.FEASIBLE, listed=False)
        for name in catalog.names
        if name not in priority
    ]
    return (*listed, *rest)
