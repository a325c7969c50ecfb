"""Cost of the cross-rank agreement check: 128 MoE layers on 4 gloo ranks (a benchmark, not a test).

Each rank decides 128 layers (Qwen3-30B-A3B on a dry-run B200), then calls
``check_agreement`` after a barrier, 3 warm-up calls and ``--calls`` timed ones.
One call's time is the slowest rank's (every rank leaves the collective together).
Cases: ``shared`` (layers share one fingerprint, the usual case) and ``distinct``
(a rule on ``layer.index`` gives every layer its own fingerprint: the largest summary).
Also timed: the bare ``all_gather_object`` of the same summary, so the comparison's
own cost shows. Target: median of the shared case <= 50 ms on the 2-core CI machine.

Usage: python -m benchmarks.consistency [--calls 20] [--out FILE]  (default benchmarks/results/consistency.json)
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pickle
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import at_least, check_out_file

REPO = Path(__file__).resolve().parent.parent
MODEL = str(REPO / "configs/models/qwen3-30b-a3b.json")
LAYERS = 128
WORLD = 4
WARMUP = 3
TARGET_MS = 50.0
DISTINCT_RULE = (
    "rules:\n  - {id: per-layer, when: {layer.index: {ge: 0}}, effect: prefer, "
    "backends: [flashinfer_trtllm], reason: every layer its own fingerprint}\n"
)


def _decisions(policy: str | None) -> list[Any]:
    from moe_policy import PlatformFacts, Selector

    sel = Selector(
        MODEL,
        environ={},
        policy_files=[policy] if policy else None,
        platform=PlatformFacts("cuda", "10.0", "NVIDIA B200", ("flashinfer", "torch", "triton")),
    )
    return [sel.decide(i) for i in range(LAYERS)]


def _timed(fn: Any, calls: int) -> list[float]:
    import torch.distributed as dist

    samples = []
    for i in range(WARMUP + calls):
        dist.barrier()
        start = time.perf_counter()
        fn()
        if i >= WARMUP:
            samples.append(time.perf_counter() - start)
    return samples


def worker(rank: int, init_file: str, out: str, calls: int, policy: str) -> None:
    """One rank: decide, time check_agreement and the bare gather, gather the samples to rank 0."""
    import structlog
    import torch.distributed as dist

    from moe_policy import distributed as agreement

    structlog.configure(logger_factory=structlog.ReturnLoggerFactory())
    dist.init_process_group(
        "gloo",
        init_method=f"file://{init_file}",
        rank=rank,
        world_size=WORLD,
        timeout=datetime.timedelta(seconds=60),
    )
    cases: dict[str, Any] = {}
    for case, policy_file in (("shared", None), ("distinct", policy)):
        decisions = _decisions(policy_file)
        summary = agreement.rank_summary(decisions, rank=rank, host="h", mode=None)
        gathered: list[Any] = [None] * WORLD
        cases[case] = {
            "check_agreement": _timed(lambda d=decisions: agreement.check_agreement(d), calls),
            "all_gather_object": _timed(
                lambda s=summary, g=gathered: dist.all_gather_object(g, s), calls
            ),
            "summary_bytes": len(pickle.dumps(summary)),
            "fingerprints": len({layer[2] for layer in summary["layers"]}),
            "inputs_entries": len(summary["inputs"]),
        }
    everyone: list[Any] = [None] * WORLD
    dist.all_gather_object(everyone, cases)
    if rank == 0:
        Path(out).write_text(json.dumps(everyone))
    dist.destroy_process_group()


def _stats(per_rank: list[list[float]]) -> dict[str, float]:
    slowest = [max(call) * 1e3 for call in zip(*per_rank, strict=True)]
    q = statistics.quantiles(slowest, n=10)
    return {
        "median_ms": round(statistics.median(slowest), 3),
        "p20_ms": round(q[1], 3),
        "p80_ms": round(q[7], 3),
        "min_ms": round(min(slowest), 3),
        "max_ms": round(max(slowest), 3),
    }


def main() -> None:
    """Spawn the ranks, print the table, write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=at_least(2), default=20,
                        help="timed calls per case (at least 2: their p20 and p80 are kept)")  # fmt: skip
    parser.add_argument("--out", default=str(REPO / "benchmarks/results/consistency.json"))
    args = parser.parse_args()
    try:  # written at the end: a path that cannot be written fails before the ranks start
        check_out_file(args.out)
    except ValueError as exc:
        parser.error(f"--out: {exc}")
    try:
        import torch
        import torch.multiprocessing as mp
    except ImportError:
        parser.exit(2, f"{parser.prog}: error: the ranks run torch.distributed: pip install "
                       "'moe-policy[kernels]'\n")  # fmt: skip

    with tempfile.TemporaryDirectory() as tmp:
        policy = Path(tmp) / "per-layer.yaml"
        policy.write_text(DISTINCT_RULE)
        raw = Path(tmp) / "samples.json"
        mp.start_processes(
            worker,
            args=(str(Path(tmp) / "rendezvous"), str(raw), args.calls, str(policy)),
            nprocs=WORLD,
            start_method="spawn",
        )
        per_rank = json.loads(raw.read_text())
    result: dict[str, Any] = {
        "benchmark": "check_agreement",
        "backend": "gloo",
        "ranks": WORLD,
        "layers": LAYERS,
        "calls": args.calls,
        "warmup": WARMUP,
        "target_ms": TARGET_MS,
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "platform": platform.platform(),
            "load_average_1m": round(os.getloadavg()[0], 2),
        },  # other work skews gloo timings
        "cases": {},
    }
    print(
        f"check_agreement, {LAYERS} layers, {WORLD} gloo ranks, median of {args.calls} calls (slowest rank)"
    )
    print(
        f"{'case':<10}{'fingerprints':>13}{'summary B':>11}{'check ms':>10}{'p20-p80':>16}{'gather ms':>11}"
    )
    for case in ("shared", "distinct"):
        check = _stats([r[case]["check_agreement"] for r in per_rank])
        gather = _stats([r[case]["all_gather_object"] for r in per_rank])
        first = per_rank[0][case]
        result["cases"][case] = {
            "check_agreement": check,
            "all_gather_object": gather,
            "summary_bytes": first["summary_bytes"],
            "fingerprints": first["fingerprints"],
            "inputs_entries": first["inputs_entries"],
        }
        print(
            f"{case:<10}{first['fingerprints']:>13}{first['summary_bytes']:>11}{check['median_ms']:>10.2f}"
            f"{check['p20_ms']:>8.2f}-{check['p80_ms']:<7.2f}{gather['median_ms']:>11.2f}"
        )
    result["median_ms"] = result["cases"]["shared"]["check_agreement"]["median_ms"]
    result["within_target"] = result["median_ms"] <= TARGET_MS
    print(
        f"median {result['median_ms']:.2f} ms (target <= {TARGET_MS:.0f} ms): "
        f"{'ok' if result['within_target'] else 'OVER'}"
    )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    sys.exit(main())
