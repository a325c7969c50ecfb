"""Tune the Triton fused-MoE tiles for one model on this GPU; writes a tuned file the kernels
pick up at run time from ``MOE_POLICY_TUNED_CONFIG_DIR``.

Unlike ``tools.tune_triton`` (one GEMM at a time), every candidate is timed as what an engine
runs: the whole layer (alignment, both GEMMs, activation, top-k sum; LoRA with ``--lora``)
captured in a CUDA graph, all candidates of a token count replayed in interleaved rounds, so
that persistence, dependent launches and the fused decode sum are seen. Each candidate's
output is checked against the heuristic's before it is timed. Candidates are compiled first
in worker processes (``--jobs``).

    python -m tools.tune --model config.json --out ~/.cache/moe-policy/tuned
    MOE_POLICY_TUNED_CONFIG_DIR=~/.cache/moe-policy/tuned vllm serve ...

``--tp N`` tunes the layer a tensor-parallel rank runs (intermediate size / N), ``--ep N`` the
one an expert-parallel rank runs (E / N experts, each token's k slots spread over the ranks:
k / N per rank, at least 1). Prints progress with the time left, the before/after table, and
writes ``E=..,N=..,device_name=...json``, ``tune_report.json`` and ``tune_report.png`` in
``--out``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from dataclasses import asdict, replace
from typing import Any

from benchmarks.common import (
    FIXED_COPY_TBPS,
    FIXED_MATMUL_TFLOPS,
    MoEShape,
    lower_bound_us,
    positive_int,
    shape_from_model,
)
from moe_policy.experts.triton.config import (
    TUNED_DIR_ENV,
    GemmConfig,
    MoEConfig,
    config_file_name,
    default_tail_m,
    fit_stages,
    heuristic_config,
    is_decode_batch,
)

#: Activations the Triton kernels run, and whether each must be gated.
KERNEL_ACTIVATIONS = {"silu": None, "gelu": None, "gelu_tanh": None, "relu2": False,
                      "swigluoai": True, "swiglustep": None}  # fmt: skip
TUNE_TOKENS = (1, 16, 64, 256, 1024, 4096)


class TuneError(Exception):
    """Bad input, named by its origin; the command prints it as one line and exits 2."""


# ---------------------------------------------------------------- inputs


def model_shape(spec: str, tp: int, ep: int) -> tuple[MoEShape, str]:
    """The layer one rank runs of the model ``spec``, and its quantization; TuneError when the
    config has no MoE facts, the split does not divide, or the kernels cannot run it."""
    from moe_policy.core.model import load_model
    from moe_policy.errors import PolicyError

    try:
        shape = shape_from_model(spec)
        quant = str(load_model(spec).value("model.quantization"))
    except PolicyError as exc:
        raise TuneError(f"--model {spec}: {exc}") from None
    except OSError as exc:
        raise TuneError(f"--model {spec}: {exc.strerror or exc}") from None
    need = KERNEL_ACTIVATIONS.get(shape.activation, "missing")
    if need == "missing" or (need is not None and need != shape.gated):
        raise TuneError(f"--model {spec}: the Triton kernels do not run {shape.activation!r} "
                        f"experts with gated={shape.gated}")  # fmt: skip
    if quant != "none":
        raise TuneError(f"--model {spec}: the Triton kernels run bf16/fp16 experts; this model's "
                        f"are quantized ({quant})")  # fmt: skip
    if shape.inter % tp:
        raise TuneError(f"cli:--tp: {tp} does not divide the expert intermediate size "
                        f"{shape.inter}")  # fmt: skip
    if shape.num_experts % ep:
        raise TuneError(f"cli:--ep: {ep} does not divide the expert count {shape.num_experts}")
    e = shape.num_experts // ep
    k = max(1, min(e, round(shape.top_k / ep)))
    if e > 1024:
        raise TuneError(f"--model {spec}: {e} experts per rank; the kernels run at most 1024")
    name = shape.name + (f"-tp{tp}" if tp > 1 else "") + (f"-ep{ep}" if ep > 1 else "")
    return replace(shape, name=name, num_experts=e, top_k=k, inter=shape.inter // tp), quant


def writable_dir(path: str, origin: str) -> str:
    """``path`` created if missing and checked writable (a file is written and removed)."""
    try:
        os.makedirs(path, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".tune-check-"):
            pass
    except OSError as exc:
        raise TuneError(f"{origin}: cannot write to {path!r} ({exc.strerror or exc})") from None
    return path


def require_gpu() -> str:
    """The CUDA device's name; TuneError without one (tuning times the GPU it tunes for)."""
    import torch

    if not torch.cuda.is_available():
        raise TuneError("no CUDA GPU: tuning times the kernels on the GPU they will run on")
    return str(torch.cuda.get_device_name())


# ---------------------------------------------------------------- candidates


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


# ---------------------------------------------------------------- compile and time (GPU)


def _compile_task(task: tuple[dict[str, Any], int, list[dict[str, Any]], bool]) -> int:
    """Worker: launch each config once on a few experts, so that Triton's on-disk cache holds
    its kernels (plans are made for the real expert count: the same kernels); failures."""
    import torch

    from moe_policy.experts.testing import make_routing, make_x
    from moe_policy.experts.triton.device import device_limits
    from moe_policy.experts.triton.fused_moe import launch_plan
    from moe_policy.experts.triton.launch import MoEProblem, plan_launch

    sd, t, cfgs, _ = task
    s = MoEShape(**sd)
    dev = torch.device("cuda")
    e = min(s.num_experts, max(2, s.top_k))
    w13 = torch.randn(e, s.n1, s.hidden, device=dev, dtype=torch.bfloat16) * 0.02
    w2 = torch.randn(e, s.hidden, s.inter, device=dev, dtype=torch.bfloat16) * 0.02
    b13 = torch.zeros(e, s.n1, device=dev, dtype=torch.bfloat16) if s.has_bias else None
    b2 = torch.zeros(e, s.hidden, device=dev, dtype=torch.bfloat16) if s.has_bias else None
    x = make_x(t, s.hidden, torch.bfloat16, dev)
    tw, ti = make_routing(t, e, s.top_k, dev)
    prob = MoEProblem(t, s.top_k, s.num_experts, s.hidden, s.inter, s.gated, s.activation, 2,
                      False, s.has_bias)  # fmt: skip
    bad = 0
    for c in cfgs:
        try:
            launch_plan(plan_launch(prob, device_limits(dev), MoEConfig.from_dict(c)),
                        x, w13, w2, tw, ti, b13, b2)  # fmt: skip
        except Exception:
            bad += 1
    torch.cuda.synchronize()
    return bad


def tune(
    shape: MoEShape, tokens: list[int], lora: bool, jobs: int, rounds: int
) -> list[dict[str, Any]]:
    """Per token count: every candidate timed as a whole layer (and with LoRA), the winner."""
    import multiprocessing as mp

    import torch

    from benchmarks.common import (
        experts_config,
        lora_contexts,
        routing_sets,
        shape_adapters,
        shape_weights,
        time_graphs_interleaved,
    )
    from moe_policy.experts.testing import rel_err
    from moe_policy.experts.triton.device import cuda_limits
    from moe_policy.experts.triton.fused_moe import TritonExperts
    from tools.layer import call

    sms = int(cuda_limits(torch.cuda.current_device())["num_sms"])
    cands = {t: candidates(shape, t, sms) for t in tokens}
    total = sum(len(c) for c in cands.values())
    start = time.time()
    print(f"# {shape.name}: E={shape.num_experts} k={shape.top_k} H={shape.hidden} "
          f"I={shape.inter}; {total} candidates at T={tokens}", flush=True)  # fmt: skip
    tasks = [(asdict(shape), t, [c.to_dict() for c in cands[t]], lora) for t in tokens]
    with mp.get_context("spawn").Pool(max(1, jobs)) as pool:
        bad = sum(pool.map(_compile_task, tasks))
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
        ref = call(be, cands[t][0], *sets[0])
        variants: dict[str, list[Any]] = {}
        kept: dict[str, MoEConfig] = {}
        for i, c in enumerate(cands[t]):
            try:
                if i and not rel_err(call(be, c, *sets[0]), ref) < 2e-2:
                    continue
            except Exception:
                continue
            kept[str(i)] = c
            variants[str(i)] = [lambda s=s, c=c: call(be, c, *s) for s in sets]
            if lora:
                variants[f"{i}+lora"] = [lambda s=s, c=c, x=x: call(be, c, *s, lora=x)
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


# ---------------------------------------------------------------- output


def report_table(results: list[dict[str, Any]]) -> str:
    """The before/after table: µs and bound ratio of the heuristic and the tuned config."""
    lora = any("tuned_lora_us" in r for r in results)
    head = "| T | heuristic µs | tuned µs | gain | tuned / bound |"
    head += " LoRA heuristic µs | LoRA tuned µs |" if lora else ""
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in results:
        cells = [str(r["T"]), f"{r['heuristic_us']:.1f}", f"{r['tuned_us']:.1f}",
                 f"{r['heuristic_us'] / r['tuned_us'] - 1:+.1%}",
                 f"{r['tuned_us'] / r['bound_us']:.2f}"]  # fmt: skip
        if lora:
            cells += [f"{r['heuristic_lora_us']:.1f}", f"{r['tuned_lora_us']:.1f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def write_outputs(shape: MoEShape, device: str, results: list[dict[str, Any]], out: str) -> str:
    """The tuned file (token count -> config), ``tune_report.json`` and ``tune_report.png``."""
    import triton

    path = os.path.join(out, config_file_name(shape.num_experts, shape.inter, device))
    payload = {"triton_version": triton.__version__, "device_name": device, "model": shape.name,
               "configs": {str(r["T"]): r["config"] for r in results}}  # fmt: skip
    with open(path, "w") as f:
        json.dump(payload, f, indent=1)
        f.write("\n")
    with open(os.path.join(out, "tune_report.json"), "w") as f:
        json.dump({"shape": asdict(shape), "device": device, "rows": results}, f, indent=1)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 4))
        ts = [r["T"] for r in results]
        ax.plot(ts, [r["heuristic_us"] / r["bound_us"] for r in results], marker="o",
                label="heuristic")  # fmt: skip
        ax.plot(ts, [r["tuned_us"] / r["bound_us"] for r in results], marker="o", label="tuned")
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("tokens T")
        ax.set_ylabel("whole layer / lower bound")
        ax.set_title(f"{shape.name} on {device}")
        ax.legend()
        fig.tight_layout()
        fig.savefig(os.path.join(out, "tune_report.png"), dpi=110)
    except ImportError as exc:
        print(f"# no plot: {exc}")
    return path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tools.tune", description=__doc__.split("\n")[0])
    p.add_argument(
        "--model",
        required=True,
        help="a Hugging Face config.json, model directory or bundled model name",
    )
    p.add_argument("--tp", type=positive_int, default=1, help="tensor-parallel ranks")
    p.add_argument("--ep", type=positive_int, default=1, help="expert-parallel ranks")
    p.add_argument("--tokens", nargs="+", type=positive_int, default=list(TUNE_TOKENS))
    p.add_argument("--lora", action="store_true",
                   help="time every candidate with LoRA too (rank 16, 4 adapters); the winner "
                        "is the fastest base + LoRA layer")  # fmt: skip
    p.add_argument("--out", help=f"directory of the tuned file (default: ${TUNED_DIR_ENV})")
    p.add_argument(
        "--jobs", type=positive_int, default=min(16, os.cpu_count() or 1), help="compile workers"
    )
    p.add_argument("--rounds", type=positive_int, default=6, help="interleaved timing rounds")
    args = p.parse_args(argv)
    try:
        shape, _ = model_shape(args.model, args.tp, args.ep)
        out = args.out or os.environ.get(TUNED_DIR_ENV, "").strip()
        if not out:
            raise TuneError(f"cli:--out: no directory: give --out DIR or set {TUNED_DIR_ENV}")
        out = writable_dir(out, "cli:--out" if args.out else f"env:{TUNED_DIR_ENV}")
        device = require_gpu()
    except TuneError as exc:
        print(f"moe-policy tune: error: {exc}", file=sys.stderr)
        return 2
    results = tune(shape, sorted(set(args.tokens)), args.lora, args.jobs, args.rounds)
    path = write_outputs(shape, device, results, out)
    print(report_table(results))
    gain = [r["heuristic_us"] / r["tuned_us"] for r in results]
    print(f"# wrote {path} (gain over the heuristic {min(gain) - 1:+.1%} to {max(gain) - 1:+.1%});"
          f" set {TUNED_DIR_ENV}={out} for the kernels to use it")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
