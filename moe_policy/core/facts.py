"""Assemble the SelectionContext: defaults < platform probe < model config < settings layers.

Dry runs: when the platform, capability or device name is given explicitly, the
local machine is not probed and the target is assumed to have every backend's
packages, unless ``packages`` is given too.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from moe_policy.core.catalog import Catalog
from moe_policy.core.context import SelectionContext
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
    "lora.enabled": False,
    "lora.max_rank": None,
    "lora.max_loras": None,
    "layer.kind": "moe",
    "layer.index": None,
    "batch_invariant": False,
    "rocm.aiter": False,
    "device.capability": None,
    "device.name": None,
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
) -> SelectionContext:
    """Every fact with its origin; ``settings_context`` maps key -> Resolved (env, API, CLI)."""
    values: dict[str, Any] = dict(DEFAULTS)
    origins: dict[str, str] = {key: "default" for key in DEFAULTS}

    def put(key: str, value: Any, origin: Origin | str) -> None:
        values[key] = value
        origins[key] = str(origin)

    dry_run = any(key in settings_context for key in DRY_RUN_KEYS)
    if platform is not None:
        _put_platform(put, platform)
    elif not dry_run:
        _put_platform(put, current_platform())
    else:
        put("platform", "cuda", "default")
        every = sorted({pkg for spec in catalog for pkg in spec.packages})
        put("packages", tuple(every), Origin.derived("dry run: assumes every backend's packages"))
    for key, (value, origin) in model.facts.items():
        put(key, coerce_value(key, value, origin), origin)
    for key, resolved in settings_context.items():
        put(key, resolved.value, resolved.origin)
    _derive(values, origins)
    return SelectionContext(values, origins, request, mode)


def _put_platform(put: Any, facts: PlatformFacts) -> None:
    origin = facts.origin
    put("platform", facts.platform, origin)
    put("device.capability", facts.capability, origin)
    put("device.name", facts.device_name, origin)
    if facts.packages is not None:
        put("packages", tuple(sorted(facts.packages)), origin)


def _derive(values: dict[str, Any], origins: dict[str, str]) -> None:
    for key in ("parallel.tp", "parallel.dp", "lora.max_rank", "lora.max_loras"):
        value = values.get(key)
        if value is not None and value < 1:
            raise PolicyError(f"{key} must be at least 1, got {value}", origins[key], key=key)
    tp, dp, ep = values["parallel.tp"], values["parallel.dp"], values["parallel.ep"]
    ep_size = tp * dp if ep else 1
    values["parallel.ep_size"] = ep_size
    origins["parallel.ep_size"] = str(Origin.derived("parallel.ep, parallel.tp, parallel.dp"))
    experts = values["model.num_experts"]
    values["model.local_experts"] = -(-experts // ep_size)
    origins["model.local_experts"] = str(Origin.derived("model.num_experts / parallel.ep_size"))
    inter = values["model.intermediate_size"]
    if ep:
        per_partition = inter
    else:
        if inter % tp:
            raise PolicyError(
                f"model.intermediate_size {inter} is not divisible by parallel.tp={tp}",
                origins["parallel.tp"],
                key="parallel.tp",
            )
        per_partition = inter // tp
    values["model.intermediate_size_per_partition"] = per_partition
    origins["model.intermediate_size_per_partition"] = str(
        Origin.derived("model.intermediate_size / parallel.tp (1 under expert parallelism)")
    )
    fmt = "batched" if values["parallel.all2all"] in BATCHED_ALL2ALL else "standard"
    values["parallel.activation_format"] = fmt
    origins["parallel.activation_format"] = str(Origin.derived("parallel.all2all"))
    if values.get("lora.enabled") and values.get("lora.max_rank") is None:
        values["lora.max_rank"] = 16
        origins["lora.max_rank"] = "default"
    unknown = [k for k in values if k not in CONTEXT_KEYS]
    if unknown:
        raise AssertionError(f"context keys outside the vocabulary: {unknown}")
