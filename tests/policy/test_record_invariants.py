"""Property: every decision record keeps the invariants docs/decision-record.md states.

Deployments are drawn over the bundled models, every platform, capabilities, device names,
package sets, parallel layouts, LoRA, dtypes, layer kinds, modes, requests (any backend name
of any catalog, or none; from the API or the environment, and vLLM's own switches) and both
engine profiles (vLLM's quantization oracles decide the quantized models). Each outcome, a
decision or the error raised, is checked against the catalog and spec objects: the schema,
one candidate per catalog backend, the selected one, eliminations, outcome and overrides,
strict mode, adaptations, ``implemented_here``, LoRA, the activation format, the
fingerprint and the JSON round trip.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import moe_policy
from moe_policy.core.catalog import BackendSpec, Catalog, load_catalog
from moe_policy.core.decision import Decision, Outcome, ReasonCode, Status
from moe_policy.core.engines import MOE_POLICY, PROFILES, EngineProfile, resolve_engine
from moe_policy.core.keys import (
    ALL2ALL_KINDS,
    CONTEXT_KEYS,
    CPU_ARCHS,
    DTYPES,
    ENGINES,
    LAYER_KINDS,
    PLATFORMS,
    ROCM_GFX,
)
from moe_policy.core.model import load_model
from moe_policy.core.passes.request import BATCHED_COUNTERPART
from moe_policy.core.pipeline import DEFAULT_PIPELINE, pass_names
from moe_policy.core.platform import KNOWN_PACKAGES, PlatformFacts
from moe_policy.errors import BackendOverrideError, NoFeasibleBackendError, PolicyError
from moe_policy.testing import isolated_selector
from tests.bundled import MODELS

MODEL_PATHS = tuple(sorted(str(p) for p in Path(MODELS).glob("*.json")))
#: Every profile an engine has, with each of its quantization oracles.
ALL_PROFILES: tuple[EngineProfile, ...] = tuple(
    sibling for profiles in PROFILES.values() for p in profiles for sibling in p.siblings()
)
ALL_NAMES = tuple(sorted({n for p in ALL_PROFILES for n in load_catalog(p).names}))
ALL_PACKAGES = tuple(
    sorted(
        {*KNOWN_PACKAGES, *(k for p in ALL_PROFILES for s in load_catalog(p) for k in s.packages)}
    )
)
PASSES = frozenset(pass_names(DEFAULT_PIPELINE))
POLICY_CODES = frozenset({ReasonCode.POLICY_FORBID, ReasonCode.POLICY_REQUIRE})
VALIDATOR = jsonschema.Draft202012Validator(moe_policy.schema("decision"))
SHA256 = re.compile(r"[0-9a-f]{64}")
CAPABILITIES = (None, *(f"{major}.{minor}" for major in range(7, 13) for minor in range(10)))
DEVICE_NAMES = (
    None,
    "NVIDIA H200",
    "NVIDIA B200",
    "NVIDIA A100-SXM4-80GB",
    "NVIDIA GeForce RTX 5090",
    "AMD Instinct MI300X",
    "Intel(R) Data Center GPU Max 1550",
    "TPU v5e",
)
VLLM_SWITCHES = st.dictionaries(
    st.sampled_from(
        [
            "VLLM_ROCM_USE_AITER",
            "VLLM_USE_DEEP_GEMM",
            "VLLM_MOE_USE_DEEP_GEMM",
            "VLLM_BATCH_INVARIANT",
        ]
    ),
    st.sampled_from(["1", "0"]),
    max_size=2,
)


def oracle_profile(engine: str, model: str) -> EngineProfile:
    """The profile that decides ``model``'s layers for ``engine`` (vLLM: by quantization)."""
    facts = load_model(model).facts
    scheme = str(facts.get("model.quantization", ("none", ""))[0])
    activation = str(facts.get("model.quant.activation", ("none", ""))[0])
    return resolve_engine(engine).for_quantization(scheme, "test", activation)


def spelled(name: str, style: int) -> str:
    """A backend name as a user may write it (names are read case- and dash-insensitively)."""
    return (name, name.upper(), name.replace("_", "-"))[style]


@dataclass
class Deployment:
    engine: str
    model: str
    platform: PlatformFacts
    keywords: dict[str, Any]
    overrides: dict[str, Any]
    environ: dict[str, str]
    layer_index: int | None
    layer_kind: str | None
    #: (normalised name or "auto", origin) of each request source given, highest first.
    requests: list[tuple[str, str]] = field(default_factory=list)
    mode: str = "warn"

    def build(self, **changes: Any) -> Any:
        keywords = {**self.keywords, **changes}
        return isolated_selector(
            self.model,
            platform=self.platform,
            environ=self.environ,
            overrides=self.overrides,
            **keywords,
        )


@st.composite
def deployments(draw: st.DrawFn) -> Deployment:
    engine = draw(st.sampled_from(ENGINES))
    model = draw(st.sampled_from(MODEL_PATHS))
    own = load_catalog(oracle_profile(engine, model)).policy_names
    platform = draw(st.sampled_from(PLATFORMS))
    capability = None
    if platform in ("cuda", "rocm"):  # None: unknown (one draw in 61)
        capability = draw(st.sampled_from(CAPABILITIES))
    packages = draw(
        st.one_of(
            st.none(),  # "assume every package"
            st.sets(st.sampled_from(ALL_PACKAGES), max_size=3).map(
                lambda gone: tuple(p for p in ALL_PACKAGES if p not in gone)
            ),
            st.sets(st.sampled_from(ALL_PACKAGES), max_size=4).map(tuple),
        )
    )
    facts = PlatformFacts(
        platform, capability, draw(st.sampled_from(DEVICE_NAMES)), packages, origin="api"
    )
    lora = draw(st.booleans())
    keywords: dict[str, Any] = {
        "tp": draw(st.sampled_from([1, 2, 4, 8])),
        "dp": draw(st.sampled_from([1, 2, 4])),
        "ep": draw(st.booleans()),
        "all2all": draw(st.sampled_from(ALL2ALL_KINDS)),
        "eplb": draw(st.booleans()),
        "lora": lora,
        "dtype": draw(st.one_of(st.none(), st.sampled_from(DTYPES))),
        "batch_invariant": draw(st.booleans()),
    }
    if lora:
        keywords["max_lora_rank"] = draw(st.sampled_from([None, 8, 16, 24, 32, 64, 256]))
        keywords["max_loras"] = draw(st.sampled_from([None, 1, 4]))
    overrides: dict[str, Any] = {
        "parallel.sp": draw(st.booleans()),
        "lora.fully_sharded": lora and draw(st.booleans()),
        "rocm.aiter": draw(st.booleans()),
        "cpu.amx": draw(st.booleans()),
        "cpu.amx_fp8": draw(st.booleans()),
    }
    for key, choices in (("rocm.gfx", ROCM_GFX), ("cpu.arch", CPU_ARCHS)):
        value = draw(st.one_of(st.none(), st.sampled_from(choices)))
        if value is not None:
            overrides[key] = value
    environ: dict[str, str] = {"MOE_POLICY_ENGINE": engine} if engine != "moe_policy" else {}
    environ.update(draw(VLLM_SWITCHES) if engine == "vllm" else {})
    # Requests: mostly names the engine's policy may use, sometimes any catalog's name.
    request_names = st.one_of(
        st.none(), st.just("auto"), st.sampled_from(own), st.sampled_from(ALL_NAMES)
    )
    requests = []
    api_request = draw(request_names)
    env_request = draw(st.one_of(st.none(), request_names))
    if api_request is not None:
        keywords["backend"] = spelled(api_request, draw(st.integers(0, 2)))
        requests.append((api_request, "api"))
    if env_request is not None:
        environ["MOE_POLICY_BACKEND"] = spelled(env_request, draw(st.integers(0, 2)))
        requests.append((env_request, "env:MOE_POLICY_BACKEND"))
    mode = draw(st.sampled_from(["warn", "strict"]))
    if draw(st.booleans()):
        keywords["mode"] = mode
    else:
        environ["MOE_POLICY_MODE"] = mode
    layer_kind = draw(st.one_of(st.none(), st.sampled_from(LAYER_KINDS)))
    layer_index = draw(st.one_of(st.none(), st.integers(min_value=0, max_value=95)))
    return Deployment(
        engine, model, facts, keywords, overrides, environ, layer_index, layer_kind, requests, mode
    )


def expected_request(dep: Deployment, sel: Any) -> tuple[str, str] | None:
    """(backend, origin) of the request the inputs make: the API beats MOE_POLICY_BACKEND,
    which beats vLLM's own switches; ``auto`` is no request."""
    if dep.requests:
        name, origin = dep.requests[0]
        return None if name == "auto" else (name, origin)
    request = sel.selector.settings.request
    if request is None:
        return None
    # Only vLLM's switches (AITER, DeepGEMM) request a backend on their own.
    assert request.origin.startswith("env:VLLM_"), request
    return request.backend, request.origin


def check_candidates(d: Decision, catalog: Catalog) -> None:
    counts = Counter(c.backend for c in d.candidates)
    assert counts == Counter(catalog.names), "each catalog backend is a candidate exactly once"
    selected = [c for c in d.candidates if c.status is Status.SELECTED]
    if d.backend is None:
        assert selected == []
    else:
        assert [c.backend for c in selected] == [d.backend]
    for cand in d.candidates:
        spec = catalog.spec(cand.backend)
        if cand.status is Status.ELIMINATED:
            assert isinstance(cand.reason_code, ReasonCode), cand
            assert cand.detail and cand.pass_name in PASSES, cand
            assert (cand.reason_code in POLICY_CODES) == (cand.pass_name == "policy_rules"), cand
            assert (cand.rule is not None) == (cand.pass_name == "policy_rules"), cand
            if cand.pass_name == "lora":
                assert cand.reason_code is ReasonCode.LORA_UNSUPPORTED, cand
        else:
            assert cand.reason_code is None and cand.rule is None, cand
        if cand.experts_class is not None:  # a class other than the backend's default
            classes = {c.name for c in spec.classes} | {spec.lora_experts_class}
            assert cand.experts_class in classes and cand.experts_class != spec.experts_class
    assert sum(c.requested for c in d.candidates) <= 1


def check_request(d: Decision, catalog: Catalog, want: tuple[str, str] | None) -> None:
    if want is None:
        assert d.requested is None and d.outcome is Outcome.AUTO
        assert d.overrides == () and d.adaptations == ()
        assert not any(c.requested for c in d.candidates)
        return
    name, origin = want
    assert d.requested is not None and d.requested.origin == origin, (d.requested, want)
    adapt = (
        d.activation_format == "batched"
        and name in BATCHED_COUNTERPART
        and BATCHED_COUNTERPART[name] in catalog
    )
    if adapt:
        assert d.requested.backend == BATCHED_COUNTERPART[name]
        assert d.requested.adapted_from == name
        assert [(a.requested, a.adapted_to, a.origin) for a in d.adaptations] == [
            (name, BATCHED_COUNTERPART[name], origin)
        ]
    else:
        assert d.requested.backend == name and d.requested.adapted_from is None
        assert d.adaptations == ()
    wanted = d.requested.backend
    marked = [c.backend for c in d.candidates if c.requested]
    assert marked == ([wanted] if wanted in catalog else [])
    overridden = d.backend != wanted or bool(d.overrides)
    assert (d.outcome is Outcome.OVERRIDDEN) == overridden, d.outcome
    assert (d.outcome is Outcome.HONORED) == (not overridden)
    if d.outcome is Outcome.HONORED:
        assert d.backend == wanted and d.overrides == ()
        return
    # overridden: at least one override, naming the request and its origin
    assert d.overrides, "overridden without an override record"
    for o in d.overrides:
        assert o.requested == name and o.origin == origin and o.selected == d.backend, o
        assert isinstance(o.reason_code, ReasonCode) and o.detail and o.pass_name in PASSES
    if wanted in catalog:
        cand = d.candidate(wanted)
        assert not cand.alive, "a surviving requested backend must be selected"
        assert (cand.reason_code, cand.pass_name, cand.rule) in {
            (o.reason_code, o.pass_name, o.rule) for o in d.overrides
        }
    else:  # a backend of another of the engine's oracles
        assert [o.reason_code for o in d.overrides] == [ReasonCode.QUANTIZATION_UNSUPPORTED]


def check_selected(d: Decision, catalog: Catalog, ctx: dict[str, Any]) -> None:
    assert d.activation_format == ctx["parallel.activation_format"]
    if d.backend is None:
        assert not d.implemented_here and d.experts_class is None
        assert not any(c.alive and (c.listed or c.requested) for c in d.candidates)
        return
    spec: BackendSpec = catalog.spec(d.backend)
    assert d.implemented_here == (spec.implementation is not None)
    assert spec.activation_format in (d.activation_format, "any"), (spec.name, d.activation_format)
    assert d.experts_class == (d.candidate(d.backend).experts_class or spec.experts_class)
    if ctx["lora.enabled"]:
        assert spec.lora != "false", f"{d.backend} cannot apply LoRA"
        if spec.lora_rank_multiple:
            assert ctx["lora.max_rank"] % spec.lora_rank_multiple == 0
        if spec.lora == "conditional":
            assert all(c.test(ctx.get(c.key)) for c in spec.lora_conditions)
            if spec.lora_experts_class:
                assert d.experts_class == spec.lora_experts_class


def check_record(d: Decision) -> None:
    record = d.to_dict()
    VALIDATOR.validate(record)
    assert json.loads(json.dumps(record)) == record
    assert SHA256.fullmatch(d.fingerprint)
    assert set(record["context"]) == set(CONTEXT_KEYS), "the record lists every context key"


def catalog_of(dep: Deployment) -> Catalog:
    """The catalog of the oracle that decides ``dep``'s layers."""
    return load_catalog(oracle_profile(dep.engine, dep.model))


def check_decision(
    d: Decision, dep: Deployment, catalog: Catalog, want: tuple[str, str] | None
) -> None:
    check_record(d)
    assert d.mode == dep.mode
    assert d.layer_kind == (dep.layer_kind or "moe") and d.layer_index == dep.layer_index
    check_candidates(d, catalog)
    check_request(d, catalog, want)
    check_selected(d, catalog, {key: value for key, (value, _) in d.context.items()})


@settings(
    derandomize=True,
    database=None,
    max_examples=400,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(dep=deployments())
def test_every_decision_record_keeps_its_invariants(dep: Deployment) -> None:
    try:
        sel = dep.build()
    except PolicyError as exc:
        unknown = [
            (n, o) for n, o in dep.requests if n != "auto" and n not in catalog_of(dep).policy_names
        ]
        if exc.code == "unknown-backend":
            assert unknown and exc.origin in {o for _, o in unknown}, exc
            event("unknown backend requested")
        else:
            assert not unknown, exc
            assert exc.origin, f"a PolicyError names its origin: {exc}"
            event("deployment refused")
        return
    catalog = catalog_of(dep)
    assert sel.selector.catalog.names == catalog.names
    want = expected_request(dep, sel)
    raised: Exception | None = None
    try:
        d = sel.select(dep.layer_index, dep.layer_kind)
    except (BackendOverrideError, NoFeasibleBackendError) as exc:
        d, raised = exc.decision, exc
    event(f"{dep.engine}: {d.outcome.value}{'' if d.backend else ', nothing feasible'}")
    check_decision(d, dep, catalog, want)

    # what reached the caller
    if d.backend is None:
        assert isinstance(raised, NoFeasibleBackendError)
    elif d.outcome is Outcome.OVERRIDDEN and dep.mode == "strict":
        assert isinstance(raised, BackendOverrideError), "strict mode never returns overridden"
        assert want is not None and f"(from {want[1]})" in str(raised)
        assert sel.warnings == []
    else:
        assert raised is None
        if d.outcome is Outcome.OVERRIDDEN:
            assert [w.override for w in sel.warnings] == [d.overrides[0]]
            assert want is not None and f"(from {want[1]})" in str(sel.warnings[0])
        else:
            assert sel.warnings == []

    # the fingerprint: same inputs, same fingerprint; another request, another fingerprint
    again = dep.build().decide(dep.layer_index, dep.layer_kind)
    assert again.fingerprint == d.fingerprint and again.decision_id != d.decision_id
    assert again.to_dict() | {"decision_id": d.decision_id} == d.to_dict()
    # another request: a backend that survived every pass here if there is one, which is
    # then honoured (the request decides nothing before the request pass) unless it changes
    # the activation format (vLLM's batched_triton on XPU)
    current = d.requested.backend if d.requested else "auto"
    alive = [c.backend for c in d.candidates if c.alive and c.backend != current]
    other = next(
        n for n in (*alive, "auto", *catalog.names) if n not in (current, want and want[0])
    )
    changed = dep.build(backend=other).decide(dep.layer_index, dep.layer_kind)
    assert changed.fingerprint != d.fingerprint, f"request {want} -> {other}"
    check_decision(changed, dep, catalog, None if other == "auto" else (other, "api"))
    if other in alive and changed.activation_format == d.activation_format:
        event("a surviving backend requested")
        assert changed.outcome is Outcome.HONORED and changed.backend == other, changed.describe()
    rules_on_index = any("layer.index" in rule.keys for rule in sel.selector.resolver.policy.rules)
    if not rules_on_index:
        elsewhere = sel.decide((dep.layer_index or 0) + 1, dep.layer_kind)
        assert elsewhere.fingerprint == d.fingerprint, "layer.index is not decisive"


def test_the_draws_cover_every_engine_oracle_of_the_bundled_models() -> None:
    """The models reach both engines' catalogs and vLLM's quantization oracles."""
    profiles = {oracle_profile(e, m) for e in ENGINES for m in MODEL_PATHS}
    assert MOE_POLICY in profiles
    assert {p.quantization for p in profiles if p.name == "vllm"} == {
        "none",
        "fp8",
        "nvfp4",
        "mxfp4",
        "int_wna16",
    }


# --- regressions the property found -------------------------------------------------


def test_a_pinned_platform_without_packages_still_records_the_packages_key() -> None:
    """``PlatformFacts(packages=None)`` ("assume every package") left ``packages`` out of the
    record's context, which lists every context key."""
    d = isolated_selector(MODEL_PATHS[0]).decide()  # the H200 facts, packages=None
    assert d.context["packages"] == (None, "api")
    assert set(d.to_dict()["context"]) == set(CONTEXT_KEYS)


@pytest.mark.parametrize("origin", ["api", "probe"])
def test_a_package_switched_off_keeps_a_schema_valid_origin(origin: str) -> None:
    """``VLLM_USE_DEEP_GEMM=0`` on a probed (or API-given) platform wrote the origin
    ``probe; deep_gemm switched off by ...``, which the record's schema refuses."""
    facts = PlatformFacts("cuda", "9.0", "NVIDIA H200", ("deep_gemm", "torch", "triton"), origin)
    environ = {"MOE_POLICY_ENGINE": "vllm", "VLLM_USE_DEEP_GEMM": "0"}
    model = str(Path(MODELS) / "deepseek-v3.json")
    d = isolated_selector(model, platform=facts, environ=environ).decide()
    value, where = d.context["packages"]
    assert value == ("torch", "triton")
    assert where == f"derived:{origin}; deep_gemm switched off by env:VLLM_USE_DEEP_GEMM"
    VALIDATOR.validate(d.to_dict())
