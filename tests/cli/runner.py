"""CLI test helpers: run the installed ``moe-policy`` console script, parse what it prints."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from tests.bundled import NEMOTRON, REPO

#: The console script installed next to this interpreter (the venv's bin directory).
SCRIPT = shutil.which("moe-policy", path=str(Path(sys.executable).parent))
H200 = ("--platform", "cuda", "--capability", "9.0", "--device-name", "NVIDIA H200")
NEMOTRON_REL = os.path.relpath(NEMOTRON, REPO)


@dataclass(frozen=True)
class Run:
    """One finished ``moe-policy`` process."""

    args: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str

    def json(self) -> Any:
        """stdout parsed as exactly one JSON document."""
        return json.loads(self.stdout)

    def events(self) -> list[dict[str, Any]]:
        """stderr's JSON-lines events (lines that are not JSON are left out)."""
        found = []
        for line in self.stderr.splitlines():
            try:
                found.append(json.loads(line))
            except ValueError:
                continue
        return found

    def event_names(self) -> list[str]:
        return [e.get("event", "") for e in self.events()]

    def errors(self) -> list[str]:
        """The stderr lines that are not JSON events (error lines)."""
        return [line for line in self.stderr.splitlines() if line and not line.startswith("{")]


def run_cli(*args: str, env: Mapping[str, str] | None = None, cwd: Path = REPO) -> Run:
    """Run the console script with a clean policy environment plus ``env``."""
    base = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("MOE_POLICY_", "VLLM_")) and k not in ("RANK", "WORLD_SIZE")
    }
    base.update(env or {})
    if SCRIPT is None:
        pytest.fail(f"moe-policy is not installed next to {sys.executable}; run `make setup`")
    done = subprocess.run(
        [SCRIPT, *args],
        capture_output=True,
        text=True,
        env=base,
        cwd=cwd,
        timeout=60,
    )
    return Run(tuple(args), done.returncode, done.stdout, done.stderr)


@cache
def decision_schema() -> dict[str, Any]:
    """The shipped schema, read as package data."""
    from importlib.resources import files

    return json.loads((files("moe_policy") / "schemas" / "decision.v1.json").read_text())


def validate_record(record: Mapping[str, Any]) -> None:
    """Raise if ``record`` is not a valid decision.v1 record."""
    import jsonschema

    jsonschema.Draft202012Validator(decision_schema()).validate(record)


def explain_record(*args: str, env: Mapping[str, str] | None = None) -> tuple[Run, dict[str, Any]]:
    """``moe-policy explain ARGS --json`` that must exit 0: the run and its record,
    schema-checked."""
    run = run_cli("explain", *args, "--json", env=env)
    assert run.returncode == 0, run.stderr
    record = run.json()
    validate_record(record)
    return run, record


def settings_rows(text: str, key: str) -> list[str]:
    """The lines of ``explain``'s Settings table for ``key``: its row and the indented
    ``beat`` lines under it."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"{key} "))
    rows = [lines[start]]
    for line in lines[start + 1 :]:
        if line[:1].strip():
            break
        rows.append(line)
    return rows
