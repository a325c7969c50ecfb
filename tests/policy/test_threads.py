"""Selections from several threads (an API server, a loader pool) and across ``fork``.

Each race is lined up with events, never with sleeps: a thread is held inside the library
until the other has reached the point that matters. Join timeouts only turn a deadlock into
a failure.
"""

from __future__ import annotations

import os
import signal
import threading
from typing import Any

import pytest

import moe_policy
import moe_policy.api as api
from moe_policy import override_platform
from moe_policy.core.platform import PlatformFacts, current_platform
from tests.bundled import NEMOTRON
from tests.threads import JOIN, SignallingLock

H200 = {"platform": "cuda", "capability": "9.0", "device_name": "NVIDIA H200"}


def _start(target: Any) -> tuple[threading.Thread, list[Any]]:
    out: list[Any] = []
    thread = threading.Thread(target=lambda: out.append(target()), daemon=True)
    thread.start()
    return thread, out


def _held_selector() -> tuple[Any, threading.Event, threading.Event]:
    """A selector whose triton check, in any thread but this one, sets ``inside`` and waits
    for ``release``: that thread holds the selector's lock while it decides."""
    first = threading.current_thread()
    inside, release = threading.Event(), threading.Event()

    def check(values: Any) -> tuple[bool, None]:
        if threading.current_thread() is not first:
            inside.set()
            assert release.wait(JOIN)
        return True, None

    selector = moe_policy.Selector(NEMOTRON, environ={}, extra_checks={"triton": check}, **H200)
    return selector, inside, release


def test_one_layer_asked_by_two_threads_at_once_is_one_decision():
    """The second thread waits while the first decides, then takes the first's decision (one
    decision id per layer, as in one thread), not a second copy."""
    selector, inside, release = _held_selector()
    lock = selector._lock = SignallingLock(threading.RLock)  # type: ignore[assignment]
    a, a_out = _start(lambda: selector.decide(7))
    assert inside.wait(JOIN)
    lock.holder = a
    b, b_out = _start(lambda: selector.decide(7))
    assert lock.contended.wait(JOIN)
    release.set()
    a.join(JOIN)
    b.join(JOIN)
    assert not a.is_alive() and not b.is_alive()
    assert a_out[0] is b_out[0]
    assert selector.decide(7) is a_out[0]
    assert selector.resolver.resolutions == 1


def test_a_platform_pinned_by_another_thread_meanwhile_is_not_cached_unpinned(monkeypatch):
    """``override_platform`` pins the platform for the whole process while its block runs; a
    selector whose build started unpinned keeps the probed platform and is cached as such, so
    the pin never outlives the block."""
    probed = current_platform()
    pinned = PlatformFacts("rocm", "9.4", "pinned by another thread", ("torch",), origin="test")
    assert probed.device_name != pinned.device_name
    building, pin_set = threading.Event(), threading.Event()
    real = api.resolve_settings
    first = threading.current_thread()

    def held_resolve_settings(*args: Any, **kwargs: Any) -> Any:
        if threading.current_thread() is not first:
            building.set()
            assert pin_set.wait(JOIN)
        return real(*args, **kwargs)

    monkeypatch.setattr(api, "resolve_settings", held_resolve_settings)
    builder, out = _start(lambda: moe_policy.explain(NEMOTRON, max_loras=3))
    assert building.wait(JOIN)
    with override_platform(pinned):
        pin_set.set()
        builder.join(JOIN)
        assert not builder.is_alive()
        assert out[0].context.values["device.name"] == probed.device_name
    after = moe_policy.explain(NEMOTRON, max_loras=3)
    assert after.context.values["device.name"] == probed.device_name


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_decides_with_a_selector_another_thread_was_deciding_with():
    """A thread of the parent holds a cached selector's lock (deciding a layer) at the fork:
    the child, a new process, still decides with that selector."""
    selector, inside, release = _held_selector()
    builder, _ = _start(lambda: selector.decide(layer_kind="draft"))
    try:
        assert inside.wait(JOIN)
        pid = os.fork()
        if pid == 0:  # the child: a deadlock becomes SIGALRM, anything else exits 1
            code = 1
            try:
                signal.alarm(JOIN)
                code = 0 if selector.decide(layer_kind="mtp").backend == "triton" else 1
            finally:
                os._exit(code)
    finally:
        release.set()
        builder.join(JOIN)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
