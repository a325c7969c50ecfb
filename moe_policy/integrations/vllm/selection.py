"""vLLM's unquantized MoE backend selection, through the policy.

:func:`select_unquantized_moe_backend` has the signature and the return value of vLLM's
own function (``(UnquantizedMoeBackend, experts class | None)``), so the plugin can put it
in vLLM's place. Per call it builds the context from vLLM's objects, asks a selector for
the vLLM engine profile and reports the decision (events, audit line, override warning,
or the strict-mode error). Inside vLLM each candidate's experts classes also run vLLM's
own ``is_supported_config``, whose reason lands in the candidate's detail, under the
activation format vLLM's prepare/finalize will deliver; the class handed back is asked once
more for the layer being built. The policy never picks what this vLLM cannot build.

Selectors are cached per layer signature (every field of the layer's ``FusedMoEConfig``) and
environment, so 48 identical MoE layers cost one resolution and 48 cheap lookups.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import operator
import os
import sys
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from moe_policy.api import ENGINE_VARIABLE, Selector
from moe_policy.core.catalog import Catalog, load_catalog
from moe_policy.core.context import SelectionContext
from moe_policy.core.decision import Decision
from moe_policy.core.engines import EngineProfile, resolve_engine
from moe_policy.core.origin import Origin
from moe_policy.core.state import STATE
from moe_policy.errors import PolicyError
from moe_policy.integrations.vllm.facts import (
    deployment_entries,
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
from moe_policy.reporting.audit import AuditWriteError


def engine_profile() -> EngineProfile:
    """The profile of the installed vLLM (an error when none describes its version)."""
    import vllm

    return resolve_engine(f"vllm=={vllm.__version__}", vllm_origin("vllm.__version__"))


def check_engine_variable(profile: EngineProfile, environ: Mapping[str, str]) -> None:
    """``MOE_POLICY_ENGINE`` inside vLLM: the installed vLLM decides which profile applies, so
    the variable (meant for dry runs) must name that one or be unset; anything else is an
    error naming it, never silently ignored."""
    raw = environ.get(ENGINE_VARIABLE, "")
    if not raw.strip():
        return
    origin = Origin.env(ENGINE_VARIABLE)
    named = resolve_engine(raw, origin)  # an unknown engine or version names the variable
    if (named.name, named.version) != (profile.name, profile.version):
        import vllm

        raise PolicyError(
            f"{ENGINE_VARIABLE}={raw.strip()!r} names {named.label}, but this is vLLM "
            f"{vllm.__version__}, whose MoE layers the plugin decides with the {profile.label} "
            f"profile; unset it (it selects the engine of dry runs) or name this vLLM",
            origin,
            key=ENGINE_VARIABLE,
        )


def check_settings_at_load(environ: Mapping[str, str]) -> PolicyError | None:
    """The serving environment's settings (``MOE_POLICY_*``, the vLLM variables the profile
    reads, the policy files they name) checked when vLLM loads the plugin, before any model is
    downloaded: the error, reported as a ``moe_policy.settings_invalid`` event, or None.
    vLLM's plugin loader only logs what ``register`` raises, so the first MoE layer still
    stops start-up on it."""
    from moe_policy.reporting.events import get_logger
    from moe_policy.settings import resolve_settings

    try:
        profile = engine_profile()
        check_engine_variable(profile, environ)
        resolve_settings(load_catalog(profile), environ=environ, engine=profile)
    except PolicyError as exc:
        get_logger().error(
            "moe_policy.settings_invalid",
            origin=exc.origin,
            error=exc.message,
            detail="vLLM stops at its first MoE layer",
        )
        return exc
    return None


def _config_key(config: Any) -> tuple[Any, ...]:
    """Every field of a layer's ``FusedMoEConfig`` (its parallel config inside). vLLM's
    experts classes read per-layer fields no policy fact describes (hash routing, routes
    adjusted after routing, the router logits dtype, SwiGLU limits): two layers of one model
    that differ in any field must not share a decision made for the other."""
    if not dataclasses.is_dataclass(config):
        return tuple(sorted((name, repr(value)) for name, value in vars(config).items()))
    fields = _FIELDS.get(type(config))
    if fields is None:
        names = [f.name for f in dataclasses.fields(config)]
        nested = tuple(n for n in names if dataclasses.is_dataclass(getattr(config, n, None)))
        plain: Callable[[Any], Any] = operator.attrgetter(
            "__class__", *(n for n in names if n not in nested)
        )
        fields = _FIELDS[type(config)] = (plain, nested)
    getter, nested = fields
    values = tuple(getter(config))
    try:
        hash(values)
    except TypeError:  # a field holding a list or a dict: compared by its repr
        values = tuple(v if _hashable(v) else repr(v) for v in values)
    return (values, *(_config_key(getattr(config, n)) for n in nested))


#: Per dataclass: the getter of its plain fields, and the names of its dataclass fields.
_FIELDS: dict[type, tuple[Callable[[Any], Any], tuple[str, ...]]] = {}


def _hashable(value: Any) -> bool:
    try:
        hash(value)
    except TypeError:
        return False
    return True


def _signature(moe_config: Any) -> tuple[Any, ...]:
    env = tuple(
        sorted((k, v) for k, v in os.environ.items() if k.startswith(("MOE_POLICY_", "VLLM_")))
    )
    return (_config_key(moe_config), env)


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


def prepare_finalize_format(moe_config: Any, platform: str) -> tuple[str, Origin]:
    """The activation format vLLM's prepare/finalize hands this layer's experts
    (``all2all_utils.maybe_make_prepare_finalize``), and where it comes from.

    Batched only under the DeepEP low-latency and NIXL-EP all2all kernels, or on XPU for
    ``--moe-backend batched_triton`` without all2all kernels; everywhere else standard, an
    explicit ``batched_triton`` included (vLLM's oracle then picks a class its kernel cannot
    be built with).
    """
    par = moe_config.moe_parallel_config
    if par.use_passthrough_all2all:
        return "standard", vllm_origin("parallel_config.all2all_backend")
    if par.use_all2all_kernels:
        fmt = "batched" if par.use_batched_activation_format else "standard"
        return fmt, vllm_origin("parallel_config.all2all_backend")
    if platform == "xpu" and str(moe_config.moe_backend) == "batched_triton":
        return "batched", vllm_origin("--moe-backend")
    return "standard", vllm_origin("moe_parallel_config.use_all2all_kernels")


def _with_engine_format(selector: Selector, fmt: str, origin: Origin) -> Selector:
    """The selector deciding in the format vLLM's prepare/finalize delivers. The profile
    derives the same format from the layout and the request, except where the request the
    policy sees is not vLLM's ``--moe-backend`` (``MOE_POLICY_BACKEND`` on XPU, either way):
    vLLM's objects have the last word, so a request that cannot run in that format is
    warned about (or refused in strict mode), never handed to a kernel that fails to build."""
    ctx = selector.context
    if ctx.format == fmt:
        return selector
    values = {**ctx.values, "parallel.activation_format": fmt}
    origins = {**ctx.origins, "parallel.activation_format": str(origin)}
    selector.context = SelectionContext(values, origins, ctx.request, ctx.mode)
    return selector


def _without_lora(moe_config: Any) -> Any:
    config = copy.copy(moe_config)
    config.is_lora_enabled = False
    return config


def _engine_checks(moe_config: Any, catalog: Catalog) -> dict[str, Callable[..., Any]]:
    """Per backend: vLLM's own ``is_supported_config`` over its experts classes.

    LoRA is left to the policy's LoRA pass (so a request it vetoes says ``lora_unsupported``):
    the classes are asked about a copy of the layer's config with LoRA off, except the LoRA
    class itself.
    """
    from vllm.model_executor.layers.fused_moe.oracle.unquantized import UnquantizedMoeBackend

    without_lora = _without_lora(moe_config)
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
    check_engine_variable(profile, os.environ)
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
        if quantized.wna16 is not None:
            quant = wna16_facts(quantized.wna16)
        else:
            quant = quant_facts(quantized.weight_key, quantized.activation_key, quantized.fmt)
        batched = bool(moe_config.moe_parallel_config.use_batched_activation_format)
        if quantized.oracle == "fp8":
            # vLLM's DeepGEMM and AITER switches: the environment layer, as in a dry run
            request = fp8_request_entry(
                moe_config.moe_backend,
                batched=batched,
                allow_vllm_cutlass=quantized.allow_vllm_cutlass,
            )
        elif quantized.oracle == "w4a8_int8":
            request = w4a8_int8_request_entry(moe_config.moe_backend)
        elif quantized.oracle == "w4a8":
            request = w4a8_request_entry(moe_config.moe_backend)
        elif quantized.oracle == "int8":
            request = int8_request_entry(moe_config.moe_backend)
        elif quantized.oracle == "mxfp8":
            request = mxfp8_request_entry(moe_config.moe_backend)  # VLLM_USE_DEEP_GEMM: env
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
    selector = Selector(
        model_facts(moe_config, architectures[0] if architectures else None, quant),
        explicit=explicit,
        platform=platform,
        engine=profile,
        engine_origin=vllm_origin("vllm.__version__"),
        extra_checks=checks,
    )
    return _with_engine_format(selector, *prepare_finalize_format(moe_config, platform.platform))


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
    without_lora = _without_lora(moe_config)
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


def _decide(selector: Selector) -> Decision:
    """The decision for the layer being built, reported (events, audit line, warning or the
    strict-mode error) and kept in :func:`decisions`."""
    index, kind = _layer_identity()
    try:
        decision = selector.select(index, kind)
    except AuditWriteError as exc:
        raise _audit_error(selector, exc) from None
    STATE.engine_decisions.append(decision)
    return decision


def _audit_error(selector: Selector, exc: AuditWriteError) -> AuditWriteError:
    """The required audit's failure, naming where the audit file and the requirement were
    set (``env:MOE_POLICY_AUDIT_LOG``, a policy file's line)."""
    path = selector.settings.values.get("audit.path")
    required = selector.settings.values.get("audit.required")
    where = f"{path.origin}: " if path is not None else ""
    why = f" (the audit is required by {required.origin})" if required is not None else ""
    return AuditWriteError(f"{where}{exc}{why}")


def _buildable_class(
    selector: Selector,
    backend: Any,
    classes: list[Any],
    decision: Decision,
    config: Callable[[], Any],
    keys: tuple[Any, Any] = (None, None),
) -> Any:
    """The experts class handed to vLLM: the one the decision names (else the first of
    vLLM's classes for the backend), once vLLM's own ``is_supported_config`` accepts it for
    this layer (``config()``) in the format vLLM's prepare/finalize delivers. A refusal is an
    error at selection, never a kernel vLLM fails to build (or builds wrongly) later. Layers
    sharing the selector have equal configs: each answer is asked once per selector."""
    verified = _VERIFIED.setdefault(selector, {})
    key = (decision.backend, decision.experts_class, decision.activation_format)
    found = verified.get(key)
    if found is not None:
        return found
    named = [cls for cls in classes if cls.__name__ == decision.experts_class]
    layer = config()
    fmt = _activation_format(layer, decision.activation_format == "batched")
    reason = None
    for cls in named or classes:
        ok, reason = cls.is_supported_config(cls, layer, keys[0], keys[1], fmt)
        if ok:
            verified[key] = cls
            return cls
    raise PolicyError(
        f"{backend.name} for {decision.layer_label()}: vLLM's "
        f"{', '.join(c.__name__ for c in named or classes)} refuses this layer "
        f"({reason or 'no reason given'}), although the policy chose it; the vLLM profile and "
        f"this vLLM disagree, and the plugin hands vLLM no kernel it cannot build",
        vllm_origin("is_supported_config"),
    )


#: Per selector, the experts classes vLLM accepted for its layers' decisions.
_VERIFIED: weakref.WeakKeyDictionary[Selector, dict[tuple[Any, ...], Any]] = (
    weakref.WeakKeyDictionary()
)


def select_unquantized_moe_backend(moe_config: Any) -> tuple[Any, type | None]:
    """vLLM's selection function, decided by the policy (same arguments, same result)."""
    from vllm.model_executor.layers.fused_moe.oracle.unquantized import UnquantizedMoeBackend

    selector = selector_for(moe_config)
    decision = _decide(selector)
    spec = selector.catalog.spec(str(decision.backend))
    backend = UnquantizedMoeBackend[str(spec.engine_name)]
    if spec.delegated:
        return backend, None
    lora = bool(moe_config.is_lora_enabled)
    classes = _experts_classes(backend, lora, decision.experts_class)
    # asked as the checks asked: LoRA is the LoRA pass's, except for the LoRA class itself
    lora_class = (
        lora and spec.lora == "conditional" and decision.experts_class == spec.lora_experts_class
    )
    ask = (lambda: moe_config) if lora_class else functools.partial(_without_lora, moe_config)
    return backend, _buildable_class(selector, backend, classes, decision, ask)


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
    selector = selector_for(config, quantized)
    decision = _decide(selector)
    spec = selector.catalog.spec(str(decision.backend))
    backend = _backend_enum(oracle, str(spec.engine_name))
    if spec.delegated:
        return backend, None
    classes = _kernel_classes(quantized, oracle, backend)
    keys = (quantized.weight_key, quantized.activation_key)
    layer = functools.partial(_without_lora, config)
    return backend, _buildable_class(selector, backend, classes, decision, layer, keys)
