"""Probe: does a warp-specialized Hopper GEMM (Gluon) beat our Triton GEMMs on MoE work?

Our GEMMs are Triton tile programs: the same warps issue the TMA loads, wait on them and run
the MMAs, so a load waits behind MMA issue and a tile's first loads behind the last tile's
epilogue (``gemm_ceiling.py``: 1.04-1.13x cuBLAS on identical rows, and on Nemotron another
1.10-1.23x for streaming 128 experts' weights). This probe writes the other design in Gluon
(Triton's lower-level language, Hopper): one loader warp streams A and B tiles through TMA
into a ring of shared-memory stages, signalled by mbarriers, while two consumer warpgroups
run asynchronous wgmma on them and store each finished tile through TMA; persistent, tiles in
the same grouped order as ours. It computes the grouped GEMM of GEMM 2 on expert-padded rows:
``C[block rows] = A[block rows] @ W[expert(block)]^T`` (no router weight, no scatter: a
go/no-go on the main loop, not a layer), and times it against our layer's GEMM 2 on the same
routing (profiler device time, as ``gemm_ceiling.py``).

Written against the GPU machine's Triton 3.6 Gluon API (Triton 3.9 renamed the TMA copies to
``async_load``/``async_store``), so it is an experiment, not a backend. On the H200 its best
cuts (128 x 128 tiles, 5 stages; one 8-warp consumer or two 4-warp ping-pong consumers) took
0.94-1.02x our GEMM 2's time at T = 4096-8192 on Nemotron and Qwen3, 1.03-1.06x on Mixtral
(``results/ab_gluon_ws_gemm_h200.txt``): warp specialization alone does not buy the 15-25 %
the remaining issue-4 targets need.

    python benchmarks/gluon_probe.py --shapes nemotron3-nano qwen3-30b-a3b --tokens 4096 8192
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)


@gluon.jit
def _tile_of(t, live_m, n_tiles, GROUP_M: gl.constexpr):
    """Tile -> (M block, N tile), GROUP_M blocks at a time (the order of our Triton GEMMs)."""
    group = GROUP_M * n_tiles
    first_m = (t // group) * GROUP_M
    size_m = gl.minimum(live_m - first_m, GROUP_M)
    m = first_m + (t % group) % size_m
    n = (t % group) // size_m
    return m, n


@gluon.jit
def _load_partition(
    a_desc, b_desc, a_bufs, b_bufs, ready, empty, expert_ids_ptr, live_m, n_tiles, N, K,
    GROUP_M: gl.constexpr, STAGES: gl.constexpr,
):  # fmt: skip
    """One warp: for every tile of this program and K step, wait for a free stage and fill it
    with the A and B tiles through TMA (the stage's ready barrier counts the bytes)."""
    BLOCK_M: gl.constexpr = a_desc.block_type.shape[0]
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = b_desc.block_type.shape[0]
    nbytes: gl.constexpr = a_desc.block_type.nbytes + b_desc.block_type.nbytes
    it = 0
    for t in range(gl.program_id(0), live_m * n_tiles, gl.num_programs(0)):
        m, n = _tile_of(t, live_m, n_tiles, GROUP_M)
        expert = gl.load(expert_ids_ptr + m)
        for k in range(0, K, BLOCK_K):
            s = it % STAGES
            mbarrier.wait(empty.index(s), ((it // STAGES) & 1) ^ 1)
            mbarrier.expect(ready.index(s), nbytes)
            tma.async_copy_global_to_shared(
                a_desc, [m * BLOCK_M, k], ready.index(s), a_bufs.index(s)
            )
            tma.async_copy_global_to_shared(
                b_desc, [expert * N + n * BLOCK_N, k], ready.index(s), b_bufs.index(s)
            )
            it += 1


@gluon.jit
def _mma_partition(
    c_desc, a_bufs, b_bufs, ready, empty, c_smem, turn_wait, turn_signal, live_m, n_tiles, K,
    GROUP_M: gl.constexpr, STAGES: gl.constexpr, WARPS: gl.constexpr,
    ROLE: gl.constexpr, CONSUMERS: gl.constexpr,
):  # fmt: skip
    """A consumer (WARPS warps): async wgmma on each ready stage, one in flight; a stage is
    released once the MMA after it has been issued and the one reading it has finished; the
    tile's result goes out through shared memory and a TMA store. With two consumers
    ("ping-pong") consumer ROLE takes every other tile of the program, so one runs its epilogue
    while the other runs its main loop (the loader fills the stages in tile order). The two
    main loops take turns (``turn_wait``/``turn_signal``): a consumer that started its main loop
    early would wait on a stage barrier more than one phase ahead, which an mbarrier's parity
    cannot tell from a completed one (the first version hung that way)."""
    BLOCK_M: gl.constexpr = c_desc.block_type.shape[0]
    BLOCK_N: gl.constexpr = c_desc.block_type.shape[1]
    BLOCK_K: gl.constexpr = a_bufs.type.shape[2]
    layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[WARPS, 1], instr_shape=[16, BLOCK_N, 16]
    )
    k_steps = gl.cdiv(K, BLOCK_K)
    it = ROLE * k_steps  # stage counter of this consumer's first tile
    p = gl.num_programs(0)
    turns = 0
    for t in range(gl.program_id(0) + ROLE * p, live_m * n_tiles, CONSUMERS * p):
        m, n = _tile_of(t, live_m, n_tiles, GROUP_M)
        if CONSUMERS > 1:  # consumer 0 starts; then each waits for the other's main loop
            mbarrier.wait(turn_wait, (turns & 1) ^ (1 - ROLE))
        acc = gl.zeros((BLOCK_M, BLOCK_N), gl.float32, layout)
        s = it % STAGES
        mbarrier.wait(ready.index(s), (it // STAGES) & 1)
        acc = warpgroup_mma(
            a_bufs.index(s), b_bufs.index(s).permute((1, 0)), acc, use_acc=False, is_async=True
        )
        acc = warpgroup_mma_wait(1, deps=(acc,))
        prev = s
        it += 1
        for _k in range(1, k_steps):
            s = it % STAGES
            mbarrier.wait(ready.index(s), (it // STAGES) & 1)
            acc = warpgroup_mma(
                a_bufs.index(s), b_bufs.index(s).permute((1, 0)), acc, is_async=True
            )
            acc = warpgroup_mma_wait(1, deps=(acc,))
            mbarrier.arrive(empty.index(prev), count=1)
            prev = s
            it += 1
        acc = warpgroup_mma_wait(0, deps=(acc,))
        mbarrier.arrive(empty.index(prev), count=1)
        if CONSUMERS > 1:
            mbarrier.arrive(turn_signal, count=1)
            turns += 1
        it += (CONSUMERS - 1) * k_steps  # the other consumer's tile
        tma.store_wait(0)  # the last tile's store has left c_smem
        c_smem.store(acc.to(c_desc.dtype))
        fence_async_shared()
        tma.async_copy_shared_to_global(c_desc, [m * BLOCK_M, n * BLOCK_N], c_smem)
    tma.store_wait(0)


@gluon.jit
def ws_grouped_gemm_kernel(
    a_desc, b_desc, c_desc, expert_ids_ptr, num_padded_ptr, N, K, n_tiles,
    GROUP_M: gl.constexpr, STAGES: gl.constexpr, PINGPONG: gl.constexpr, num_warps: gl.constexpr,
):  # fmt: skip
    """Persistent grouped GEMM: a loader warp and one consumer of ``num_warps`` warps, or
    (PINGPONG) two consumers of ``num_warps`` warps each taking alternate tiles."""
    BLOCK_M: gl.constexpr = a_desc.block_type.shape[0]
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = b_desc.block_type.shape[0]
    CONSUMERS: gl.constexpr = 2 if PINGPONG else 1
    a_bufs = gl.allocate_shared_memory(a_desc.dtype, [STAGES, BLOCK_M, BLOCK_K], a_desc.layout)
    b_bufs = gl.allocate_shared_memory(b_desc.dtype, [STAGES, BLOCK_N, BLOCK_K], b_desc.layout)
    c_smem = gl.allocate_shared_memory(c_desc.dtype, [CONSUMERS, BLOCK_M, BLOCK_N], c_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    turn = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=1)
    for i in gl.static_range(2):
        mbarrier.init(turn.index(i), count=1)
    live_m = gl.load(num_padded_ptr) // BLOCK_M
    if PINGPONG:
        gl.warp_specialize(
            [
                (_mma_partition, (c_desc, a_bufs, b_bufs, ready, empty, c_smem.index(0),
                                  turn.index(0), turn.index(1), live_m,
                                  n_tiles, K, GROUP_M, STAGES, num_warps, 0, 2)),
                (_mma_partition, (c_desc, a_bufs, b_bufs, ready, empty, c_smem.index(1),
                                  turn.index(1), turn.index(0), live_m,
                                  n_tiles, K, GROUP_M, STAGES, num_warps, 1, 2)),
                (_load_partition, (a_desc, b_desc, a_bufs, b_bufs, ready, empty,
                                   expert_ids_ptr, live_m, n_tiles, N, K, GROUP_M, STAGES)),
            ],
            [num_warps, 1],
            [232, 40],
        )  # fmt: skip
    else:
        gl.warp_specialize(
            [
                (_mma_partition, (c_desc, a_bufs, b_bufs, ready, empty, c_smem.index(0),
                                  turn.index(0), turn.index(1), live_m,
                                  n_tiles, K, GROUP_M, STAGES, num_warps, 0, 1)),
                (_load_partition, (a_desc, b_desc, a_bufs, b_bufs, ready, empty,
                                   expert_ids_ptr, live_m, n_tiles, N, K, GROUP_M, STAGES)),
            ],
            [1],
            [40],
        )  # fmt: skip


def descriptors(a: Any, w: Any, c: Any, block_m: int, block_n: int, block_k: int) -> tuple:
    """TMA descriptors of A [rows, K], the weights [E, N, K] as [E*N, K] and C [rows, N]."""
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    e, n, k = w.shape
    lay = gl.NVMMASharedLayout.get_default_for
    return (
        TensorDescriptor.from_tensor(a, [block_m, block_k], lay([block_m, block_k], gl.bfloat16)),
        TensorDescriptor.from_tensor(
            w.view(e * n, k), [block_n, block_k], lay([block_n, block_k], gl.bfloat16)
        ),
        TensorDescriptor.from_tensor(c, [block_m, block_n], lay([block_m, block_n], gl.bfloat16)),
    )


def ws_grouped_gemm(
    a: Any, w: Any, c: Any, expert_ids: Any, num_padded: Any, *, block_m: int = 128,
    block_n: int = 256, block_k: int = 64, stages: int = 3, group_m: int = 8,
    programs: int | None = None, maxnreg: int | None = 168, pingpong: bool = False,
) -> Any:  # fmt: skip
    """``c[r] = a[r] @ w[expert_ids[r // block_m]]^T`` for the first ``num_padded`` rows."""
    import torch
    import triton

    _, n, k = w.shape
    descs = descriptors(a, w, c, block_m, block_n, block_k)
    if programs is None:
        programs = torch.cuda.get_device_properties(a.device).multi_processor_count
    extra = {"maxnreg": maxnreg} if maxnreg else {}
    ws_grouped_gemm_kernel[(programs,)](
        *descs, expert_ids, num_padded, n, k, triton.cdiv(n, block_n),
        GROUP_M=group_m, STAGES=stages, PINGPONG=pingpong, num_warps=4 if pingpong else 8,
        **extra,
    )  # fmt: skip
    return c


def padded_problem(shape: Any, t: int, block_m: int, seed: int = 0) -> dict[str, Any]:
    """GEMM 2's rows for one uniform routing, each expert's rows padded to whole blocks."""
    import torch

    g = torch.Generator(device="cuda").manual_seed(seed)
    e, k = shape.num_experts, shape.top_k
    logits = torch.randn(t, e, device="cuda", generator=g)
    ids = torch.topk(logits, k, dim=-1).indices
    counts = torch.bincount(ids.flatten(), minlength=e).tolist()
    blocks = [-(-c // block_m) for c in counts]
    expert_ids = torch.tensor(
        [ex for ex, b in enumerate(blocks) for _ in range(b)], device="cuda", dtype=torch.int32
    )
    rows = sum(blocks) * block_m
    a = torch.randn(rows, shape.inter, device="cuda", generator=g).bfloat16()
    w = torch.randn(e, shape.hidden, shape.inter, device="cuda", generator=g) / shape.inter**0.5
    return {
        "a": a, "w": w.bfloat16().contiguous(), "expert_ids": expert_ids,
        "num_padded": torch.tensor([rows], device="cuda", dtype=torch.int32),
        "rows": rows, "pairs": t * k, "topk_ids": ids.int(),
    }  # fmt: skip


def check(p: dict[str, Any], c: Any, block_m: int) -> float:
    """Largest relative error of ``c`` against a per-block torch reference (fp32)."""
    ref = (
        p["a"].view(-1, block_m, p["a"].shape[1]).float()
        @ p["w"][p["expert_ids"].long()].float().transpose(1, 2)
    ).view(c.shape)
    return float((c.float() - ref).abs().max() / ref.abs().max())


def time_variant(p: dict[str, Any], shape: Any, variant: str, reps: int) -> dict[str, Any]:
    """Check and time one ``BLOCK_N:BLOCK_K:STAGES[:pp]`` variant on problem ``p`` (``pp``: two
    ping-pong consumers of 4 warps; errors reported)."""
    import torch
    from gemm_ceiling import every_kernel, gemm_us

    fields = variant.split(":")
    bn, bk, stages = (int(v) for v in fields[:3])
    pingpong = fields[3:] == ["pp"]
    c = torch.empty(p["rows"], shape.hidden, device="cuda", dtype=torch.bfloat16)
    row: dict[str, Any] = {"variant": variant, "rows": p["rows"], "pairs": p["pairs"]}

    def run() -> Any:
        return ws_grouped_gemm(p["a"], p["w"], c, p["expert_ids"], p["num_padded"],
                               stages=stages, block_n=bn, block_k=bk, pingpong=pingpong)  # fmt: skip

    try:
        run()
        torch.cuda.synchronize()
        row["max_rel_err"] = check(p, c, 128)
        row["gluon_us"] = sum(gemm_us(run, reps, every_kernel))
        row["gluon_tflops"] = 2.0 * p["rows"] * shape.hidden * shape.inter / row["gluon_us"] / 1e6
    except Exception as exc:  # a variant that does not fit or compile is reported
        row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
    return row


def main() -> None:
    import torch
    import triton
    from _bench_util import SHAPES, positive_int, write_json
    from gemm_ceiling import gemm_us, our_gemms
    from kernels import make_case, make_weights

    from moe_policy.experts.base import ExpertsConfig
    from moe_policy.experts.triton.fused_moe import TritonExperts

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", nargs="+", default=["nemotron3-nano", "qwen3-30b-a3b"])
    ap.add_argument("--tokens", nargs="+", type=positive_int, default=[1024, 4096, 8192])
    ap.add_argument(
        "--variants",
        nargs="+",
        default=["128:64:5", "256:64:3", "256:32:6"],
        help="BLOCK_N:BLOCK_K:STAGES[:pp] per variant (BLOCK_M 128; pp: two 4-warp consumers)",
    )
    ap.add_argument("--reps", type=positive_int, default=10)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    rows = []
    for name in args.shapes:
        shape = SHAPES[name]
        wts = make_weights(shape)
        be = TritonExperts(
            ExpertsConfig(shape.num_experts, shape.hidden, shape.inter, shape.top_k,
                          shape.activation, shape.gated, shape.has_bias), wts["w13"], wts["w2"],
        )  # fmt: skip
        for t in args.tokens:
            case = make_case(shape, t, wts, None)
            tw, ti = case.routings[0]
            ours = gemm_us(
                lambda b=be, x=case.x, w=tw, i=ti: b.apply(x, w, i), args.reps, our_gemms
            )[1]
            p = padded_problem(shape, t, 128)
            for variant in args.variants:
                row = time_variant(p, shape, variant, args.reps)
                row.update(shape=name, T=t, ours_gemm2_us=ours)
                if "gluon_us" in row:
                    row["gluon_vs_ours"] = row["gluon_us"] / ours
                print(row, flush=True)
                rows.append(row)
            torch.cuda.empty_cache()
    os.makedirs(args.out, exist_ok=True)
    write_json(os.path.join(args.out, "gluon_probe.json"), {
        "info": {"device": torch.cuda.get_device_name(), "triton": triton.__version__,
                 "date": time.strftime("%Y-%m-%d %H:%M:%S"), "argv": sys.argv[1:]},
        "rows": rows,
    })  # fmt: skip


if __name__ == "__main__":
    main()
