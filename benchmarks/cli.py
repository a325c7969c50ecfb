"""``moe-policy explain --json`` wall time (a benchmark, not a test): prints and writes JSON.

Runs the installed console script for the Nemotron H200 dry run (the demo's first step,
as JSON) ``--runs`` times after ``--warmup`` runs, and reports the median wall time with
the 20th/80th percentiles, the CPU time (user + sys) of the child processes, the load
average around the measurement (other work on the machine inflates wall time, not CPU
time) and, from one ``-X importtime`` run, what the imports cost. Target: median <= 300 ms
on the 2-core CI machine.

Usage: python -m benchmarks.cli [--runs 20] [--out FILE]  (default benchmarks/results/cli.json)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.common import at_least, check_out_file, nonnegative_int

REPO = Path(__file__).resolve().parent.parent
MODEL = "configs/models/nemotron-3-nano-30b-a3b.json"
ARGS = (
    "explain",
    "--model",
    MODEL,
    "--platform",
    "cuda",
    "--capability",
    "9.0",
    "--device-name",
    "NVIDIA H200",
    "--json",
)
TARGET_MS = 300.0
#: Top-level imports worth naming in the breakdown.
PACKAGES = (
    "moe_policy",
    "structlog",
    "yaml",
    "tabulate",
    "omegaconf",
    "argparse",
    "json",
    "torch",
    "triton",
)


def _script() -> str:
    found = shutil.which("moe-policy", path=str(Path(sys.executable).parent))
    if found is None:
        sys.exit(f"moe-policy is not installed next to {sys.executable}; run `make setup`")
    return found


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("MOE_POLICY_", "VLLM_"))}


def _one(script: str) -> tuple[float, float]:
    """(wall seconds, child CPU seconds) of one run; fails loudly on a non-zero exit."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run([script, *ARGS], capture_output=True, text=True, cwd=REPO, env=_env())
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        sys.exit(f"moe-policy exited {done.returncode}: {done.stderr}")
    json.loads(done.stdout)  # exactly one JSON document on stdout
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def import_breakdown(script: str) -> dict[str, float]:
    """Cumulative import time (ms) of the top-level packages, from one -X importtime run."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", script, *ARGS],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=_env(),
    )
    out: dict[str, float] = {}
    for line in done.stderr.splitlines():
        if not line.startswith("import time:") or "|" not in line:
            continue
        _self, cumulative, name = (
            part.strip() for part in line.removeprefix("import time:").split("|")
        )
        if name in PACKAGES and cumulative.isdigit():
            out[name] = max(out.get(name, 0.0), int(cumulative) / 1e3)
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def _quantile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main() -> None:
    """Measure, print a short table, write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=at_least(10), default=20)
    parser.add_argument("--warmup", type=nonnegative_int, default=2)
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "cli.json"))
    args = parser.parse_args()
    try:  # written at the end: a path that cannot be written fails before the measurement
        check_out_file(args.out)
    except ValueError as exc:
        parser.error(f"--out: {exc}")
    script = _script()
    import compileall

    compileall.compile_dir(str(REPO / "moe_policy"), quiet=1)
    for _ in range(args.warmup):
        _one(script)
    load_before = os.getloadavg()
    walls, cpus = zip(*(_one(script) for _ in range(args.runs)), strict=True)
    load_after = os.getloadavg()
    result = {
        "command": "moe-policy " + " ".join(f'"{a}"' if " " in a else a for a in ARGS),
        "runs": args.runs,
        "wall_ms": {
            "median": statistics.median(walls) * 1e3,
            "p20": _quantile(list(walls), 0.2) * 1e3,
            "p80": _quantile(list(walls), 0.8) * 1e3,
            "min": min(walls) * 1e3,
        },
        "cpu_ms_median": statistics.median(cpus) * 1e3,
        "target_ms": TARGET_MS,
        "meets_target": statistics.median(walls) * 1e3 <= TARGET_MS,
        "imports_ms": import_breakdown(script),
        "loadavg_1min": {"before": load_before[0], "after": load_after[0]},
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
        },
    }
    w = result["wall_ms"]
    print(f"moe-policy explain --json (Nemotron, H200 dry run), {args.runs} runs")
    print(
        f"  wall   median {w['median']:6.1f} ms   p20 {w['p20']:6.1f}   p80 {w['p80']:6.1f}   min {w['min']:6.1f}"
    )
    print(f"  cpu    median {result['cpu_ms_median']:6.1f} ms (user + sys)")
    print(
        f"  target {TARGET_MS:.0f} ms: {'met' if result['meets_target'] else 'MISSED'}"
        f"   (1-min load average {load_before[0]:.2f} -> {load_after[0]:.2f} on {os.cpu_count()} CPUs)"
    )
    print(
        "  imports (cumulative ms): "
        + ", ".join(f"{k} {v:.0f}" for k, v in result["imports_ms"].items())
    )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"  written to {out.relative_to(REPO) if out.is_relative_to(REPO) else out}")


if __name__ == "__main__":
    main()
