"""The vLLM general plugin: vLLM's unquantized MoE selection goes through the policy.

Registered in the ``vllm.general_plugins`` entry-point group as ``moe_policy``; vLLM loads
it in every process (select or exclude it with ``VLLM_PLUGINS``). :func:`register` puts
:func:`moe_policy.integrations.vllm.selection.select_unquantized_moe_backend` where
``UnquantizedFusedMoEMethod`` looks its selector up (and in the oracle module, for direct
callers); a second call changes nothing. A vLLM release no profile describes fails here,
at plugin load, with the list of known profiles.
"""

from __future__ import annotations

import logging
from typing import Any

#: Marks the functions this plugin installed (idempotent registration).
MARK = "__moe_policy_selector__"
LOGGER = "moe_policy"


def _install(module: Any, replacement: Any) -> None:
    if getattr(module.select_unquantized_moe_backend, MARK, False):
        return
    module.select_unquantized_moe_backend = replacement


def register() -> None:
    """Route vLLM's unquantized MoE backend selection through the policy (idempotent)."""
    from vllm.model_executor.layers.fused_moe import unquantized_fused_moe_method
    from vllm.model_executor.layers.fused_moe.oracle import unquantized

    from moe_policy.integrations.vllm import selection

    selection.engine_profile()  # this vLLM release must have a profile
    select = _routed(selection.select_unquantized_moe_backend)
    _install(unquantized_fused_moe_method, select)
    _install(unquantized, select)


def _routed(select: Any) -> Any:
    def select_unquantized_moe_backend(moe_config: Any) -> Any:
        attach_to_vllm_logging()
        return select(moe_config)

    setattr(select_unquantized_moe_backend, MARK, True)
    select_unquantized_moe_backend.__doc__ = select.__doc__
    return select_unquantized_moe_backend


class _ToVllmHandlers(logging.Handler):
    """Hands ``moe_policy`` records to the handlers vLLM configured on its ``vllm`` logger."""

    def emit(self, record: logging.LogRecord) -> None:
        for handler in logging.getLogger("vllm").handlers:
            if record.levelno >= handler.level:
                handler.handle(record)


def attach_to_vllm_logging() -> None:
    """Show moe_policy's events in vLLM's log, formatted by vLLM's handler, unless the
    application already gave the ``moe_policy`` logger handlers of its own."""
    logger = logging.getLogger(LOGGER)
    if logger.handlers or not logging.getLogger("vllm").handlers:
        return
    logger.addHandler(_ToVllmHandlers())
    if logger.level == logging.NOTSET:
        logger.setLevel(logging.INFO)
    logger.propagate = False
