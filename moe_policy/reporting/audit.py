"""JSON-lines audit sink: one line per decision, never deduplicated away.

Each line is one ``os.write`` to a descriptor opened with ``O_APPEND``, so many
processes can share one file without torn or lost lines. Repeats of a decision are
counted (``count``), not dropped. A sink that cannot write returns the failure to
the caller, which warns, or raises when the audit is required.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from collections.abc import Mapping
from typing import Any

from moe_policy.core.decision import Decision
from moe_policy.errors import MoEPolicyError


class AuditWriteError(MoEPolicyError, OSError):
    """The audit line could not be written and the policy requires the audit."""


def rank_info(environ: Mapping[str, str] | None = None) -> tuple[int | None, int | None]:
    """(rank, world size) from torch.distributed when initialised, else RANK/WORLD_SIZE."""
    import sys

    dist = sys.modules.get("torch.distributed")
    try:
        if dist is not None and dist.is_available() and dist.is_initialized():
            return int(dist.get_rank()), int(dist.get_world_size())
    except Exception:  # a half-initialised process group: fall back to the env
        pass
    env = os.environ if environ is None else environ
    try:
        rank = int(env["RANK"]) if "RANK" in env else None
        world = int(env["WORLD_SIZE"]) if "WORLD_SIZE" in env else None
    except ValueError:
        return None, None
    return rank, world


def audit_record(
    decision: Decision, count: int, extra: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The decision record plus timestamp, host, pid, rank, world size and repeat count."""
    import datetime as _dt
    import socket

    rank, world = rank_info()
    record = decision.to_dict()
    record.update(
        {
            "timestamp": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="microseconds"),
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "rank": rank,
            "world_size": world,
            "count": count,
        }
    )
    if extra:
        record.update(extra)
    return record


class AuditSink:
    """Appends records to one file; opened lazily, reopened after a failure."""

    def __init__(self, path: str, required: bool = False) -> None:
        self.path = path
        self.required = required
        self._fd: int | None = None
        self._lock = threading.Lock()
        self.written = 0

    def __repr__(self) -> str:
        return f"AuditSink({self.path!r}, required={self.required})"

    def write(self, record: Mapping[str, Any]) -> OSError | None:
        """Append one line; returns the error instead of raising (the caller decides)."""
        line = (
            json.dumps(record, sort_keys=True, separators=(",", ":"), default=str) + "\n"
        ).encode()
        with self._lock:
            try:
                if self._fd is None:
                    self._fd = os.open(
                        self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644
                    )
                written = os.write(self._fd, line)
                if written != len(line):
                    raise OSError(f"short write: {written} of {len(line)} bytes")
            except OSError as exc:
                self.close_locked()
                return exc
            self.written += 1
            return None

    def close_locked(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None

    def close(self) -> None:
        with self._lock:
            self.close_locked()
