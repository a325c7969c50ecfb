"""Assemble the SelectionContext: defaults < platform probe < model config < settings layers.

Dry runs: when the platform, capability or device name is given explicitly, the
local machine is not probed and the target is assumed to have every backend's
packages, unless ``packages`` is given too.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from moe_policy.core.catalog import Catalog
from moe_policy.core.context import SelectionContext
from moe_policy.core.engines import MOE_POLICY, EngineProfile
from moe_policy.core.keys import BATCHED_ALL2ALL, CONTEXT_KEYS, coerce_value
from moe_policy.core.model import ModelFacts
from moe_policy.core.origin import Origin
from moe_policy.core.platform import PlatformFacts, current_platform
from moe_policy.errors import PolicyError

#: Deployment facts when nobody says otherwise.
DEFAULTS: Mapping[str, Any] = {
    "parallel.tp": 1,
    "parallel.dp": 1,
    "parallel.ep": False,
    "parallel.all2all": "none",
    "parallel.eplb": False,
    "parallel.sp": False,
    "lora.enabled": False,
    "lora.fully_sharded": False,
    "lora.max_rank": None,
    "lora.max_loras": None,
    "layer.kind": "moe",
    "layer.index": None,
    "batch_invariant": False,
    "rocm.aiter": False,
    "device.capability": None,
    "device.name": None,
    "cpu.arch": None,
    "cpu.amx": False,
    "rocm.gfx": None,
    "cpu.amx_fp8": False,
}
DRY_RUN_KEYS = ("platform", "device.capability", "device.name")


def build_context(
    catalog: Catalog,
    model: ModelFacts,
    settings_context: Mapping[str, Any],
    *,
    mode: str,
    request: Any,
    platform: PlatformFacts | None = None,
    engine: EngineProfile = MOE_POLICY,
    engine_origin: Origin | str = "default",
    switched_off: Sequence[tuple[str, str]] = (),
    current: Callable[[], PlatformFacts] = current_platform,
) -> SelectionContext:
    """Every fact with its origin; ``settings_context`` maps key -> Resolved (env, API, CLI).
    ``switched_off`` names packages an engine switch takes out of ``packages`` (package,
    origin of the switch), whoever said the target has them. ``current`` gives the target's
    facts when neither ``platform`` nor a dry run describes it (called only then)."""
    values: dict[str, Any] = dict(DEFAULTS)
    origins: dict[str, str] = {key: "default" for key in DEFAULTS}

    def put(key: str, value: Any, origin: Origin | str) -> None:
        values[key] = value
        origins[key] = str(origin)

    put("engine", engine.name, engine_origin)
    put("engine.version", engine.version, engine_origin)

    dry_run = any(key in settings_context for key in DRY_RUN_KEYS)
    if platform is not None:
        _put_platform(put, platform)
    elif not dry_run:
        _put_platform(put, current())
    else:
        put("platform", "cuda", "default")
        every = sorted({pkg for spec in catalog for pkg in spec.packages})
        put("packages", tuple(every), Origin.derived("dry run: assumes every backend's packages"))
    for key, (value, origin) in model.facts.items():
        put(key, coerce_value(key, value, origin), origin)
    for key, resolved in settings_context.items():
        put(key, resolved.value, resolved.origin)
    _switch_off(catalog, values, origins, switched_off)
    _derive(values, origins, engine, request)
    _check_deployment(catalog, engine, values, origins)
    return SelectionContext(values, origins, request, mode)


def _switch_off(
    catalog: Catalog,
    values: dict[str, Any],
    origins: dict[str, str],
    switched_off: Sequence[tuple[str, str]],
) -> None:
    """``packages`` less those an engine switch takes out, the switch named in its origin
    (unknown packages mean every backend's, as in a dry run)."""
    if not switched_off:
        return
    packages = values.get("packages")
    if packages is None:
        packages = tuple(sorted({pkg for spec in catalog for pkg in spec.packages}))
    off = [(name, origin) for name, origin in switched_off if name in packages]
    if not off:
        return
    names = {name for name, _ in off}
    values["packages"] = tuple(p for p in packages if p not in names)
    why = ", ".join(f"{name} switched off by {origin}" for name, origin in off)
    base = origins.get("packages", "default")
    # A bare origin (api, probe, default) takes no "; ..." tail in a record's origin: the
    # packages are then derived from it, less what the switch took out.
    origins["packages"] = f"{base}; {why}" if ":" in base else str(Origin.derived(f"{base}; {why}"))


def _check_deployment(
    catalog: Catalog, engine: EngineProfile, values: Mapping[str, Any], origins: Mapping[str, str]
) -> None:
    """The engine's deployment constraints: one that fails is an error naming the keys that
    break it and where they came from (it would fail the engine's start-up later)."""
    for requirement in catalog.deployment:
        detail = requirement.failure(values)
        if detail is None:
            continue
        keys = [c.key for c in (*requirement.need, *requirement.when)]
        origin = next((origins[k] for k in keys if origins.get(k, "default") != "default"), None)
        raise PolicyError(f"{engine.label} cannot run this deployment: {detail}", origin)


def _own_layout(values: Mapping[str, Any]) -> tuple[int, int, str, str]:
    """This package's layer: EP over tp x dp ranks, the all2all kind as given."""
    tp, dp, ep = values["parallel.tp"], values["parallel.dp"], values["parallel.ep"]
    return (tp * dp if ep else 1), (1 if ep else tp), values["parallel.all2all"], "parallel.all2all"


#: vLLM rewrites the removed all2all kinds to allgather_reducescatter, also its default.
VLLM_ALL2ALL_ALIASES = {"none": "allgather_reducescatter", "naive": "allgather_reducescatter",
                        "pplx": "allgather_reducescatter"}  # fmt: skip


def _vllm_layout(values: Mapping[str, Any]) -> tuple[int, int, str, str]:
    """vLLM's FusedMoEParallelConfig: tp is flattened over dp; EP only when that is > 1; the
    all2all kernels run only under EP with dp > 1 or sequence parallelism."""
    tp, dp, ep = values["parallel.tp"], values["parallel.dp"], values["parallel.ep"]
    flat = tp * dp
    use_ep = bool(ep) and flat > 1
    all2all = VLLM_ALL2ALL_ALIASES.get(values["parallel.all2all"], values["parallel.all2all"])
    kernels = use_ep and (dp > 1 or bool(values.get("parallel.sp")))
    why = "parallel.all2all when expert parallelism runs all2all kernels (dp > 1 or sequence parallel)"
    return (flat if use_ep else 1), (1 if use_ep else flat), (all2all if kernels else "none"), why


def _blame(origins: Mapping[str, str], keys: tuple[str, ...]) -> str | None:
    """The origin to name for a check across ``keys``: the first set explicitly (an
    override beats the config file it contradicts), else the first known."""
    known = [origins[k] for k in keys if origins.get(k, "default") != "default"]
    explicit = [o for o in known if not o.startswith("file:")]
    chosen = explicit or known
    return chosen[0] if chosen else None


def _check_against_experts(
    values: Mapping[str, Any], origins: Mapping[str, str], experts: int, ep_size: int
) -> None:
    """The checks a config.json is held to, whoever set the values (an override too)."""
    top_k = values["model.top_k"]
    if top_k > experts:
        raise PolicyError(
            f"model.top_k {top_k} exceeds model.num_experts {experts}",
            _blame(origins, ("model.top_k", "model.num_experts")),
            key="model.top_k",
        )
    activation, gated = values.get("model.activation"), values.get("model.gated")
    for name, needs in (("relu2", False), ("swigluoai", True), ("swiglustep", True)):
        if activation == name and gated is not None and gated != needs:
            raise PolicyError(
                f"model.activation {name} is {'gated' if needs else 'non-gated'}; "
                f"model.gated {str(gated).lower()} contradicts it",
                _blame(origins, ("model.gated", "model.activation")),
                key="model.gated",
            )
    if ep_size > experts:
        raise PolicyError(
            f"an expert-parallel group of {ep_size} ranks (parallel.ep_size) exceeds "
            f"model.num_experts {experts}: some ranks would hold no expert",
            _blame(origins, ("parallel.tp", "parallel.dp", "parallel.ep", "model.num_experts")),
            key="parallel.ep_size",
        )


def _put_platform(put: Any, facts: PlatformFacts) -> None:
    """The target's facts, typed like any other value (pinned facts come from callers)."""
    origin = facts.origin
    put("platform", coerce_value("platform", facts.platform, origin), origin)
    put("device.capability", coerce_value("device.capability", facts.capability, origin), origin)
    put("device.name", coerce_value("device.name", facts.device_name, origin), origin)
    # None ("assume every package") is still recorded: a record lists every context key
    packages = facts.packages
    put(
        "packages", None if packages is None else coerce_value("packages", packages, origin), origin
    )


def _vllm_fp8_keys(values: dict[str, Any], origins: dict[str, str], tp_shards: int) -> None:
    """What vLLM's Hugging Face fp8 method asks its oracle for, from the checkpoint's facts.

    A weight block that does not divide the tensor-parallel shard is refined to the largest
    common block of at least 32 (``refine_fp8_moe_block_shape``: only Triton takes it);
    per-tensor activations quantized dynamically are quantized per token under batch
    invariance (``Fp8MoEMethod``: a per-tensor scale would depend on the batch).
    """
    if values.get("model.quantization") != "fp8" or values.get("model.quant.format") != "fp8":
        return
    block = values.get("model.quant.block")
    if values.get("model.quant.weight_scale") == "block" and block:
        n, k = (int(side) for side in str(block).split("x"))
        shard = values["model.intermediate_size_per_partition"]
        if shard % n or (tp_shards > 1 and shard % k):
            refined = math.gcd(n, k, shard, values["model.hidden_size"])
            if refined >= 32:
                values["model.quant.block"] = f"{refined}x{refined}"
                origins["model.quant.block"] = str(
                    Origin.derived(
                        "model.quant.block refined to divide model.intermediate_size_per_partition"
                    )
                )
    if (
        values.get("model.quant.weight_scale") == "tensor"
        and values.get("model.quant.activation") == "dynamic_tensor"
        and values.get("batch_invariant")
    ):
        values["model.quant.activation"] = "dynamic_token"
        origins["model.quant.activation"] = str(
            Origin.derived(
                "batch_invariant: per-tensor dynamic activations are quantized per token"
            )
        )


def _derive(
    values: dict[str, Any], origins: dict[str, str], engine: EngineProfile, request: Any
) -> None:
    for key in ("parallel.tp", "parallel.dp", "lora.max_rank", "lora.max_loras"):
        value = values.get(key)
        if value is not None and value < 1:
            raise PolicyError(f"{key} must be at least 1, got {value}", origins[key], key=key)
    layout = _vllm_layout(values) if engine.vllm_layout else _own_layout(values)
    ep_size, tp_shards, active, why = layout
    values["parallel.ep_size"] = ep_size
    origins["parallel.ep_size"] = str(Origin.derived("parallel.ep, parallel.tp, parallel.dp"))
    experts = values["model.num_experts"]
    _check_against_experts(values, origins, experts, ep_size)
    values["model.local_experts"] = -(-experts // ep_size)
    origins["model.local_experts"] = str(Origin.derived("model.num_experts / parallel.ep_size"))
    inter = values["model.intermediate_size"]
    if inter % tp_shards:
        raise PolicyError(
            f"model.intermediate_size {inter} is not divisible by the {tp_shards} tensor-parallel "
            f"shards of the experts",
            origins["parallel.tp"],
            key="parallel.tp",
        )
    values["model.intermediate_size_per_partition"] = inter // tp_shards
    origins["model.intermediate_size_per_partition"] = str(
        Origin.derived(
            "model.intermediate_size / (parallel.tp x parallel.dp) without expert parallelism"
            if engine.vllm_layout
            else "model.intermediate_size / parallel.tp (1 under expert parallelism)"
        )
    )
    if engine.vllm_layout:
        _vllm_fp8_keys(values, origins, tp_shards)
    values["parallel.all2all_active"] = active
    origins["parallel.all2all_active"] = str(Origin.derived(why))
    # vLLM's prepare/finalize delivers the batched format under the batched all2all kernels,
    # and without all2all kernels only on XPU for a batched_triton request (elsewhere vLLM
    # builds a standard prepare/finalize, which no batched experts class can run behind).
    batched = active in BATCHED_ALL2ALL or (
        engine.vllm_layout
        and active == "none"
        and values.get("platform") == "xpu"
        and request is not None
        and request.backend == "batched_triton"
    )
    values["parallel.activation_format"] = "batched" if batched else "standard"
    origins["parallel.activation_format"] = str(
        Origin.derived(
            "parallel.all2all_active, or a batched_triton request on XPU"
            if engine.vllm_layout
            else "parallel.all2all"
        )
    )
    if values.get("lora.enabled") and values.get("lora.max_rank") is None:
        values["lora.max_rank"] = 16
        origins["lora.max_rank"] = "default"
    unknown = [k for k in values if k not in CONTEXT_KEYS]
    if unknown:
        raise AssertionError(f"context keys outside the vocabulary: {unknown}")
