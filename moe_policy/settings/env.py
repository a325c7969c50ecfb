"""Environment variables: ours (``MOE_POLICY_*``) and the vLLM knobs users already set.

The environment is read once, in the constructor, through ``_load_environ`` (tests
may pass a mapping instead). Only the names below are read; an unknown
``MOE_POLICY_*`` name is an error with a did-you-mean; any other ``VLLM_*MOE*`` name
is reported as having no effect.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING

from moe_policy.core.decision import Notice
from moe_policy.core.engines import MOE_POLICY, EngineProfile
from moe_policy.core.origin import Origin
from moe_policy.core.values import bool_from_text
from moe_policy.errors import PolicyError, did_you_mean
from moe_policy.settings.base import Entry, Source, SourceOutput
from moe_policy.settings.schema import validate_setting
from moe_policy.settings.vllm_switches import (
    DEEP_GEMM_PACKAGE,
    DEEP_GEMM_SWITCHES,
    MOE_USE_DEEP_GEMM,
    deep_gemm_request,
    deep_gemm_switched_off,
    no_effect_detail,
    switches_read,
)

if TYPE_CHECKING:
    from moe_policy.core.catalog import Catalog

PREFIX = "MOE_POLICY_"
#: Our variables -> the setting each one sets (FILES selects the policy files).
OUR_VARIABLES = {
    "MOE_POLICY_BACKEND": "backend",
    "MOE_POLICY_MODE": "mode",
    "MOE_POLICY_AUDIT_LOG": "audit.path",
    "MOE_POLICY_AUDIT_REQUIRED": "audit.required",
    "MOE_POLICY_CONSISTENCY": "consistency",
    "MOE_POLICY_FILES": None,
    "MOE_POLICY_ENGINE": None,  # read by the Selector: it picks the catalog the layers use
    "MOE_POLICY_AUDIT_DIR": None,  # read by the audit profile's ${oc.env:...} interpolation
    "MOE_POLICY_TUNED_CONFIG_DIR": None,  # read by the Triton kernels: user tuned tile files
}
AITER = "VLLM_ROCM_USE_AITER"
AITER_MOE = "VLLM_ROCM_USE_AITER_MOE"
BATCH_INVARIANT = "VLLM_BATCH_INVARIANT"
FI_FP16 = "VLLM_USE_FLASHINFER_MOE_FP16"
FI_BACKEND = "VLLM_FLASHINFER_MOE_BACKEND"
VLLM_HANDLED = {AITER, AITER_MOE, BATCH_INVARIANT, FI_FP16, FI_BACKEND}
#: What we know about other vLLM MoE knobs users set (all have no effect here).
VLLM_KNOWN_NO_EFFECT = {
    "VLLM_MOE_FORCE_MARLIN": "does not exist in vLLM (it was set in vLLM #45101 and silently ignored)",
    "VLLM_FUSED_MOE_CHUNK_SIZE": "was removed with the kernel chunking (vLLM #34086)",
    "VLLM_USE_FLASHINFER_MOE_FP8": "applies to FP8 MoE only; removed in favour of --moe-backend",
    "VLLM_USE_FLASHINFER_MOE_FP4": "applies to FP4 MoE only; removed in favour of --moe-backend",
    "VLLM_ROCM_MOE_PADDING": "changes ROCm Triton weight padding, not the backend choice",
    "VLLM_MOE_DP_CHUNK_SIZE": "sets a dispatch chunk size, not the backend choice",
    "VLLM_ROCM_AITER_MOE_DISPATCH_POLICY": "tunes AITER sorting at run time, not the backend choice",
}


def _load_environ() -> Mapping[str, str]:
    return dict(os.environ)


def vllm_oracle(engine: EngineProfile) -> str | None:
    """The vLLM oracle ``engine`` decides for (``none``: unquantized), or None for an engine
    that is not vLLM."""
    return engine.quantization if engine.vllm_layout else None


class EnvSource(Source):
    """The environment snapshot taken at construction, read for ``engine`` (the vLLM switches
    an oracle reads depend on the oracle deciding the layer)."""

    layer = "environment"

    def __init__(
        self, environ: Mapping[str, str] | None = None, engine: EngineProfile = MOE_POLICY
    ) -> None:
        self.environ: Mapping[str, str] = dict(environ) if environ is not None else _load_environ()
        self.engine = engine

    def __repr__(self) -> str:
        shown = sorted(
            k
            for k in self.environ
            if k.startswith(PREFIX)
            or (k.startswith("VLLM_") and "MOE" in k)
            or k in VLLM_HANDLED
            or k in DEEP_GEMM_SWITCHES
        )
        return f"EnvSource({shown!r})"

    def policy_files(self) -> list[tuple[str, Origin]]:
        """Files listed in ``MOE_POLICY_FILES`` (os.pathsep-separated), in order."""
        raw = self.environ.get("MOE_POLICY_FILES", "")
        origin = Origin.env("MOE_POLICY_FILES")
        return [(part, origin) for part in raw.split(os.pathsep) if part.strip()]

    def _bool(self, name: str) -> bool:
        try:
            return bool_from_text(self.environ[name])
        except ValueError as exc:
            raise PolicyError(str(exc), Origin.env(name), key=name) from None

    def load(self, catalog: Catalog) -> SourceOutput:
        out = SourceOutput(self.layer)
        for name in sorted(self.environ):
            if not name.startswith(PREFIX):
                continue
            if name not in OUR_VARIABLES:
                raise PolicyError(
                    f"unknown environment variable {name}{did_you_mean(name, OUR_VARIABLES)}; "
                    f"known: {', '.join(OUR_VARIABLES)}",
                    Origin.env(name),
                    key=name,
                )
        self._load_vllm(out, catalog)
        for name, key in OUR_VARIABLES.items():
            if name not in self.environ:
                continue
            raw = self.environ[name]
            origin = Origin.env(name)
            if raw.strip() == "":  # every reader of these variables takes blank as unset
                out.notices.append(Notice(name, str(origin), "set but empty; ignored"))
                continue
            if key is None:
                continue
            out.settings.append(
                Entry(key, validate_setting(key, raw, origin, catalog, as_text=True), origin)
            )
        return out

    def _load_vllm(self, out: SourceOutput, catalog: Catalog) -> None:
        env = self.environ
        if AITER in env or AITER_MOE in env:
            master = self._bool(AITER) if AITER in env else False
            sub = self._bool(AITER_MOE) if AITER_MOE in env else True
            if master and sub:
                origin = Origin.env(AITER if AITER in env else AITER_MOE)
                out.context.append(Entry("rocm.aiter", True, origin))
                out.settings.append(Entry("backend", "aiter", origin))
            elif AITER not in env:  # only the MoE switch is set: the master is off by default
                why = f"{AITER_MOE} without {AITER} (off by default)"
                out.context.append(Entry("rocm.aiter", False, Origin.derived(why)))
            else:
                off = AITER if not master else AITER_MOE
                out.context.append(Entry("rocm.aiter", False, Origin.env(off)))
        self._load_deep_gemm(out)
        if BATCH_INVARIANT in env:
            out.context.append(
                Entry("batch_invariant", self._bool(BATCH_INVARIANT), Origin.env(BATCH_INVARIANT))
            )
        for name in (FI_FP16, FI_BACKEND):
            if name in env:
                out.notices.append(
                    Notice(
                        name,
                        str(Origin.env(name)),
                        "was removed from vLLM (it no longer exists in vLLM 0.33); it has no effect",
                        replacement="MOE_POLICY_BACKEND or vLLM's --moe-backend",
                    )
                )
        for name in sorted(env):
            if name in DEEP_GEMM_SWITCHES:
                continue  # _load_deep_gemm
            if name.startswith("VLLM_") and "MOE" in name and name not in VLLM_HANDLED:
                detail = VLLM_KNOWN_NO_EFFECT.get(name, "is not a knob moe_policy reads")
                out.notices.append(_no_effect(name, detail))

    def _load_deep_gemm(self, out: SourceOutput) -> None:
        """vLLM's DeepGEMM switches, for the oracle that decides the layer
        (:mod:`moe_policy.settings.vllm_switches`): both on is a ``deep_gemm`` request of this
        layer, read after the AITER switches (vLLM's fp8 oracle looks at DeepGEMM first) and
        before ``MOE_POLICY_BACKEND``; one set off takes the ``deep_gemm`` package out. An
        oracle that does not read ``VLLM_MOE_USE_DEEP_GEMM`` set gets a notice saying so."""
        env = self.environ
        oracle = vllm_oracle(self.engine)
        request = deep_gemm_request(env, oracle)
        if request is not None:
            out.settings.append(request)
        off = deep_gemm_switched_off(env, oracle)
        if off is not None:
            out.switched_off.append(Entry("packages", DEEP_GEMM_PACKAGE, off))
        # VLLM_USE_DEEP_GEMM also drives vLLM's dense fp8 GEMMs: set for them, it is no
        # mistake, so only the MoE switch gets a notice where it has no effect.
        if MOE_USE_DEEP_GEMM in env and MOE_USE_DEEP_GEMM not in switches_read(oracle):
            detail = no_effect_detail(MOE_USE_DEEP_GEMM, oracle, self.engine.label)
            out.notices.append(_no_effect(MOE_USE_DEEP_GEMM, detail))


def _no_effect(name: str, detail: str) -> Notice:
    """The notice for a vLLM variable that does not change this MoE backend choice."""
    return Notice(
        name,
        str(Origin.env(name)),
        f"has no effect on the MoE backend choice: {detail}",
        replacement="MOE_POLICY_BACKEND or a policy rule",
    )
