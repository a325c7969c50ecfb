"""Spawn N ranks (torch.multiprocessing) that run the agreement scenarios; one JSON file per rank.

    python -m tests.distributed.group --backend gloo --nproc 4 --out DIR [--simulate-hosts]

Rendezvous is a ``file://`` store in DIR; every collective times out (``--pg-timeout``)
and the whole group is killed after ``--timeout`` seconds, so nothing hangs.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tests.distributed.scenarios import SCENARIOS, run_scenario, simulate_hosts

DEVICE_MODES = ("local_rank", "set_device", "bound")


def _init(
    rank: int, world: int, backend: str, init_file: str, device_mode: str, pg_timeout: float
) -> dict[str, Any]:
    """Join the group; for NCCL, place the rank on a GPU the way ``device_mode`` says."""
    import torch
    import torch.distributed as dist

    os.environ["LOCAL_RANK"] = str(rank)
    info: dict[str, Any] = {"backend": backend, "device_mode": device_mode}
    kwargs: dict[str, Any] = {}
    if backend == "nccl":
        device = rank % torch.cuda.device_count()
        if device_mode == "set_device":
            torch.cuda.set_device(device)
        elif device_mode == "bound":
            kwargs["device_id"] = torch.device("cuda", device)
        info["expected_device"] = device
    dist.init_process_group(
        backend,
        init_method=f"file://{init_file}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=pg_timeout),
        **kwargs,
    )
    return info


def worker(
    rank: int,
    world: int,
    backend: str,
    init_file: str,
    out: str,
    names: Sequence[str],
    sim_hosts: bool,
    device_mode: str,
    pg_timeout: float,
) -> None:
    """One rank: join, run every scenario in order, write ``rank<N>.json``, leave."""
    import torch
    import torch.distributed as dist

    out_dir = Path(out)
    info = _init(rank, world, backend, init_file, device_mode, pg_timeout)
    if sim_hosts:
        simulate_hosts(rank, world)
    results = []
    for name in names:
        started = time.perf_counter()
        try:
            result = run_scenario(name, rank, world, out_dir)
        except Exception:  # recorded; the other ranks' next collective then times out
            result = {
                "scenario": name,
                "rank": rank,
                "raised": "crash",
                "message": traceback.format_exc(),
            }
        result["seconds"] = time.perf_counter() - started
        results.append(result)
    if backend == "nccl":
        from moe_policy.fleet.distributed import nccl_device

        info.update(
            chosen_device=nccl_device(dist, torch, None),
            current_device=torch.cuda.current_device(),
            device_name=torch.cuda.get_device_name(info["expected_device"]),
        )
    (out_dir / f"rank{rank}.json").write_text(
        json.dumps({"info": info, "results": results}, default=str)
    )
    if backend == "nccl":  # name the device: in local_rank mode nothing else says which it is
        dist.barrier(device_ids=[info["expected_device"]])
    else:
        dist.barrier()
    dist.destroy_process_group()


def spawn_group(
    backend: str,
    world: int,
    out: Path,
    names: Sequence[str],
    *,
    sim_hosts: bool = False,
    device_mode: str = "local_rank",
    timeout: float = 120.0,
    pg_timeout: float = 30.0,
) -> list[dict[str, Any]]:
    """Run the scenarios on ``world`` spawned ranks; returns each rank's file (kills all on timeout)."""
    import torch.multiprocessing as mp

    out.mkdir(parents=True, exist_ok=True)
    init_file = out / "rendezvous"
    if init_file.exists():
        init_file.unlink()
    ctx = mp.start_processes(
        worker,
        args=(
            world,
            backend,
            str(init_file),
            str(out),
            list(names),
            sim_hosts,
            device_mode,
            pg_timeout,
        ),
        nprocs=world,
        join=False,
        start_method="spawn",
    )
    deadline = time.monotonic() + timeout
    try:
        while not ctx.join(timeout=0.5):
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"{backend} group of {world} did not finish within {timeout:.0f} s"
                )
    finally:
        for proc in ctx.processes:
            if proc.is_alive():
                proc.kill()
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(world)]


def main(argv: Sequence[str] | None = None) -> int:
    """CLI: run the scenarios and leave the per-rank files in ``--out``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="gloo", choices=("gloo", "nccl"))
    parser.add_argument("--nproc", type=int, default=4)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--scenarios", default=",".join(SCENARIOS))
    parser.add_argument("--simulate-hosts", action="store_true")
    parser.add_argument("--device-mode", default="local_rank", choices=DEVICE_MODES)
    parser.add_argument("--timeout", type=float, default=120.0)
    parser.add_argument("--pg-timeout", type=float, default=30.0)
    args = parser.parse_args(argv)
    spawn_group(
        args.backend,
        args.nproc,
        args.out,
        args.scenarios.split(","),
        sim_hosts=args.simulate_hosts,
        device_mode=args.device_mode,
        timeout=args.timeout,
        pg_timeout=args.pg_timeout,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
