"""The Python API: ``Selector`` for engines, ``select_backend`` and ``explain`` for one-offs.

An engine builds one ``Selector`` per model and deployment and asks it once per MoE
layer; layers with the same signature share one resolution (the cached decision is
relabelled with the layer's index).
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from moe_policy.core import state
from moe_policy.core.catalog import Catalog, load_catalog
from moe_policy.core.context import SelectionContext
from moe_policy.core.decision import Decision
from moe_policy.core.engines import MOE_POLICY, EngineProfile, resolve_engine
from moe_policy.core.facts import build_context
from moe_policy.core.keys import coerce_value
from moe_policy.core.model import ModelFacts, load_model, model_facts_from_mapping
from moe_policy.core.origin import Origin
from moe_policy.core.passes import ExtraCheck, Pass
from moe_policy.core.pipeline import DEFAULT_PIPELINE
from moe_policy.core.platform import PlatformFacts, current_platform, probed_platform
from moe_policy.core.resolver import Resolver
from moe_policy.core.state import STATE
from moe_policy.errors import PolicyError, did_you_mean
from moe_policy.reporting.audit import audit_sink
from moe_policy.reporting.events import REPORTER, Reporter
from moe_policy.settings import Entry, Settings, resolve_settings

ModelLike = str | os.PathLike[str] | Mapping[str, Any] | ModelFacts

#: API keyword -> settings or context key.
API_KEYS = {
    "backend": "backend",
    "mode": "mode",
    "audit_log": "audit.path",
    "lora": "lora.enabled",
    "max_lora_rank": "lora.max_rank",
    "max_loras": "lora.max_loras",
    "platform": "platform",
    "capability": "device.capability",
    "device_name": "device.name",
    "packages": "packages",
    "dtype": "model.dtype",
    "tp": "parallel.tp",
    "dp": "parallel.dp",
    "ep": "parallel.ep",
    "all2all": "parallel.all2all",
    "eplb": "parallel.eplb",
    "batch_invariant": "batch_invariant",
}


def _load_model_like(model: ModelLike) -> ModelFacts:
    if isinstance(model, ModelFacts):
        return model
    if isinstance(model, Mapping):
        return model_facts_from_mapping(model)
    if isinstance(model, (str, os.PathLike)):
        # As written: ``./NAME`` is a path, never the bundled NAME; so is any PathLike.
        spec = model if isinstance(model, str) else os.path.join(".", os.fspath(model))
        if not isinstance(spec, str) or not spec.strip():
            raise PolicyError(
                f"model must name a config.json, a model directory or a bundled model, "
                f"got {spec!r}",
                "api:model",
            )
        return load_model(spec)
    raise PolicyError(
        f"model must be a path, a config mapping or ModelFacts, got {type(model).__name__}",
        "api:model",
    )


def explicit_entries(
    arguments: Mapping[str, Any], overrides: Mapping[str, Any] | None, origin: Origin
) -> list[Entry]:
    """API keywords (None = not given) and free-form overrides as explicit entries."""
    unknown = [name for name in arguments if name not in API_KEYS]
    if unknown:
        raise PolicyError(
            f"unknown argument {unknown[0]!r}{did_you_mean(unknown[0], API_KEYS)}", "api"
        )
    entries = [
        Entry(API_KEYS[name], value, origin)
        for name, value in arguments.items()
        if value is not None
    ]
    entries.extend(Entry(key, value, origin) for key, value in (overrides or {}).items())
    return entries


@dataclass(frozen=True)
class Explanation:
    """Everything ``explain`` shows: the settings ladder, the context, the decision."""

    settings: Settings
    context: SelectionContext
    decision: Decision

    @property
    def strict_outcome(self) -> str:
        """What strict mode would do with this decision."""
        d = self.decision
        if d.backend is None:
            return "error: no feasible backend (in any mode)"
        if d.override is not None:
            o = d.override
            return f"refuse: {o.requested} from {o.origin} is infeasible ({o.reason_code.value}); nothing starts"
        return f"run {d.backend} (same as warn mode)"


ENGINE_VARIABLE = "MOE_POLICY_ENGINE"


def _engine_profile(
    engine: str | EngineProfile | None,
    origin: Origin | None,
    environ: Mapping[str, str] | None,
) -> tuple[EngineProfile, Origin | str]:
    """The engine asked for: explicitly, else by ``MOE_POLICY_ENGINE``, else this package.

    A ``MOE_POLICY_ENGINE`` that an explicit engine beats is still checked: a misspelt one
    is an error, not silently passed over."""
    env = os.environ if environ is None else environ
    from_env = None
    if env.get(ENGINE_VARIABLE, "").strip():
        from_env = resolve_engine(env[ENGINE_VARIABLE], Origin.env(ENGINE_VARIABLE))
    if isinstance(engine, EngineProfile):
        return engine, origin or Origin.api("engine")
    if engine is not None:
        where = origin or Origin.api("engine")
        return resolve_engine(engine, where), where
    if from_env is not None:
        return from_env, Origin.env(ENGINE_VARIABLE)
    return MOE_POLICY, "default"


class Selector:
    """Decides backends for the MoE layers of one model in one deployment.

    ``arguments`` are the deployment keywords of :func:`select_backend` (backend, mode,
    lora, tp, dp, ep, all2all, platform, capability, ...), recorded with origin ``api``;
    ``overrides`` sets any context or settings key by name; ``explicit`` takes entries
    with origins of their own (the CLI's flags). ``environ`` replaces ``os.environ``;
    ``platform`` is a platform name like the other keywords (a dry run for that target),
    or ``PlatformFacts`` that pin the target instead of probing this machine.
    """

    def __init__(
        self,
        model: ModelLike,
        *,
        policy_files: Sequence[str] | None = None,
        environ: Mapping[str, str] | None = None,
        explicit: Sequence[Entry] = (),
        platform: PlatformFacts | str | None = None,
        extra_checks: Mapping[str, ExtraCheck] | None = None,
        catalog: Catalog | None = None,
        reporter: Reporter | None = None,
        files_origin: Origin | None = None,
        pipeline: Sequence[Pass] = DEFAULT_PIPELINE,
        overrides: Mapping[str, Any] | None = None,
        engine: str | EngineProfile | None = None,
        engine_origin: Origin | None = None,
        _current_platform: Callable[[], PlatformFacts] = current_platform,
        **arguments: Any,
    ) -> None:
        if isinstance(platform, str):  # the platform name keyword (a dry run), not pinned facts
            arguments["platform"], platform = platform, None
        if arguments or overrides:
            explicit = (*explicit, *explicit_entries(arguments, overrides, Origin.api()))
        self.engine, chosen_by = _engine_profile(engine, engine_origin, environ)
        self.model = _load_model_like(model)
        # An engine with one oracle per quantization scheme decides with that oracle's profile.
        scheme, scheme_origin = self.model.facts.get("model.quantization", ("none", "default"))
        activation = self.model.facts.get("model.quant.activation", ("none", "default"))[0]
        self.engine = self.engine.for_quantization(str(scheme), scheme_origin, str(activation))
        self.catalog = catalog or load_catalog(self.engine)
        self.settings = resolve_settings(
            self.catalog,
            policy_files=policy_files,
            environ=environ,
            explicit=explicit,
            files_origin=files_origin,
            engine=self.engine,
        )
        self.context = build_context(
            self.catalog,
            self.model,
            self.settings.context,
            mode=self.settings.mode,
            request=self.settings.request,
            platform=platform,
            engine=self.engine,
            engine_origin=chosen_by,
            switched_off=self.settings.switched_off,
            # selector_for's snapshot: the platform its cache key names, never one that
            # override_platform pinned (or unpinned) in another thread meanwhile
            current=_current_platform,
        )
        self.resolver = Resolver(self.catalog, self.settings.policy(), extra_checks, pipeline)
        self.reporter = reporter or REPORTER
        audit_path = self.settings.value("audit.path")
        self.audit = (
            audit_sink(str(audit_path), bool(self.settings.value("audit.required", False)))
            if audit_path
            else None
        )
        self._layers: dict[tuple[int | None, str | None], Decision] = {}
        self._lock = threading.RLock()
        _SELECTORS.add(self)

    def _context_for(self, layer_index: int | None, layer_kind: str | None) -> SelectionContext:
        if layer_index is None and layer_kind is None:
            return self.context
        values = dict(self.context.values)
        origins = dict(self.context.origins)
        if layer_index is not None:
            values["layer.index"] = coerce_value("layer.index", layer_index, "api:layer_index")
            origins["layer.index"] = "api"
        if layer_kind is not None:
            values["layer.kind"] = coerce_value("layer.kind", layer_kind, "api:layer_kind")
            origins["layer.kind"] = "api"
        return SelectionContext(values, origins, self.context.request, self.context.mode)

    def decide(self, layer_index: int | None = None, layer_kind: str | None = None) -> Decision:
        """The decision for a layer, without logging, warning or raising."""
        key = (layer_index, layer_kind)
        decision = self._layers.get(key)
        if decision is None:
            if layer_index is not None:
                coerce_value("layer.index", layer_index, "api:layer_index")
            with self._lock:
                decision = self._layers.get(key)  # another thread may have decided it meanwhile
                if decision is not None:
                    return decision
                if layer_index is not None and "layer.index" in self.resolver.excluded_keys:
                    # The index does not decide: reuse the kind's decision, relabelled.
                    decision = self.decide(None, layer_kind).for_layer(layer_index)
                else:
                    decision = self.resolver.resolve(self._context_for(layer_index, layer_kind))
                self._layers[key] = decision
        return decision

    def select(self, layer_index: int | None = None, layer_kind: str | None = None) -> Decision:
        """Decide, log once per signature, audit every call, warn or raise on overrides."""
        decision = self.decide(layer_index, layer_kind)
        self.reporter.report(decision, self.audit)
        return decision

    def explain(self, layer_index: int | None = None, layer_kind: str | None = None) -> Explanation:
        decision = self.decide(layer_index, layer_kind)
        return Explanation(self.settings, self._context_for(layer_index, layer_kind), decision)


#: Every live selector, so a forked child can give each a new lock (see _after_fork_in_child).
_SELECTORS: weakref.WeakSet[Selector] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    """A selector's lock held by another thread at the fork would never be released in the
    child (cached selectors outlive the fork): each gets a new one."""
    for selector in list(_SELECTORS):
        selector._lock = threading.RLock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _env_key() -> tuple[tuple[str, str], ...]:
    return tuple(
        sorted((k, v) for k, v in os.environ.items() if k.startswith(("MOE_POLICY_", "VLLM_")))
    )


def _freeze(value: Any) -> Any:
    if isinstance(value, Mapping):  # keys of any type: ordered by type name, then text
        return tuple(
            sorted(
                ((k, _freeze(v)) for k, v in value.items()),
                key=lambda item: (type(item[0]).__name__, str(item[0])),
            )
        )
    if isinstance(value, (list, tuple, set, frozenset)):
        return tuple(_freeze(v) for v in value)
    if isinstance(value, ModelFacts):
        return id(value)
    return value


def selector_for(
    model: ModelLike,
    *,
    policy_files: Sequence[str] | None = None,
    overrides: Mapping[str, Any] | None = None,
    **arguments: Any,
) -> Selector:
    """A cached Selector for these arguments and the current relevant environment."""
    model_key = (
        (type(model).__name__, os.fspath(model))
        if isinstance(model, (str, os.PathLike))
        else _freeze(model)
    )
    pinned = STATE.pinned_platform  # read once: the key and the build agree on it
    key = (
        model_key,
        _freeze(policy_files),
        _freeze(overrides),
        _freeze(arguments),
        _env_key(),
        pinned,  # a selector built under override_platform stays in its block
    )
    selector: Selector | None = STATE.selectors.get(key)
    if selector is None:
        with STATE.selectors_lock:
            selector = STATE.selectors.get(key)
            if selector is None:
                engine = arguments.pop("engine", None)
                selector = Selector(
                    model,
                    policy_files=policy_files,
                    explicit=explicit_entries(arguments, overrides, Origin.api()),
                    engine=engine,
                    _current_platform=(lambda: pinned) if pinned else probed_platform,
                )
                STATE.selectors[key] = selector
    return selector


def select_backend(
    model: ModelLike,
    *,
    policy_files: Sequence[str] | None = None,
    layer_index: int | None = None,
    layer_kind: str | None = None,
    overrides: Mapping[str, Any] | None = None,
    **arguments: Any,
) -> Decision:
    """Decide the backend of one MoE layer; warns (or raises in strict mode) on overrides.

    Keywords: backend, mode, audit_log, lora, max_lora_rank, max_loras, platform,
    capability, device_name, packages, dtype, tp, dp, ep, all2all, eplb,
    batch_invariant; ``overrides`` sets any context or settings key by name.
    """
    selector = selector_for(model, policy_files=policy_files, overrides=overrides, **arguments)
    return selector.select(layer_index, layer_kind)


def explain(
    model: ModelLike,
    *,
    policy_files: Sequence[str] | None = None,
    layer_index: int | None = None,
    layer_kind: str | None = None,
    overrides: Mapping[str, Any] | None = None,
    **arguments: Any,
) -> Explanation:
    """The decision with its settings ladder and context; never warns or raises on overrides."""
    selector = selector_for(model, policy_files=policy_files, overrides=overrides, **arguments)
    return selector.explain(layer_index, layer_kind)


def reset() -> None:
    """Forget cached selectors, probe results, the catalog and reporting state (tests, env
    changes)."""
    state.reset()
