"""Run the agreement scenarios over NCCL with N processes on N GPUs; PASS/FAIL per scenario.

    python3 -m tests.distributed.run_nccl OUT_DIR [--nproc N] [--device-modes local_rank,set_device,bound]

(``--backend gloo`` rehearses the same script on CPU, without the device modes.)

Each device mode is one spawned group: ``local_rank`` sets only LOCAL_RANK (the
check must pick each rank's GPU itself), ``set_device`` calls torch.cuda.set_device,
``bound`` passes ``device_id`` to init_process_group. With one GPU (N=1) the NCCL
code path still runs; scenarios that need two ranks are reported as SKIP. The NCCL
environment is left as the machine sets it. Writes OUT_DIR/results.json (and the
per-rank files under OUT_DIR/<mode>/); exit 0 when nothing failed.
"""

from __future__ import annotations

import argparse
import json
import platform
import socket
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from tests.distributed.group import DEVICE_MODES, spawn_group
from tests.distributed.scenarios import MULTI_RANK, SCENARIOS, verify


def _device_problems(ranks: list[dict[str, Any]], mode: str) -> list[str]:
    """Each rank gathered on its own GPU, and the check left the current device as it found it."""
    problems = []
    for r, data in enumerate(ranks):
        info = data["info"]
        if info["chosen_device"] != info["expected_device"]:
            problems.append(
                f"rank {r}: object collective on cuda:{info['chosen_device']}, "
                f"expected cuda:{info['expected_device']}"
            )
        if mode == "local_rank" and info["current_device"] != 0:
            problems.append(f"rank {r}: current device changed to {info['current_device']}")
    return problems


def run_mode(backend: str, mode: str, world: int, out: Path, timeout: float) -> dict[str, Any]:
    """One spawned group in ``mode``; returns per-scenario statuses."""
    names = [n for n in SCENARIOS if world > 1 or n not in MULTI_RANK]
    started = time.perf_counter()
    try:
        ranks = spawn_group(
            backend, world, out, names, device_mode=mode, timeout=timeout, pg_timeout=120
        )
    except Exception:
        return {
            "error": traceback.format_exc(),
            "scenarios": {n: {"status": "FAIL"} for n in names},
        }
    scenarios: dict[str, Any] = {}
    for name in SCENARIOS:
        if name not in names:
            scenarios[name] = {
                "status": "SKIP",
                "problems": [f"needs 2 ranks or more (have {world})"],
            }
            continue
        per_rank = [next(r for r in data["results"] if r["scenario"] == name) for data in ranks]
        problems = verify(name, per_rank, world, out)
        scenarios[name] = {
            "status": "FAIL" if problems else "PASS",
            "problems": problems,
            "seconds": max(r["seconds"] for r in per_rank),
            "message": per_rank[0]["message"],
        }
    if backend == "nccl":
        device = _device_problems(ranks, mode)
        scenarios["device_placement"] = {"status": "FAIL" if device else "PASS", "problems": device}
    return {
        "seconds": time.perf_counter() - started,
        "scenarios": scenarios,
        "ranks": [data["info"] for data in ranks],
    }


def main(argv: list[str] | None = None) -> int:
    """Run every requested device mode, print PASS/FAIL lines, write results.json."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="directory for results.json and per-rank files")
    parser.add_argument(
        "--nproc", type=int, default=None, help="processes (default: one per visible GPU)"
    )
    parser.add_argument("--device-modes", default=",".join(DEVICE_MODES))
    parser.add_argument(
        "--timeout", type=float, default=300.0, help="seconds per group before it is killed"
    )
    parser.add_argument(
        "--backend", default="nccl", choices=("nccl", "gloo"), help="gloo: CPU rehearsal"
    )
    args = parser.parse_args(argv)
    import torch

    nccl = args.backend == "nccl"
    if nccl and (not torch.cuda.is_available() or not torch.distributed.is_nccl_available()):
        print("FAIL: no CUDA device or no NCCL in this torch build")
        return 2
    world = args.nproc or (torch.cuda.device_count() if nccl else 2)
    modes = args.device_modes.split(",") if nccl else ["cpu"]
    args.out.mkdir(parents=True, exist_ok=True)
    version = torch.cuda.nccl.version() if nccl else None
    summary: dict[str, Any] = {
        "backend": args.backend,
        "world": world,
        "host": socket.gethostname(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "nccl": ".".join(map(str, version)) if isinstance(version, tuple) else version,
        "devices": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        if nccl
        else [],
        "modes": {},
    }
    failed = False
    for mode in modes:
        result = run_mode(args.backend, mode, world, args.out / mode, args.timeout)
        summary["modes"][mode] = result
        if "error" in result:
            failed = True
            print(f"FAIL {args.backend}[{mode}] group: {result['error'].strip().splitlines()[-1]}")
        for name, status in result["scenarios"].items():
            failed |= status["status"] == "FAIL"
            detail = "; ".join(status.get("problems", []))
            print(
                f"{status['status']:<4} {args.backend}[{mode}] {name} ({world} ranks)"
                f"{': ' + detail if detail else ''}"
            )
    summary["passed"] = not failed
    (args.out / "results.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    print(f"{'PASS' if not failed else 'FAIL'}: wrote {args.out / 'results.json'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
