"""Policy-path timings (a benchmark, not a test): prints a table and writes JSON.

* import: ``import moe_policy`` in a fresh interpreter (torch/triton must stay unimported)
* first decision, cold: a fresh interpreter's first ``select`` (YAML loads, lazy imports; structlog is
  imported and silenced before the clock starts)
* first decision, warm deps: YAML loading + merge + resolution with omegaconf/structlog imported
* cached per-layer selection: ``Selector.select`` for a layer already decided
* new layer, same signature: ``Selector.select`` for a new index (fingerprint + relabel)
* module-level ``select_backend`` with identical arguments

Usage: python -m benchmarks.policy [--runs 15] [--out FILE]  (default benchmarks/results/policy.json)
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.common import check_out_file, positive_int

REPO = Path(__file__).resolve().parent.parent
MODEL = str(REPO / "configs/models/nemotron-3-nano-30b-a3b.json")
DRY = dict(platform="cuda", capability="9.0", device_name="NVIDIA H200")

IMPORT_SNIPPET = (
    "import sys, time; t = time.perf_counter(); import moe_policy; "
    "dt = time.perf_counter() - t; "
    "print(dt, int('torch' in sys.modules or 'triton' in sys.modules))"
)
COLD_SNIPPET = f"""
import time, structlog
structlog.configure(logger_factory=structlog.ReturnLoggerFactory())
t = time.perf_counter()
import moe_policy
moe_policy.select_backend({MODEL!r}, **{DRY!r})
print(time.perf_counter() - t)
"""


def _fresh(snippet: str) -> list[str]:
    out = subprocess.run(
        [sys.executable, "-c", snippet], capture_output=True, text=True, check=True, cwd=REPO
    )
    return out.stdout.split()


def _median_ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(REPO / "benchmarks/results/policy.json"))
    parser.add_argument("--runs", type=positive_int, default=15)
    args = parser.parse_args()
    try:  # written at the end: a path that cannot be written fails before the measurement
        check_out_file(args.out)
    except ValueError as exc:
        parser.error(f"--out: {exc}")

    imports = [_fresh(IMPORT_SNIPPET) for _ in range(args.runs)]
    import_ms = _median_ms([float(s[0]) for s in imports])
    heavy = any(s[1] == "1" for s in imports)
    cold_ms = _median_ms([float(_fresh(COLD_SNIPPET)[0]) for _ in range(args.runs)])

    import omegaconf  # noqa: F401  (warm the lazy imports for the in-process numbers)
    import structlog

    structlog.configure(logger_factory=structlog.ReturnLoggerFactory())
    import moe_policy
    from moe_policy.api import Selector, explicit_entries
    from moe_policy.core.origin import Origin

    explicit = explicit_entries(DRY, None, Origin.api())
    first = []
    for _ in range(args.runs):
        moe_policy.reset()  # the parsed catalog too
        t = time.perf_counter()
        Selector(MODEL, explicit=explicit, environ={}).select(0)
        first.append(time.perf_counter() - t)
    selector = Selector(MODEL, explicit=explicit, environ={})
    selector.select(5)
    n = 100_000
    t = time.perf_counter()
    for _ in range(n):
        selector.select(5)
    cached_us = (time.perf_counter() - t) / n * 1e6
    layers = 2_000
    t = time.perf_counter()
    for i in range(100, 100 + layers):
        selector.select(i)
    new_layer_us = (time.perf_counter() - t) / layers * 1e6
    moe_policy.select_backend(MODEL, **DRY)
    calls = 20_000
    t = time.perf_counter()
    for _ in range(calls):
        moe_policy.select_backend(MODEL, **DRY)
    module_us = (time.perf_counter() - t) / calls * 1e6

    rows = [
        (
            "import moe_policy (fresh interpreter)",
            f"{import_ms:.1f} ms",
            "<= 150 ms",
            import_ms <= 150,
        ),
        ("torch/triton imported by it", str(heavy), "False", not heavy),
        (
            "first decision, fresh interpreter (moe_policy + omegaconf imports; structlog pre-imported)",
            f"{cold_ms:.1f} ms",
            "-",
            None,
        ),
        (
            "first decision, YAML load + resolve (deps imported)",
            f"{_median_ms(first):.2f} ms",
            "<= 20 ms",
            _median_ms(first) <= 20,
        ),
        (
            "cached per-layer selection (Selector.select)",
            f"{cached_us:.2f} us",
            "<= 5 us",
            cached_us <= 5,
        ),
        ("new layer, same signature (fingerprint + relabel)", f"{new_layer_us:.1f} us", "-", None),
        ("select_backend(), same arguments", f"{module_us:.1f} us", "-", None),
    ]
    width = max(len(r[0]) for r in rows)
    print(f"{'measure'.ljust(width)}  {'value':>10}  {'target':>10}  met")
    for name, value, target, met in rows:
        print(
            f"{name.ljust(width)}  {value:>10}  {target:>10}  {'' if met is None else ('yes' if met else 'NO')}"
        )
    result = {
        "machine": {
            "python": sys.version.split()[0],
            "platform": platform.platform(),
            "cpu_count": __import__("os").cpu_count(),
        },
        "runs": args.runs,
        "import_ms": import_ms,
        "heavy_imported": heavy,
        "first_decision_cold_ms": cold_ms,
        "first_decision_warm_deps_ms": _median_ms(first),
        "cached_select_us": cached_us,
        "new_layer_same_signature_us": new_layer_us,
        "select_backend_same_args_us": module_us,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
