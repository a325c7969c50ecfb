"""Compare Triton fused-MoE tile configs on whole layers, CUDA-graph timed (GPU machine).

The tuner ranks GEMM 1 and GEMM 2 by isolated profiler times; this script times what an engine
runs: the whole layer (alignment, both GEMMs, top-k sum) replayed in a CUDA graph, for the
shipped config and named variants of it (TMA on, other BLOCK_M, other tiles). Each variant's
output is checked against the shipped config's output before it is timed.

    python benchmarks/compare_configs.py --shapes qwen3-30b-a3b --tokens 4096 8192
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import replace
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _bench_util import SHAPES, MoEShape, lower_bound_us, measure_ceilings, time_graph_us
from tune_triton import _call, _inputs, _layer

from moe_policy.experts.triton_config import GemmConfig, MoEConfig, _fit_stages, get_config


def variants(shape: MoEShape, t: int, device: str) -> dict[str, MoEConfig]:
    """The shipped config and TMA / tile variants of it, by name."""
    base = get_config(t, shape.num_experts, shape.top_k, shape.hidden, shape.inter, shape.gated,
                      device)  # fmt: skip
    b1 = 2 if shape.gated else 1

    def mk(bm: int, g1: GemmConfig, g2: GemmConfig) -> MoEConfig:
        return MoEConfig(bm, _fit_stages(bm, g1, b1), _fit_stages(bm, g2, 1))

    def tma(g: GemmConfig) -> GemmConfig:
        return replace(g, tma=True, one_dot=g.one_dot or (g is base.gemm1 and shape.gated))

    out = {"shipped": base, "shipped+tma": mk(base.block_m, tma(base.gemm1), tma(base.gemm2))}
    if t * shape.top_k / shape.num_experts >= 32:
        w1 = 128 if shape.gated else 256
        out["bm128-tma-s3"] = mk(128, GemmConfig(w1, 64, 8, 8, 3, shape.gated, True),
                                 GemmConfig(256, 64, 8, 8, 3, tma=True))  # fmt: skip
        out["bm128-tma-s4"] = mk(128, GemmConfig(w1, 64, 8, 8, 4, shape.gated, True),
                                 GemmConfig(256, 64, 8, 8, 4, tma=True))  # fmt: skip
        out["bm128-tma-n128"] = mk(128, GemmConfig(w1 // 2, 64, 8, 4, 4, shape.gated, True),
                                   GemmConfig(128, 64, 8, 4, 4, tma=True))  # fmt: skip
        out["bm64-tma"] = mk(64, GemmConfig(w1 // 2, 64, 8, 4, 4, shape.gated, True),
                             GemmConfig(128, 64, 8, 4, 4, tma=True))  # fmt: skip
        out["bm64-tma-wide"] = mk(64, GemmConfig(w1, 64, 8, 8, 3, shape.gated, True),
                                  GemmConfig(256, 64, 8, 8, 3, tma=True))  # fmt: skip
    return out


def _compile(task: tuple[str, int, list[dict[str, Any]]]) -> int:
    """Worker: run each config once so that it lands in Triton's cache; returns failures."""
    from tune_triton import _compile_worker

    return _compile_worker(task)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument(
        "--shapes", nargs="+", default=["nemotron3-nano", "mixtral-8x7b", "qwen3-30b-a3b"]
    )
    p.add_argument("--tokens", nargs="+", type=int, default=[1024, 4096, 8192])
    p.add_argument("--replays", type=int, default=20)
    p.add_argument("--jobs", type=int, default=12)
    p.add_argument("--out", default=os.environ.get("OUT", "."))
    args = p.parse_args()

    import multiprocessing as mp

    import torch

    start = time.time()
    device = torch.cuda.get_device_name()
    plan = {(s, t): variants(SHAPES[s], t, device) for s in args.shapes for t in args.tokens}
    tasks = [(s, t, [c.to_dict()]) for (s, t), vs in plan.items() for c in vs.values()]
    with mp.get_context("spawn").Pool(args.jobs) as pool:
        bad = sum(pool.map(_compile, tasks, chunksize=1))
    print(
        f"# compiled {len(tasks)} configs in {time.time() - start:.0f}s ({bad} failed)", flush=True
    )
    ceil = measure_ceilings()
    print(f"# copy {ceil['copy_tbps']:.2f} TB/s, matmul {ceil['matmul_tflops']:.0f} TFLOP/s")
    rows = []
    for (s, t), vs in plan.items():
        shape = SHAPES[s]
        _, backend = _layer(shape)
        sets = _inputs(shape, t, 2)
        bound = lower_bound_us(shape, t, ceil["copy_tbps"], ceil["matmul_tflops"])
        ref = _call(backend, vs["shipped"], *sets[0]).float()
        for name, cfg in vs.items():
            row: dict[str, Any] = {"shape": s, "T": t, "variant": name, "config": cfg.to_dict()}
            try:
                got = _call(backend, cfg, *sets[0]).float()
                row["rel_diff"] = float((got - ref).norm() / ref.norm())
                calls = [
                    lambda b=backend, c=cfg, x=x, tw=tw, ti=ti: _call(b, c, x, tw, ti)
                    for x, tw, ti in sets
                ]
                row.update(time_graph_us(calls, args.replays))
                row["ratio"] = row["us"] / bound
            except Exception as exc:  # a tile that does not compile or fit is reported, not fatal
                row["error"] = f"{type(exc).__name__}: {str(exc)[:160]}"
            rows.append(row)
            if "us" in row:
                print(f"{s:15s} T={t:5d} {name:16s} {row['us']:9.1f} us  x{row['ratio']:.2f}  "
                      f"diff {row['rel_diff']:.1e}", flush=True)  # fmt: skip
            else:
                print(f"{s:15s} T={t:5d} {name:16s} {row['error']}", flush=True)
        torch.cuda.empty_cache()
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "compare_configs.json"), "w") as f:
        json.dump({"device": device, "ceilings": ceil, "rows": rows}, f, indent=1)
    print(f"# total {time.time() - start:.0f}s", flush=True)


if __name__ == "__main__":
    main()
