"""Engine profiles: which backends, built-in policy and deployment rules a decision targets.

A decision is for an engine: this package's own ``MoELayer`` (``moe_policy``) or a
serving engine such as vLLM, whose release decides which backends exist, which
experts classes it builds and how it derives the activation format from the parallel
layout. Each profile names its catalog and its built-in policy (YAML under
``configs/``) and the derivation rules of its release. A profile is chosen by name and,
for a serving engine, version (``vllm==0.33.0`` picks the ``0.33`` profile); a version no
profile describes is an error that lists the ones that exist, never a guess.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from moe_policy.core import paths
from moe_policy.core.keys import ENGINES
from moe_policy.core.origin import Origin
from moe_policy.core.values import is_decimal
from moe_policy.errors import PolicyError, did_you_mean


@dataclass(frozen=True)
class EngineProfile:
    """One engine release as the policy sees it."""

    name: str
    #: ``major.minor`` of the release this profile describes (None: this package).
    version: str | None
    catalog_path: Path
    policy_path: Path
    #: vLLM's layout rules: expert parallelism only when tp x dp > 1 (tp flattened over dp),
    #: all2all kernels only under EP with dp > 1 or sequence parallelism, the batched format
    #: also for an explicit ``batched_triton`` request.
    vllm_layout: bool = False
    description: str = ""
    #: Quantization schemes with an oracle of their own in this engine: each has a catalog
    #: ``<scheme>-backends.yaml`` and a built-in policy ``<scheme>-default.yaml`` beside the
    #: profile's (unquantized) ones. Empty: one catalog says what runs every scheme.
    oracles: tuple[str, ...] = ()
    #: The scheme this profile's catalog and policy decide for (``none``: unquantized).
    quantization: str = "none"

    @property
    def label(self) -> str:
        return self.name if self.version is None else f"{self.name}=={self.version}"

    @property
    def catalog_name(self) -> str:
        """How the catalog is named in records (stable across installs)."""
        return paths.display_name(self.catalog_path)

    @property
    def policy_name(self) -> str:
        return paths.display_name(self.policy_path)

    def siblings(self) -> tuple[EngineProfile, ...]:
        """This engine's profile for every scheme it describes (unquantized first): what a
        policy for the engine may name, whichever oracle a layer goes to."""
        if not self.oracles:
            return (self,)
        folder = self.catalog_path.parent
        return tuple(
            replace(
                self,
                catalog_path=folder / ("backends.yaml" if s == "none" else f"{s}-backends.yaml"),
                policy_path=folder / ("default.yaml" if s == "none" else f"{s}-default.yaml"),
                quantization=s,
            )
            for s in ("none", *self.oracles)
        )

    def for_quantization(
        self, scheme: str, origin: Origin | str = "default", activation: str | None = None
    ) -> EngineProfile:
        """The profile of this engine's oracle for MoE layers quantized with ``scheme``
        (with ``activation``, the layer's ``model.quant.activation``: int4 and int8 weights
        with unquantized activations go to vLLM's weight-only ``int_wna16`` oracle).

        An engine with oracles (vLLM) decides each scheme with that oracle's catalog and
        rules; a scheme it has no oracle description for is an error naming the scheme's
        origin rather than a decision by the wrong rules. Without oracles the profile's one
        catalog decides (this package: its backends say which schemes they run).
        """
        if not self.oracles:
            return self
        scheme = oracle_for(scheme, activation)
        if scheme in ("none", self.quantization):
            return self
        if scheme not in self.oracles:
            known = ", ".join(("none", *self.oracles))
            raise PolicyError(
                f"{self.label} has no description of its {scheme} MoE oracle, so moe_policy "
                f"cannot decide {scheme} layers for it (described: {known})",
                origin,
                key="model.quantization",
            )
        folder = self.catalog_path.parent
        return replace(
            self,
            catalog_path=folder / f"{scheme}-backends.yaml",
            policy_path=folder / f"{scheme}-default.yaml",
            quantization=scheme,
            description=f"{self.description} ({scheme} oracle)",
        )


#: Weight-only integer schemes (activations unquantized) and the oracle that decides them.
WEIGHT_ONLY_ORACLE = "int_wna16"


def oracle_for(scheme: str, activation: str | None = None) -> str:
    """The oracle that decides layers of ``scheme``: ``int_wna16`` for int4 weights and for
    int8 weights with unquantized (``none``) activations, ``w4a8`` for int4 weights with fp8
    activations, else the scheme's own."""
    if scheme == "int4" or (scheme == "int8" and activation == "none"):
        return WEIGHT_ONLY_ORACLE
    if scheme == "w4a8_fp8":  # vLLM's w4a8 oracle: int4 weights, fp8 activations
        return "w4a8"
    return scheme


MOE_POLICY = EngineProfile(
    name="moe_policy",
    version=None,
    catalog_path=paths.BACKENDS_CATALOG,
    policy_path=paths.DEFAULT_POLICY,
    description="this package's MoELayer and kernels",
)

VLLM_0_33 = EngineProfile(
    name="vllm",
    version="0.33",
    catalog_path=paths.CONFIG_DIR / "engines" / "vllm-0.33" / "backends.yaml",
    policy_path=paths.CONFIG_DIR / "engines" / "vllm-0.33" / "default.yaml",
    vllm_layout=True,
    description="vLLM 0.33's fused-MoE oracles, their experts classes and its LoRA layer",
    oracles=("fp8", "mxfp4", "nvfp4", "int_wna16", "mxfp8", "int8", "w4a8", "w4a8_int8"),
)

#: Every profile, by engine name, newest last.
PROFILES: dict[str, tuple[EngineProfile, ...]] = {
    "moe_policy": (MOE_POLICY,),
    "vllm": (VLLM_0_33,),
}
assert set(PROFILES) == set(ENGINES)


def _major_minor(version: str) -> str | None:
    parts = version.strip().lstrip("v").split(".")
    if len(parts) < 2 or not all(is_decimal(p) for p in parts[:2]):
        return None
    return f"{int(parts[0])}.{int(parts[1])}"


def resolve_engine(spec: str | None, origin: Origin | str = "default") -> EngineProfile:
    """The profile for ``moe_policy``, ``vllm`` (its newest profile) or ``vllm==0.33[.x]``;
    a ``/SCHEME`` suffix (``vllm/fp8``) names the engine's oracle for that quantization."""
    if spec is None or not str(spec).strip():
        return MOE_POLICY
    text, _, scheme = str(spec).strip().partition("/")
    profile = _resolve_release(text.strip(), origin)
    if not scheme.strip():
        return profile
    scheme = scheme.strip().lower()
    if scheme not in profile.oracles:
        known = ", ".join(profile.oracles) or "none"
        raise PolicyError(
            f"engine {profile.label} has no {scheme!r} oracle"
            f"{did_you_mean(scheme, profile.oracles)}; its oracles: {known}",
            origin,
            key="engine",
        )
    return profile.for_quantization(scheme, origin)


def _resolve_release(text: str, origin: Origin | str) -> EngineProfile:
    name, _, version = text.partition("==")
    name = name.strip().lower()
    if name not in PROFILES:
        raise PolicyError(
            f"unknown engine {name!r}{did_you_mean(name, PROFILES)}; known: {', '.join(PROFILES)}",
            origin,
            key="engine",
        )
    profiles = PROFILES[name]
    if not version.strip():
        return profiles[-1]
    if profiles[0].version is None:
        raise PolicyError(f"engine {name!r} takes no version, got {text!r}", origin, key="engine")
    wanted = _major_minor(version)
    known = ", ".join(f"{name}=={p.version}" for p in profiles)
    if wanted is None:
        raise PolicyError(
            f"engine version {version.strip()!r} is not MAJOR.MINOR[.PATCH] (known: {known})",
            origin,
            key="engine",
        )
    for profile in profiles:
        if profile.version == wanted:
            return profile
    raise PolicyError(
        f"no profile describes {name} {version.strip()} (its backends and rules may differ); "
        f"known: {known}",
        origin,
        key="engine",
    )
