"""Probe: the decode MoE layer as ONE Triton kernel, a grid barrier between its two GEMMs.

Qwen3-30B-A3B at T=1 is the one decode point that misses issue 4's 1.3x target (25 us, 1.4x):
a pure read of its 75.5 MB takes 22.19 us as two kernels and 19.35 us as one
(``results/decode_read_floor_h200.txt``), so only a one-kernel layer has room. This probe is
that layer: one persistent grid, launched cooperatively (all programs co-resident; Triton's
``launch_cooperative_grid``, which CUDA graphs capture), in two phases:

1. GEMM 1 + activation: program ``p`` takes tiles ``p, p + P, ...`` of (pair, ``block_n1``
   intermediate columns) as matrix-vector products on the CUDA cores (fp32 partial products,
   reduced once per tile); all its tiles and their H steps run as one software-pipelined
   loop. The activation ``[T*k, I]`` is stored in the compute dtype, as the shipped path does.
2. Grid barrier: each program counts itself in (CTA barrier, then a release add), loads its
   first w2 tile, then spins on an acquire load until all have arrived; the last one to leave
   resets the two int32 counters, so one zeroed buffer serves every call on a stream.
3. GEMM 2 + bias + router weight + top-k sum: tile (token, ``block_n2`` output columns) sums
   the token's k slots in slot order, each rounded to the compute dtype first, as the
   two-GEMM path's buffer holds them: deterministic, no atomics on data.

Under Triton's interpreter, which runs programs one after another, the phases run as two
launches (``split_phases``), the same code on both sides of the barrier
(``tests/kernels/test_decode_barrier_probe.py`` checks it against the torch reference).

Verdict (H200, ``results/ab_decode_grid_barrier_h200.txt``): correct (within 5e-3 of the
shipped layer, bit-identical run to run) and slower: best 28.4 us against the shipped
24.5 us at Qwen3 T=1. The barrier buys nothing measurable (the fused kernel takes the sum of
its two phases launched separately, within 0.5 us), and the CUDA-core phases stream more
slowly than the shipped tensor-core GEMMs (phase 1 15.7 us vs GEMM 1's 14.2, phase 2
11.7-12.6 us vs GEMM 2's 10.0). What the one-kernel floor would need is each program's share
of w2 (95 KB at two programs per SM) staged in shared memory DURING phase 1, which Triton
cannot hold across a loop; a Gluon kernel could. Not a backend.

    python benchmarks/decode_barrier_probe.py --shapes qwen3-30b-a3b --tokens 1 \
        --variants base n2_8 --phases
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass, replace
from typing import Any

import torch
import triton
import triton.language as tl

from moe_policy.experts.base import sm_count
from moe_policy.experts.triton.fused_moe import _WEIGHT_OUTPUT, _apply_act


@dataclass(frozen=True)
class DecodeConfig:
    """Tiles of the one-kernel decode layer (defaults: the best cut on the H200 but one)."""

    block_n1: int = 8  # intermediate columns per GEMM-1 tile (gated: 2x rows of w13)
    block_k1: int = 256  # H step of GEMM 1
    block_n2: int = 16  # output columns per GEMM-2 tile
    block_i2: int = 256  # I step of GEMM 2 (the first step of the first tile is prefetched)
    num_warps: int = 4
    programs_per_sm: int = 2
    prefetch: bool = True
    stages1: int = 4
    stages2: int = 4


@triton.jit
def _w2_step(w2_ptr, e, n0, i0, H, inter, stride_2e, stride_2h, BLOCK_N2: tl.constexpr,
             BLOCK_I2: tl.constexpr, load):  # fmt: skip
    """w2[e, n0:n0+BLOCK_N2, i0:i0+BLOCK_I2] (zeros outside; expert -1 loads nothing)."""
    offs_n = n0 + tl.arange(0, BLOCK_N2)
    offs_i = i0 + tl.arange(0, BLOCK_I2)
    n_lim = tl.where((e >= 0) & load, H, 0)  # an invalid expert (or load False) loads nothing
    ptrs = w2_ptr + e.to(tl.int64) * stride_2e + offs_n[:, None] * stride_2h + offs_i[None, :]
    return tl.load(ptrs, mask=(offs_n[:, None] < n_lim) & (offs_i[None, :] < inter), other=0.0)


@triton.jit
def _decode_layer_kernel(
    x_ptr,  # [T, H]
    w13_ptr,  # [E, N1, H], gated interleaved (gate 2n, up 2n + 1)
    w2_ptr,  # [E, H, I]
    b13_ptr,  # [E, N1] (HAS_BIAS)
    b2_ptr,  # [E, H] (HAS_BIAS)
    topk_w_ptr,  # [T*k]
    topk_ids_ptr,  # [T*k]
    act_ptr,  # [T*k, I] scratch
    out_ptr,  # [T, H]
    bar_ptr,  # [2] int32 barrier counters, zero between calls
    num_tokens,
    H,
    inter,
    num_experts,
    stride_xt,
    stride_13e,
    stride_13n,
    stride_2e,
    stride_2h,
    stride_b13e,
    stride_b2e,
    stride_ot,
    TOP_K: tl.constexpr,
    GATED: tl.constexpr,
    ACT: tl.constexpr,
    ALPHA: tl.constexpr,
    LIMIT: tl.constexpr,
    WEIGHT_POS: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    BLOCK_N1: tl.constexpr,
    BLOCK_K1: tl.constexpr,
    BLOCK_N2: tl.constexpr,
    BLOCK_I2: tl.constexpr,
    PHASE: tl.constexpr,  # 0: both with the grid barrier; 1 or 2: that phase only
    PREFETCH: tl.constexpr,  # load the first w2 step before waiting at the barrier
    I_STEPS: tl.constexpr,  # cdiv(I, BLOCK_I2)
    STAGES1: tl.constexpr,  # software pipelining of phase 1's loop
    STAGES2: tl.constexpr,  # and of phase 2's
):
    """One decode MoE layer; see the module docstring."""
    pid = tl.program_id(0)
    num_p = tl.num_programs(0)
    numel = num_tokens * TOP_K
    if PHASE != 2:
        # phase 1: act[p, n] = act(w13[e] x[t]) for tiles (pair p, BLOCK_N1 columns); the
        # program's tiles and their H steps run as ONE software-pipelined loop, so the loads
        # of the next tile are in flight during a tile's epilogue
        n_t1 = tl.cdiv(inter, BLOCK_N1)
        k_steps = tl.cdiv(H, BLOCK_K1)
        mine1 = tl.cdiv(tl.maximum(numel * n_t1 - pid, 0), num_p)
        R: tl.constexpr = 2 * BLOCK_N1 if GATED else BLOCK_N1
        offs_r = tl.arange(0, R)
        offs_k = tl.arange(0, BLOCK_K1)
        acc2 = tl.zeros((R, BLOCK_K1), dtype=tl.float32)
        for it in tl.range(0, mine1 * k_steps, num_stages=STAGES1):
            tile = pid + (it // k_steps) * num_p
            ks = it % k_steps
            p = tile // n_t1
            n0 = (tile % n_t1) * BLOCK_N1
            e = _slot_expert(topk_ids_ptr, p, num_experts)
            t = p // TOP_K
            rows = (2 * n0 if GATED else n0) + offs_r
            r_lim = tl.where(
                e >= 0, 2 * inter if GATED else inter, 0
            )  # an invalid expert reads nothing
            kk = ks * BLOCK_K1 + offs_k
            xv = tl.load(x_ptr + t * stride_xt + kk, mask=kk < H, other=0.0)
            w_ptrs = (
                w13_ptr + e.to(tl.int64) * stride_13e + rows[:, None] * stride_13n + kk[None, :]
            )
            wv = tl.load(w_ptrs, mask=(rows[:, None] < r_lim) & (kk[None, :] < H), other=0.0)
            # elementwise fp32 partial products, reduced once per tile
            acc2 += wv.to(tl.float32) * xv.to(tl.float32)[None, :]
            if ks == k_steps - 1:
                acc = tl.sum(acc2, axis=1)
                acc2 = tl.zeros((R, BLOCK_K1), dtype=tl.float32)
                if GATED:
                    g, u = tl.split(tl.reshape(acc, (BLOCK_N1, 2)))
                else:
                    g = acc
                    u = acc
                cols = n0 + tl.arange(0, BLOCK_N1)
                c_lim = tl.where(e >= 0, inter, 0)
                if WEIGHT_POS == 1:
                    wt = tl.load(topk_w_ptr + p).to(tl.float32)
                    g = g * wt
                    u = u * wt
                if HAS_BIAS:
                    bb = b13_ptr + tl.maximum(e, 0).to(tl.int64) * stride_b13e
                    if GATED:
                        g += tl.load(bb + 2 * cols, mask=cols < c_lim, other=0.0).to(tl.float32)
                        u += tl.load(bb + 2 * cols + 1, mask=cols < c_lim, other=0.0).to(tl.float32)
                    else:
                        g += tl.load(bb + cols, mask=cols < c_lim, other=0.0).to(tl.float32)
                a = _apply_act(g, u, ACT, GATED, ALPHA, LIMIT)
                tl.store(act_ptr + p.to(tl.int64) * inter + cols, a.to(act_ptr.dtype.element_ty),
                         mask=cols < c_lim)  # fmt: skip

    n_t2 = tl.cdiv(H, BLOCK_N2)
    tiles2 = num_tokens * n_t2
    if PHASE == 0:
        # grid barrier: every thread's act stores before the count (CTA barrier + release)
        tl.debug_barrier()
        tl.atomic_add(bar_ptr, 1, sem="release", scope="gpu")
    first = tl.zeros((BLOCK_N2, BLOCK_I2), dtype=w2_ptr.dtype.element_ty)
    if PREFETCH:  # noqa: SIM102 (constexpr test)
        if pid < tiles2:
            e0 = _slot_expert(topk_ids_ptr, (pid // n_t2) * TOP_K, num_experts)
            first = _w2_step(w2_ptr, e0, (pid % n_t2) * BLOCK_N2, 0, H, inter, stride_2e, stride_2h,
                             BLOCK_N2, BLOCK_I2, True)  # fmt: skip
    if PHASE == 0:
        while tl.atomic_add(bar_ptr, 0, sem="acquire", scope="gpu") < num_p:
            pass
        tl.debug_barrier()
        # the last program to leave resets both counters for the next call
        if tl.atomic_add(bar_ptr + 1, 1, sem="relaxed", scope="gpu") == num_p - 1:
            tl.store(bar_ptr, 0)
            tl.store(bar_ptr + 1, 0)
    if PHASE != 1:
        # phase 2: out[t, n] = sum_j round(w_j * (w2[e_j] act[t*k + j] + b2[e_j])), slot order;
        # the program's tiles, their slots and I steps run as one software-pipelined loop (the
        # first step's w2 tile came in before the barrier)
        offs_i = tl.arange(0, BLOCK_I2)
        steps2: tl.constexpr = TOP_K * I_STEPS
        mine2 = tl.cdiv(tl.maximum(tiles2 - pid, 0), num_p)
        out = tl.zeros((BLOCK_N2,), dtype=tl.float32)
        y2 = tl.zeros((BLOCK_N2, BLOCK_I2), dtype=tl.float32)
        for it in tl.range(0, mine2 * steps2, num_stages=STAGES2):
            tile = pid + (it // steps2) * num_p
            q = it % steps2
            j = q // I_STEPS
            s = q % I_STEPS
            t = tile // n_t2
            n0 = (tile % n_t2) * BLOCK_N2
            p = t * TOP_K + j
            e = _slot_expert(topk_ids_ptr, p, num_experts)
            wv = _w2_step(w2_ptr, e, n0, s * BLOCK_I2, H, inter, stride_2e, stride_2h, BLOCK_N2,
                          BLOCK_I2, (not PREFETCH) | (it > 0))  # fmt: skip
            if PREFETCH:
                wv = tl.where(it == 0, first, wv)
            i_lim = tl.where(e >= 0, inter, 0)  # an invalid slot reads nothing, adds zero
            av = tl.load(act_ptr + p.to(tl.int64) * inter + s * BLOCK_I2 + offs_i,
                         mask=s * BLOCK_I2 + offs_i < i_lim, other=0.0,
                         cache_modifier=".cg")  # fmt: skip
            y2 += wv.to(tl.float32) * av.to(tl.float32)[None, :]
            if s == I_STEPS - 1:
                y = tl.sum(y2, axis=1)
                y2 = tl.zeros((BLOCK_N2, BLOCK_I2), dtype=tl.float32)
                offs_n = n0 + tl.arange(0, BLOCK_N2)
                if HAS_BIAS:
                    y += tl.load(b2_ptr + tl.maximum(e, 0).to(tl.int64) * stride_b2e + offs_n,
                                 mask=offs_n < tl.where(e >= 0, H, 0),
                                 other=0.0).to(tl.float32)  # fmt: skip
                if WEIGHT_POS == 2:
                    y = y * tl.load(topk_w_ptr + p).to(tl.float32)
                out += y.to(out_ptr.dtype.element_ty).to(tl.float32)
                if j == TOP_K - 1:
                    tl.store(out_ptr + t.to(tl.int64) * stride_ot + offs_n,
                             out.to(out_ptr.dtype.element_ty), mask=offs_n < H)  # fmt: skip
                    out = tl.zeros((BLOCK_N2,), dtype=tl.float32)


@triton.jit
def _slot_expert(topk_ids_ptr, pair, num_experts):
    """Expert of ``pair``, or -1 when it lies outside ``[0, num_experts)``."""
    e = tl.load(topk_ids_ptr + pair)
    return tl.where((e >= 0) & (e < num_experts), e, -1)


_BARRIERS: dict[str, torch.Tensor] = {}


def _barrier(device: torch.device) -> torch.Tensor:
    """The zeroed, self-resetting barrier counters of ``device`` (one pair per device: two of
    these layers must never run at once, e.g. on two streams). Allocated outside any CUDA
    graph capture (a buffer from a graph's private pool would not outlive the graph)."""
    buf = _BARRIERS.get(str(device))
    if buf is None:
        if torch.cuda.is_current_stream_capturing():
            raise RuntimeError("call fused_moe_decode once before capturing it in a CUDA graph")
        buf = _BARRIERS[str(device)] = torch.zeros(2, dtype=torch.int32, device=device)
    return buf


def fused_moe_decode(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    *,
    act_code: int,
    gated: bool,
    w13_bias: torch.Tensor | None = None,
    w2_bias: torch.Tensor | None = None,
    weight_pos: int = _WEIGHT_OUTPUT,
    swiglu_alpha: float = 1.702,
    swiglu_limit: float = 7.0,
    config: DecodeConfig | None = None,
    split_phases: bool | None = None,
    barrier: torch.Tensor | None = None,
    phases: tuple[int, ...] = (1, 2),
) -> torch.Tensor:
    """Decode MoE layer on ``x`` [T, H] (w13 in ``TritonExperts``' interleaved layout) as one
    cooperative kernel, or as the ``phases`` launched one by one (``split_phases``; the
    default off a GPU). ``barrier``: two zeroed int32 counters to use instead of the device's
    own. Inputs are not checked: a probe, not a backend."""
    cfg = config or DecodeConfig()
    t, h = x.shape
    e, _, _ = w13.shape
    i = w2.shape[2]
    k = topk_ids.shape[1]
    act = torch.empty(t * k, i, dtype=x.dtype, device=x.device)
    out = torch.empty(t, h, dtype=x.dtype, device=x.device)
    if split_phases is None:
        split_phases = x.device.type != "cuda"
    programs = sm_count(x.device) * cfg.programs_per_sm
    bar = barrier if barrier is not None else topk_ids if split_phases else _barrier(x.device)
    b13 = w13_bias if w13_bias is not None else x
    b2 = w2_bias if w2_bias is not None else x
    args = (
        x, w13, w2, b13, b2, topk_weights, topk_ids, act, out, bar, t, h, i, e,
        x.stride(0), w13.stride(0), w13.stride(1), w2.stride(0), w2.stride(1),
        b13.stride(0) if w13_bias is not None else 0, b2.stride(0) if w2_bias is not None else 0,
        out.stride(0),
    )  # fmt: skip
    bi2 = min(cfg.block_i2, triton.next_power_of_2(i))
    consts = dict(
        TOP_K=k, GATED=gated, ACT=act_code, ALPHA=float(swiglu_alpha), LIMIT=float(swiglu_limit),
        WEIGHT_POS=weight_pos, HAS_BIAS=w13_bias is not None, BLOCK_N1=cfg.block_n1,
        BLOCK_K1=cfg.block_k1, BLOCK_N2=cfg.block_n2,
        BLOCK_I2=bi2, I_STEPS=triton.cdiv(i, bi2), STAGES1=cfg.stages1, STAGES2=cfg.stages2,
        num_warps=cfg.num_warps,
    )  # fmt: skip
    if split_phases:
        for phase in phases:
            _decode_layer_kernel[(programs,)](*args, PHASE=phase, PREFETCH=False, **consts)
    else:
        _decode_layer_kernel[(programs,)](
            *args, PHASE=0, PREFETCH=cfg.prefetch, launch_cooperative_grid=True, **consts
        )
    return out


#: Named cuts timed by ``main`` (``--variants``); ``base`` is ``DecodeConfig()``.
VARIANTS: dict[str, DecodeConfig] = {
    "base": DecodeConfig(),
    "n2_8": DecodeConfig(block_n2=8),
    "n2_8i1024": DecodeConfig(block_n2=8, block_i2=1024),
    "n2_8_k1_512": DecodeConfig(block_n2=8, block_k1=512),
    "n2_4": DecodeConfig(block_n2=4),
    "w8p1s3": DecodeConfig(num_warps=8, programs_per_sm=1, stages1=3, stages2=3),
    "w4p4s3": DecodeConfig(programs_per_sm=4, stages1=3, stages2=3),
    "nopf": DecodeConfig(prefetch=False),
}


def _calls(case: Any, wt: dict[str, Any], act: int, cfg: DecodeConfig, **kw: Any) -> list[Any]:
    """One ``fused_moe_decode`` call per routing set of a ``kernels.make_case`` case."""
    s = case.shape

    def run(tw: Any, ti: Any) -> Any:
        return fused_moe_decode(
            case.x, wt["w13"], wt["w2"], tw, ti, act_code=act, gated=s.gated,
            w13_bias=wt["w13_bias"], w2_bias=wt["w2_bias"], config=cfg, **kw,
        )  # fmt: skip

    return [lambda tw=tw, ti=ti: run(tw, ti) for tw, ti in case.routings]


def main() -> None:
    """Time the shipped Triton layer against the one-kernel variants (GPU machine)."""
    sys.path.insert(0, os.path.dirname(__file__))
    import kernels as K
    from _bench_util import SHAPES, duty_fraction, time_against_shipped, write_json

    from moe_policy.experts.triton.fused_moe import ACTIVATION_CODES

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", nargs="+", default=["qwen3-30b-a3b"], choices=sorted(SHAPES))
    ap.add_argument("--tokens", nargs="+", type=int, default=[1])
    ap.add_argument("--variants", nargs="+", default=["base", "n2_8"], choices=sorted(VARIANTS))
    ap.add_argument("--phases", action="store_true", help="also time each phase on its own")
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--duty", type=duty_fraction, default=0.25)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()

    rows = []
    for name in args.shapes:
        shape = SHAPES[name]
        weights = K.make_weights(shape)
        for t in args.tokens:
            case = K.make_case(shape, t, weights, None)
            wt = K._triton_backend(case).weights
            act = ACTIVATION_CODES[shape.activation]
            variants = {"shipped": K.build_triton(case)}
            for v in args.variants:
                variants[v] = _calls(case, wt, act, VARIANTS[v])
                for ph in (1, 2) if args.phases else ():
                    variants[f"{v}_phase{ph}"] = _calls(
                        case, wt, act, replace(VARIANTS[v], prefetch=False),
                        split_phases=True, phases=(ph,),
                    )  # fmt: skip
            rows += time_against_shipped(shape, t, variants, rounds=args.rounds,
                                         duty=args.duty, checked=args.variants)  # fmt: skip
    os.makedirs(args.out, exist_ok=True)
    write_json(os.path.join(args.out, "decode_barrier_probe.json"), {"rows": rows})


if __name__ == "__main__":
    main()
