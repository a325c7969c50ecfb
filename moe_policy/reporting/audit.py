"""JSON-lines audit sink: one line per decision, never deduplicated away.

Each line is one ``os.write`` to a descriptor opened with ``O_APPEND``, so many
processes can share one file; see :class:`AuditSink` for what keeps a record whole when a
writer dies mid-line, the disk fills or the file is rotated. Repeats of a decision are
counted (``count``), not dropped. A sink that cannot write returns the failure to
the caller, which warns, or raises when the audit is required.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
import threading
import weakref
from collections.abc import Mapping
from typing import Any

from moe_policy.core.decision import Decision
from moe_policy.core.state import STATE
from moe_policy.core.values import int_from_text
from moe_policy.errors import MoEPolicyError

#: How often one write reopens a path that was rotated under it before giving up.
_REOPENS = 8


class AuditWriteError(MoEPolicyError, OSError):
    """The audit line could not be written and the policy requires the audit."""

    @classmethod
    def at(cls, path: str, error: BaseException) -> AuditWriteError:
        """The error for the audit log at ``path`` that ``error`` kept from being written."""
        return cls(f"audit log {path!r} could not be written: {error}")


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
    try:  # ASCII decimal digits only: int() also reads "３", " 3" and "1_0"
        rank = int_from_text(env["RANK"], minimum=0) if "RANK" in env else None
        world = int_from_text(env["WORLD_SIZE"], minimum=1) if "WORLD_SIZE" in env else None
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
    """Appends records to one regular file; opened lazily, reopened after a failure or when
    the path is rotated (renamed or deleted) under it.

    A record is whole on disk or visibly absent: each line is one ``O_APPEND`` write, and a
    line that finds the file ending inside a fragment (a writer that died or hit a size limit
    mid-line) starts on a new line, so no record is ever glued onto another. The final path
    component is opened without following a symlink; FIFOs, devices, directories, files with
    several hard links and files that are not JSON lines are refused, never waited on or
    appended to. New files are created 0600.
    """

    def __init__(self, path: str, required: bool = False) -> None:
        self.path = path
        self.required = required
        self._fd: int | None = None
        self._identity: tuple[int, int] | None = None
        #: The process that opened ``_fd``: a forked child opens its own (see _descriptor).
        self._owner = os.getpid()
        self._lock = threading.Lock()
        self.written = 0
        _SINKS.add(self)

    def __repr__(self) -> str:
        return f"AuditSink({self.path!r}, required={self.required})"

    def write(self, record: Mapping[str, Any]) -> OSError | None:
        """Append one line; returns the error instead of raising (the caller decides)."""
        line = (
            json.dumps(record, sort_keys=True, separators=(",", ":"), default=str) + "\n"
        ).encode()
        with self._lock:
            try:
                import fcntl  # POSIX; imported here so the policy path imports anywhere

                # Writers of this file take turns (an advisory lock the kernel drops when a
                # writer dies), so the last byte seen is never another writer's line half
                # copied: a fragment there is a dead or failed write, closed off first.
                fd = self._locked_descriptor(fcntl)
                try:
                    if _ends_inside_a_line(fd):
                        line = b"\n" + line
                    written = os.write(fd, line)
                    if written != len(line):
                        self._terminate(fd)
                        raise OSError(f"short write: {written} of {len(line)} bytes")
                finally:
                    fcntl.flock(fd, fcntl.LOCK_UN)
            except OSError as exc:
                self.close_locked()
                return exc
            self.written += 1
            return None

    def check(self) -> OSError | None:
        """Open the file now (as a write would), without writing: the error, or None."""
        with self._lock:
            try:
                self._descriptor()
            except OSError as exc:
                self.close_locked()
                return exc
            return None

    def _locked_descriptor(self, fcntl: Any) -> int:
        """The descriptor, locked, of the file the path names once the lock is held.

        The path is checked again after the lock is taken: a file rotated or deleted while
        this writer waited (an operator archives the log under the same lock, then removes
        it) would otherwise receive a line nobody will read.
        """
        for _ in range(_REOPENS):
            fd = self._descriptor()
            fcntl.flock(fd, fcntl.LOCK_EX)
            if not self._rotated():
                return fd
            self.close_locked()  # closing drops the lock
        raise OSError(errno.EAGAIN, f"the file was replaced {_REOPENS} times while being opened")

    def _descriptor(self) -> int:
        """The open descriptor, reopened when the path now names another file (rotation)
        and in a forked child: a descriptor inherited across ``fork`` shares its lock with
        the parent, so parent and child would not take turns."""
        if self._fd is not None and self._owner != os.getpid():
            self._forget_inherited()
        if self._fd is not None and self._rotated():
            self.close_locked()
        if self._fd is None:
            self._fd, self._identity = _open_audit_file(self.path)
            self._owner = os.getpid()
        return self._fd

    def _forget_inherited(self) -> None:
        """In a forked child: close the parent's descriptor copy and start a new lock (one
        held by another thread at the fork would never be released here)."""
        self._lock = threading.Lock()
        self.close_locked()
        self._owner = os.getpid()

    def _rotated(self) -> bool:
        try:
            st = os.stat(self.path, follow_symlinks=False)
        except FileNotFoundError:
            return True
        return (st.st_dev, st.st_ino) != self._identity

    @staticmethod
    def _terminate(fd: int) -> None:
        """End a partly written line, so the next record starts clean (best effort)."""
        with contextlib.suppress(OSError):
            os.write(fd, b"\n")

    def close_locked(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None
            self._identity = None

    def close(self) -> None:
        with self._lock:
            self.close_locked()


#: Every live sink, so a forked child can give each its own lock and descriptor.
_SINKS: weakref.WeakSet[AuditSink] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for sink in list(_SINKS):
        sink._forget_inherited()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _open_audit_file(path: str) -> tuple[int, tuple[int, int]]:
    """Open ``path`` for appending, refusing what is not a private, regular JSON-lines file."""
    # Read-write: the last byte tells whether a fragment needs closing before a new line.
    flags = os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_NONBLOCK
    if "\0" in path:  # os.open raises ValueError, which no caller expects from a sink
        raise OSError(errno.EINVAL, "the path contains a NUL byte")
    try:
        fd = os.open(path, flags, 0o600)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise OSError(
                exc.errno, "is a symbolic link; the audit does not follow links"
            ) from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, "is not a regular file (FIFO, device or directory)")
        if st.st_nlink > 1:
            raise OSError(
                errno.EMLINK, f"has {st.st_nlink} hard links; the audit writes only its own file"
            )
        if st.st_size and os.pread(fd, 1, 0) not in (b"{", b"\n"):
            raise OSError(errno.EINVAL, "does not hold JSON lines; refusing to append to it")
        os.set_blocking(fd, True)
    except OSError:
        os.close(fd)
        raise
    return fd, (st.st_dev, st.st_ino)


def _ends_inside_a_line(fd: int) -> bool:
    size = os.fstat(fd).st_size
    return size > 0 and os.pread(fd, 1, size - 1) != b"\n"


def audit_sink(path: str, required: bool = False) -> AuditSink:
    """The process's sink for ``path``: selectors writing one file share one descriptor,
    which ``moe_policy.reset()`` closes."""
    key = (path, required)
    with STATE.audit_lock:
        sink: AuditSink | None = STATE.audit_sinks.get(key)
        if sink is None:
            sink = STATE.audit_sinks[key] = AuditSink(path, required)
    return sink
