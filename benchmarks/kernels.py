"""Fused-MoE kernels on the GPU: µs, TB/s, TFLOP/s and ratio to the H200 lower bound.

A table of named implementations (``IMPLEMENTATIONS``: name -> :class:`Impl`) is run over model
shapes and token counts with uniform routing. Each builder gets a :class:`Case` and returns one
callable per routing set; graph-capturable implementations are timed as CUDA-graph replays of
all routing sets (several sets so that consecutive calls touch different experts), the others
with events around eager calls. Ceilings (copy bandwidth, bf16 matmul rate) are re-measured
first, as a short burst and held for ``--held`` seconds.

The H200 is power-capped: under a long matmul load it clocks down (1980 -> 1300-1500 MHz), so
a timing depends on what ran before it. Graph timings therefore rest the GPU between samples
(``--duty``, default 0.25: busy a quarter of the time), which keeps every sample at the boost
clock the burst ceilings were measured at (H200, 2026-11-30: p20-p80 within 0.3 %, where
back-to-back replays spread 5-10 % and ran 3-17 % slower). For T >= ``HELD_MIN_T`` the
Triton rows are also replayed back to back for ``--held`` seconds (``held_us``) and compared
with the held ceilings (``ratio_held``): the sustained, power-capped view. The LoRA row's
``overhead_vs_triton`` comes from the two layers timed interleaved in the same rounds. Each
row records the board's clock, power and clock-event reasons right after its timing. Writes
``kernels.json`` and ``kernels.png`` to ``--out`` (default ``$OUT`` or ``.``).

Add a backend: write ``def build_x(case) -> list[callable]`` and add
``IMPLEMENTATIONS["x"] = Impl(build_x)``.

    python -m benchmarks.kernels --shapes mixtral-8x7b --tokens 1 64 1024
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from benchmarks.common import (
    SHAPES,
    MoEShape,
    alloc_block,
    duty_fraction,
    gpu_state,
    layer_bytes,
    layer_flops,
    lower_bound_us,
    measure_ceilings,
    peak_extra_bytes,
    plot_ratios,
    positive_int,
    time_eager_us,
    time_graph_held_us,
    time_graph_us,
    time_graphs_interleaved,
    write_json,
)

TOKENS = (1, 16, 64, 256, 1024, 4096, 8192)
BENCH_SHAPES = ("nemotron3-nano", "mixtral-8x7b", "qwen3-30b-a3b")
LORA_SLOTS, LORA_RANK = 4, 16
#: Rows with at least this many tokens get a held timing (decode never reaches the power cap).
HELD_MIN_T = 1024
#: Rounds of the interleaved LoRA/base timing behind ``overhead_vs_triton``.
PAIR_ROUNDS = 10
#: vLLM Triton fused-MoE GEMMs (tuned configs, alignment excluded) / lower bound, from issue 4.
VLLM_RATIO = {
    ("nemotron3-nano", 1): 1.60, ("nemotron3-nano", 64): 1.08, ("nemotron3-nano", 1024): 1.20,
    ("nemotron3-nano", 8192): 1.98, ("mixtral-8x7b", 1): 1.16, ("mixtral-8x7b", 64): 1.03,
    ("mixtral-8x7b", 1024): 1.86, ("mixtral-8x7b", 8192): 1.46, ("qwen3-30b-a3b", 1): 2.06,
    ("qwen3-30b-a3b", 64): 1.10, ("qwen3-30b-a3b", 1024): 1.44, ("qwen3-30b-a3b", 8192): 2.04,
}  # fmt: skip


class Skip(Exception):
    """An implementation cannot run this case (the reason goes into the table)."""


@dataclass
class Case:
    """Inputs of one (shape, T): weights in the common layout, routing sets, LoRA contexts."""

    shape: MoEShape
    tokens: int
    weights: dict[str, Any]
    x: Any
    routings: list[tuple[Any, Any]]
    lora: list[Any] = field(default_factory=list)


@dataclass(frozen=True)
class Impl:
    """A benchmarked implementation: builder, whether it can be graph-captured, token cap."""

    build: Callable[[Case], list[Callable[[], Any]]]
    graphable: bool = True
    max_tokens: int | None = None
    uses_lora: bool = False
    baseline: str | None = None  # implementation this one's overhead is reported against


# ---------------------------------------------------------------- implementations


def _act(h: Any, shape: MoEShape) -> Any:
    from moe_policy.experts.reference import apply_activation

    return apply_activation(h, shape.activation, shape.gated)


def build_naive_loop(case: Case) -> list[Callable[[], Any]]:
    """Per-expert torch loop (nonzero per expert: host syncs, not graph-capturable)."""
    import torch

    s, w = case.shape, case.weights

    def run(tw: Any, ti: Any) -> Any:
        out = torch.zeros(case.x.shape, dtype=torch.float32, device=case.x.device)
        for e in range(s.num_experts):
            tok, slot = torch.nonzero(ti == e, as_tuple=True)
            if tok.numel() == 0:
                continue
            a = _act(case.x[tok] @ w["w13"][e].t(), s)
            y = a @ w["w2"][e].t()
            out.index_add_(0, tok, y.float() * tw[tok, slot, None])
        return out.to(case.x.dtype)

    return [lambda tw=tw, ti=ti: run(tw, ti) for tw, ti in case.routings]


def build_grouped_mm(case: Case) -> list[Callable[[], Any]]:
    """Sort pairs by expert, torch._grouped_mm for both GEMMs, weighted index_add (no host sync)."""
    import torch

    gmm = getattr(torch, "_grouped_mm", None)
    if gmm is None or case.x.dtype != torch.bfloat16:
        raise Skip("torch._grouped_mm missing (or not bf16)")
    s, w = case.shape, case.weights
    w13t, w2t = w["w13"].transpose(1, 2), w["w2"].transpose(1, 2)  # column-major [E, K, N] views
    t, k, e = case.tokens, s.top_k, s.num_experts

    def run(tw: Any, ti: Any) -> Any:
        flat = ti.flatten().long()
        order = torch.argsort(flat, stable=True)
        counts = torch.zeros(e, dtype=torch.int64, device=flat.device)
        counts.scatter_add_(0, flat, torch.ones_like(flat))
        offs = torch.cumsum(counts, 0).to(torch.int32)
        tok = order // k
        h = gmm(case.x[tok], w13t, offs=offs)
        a = _act(h, s)
        y = gmm(a, w2t, offs=offs)
        y = y.float() * tw.flatten()[order, None]
        out = torch.zeros(t, s.hidden, dtype=torch.float32, device=y.device)
        out.index_add_(0, tok, y)
        return out.to(case.x.dtype)

    calls = [lambda tw=tw, ti=ti: run(tw, ti) for tw, ti in case.routings]
    calls[0]()  # probe: raises here if this torch/GPU cannot run it
    return calls


def _triton_backend(case: Case) -> Any:
    from moe_policy.experts.base import ExpertsConfig
    from moe_policy.experts.triton.fused_moe import TritonExperts

    s, w = case.shape, case.weights
    cfg = ExpertsConfig(
        s.num_experts, s.hidden, s.inter, s.top_k, s.activation, s.gated, s.has_bias
    )
    return TritonExperts(cfg, w["w13"], w["w2"], w.get("w13_bias"), w.get("w2_bias"))


def build_triton(case: Case) -> list[Callable[[], Any]]:
    """Our Triton fused MoE (alignment included)."""
    be = _triton_backend(case)
    return [lambda tw=tw, ti=ti: be.apply(case.x, tw, ti) for tw, ti in case.routings]


def build_triton_lora(case: Case) -> list[Callable[[], Any]]:
    """Our Triton fused MoE with LoRA: rank 16, 4 adapters, round-robin tokens."""
    be = _triton_backend(case)
    return [
        lambda tw=tw, ti=ti, ctx=ctx: be.apply(case.x, tw, ti, ctx)
        for (tw, ti), ctx in zip(case.routings, case.lora, strict=True)
    ]


IMPLEMENTATIONS: dict[str, Impl] = {
    "naive_loop": Impl(build_naive_loop, graphable=False, max_tokens=256),
    "torch_grouped_mm": Impl(build_grouped_mm),
    "triton": Impl(build_triton),
    "triton_lora": Impl(build_triton_lora, uses_lora=True, baseline="triton"),
}


# ---------------------------------------------------------------- cases


def make_weights(shape: MoEShape, seed: int = 0) -> dict[str, Any]:
    """Random bf16 weights in the common layout, scaled so that h ~ N(0, 1)."""
    import torch

    g = torch.Generator(device="cuda").manual_seed(seed)
    e, h, i = shape.num_experts, shape.hidden, shape.inter

    def rnd(*size: int, fan: int) -> Any:
        return (
            torch.randn(*size, device="cuda", generator=g, dtype=torch.bfloat16) / fan**0.5
        ).contiguous()

    w = {"w13": rnd(e, shape.n1, h, fan=h), "w2": rnd(e, h, i, fan=i)}
    if shape.has_bias:
        w["w13_bias"] = rnd(e, shape.n1, fan=25)
        w["w2_bias"] = rnd(e, h, fan=25)
    return w


def make_lora(shape: MoEShape, seed: int = 1) -> Any:
    """4 slots of rank-16 random adapters."""
    import torch

    from moe_policy.experts.lora import MoELoRAAdapters

    g = torch.Generator(device="cuda").manual_seed(seed)
    e, h, i, s = shape.num_experts, shape.hidden, shape.inter, 2 if shape.gated else 1
    ad = MoELoRAAdapters.allocate(
        num_slots=LORA_SLOTS, num_experts=e, hidden_size=h, intermediate_size=i,
        max_rank=LORA_RANK, num_slices=s, dtype=torch.bfloat16, device="cuda",
    )  # fmt: skip

    def rnd(*size: int, fan: int) -> Any:
        return torch.randn(*size, device="cuda", generator=g, dtype=torch.bfloat16) / fan**0.5

    for slot in range(LORA_SLOTS):
        ad.set_adapter(
            slot,
            w13_a=[rnd(e, LORA_RANK, h, fan=h) for _ in range(s)],
            w13_b=[rnd(e, i, LORA_RANK, fan=LORA_RANK) for _ in range(s)],
            w2_a=rnd(e, LORA_RANK, i, fan=i),
            w2_b=rnd(e, h, LORA_RANK, fan=LORA_RANK),
            scaling=1.0,
        )
    return ad


def make_case(
    shape: MoEShape, t: int, weights: dict[str, Any], adapters: Any, seed: int = 0
) -> Case:
    """Uniform routing sets (softmax top-k of random logits); more sets at small T."""
    import torch

    from moe_policy.experts.lora import MoELoRAContext

    n_sets = 8 if t <= 256 else (4 if t <= 1024 else 2)
    g = torch.Generator(device="cuda").manual_seed(seed + t)
    x = torch.randn(t, shape.hidden, device="cuda", generator=g, dtype=torch.bfloat16)
    routings = []
    for _ in range(n_sets):
        logits = torch.randn(t, shape.num_experts, device="cuda", generator=g)
        tw, ti = torch.topk(logits.softmax(-1), shape.top_k, dim=-1)
        routings.append(((tw / tw.sum(-1, keepdim=True)).contiguous(), ti.int().contiguous()))
    mapping = (torch.arange(t, device="cuda") % LORA_SLOTS).int()
    lora = [MoELoRAContext(adapters, mapping) for _ in routings] if adapters is not None else []
    return Case(shape, t, weights, x, routings, lora)


def mem_limit_bytes(shape: MoEShape, t: int, lora: bool) -> int:
    """Issue 4's budget: a T*k*max(N1, H) and a T*k*I bf16 buffer (+ T*k*R*(S+1) fp32 with
    LoRA), each as the allocator's block (``alloc_block``), the unit the peak is counted in."""
    pairs = t * shape.top_k
    lim = alloc_block(pairs * max(shape.n1, shape.hidden) * 2) + alloc_block(
        pairs * shape.inter * 2
    )
    if lora:
        lim += alloc_block(pairs * LORA_RANK * ((2 if shape.gated else 1) + 1) * 4)
    return lim


def overhead_pair(
    base_name: str,
    base_calls: list[Callable[[], Any]],
    calls: list[Callable[[], Any]],
    duty: float,
    rounds: int = PAIR_ROUNDS,
) -> dict[str, Any]:
    """``overhead_vs_<base_name>``: this layer over its baseline, both timed interleaved in the
    same rounds (so that neither gains from the other having heated or cooled the board), with
    both times kept (``pair_us``)."""
    timed = time_graphs_interleaved({"base": base_calls, "this": calls}, rounds, 2, duty)
    return {
        "overhead_vs_" + base_name: timed["this"]["us"] / timed["base"]["us"],
        "pair_us": {"base": timed["base"]["us"], "this": timed["this"]["us"]},
    }


def kernel_breakdown(fn: Callable[[], Any], reps: int = 3) -> list[tuple[str, float]]:
    """Device time of each kernel of one eager call, in launch order (median of reps)."""
    import statistics

    import torch
    from torch.profiler import ProfilerActivity, profile

    runs: list[list[tuple[str, float]]] = []
    for _ in range(reps):
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
        evs = [ev for ev in prof.events() if str(getattr(ev, "device_type", "")).endswith("CUDA")]
        evs.sort(key=lambda ev: ev.time_range.start)
        runs.append([(ev.name[:40], ev.time_range.elapsed_us()) for ev in evs])
    n = min(len(r) for r in runs)
    return [(runs[0][j][0], statistics.median(r[j][1] for r in runs)) for j in range(n)]


# ---------------------------------------------------------------- driver


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Benchmark every (shape, T, implementation) asked for; returns the JSON payload."""
    import torch

    from moe_policy.experts.triton.config import get_config

    torch.backends.cuda.matmul.allow_tf32 = False
    info = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": __import__("triton").__version__,
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "argv": sys.argv[1:],
    }
    ceil = {"copy_tbps": 4.3, "matmul_tflops": 790.0} if args.warm else measure_ceilings()
    print(f"# {info['device']} torch {info['torch']} triton {info['triton']}", flush=True)
    print(
        f"# ceilings: copy {ceil['copy_tbps']:.2f} TB/s, bf16 matmul {ceil['matmul_tflops']:.0f} TFLOP/s",
        flush=True,
    )
    held = None
    if not args.warm and args.held > 0:
        held = measure_ceilings(held_s=args.held)
        print(f"# held {args.held:.0f}s each: copy {held['copy_tbps']:.2f} TB/s, bf16 matmul "
              f"{held['matmul_tflops']:.0f} TFLOP/s ({gpu_state()})", flush=True)  # fmt: skip
    rows: list[dict[str, Any]] = []
    for sname in args.shapes:
        shape = SHAPES[sname]
        weights = make_weights(shape)
        need_lora = any(IMPLEMENTATIONS[n].uses_lora for n in args.impls)
        adapters = make_lora(shape) if need_lora else None
        for t in args.tokens:
            case = make_case(shape, t, weights, adapters)
            bound = lower_bound_us(shape, t, ceil["copy_tbps"], ceil["matmul_tflops"])
            base_us: dict[str, float] = {}
            built: dict[str, list[Callable[[], Any]]] = {}  # graphable calls, for pair timings
            for name in args.impls:
                impl = IMPLEMENTATIONS[name]
                row: dict[str, Any] = {"shape": sname, "T": t, "impl": name, "bound_us": bound}
                if name.startswith("triton"):
                    row["config"] = get_config(t, shape.num_experts, shape.top_k, shape.hidden,
                                               shape.inter, shape.gated, info["device"]).to_dict()  # fmt: skip
                try:
                    if impl.max_tokens is not None and t > impl.max_tokens:
                        raise Skip(f"skipped above T={impl.max_tokens} to save time")
                    calls = impl.build(case)
                    if args.warm:
                        for c in calls:
                            c()
                        torch.cuda.synchronize()
                        continue
                    reps = args.replays
                    timing = (
                        time_graph_us(calls, reps, args.duty)
                        if impl.graphable
                        else time_eager_us(calls, reps)
                    )
                    row.update(timing)
                    row["duty"] = args.duty if impl.graphable else 1.0
                    row["extra_mem_bytes"] = peak_extra_bytes(calls[0])
                    row["mem_limit_bytes"] = mem_limit_bytes(shape, t, impl.uses_lora)
                    row["tbps"] = layer_bytes(shape, t) / (row["us"] * 1e-6) / 1e12
                    row["tflops"] = layer_flops(shape, t) / (row["us"] * 1e-6) / 1e12
                    row["ratio"] = row["us"] / bound
                    row["gpu"] = gpu_state()  # the board's state at the end of the timing
                    if (
                        held is not None
                        and t >= HELD_MIN_T
                        and impl.graphable
                        and name.startswith("triton")
                    ):
                        row.update(time_graph_held_us(calls, args.held))
                        row["ratio_held"] = row["held_us"] / lower_bound_us(
                            shape, t, held["copy_tbps"], held["matmul_tflops"]
                        )
                        row["gpu_held"] = gpu_state()
                    if (sname, t) in VLLM_RATIO:
                        row["vllm_ratio"] = VLLM_RATIO[(sname, t)]
                    if impl.baseline in built and impl.graphable:
                        row.update(
                            overhead_pair(impl.baseline, built[impl.baseline], calls, args.duty)
                        )
                    elif impl.baseline in base_us:
                        row["overhead_vs_" + impl.baseline] = row["us"] / base_us[impl.baseline]
                    base_us[name] = row["us"]
                    if impl.graphable:
                        built[name] = calls
                    if args.breakdown and name.startswith("triton"):
                        row["kernels"] = kernel_breakdown(calls[0])
                except Skip as exc:
                    row["skipped"] = str(exc)
                except Exception as exc:  # keep going: one failure must not lose the run
                    row["error"] = f"{type(exc).__name__}: {exc}"[:400]
                    traceback.print_exc()
                if args.warm:
                    continue
                rows.append(row)
                _print_row(row)
            del case
        del weights, adapters
        torch.cuda.empty_cache()
    out = {"info": info, "ceilings": ceil, "rows": rows}
    if held is not None:
        out["ceilings_held"] = held
    return out


def median_of_runs(payloads: list[dict[str, Any]]) -> dict[str, Any]:
    """One payload from several whole runs: per (shape, T, impl) the row of the run with the
    median ratio (each run's rows use that run's own ceilings), every run's ratio kept, and
    the median LoRA overhead of the runs. With an even number of runs both take the upper
    middle (the slower run, the larger overhead), so the figures never flatter."""
    first = payloads[0]
    keyed: dict[tuple[str, int, str], list[dict[str, Any]]] = {}
    for p in payloads:
        for r in p["rows"]:
            keyed.setdefault((r["shape"], r["T"], r["impl"]), []).append(r)
    rows = []
    for runs in keyed.values():
        timed = sorted((r for r in runs if "ratio" in r), key=lambda r: r["ratio"])
        if not timed:
            rows.append(runs[0])
            continue
        row = dict(timed[len(timed) // 2])
        row["ratio_runs"] = [r["ratio"] for r in runs if "ratio" in r]
        if any("overhead_vs_triton" in r for r in runs):
            over = sorted(r["overhead_vs_triton"] for r in runs if "overhead_vs_triton" in r)
            row["overhead_vs_triton"] = over[len(over) // 2]
        rows.append(row)
    info = dict(first["info"], runs=len(payloads))
    out = {"info": info, "ceilings": first["ceilings"],
           "ceilings_runs": [p["ceilings"] for p in payloads], "rows": rows}  # fmt: skip
    if any("ceilings_held" in p for p in payloads):
        out["ceilings_held_runs"] = [p.get("ceilings_held") for p in payloads]
    return out


def load_sweep(path: str) -> dict[str, Any]:
    """A sweep JSON as ``run`` returns it; ValueError naming the file when it is not one."""
    try:
        with open(path) as f:
            payload = json.load(f)
    except OSError as exc:
        raise ValueError(f"--merge {path}: {exc.strerror or exc}") from exc
    except json.JSONDecodeError as exc:
        raise ValueError(f"--merge {path}:{exc.lineno}:{exc.colno}: not JSON ({exc.msg})") from exc
    missing = [
        k for k in ("info", "ceilings", "rows") if not isinstance(payload, dict) or k not in payload
    ]
    if missing:
        raise ValueError(f"--merge {path}: not a kernels.py sweep (no {', '.join(missing)})")
    return payload


def _print_row(r: dict[str, Any]) -> None:
    head = f"{r['shape']:15s} T={r['T']:5d} {r['impl']:17s}"
    if "us" not in r:
        print(f"{head} {r.get('skipped') or r.get('error')}", flush=True)
        return
    extra = r.get("overhead_vs_triton")
    vr = r.get("vllm_ratio")
    ks = " ".join(f"{n.split('_kernel')[0][-12:]}:{us:.1f}" for n, us in r.get("kernels", []))
    held = r.get("ratio_held")
    gpu = r.get("gpu", {})
    state = f" {gpu['sm_mhz']:.0f}MHz" if "sm_mhz" in gpu else ""
    state += " power-capped" if "sw_power_cap" in gpu.get("throttle", []) else ""
    print(
        f"{head} {r['us']:9.1f}us bound {r['bound_us']:8.1f} ratio {r['ratio']:5.2f}"
        f"{'' if held is None else f' (held {held:.2f})'}"
        f"{'' if vr is None else f' (vllm {vr:.2f})'} {r['tbps']:5.2f}TB/s {r['tflops']:6.1f}TF"
        f" mem {r['extra_mem_bytes'] / 2**20:7.1f}/{r['mem_limit_bytes'] / 2**20:7.1f}MiB"
        f"{'' if extra is None else f' lora x{extra:.3f}'}{state} {ks}",
        flush=True,
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shapes", nargs="+", default=list(BENCH_SHAPES), choices=sorted(SHAPES))
    p.add_argument("--tokens", nargs="+", type=positive_int, default=list(TOKENS))
    p.add_argument(
        "--impls", nargs="+", default=list(IMPLEMENTATIONS), choices=sorted(IMPLEMENTATIONS)
    )
    p.add_argument("--replays", type=positive_int, default=50)
    p.add_argument("--out", default=os.environ.get("OUT", "."))
    p.add_argument("--tag", default="kernels")
    p.add_argument("--warm", action="store_true", help="only compile/run once (parallel warm-up)")
    p.add_argument("--breakdown", action="store_true", help="per-kernel device times (profiler)")
    p.add_argument("--held", type=float, default=2.0, metavar="S",
                   help="also measure the ceilings, and the Triton rows at T >= "
                        f"{HELD_MIN_T}, held S seconds each (0: skip); those rows get "
                        "held_us and ratio_held, the power-capped view")  # fmt: skip
    p.add_argument("--duty", type=duty_fraction, default=0.25,
                   help="graph timings keep the GPU busy at most this fraction of the time "
                        "(1: back to back)")  # fmt: skip
    p.add_argument("--runs", type=positive_int, default=1,
                   help="whole sweeps; the JSON keeps each point's median-ratio run, and each "
                        "run is also written as <tag>_runN.json when it ends")  # fmt: skip
    p.add_argument("--merge", nargs="+", metavar="JSON",
                   help="no GPU: merge whole-sweep JSONs (e.g. the <tag>_runN.json that each "
                        "run of --runs N leaves, should the call be cut off) like --runs does")  # fmt: skip
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    if args.merge:
        try:
            payloads = [load_sweep(path) for path in args.merge]
        except ValueError as exc:
            p.error(str(exc))
    else:
        payloads = []
        for i in range(1 if args.warm else args.runs):
            payloads.append(run(args))
            if args.runs > 1:  # each run on disk as soon as it ends
                write_json(os.path.join(args.out, f"{args.tag}_run{i + 1}.json"), payloads[-1])
        if args.warm:
            return
    payload = payloads[0]
    if len(payloads) > 1:
        payload = median_of_runs(payloads)
        print("# median of runs (ratio; LoRA overhead median of runs):")
        for r in payload["rows"]:
            if r.get("ratio_runs"):
                print(f"{r['shape']:15s} T={r['T']:5d} {r['impl']:18s} x{r['ratio']:.2f} "
                      f"runs {' '.join(f'{v:.2f}' for v in r['ratio_runs'])}"
                      + (f"  lora x{r['overhead_vs_triton']:.3f}" if "overhead_vs_triton" in r
                         else ""))  # fmt: skip
    write_json(os.path.join(args.out, f"{args.tag}.json"), payload)
    try:
        plot_ratios([r for r in payload["rows"] if "ratio" in r], os.path.join(args.out, f"{args.tag}.png"),
                    f"{payload['info']['device']}: fused MoE time / lower bound")  # fmt: skip
    except Exception as exc:  # matplotlib missing must not lose the JSON
        print(f"plot failed: {exc}")


if __name__ == "__main__":
    main()
