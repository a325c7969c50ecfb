"""Each GEMM of our fused MoE against torch's grouped GEMM and dense cuBLAS on the same rows.

Where the layer is far from its lower bound at T >= 1024, is it our GEMM code or the work
itself (padding, short K, many experts)? For one layer call (shape, T, the uniform routing of
``kernels.py``) this times, as device time in the profiler (median of ``--reps`` calls):

- ``ours``: our GEMM 1 (with its activation) and GEMM 2 (with the router weight) kernels,
  inside a whole ``TritonExperts.apply``;
- ``grouped``: ``torch._grouped_mm`` (CUTLASS's warp-specialized grouped GEMM on Hopper) on
  the same expert-sorted rows, no padding, no activation;
- ``dense``: one ``torch.mm`` (cuBLAS) with as many rows as our blocks compute (padding and
  tail tiles counted) and ONE weight matrix: no per-expert weight traffic, so a ceiling for
  the tile work, not a peer;
- ``ours_dense``: our two GEMM kernels on the same rows and ONE weight matrix (one expert,
  top-1, the point's tile config): ``dense`` vs ``ours_dense`` is our GEMM code against
  cuBLAS, ``ours_dense`` vs ``ours`` what the MoE structure costs our kernels;
- ``bmm``: ``torch.bmm`` (cuBLAS, batched) with every expert's weights and the routed pairs
  spread evenly (pairs / E rows each, no padding): the per-expert weight traffic of the layer
  without its routing irregularity, computed by cuBLAS tiles.

TF/s are counted on the rows each computes (``padded_rows``) and on the routed pairs.

    python benchmarks/gemm_ceiling.py --out $OUT            # 3 shapes x T 1024..8192
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _bench_util import SHAPES, MoEShape, measure_ceilings, positive_int, write_json
from kernels import kernel_breakdown, make_case, make_weights

TOKENS = (1024, 4096, 8192)
BENCH_SHAPES = ("nemotron3-nano", "mixtral-8x7b", "qwen3-30b-a3b")
IMPLS = ("ours", "grouped", "dense", "ours_dense", "bmm")


def padded_rows(counts: Sequence[int], block_m: int, tail_m: int = 0) -> int:
    """Rows our aligned GEMMs compute for these per-expert pair counts: every expert's pairs in
    ``block_m``-row blocks, a last block holding at most ``tail_m`` pairs run as a
    ``tail_m``-row tile (``tail_m`` 0: no tail tiles)."""
    if block_m <= 0 or tail_m < 0:
        raise ValueError(f"block_m must be > 0 and tail_m >= 0, got {block_m}, {tail_m}")
    rows = 0
    for c in counts:
        full, rest = divmod(int(c), block_m)
        rows += full * block_m
        if rest:
            rows += tail_m if tail_m > 0 and rest <= tail_m else block_m
    return rows


def gemm_flops(shape: MoEShape, rows: int) -> tuple[float, float]:
    """FLOPs of GEMM 1 (``rows x H -> N1``) and GEMM 2 (``rows x I -> H``)."""
    return 2.0 * rows * shape.hidden * shape.n1, 2.0 * rows * shape.inter * shape.hidden


def gemm_us(
    fn: Callable[[], Any], reps: int, pick: Callable[[list[str]], list[int]]
) -> list[float]:
    """Device µs (profiler, median of ``reps`` calls) of the kernels ``pick`` chooses by name
    from one call of ``fn``, after a warm-up call."""
    import torch

    fn()
    torch.cuda.synchronize()
    kernels = kernel_breakdown(fn, reps)
    return [kernels[j][1] for j in pick([name for name, _ in kernels])]


def our_gemms(names: list[str]) -> list[int]:
    """Indexes of our two GEMM kernels (GEMM 1 first) among one layer call's kernels."""
    idx = [j for j, n in enumerate(names) if n.startswith("_moe_gemm_kernel")]
    if len(idx) != 2:
        raise RuntimeError(f"expected two _moe_gemm_kernel launches, got {names}")
    return idx


def every_kernel(names: list[str]) -> list[int]:
    return list(range(len(names)))


def measure_point(shape: MoEShape, t: int, reps: int, device_name: str) -> dict[str, Any]:
    """One (shape, T): per GEMM and implementation, µs and TF/s (computed rows, routed pairs)."""
    import torch

    from moe_policy.experts.base import ExpertsConfig
    from moe_policy.experts.triton.config import get_config
    from moe_policy.experts.triton.fused_moe import PERSISTENT_GEMMS, TritonExperts

    w = make_weights(shape)
    case = make_case(shape, t, w, None)
    tw, ti = case.routings[0]
    k, e = shape.top_k, shape.num_experts
    flat = ti.flatten().long()
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=e)
    offs = torch.cumsum(counts, 0).to(torch.int32)
    cfg = get_config(t, e, k, shape.hidden, shape.inter, shape.gated, device_name)
    persistent = PERSISTENT_GEMMS and cfg.persistent
    ours_rows = padded_rows(counts.tolist(), cfg.block_m, 0 if persistent else cfg.tail_m)
    pairs = t * k

    be = TritonExperts(
        ExpertsConfig(e, shape.hidden, shape.inter, k, shape.activation, shape.gated,
                      shape.has_bias), w["w13"], w["w2"],
    )  # fmt: skip
    one = TritonExperts(
        ExpertsConfig(1, shape.hidden, shape.inter, 1, shape.activation, shape.gated,
                      shape.has_bias),
        w["w13"][:1], w["w2"][:1], tile_config=cfg,
    )  # fmt: skip
    x_one = torch.randn(ours_rows, shape.hidden, device="cuda", dtype=torch.bfloat16)
    ids_one = torch.zeros(ours_rows, 1, device="cuda", dtype=torch.int32)
    w_one = torch.ones(ours_rows, 1, device="cuda", dtype=torch.float32)
    per_e = pairs // e
    x_e = torch.randn(e, per_e, shape.hidden, device="cuda", dtype=torch.bfloat16)
    act_e = torch.randn(e, per_e, shape.inter, device="cuda", dtype=torch.bfloat16)
    xs = case.x[order // k].contiguous()
    act = torch.randn(pairs, shape.inter, device="cuda", dtype=torch.bfloat16)
    w13t, w2t = w["w13"].transpose(1, 2), w["w2"].transpose(1, 2)
    a1 = torch.randn(ours_rows, shape.hidden, device="cuda", dtype=torch.bfloat16)
    a2 = torch.randn(ours_rows, shape.inter, device="cuda", dtype=torch.bfloat16)
    b1, b2 = w["w13"][0].t(), w["w2"][0].t()
    gmm = torch._grouped_mm

    us = {
        "ours": gemm_us(lambda: be.apply(case.x, tw, ti), reps, our_gemms),
        "grouped": [
            sum(gemm_us(lambda: gmm(xs, w13t, offs=offs), reps, every_kernel)),
            sum(gemm_us(lambda: gmm(act, w2t, offs=offs), reps, every_kernel)),
        ],
        "dense": [
            sum(gemm_us(lambda: a1 @ b1, reps, every_kernel)),
            sum(gemm_us(lambda: a2 @ b2, reps, every_kernel)),
        ],
        "ours_dense": gemm_us(lambda: one.apply(x_one, w_one, ids_one), reps, our_gemms),
        "bmm": [
            sum(gemm_us(lambda: torch.bmm(x_e, w13t), reps, every_kernel)),
            sum(gemm_us(lambda: torch.bmm(act_e, w2t), reps, every_kernel)),
        ],
    }
    rows_of = {
        "ours": ours_rows, "grouped": pairs, "dense": ours_rows, "ours_dense": ours_rows,
        "bmm": per_e * e,
    }  # fmt: skip
    real = gemm_flops(shape, pairs)
    point: dict[str, Any] = {
        "shape": shape.name, "T": t, "pairs": pairs, "padded_rows": ours_rows,
        "config": cfg.to_dict(), "gemms": {},
    }  # fmt: skip
    for g in (0, 1):
        per: dict[str, Any] = {}
        for impl in IMPLS:
            done = gemm_flops(shape, rows_of[impl])[g]
            per[impl] = {
                "us": us[impl][g],
                "tflops_computed": done / us[impl][g] / 1e6,
                "tflops_routed": real[g] / us[impl][g] / 1e6,
            }
        point["gemms"][f"gemm{g + 1}"] = per
    return point


def table(points: list[dict[str, Any]]) -> str:
    """One line per (shape, T, GEMM): µs and TF/s on computed rows of each implementation."""
    head = f"{'shape':15s} {'T':>5s} pad   gemm " + " ".join(f"{i:>17s}" for i in IMPLS)
    lines = [head, " " * 33 + " ".join(f"{'us':>8s} {'TF/s':>8s}" for _ in IMPLS)]
    for p in points:
        pad = p["padded_rows"] / p["pairs"]
        for g, per in p["gemms"].items():
            cells = " ".join(f"{per[i]['us']:8.1f} {per[i]['tflops_computed']:8.0f}" for i in IMPLS)
            lines.append(f"{p['shape']:15s} {p['T']:5d} {pad:5.3f} {g:5s} {cells}")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shapes", nargs="+", default=list(BENCH_SHAPES), choices=sorted(SHAPES))
    p.add_argument("--tokens", nargs="+", type=positive_int, default=list(TOKENS))
    p.add_argument("--reps", type=positive_int, default=10, help="profiled calls per timing")
    p.add_argument("--out", default=os.environ.get("OUT", "."))
    p.add_argument("--tag", default="gemm_ceiling")
    args = p.parse_args()
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    device_name = torch.cuda.get_device_name()
    ceil = measure_ceilings()
    points = []
    for name in args.shapes:
        for t in args.tokens:
            points.append(measure_point(SHAPES[name], t, args.reps, device_name))
            torch.cuda.empty_cache()
            print(table(points[-1:]).split("\n", 2)[2], flush=True)
    print(table(points))
    os.makedirs(args.out, exist_ok=True)
    write_json(os.path.join(args.out, f"{args.tag}.json"), {
        "info": {"device": device_name, "torch": torch.__version__,
                 "triton": __import__("triton").__version__,
                 "date": time.strftime("%Y-%m-%d %H:%M:%S"), "argv": sys.argv[1:]},
        "ceilings": ceil, "points": points,
    })  # fmt: skip


if __name__ == "__main__":
    main()
