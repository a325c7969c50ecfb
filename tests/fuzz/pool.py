"""Run fuzz cases through worker processes (:mod:`tests.fuzz.worker`) or the console script.

A :class:`Case` is a command line, its environment and the files it names; the pool writes
the files into a fresh directory (the case's working directory), sends the case to a
worker and reads back an :class:`Outcome`. A worker that does not answer in time (stuck
where the interval timer cannot reach) is killed, restarted and the case counted as a hang.
"""

from __future__ import annotations

import json
import os
import resource
import select
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.bundled import REPO

#: Seconds one case may run in a worker before its timer fires (a hang).
CASE_TIMEOUT = 10.0
#: A value every case's environment holds; it must never show up in any output.
SECRET_NAME = "FUZZ_SECRET_TOKEN"
SECRET_VALUE = "fz-7f3a9c1e5b2d"
CONSOLE_SCRIPT = Path(sys.executable).parent / "moe-policy"


@dataclass(frozen=True)
class Case:
    """One command line. ``files`` maps a relative name to its bytes; ``specials`` maps a
    name to a kind of non-regular file (``fifo``, ``dir``, ``symlink:TARGET``, ``hardlink:TARGET``)."""

    kind: str
    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    files: Mapping[str, bytes] = field(default_factory=dict)
    specials: Mapping[str, str] = field(default_factory=dict)
    note: str = ""

    def describe(self) -> str:
        shown = {k: v[:300] for k, v in self.files.items()}
        return (
            f"[{self.kind}] {self.note}\n  argv={list(self.argv)!r}\n  env={dict(self.env)!r}\n"
            f"  files={shown!r}\n  specials={dict(self.specials)!r}"
        )


@dataclass
class Outcome:
    """What one case did: exit code (None: no exit), output, traceback, hang, peak memory."""

    case: Case
    rc: int | None
    stdout: str = ""
    stderr: str = ""
    traceback: str | None = None
    #: ``module.Type at file.py:function`` of an exception that escaped.
    exception: str = ""
    timed_out: bool = False
    peak_kb: int = 0
    seconds: float = 0.0
    fd_leak: int = 0
    #: Files left in the case directory after the run: name -> bytes (audit files).
    left: dict[str, bytes] = field(default_factory=dict)


def clean_environment() -> dict[str, str]:
    """The calling environment without any policy, vLLM or rank variable, plus the secret."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("MOE_POLICY_", "VLLM_", "FUZZ_", "HYPOTHESIS"))
        and k not in ("RANK", "WORLD_SIZE")
    }
    env[SECRET_NAME] = SECRET_VALUE
    env["PYTHONHASHSEED"] = "0"
    return env


def materialize(case: Case, root: Path) -> None:
    """Write the case's files and special files under ``root``."""
    for name, data in case.files.items():
        target = root / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    for name, kind in case.specials.items():
        target = root / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if kind == "fifo":
            os.mkfifo(target)
        elif kind == "dir":
            target.mkdir(exist_ok=True)
        elif kind.startswith("symlink:"):
            target.symlink_to(kind.partition(":")[2])
        elif kind.startswith("hardlink:"):
            os.link(root / kind.partition(":")[2], target)
        else:
            raise ValueError(f"unknown special file kind {kind!r}")


def leftovers(case: Case, root: Path) -> dict[str, bytes]:
    """Regular files under ``root`` that the case did not bring (what the run wrote)."""
    found: dict[str, bytes] = {}
    for path in root.rglob("*"):
        name = str(path.relative_to(root))
        if name in case.files or path.is_symlink() or not path.is_file():
            continue
        with open(path, "rb") as handle:
            found[name] = handle.read(1 << 20)
    return found


class Worker:
    """One ``tests.fuzz.worker`` process; restarted after a hang or a runaway allocation."""

    def __init__(self, memory_mb: int = 2048) -> None:
        self.memory_mb = memory_mb
        self.proc: subprocess.Popen[str] | None = None
        self.restarts = 0

    def start(self) -> None:
        env = clean_environment()
        env["FUZZ_WORKER_AS_MB"] = str(self.memory_mb)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.fuzz.worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            cwd=REPO,
            env=env,
        )
        ready = self._read(60.0)
        if ready is None or not ready.get("ready"):
            raise RuntimeError("the fuzz worker did not start")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None

    def _read(self, timeout: float) -> dict[str, Any] | None:
        assert self.proc is not None and self.proc.stdout is not None
        readable, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not readable:
            return None
        line = self.proc.stdout.readline()
        return json.loads(line) if line else None

    def run(self, case: Case, timeout: float = CASE_TIMEOUT) -> Outcome:
        if self.proc is None or self.proc.poll() is not None:
            self.start()
        assert self.proc is not None and self.proc.stdin is not None
        root = Path(tempfile.mkdtemp(prefix="moe-fuzz-"))
        try:
            materialize(case, root)
            env = {
                k.replace("{dir}", str(root)): v.replace("{dir}", str(root))
                for k, v in case.env.items()
            }
            argv = [arg.replace("{dir}", str(root)) for arg in case.argv]
            request = {"argv": argv, "env": env, "cwd": str(root), "timeout": timeout}
            self.proc.stdin.write(json.dumps(request) + "\n")
            self.proc.stdin.flush()
            answer = self._read(timeout + 20.0)
            if answer is None:  # stuck beyond the timer's reach, or died
                died = self.proc.poll() is not None
                self.stop()
                self.restarts += 1
                return Outcome(
                    case,
                    None,
                    timed_out=not died,
                    traceback="the worker died" if died else None,
                    left=leftovers(case, root),
                )
            if answer.get("restart"):
                self.stop()
                self.restarts += 1
            return Outcome(
                case,
                answer.get("rc"),
                stdout=answer.get("stdout", ""),
                stderr=answer.get("stderr", ""),
                traceback=answer.get("traceback"),
                exception=answer.get("exception", ""),
                timed_out=bool(answer.get("timed_out")),
                peak_kb=int(answer.get("peak_kb", 0)),
                seconds=float(answer.get("seconds", 0.0)),
                fd_leak=int(answer.get("fd_leak", 0)),
                left=leftovers(case, root),
            )
        finally:
            shutil.rmtree(root, ignore_errors=True)


def run_console_script(case: Case, timeout: float = 30.0, memory_mb: int = 1024) -> Outcome:
    """Run the case through the installed console script (a real process): its exit code,
    output and peak resident memory (``wait4``'s rusage)."""
    root = Path(tempfile.mkdtemp(prefix="moe-fuzz-"))
    limit = memory_mb * 1024 * 1024

    def limit_memory() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    try:
        materialize(case, root)
        env = clean_environment()
        env["PYTHONPATH"] = str(REPO)  # this checkout's package, whatever the venv installed
        env.update({k: v.replace("{dir}", str(root)) for k, v in case.env.items()})
        argv = [arg.replace("{dir}", str(root)) for arg in case.argv]
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            proc = subprocess.Popen(
                [str(CONSOLE_SCRIPT), *argv],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                cwd=root,
                env=env,
                preexec_fn=limit_memory,
            )
            started = time.monotonic()
            timed_out = False
            while True:
                pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
                if pid:
                    break
                if time.monotonic() - started > timeout:
                    proc.kill()
                    pid, status, usage = os.wait4(proc.pid, 0)
                    timed_out = True
                    break
                time.sleep(0.01)
            proc.returncode = os.waitstatus_to_exitcode(status)
            out.seek(0)
            err.seek(0)
            stdout = out.read().decode("utf-8", "backslashreplace")
            stderr = err.read().decode("utf-8", "backslashreplace")
        return Outcome(
            case,
            None if timed_out else proc.returncode,
            stdout=stdout,
            stderr=stderr,
            traceback=stderr if "Traceback" in stderr else None,
            timed_out=timed_out,
            peak_kb=int(usage.ru_maxrss),
            seconds=time.monotonic() - started,
            left=leftovers(case, root),
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)
