"""Every benchmark and tool runs as a module from the repository root (``python -m
benchmarks.kernels``, ``python -m tools.smem_check``), and none of them, nor their tests,
edits ``sys.path`` to find the others."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ENTRY_POINTS = [
    "benchmarks.policy",
    "benchmarks.cli",
    "benchmarks.plan",
    "benchmarks.consistency",
    "benchmarks.kernels",
    "benchmarks.vs_vllm",
    "tools.tune_triton",
    "tools.compare_configs",
    "tools.smem_check",
    "tools.ptx_report",
]


@pytest.mark.parametrize("module", ENTRY_POINTS)
def test_help_runs_as_a_module_from_the_repository_root(module):
    out = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True,
                         text=True, cwd=REPO, timeout=120)  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.startswith("usage: ")


def test_nothing_edits_sys_path():
    folders = ["benchmarks", "tools", "tests/benchmarks", "tests/tools"]
    found = [
        f"{path}:{n}"
        for folder in folders
        for path in sorted((REPO / folder).rglob("*.py"))
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if "sys.path" in line and path != Path(__file__)
    ]
    assert not found, found
    assert all(os.path.exists(REPO / f / "__init__.py") for f in ("benchmarks", "tools"))


@pytest.mark.parametrize(
    ("module", "flags", "keys"),
    [("benchmarks.policy", ["--runs", "2"], {"import_ms", "cached_select_us"}),
     ("benchmarks.cli", ["--runs", "10", "--warmup", "0"], {"wall_ms", "meets_target"})],
)  # fmt: skip
def test_cpu_benchmarks_run_and_write_their_json(module, flags, keys, tmp_path):
    """The CPU benchmarks of ``make bench`` run against the package as it is (a short run;
    not a measurement) and write their JSON where ``--out`` says."""
    import json

    path = tmp_path / "out.json"
    done = subprocess.run([sys.executable, "-m", module, *flags, "--out", str(path)],
                          capture_output=True, text=True, cwd=REPO, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert keys <= set(json.loads(path.read_text()))
