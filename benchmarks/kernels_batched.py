"""Benchmark: batched-format Triton (with and without LoRA) and the torch grouped-GEMM backend
against the standard Triton path at equal work, on full MoE layers (bf16, one GPU).

Equal work: the same tokens and the same uniform routing; the batched path gets the
dispatched ``[E, M, H]`` rows with ``M`` = the largest expert count (a tight capacity), its
dispatch and combine are not timed (DeepEP's all-to-all does them). Every implementation is
captured in a CUDA graph (``CALLS`` calls per graph, median per-call time over ``--replays``
replays); anything that cannot be captured is event-timed eagerly and marked so.
LoRA: 4 enabled adapters of rank 16, tokens round-robin over them (every token has one).

Usage: ``python -m benchmarks.kernels_batched --out DIR`` (writes ``kernels_batched.json``
and a plot there; prints a table).
"""

from __future__ import annotations

import argparse
import os
import time
from functools import partial
from typing import Any

from benchmarks.common import (
    SHAPES,
    lower_bound_us,
    measure_ceilings,
    plot_ratios,
    positive_int,
    time_eager_us,
    time_graph_us,
    write_json,
)

TOKENS = [1, 16, 64, 256, 1024, 4096, 8192]
DEFAULT_SHAPES = ["nemotron3-nano", "mixtral-8x7b", "qwen3-30b-a3b"]
CALLS = 5
LORA_SLOTS, LORA_RANK = 4, 16
#: Where the layers live; a CPU dry run (TRITON_INTERPRET=1) sets it to "cpu".
DEVICE = "cuda"


def _time(fn: Any, replays: int) -> dict[str, Any]:
    """CUDA-graph timing, eager event timing when capture fails."""
    try:
        return {**time_graph_us([fn] * CALLS, replays=replays), "timing": "graph"}
    except Exception as exc:  # capture unsupported: time eagerly
        import torch

        torch.cuda.synchronize()
        r = time_eager_us([fn], reps=replays)
        return {**r, "timing": f"eager ({type(exc).__name__})"}


def _adapters(cfg: Any, dev: str) -> Any:
    import torch

    from moe_policy.experts.lora import MoELoRAAdapters

    ad = MoELoRAAdapters.allocate(
        num_slots=LORA_SLOTS,
        num_experts=cfg.num_experts,
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        max_rank=LORA_RANK,
        num_slices=cfg.num_lora_slices,
        dtype=torch.bfloat16,
        device=dev,
    )
    for t, std in (
        (ad.w13_a, cfg.hidden_size**-0.5),
        (ad.w13_b, 0.1),
        (ad.w2_a, cfg.intermediate_size**-0.5),
        (ad.w2_b, 0.1),
    ):
        t.normal_(0.0, std)
    ad.enabled.fill_(1)
    return ad


def rel_l2(a: Any, b: Any) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30))


def bench_shape(
    name: str,
    tokens: list[int],
    replays: int,
    ceil: dict[str, float],
    deadline: float,
    impls: list[str] | None = None,
) -> list[dict[str, Any]]:
    """All implementations and token counts of one layer shape."""
    import torch

    from moe_policy.experts.base import ExpertsConfig
    from moe_policy.experts.batched_format import combine_from_batched, dispatch_to_batched
    from moe_policy.experts.grouped_mm import TorchGroupedMMExperts
    from moe_policy.experts.lora import MoELoRAContext
    from moe_policy.experts.triton.batched import BatchedTritonExperts

    try:
        from moe_policy.experts.triton.fused_moe import TritonExperts
    except ImportError:
        TritonExperts = None

    shape = SHAPES[name]
    dev = DEVICE
    cfg = ExpertsConfig(
        shape.num_experts,
        shape.hidden,
        shape.inter,
        shape.top_k,
        activation=shape.activation,
        gated=shape.gated,
    )
    g = torch.Generator(device=dev).manual_seed(0)
    w13 = (
        torch.randn(shape.num_experts, shape.n1, shape.hidden, device=dev, generator=g)
        * shape.hidden**-0.5
    ).to(torch.bfloat16)
    w2 = (
        torch.randn(shape.num_experts, shape.hidden, shape.inter, device=dev, generator=g)
        * shape.inter**-0.5
    ).to(torch.bfloat16)
    ad = _adapters(cfg, dev)
    experts: dict[str, Any] = {"batched_triton": BatchedTritonExperts(cfg, w13, w2)}
    if TritonExperts is not None:
        experts["triton"] = TritonExperts(cfg, w13, w2)
    ok, why = TorchGroupedMMExperts.is_available()
    if ok:
        experts["torch_grouped_mm"] = TorchGroupedMMExperts(cfg, w13, w2)
    else:
        print(f"torch_grouped_mm unavailable: {why}", flush=True)

    rows: list[dict[str, Any]] = []
    for t in tokens:
        if time.time() > deadline:
            print(f"{name}: time budget spent, skipping T >= {t}", flush=True)
            break
        x = torch.randn(t, shape.hidden, device=dev, generator=g).to(torch.bfloat16)
        logits = torch.randn(t, shape.num_experts, device=dev, generator=g)
        w, ids = torch.softmax(logits, -1).topk(shape.top_k, dim=-1)
        ids = ids.to(torch.int32)
        lmap = (torch.arange(t, device=dev, dtype=torch.int32) % LORA_SLOTS).contiguous()
        m = int(torch.bincount(ids.flatten().long(), minlength=shape.num_experts).max())
        d = dispatch_to_batched(x, ids, shape.num_experts, m, lmap)
        lora_std = MoELoRAContext(ad, lmap)
        lora_b = MoELoRAContext(ad, d.lora_mapping)
        fns: dict[str, Any] = {}
        if "triton" in experts:
            fns["triton"] = partial(experts["triton"].apply, x, w, ids)
            fns["triton+lora"] = partial(experts["triton"].apply, x, w, ids, lora_std)
        fns["batched_triton"] = partial(experts["batched_triton"].apply, d.x, d.expert_num_tokens)
        fns["batched_triton+lora"] = partial(
            experts["batched_triton"].apply, d.x, d.expert_num_tokens, lora_b
        )
        if "torch_grouped_mm" in experts:
            fns["torch_grouped_mm"] = partial(experts["torch_grouped_mm"].apply, x, w, ids)
            fns["torch_grouped_mm+lora"] = partial(
                experts["torch_grouped_mm"].apply, x, w, ids, lora_std
            )

        if impls:
            fns = {k: v for k, v in fns.items() if k in impls}

        # Spot check (T = 64): every implementation agrees with the standard Triton path.
        check: dict[str, float] = {}
        for sfx in ("", "+lora") if t == 64 else ():
            if "triton" + sfx not in fns:
                continue
            base = fns["triton" + sfx]()
            if "batched_triton" + sfx in fns:
                yb = fns["batched_triton" + sfx]()
                check["batched_triton" + sfx] = rel_l2(
                    combine_from_batched(yb, d.index_map, w, t), base
                )
            if "torch_grouped_mm" + sfx in fns:
                check["torch_grouped_mm" + sfx] = rel_l2(fns["torch_grouped_mm" + sfx](), base)
        if check:
            print(
                f"{name} T={t} rel_l2 vs triton: "
                + ", ".join(f"{k}={v:.1e}" for k, v in check.items()),
                flush=True,
            )

        lb = lower_bound_us(shape, t, ceil["copy_tbps"], ceil["matmul_tflops"])
        times: dict[str, dict[str, Any]] = {}
        for impl, fn in fns.items():
            try:
                times[impl] = _time(fn, replays)
            except Exception as exc:
                times[impl] = {"us": None, "error": f"{type(exc).__name__}: {exc}"[:300]}
                print(f"{name} T={t} {impl}: {times[impl]['error']}", flush=True)
        for impl, r in times.items():
            base = times.get("triton+lora" if impl.endswith("+lora") else "triton", {}).get("us")
            us = r.get("us")
            rows.append(
                {
                    "shape": name,
                    "T": t,
                    "impl": impl,
                    "max_tokens_per_expert": m,
                    **r,
                    "lower_bound_us": lb,
                    "ratio": us / lb if us else None,
                    "vs_triton": us / base if us and base else None,
                    "check_rel_l2_vs_triton": check.get(impl),
                }
            )
        print(
            f"{name} T={t}: "
            + ", ".join(
                f"{k}={v['us']:.1f}us" if v.get("us") else f"{k}=ERR" for k, v in times.items()
            ),
            flush=True,
        )
    del experts, w13, w2, ad
    torch.cuda.empty_cache()
    return rows


def print_table(rows: list[dict[str, Any]]) -> None:
    """µs per call and ratio to the standard Triton path at equal work."""
    cols = [
        "triton",
        "batched_triton",
        "torch_grouped_mm",
        "triton+lora",
        "batched_triton+lora",
        "torch_grouped_mm+lora",
    ]
    by = {(r["shape"], r["T"], r["impl"]): r for r in rows}
    head = f"{'shape':<15}{'T':>6}" + "".join(f"{c:>24}" for c in cols)
    print(head)
    for shape in dict.fromkeys(r["shape"] for r in rows):
        for t in sorted({r["T"] for r in rows if r["shape"] == shape}):
            cells = []
            for c in cols:
                r = by.get((shape, t, c))
                if r is None or r.get("us") is None:
                    cells.append(f"{'-':>24}")
                    continue
                vs = (
                    f" ({r['vs_triton']:.2f}x)"
                    if r.get("vs_triton") and c not in ("triton", "triton+lora")
                    else ""
                )
                cells.append(f"{r['us']:>14.1f}{vs:>10}")
            print(f"{shape:<15}{t:>6}" + "".join(cells))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--shapes", nargs="*", default=DEFAULT_SHAPES)
    ap.add_argument("--tokens", nargs="*", type=positive_int, default=TOKENS)
    ap.add_argument("--replays", type=positive_int, default=20)
    ap.add_argument(
        "--impls",
        nargs="*",
        default=None,
        help="subset of: triton, batched_triton, torch_grouped_mm (each +lora too)",
    )
    ap.add_argument(
        "--budget-s", type=float, default=300.0, help="stop starting new cells after this"
    )
    args = ap.parse_args()

    import torch
    import triton

    start = time.time()
    deadline = start + args.budget_s
    ceil = measure_ceilings()
    meta = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "ceilings": ceil,
        "calls_per_graph": CALLS,
        "replays": args.replays,
        "lora": {"slots": LORA_SLOTS, "rank": LORA_RANK},
        "routing": "uniform (top-k of softmax of N(0,1) logits)",
        "dtype": "bfloat16",
    }
    print(f"ceilings: {ceil}", flush=True)
    rows: list[dict[str, Any]] = []
    path = os.path.join(args.out, "kernels_batched.json")
    meta["impls"] = args.impls or "all"
    for name in args.shapes:
        try:
            rows += bench_shape(name, args.tokens, args.replays, ceil, deadline, args.impls)
        except Exception as exc:  # keep the other shapes' numbers
            print(f"{name}: failed: {type(exc).__name__}: {exc}", flush=True)
        write_json(path, {"meta": meta, "rows": rows})
    meta["wall_s"] = time.time() - start
    write_json(path, {"meta": meta, "rows": rows})
    try:
        plot_ratios(
            rows,
            os.path.join(args.out, "kernels_batched.png"),
            "batched Triton / grouped_mm vs lower bound (H200, bf16)",
        )
    except Exception as exc:
        print(f"plot skipped: {exc}")
    print_table(rows)


if __name__ == "__main__":
    main()
