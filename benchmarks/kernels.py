"""Fused-MoE kernels on a GPU: µs, TB/s, TFLOP/s and ratio to the lower bound; ``--table``
renders a saved sweep and its targets without a GPU.

A table of named implementations (``IMPLEMENTATIONS``: name -> :class:`Impl`) is run over model
shapes and token counts with uniform routing. Each builder gets a :class:`Case` and returns one
callable per routing set; graph-capturable implementations are timed as CUDA-graph replays of
all routing sets (several sets so that consecutive calls touch different experts), the others
with events around eager calls. Ceilings (copy bandwidth, bf16 matmul rate) are re-measured
first, as a short burst and held for ``--held`` seconds.

The H200 is power-capped: under a long matmul load it clocks down (from 1980 to 1300-1500 MHz),
so a timing depends on what ran before it. Graph timings therefore rest the GPU between samples
(``--duty``, default 0.25: busy a quarter of the time), which keeps every sample at the boost
clock the burst ceilings were measured at (p20-p80 within 0.3 %, where back-to-back replays
spread 5-10 % and ran 3-17 % slower). For T >= ``HELD_MIN_T`` the Triton rows are also
replayed back to back for ``--held`` seconds (``held_us``) and compared with the held ceilings
(``ratio_held``): the sustained, power-capped view. A row with a baseline (``Impl.baseline``)
gets ``overhead_vs_<baseline>`` from the two layers timed interleaved in the same rounds, and
where both do the same work its output is first checked against the baseline's
(``rel_err_vs_<baseline>``). Each row records the board's clock, power and clock-event reasons
right after its timing.

Formats (``--format``, the default set of implementations):

* ``standard``: the layer on ``[T, H]`` tokens and their top-k routing: the Triton layer, with
  LoRA (4 adapters of rank 16, tokens round-robin), torch's grouped-GEMM backend and a
  per-expert torch loop.
* ``batched``: the batched format an expert-parallel all-to-all delivers (``[E, M, H]`` rows,
  ``M`` the busiest expert's count), with and without LoRA, against the standard Triton layer
  and the grouped-GEMM backend at equal work (the same tokens and routing; dispatch and
  combine are not timed, the all-to-all does them).

Prints one line per (shape, T, implementation); with ``--out DIR`` also writes ``<tag>.json``
and a plot, ``<tag>.png``, there. Exits 1 when a row failed (its error is in the row). ``--table FILE`` prints a saved sweep as the README's table
and checks the performance targets at every point it timed (standard sweeps), or as µs per
implementation and the ratio to the standard layer (batched sweeps).

Add a backend: write ``def build_x(case) -> list[callable]`` and add
``IMPLEMENTATIONS["x"] = Impl(build_x)`` (and its name to a format in ``FORMATS``).

    python -m benchmarks.kernels --shapes mixtral-8x7b --tokens 1 64 1024 --out DIR
    python -m benchmarks.kernels --format batched --out DIR
    python -m benchmarks.kernels --table benchmarks/results/kernels_h200.json
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from benchmarks.common import (
    FIXED_COPY_TBPS,
    FIXED_MATMUL_TFLOPS,
    LORA_RANK,
    SHAPES,
    MoEShape,
    add_shape_args,
    alloc_block,
    at_least,
    cuda_device_name,
    duty_fraction,
    experts_config,
    gpu_state,
    kernel_times,
    layer_bytes,
    layer_flops,
    lora_contexts,
    lower_bound_us,
    measure_ceilings,
    nonnegative_float,
    peak_extra_bytes,
    plot_ratios,
    positive_int,
    read_json,
    routing_sets,
    shape_adapters,
    shape_weights,
    time_eager_us,
    time_graph_held_us,
    time_graph_us,
    time_graphs_interleaved,
    writable_dir,
    write_json,
)

#: Rows with at least this many tokens get a held timing (decode never reaches the power cap).
HELD_MIN_T = 1024
#: Rounds of the interleaved timing of a row and its baseline behind ``overhead_vs_<baseline>``.
PAIR_ROUNDS = 10
#: vLLM's Triton fused-MoE GEMMs (tuned configs, alignment excluded) / lower bound at the
#: fixed ceilings below: the figures the targets compare against.
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
    """Inputs of one (shape, T): weights in the common layout, one (x, topk_weights, topk_ids)
    per routing set, and per set its LoRA context and batched dispatch where asked for."""

    shape: MoEShape
    tokens: int
    weights: dict[str, Any]
    inputs: list[tuple[Any, Any, Any]]
    lora: list[Any] = field(default_factory=list)
    batched: list[Any] = field(default_factory=list)  # BatchedDispatch per routing set


@dataclass(frozen=True)
class Impl:
    """A benchmarked implementation: builder, whether it can be graph-captured, token cap,
    whether it takes LoRA or the batched format, and the implementation it is compared with
    (``checked``: the two compute the same, so its output is checked against the baseline's)."""

    build: Callable[[Case], list[Callable[[], Any]]]
    graphable: bool = True
    max_tokens: int | None = None
    uses_lora: bool = False
    batched: bool = False
    baseline: str | None = None
    checked: bool = False


# ---------------------------------------------------------------- implementations


def build_naive_loop(case: Case) -> list[Callable[[], Any]]:
    """Per-expert torch loop (nonzero per expert: host syncs, not graph-capturable)."""
    import torch

    from moe_policy.experts.reference import apply_activation

    s, w = case.shape, case.weights

    def run(x: Any, tw: Any, ti: Any) -> Any:
        out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
        for e in range(s.num_experts):
            tok, slot = torch.nonzero(ti == e, as_tuple=True)
            if tok.numel() == 0:
                continue
            a = apply_activation(x[tok] @ w["w13"][e].t(), s.activation, s.gated)
            y = a @ w["w2"][e].t()
            out.index_add_(0, tok, y.float() * tw[tok, slot, None])
        return out.to(x.dtype)

    return [lambda inp=inp: run(*inp) for inp in case.inputs]


def _layer(cls: Any, case: Case) -> Any:
    w = case.weights
    return cls(experts_config(case.shape), w["w13"], w["w2"], w["w13_bias"], w["w2_bias"])


def _standard_calls(be: Any, case: Case, lora: bool) -> list[Callable[[], Any]]:
    """One ``be.apply`` per routing set (with its LoRA context when ``lora``)."""
    ctxs = case.lora if lora else [None] * len(case.inputs)
    return [
        lambda inp=inp, ctx=ctx: be.apply(*inp, ctx)
        for inp, ctx in zip(case.inputs, ctxs, strict=True)
    ]


def _grouped_mm(case: Case, lora: bool) -> list[Callable[[], Any]]:
    from moe_policy.experts.grouped_mm import TorchGroupedMMExperts

    s = case.shape
    ok, why = TorchGroupedMMExperts.is_available()
    if ok:
        ok, why = TorchGroupedMMExperts.supports({
            "dtype": case.inputs[0][0].dtype, "hidden_size": s.hidden,
            "intermediate_size": s.inter, "lora_enabled": lora, "lora_max_rank": LORA_RANK,
        })  # fmt: skip
    if not ok:
        raise Skip(f"torch_grouped_mm: {why}")
    calls = _standard_calls(_layer(TorchGroupedMMExperts, case), case, lora)
    calls[0]()  # probe: raises here if this torch/GPU cannot run it
    return calls


def build_grouped_mm(case: Case) -> list[Callable[[], Any]]:
    """torch's grouped-GEMM backend (``torch_grouped_mm``: sort by expert, two grouped GEMMs)."""
    return _grouped_mm(case, lora=False)


def build_grouped_mm_lora(case: Case) -> list[Callable[[], Any]]:
    """torch's grouped-GEMM backend with LoRA."""
    return _grouped_mm(case, lora=True)


def _triton(case: Case, lora: bool) -> list[Callable[[], Any]]:
    from moe_policy.experts.triton.fused_moe import TritonExperts

    return _standard_calls(_layer(TritonExperts, case), case, lora)


def build_triton(case: Case) -> list[Callable[[], Any]]:
    """Our Triton fused MoE (alignment included)."""
    return _triton(case, lora=False)


def build_triton_lora(case: Case) -> list[Callable[[], Any]]:
    """Our Triton fused MoE with LoRA: rank 16, 4 adapters, round-robin tokens."""
    return _triton(case, lora=True)


def _batched(case: Case, lora: bool) -> list[Callable[[], Any]]:
    from moe_policy.experts.lora import MoELoRAContext
    from moe_policy.experts.triton.batched import BatchedTritonExperts

    be = _layer(BatchedTritonExperts, case)
    ctxs = (
        [
            MoELoRAContext(c.adapters, d.lora_mapping)
            for c, d in zip(case.lora, case.batched, strict=True)
        ]
        if lora
        else [None] * len(case.batched)
    )
    return [
        lambda d=d, ctx=ctx: be.apply(d.x, d.expert_num_tokens, ctx)
        for d, ctx in zip(case.batched, ctxs, strict=True)
    ]


def build_batched_triton(case: Case) -> list[Callable[[], Any]]:
    """Our batched-format Triton layer on the dispatched ``[E, M, H]`` rows."""
    return _batched(case, lora=False)


def build_batched_triton_lora(case: Case) -> list[Callable[[], Any]]:
    """Our batched-format Triton layer with LoRA (each row's adapter from the dispatch)."""
    return _batched(case, lora=True)


IMPLEMENTATIONS: dict[str, Impl] = {  # baselines before the rows compared with them
    "triton": Impl(build_triton),
    "triton_lora": Impl(build_triton_lora, uses_lora=True, baseline="triton"),
    "batched_triton": Impl(build_batched_triton, batched=True, baseline="triton", checked=True),
    "batched_triton_lora": Impl(
        build_batched_triton_lora,
        uses_lora=True,
        batched=True,
        baseline="triton_lora",
        checked=True,
    ),
    "torch_grouped_mm": Impl(build_grouped_mm, baseline="triton", checked=True),
    "torch_grouped_mm_lora": Impl(
        build_grouped_mm_lora, uses_lora=True, baseline="triton_lora", checked=True
    ),
    "naive_loop": Impl(build_naive_loop, graphable=False, max_tokens=256),
}
#: ``--format``: the implementations a sweep times unless ``--impls`` names others.
FORMATS: dict[str, tuple[str, ...]] = {
    "standard": ("triton", "triton_lora", "torch_grouped_mm", "naive_loop"),
    "batched": ("triton", "triton_lora", "batched_triton", "batched_triton_lora",
                "torch_grouped_mm", "torch_grouped_mm_lora"),
}  # fmt: skip


# ---------------------------------------------------------------- cases


def make_case(
    shape: MoEShape,
    t: int,
    weights: dict[str, Any],
    adapters: Any,
    batched: bool = False,
    device: str = "cuda",
    dtype: Any = None,
) -> Case:
    """Uniform routing sets (more at small T; activations in ``dtype``, default bf16), their
    LoRA contexts where ``adapters`` is given and, with ``batched``, their dispatch to the
    batched format (``M`` = each set's largest expert count, a tight capacity)."""
    import torch

    from moe_policy.experts.batched_format import dispatch_to_batched

    n_sets = 8 if t <= 256 else (4 if t <= 1024 else 2)
    inputs = routing_sets(shape, t, n_sets, device, dtype=dtype)
    lora = lora_contexts(adapters, t, n_sets, device) if adapters is not None else []
    dispatched = []
    for i, (x, _, ti) in enumerate(inputs if batched else []):
        m = int(torch.bincount(ti.flatten().long(), minlength=shape.num_experts).max())
        mapping = lora[i].token_lora_mapping if lora else None
        dispatched.append(dispatch_to_batched(x, ti, shape.num_experts, m, mapping))
    return Case(shape, t, weights, inputs, lora, dispatched)


def layer_output(case: Case, impl: Impl, out: Any, i: int = 0) -> Any:
    """The ``[T, H]`` layer output of routing set ``i`` from what ``impl``'s call returned (a
    batched implementation's rows combined with the router weights)."""
    if not impl.batched:
        return out
    from moe_policy.experts.batched_format import combine_from_batched

    return combine_from_batched(out, case.batched[i].index_map, case.inputs[i][1], case.tokens)


def mem_limit_bytes(shape: MoEShape, t: int, lora: bool) -> int:
    """The memory budget of a standard-format layer call: a T*k*max(N1, H) and a T*k*I bf16
    buffer (+ T*k*R*(S+1) fp32 with LoRA), each as the allocator's block (``alloc_block``),
    the unit the peak is counted in."""
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

    runs = [[(name[:40], us) for name, us in kernel_times(fn)] for _ in range(reps)]
    n = min(len(r) for r in runs)
    return [(runs[0][j][0], statistics.median(r[j][1] for r in runs)) for j in range(n)]


# ---------------------------------------------------------------- driver


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Benchmark every (shape, T, implementation) asked for; returns the JSON payload."""
    import torch

    from moe_policy.experts.testing import rel_err
    from moe_policy.experts.triton.config import get_config

    torch.backends.cuda.matmul.allow_tf32 = False
    info = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": __import__("triton").__version__,
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "argv": sys.argv[1:],
        "format": args.format,
        "shapes": {name: asdict(SHAPES[name]) for name in args.shapes},
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
    impls = [n for n in IMPLEMENTATIONS if n in args.impls]  # baselines first
    rows: list[dict[str, Any]] = []
    for sname in args.shapes:
        shape = SHAPES[sname]
        weights = shape_weights(shape)
        need_lora = any(IMPLEMENTATIONS[n].uses_lora for n in impls)
        adapters = shape_adapters(shape) if need_lora else None
        batched = any(IMPLEMENTATIONS[n].batched for n in impls)
        for t in args.tokens:
            case = make_case(shape, t, weights, adapters, batched)
            bound = lower_bound_us(shape, t, ceil["copy_tbps"], ceil["matmul_tflops"])
            base_us: dict[str, float] = {}
            built: dict[str, list[Callable[[], Any]]] = {}  # graphable calls, for pair timings
            for name in impls:
                impl = IMPLEMENTATIONS[name]
                row: dict[str, Any] = {"shape": sname, "T": t, "impl": name, "bound_us": bound}
                if name.startswith("triton"):
                    row["config"] = get_config(t, shape.num_experts, shape.top_k, shape.hidden,
                                               shape.inter, shape.gated, info["device"]).to_dict()  # fmt: skip
                if impl.batched:
                    row["rows_per_expert"] = int(case.batched[0].x.shape[1])
                try:
                    if impl.max_tokens is not None and t > impl.max_tokens:
                        raise Skip(f"skipped above T={impl.max_tokens} to save time")
                    calls = impl.build(case)
                    if args.warm:
                        for c in calls:
                            c()
                        torch.cuda.synchronize()
                        continue
                    if impl.checked and impl.baseline in built:
                        ref = built[impl.baseline][0]()
                        row["rel_err_vs_" + impl.baseline] = rel_err(
                            layer_output(case, impl, calls[0]()), ref
                        )
                    reps = args.replays
                    timing = (
                        time_graph_us(calls, reps, args.duty)
                        if impl.graphable
                        else time_eager_us(calls, reps)
                    )
                    row.update(timing)
                    row["duty"] = args.duty if impl.graphable else 1.0
                    row["extra_mem_bytes"] = peak_extra_bytes(calls[0])
                    if not impl.batched:
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


def model_shape(spec: str) -> str:
    """``--model``: the routed-expert layer of a Hugging Face config, added to ``SHAPES`` under
    the model's name; its name. ValueError naming the file and key when it is no MoE config,
    or one the Triton kernels cannot run (``moe-policy tune``'s checks: the activation, a
    quantized model, more than 1024 experts)."""
    from moe_policy.cli.tune import TuneError
    from moe_policy.cli.tune import model_shape as tune_shape
    from moe_policy.errors import PolicyError

    try:
        shape, _ = tune_shape(spec, 1, 1)
    except TuneError as exc:  # "cli:--model: <spec>: why"
        raise ValueError(
            f"--model {spec}: {str(exc).removeprefix(f'cli:--model: {spec}: ')}"
        ) from None
    except (PolicyError, OSError) as exc:
        raise ValueError(f"--model {spec}: {exc}") from None
    known = SHAPES.get(shape.name)
    if known is not None and known != shape:
        shape = replace(shape, name=f"{shape.name}@{spec}")
    SHAPES[shape.name] = shape
    return shape.name


def register_shapes(payload: dict[str, Any]) -> None:
    """Shapes a sweep recorded (``--model`` ones among them) into ``SHAPES``, for ``--table``
    (``load_sweep`` checked them)."""
    for name, fields in payload["info"].get("shapes", {}).items():
        SHAPES.setdefault(name, MoEShape(**fields))


def _overheads(row: dict[str, Any]) -> dict[str, float]:
    return {k: v for k, v in row.items() if k.startswith("overhead_vs_")}


def median_of_runs(payloads: list[dict[str, Any]]) -> dict[str, Any]:
    """One payload from several whole runs: per (shape, T, impl) the row of the run with the
    median ratio (each run's rows use that run's own ceilings), every run's ratio kept, and
    the median overhead over the baseline of the runs. With an even number of runs both take
    the upper middle (the slower run, the larger overhead), so the figures never flatter."""
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
        for key in {k for r in runs for k in _overheads(r)}:
            over = sorted(r[key] for r in runs if key in r)
            row[key] = over[len(over) // 2]
        rows.append(row)
    info = dict(first["info"], runs=len(payloads))
    out = {"info": info, "ceilings": first["ceilings"],
           "ceilings_runs": [p["ceilings"] for p in payloads], "rows": rows}  # fmt: skip
    if any("ceilings_held" in p for p in payloads):
        out["ceilings_held_runs"] = [p.get("ceilings_held") for p in payloads]
    return out


def _from_batched_meta(payload: dict[str, Any]) -> dict[str, Any]:
    """A batched sweep saved as ``{"meta", "rows"}`` (LoRA rows named ``<impl>+lora``, the time
    over the standard Triton layer of the same work as ``vs_triton``) in this module's form."""
    meta = dict(payload["meta"])
    rows = []
    for r in payload["rows"]:
        row = {k: v for k, v in r.items() if k != "vs_triton"}
        if isinstance(r.get("impl"), str):  # else refused by load_sweep's row check
            row["impl"] = r["impl"].replace("+lora", "_lora")
        impl = IMPLEMENTATIONS.get(row.get("impl"))
        if impl and impl.checked and r.get("vs_triton") is not None:
            row[f"overhead_vs_{impl.baseline}"] = r["vs_triton"]
        rows.append(row)
    return {"info": {**meta, "format": "batched"}, "ceilings": meta.get("ceilings", {}),
            "rows": rows}  # fmt: skip


def load_sweep(path: str) -> dict[str, Any]:
    """A sweep JSON as ``run`` returns it; ValueError naming the file (and the row) when it is
    not one: unreadable, not JSON, no ``info``/``ceilings``/``rows``, a row without its shape,
    T and implementation, a figure that is not a finite number, a recorded shape that is not
    a layer."""
    payload = read_json(path)
    if isinstance(payload, dict) and {"meta", "rows"} <= set(payload):
        if not isinstance(payload["meta"], dict) or not _rows_of_objects(payload["rows"]):
            raise ValueError(f"{path}: not a benchmarks.kernels sweep ('meta' must be an "
                             "object, 'rows' a list of objects)")  # fmt: skip
        payload = _from_batched_meta(payload)
    missing = [
        k for k in ("info", "ceilings", "rows") if not isinstance(payload, dict) or k not in payload
    ]
    if missing:
        raise ValueError(f"{path}: not a benchmarks.kernels sweep (no {', '.join(missing)})")
    for key in ("info", "ceilings"):
        if not isinstance(payload[key], dict):
            raise ValueError(f"{path}: not a benchmarks.kernels sweep ({key!r} is not an object)")
    rows = payload["rows"]
    if not isinstance(rows, list) or not rows:
        raise ValueError(f"{path}: not a benchmarks.kernels sweep ('rows' is not a non-empty list)")
    for i, row in enumerate(rows):
        problem = _row_problem(row)
        if problem:
            raise ValueError(f"{path}: rows[{i}]: {problem}")
    shapes = payload["info"].get("shapes", {})
    if not isinstance(shapes, dict):
        raise ValueError(f"{path}: info.shapes is not an object")
    for name, fields in shapes.items():
        problem = _shape_problem(name, fields)
        if problem:
            raise ValueError(f"{path}: info.shapes.{name}: {problem}")
    return payload


def _rows_of_objects(rows: Any) -> bool:
    return isinstance(rows, list) and all(isinstance(r, dict) for r in rows)


#: Figures of a row that must be finite numbers where present (``us`` > 0 too).
_ROW_NUMBERS = ("us", "p20_us", "p80_us", "bound_us", "ratio", "ratio_held", "held_us", "tbps",
                "tflops", "extra_mem_bytes", "mem_limit_bytes")  # fmt: skip


def _is_count(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 1


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _row_problem(row: Any) -> str | None:
    """What makes ``row`` no sweep row, or None."""
    if not isinstance(row, dict):
        return f"not an object: {row!r}"[:200]
    if not isinstance(row.get("shape"), str):
        return f"'shape' must be a shape's name, got {row.get('shape')!r}"
    if not _is_count(row.get("T")):
        return f"'T' must be a token count (an integer >= 1), got {row.get('T')!r}"
    if row.get("impl") not in IMPLEMENTATIONS:
        return (f"'impl' must be one of {', '.join(IMPLEMENTATIONS)}, "
                f"got {row.get('impl')!r}")  # fmt: skip
    for key, value in row.items():
        if (key in _ROW_NUMBERS or key.startswith("overhead_vs_")) and not _is_number(value):
            return f"{key!r} must be a finite number, got {value!r}"
    if "us" in row and row["us"] <= 0:
        return f"'us' must be greater than 0, got {row['us']!r}"
    return None


def _shape_problem(name: str, fields: Any) -> str | None:
    """What makes a recorded shape (``info.shapes``) no layer ``MoEShape`` can hold, or None."""
    if not isinstance(fields, dict):
        return "not an object"
    want = {"name", "num_experts", "hidden", "inter", "top_k", "gated", "activation"}
    missing = sorted(want - set(fields))
    unknown = sorted(set(fields) - want - {"has_bias"})
    if missing or unknown:
        return f"missing {missing}, unknown {unknown}" if unknown else f"missing {missing}"
    for key in ("num_experts", "hidden", "inter", "top_k"):
        if not _is_count(fields[key]):
            return f"{key!r} must be an integer >= 1, got {fields[key]!r}"
    if fields["top_k"] > fields["num_experts"]:
        return f"top_k {fields['top_k']} exceeds num_experts {fields['num_experts']}"
    if not all(isinstance(fields.get(k, False), bool) for k in ("gated", "has_bias")):
        return "'gated' and 'has_bias' must be true or false"
    if not isinstance(fields["activation"], str) or fields["name"] != name:
        return "'activation' must be a name and 'name' the shape's key"
    return None


#: What ``--table`` reads of a standard sweep's timed Triton rows (the targets and the table).
TABLE_FIELDS = ("tflops", "extra_mem_bytes", "mem_limit_bytes")


def check_table(payload: dict[str, Any], path: str) -> None:
    """ValueError naming the file and row when a standard sweep's timed Triton row lacks what
    the target checks read (``TABLE_FIELDS``), or has a memory budget of 0."""
    if payload["info"].get("format") == "batched":
        return
    for i, r in enumerate(payload["rows"]):
        if "us" not in r or r["impl"] not in ("triton", "triton_lora"):
            continue
        missing = [k for k in TABLE_FIELDS if k not in r]
        if missing:
            raise ValueError(f"{path}: rows[{i}] ({r['shape']} T={r['T']} {r['impl']}): "
                             f"no {', '.join(missing)}")  # fmt: skip
        if r["mem_limit_bytes"] <= 0:
            raise ValueError(f"{path}: rows[{i}]: 'mem_limit_bytes' must be greater than 0")


def _print_row(r: dict[str, Any]) -> None:
    head = f"{r['shape']:15s} T={r['T']:5d} {r['impl']:21s}"
    if "us" not in r:
        print(f"{head} {r.get('skipped') or r.get('error')}", flush=True)
        return
    vr = r.get("vllm_ratio")
    ks = " ".join(f"{n.split('_kernel')[0][-12:]}:{us:.1f}" for n, us in r.get("kernels", []))
    held = r.get("ratio_held")
    gpu = r.get("gpu", {})
    state = f" {gpu['sm_mhz']:.0f}MHz" if "sm_mhz" in gpu else ""
    state += " power-capped" if "sw_power_cap" in gpu.get("throttle", []) else ""
    limit = r.get("mem_limit_bytes")
    mem = f" mem {r['extra_mem_bytes'] / 2**20:7.1f}"
    mem += "MiB" if limit is None else f"/{limit / 2**20:7.1f}MiB"
    vs = "".join(f" {k.removeprefix('overhead_')} x{v:.3f}" for k, v in _overheads(r).items())
    vs += "".join(f" diff {v:.1e}" for k, v in r.items() if k.startswith("rel_err_vs_"))
    print(
        f"{head} {r['us']:9.1f}us bound {r['bound_us']:8.1f} ratio {r['ratio']:5.2f}"
        f"{'' if held is None else f' (held {held:.2f})'}"
        f"{'' if vr is None else f' (vllm {vr:.2f})'} {r['tbps']:5.2f}TB/s {r['tflops']:6.1f}TF"
        f"{mem}{vs}{state} {ks}",
        flush=True,
    )


# ---------------------------------------------------------------- --table


def fixed_ratio(row: dict[str, Any]) -> float:
    """Time over the lower bound at the fixed ceilings."""
    shape = SHAPES[row["shape"]]
    return float(row["us"]) / lower_bound_us(shape, row["T"], FIXED_COPY_TBPS, FIXED_MATMUL_TFLOPS)


@dataclass(frozen=True)
class Check:
    """One target at one point: the figure, the limit and whether it holds."""

    target: str
    shape: str
    t: int
    value: float
    limit: float
    higher_is_better: bool = False
    #: bound ratios: the same figure at the sweep's own measured ceilings (``ratio``)
    own_ceilings: float | None = None

    @property
    def met(self) -> bool:
        return self.value >= self.limit if self.higher_is_better else self.value <= self.limit

    def line(self) -> str:
        op = ">=" if self.higher_is_better else "<="
        verdict = "met   " if self.met else "MISSED"
        own = "" if self.own_ceilings is None else f"  (own ceilings {self.own_ceilings:.2f})"
        return (f"{verdict} {self.target:34s} {self.shape:15s} T={self.t:<5d} "
                f"{self.value:6.2f} {op} {self.limit:g}{own}")  # fmt: skip


def _timed_rows(payload: dict[str, Any]) -> dict[tuple[str, int, str], dict[str, Any]]:
    return {(r["shape"], r["T"], r["impl"]): r for r in payload["rows"] if "us" in r}


def checks(payload: dict[str, Any]) -> list[Check]:
    """The performance targets at every point the sweep timed (Triton layer and its LoRA row):
    bound ratios by token range, no slower than vLLM, Mixtral's prefill rate, the memory
    budget, and the LoRA layer's cost over the base layer."""
    rows = _timed_rows(payload)
    out: list[Check] = []
    for (shape, t, impl), r in sorted(rows.items()):
        if impl != "triton":
            continue
        ratio = fixed_ratio(r)
        vllm = VLLM_RATIO.get((shape, t))
        if vllm is not None:
            out.append(Check("no slower than vLLM (ratio)", shape, t, ratio, vllm))
            if t >= 4096:
                out.append(Check("vLLM time / ours, T >= 4096", shape, t, vllm / ratio, 1.25, True))
        own = r.get("ratio")
        if t == 1:
            out.append(Check("bound ratio, T = 1", shape, t, ratio, 1.3, own_ceilings=own))
        elif 16 <= t <= 256:
            out.append(Check("bound ratio, 16 <= T <= 256", shape, t, ratio, 1.15,
                             own_ceilings=own))  # fmt: skip
        elif t >= 1024:
            out.append(Check("bound ratio, T >= 1024", shape, t, ratio, 1.4, own_ceilings=own))
        if shape == "mixtral-8x7b" and t == 8192:
            out.append(Check("TFLOP/s, Mixtral T = 8192", shape, t, r["tflops"], 600.0, True))
        out.append(Check("extra memory / budget", shape, t,
                         r["extra_mem_bytes"] / r["mem_limit_bytes"], 1.0))  # fmt: skip
        lora = rows.get((shape, t, "triton_lora"))
        if lora is not None and "overhead_vs_triton" in lora:
            limit = 1.35 if t == 1 else 1.2
            if t == 1 or t >= 64:
                out.append(Check(f"LoRA / base layer, T {'= 1' if t == 1 else '>= 64'}", shape,
                                 t, lora["overhead_vs_triton"], limit))  # fmt: skip
            out.append(Check("LoRA extra memory / budget", shape, t,
                             lora["extra_mem_bytes"] / lora["mem_limit_bytes"], 1.0))  # fmt: skip
    return out


def markdown_table(payload: dict[str, Any]) -> str:
    """The README's table: per shape the Triton layer's fixed-ceiling ratio at each T (µs at
    T=1, vLLM's figure in brackets, the held ratio and TFLOP/s at T=8192 where measured) and
    the LoRA overhead over T >= 64 and at T = 1."""
    rows = _timed_rows(payload)
    shapes = list(dict.fromkeys(s for s, _, i in rows if i == "triton"))
    ts = sorted({t for _, t, i in rows if i == "triton"})
    head = ["shape", *(f"T={t}" for t in ts), "LoRA × (T≥64)", "LoRA × (T=1)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for s in shapes:
        cells = [s]
        for t in ts:
            r = rows.get((s, t, "triton"))
            if r is None:
                cells.append("–")
                continue
            c = f"{fixed_ratio(r):.2f}"
            if t == 1:
                c = f"{r['us']:.1f} µs {c}"
            if (s, t) in VLLM_RATIO:
                c += f" [{VLLM_RATIO[(s, t)]:.2f}]"
            extra = [f"held {r['ratio_held']:.2f}"] if "ratio_held" in r else []
            if t == 8192:
                extra.append(f"{r['tflops']:.0f} TF/s")
            cells.append(c + (f" ({'; '.join(extra)})" if extra else ""))
        over: list[float] = [
            rows[(s, t, "triton_lora")]["overhead_vs_triton"]
            for t in ts
            if t >= 64 and "overhead_vs_triton" in rows.get((s, t, "triton_lora"), {})
        ]
        cells.append(f"{min(over):.2f}–{max(over):.2f}" if over else "–")
        one = rows.get((s, 1, "triton_lora"), {}).get("overhead_vs_triton")
        cells.append("–" if one is None else f"{one:.2f}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def batched_table(payload: dict[str, Any]) -> str:
    """A batched sweep: µs per call of each implementation and, beside the others, its time
    over the standard Triton layer doing the same work (``(1.12x)``)."""
    rows = _timed_rows(payload)
    cols = [n for n in FORMATS["batched"] if any(i == n for _, _, i in rows)]
    lines = [f"{'shape':<15}{'T':>6}" + "".join(f"{c:>24}" for c in cols)]
    for shape in dict.fromkeys(s for s, _, _ in rows):
        for t in sorted({t for s, t, _ in rows if s == shape}):
            cells = []
            for c in cols:
                r = rows.get((shape, t, c))
                if r is None:
                    cells.append(f"{'-':>24}")
                    continue
                base = IMPLEMENTATIONS[c].baseline
                over = r.get(f"overhead_vs_{base}") if c not in ("triton", "triton_lora") else None
                vs = "" if over is None else f" ({over:.2f}x)"
                cells.append(f"{r['us']:>14.1f}{vs:>10}")
            lines.append(f"{shape:<15}{t:>6}" + "".join(cells))
    return "\n".join(lines)


def print_table(payload: dict[str, Any], missed_only: bool = False) -> None:
    """``--table``: a batched sweep's table, or a standard sweep's table and its targets."""
    if payload["info"].get("format") == "batched":
        print(batched_table(payload))
        return
    print(markdown_table(payload))
    print()
    found = checks(payload)
    for c in found:
        if not (c.met and missed_only):
            print(c.line())
    missed = sum(not c.met for c in found)
    print(f"# {len(found) - missed} of {len(found)} target checks met, {missed} missed")


# ---------------------------------------------------------------- main


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--format", default="standard", choices=sorted(FORMATS),
                   help="which implementations a sweep times by default (see above)")  # fmt: skip
    add_shape_args(p)
    p.add_argument("--model", nargs="+", metavar="CONFIG",
                   help="time these models' routed-expert layers instead of --shapes: Hugging "
                        "Face config.json files, model directories or bundled model names")  # fmt: skip
    p.add_argument("--impls", nargs="+", choices=list(IMPLEMENTATIONS),
                   help="implementations to time (default: those of --format)")  # fmt: skip
    p.add_argument("--replays", type=at_least(2), default=50,
                   help="graph replays per row (at least 2: the row keeps their p20 and p80)")  # fmt: skip
    p.add_argument("--out", metavar="DIR",
                   help="write <tag>.json and <tag>.png here (default: print only)")  # fmt: skip
    p.add_argument("--tag", default="kernels", help="the file names' stem (a name, no folder)")
    p.add_argument("--warm", action="store_true", help="only compile/run once (parallel warm-up)")
    p.add_argument("--breakdown", action="store_true", help="per-kernel device times (profiler)")
    p.add_argument("--held", type=nonnegative_float, default=2.0, metavar="S",
                   help="also measure the ceilings, and the Triton rows at T >= "
                        f"{HELD_MIN_T}, held S seconds each (0: skip); those rows get "
                        "held_us and ratio_held, the power-capped view")  # fmt: skip
    p.add_argument("--duty", type=duty_fraction, default=0.25,
                   help="graph timings keep the GPU busy at most this fraction of the time "
                        "(1: back to back)")  # fmt: skip
    p.add_argument("--runs", type=positive_int, default=1,
                   help="whole sweeps; the JSON keeps each point's median-ratio run, and with "
                        "--out each run is also written as <tag>_runN.json when it ends")  # fmt: skip
    saved = p.add_mutually_exclusive_group()
    saved.add_argument("--merge", nargs="+", metavar="JSON",
                       help="no GPU: merge whole-sweep JSONs (e.g. the <tag>_runN.json that each "
                            "run of --runs N leaves, should the call be cut off) like --runs "
                            "does, into --out")  # fmt: skip
    saved.add_argument("--table", metavar="JSON",
                       help="no GPU: print a saved sweep as a table (a standard sweep with its "
                            "target checks) and exit")  # fmt: skip
    p.add_argument("--missed", action="store_true", help="with --table: only the missed targets")
    args = p.parse_args()
    if args.missed and not args.table:
        p.error("--missed goes with --table")
    if args.table:
        try:
            payload = load_sweep(args.table)
            check_table(payload, args.table)
        except ValueError as exc:
            p.error(f"--table {exc}")
        register_shapes(payload)
        unknown = sorted({r["shape"] for r in payload["rows"]} - set(SHAPES))
        if unknown:
            p.error(f"{args.table}: shapes not in benchmarks.common.SHAPES: {', '.join(unknown)}")
        print_table(payload, args.missed)
        return
    if not args.tag or os.sep in args.tag or args.tag in (".", ".."):
        p.error(f"--tag: a file name without a folder, got {args.tag!r}")
    if args.model:
        try:
            args.shapes = [model_shape(spec) for spec in args.model]
        except ValueError as exc:
            p.error(str(exc))
    if args.merge and not args.out:
        p.error("--merge writes the merged sweep: give --out DIR")
    args.impls = args.impls or list(FORMATS[args.format])
    if args.merge:
        try:
            payloads = [load_sweep(path) for path in args.merge]
        except ValueError as exc:
            p.error(f"--merge {exc}")
    if args.out:
        try:
            writable_dir(args.out)
        except ValueError as exc:
            p.error(f"--out: {exc}")
    if not args.merge:
        try:
            cuda_device_name(
                "the benchmark times the kernels on one (--table and --merge need none)"
            )
        except ValueError as exc:
            p.exit(2, f"{p.prog}: error: {exc}\n")
        payloads = []
        for i in range(1 if args.warm else args.runs):
            payloads.append(run(args))
            if args.runs > 1 and args.out:  # each run on disk as soon as it ends
                write_json(os.path.join(args.out, f"{args.tag}_run{i + 1}.json"), payloads[-1])
        if args.warm:
            return
    payload = payloads[0]
    if len(payloads) > 1:
        payload = median_of_runs(payloads)
        print("# median of runs (ratio; overheads median of runs):")
        for r in payload["rows"]:
            if r.get("ratio_runs"):
                over = "".join(f"  {k.removeprefix('overhead_')} x{v:.3f}"
                               for k, v in _overheads(r).items())  # fmt: skip
                print(f"{r['shape']:15s} T={r['T']:5d} {r['impl']:21s} x{r['ratio']:.2f} "
                      f"runs {' '.join(f'{v:.2f}' for v in r['ratio_runs'])}{over}")  # fmt: skip
    if args.out:
        write_json(os.path.join(args.out, f"{args.tag}.json"), payload)
        try:
            plot_ratios([r for r in payload["rows"] if "ratio" in r], os.path.join(args.out, f"{args.tag}.png"),
                        f"{payload['info'].get('device', '?')}: fused MoE time / lower bound")  # fmt: skip
        except Exception as exc:  # matplotlib missing must not lose the JSON
            print(f"plot failed: {exc}")
    failed = [r for r in payload["rows"] if "error" in r]
    if failed:
        sys.exit(f"# {len(failed)} of {len(payload['rows'])} rows failed")


if __name__ == "__main__":
    main()
