"""Thread-test helpers: a lock that tells when a second thread starts waiting for it."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

JOIN = 30  # seconds: only ever reached by a deadlock


class SignallingLock:
    """Wraps a lock (``threading.Lock`` by default, or ``RLock``) and sets ``contended`` when a
    thread other than ``holder`` starts waiting for it; ``holder`` is the last thread to take
    it (a test may set it, when the holder took the lock before the wrapper was installed)."""

    def __init__(self, factory: Callable[[], Any] = threading.Lock) -> None:
        self._lock = factory()
        self.holder: threading.Thread | None = None
        self.contended = threading.Event()

    def __enter__(self) -> None:
        if self.holder is not None and threading.current_thread() is not self.holder:
            self.contended.set()
        self._lock.acquire()
        self.holder = threading.current_thread()

    def __exit__(self, *exc: object) -> None:
        self._lock.release()
