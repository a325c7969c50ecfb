"""The tuner's search: candidate tile configs around the heuristic's for one token count, each
compiled in worker processes, checked against the heuristic's output and timed as a whole layer
(alignment, both GEMMs, activation, top-k sum; LoRA when asked) in interleaved CUDA-graph
rounds, so that persistence, dependent launches and the fused decode sum are seen."""

from __future__ import annotations

import math
import time
from dataclasses import asdict, replace
from typing import Any

from moe_policy.experts.triton.config import (
    GemmConfig,
    MoEConfig,
    default_tail_m,
    fit_stages,
    heuristic_config,
    is_decode_batch,
)
from moe_policy.experts.triton.tuning.shapes import (
    FIXED_COPY_TBPS,
    FIXED_MATMUL_TFLOPS,
    MoEShape,
    experts_config,
    lower_bound_us,
)

#: Token counts tuned by default.
TUNE_TOKENS = (1, 16, 64, 256, 1024, 4096)


def _pow2_at_most(x: int, cap: int) -> int:
    p = 16
    while p < x and p < cap:
        p *= 2
    return p


def _tiles(shape: MoEShape, bm: int, g1: GemmConfig, g2: GemmConfig) -> MoEConfig:
    b1 = 2 if shape.gated else 1
    g1 = replace(g1, block_n=_pow2_at_most(shape.inter, g1.block_n),
                 block_k=_pow2_at_most(shape.hidden, g1.block_k), tma=True)  # fmt: skip
    g2 = replace(g2, block_n=_pow2_at_most(shape.hidden, g2.block_n),
                 block_k=_pow2_at_most(shape.inter, g2.block_k), tma=True)  # fmt: skip
    return MoEConfig(bm, fit_stages(bm, g1, b1), fit_stages(bm, g2, 1), tail_m=default_tail_m(bm))


def candidates(shape: MoEShape, t: int, num_sms: int = 132) -> list[MoEConfig]:
    """The heuristic's config first, then variants: at decode the GEMMs' N tiles and stages;
    otherwise block heights around the heuristic's with deep-K, 8-warp and 128 x 256 tiles,
    and persistent GEMMs at 128 rows."""
    h = heuristic_config(t, shape.num_experts, shape.top_k, shape.hidden, shape.inter,
                         shape.gated, num_sms=num_sms)  # fmt: skip
    g = shape.gated
    out = [h]
    if is_decode_batch(t, shape.top_k, shape.num_experts):
        for f1 in (0.5, 1, 2):
            for f2 in (0.5, 1, 2):
                for st in (4, 5):
                    g1 = replace(h.gemm1, block_n=max(16, int(h.gemm1.block_n * f1)),
                                 num_stages=st)  # fmt: skip
                    g2 = replace(h.gemm2, block_n=max(16, int(h.gemm2.block_n * f2)),
                                 num_stages=st)  # fmt: skip
                    out.append(replace(h, gemm1=g1, gemm2=g2))
    else:
        bms = sorted({max(16, h.block_m // 2), h.block_m, min(128, h.block_m * 2)})
        for bm in bms:
            n1 = 64 if g else 128
            fams = [
                (GemmConfig(n1, 128, 1, 4, 5), GemmConfig(128, 128, 1, 4, 5)),
                (GemmConfig(n1, 128, 1, 8, 3, one_dot=g), GemmConfig(128, 128, 1, 8, 3)),
                (GemmConfig(n1, 64, 1, 8, 3, one_dot=g), GemmConfig(128, 64, 1, 8, 3)),
                (GemmConfig(n1, 64, 8, 4, 4, one_dot=g), GemmConfig(128, 64, 8, 4, 4)),
            ]
            if bm == 128:
                fams.append((GemmConfig(2 * n1, 64, 8, 8, 4, one_dot=g),
                             GemmConfig(256, 64, 8, 8, 4)))  # fmt: skip
            for g1, g2 in fams:
                c = _tiles(shape, bm, g1, g2)
                out.append(c)
                if bm == 128:
                    out.append(replace(c, tail_m=0, persistent=True))
    seen: list[MoEConfig] = []
    for c in out:
        if c not in seen:
            seen.append(c)
    return seen


def compile_task(
    task: tuple[dict[str, Any], int, list[dict[str, Any]], bool],
    device: str = "cuda",
    dtype: Any = None,
) -> int:
    """Worker: launch each config once on a few experts (and with LoRA when the task asks),
    so that Triton's on-disk cache holds its kernels (plans are made for the real expert
    count: the same kernels); returns how many failed to launch."""
    import torch

    from moe_policy.experts.triton.device import device_limits
    from moe_policy.experts.triton.fused_moe import launch_plan
    from moe_policy.experts.triton.launch import MoEProblem, plan_launch
    from moe_policy.experts.triton.tuning.inputs import (
        LORA_RANK,
        LORA_SLOTS,
        lora_contexts,
        routing_sets,
        shape_adapters,
        shape_weights,
    )

    sd, t, cfgs, lora = task
    s = MoEShape(**sd)
    few = replace(s, num_experts=min(s.num_experts, max(2, s.top_k)))
    w = shape_weights(few, device, dtype=dtype)
    [(x, tw, ti)] = routing_sets(few, t, 1, device, dtype=dtype)
    prob = MoEProblem(t, s.top_k, s.num_experts, s.hidden, s.inter, s.gated, s.activation,
                      x.element_size(), False, s.has_bias)  # fmt: skip
    runs: list[tuple[MoEProblem, Any]] = [(prob, None)]
    if lora:
        [ctx] = lora_contexts(shape_adapters(few, device, dtype=dtype), t, 1, device)
        runs.append((replace(prob, lora_slots=LORA_SLOTS, lora_rank=LORA_RANK), ctx))
    limits = device_limits(torch.device(device))
    bad = 0
    for c in cfgs:
        try:
            for p, ctx in runs:
                launch_plan(plan_launch(p, limits, MoEConfig.from_dict(c)), x, w["w13"],
                            w["w2"], tw, ti, w["w13_bias"], w["w2_bias"], ctx)  # fmt: skip
        except Exception:
            bad += 1
    if device == "cuda":
        torch.cuda.synchronize()
    return bad


def tune(
    shape: MoEShape, tokens: list[int], lora: bool, jobs: int, rounds: int
) -> list[dict[str, Any]]:
    """Per token count: every candidate timed as a whole layer (and with LoRA), the winner."""
    import multiprocessing as mp

    import torch

    from moe_policy.experts.testing import rel_err
    from moe_policy.experts.triton.device import cuda_limits
    from moe_policy.experts.triton.fused_moe import TritonExperts
    from moe_policy.experts.triton.tuning.inputs import (
        call_layer,
        lora_contexts,
        routing_sets,
        shape_adapters,
        shape_weights,
    )
    from moe_policy.experts.triton.tuning.timing import time_graphs_interleaved

    sms = int(cuda_limits(torch.cuda.current_device())["num_sms"])
    cands = {t: candidates(shape, t, sms) for t in tokens}
    total = sum(len(c) for c in cands.values())
    start = time.time()
    print(f"# {shape.name}: E={shape.num_experts} k={shape.top_k} H={shape.hidden} "
          f"I={shape.inter}; {total} candidates at T={tokens}", flush=True)  # fmt: skip
    tasks = [(asdict(shape), t, [c.to_dict() for c in cands[t]], lora) for t in tokens]
    with mp.get_context("spawn").Pool(max(1, jobs)) as pool:
        bad = sum(pool.map(compile_task, tasks))
    print(f"# compiled in {time.time() - start:.0f}s ({bad} failed to launch)", flush=True)
    w = shape_weights(shape)
    be = TritonExperts(experts_config(shape), w["w13"], w["w2"], w["w13_bias"], w["w2_bias"])
    del w
    adapters = shape_adapters(shape) if lora else None
    results, done, t0 = [], 0, time.time()
    for t in tokens:
        n_sets = 8 if t <= 256 else (4 if t <= 1024 else 2)
        sets = routing_sets(shape, t, n_sets)
        ctxs = lora_contexts(adapters, t, n_sets) if lora else [None] * n_sets
        ref = call_layer(be, cands[t][0], *sets[0])
        variants: dict[str, list[Any]] = {}
        kept: dict[str, MoEConfig] = {}
        for i, c in enumerate(cands[t]):
            try:
                if i and not rel_err(call_layer(be, c, *sets[0]), ref) < 2e-2:
                    continue
            except Exception:
                continue
            kept[str(i)] = c
            variants[str(i)] = [lambda s=s, c=c: call_layer(be, c, *s) for s in sets]
            if lora:
                variants[f"{i}+lora"] = [lambda s=s, c=c, x=x: call_layer(be, c, *s, lora=x)
                                         for s, x in zip(sets, ctxs, strict=True)]  # fmt: skip
        bound = lower_bound_us(shape, t, FIXED_COPY_TBPS, FIXED_MATMUL_TFLOPS)
        replays = max(1, min(20, math.ceil(600 / (n_sets * bound * 1.3))))
        timed = time_graphs_interleaved(variants, rounds, replays, 0.5)

        best = min(kept, key=lambda i, tm=timed: tm[i]["us"]
                   + (tm[f"{i}+lora"]["us"] if lora else 0.0))  # fmt: skip
        row = {"T": t, "bound_us": bound, "heuristic_us": timed["0"]["us"],
               "tuned_us": timed[best]["us"], "config": kept[best].to_dict(),
               "candidates": len(kept)}  # fmt: skip
        if lora:
            row.update(
                heuristic_lora_us=timed["0+lora"]["us"], tuned_lora_us=timed[f"{best}+lora"]["us"]
            )
        results.append(row)
        done += len(cands[t])
        left = (time.time() - t0) / done * (total - done)
        print(f"[{len(results)}/{len(tokens)}] T={t:5d}: {len(kept)} candidates, heuristic "
              f"{row['heuristic_us']:9.1f} us -> {row['tuned_us']:9.1f} us "
              f"({row['heuristic_us'] / row['tuned_us'] - 1:+.1%}); elapsed "
              f"{time.time() - start:.0f}s, about {left:.0f}s left", flush=True)  # fmt: skip
        del variants, sets
        torch.cuda.empty_cache()
    return results
