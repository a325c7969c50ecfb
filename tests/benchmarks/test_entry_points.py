"""Every benchmark and tool runs as a module from the repository root (``python -m
benchmarks.kernels``, ``python -m tools.smem_check``), and none of them, nor their tests,
edits ``sys.path`` to find the others."""

from __future__ import annotations

import importlib.util
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
    "benchmarks.vllm_plugin",  # without vLLM too
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


@pytest.mark.parametrize(
    ("module", "flags", "message"),
    [("benchmarks.policy", ["--runs", "0"], "argument --runs: must be at least 1, got '0'"),
     ("benchmarks.policy", ["--out", "{dir}"], "--out: cannot write to '{dir}' (a directory)"),
     ("benchmarks.cli", ["--warmup", "-1"], "argument --warmup: must be at least 0, got '-1'"),
     ("benchmarks.cli", ["--out", "{fifo}"],
      "--out: cannot write to '{fifo}' (not a regular file)"),
     ("benchmarks.plan", ["--runs", "0"], "argument --runs: must be at least 1, got '0'"),
     ("benchmarks.plan", ["--deployments", "961"],
      "--deployments: at most 960 (the different combinations), got 961"),
     ("benchmarks.consistency", ["--calls", "1"], "argument --calls: must be at least 2, got '1'"),
     ("benchmarks.consistency", ["--out", "{file}/x.json"],
      "--out: cannot write to '{file}' (not a directory)"),
     ("benchmarks.vllm_plugin", ["--loads", "0"], "argument --loads: must be at least 1, got '0'"),
     ("benchmarks.vllm_plugin", ["--out", "{dir}"], "--out: cannot write to '{dir}' (a directory)")],
)  # fmt: skip
def test_cpu_benchmarks_check_their_flags_and_out_first(module, flags, message, tmp_path):
    """A count of 0 was a StatisticsError after the measurement (1 call: consistency's
    quantiles), --deployments above the combinations was silently capped, a negative
    --warmup ignored, and an --out that is a directory, a FIFO or under a file failed only
    when the results were written (a traceback; a FIFO would have blocked)."""
    paths = {"dir": tmp_path, "fifo": tmp_path / "fifo", "file": tmp_path / "file"}
    os.mkfifo(paths["fifo"])
    paths["file"].write_text("")
    flags = [f.format(**paths) for f in flags]
    out = subprocess.run([sys.executable, "-m", module, *flags], capture_output=True, text=True,
                         cwd=REPO, timeout=60)  # fmt: skip
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr[-2000:]
    assert out.stderr.strip().splitlines()[-1].endswith(message.format(**paths))


def test_the_vllm_plugin_benchmark_says_it_needs_vllm():
    """Without vLLM (this environment) even --help was a ModuleNotFoundError traceback."""
    if importlib.util.find_spec("vllm") is not None:
        pytest.skip("vLLM is installed")
    out = subprocess.run([sys.executable, "-m", "benchmarks.vllm_plugin", "--loads", "1"],
                         capture_output=True, text=True, cwd=REPO, timeout=60)  # fmt: skip
    assert out.returncode == 2
    assert out.stderr == ("vllm_plugin.py: error: needs vLLM (No module named 'vllm'): run it "
                          "with .venv-vllm/bin/python after make test-vllm\n")  # fmt: skip
