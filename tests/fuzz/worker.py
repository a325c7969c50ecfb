"""A fuzz worker: runs many ``moe-policy`` command lines in one process, one at a time.

Started as ``python -m tests.fuzz.worker`` by :mod:`tests.fuzz.pool`. Each request is one
JSON line on stdin (``argv``, ``env``, ``cwd``, ``timeout``); each answer one JSON line on
the descriptor the worker was started with as stdout. A case runs ``moe_policy.cli.main``
in process, exactly as the console script does, with:

- the environment replaced by the worker's clean base plus the case's variables;
- stdout and stderr captured (stdout strict UTF-8, stderr backslash-escaped, as Python sets
  them up for a console script in a UTF-8 locale);
- an interval timer that interrupts the case (a hang, e.g. a blocking open);
- its peak resident memory, measured by resetting the kernel's high-water mark before it;
- ``moe_policy.reset()`` afterwards, and the open descriptors counted before and after.

An exception that escapes ``main`` is a traceback the console script would have printed.
The address-space limit (``FUZZ_WORKER_AS_MB``) turns a runaway allocation into a
``MemoryError`` instead of swapping the machine.
"""

from __future__ import annotations

import io
import json
import os
import resource
import signal
import sys
import time
import traceback
from typing import Any


class CaseTimeout(BaseException):
    """Raised by the interval timer: the case ran past its time (not an ``Exception``, so
    the code under test cannot swallow it)."""


class Capture(io.TextIOWrapper):
    """A text stream over a byte buffer that is emptied between cases."""

    def __init__(self, errors: str) -> None:
        super().__init__(io.BytesIO(), encoding="utf-8", errors=errors, write_through=True)

    def isatty(self) -> bool:
        return False

    def take(self) -> str:
        self.flush()
        raw = self.buffer
        assert isinstance(raw, io.BytesIO)
        data = raw.getvalue()
        raw.seek(0)
        raw.truncate()
        return data.decode("utf-8", errors="backslashreplace")


def _on_alarm(_signum: int, _frame: Any) -> None:
    raise CaseTimeout


def peak_kb() -> int:
    """This process's resident high-water mark (VmHWM) in KiB."""
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def reset_peak() -> None:
    """Reset the kernel's resident high-water mark, so the next reading is one case's peak."""
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as refs:
            refs.write("5")
    except OSError:
        pass


def raised_at(exc: BaseException) -> str:
    """``module.py:function`` of the innermost moe_policy frame the exception passed."""
    where = "?"
    for frame, _line in traceback.walk_tb(exc.__traceback__):
        filename = frame.f_code.co_filename
        if "moe_policy" in filename:
            where = f"{filename.rpartition('moe_policy')[2].lstrip('/')}:{frame.f_code.co_name}"
    return where


def open_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


def run_case(
    request: dict[str, Any], base_env: dict[str, str], out: Capture, err: Capture
) -> dict[str, Any]:
    """Run one command line in process and describe what happened."""
    import moe_policy
    from moe_policy.cli.app import main

    os.environ.clear()
    os.environ.update(base_env)
    os.environ.update(request.get("env") or {})
    os.chdir(request["cwd"])
    fds_before = open_descriptors()
    result: dict[str, Any] = {"rc": None, "traceback": None, "timed_out": False}
    reset_peak()
    started = time.monotonic()
    signal.setitimer(signal.ITIMER_REAL, float(request.get("timeout", 10)))
    try:
        result["rc"] = main(list(request["argv"]))
    except CaseTimeout:
        result["timed_out"] = True
    except SystemExit as exc:  # argparse (errors, --help, --version)
        code = exc.code
        result["rc"] = code if isinstance(code, int) else (0 if code is None else 1)
        if code is not None and not isinstance(code, int):
            err.write(f"{code}\n")
    except BaseException as exc:  # the traceback the console script would print
        result["traceback"] = "".join(traceback.format_exception(exc))
        result["exception"] = f"{type(exc).__module__}.{type(exc).__qualname__} at {raised_at(exc)}"
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    result["seconds"] = time.monotonic() - started
    result["peak_kb"] = peak_kb()
    try:
        moe_policy.reset()
    except BaseException as exc:
        result["traceback"] = result["traceback"] or "".join(traceback.format_exception(exc))
    result["fd_leak"] = open_descriptors() - fds_before
    result["stdout"] = out.take()
    result["stderr"] = err.take()
    return result


def serve() -> None:
    """Answer requests until stdin closes."""
    # Cases change the working directory: imports must not follow it.
    sys.path[:] = [os.path.abspath(p or os.curdir) for p in sys.path]
    limit = int(os.environ.get("FUZZ_WORKER_AS_MB", "2048")) * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    answers = os.fdopen(os.dup(sys.stdout.fileno()), "w", encoding="utf-8")
    requests = sys.stdin
    # Anything written below Python's streams (a C library) goes nowhere.
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    os.close(devnull)
    out, err = Capture("strict"), Capture("backslashreplace")
    sys.stdout, sys.stderr = out, err
    signal.signal(signal.SIGALRM, _on_alarm)
    base_env = dict(os.environ)
    import moe_policy.cli.app  # noqa: F401  (imported once, before the first case is timed)

    answers.write(json.dumps({"ready": True, "pid": os.getpid()}) + "\n")
    answers.flush()
    for line in requests:
        request = json.loads(line)
        try:
            result = run_case(request, base_env, out, err)
        except MemoryError:
            result = {"rc": None, "traceback": "MemoryError outside the case", "restart": True}
        if result.get("traceback", "") and "MemoryError" in (result["traceback"] or ""):
            result["restart"] = True
        answers.write(json.dumps(result) + "\n")
        answers.flush()


if __name__ == "__main__":
    serve()
