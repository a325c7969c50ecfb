"""The vLLM general plugin: vLLM's unquantized, fp8, mxfp4, nvfp4, mxfp8, int8 (w8a8), W4A8
(int4 x fp8 and int4 x int8) and GPTQ/AWQ weight-only integer MoE selection go through the
policy.

Registered in the ``vllm.general_plugins`` entry-point group as ``moe_policy``; vLLM loads
it in every process (select or exclude it with ``VLLM_PLUGINS``). :func:`register` puts
:func:`moe_policy.integrations.vllm.selection.select_unquantized_moe_backend` where
``UnquantizedFusedMoEMethod`` looks its selector up (and in the oracle module, for direct
callers), and :func:`~moe_policy.integrations.vllm.selection.select_fp8_moe_backend` and
:func:`~moe_policy.integrations.vllm.selection.select_mxfp4_moe_backend` and ``..._nvfp4_...``
``..._mxfp8_...``, ``..._int8_...``, ``..._w4a8_...`` and ``..._w4a8_int8_...`` in their oracles and
every quantization method that calls them, ``..._wna16_...`` in the GPTQ and AWQ methods; a second call changes nothing. A vLLM release no profile describes fails here,
at plugin load, with the list of known profiles; bad settings are reported there too (the
``moe_policy.settings_invalid`` event), and stop start-up at the first MoE layer.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

#: Marks the functions this plugin installed (idempotent registration).
MARK = "__moe_policy_selector__"
LOGGER = "moe_policy"


#: The modules that bind vLLM 0.33's fp8 selector by name: the oracle and its callers.
FP8_CALLERS = (
    "vllm.model_executor.layers.fused_moe.oracle.fp8",
    "vllm.model_executor.layers.quantization.fp8",
    "vllm.model_executor.layers.quantization.modelopt",
    "vllm.model_executor.layers.quantization.online.fp8",
    "vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors_moe."
    "compressed_tensors_moe_w8a8_fp8",
    "vllm.model_executor.layers.quantization.quark.quark_moe",
)


#: The modules that bind vLLM 0.33's mxfp4 selector by name.
MXFP4_CALLERS = (
    "vllm.model_executor.layers.fused_moe.oracle.mxfp4",
    "vllm.model_executor.layers.quantization.mxfp4",
    "vllm.model_executor.layers.quantization.online.mxfp4",
    "vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors_moe."
    "compressed_tensors_moe_w4a4_mxfp4",
    "vllm.model_executor.layers.quantization.quark.quark_moe",
)


#: The modules that bind vLLM 0.33's nvfp4 selector by name.
NVFP4_CALLERS = (
    "vllm.model_executor.layers.fused_moe.oracle.nvfp4",
    "vllm.model_executor.layers.quantization.modelopt",
    "vllm.model_executor.layers.quantization.online.nvfp4",
    "vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors_moe."
    "compressed_tensors_moe_w4a4_nvfp4",
    "vllm.model_executor.layers.quantization.quark.quark_moe",
)


#: The modules that bind vLLM 0.33's mxfp8 selector by name.
MXFP8_CALLERS = (
    "vllm.model_executor.layers.fused_moe.oracle.mxfp8",
    "vllm.model_executor.layers.quantization.modelopt",
    "vllm.model_executor.layers.quantization.online.mxfp8",
    "vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors_moe."
    "compressed_tensors_moe_w8a8_mxfp8",
    "vllm.model_executor.layers.quantization.quark.quark_moe",
    "vllm.model_executor.layers.quantization.inc.schemes.inc_mxfp8_moe",
)


#: The modules that bind vLLM 0.33's int8 (w8a8) selector by name.
INT8_CALLERS = (
    "vllm.model_executor.layers.fused_moe.oracle.int8",
    "vllm.model_executor.layers.quantization.online.int8",
    "vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors_moe."
    "compressed_tensors_moe_w8a8_int8",
    "vllm.model_executor.layers.quantization.quark.quark_moe",
)


#: The modules that bind vLLM 0.33's W4A8 (int4 x fp8) selector by name.
W4A8_CALLERS = (
    "vllm.model_executor.layers.fused_moe.oracle.w4a8",
    "vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors_moe."
    "compressed_tensors_moe_w4a8_fp8",
)


#: The modules that bind vLLM 0.33's W4A8 int8 (int4 x int8) selector by name.
W4A8_INT8_CALLERS = (
    "vllm.model_executor.layers.fused_moe.oracle.w4a8_int8",
    "vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors_moe."
    "compressed_tensors_moe_w4a8_int8",
)


#: The modules that bind vLLM 0.33's weight-only integer selector by name: the GPTQ and AWQ
#: methods (the profile describes their checkpoints; compressed-tensors, MoeWNA16 and Quark
#: layers keep vLLM's own selection).
WNA16_CALLERS = (
    "vllm.model_executor.layers.quantization.auto_gptq",
    "vllm.model_executor.layers.quantization.auto_awq",
)


def _install(module: Any, name: str, replacement: Any) -> None:
    if getattr(getattr(module, name), MARK, False):
        return
    setattr(module, name, replacement)


def register() -> None:
    """Route vLLM's unquantized, fp8, mxfp4, nvfp4, mxfp8, int8, W4A8 and GPTQ/AWQ int MoE selection
    through the policy (idempotent)."""
    import importlib

    from vllm.model_executor.layers.fused_moe import unquantized_fused_moe_method
    from vllm.model_executor.layers.fused_moe.oracle import unquantized

    from moe_policy.integrations.vllm import selection

    selection.engine_profile()  # this vLLM release must have a profile
    select = _routed(selection.select_unquantized_moe_backend)
    _install(unquantized_fused_moe_method, "select_unquantized_moe_backend", select)
    _install(unquantized, "select_unquantized_moe_backend", select)
    for callers, function in (
        (FP8_CALLERS, "select_fp8_moe_backend"),
        (MXFP4_CALLERS, "select_mxfp4_moe_backend"),
        (NVFP4_CALLERS, "select_nvfp4_moe_backend"),
        (MXFP8_CALLERS, "select_mxfp8_moe_backend"),
        (INT8_CALLERS, "select_int8_moe_backend"),
        (W4A8_CALLERS, "select_w4a8_moe_backend"),
        (W4A8_INT8_CALLERS, "select_w4a8_int8_moe_backend"),
        (WNA16_CALLERS, "select_wna16_moe_backend"),
    ):
        routed = _routed(getattr(selection, function))
        for name in callers:
            try:
                module = importlib.import_module(name)
            except ImportError:  # its optional dependency is missing: vLLM cannot use it either
                continue
            _install(module, function, routed)
    attach_to_vllm_logging()
    selection.check_settings_at_load(os.environ)


def _routed(select: Any) -> Any:
    def routed(*args: Any, **kwargs: Any) -> Any:
        attach_to_vllm_logging()
        return select(*args, **kwargs)

    setattr(routed, MARK, True)
    routed.__name__ = routed.__qualname__ = select.__name__
    routed.__doc__ = select.__doc__
    return routed


class _ToVllmHandlers(logging.Handler):
    """Hands ``moe_policy`` records to the handlers vLLM configured on its ``vllm`` logger,
    while no handler of the application's (on ``moe_policy`` or, through propagation, on the
    root logger) receives them: records are never lost to vLLM's log, nor shown twice."""

    def emit(self, record: logging.LogRecord) -> None:
        if _handled_elsewhere(logging.getLogger(LOGGER)):
            return
        for handler in logging.getLogger("vllm").handlers:
            if record.levelno >= handler.level:
                handler.handle(record)


def _handled_elsewhere(logger: logging.Logger) -> bool:
    """Whether a handler other than the plugin's receives the logger's records: its own, or
    an ancestor's the records propagate to."""
    current: logging.Logger | None = logger
    while current is not None:
        if any(not isinstance(h, _ToVllmHandlers) for h in current.handlers):
            return True
        if not current.propagate:
            return False
        current = current.parent
    return False


def attach_to_vllm_logging() -> None:
    """Show moe_policy's events in vLLM's log, formatted by vLLM's handler, when nothing else
    would show them: the application gave neither the ``moe_policy`` logger nor the root
    logger a handler. Propagation is left alone (the records stay stdlib records for any
    handler configured later); the logger's level, when unset, follows vLLM's."""
    logger = logging.getLogger(LOGGER)
    if any(isinstance(h, _ToVllmHandlers) for h in logger.handlers):
        return
    # Layers are built from several threads, each calling this: one of them attaches (two
    # handlers would show every event twice in vLLM's log). No user code runs under the lock.
    with _ATTACH_LOCK:
        if any(isinstance(h, _ToVllmHandlers) for h in logger.handlers):
            return
        vllm_logger = logging.getLogger("vllm")
        if _handled_elsewhere(logger) or not vllm_logger.handlers:
            return
        logger.addHandler(_ToVllmHandlers())
        if logger.level == logging.NOTSET:
            logger.setLevel(vllm_logger.getEffectiveLevel())


_ATTACH_LOCK = threading.Lock()
