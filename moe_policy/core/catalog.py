"""The backend capability catalog (``configs/backends.yaml``) and the experts registry.

The catalog states what each backend can run; feasibility is checked against it.
Implementations are named by the catalog's ``implementation`` field
(``module:Class``). A backend with no implementation in this process can still be
decided, for an engine that has it.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from moe_policy.core.canonical import sha256_hex
from moe_policy.core.decision import ReasonCode
from moe_policy.core.engines import MOE_POLICY, EngineProfile
from moe_policy.core.keys import ACTIVATIONS, ALL2ALL_KINDS, DTYPES, PLATFORMS, QUANTIZATIONS
from moe_policy.core.problems import ProblemSink
from moe_policy.core.rules import Condition, parse_conditions
from moe_policy.core.state import STATE
from moe_policy.core.values import parse_bool
from moe_policy.core.yamlio import LoadedYaml, load_yaml_file
from moe_policy.errors import PolicyError, did_you_mean

LORA_SUPPORT = ("true", "false", "conditional", "delegated")
BACKEND_KEYS = (
    "description",
    "experts_class",
    "implementation",
    "platforms",
    "capability",
    "dtypes",
    "quantization",
    "activations",
    "activation_format",
    "parallel",
    "lora",
    "batch_invariant",
    "max_experts",
    "intermediate_multiple",
    "hidden_multiple",
    "bias",
    "packages",
    "delegated",
    "requires",
    "classes",
    "engine_name",
)
REQUIREMENT_KEYS = ("if", "need", "reason_code", "detail")
CLASS_KEYS = ("name", "requires")


@dataclass(frozen=True)
class Requirement:
    """A fact a backend (or one of its experts classes) needs: where ``when`` holds (always,
    when empty), every ``need`` condition must hold, else it is eliminated with ``reason``."""

    when: tuple[Condition, ...]
    need: tuple[Condition, ...]
    reason: ReasonCode
    detail: str

    def failure(self, values: Mapping[str, Any]) -> str | None:
        """The detail when this requirement fails for ``values``, else None."""
        if not all(c.test(values.get(c.key)) for c in self.when):
            return None
        failing = [c for c in self.need if not c.test(values.get(c.key))]
        if not failing:
            return None
        shown = "; ".join(
            f"{c.key} {c.op} {_shown(c.operand)} (is {values.get(c.key)})" for c in failing
        )
        return f"{self.detail}: {shown}"


def _shown(operand: Any) -> Any:
    return list(operand) if isinstance(operand, tuple) else operand


@dataclass(frozen=True)
class ExpertsClassSpec:
    """One experts class of a backend; an engine tries its classes in order."""

    name: str
    requires: tuple[Requirement, ...] = ()


@dataclass(frozen=True)
class BackendSpec:
    """Static capabilities of one backend."""

    name: str
    description: str
    experts_class: str | None
    implementation: str | None
    platforms: tuple[str, ...]
    capability_min: str | None
    capability_max: str | None
    capability_any_of: tuple[str, ...]
    dtypes: tuple[str, ...]
    quantization: tuple[str, ...]
    gated_activations: tuple[str, ...]
    non_gated_activations: tuple[str, ...]
    activation_format: str
    all2all_exclude: tuple[str, ...]
    eplb: bool
    lora: str
    lora_conditions: tuple[Condition, ...]
    lora_experts_class: str | None
    batch_invariant: bool
    max_experts: int | None
    intermediate_multiple: int | None
    hidden_multiple: int | None
    bias: bool
    lora_rank_multiple: int | None
    packages: tuple[str, ...]
    delegated: bool
    origin: str
    requires: tuple[Requirement, ...] = ()
    #: Experts classes tried in order (the first whose requirements hold is built).
    classes: tuple[ExpertsClassSpec, ...] = ()
    #: The engine's own name for the backend (e.g. vLLM's ``UnquantizedMoeBackend`` member).
    engine_name: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": self.description,
            "experts_class": self.experts_class,
            "implementation": self.implementation,
            "platforms": list(self.platforms),
            "capability": {
                "min": self.capability_min,
                "max": self.capability_max,
                "any_of": list(self.capability_any_of),
            },
            "dtypes": list(self.dtypes),
            "quantization": list(self.quantization),
            "activations": {
                "gated": list(self.gated_activations),
                "non_gated": list(self.non_gated_activations),
            },
            "activation_format": self.activation_format,
            "parallel": {"all2all_exclude": list(self.all2all_exclude), "eplb": self.eplb},
            "lora": self.lora,
            "lora_experts_class": self.lora_experts_class,
            "batch_invariant": self.batch_invariant,
            "max_experts": self.max_experts,
            "intermediate_multiple": self.intermediate_multiple,
            "hidden_multiple": self.hidden_multiple,
            "bias": self.bias,
            "lora_rank_multiple": self.lora_rank_multiple,
            "packages": list(self.packages),
            "delegated": self.delegated,
            "classes": [c.name for c in self.classes],
            "engine_name": self.engine_name,
        }


@dataclass(frozen=True)
class Catalog:
    """All backends, in catalog order, plus the implementations registered for them."""

    backends: Mapping[str, BackendSpec]
    implementations: Mapping[str, str]
    sha256: str
    #: Deployment constraints of the engine that no backend choice can satisfy (e.g. vLLM's
    #: LoRA layer under expert parallelism): a failing one is a PolicyError at selection.
    deployment: tuple[Requirement, ...] = ()
    #: Backends of the engine's other oracles (vLLM's fp8 ``deep_gemm`` beside its
    #: unquantized catalog): a policy may name them; they are not candidates here.
    elsewhere: tuple[str, ...] = ()

    @property
    def policy_names(self) -> tuple[str, ...]:
        """The backend names a policy for this catalog's engine may use."""
        return (*self.backends, *self.elsewhere)

    def __iter__(self) -> Iterator[BackendSpec]:
        return iter(self.backends.values())

    def __contains__(self, name: object) -> bool:
        return name in self.backends

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self.backends)

    def spec(self, name: str) -> BackendSpec:
        try:
            return self.backends[name]
        except KeyError:
            raise PolicyError(
                f"unknown backend {name!r}{did_you_mean(name, self.backends)}"
            ) from None

    def implementation(self, name: str) -> str | None:
        return self.implementations.get(name)

    def load_experts_class(self, name: str) -> type:
        """Import the experts class registered for ``name`` (imports torch)."""
        target = self.implementations.get(name)
        if target is None:
            raise LookupError(
                f"backend {name!r} has no experts implementation in this package "
                f"(an engine provides it: decide here, run it there)"
            )
        module_name, _, attr = target.partition(":")
        module = importlib.import_module(module_name)
        return getattr(module, attr)  # type: ignore[no-any-return]


def _strs(
    value: Any, where: str, field: str, allowed: tuple[str, ...] | None = None
) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise PolicyError(f"{field}: expected a list of names, got {value!r}", where)
    if allowed is not None:
        for item in value:
            if item not in allowed:
                raise PolicyError(
                    f"{field}: unknown value {item!r}{did_you_mean(item, allowed)}", where
                )
    return tuple(value)


def _flag(mapping: Mapping[str, Any], key: str, default: bool, where: str, field: str) -> bool:
    """A boolean field (``true``/``false``; ``"false"`` is not true)."""
    try:
        return parse_bool(mapping.get(key, default))
    except ValueError as exc:
        raise PolicyError(f"{field}: {exc}", where) from None


def parse_catalog(loaded: LoadedYaml) -> Catalog:
    """Validate a loaded catalog document; every problem names its file:line:col."""
    data = loaded.data
    if not isinstance(data, Mapping) or not isinstance(data.get("backends"), Mapping):
        raise PolicyError("a catalog needs a `backends:` mapping", loaded.origin(()))
    specs: dict[str, BackendSpec] = {}
    for name, raw in data["backends"].items():
        path = ("backends", name)
        where = str(loaded.origin(path, at_key=True))
        if not isinstance(raw, Mapping):
            raise PolicyError(f"backend {name!r}: expected a mapping", where)
        for key in raw:
            if key not in BACKEND_KEYS:
                raise PolicyError(
                    f"backend {name!r}: unknown key {key!r}{did_you_mean(str(key), BACKEND_KEYS)}",
                    loaded.origin((*path, key), at_key=True),
                )
        cap = raw.get("capability") or {}
        acts = raw.get("activations") or {}
        par = raw.get("parallel") or {}
        lora = raw.get("lora") or {"supported": False}
        lora_supported = str(lora.get("supported")).lower()
        if lora_supported not in LORA_SUPPORT:
            raise PolicyError(
                f"backend {name!r}: lora.supported must be one of {', '.join(LORA_SUPPORT)}",
                loaded.origin((*path, "lora", "supported")),
            )
        sink = ProblemSink(strict=True)
        lora_conditions = parse_conditions(
            lora.get("when"), loaded.origin, (*path, "lora", "when"), sink
        )
        fmt = raw.get("activation_format", "standard")
        if fmt not in ("standard", "batched", "any"):
            raise PolicyError(
                f"backend {name!r}: activation_format must be standard, batched or any",
                loaded.origin((*path, "activation_format")),
            )
        specs[name] = BackendSpec(
            name=name,
            description=str(raw.get("description", "")),
            experts_class=raw.get("experts_class"),
            implementation=raw.get("implementation"),
            platforms=_strs(raw.get("platforms"), where, "platforms", PLATFORMS),
            capability_min=cap.get("min"),
            capability_max=cap.get("max"),
            capability_any_of=tuple(str(c) for c in cap.get("any_of", ())),
            dtypes=_strs(raw.get("dtypes"), where, "dtypes", DTYPES),
            quantization=_strs(raw.get("quantization"), where, "quantization", QUANTIZATIONS),
            gated_activations=_strs(acts.get("gated"), where, "activations.gated", ACTIVATIONS),
            non_gated_activations=_strs(
                acts.get("non_gated"), where, "activations.non_gated", ACTIVATIONS
            ),
            activation_format=fmt,
            all2all_exclude=_strs(
                par.get("all2all_exclude"), where, "parallel.all2all_exclude", ALL2ALL_KINDS
            ),
            eplb=_flag(par, "eplb", True, where, "parallel.eplb"),
            lora=lora_supported,
            lora_conditions=lora_conditions,
            lora_experts_class=lora.get("experts_class"),
            batch_invariant=_flag(raw, "batch_invariant", False, where, "batch_invariant"),
            max_experts=raw.get("max_experts"),
            intermediate_multiple=raw.get("intermediate_multiple"),
            hidden_multiple=raw.get("hidden_multiple"),
            bias=_flag(raw, "bias", True, where, "bias"),
            lora_rank_multiple=lora.get("rank_multiple"),
            packages=_strs(raw.get("packages"), where, "packages"),
            delegated=_flag(raw, "delegated", False, where, "delegated"),
            origin=where,
            requires=_requirements(loaded, raw.get("requires"), (*path, "requires")),
            classes=_classes(loaded, raw.get("classes"), (*path, "classes")),
            engine_name=raw.get("engine_name"),
        )
    implementations = {s.name: s.implementation for s in specs.values() if s.implementation}
    deployment = _requirements(loaded, data.get("deployment"), ("deployment",))
    return Catalog(specs, implementations, sha256_hex(loaded.text), deployment)


def _requirements(loaded: LoadedYaml, raw: Any, path: tuple[Any, ...]) -> tuple[Requirement, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise PolicyError("requires: expected a list of requirements", loaded.origin(path))
    found = []
    for i, item in enumerate(raw):
        where = loaded.origin((*path, i))
        if not isinstance(item, Mapping) or "need" not in item:
            raise PolicyError("a requirement is a mapping with `need:` conditions", where)
        for key in item:
            if key not in REQUIREMENT_KEYS:
                raise PolicyError(
                    f"requirement: unknown key {key!r}{did_you_mean(str(key), REQUIREMENT_KEYS)}",
                    loaded.origin((*path, i, key), at_key=True),
                )
        code = str(item.get("reason_code", "implementation_unsupported"))
        try:
            reason = ReasonCode(code)
        except ValueError:
            codes = [c.value for c in ReasonCode]
            raise PolicyError(
                f"unknown reason code {code!r}{did_you_mean(code, codes)}",
                loaded.origin((*path, i, "reason_code")),
            ) from None
        sink = ProblemSink(strict=True)
        found.append(
            Requirement(
                when=parse_conditions(item.get("if"), loaded.origin, (*path, i, "if"), sink),
                need=parse_conditions(item["need"], loaded.origin, (*path, i, "need"), sink),
                reason=reason,
                detail=str(item.get("detail", "requirement not met")),
            )
        )
    return tuple(found)


def _classes(loaded: LoadedYaml, raw: Any, path: tuple[Any, ...]) -> tuple[ExpertsClassSpec, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise PolicyError("classes: expected a list of experts classes", loaded.origin(path))
    found = []
    for i, item in enumerate(raw):
        if isinstance(item, str):
            found.append(ExpertsClassSpec(item))
            continue
        if not isinstance(item, Mapping) or not isinstance(item.get("name"), str):
            raise PolicyError(
                "an experts class is a name or {name, requires}", loaded.origin((*path, i))
            )
        for key in item:
            if key not in CLASS_KEYS:
                raise PolicyError(
                    f"experts class: unknown key {key!r}{did_you_mean(str(key), CLASS_KEYS)}",
                    loaded.origin((*path, i, key), at_key=True),
                )
        found.append(
            ExpertsClassSpec(
                item["name"], _requirements(loaded, item.get("requires"), (*path, i, "requires"))
            )
        )
    return tuple(found)


def check_registry(catalog: Catalog) -> list[str]:
    """Problems between catalog and implementations, found without importing them.

    Each built-in implementation's module must exist and define the named class.
    """
    problems = []
    for name, target in catalog.implementations.items():
        module_name, _, attr = target.partition(":")
        if not attr:
            problems.append(f"{name}: implementation {target!r} is not 'module:Class'")
            continue
        try:
            spec = importlib.util.find_spec(module_name)
        except (ImportError, ValueError):
            spec = None
        if spec is None or spec.origin is None:
            problems.append(f"{name}: module {module_name!r} of {target!r} not found")
            continue
        if module_name.startswith("moe_policy."):
            with open(spec.origin, encoding="utf-8") as handle:
                source = handle.read()
            if f"class {attr}(" not in source and f"class {attr}:" not in source:
                problems.append(f"{name}: {module_name} defines no class {attr!r}")
    return problems


def load_catalog(engine: EngineProfile | None = None) -> Catalog:
    """The catalog of ``engine`` (this package's by default), parsed once per process;
    registry drift is an error that names what is missing."""
    profile = engine or MOE_POLICY
    key = f"{profile.label}:{profile.quantization}"
    catalog = STATE.catalogs.get(key)
    if catalog is None:
        catalog = parse_builtin_catalog(profile)
        if profile.oracles:
            others = [
                name
                for sibling in profile.siblings()
                if sibling.quantization != profile.quantization
                for name in parse_builtin_catalog(sibling).names
                if name not in catalog
            ]
            catalog = dataclasses.replace(catalog, elsewhere=tuple(dict.fromkeys(others)))
        STATE.catalogs[key] = catalog
    return catalog


def parse_builtin_catalog(engine: EngineProfile | None = None) -> Catalog:
    """Read and check an engine's catalog (``configs/backends.yaml`` for this package)."""
    profile = engine or MOE_POLICY
    loaded = load_yaml_file(profile.catalog_path, display_path=profile.catalog_name)
    catalog = parse_catalog(loaded)
    problems = check_registry(catalog)
    if problems:
        raise PolicyError(
            "catalog and experts registry disagree: " + "; ".join(problems), profile.catalog_name
        )
    return catalog
