"""Probe: can a one-kernel decode layer reach issue 4's T=1 target on Qwen3-30B-A3B (Gluon)?

``decode_barrier_probe.py`` showed that a grid barrier alone buys nothing: the second GEMM's
weights still stream only after the first GEMM ends. The one-kernel read floor (19.35 us for
Qwen3's 75.5 MB, ``results/decode_read_floor_h200.txt``) needs GEMM 2's weights in flight
DURING GEMM 1. This Gluon kernel (Triton's lower-level language, explicit shared memory)
does that for shapes whose w2 share fits one SM:

1. At its start each program (one per SM, launched cooperatively) issues TMA copies of its
   whole GEMM-2 share into shared memory: the ``BLOCK_N2`` output rows of its tile for each
   of the token's k experts, all of I (Qwen3: 8 x 16 x 768 bf16 = 192 KB), on one mbarrier.
2. GEMM 1 + SiLU-and-mul as CUDA-core matrix-vector tiles (``num_warps`` gate and as many
   up rows of w13 by all of H), the next tile's loads issued before this tile's math, while
   the TMA copies stream; the activation is stored in bf16, as the shipped path does.
3. Grid barrier (release add, acquire spin, self-resetting counters).
4. GEMM 2 + router weight + top-k sum from shared memory, slot by slot in slot order, each
   slot rounded to bf16 first (as the shipped path's buffer holds them): deterministic.

Only gated SiLU without biases, ``T * H / BLOCK_N2 <= SMs``, and a w2 share that fits the
shared memory: Qwen3-30B-A3B at T=1, not Nemotron or Mixtral (their shares are 2.4-28x
larger). Written against the GPU machine's Triton 3.6 Gluon API (3.9 renamed the TMA copy),
so an experiment, not a backend.

Verdict (H200, ``results/ab_gluon_decode_h200.txt``): correct (within 5.5e-3 of the shipped
layer, bit-identical run to run), and the overlap is real -- the whole kernel (29.7 us) is
3 us shorter than its two phases timed alone (18.5 + 14.2 us) -- but both phases stream too
slowly to matter: GEMM 1 from registers reaches 2.7 TB/s (a third tile in flight spills:
40-67 us), and staging w2 as 2 KB TMA boxes (one 128-byte swizzle span wide) takes 14 us for
25 MB. Still 1.19x the shipped 24.9 us. Reaching the one-kernel floor would take GEMM 1
through a TMA ring in shared memory too, which the 192 KB w2 share leaves no room for: stage
part of w2, stream the rest after the barrier -- a larger kernel than this probe.

    python benchmarks/gluon_decode_probe.py --variants 8:16 8:16:3 --phases
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, mbarrier, tma

#: Width of one TMA box of w2 along I (128 bytes of bf16: one swizzle span).
BOX_I = 64


@gluon.jit
def _phase1_tile(x_ptr, w13_ptr, topk_ids_ptr, tile, live, n_t1, H, num_experts,
                 stride_13e, TOP_K: gl.constexpr, BN1: gl.constexpr, BK: gl.constexpr,
                 L1: gl.constexpr):  # fmt: skip
    """Issue the loads of one GEMM-1 tile: gate and up rows of ``BN1`` columns, all of H
    (nothing is read where ``live`` is false)."""
    rows_l: gl.constexpr = gl.SliceLayout(1, L1)
    cols_l: gl.constexpr = gl.SliceLayout(0, L1)
    p = tile // n_t1
    nb = (tile % n_t1) * BN1
    e = gl.load(topk_ids_ptr + p)
    ok = (e >= 0) & (e < num_experts)
    e = gl.where(ok, e, 0)
    offs_k = gl.arange(0, BK, layout=cols_l)
    rows = 2 * (nb + gl.arange(0, BN1, layout=rows_l))
    base = w13_ptr + e.to(gl.int64) * stride_13e
    ptrs = base + rows[:, None].to(gl.int64) * H + offs_k[None, :]
    mask = offs_k[None, :] < gl.where(live, H, 0)
    wg = gl.load(ptrs, mask=mask, other=0.0)
    wu = gl.load(ptrs + H, mask=mask, other=0.0)
    xv = gl.load(x_ptr + (p // TOP_K).to(gl.int64) * H + offs_k, mask=offs_k < H, other=0.0)
    return wg, wu, xv, p, nb, ok


@gluon.jit
def _phase1_store(tile, act_ptr, inter, BN1: gl.constexpr, L1: gl.constexpr):
    """Reduce a loaded GEMM-1 tile, apply SiLU-and-mul, store its activation columns."""
    wg, wu, xv, p, nb, ok = tile
    xf = xv.to(gl.float32)[None, :]
    g = gl.sum(wg.to(gl.float32) * xf, axis=1)
    u = gl.sum(wu.to(gl.float32) * xf, axis=1)
    a = g / (1.0 + gl.exp(-g)) * u
    cols = nb + gl.arange(0, BN1, layout=gl.SliceLayout(1, L1))
    c_lim = gl.where(ok, inter, 0)
    gl.store(act_ptr + p.to(gl.int64) * inter + cols, a.to(act_ptr.dtype.element_ty),
             mask=cols < c_lim)  # fmt: skip


@gluon.jit
def gluon_decode_kernel(
    x_ptr, w13_ptr, w2_desc, topk_w_ptr, topk_ids_ptr, act_ptr, out_ptr, bar_ptr,
    num_tokens, H, inter, num_experts, stride_13e,
    TOP_K: gl.constexpr, BN1: gl.constexpr, BK: gl.constexpr, I_BOXES: gl.constexpr,
    num_warps: gl.constexpr, DEPTH: gl.constexpr = 2, A_ROWS: gl.constexpr = 128,
    DO1: gl.constexpr = 1, DO2: gl.constexpr = 1,
):  # fmt: skip
    """One decode MoE layer (see the module docstring); one program per SM, co-resident."""
    BN2: gl.constexpr = w2_desc.block_type.shape[0]
    BI: gl.constexpr = w2_desc.block_type.shape[1]
    pid = gl.program_id(0)
    num_p = gl.num_programs(0)
    numel = num_tokens * TOP_K

    # 1. this program's GEMM-2 weights into shared memory, all at once
    w2_smem = gl.allocate_shared_memory(w2_desc.dtype, [TOP_K * I_BOXES, BN2, BI], w2_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [1, 1], mbarrier.MBarrierLayout())
    mbarrier.init(ready.index(0), count=1)
    fence_async_shared()
    n_t2 = gl.cdiv(H, BN2)
    t2 = pid // n_t2
    n0 = (pid % n_t2) * BN2
    has2 = pid < num_tokens * n_t2 * DO2
    if has2:
        mbarrier.expect(ready.index(0), TOP_K * I_BOXES * w2_desc.block_type.nbytes)
        for q in gl.static_range(TOP_K * I_BOXES):
            e2 = gl.load(topk_ids_ptr + t2 * TOP_K + q // I_BOXES)
            e2 = gl.where((e2 >= 0) & (e2 < num_experts), e2, 0)
            tma.async_copy_global_to_shared(
                w2_desc, [e2 * H + n0, (q % I_BOXES) * BI], ready.index(0), w2_smem.index(q)
            )

    # 2. GEMM 1 + SiLU-and-mul, one warp per gate/up row pair, the next tile's loads first
    L1: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [num_warps, 1], [1, 0])
    n_t1 = gl.cdiv(inter, BN1)
    tiles1 = numel * n_t1 * DO1
    if pid < tiles1:
        # a ring of DEPTH tiles in registers: DEPTH - 1 in flight while one is reduced
        cur = _phase1_tile(x_ptr, w13_ptr, topk_ids_ptr, pid, True, n_t1, H, num_experts,
                           stride_13e, TOP_K, BN1, BK, L1)  # fmt: skip
        if DEPTH == 3:
            mid = _phase1_tile(x_ptr, w13_ptr, topk_ids_ptr, gl.minimum(pid + num_p, tiles1 - 1),
                               pid + num_p < tiles1, n_t1, H, num_experts, stride_13e, TOP_K,
                               BN1, BK, L1)  # fmt: skip
        for tile in range(pid + (DEPTH - 1) * num_p, tiles1 + (DEPTH - 1) * num_p, num_p):
            # past the end: no loads, never reduced
            new = _phase1_tile(x_ptr, w13_ptr, topk_ids_ptr, gl.minimum(tile, tiles1 - 1),
                               tile < tiles1, n_t1, H, num_experts, stride_13e, TOP_K, BN1, BK,
                               L1)  # fmt: skip
            _phase1_store(cur, act_ptr, inter, BN1, L1)
            if DEPTH == 3:
                cur = mid
                mid = new
            else:
                cur = new

    # 3. grid barrier: every thread's stores before the count
    gl.thread_barrier()
    gl.atomic_add(bar_ptr, 1, sem="release", scope="gpu")
    while gl.atomic_add(bar_ptr, 0, sem="acquire", scope="gpu") < num_p:
        pass
    gl.thread_barrier()
    if gl.atomic_add(bar_ptr + 1, 1, sem="relaxed", scope="gpu") == num_p - 1:
        gl.store(bar_ptr, 0)
        gl.store(bar_ptr + 1, 0)

    # 4. GEMM 2 + router weight + top-k sum from shared memory, slot order
    if has2:
        L2: gl.constexpr = gl.BlockedLayout([1, 8], [32 // (BI // 8), BI // 8], [num_warps, 1],
                                            [1, 0])  # fmt: skip
        n_l: gl.constexpr = gl.SliceLayout(1, L2)
        # the token's k activation rows into shared memory at once, as [k * I_BOXES, BI]
        LA: gl.constexpr = gl.BlockedLayout([1, 8], [32 // (BI // 8), BI // 8], [num_warps, 1],
                                            [1, 0])  # fmt: skip
        ra = gl.arange(0, A_ROWS, layout=gl.SliceLayout(1, LA))
        ca = gl.arange(0, BI, layout=gl.SliceLayout(0, LA))
        pr = t2 * TOP_K + ra // I_BOXES
        er = gl.load(topk_ids_ptr + pr, mask=ra < TOP_K * I_BOXES, other=-1)
        okr = (er >= 0) & (er < num_experts)
        col = (ra % I_BOXES)[:, None] * BI + ca[None, :]
        a_rows = gl.load(act_ptr + pr[:, None].to(gl.int64) * inter + col,
                         mask=okr[:, None] & (col < inter), other=0.0,
                         cache_modifier=".cg")  # fmt: skip
        act_smem = gl.allocate_shared_memory(
            act_ptr.dtype.element_ty,
            [A_ROWS, BI],
            gl.SwizzledSharedLayout(1, 1, 1, [1, 0]),
            a_rows,
        )
        gl.thread_barrier()
        mbarrier.wait(ready.index(0), 0)
        out = gl.zeros([BN2], gl.float32, n_l)
        for j in gl.static_range(TOP_K):
            pj = t2 * TOP_K + j
            ej = gl.load(topk_ids_ptr + pj)
            okj = (ej >= 0) & (ej < num_experts)
            y2 = gl.zeros([BN2, BI], gl.float32, L2)
            for b in gl.static_range(I_BOXES):
                wv = w2_smem.index(j * I_BOXES + b).load(L2)
                av = act_smem.slice(j * I_BOXES + b, 1).load(L2)
                y2 += wv.to(gl.float32) * av.to(gl.float32)
            y = gl.sum(y2, axis=1) * gl.load(topk_w_ptr + pj).to(gl.float32)
            y = gl.where(okj, y, 0.0)
            out += y.to(out_ptr.dtype.element_ty).to(gl.float32)
        offs_n = n0 + gl.arange(0, BN2, layout=n_l)
        gl.store(out_ptr + t2.to(gl.int64) * H + offs_n, out.to(out_ptr.dtype.element_ty),
                 mask=offs_n < H)  # fmt: skip
    mbarrier.invalidate(ready.index(0))


_BARRIERS: dict[str, Any] = {}


def gluon_decode(
    x: Any, w13: Any, w2: Any, topk_weights: Any, topk_ids: Any, *, block_n1: int = 4,
    block_n2: int = 16, num_warps: int = 4, depth: int = 2, phases: tuple[int, ...] = (1, 2),
) -> Any:  # fmt: skip
    """Qwen3-style decode layer (gated SiLU, no biases; w13 interleaved as ``TritonExperts``
    holds it) in one cooperative Gluon kernel; raises where the shape does not fit it."""
    import torch
    import triton
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    t, h = x.shape
    e, _, _ = w13.shape
    i = w2.shape[2]
    k = topk_ids.shape[1]
    programs = torch.cuda.get_device_properties(x.device).multi_processor_count
    i_boxes = triton.cdiv(i, BOX_I)
    smem = (k * i_boxes * block_n2 + triton.next_power_of_2(k * i_boxes)) * BOX_I * x.element_size()
    if t * triton.cdiv(h, block_n2) > programs or smem > 216 * 1024 or block_n1 != num_warps:
        raise ValueError(
            f"does not fit: T*H/BLOCK_N2 = {t * triton.cdiv(h, block_n2)} tiles for {programs} "
            f"SMs, w2 share {smem} bytes, block_n1 {block_n1} must equal num_warps {num_warps}"
        )
    layout = gl.NVMMASharedLayout.get_default_for([block_n2, BOX_I], gl.bfloat16)
    w2_desc = TensorDescriptor.from_tensor(w2.view(e * h, i), [block_n2, BOX_I], layout)
    bar = _BARRIERS.get(str(x.device))
    if bar is None:
        bar = _BARRIERS[str(x.device)] = torch.zeros(2, dtype=torch.int32, device=x.device)
    act = torch.empty(t * k, i, dtype=x.dtype, device=x.device)
    out = torch.empty(t, h, dtype=x.dtype, device=x.device)
    gluon_decode_kernel[(programs,)](
        x, w13, w2_desc, topk_weights, topk_ids, act, out, bar, t, h, i, e, w13.stride(0),
        TOP_K=k, BN1=block_n1, BK=triton.next_power_of_2(h), I_BOXES=i_boxes,
        num_warps=num_warps, DEPTH=depth, A_ROWS=triton.next_power_of_2(k * i_boxes),
        DO1=int(1 in phases), DO2=int(2 in phases), launch_cooperative_grid=True,
    )  # fmt: skip
    return out


def _calls(case: Any, wt: dict[str, Any], variant: str, **kw: Any) -> list[Any]:
    """One ``gluon_decode`` call per routing set for a ``NUM_WARPS:BLOCK_N2[:DEPTH]`` variant."""
    warps, bn2, depth = ([int(s) for s in variant.split(":")] + [2])[:3]

    def run(tw: Any, ti: Any) -> Any:
        return gluon_decode(case.x, wt["w13"], wt["w2"], tw, ti, block_n1=warps, block_n2=bn2,
                            num_warps=warps, depth=depth, **kw)  # fmt: skip

    return [lambda tw=tw, ti=ti: run(tw, ti) for tw, ti in case.routings]


def main() -> None:
    """Time the shipped Triton layer against the Gluon one-kernel layer (GPU machine)."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import kernels as K
    from _bench_util import SHAPES, duty_fraction, time_against_shipped, write_json

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="qwen3-30b-a3b", choices=sorted(SHAPES))
    ap.add_argument("--variants", nargs="+", default=["4:16"], help="NUM_WARPS:BLOCK_N2[:DEPTH]")
    ap.add_argument("--phases", action="store_true", help="also time each phase alone")
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--duty", type=duty_fraction, default=0.25)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()

    shape = SHAPES[args.shape]
    case = K.make_case(shape, 1, K.make_weights(shape), None)
    wt = K._triton_backend(case).weights
    variants = {"shipped": K.build_triton(case)}
    for v in args.variants:
        variants[f"gluon_{v}"] = _calls(case, wt, v)
        for ph in (1, 2) if args.phases else ():
            variants[f"gluon_{v}_phase{ph}"] = _calls(case, wt, v, phases=(ph,))
    rows = time_against_shipped(shape, 1, variants, rounds=args.rounds, duty=args.duty,
                                checked=[f"gluon_{v}" for v in args.variants])  # fmt: skip
    os.makedirs(args.out, exist_ok=True)
    write_json(os.path.join(args.out, "gluon_decode_probe.json"), {"rows": rows})


if __name__ == "__main__":
    main()
