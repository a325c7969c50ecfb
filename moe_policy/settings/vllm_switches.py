"""vLLM's DeepGEMM switches for fp8 MoE, read as vLLM 0.33 reads them: one derivation for the
environment layer of a dry run and of the vLLM plugin. Pure: no vLLM or torch import.

vLLM's fp8 oracle (``oracle/fp8.py``, ``select_fp8_moe_backend``), after ``--moe-backend``:
when ``VLLM_USE_DEEP_GEMM`` or ``VLLM_MOE_USE_DEEP_GEMM`` is set and both read on, it takes
DeepGEMM (its batched class under the batched format) or fails; when either reads off, DeepGEMM
leaves its list. ``VLLM_USE_DEEP_GEMM`` off also makes DeepGEMM's experts classes unsupported
(``is_deep_gemm_supported``), which is how it reaches the mxfp8 oracle; that oracle does not
read ``VLLM_MOE_USE_DEEP_GEMM``. No other oracle the vLLM profile describes reads either.
(The AITER switches the fp8 oracle reads mean what they mean everywhere: see ``env.py``.)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from moe_policy.core.origin import Origin
from moe_policy.errors import PolicyError
from moe_policy.settings.base import Entry

USE_DEEP_GEMM = "VLLM_USE_DEEP_GEMM"
MOE_USE_DEEP_GEMM = "VLLM_MOE_USE_DEEP_GEMM"
DEEP_GEMM_SWITCHES = (USE_DEEP_GEMM, MOE_USE_DEEP_GEMM)
#: The package a DeepGEMM switch set off takes out (the catalogs' DeepGEMM backends need it).
DEEP_GEMM_PACKAGE = "deep_gemm"

#: vLLM's reading of its switches (vllm/envs.py): name -> (default, is it on).
VLLM_READING: Mapping[str, tuple[str, Callable[[str], bool]]] = {
    USE_DEEP_GEMM: ("1", lambda v: bool(int(v))),
    MOE_USE_DEEP_GEMM: ("1", lambda v: bool(int(v))),
}

#: Per vLLM oracle, the DeepGEMM switches it reads.
READ_BY: Mapping[str, tuple[str, ...]] = {
    "fp8": DEEP_GEMM_SWITCHES,
    "mxfp8": (USE_DEEP_GEMM,),
}
#: Who reads each switch, for the notice where it has no effect.
READERS = {
    USE_DEEP_GEMM: "vLLM's fp8 and mxfp8 MoE oracles",
    MOE_USE_DEEP_GEMM: "vLLM's fp8 MoE oracle",
}


def switches_read(oracle: str | None) -> tuple[str, ...]:
    """The DeepGEMM switches vLLM's ``oracle`` reads (none for other oracles or engines)."""
    return READ_BY.get(oracle or "", ())


def switch_on(environ: Mapping[str, str], name: str) -> bool:
    """vLLM's reading of one switch (its default when unset); a value vLLM's ``int()``
    cannot read is an error naming the variable."""
    default, is_on = VLLM_READING[name]
    try:
        return is_on(environ.get(name, default))
    except ValueError:
        raise PolicyError(
            f"{name}={environ[name]!r} is not a value vLLM reads (0 or 1)",
            Origin.env(name),
            key=name,
        ) from None


def deep_gemm_request(environ: Mapping[str, str], oracle: str | None) -> Entry | None:
    """The ``deep_gemm`` request vLLM's fp8 oracle derives from its switches: either set, both
    on. Its origin is the first of ``VLLM_USE_DEEP_GEMM``, ``VLLM_MOE_USE_DEEP_GEMM`` that is
    set. The batched format makes it ``batched_deep_gemm`` (the request pass's adaptation),
    as vLLM swaps the class."""
    if oracle != "fp8" or not any(name in environ for name in DEEP_GEMM_SWITCHES):
        return None
    if not all(switch_on(environ, name) for name in DEEP_GEMM_SWITCHES):
        return None
    origin = Origin.env(next(name for name in DEEP_GEMM_SWITCHES if name in environ))
    return Entry("backend", "deep_gemm", origin)


def deep_gemm_switched_off(environ: Mapping[str, str], oracle: str | None) -> Origin | None:
    """The switch that takes DeepGEMM out of ``oracle``'s reach (set and off), or None."""
    for name in switches_read(oracle):
        if name in environ and not switch_on(environ, name):
            return Origin.env(name)
    return None


def no_effect_detail(name: str, oracle: str | None, engine_label: str) -> str:
    """Why a DeepGEMM switch has no effect on this decision (its oracle does not read it)."""
    readers = READERS[name]
    if oracle is None:
        return f"it is read only by {readers}, and this decision is for the {engine_label} engine"
    layer = "unquantized" if oracle == "none" else oracle
    return f"it is read only by {readers}, and this layer goes to vLLM's {layer} oracle"
