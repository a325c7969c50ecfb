"""Run the installed ``moe-policy`` in a pseudo-terminal of a given size, as a person does."""

from __future__ import annotations

import fcntl
import os
import select
import struct
import subprocess
import termios
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.bundled import REPO
from tests.cli.runner import SCRIPT

ESCAPE = "\x1b["


@dataclass(frozen=True)
class TerminalRun:
    """One finished ``moe-policy`` process whose stdout and stderr were a terminal."""

    returncode: int
    output: str  # stdout and stderr as the terminal showed them, newlines as "\n"

    @property
    def lines(self) -> list[str]:
        return self.output.splitlines()


def run_in_terminal(
    *args: str,
    columns: int,
    env: Mapping[str, str] | None = None,
    cwd: Path = REPO,
    rows: int = 50,
) -> TerminalRun:
    """Run the console script with its stdout and stderr on a ``columns``-wide terminal.

    The policy environment is clean, ``COLUMNS``/``LINES`` are unset (the width comes from
    the terminal) and ``TERM`` is ``xterm``, plus ``env``.
    """
    if SCRIPT is None:
        pytest.fail("moe-policy is not installed next to this interpreter; run `make setup`")
    environ = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("MOE_POLICY_", "VLLM_"))
        and k not in ("COLUMNS", "LINES", "NO_COLOR", "FORCE_COLOR", "RANK", "WORLD_SIZE")
    }
    environ["TERM"] = "xterm"
    environ.update(env or {})
    primary, secondary = os.openpty()
    fcntl.ioctl(secondary, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))
    try:
        process = subprocess.Popen(
            [SCRIPT, *args],
            stdin=secondary,
            stdout=secondary,
            stderr=secondary,
            env=environ,
            cwd=cwd,
            close_fds=True,
        )
    finally:
        os.close(secondary)
    chunks: list[bytes] = []
    try:
        while True:
            ready, _, _ = select.select([primary], [], [], 60)
            if not ready:
                process.kill()
                pytest.fail(f"moe-policy {' '.join(args)} printed nothing for 60 s")
            try:
                chunk = os.read(primary, 65536)
            except OSError:  # EIO: every writer closed the terminal
                break
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(primary)
    returncode = process.wait(timeout=60)
    text = b"".join(chunks).decode("utf-8", errors="replace").replace("\r\n", "\n")
    return TerminalRun(returncode, text)
