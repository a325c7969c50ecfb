"""Temporary A/B (not committed): Qwen3 T=1024 tiles for the base and the LoRA layer."""
import json
import os
import sys
from dataclasses import replace

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch
from _bench_util import SHAPES, gpu_state, measure_ceilings, time_graphs_interleaved
from compare_configs import _lora_contexts, _shipped
from tune_triton import _call, _inputs, _layer

from moe_policy.experts.triton_config import GemmConfig as G


def variants(s, t, ship):
    return {
        "g2_128w8": replace(ship, gemm2=G(128, 64, 8, 8, 4, tma=True)),
        "g2_128w4": replace(ship, gemm2=G(128, 64, 8, 4, 4, tma=True)),
        "g1_64w4": replace(ship, gemm1=G(64, 64, 8, 4, 4, tma=True)),
    }


POINTS = [("qwen3-30b-a3b", 1024), ("qwen3-30b-a3b", 2048)]


def main():
    import multiprocessing as mp
    import time

    from compare_configs import _compile

    dev = torch.cuda.get_device_name()
    t0 = time.time()
    tasks = []
    for s, t in POINTS:
        ship = _shipped(SHAPES[s], t, dev)
        for c in [ship, *variants(s, t, ship).values()]:
            tasks += [(s, t, [c.to_dict()], False), (s, t, [c.to_dict()], True)]
    with mp.get_context("spawn").Pool(14) as pool:
        bad = sum(pool.map(_compile, tasks, chunksize=1))
    print(f"# compiled {len(tasks)} in {time.time() - t0:.0f}s, {bad} failed", flush=True)
    ceil = measure_ceilings()
    print(f"# copy {ceil['copy_tbps']:.2f} TB/s, matmul {ceil['matmul_tflops']:.0f}", flush=True)
    rows = []
    for s, t in POINTS:
        shape = SHAPES[s]
        _, be = _layer(shape)
        sets = _inputs(shape, t, 2)
        loras = _lora_contexts(shape, t, 2)
        ship = _shipped(shape, t, dev)
        V = {"base": (ship, False), "lora": (ship, True)}
        for n, c in variants(s, t, ship).items():
            V["base_" + n] = (c, False)
            V["lora_" + n] = (c, True)
        calls = {}
        for n, (c, lo) in V.items():
            calls[n] = [lambda x=x, tw=tw, ti=ti, lr=lr, c=c, lo=lo: _call(be, c, x, tw, ti, lora=lr if lo else None)
                        for (x, tw, ti), lr in zip(sets, loras, strict=True)]
        timed = time_graphs_interleaved(calls, 10, 5)
        b = timed["base"]["us"]
        line = f"{s:14s} T={t:5d} base {b:8.1f}"
        for n in V:
            if n != "base":
                line += f"  {n} x{timed[n]['us'] / b:.3f}"
        print(line + f"  {gpu_state().get('sm_mhz', 0):.0f}MHz", flush=True)
        rows.append({"shape": s, "T": t, **{n: timed[n] for n in V}})
        torch.cuda.empty_cache()
    os.makedirs(os.environ.get("OUT", "."), exist_ok=True)
    with open(os.path.join(os.environ.get("OUT", "."), "ab.json"), "w") as f:
        json.dump({"ceilings": ceil, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
