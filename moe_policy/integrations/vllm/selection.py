"""vLLM's unquantized MoE backend selection, through the policy.

:func:`select_unquantized_moe_backend` has the signature and the return value of vLLM's
own function (``(UnquantizedMoeBackend, experts class | None)``), so the plugin can put it
in vLLM's place. Per call it builds the context from vLLM's objects, asks a selector for
the vLLM engine profile and reports the decision (events, audit line, override warning,
or the strict-mode error). Inside vLLM each candidate's experts classes also run vLLM's
own ``is_supported_config``, whose reason lands in the candidate's detail: the policy
never picks what this vLLM cannot build.

Selectors are cached per layer signature and environment, so 48 identical MoE layers cost
one resolution and 48 cheap lookups.
"""

from __future__ import annotations

import copy
import dataclasses
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from moe_policy.api import Selector
from moe_policy.core.catalog import Catalog, load_catalog
from moe_policy.core.decision import Decision
from moe_policy.core.engines import EngineProfile, resolve_engine
from moe_policy.core.state import STATE
from moe_policy.errors import PolicyError
from moe_policy.integrations.vllm.facts import (
    deployment_entries,
    fp8_packages,
    fp8_request_entry,
    int8_request_entry,
    model_facts,
    mxfp4_request_entry,
    mxfp8_request_entry,
    nvfp4_request_entry,
    platform_entries,
    quant_facts,
    request_entry,
    vllm_origin,
    w4a8_int8_request_entry,
    w4a8_request_entry,
)
from moe_policy.integrations.vllm.wna16 import Wna16Call, wna16_facts, wna16_request_entry


def engine_profile() -> EngineProfile:
    """The profile of the installed vLLM (an error when none describes its version)."""
    import vllm

    return resolve_engine(f"vllm=={vllm.__version__}", vllm_origin("vllm.__version__"))


def _signature(moe_config: Any) -> tuple[Any, ...]:
    par = moe_config.moe_parallel_config
    env = tuple(
        sorted((k, v) for k, v in os.environ.items() if k.startswith(("MOE_POLICY_", "VLLM_")))
    )
    return (
        moe_config.num_experts,
        moe_config.experts_per_token,
        moe_config.hidden_dim,
        moe_config.intermediate_size,
        str(moe_config.activation),
        str(moe_config.routing_method),
        str(moe_config.in_dtype),
        moe_config.has_bias,
        moe_config.is_lora_enabled,
        str(moe_config.moe_backend),
        par.tp_size,
        par.dp_size,
        par.pcp_size,
        par.ep_size,
        par.sp_size,
        par.use_ep,
        par.all2all_backend,
        par.enable_eplb,
        env,
    )


def _experts_classes(backend: Any, lora: bool, engine_class: str | None) -> list[Any]:
    """The classes vLLM would try for ``backend`` (its LoRA class when LoRA picks it)."""
    from vllm.model_executor.layers.fused_moe.oracle import unquantized

    if lora and engine_class == "TrtLlmBf16LoRAExperts":
        from vllm.model_executor.layers.fused_moe.experts.trtllm_lora_moe import (
            TrtLlmBf16LoRAExperts,
        )

        return [TrtLlmBf16LoRAExperts]
    return list(unquantized.backend_to_kernel_cls(backend))


def _activation_format(moe_config: Any, batched: bool) -> Any:
    import vllm.model_executor.layers.fused_moe.modular_kernel as mk

    if batched:
        return mk.FusedMoEActivationFormat.BatchedExperts
    return mk.FusedMoEActivationFormat.Standard


def _engine_checks(moe_config: Any, catalog: Catalog) -> dict[str, Callable[..., Any]]:
    """Per backend: vLLM's own ``is_supported_config`` over its experts classes.

    LoRA is left to the policy's LoRA pass (so a request it vetoes says ``lora_unsupported``):
    the classes are asked about a copy of the layer's config with LoRA off, except the LoRA
    class itself.
    """
    from vllm.model_executor.layers.fused_moe.oracle.unquantized import UnquantizedMoeBackend

    without_lora = copy.copy(moe_config)
    without_lora.is_lora_enabled = False
    checks: dict[str, Callable[..., Any]] = {}
    for spec in catalog:
        if spec.engine_name is None or spec.delegated:
            continue
        backend = UnquantizedMoeBackend[spec.engine_name]

        def check(values: Mapping[str, object], backend: Any = backend, spec: Any = spec) -> Any:
            lora = bool(values.get("lora.enabled"))
            lora_class = spec.lora_experts_class if lora and spec.lora == "conditional" else None
            fmt = _activation_format(
                moe_config, values.get("parallel.activation_format") == "batched"
            )
            reason = None
            config = moe_config if lora_class else without_lora
            for cls in _experts_classes(backend, lora, lora_class):
                ok, reason = cls.is_supported_config(cls, config, None, None, fmt)
                if ok:
                    return True, None
            return False, f"vLLM: {reason}" if reason else "vLLM: not supported here"

        checks[spec.name] = check
    return checks


def _layer_identity() -> tuple[int | None, str | None]:
    """The index of the layer being built, and ``draft`` inside a speculative model."""
    index = None
    frame = sys._getframe(2)
    while frame is not None:
        owner = frame.f_locals.get("self")
        name = getattr(owner, "layer_name", None)
        if type(owner).__name__ == "RoutedExperts" and isinstance(name, str):
            numbers = [int(part) for part in name.split(".") if part.isdigit()]
            index = numbers[0] if len(numbers) == 1 else None
            break
        frame = frame.f_back  # type: ignore[assignment]
    # vLLM builds draft models under set_model_tag("eagle_head" / "draft_model" ...); the
    # module is read only if vLLM loaded it (importing it would load the compiler stack).
    backends = sys.modules.get("vllm.compilation.backends")
    tag = getattr(backends, "model_tag", "backbone")
    kind = None if tag in (None, "backbone") else "draft"
    return index, kind


@dataclass(frozen=True)
class Quantized:
    """What a quantized oracle is asked besides the layer's config: vLLM's (weight,
    activation) keys, the checkpoint format of the calling method, the oracle's switches."""

    oracle: str
    weight_key: Any
    activation_key: Any
    fmt: str
    allow_vllm_cutlass: bool = False
    #: The int_wna16 oracle's further arguments (quantization config, zero points, bias).
    wna16: Wna16Call | None = None

    @property
    def key(self) -> tuple[Any, ...]:
        return (self.oracle, str(self.weight_key), str(self.activation_key), self.fmt,
                self.allow_vllm_cutlass, self.wna16.key if self.wna16 else None)  # fmt: skip


def selector_for(moe_config: Any, quantized: Quantized | None = None) -> Selector:
    """The cached selector of this layer signature and environment (process state, so
    ``moe_policy.reset()`` forgets it)."""
    key = ("vllm", _signature(moe_config), quantized.key if quantized else None)
    selector: Selector | None = STATE.selectors.get(key)
    if selector is not None:
        return selector
    with STATE.selectors_lock:
        selector = STATE.selectors.get(key)
        if selector is None:
            selector = _build(moe_config, quantized)
            STATE.selectors[key] = selector
    return selector


def decisions() -> list[Decision]:
    """Every decision made for vLLM in this process, in order."""
    return list(STATE.engine_decisions)


def _build(moe_config: Any, quantized: Quantized | None = None) -> Selector:
    from vllm.config.vllm import get_current_vllm_config_or_none
    from vllm.platforms import current_platform

    vllm_config = get_current_vllm_config_or_none()
    model_config = getattr(vllm_config, "model_config", None)
    architectures = getattr(model_config, "architectures", None) or []
    platform, platform_facts = platform_entries(current_platform)
    explicit = [
        *deployment_entries(moe_config, getattr(vllm_config, "lora_config", None)),
        *platform_facts,
    ]
    profile = engine_profile()
    quant = None
    if quantized is None:
        request = request_entry(
            moe_config.moe_backend,
            platform=platform.platform,
            lora=bool(moe_config.is_lora_enabled),
            moonep=bool(moe_config.moe_parallel_config.use_moonep_kernels),
        )
        checks = _engine_checks(moe_config, load_catalog(profile))
    else:
        from vllm._aiter_ops import rocm_aiter_ops

        if quantized.wna16 is not None:
            quant = wna16_facts(quantized.wna16)
        else:
            quant = quant_facts(quantized.weight_key, quantized.activation_key, quantized.fmt)
        batched = bool(moe_config.moe_parallel_config.use_batched_activation_format)
        if quantized.oracle == "fp8":
            request = fp8_request_entry(
                moe_config.moe_backend,
                batched=batched,
                allow_vllm_cutlass=quantized.allow_vllm_cutlass,
                environ=os.environ,
                rdna_aiter=bool(rocm_aiter_ops.is_rdna_aiter_enabled()),
            )
            packages = fp8_packages(os.environ, tuple(platform.packages or ()))
            platform = dataclasses.replace(platform, packages=packages)
        elif quantized.oracle == "w4a8_int8":
            request = w4a8_int8_request_entry(moe_config.moe_backend)
        elif quantized.oracle == "w4a8":
            request = w4a8_request_entry(moe_config.moe_backend)
        elif quantized.oracle == "int8":
            request = int8_request_entry(moe_config.moe_backend)
        elif quantized.oracle == "mxfp8":
            request = mxfp8_request_entry(moe_config.moe_backend)
            packages = fp8_packages(os.environ, tuple(platform.packages or ()))
            platform = dataclasses.replace(platform, packages=packages)
        elif quantized.oracle == "int_wna16":
            request = wna16_request_entry(moe_config.moe_backend)
        elif quantized.oracle == "mxfp4":
            request = mxfp4_request_entry(moe_config.moe_backend, batched=batched)
        else:
            request = nvfp4_request_entry(moe_config.moe_backend, batched=batched)
        oracle = profile.for_quantization(
            str(quant["model.quantization"][0]), activation=str(quant["model.quant.activation"][0])
        )
        checks = _quantized_checks(moe_config, load_catalog(oracle), quantized)
    if request is not None:
        explicit.append(request)
    return Selector(
        model_facts(moe_config, architectures[0] if architectures else None, quant),
        explicit=explicit,
        platform=platform,
        engine=profile,
        engine_origin=vllm_origin("vllm.__version__"),
        extra_checks=checks,
    )


def _oracle_module(name: str) -> Any:
    import importlib

    return importlib.import_module(f"vllm.model_executor.layers.fused_moe.oracle.{name}")


def _backend_enum(oracle: Any, name: str) -> Any:
    enums = ("Fp8MoeBackend", "Mxfp4MoeBackend", "NvFp4MoeBackend", "WNA16MoEBackend",
             "Int8MoeBackend", "W4A8MoeBackend", "W4A8Int8MoeBackend")  # fmt: skip
    enum = next(getattr(oracle, e) for e in enums if hasattr(oracle, e))
    return enum[name]


def _kernel_classes(quantized: Quantized, oracle: Any, backend: Any) -> list[Any]:
    """The experts classes vLLM's oracle tries for ``backend``, in its order (the mxfp8
    oracle resolves DeepGEMM, AITER, Triton and emulation to its own classes)."""
    if quantized.oracle == "mxfp8":
        return list(oracle._mxfp8_backend_to_kernel_cls(backend))
    return list(oracle.backend_to_kernel_cls(backend))


def _quantized_checks(
    moe_config: Any, catalog: Catalog, quantized: Quantized
) -> dict[str, Callable[..., Any]]:
    """Per backend: vLLM's ``is_supported_config`` over the quantized oracle's classes for
    it, asked with the layer's (weight, activation) keys; LoRA is left to the LoRA pass. For
    the int_wna16 oracle, its checkpoint checks (``_backend_incompatibility_reason``: zero
    points, bias, layouts, Marlin's shapes) come first, as vLLM asks them."""
    oracle = _oracle_module(quantized.oracle)
    without_lora = copy.copy(moe_config)
    without_lora.is_lora_enabled = False
    checks: dict[str, Callable[..., Any]] = {}
    for spec in catalog:
        if spec.engine_name is None or spec.delegated:
            continue
        backend = _backend_enum(oracle, spec.engine_name)

        def check(values: Mapping[str, object], backend: Any = backend) -> Any:
            fmt = _activation_format(
                moe_config, values.get("parallel.activation_format") == "batched"
            )
            reason = _wna16_incompatibility(oracle, backend, moe_config, quantized.wna16)
            if reason is not None:
                return False, f"vLLM: {reason}"
            for cls in _kernel_classes(quantized, oracle, backend):
                ok, reason = cls.is_supported_config(
                    cls, without_lora, quantized.weight_key, quantized.activation_key, fmt
                )
                if ok:
                    return True, None
            return False, f"vLLM: {reason}" if reason else "vLLM: not supported here"

        checks[spec.name] = check
    return checks


def _wna16_incompatibility(
    oracle: Any, backend: Any, moe_config: Any, call: Wna16Call | None
) -> str | None:
    if call is None:
        return None
    reason: str | None = oracle._backend_incompatibility_reason(
        backend, moe_config, call.quant_config, call.may_have_zp, call.may_have_bias,
        call.allow_tile_padding,
    )  # fmt: skip
    return reason


def select_unquantized_moe_backend(moe_config: Any) -> tuple[Any, type | None]:
    """vLLM's selection function, decided by the policy (same arguments, same result)."""
    from vllm.model_executor.layers.fused_moe.oracle.unquantized import UnquantizedMoeBackend

    selector = selector_for(moe_config)
    index, kind = _layer_identity()
    decision = selector.select(index, kind)
    STATE.engine_decisions.append(decision)
    spec = selector.catalog.spec(str(decision.backend))
    backend = UnquantizedMoeBackend[str(spec.engine_name)]
    if spec.delegated:
        return backend, None
    lora = bool(moe_config.is_lora_enabled)
    classes = _experts_classes(backend, lora, decision.experts_class)
    fmt = _activation_format(moe_config, decision.activation_format == "batched")
    for cls in classes:
        if cls.__name__ == decision.experts_class:
            return backend, cls
    for cls in classes:  # the engine's order has the last word on which class it builds
        if cls.is_supported_config(cls, moe_config, None, None, fmt)[0]:
            return backend, cls
    raise PolicyError(
        f"{backend.name}: none of vLLM's experts classes "
        f"({', '.join(c.__name__ for c in classes)}) accepts this layer, although the policy "
        f"chose it; the vLLM profile and this vLLM disagree",
        vllm_origin("is_supported_config"),
    )


#: The quantization method classes that ask the fp8 oracle, by checkpoint format.
_FP8_CALLERS = {"ModelOptFp8MoEMethod": "modelopt", "Fp8MoEMethod": "fp8",
                "ModelOptNvFp4FusedMoE": "modelopt",
                "CompressedTensorsW8A8Int8MoEMethod": "compressed-tensors",
                "CompressedTensorsW4A8Fp8MoEMethod": "compressed-tensors"}  # fmt: skip


def _caller_format(allow_vllm_cutlass: bool) -> str:
    """The checkpoint format of the method asking (compressed-tensors allows CUTLASS)."""
    if allow_vllm_cutlass:
        return "compressed-tensors"
    frame = sys._getframe(2)
    while frame is not None:
        owner = type(frame.f_locals.get("self")).__name__
        if owner in _FP8_CALLERS:
            return _FP8_CALLERS[owner]
        frame = frame.f_back  # type: ignore[assignment]
    return "fp8"


def select_fp8_moe_backend(
    config: Any,
    weight_key: Any,
    activation_key: Any,
    allow_vllm_cutlass: bool = False,
) -> tuple[Any, type | None]:
    """vLLM's fp8 selection function, decided by the policy (same arguments, same result)."""
    quantized = Quantized(
        "fp8", weight_key, activation_key, _caller_format(allow_vllm_cutlass), allow_vllm_cutlass
    )
    return _select_quantized(config, quantized)


def select_mxfp4_moe_backend(config: Any, activation_key: Any = None) -> tuple[Any, type | None]:
    """vLLM's mxfp4 selection function, decided by the policy (same arguments, same result).

    The profile describes mxfp4 weights with unquantized activations (gpt-oss); a layer whose
    checkpoint or ``quantization_config.moe.activation`` quantizes the activations is an error
    naming the key, rather than a decision by rules that were not written for it.
    """
    from vllm.model_executor.layers.fused_moe.oracle import mxfp4
    from vllm.model_executor.layers.quantization.utils.quant_utils import kMxfp4Static

    activation = mxfp4._resolve_activation_key(activation_key)
    if activation is not None:
        raise PolicyError(
            f"mxfp4 MoE with {activation} activations: the vLLM profile describes only mxfp4 "
            "weights with unquantized activations",
            vllm_origin("activation_key"),
        )
    return _select_quantized(config, Quantized("mxfp4", kMxfp4Static, None, "mxfp4"))


def select_nvfp4_moe_backend(
    config: Any, weight_key: Any, activation_key: Any
) -> tuple[Any, type | None]:
    """vLLM's nvfp4 selection function, decided by the policy (same arguments, same result)."""
    return _select_quantized(
        config, Quantized("nvfp4", weight_key, activation_key, _caller_format(False))
    )


def select_int8_moe_backend(
    config: Any, weight_key: Any = None, activation_key: Any = None
) -> tuple[Any, type | None]:
    """vLLM's int8 (w8a8) selection function, decided by the policy (same arguments, same
    result; vLLM's defaults are per-channel weights with per-token activations)."""
    from vllm.model_executor.layers.quantization.utils import quant_utils as q

    weight = q.kInt8StaticChannelSym if weight_key is None else weight_key
    activation = q.kInt8DynamicTokenSym if activation_key is None else activation_key
    return _select_quantized(config, Quantized("int8", weight, activation, _caller_format(False)))


def select_w4a8_moe_backend(
    config: Any, weight_key: Any = None, activation_key: Any = None
) -> tuple[Any, type | None]:
    """vLLM's W4A8 (int4 weights, fp8 activations) selection function, decided by the policy
    (same arguments, same result)."""
    from vllm.model_executor.layers.quantization.utils import quant_utils as q

    weight = q.kInt4Static if weight_key is None else weight_key
    activation = q.kFp8DynamicTokenSym if activation_key is None else activation_key
    return _select_quantized(config, Quantized("w4a8", weight, activation, _caller_format(False)))


def select_w4a8_int8_moe_backend(
    config: Any, weight_key: Any, activation_key: Any
) -> tuple[Any, type | None]:
    """vLLM's W4A8 int8 (int4 weights, int8 activations) selection function, decided by the
    policy (same arguments, same result)."""
    quantized = Quantized("w4a8_int8", weight_key, activation_key, _caller_format(False))
    return _select_quantized(config, quantized)


def select_mxfp8_moe_backend(config: Any) -> tuple[Any, type | None]:
    """vLLM's mxfp8 selection function, decided by the policy (same arguments, same result):
    mxfp8 weights with dynamic mxfp8 activations, the one pair vLLM's oracle asks about."""
    from vllm.model_executor.layers.quantization.utils.quant_utils import (
        kMxfp8Dynamic,
        kMxfp8Static,
    )

    return _select_quantized(
        config, Quantized("mxfp8", kMxfp8Static, kMxfp8Dynamic, _caller_format(False))
    )


def select_wna16_moe_backend(
    config: Any,
    weight_key: Any,
    quant_config: Any,
    may_have_zp: bool,
    may_have_bias: bool,
    allow_tile_padding: bool = False,
) -> tuple[Any, type | None]:
    """vLLM's weight-only integer (GPTQ/AWQ int4 and int8) selection function, decided by the
    policy (same arguments, same result)."""
    call = Wna16Call(quant_config, bool(may_have_zp), bool(may_have_bias), bool(allow_tile_padding))
    return _select_quantized(config, Quantized("int_wna16", weight_key, None, call.fmt, wna16=call))


def _select_quantized(config: Any, quantized: Quantized) -> tuple[Any, type | None]:
    oracle = _oracle_module(quantized.oracle)
    weight_key, activation_key = quantized.weight_key, quantized.activation_key
    selector = selector_for(config, quantized)
    index, kind = _layer_identity()
    decision = selector.select(index, kind)
    STATE.engine_decisions.append(decision)
    spec = selector.catalog.spec(str(decision.backend))
    backend = _backend_enum(oracle, str(spec.engine_name))
    if spec.delegated:
        return backend, None
    classes = _kernel_classes(quantized, oracle, backend)
    fmt = _activation_format(config, decision.activation_format == "batched")
    for cls in classes:
        if cls.__name__ == decision.experts_class:
            return backend, cls
    for cls in classes:
        if cls.is_supported_config(cls, config, weight_key, activation_key, fmt)[0]:
            return backend, cls
    raise PolicyError(
        f"{backend.name}: none of vLLM's {quantized.oracle} experts classes "
        f"({', '.join(c.__name__ for c in classes)}) accepts this layer, although the policy "
        f"chose it; the vLLM profile and this vLLM disagree",
        vllm_origin("is_supported_config"),
    )
