"""The plugin's entry points from several threads (vLLM builds layers from more than one).

Races are lined up with events; join timeouts only turn a deadlock into a failure.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from moe_policy.integrations.vllm import plugin
from tests.threads import JOIN, SignallingLock


def test_two_threads_attaching_to_vllms_logging_at_once_attach_one_handler(monkeypatch):
    """Every layer build attaches the plugin's handler when it is missing; two builds at once
    attach one, so each event appears once in vLLM's log."""
    moe_logger, vllm_logger = logging.getLogger("moe_policy"), logging.getLogger("vllm")
    monkeypatch.setattr(moe_logger, "handlers", [])
    monkeypatch.setattr(moe_logger, "propagate", True)
    monkeypatch.setattr(moe_logger, "level", logging.NOTSET)
    monkeypatch.setattr(logging.getLogger(), "handlers", [])
    monkeypatch.setattr(vllm_logger, "handlers", [logging.NullHandler()])
    lock = SignallingLock()
    monkeypatch.setattr(plugin, "_ATTACH_LOCK", lock)
    first_inside = threading.Event()
    real = plugin._handled_elsewhere

    def held(logger: Any) -> bool:
        if not first_inside.is_set():  # the first thread, under the lock: wait for the second
            first_inside.set()
            assert lock.contended.wait(JOIN)
        return real(logger)

    monkeypatch.setattr(plugin, "_handled_elsewhere", held)
    threads = [threading.Thread(target=plugin.attach_to_vllm_logging, daemon=True)]
    threads[0].start()
    assert first_inside.wait(JOIN)
    threads.append(threading.Thread(target=plugin.attach_to_vllm_logging, daemon=True))
    threads[1].start()
    for thread in threads:
        thread.join(JOIN)
    assert not any(thread.is_alive() for thread in threads)
    assert sum(isinstance(h, plugin._ToVllmHandlers) for h in moe_logger.handlers) == 1
