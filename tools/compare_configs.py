"""Compare Triton fused-MoE tile configs on whole layers, CUDA-graph timed (GPU machine).

The tuner ranks GEMM 1 and GEMM 2 by isolated profiler times; this script times what an engine
runs: the whole layer (alignment, both GEMMs, top-k sum) replayed in a CUDA graph, for the
shipped config and named variants of it (tail tiles on or off, other tail sizes), timed in
interleaved rounds so that clock drift falls on all alike, the GPU resting between samples
(``--duty``) so that the power cap does not make prefill timings drift by 5-10 %. Each
variant's output is checked against the shipped config's output before it is timed.

    python -m tools.compare_configs --shapes qwen3-30b-a3b --tokens 4096 8192 --out DIR

Decode entries (``--decode-search``): the trigger with shallower pipelines, whole-layer timed;
``--decode-tiles``: each GEMM's tile (N, K, stages) with the other as shipped, the trigger on
and off. In every mode but ``--lora`` the winners (``--min-gain`` faster than shipped) go to
``compare_best.json``, which ``--write-best`` merges into the shipped tuned files (on any
machine: the JSON is all it needs); e.g. after a re-tune, ``--variants persistent
not_persistent`` finds where persistent GEMMs pay. ``--with-lora`` times every variant with and
without LoRA in the same rounds and keeps a variant that wins one layer without costing the
other (how Qwen3's 128 x 64 GEMM-2 tiles at T <= 512 were found: base -0-2%, LoRA -3-7%).

    python -m tools.compare_configs --decode-search --shapes gpt-oss-20b --tokens 1 2 4
    python -m tools.compare_configs --decode-tiles --shapes qwen3-30b-a3b --tokens 1
    python -m tools.compare_configs --write-best compare_best.json
"""

from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import replace
from typing import Any

from benchmarks.common import (
    SHAPES,
    MoEShape,
    add_shape_args,
    cuda_device_name,
    duty_fraction,
    lower_bound_us,
    measure_ceilings,
    positive_int,
    read_json,
    routing_sets,
    time_graphs_interleaved,
    writable_dir,
)
from moe_policy.experts.triton.config import (
    CONFIG_DIR,
    SMEM_LIMIT,
    MoEConfig,
    config_file_name,
    default_tail_m,
    get_config,
    heuristic_config,
    is_decode_batch,
    read_tuned_file,
    smem_bytes,
)
from moe_policy.experts.triton.tuning.inputs import call_layer
from tools.layer import compile_configs, layer, layer_lora
from tools.tune_triton import configs_by_shape, write_config_file


def _shipped(shape: MoEShape, t: int, device: str) -> MoEConfig:
    """The config a layer of ``shape`` runs at ``t`` tokens on ``device`` (tuned or heuristic)."""
    return get_config(t, shape.num_experts, shape.top_k, shape.hidden, shape.inter, shape.gated,
                      device)  # fmt: skip


def variants(shape: MoEShape, t: int, device: str) -> dict[str, MoEConfig]:
    """The shipped config and variants of it by name: one program per tile without tail tiles
    ("plain"), with tail tiles of a quarter and a half of BLOCK_M, with programmatic dependent
    launches switched ("pdl" on, "no_pdl" off) and, where they are on, the decode trigger
    forced ("trigger") or off ("no_trigger"), persistent GEMMs switched ("persistent" without
    tail tiles, "not_persistent" with the default ones), and the heuristic config where a
    tuned file differs."""
    base = _shipped(shape, t, device)
    plain = replace(base, tail_m=0, persistent=False)
    out = {"shipped": base, "plain": plain}
    for tail in (base.block_m // 4, base.block_m // 2):
        if tail >= 16:
            out[f"tail{tail}"] = replace(plain, tail_m=tail)
    out["no_pdl" if base.pdl else "pdl"] = replace(base, pdl=not base.pdl)
    if base.pdl:  # the decode trigger needs dependent launches
        out["no_trigger" if base.trigger else "trigger"] = replace(base, trigger=not base.trigger)
    if base.persistent:  # back to one program per tile, with the default tail tiles
        out["not_persistent"] = replace(base, persistent=False, tail_m=default_tail_m(base.block_m))
    else:
        out["persistent"] = replace(base, persistent=True, tail_m=0)
    heur = heuristic_config(t, shape.num_experts, shape.top_k, shape.hidden, shape.inter,
                            shape.gated)  # fmt: skip
    if heur != base:  # what an untuned GPU gets
        out["heuristic"] = heur
    return out


def decode_search(shape: MoEShape, t: int, device: str) -> dict[str, MoEConfig]:
    """The shipped config and, for a decode batch with dependent launches (one pair per block),
    the trigger forced on with shallower pipelines: GEMM 1 one stage less and GEMM 2 one or two
    less (at least 2), so that GEMM 2's programs fit on an SM beside GEMM 1's. The tuner times
    kernels one at a time and cannot see that overlap; whole layers can."""
    base = _shipped(shape, t, device)
    out = {"shipped": base}
    if not base.pdl or not is_decode_batch(t, shape.top_k, shape.num_experts):
        return out
    s1, s2 = base.gemm1.num_stages, base.gemm2.num_stages
    for d1 in (0, 1):
        for d2 in (0, 1, 2):
            if s1 - d1 < 2 or s2 - d2 < 2:
                continue
            cfg = replace(
                base, trigger=True, gemm1=replace(base.gemm1, num_stages=s1 - d1),
                gemm2=replace(base.gemm2, num_stages=s2 - d2),
            )  # fmt: skip
            if cfg != base:
                out[f"trig_g1s{s1 - d1}_g2s{s2 - d2}"] = cfg
    return out


#: Decode tile search: N tile, K tile and pipeline depth of one GEMM (the other kept).
_DECODE_TILES = [(bn, bk, st) for bn in (16, 32, 64, 128) for bk in (128, 256)
                 for st in (2, 3, 4)]  # fmt: skip


def decode_tile_search(shape: MoEShape, t: int, device: str) -> dict[str, MoEConfig]:
    """The shipped config and, for a decode batch (one pair per block), every other tile of
    one GEMM (``_DECODE_TILES``, within the shared-memory budget) with the other GEMM as
    shipped, with the decode trigger on and off where dependent launches are: a coordinate
    search the tuner cannot make, since it times the GEMMs apart (their overlap at decode is
    what the trigger and the tile sizes trade)."""
    base = _shipped(shape, t, device)
    out = {"shipped": base}
    if not is_decode_batch(t, shape.top_k, shape.num_experts):
        return out
    triggers = (True, False) if base.pdl else (None,)
    b_tiles = {"gemm1": 2 if shape.gated else 1, "gemm2": 1}
    limits = {"gemm1": (shape.inter, shape.hidden), "gemm2": (shape.hidden, shape.inter)}
    for gemm in ("gemm1", "gemm2"):
        n, k = limits[gemm]
        for bn, bk, st in _DECODE_TILES:
            if bn > n or bk > k:
                continue
            g = replace(getattr(base, gemm), block_n=bn, block_k=bk, num_stages=st)
            if smem_bytes(base.block_m, g, b_tiles[gemm]) > SMEM_LIMIT:
                continue
            for trig in triggers:
                cfg = replace(base, **{gemm: g}, trigger=trig)
                if cfg != base:
                    tag = "" if trig is None else ("_trig" if trig else "_notrig")
                    out[f"{gemm[0]}{gemm[-1]}_n{bn}_k{bk}_s{st}{tag}"] = cfg
    return out


#: A variant whose output differs from the shipped config's by more than this (relative
#: norm; bf16 layers agree to ~1e-3) computes something else and never wins.
MAX_REL_DIFF = 1e-2


#: --with-lora: how much slower than shipped the other layer (base or LoRA) of a winning
#: variant may be (the timing noise of one interleaved call, ~0.5%).
LORA_SLACK = 0.005


def best_entries(
    rows: list[dict[str, Any]], min_gain: float, slack: float = LORA_SLACK
) -> dict[str, dict[str, Any]]:
    """``shape/T`` -> config dict of the best variant where it beats the shipped config by
    more than ``min_gain`` (a fraction) and its output agrees (``MAX_REL_DIFF``); rows as
    ``main`` writes them. With LoRA rows beside the base rows (``--with-lora``) a variant
    must beat shipped on one layer by ``min_gain`` and lose at most ``slack`` on the other,
    and the best has the lowest sum of the two relative times (a tile that the LoRA expand
    prefers wins only if the base layer does not pay for it)."""

    def usable(row: dict[str, Any]) -> bool:
        return (
            "vs_shipped" in row
            and row["variant"] != "shipped"
            and row.get("rel_diff", 0.0) <= MAX_REL_DIFF  # also refuses a NaN difference
        )

    lora = {(r["shape"], r["T"], r["variant"]): r for r in rows if r.get("lora") and usable(r)}
    lora_points = {key[:2] for key in lora}
    best: dict[str, dict[str, Any]] = {}
    for row in rows:
        if row.get("lora") or not usable(row):
            continue
        key = f"{row['shape']}/{row['T']}"
        r_base = row["vs_shipped"]
        if (row["shape"], row["T"]) in lora_points:
            partner = lora.get((row["shape"], row["T"], row["variant"]))
            if partner is None:  # its LoRA timing failed or disagreed: no verdict
                continue
            r_lora = partner["vs_shipped"]
            wins = (r_base < 1 - min_gain and r_lora <= 1 + slack) or (
                r_lora < 1 - min_gain and r_base <= 1 + slack
            )
            score = r_base + r_lora
            entry = {"r": r_base, "r_lora": r_lora}
        else:
            wins, score, entry = r_base < 1 - min_gain, r_base, {"r": r_base}
        if wins and score < best.get(key, {}).get("score", float("inf")):
            best[key] = {**entry, "score": score, "variant": row["variant"],
                         "config": row["config"]}  # fmt: skip
    return best


def write_best(best_path: str, config_dir: str) -> list[str]:
    """Merge ``compare_best.json`` (any mode but ``--lora``) into the tuned files of ``config_dir``
    (each ``shape/T`` entry replaces or adds key T of that shape's file, as the tuner writes
    them); returns the files. ValueError naming the file, and nothing written, when it is not
    a ``compare_best.json``, an entry's config is malformed, or a shape has no tuned file (or
    one that is not a tuned file) to merge into."""
    payload = read_json(best_path)
    if not (isinstance(payload, dict) and isinstance(payload.get("device"), str)
            and isinstance(payload.get("best"), dict)):  # fmt: skip
        raise ValueError(f"{best_path}: not a compare_best.json (no 'device' and 'best')")
    tables = configs_by_shape(best_path, "best", payload["best"], "config")
    versions = {}
    for name in tables:
        shape = SHAPES[name]
        path = os.path.join(config_dir, config_file_name(shape.num_experts, shape.inter,
                                                         payload["device"]))  # fmt: skip
        if not os.path.isfile(path):
            raise ValueError(f"{path}: no tuned file to merge {name} into; run tools.tune_triton")
        try:
            read_tuned_file(path)
            with open(path) as f:
                versions[name] = str(json.load(f).get("triton_version", "?"))
        except (OSError, ValueError, AttributeError) as exc:
            raise ValueError(f"{path}: cannot merge {name} into it ({exc})") from None
    written = [
        write_config_file(SHAPES[name], table, payload["device"], versions[name], config_dir)
        for name, table in tables.items()
    ]
    return sorted(written)


def gain_fraction(text: str) -> float:
    """argparse type of ``--min-gain``: a fraction in [0, 1) (a negative gain would keep a
    variant slower than shipped)."""
    try:
        x = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0.0 <= x < 1.0:
        raise argparse.ArgumentTypeError(f"must be in [0, 1), got {text!r}")
    return x


def _label(variant: str, lora: bool) -> str:
    """Timing name of a variant, ``+lora`` for its LoRA layer beside the base one."""
    return f"{variant}+lora" if lora else variant


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_shape_args(p)
    p.add_argument(
        "--rounds", type=positive_int, default=10, help="timing rounds (variants rotated)"
    )
    p.add_argument(
        "--replays", type=positive_int, default=5, help="graph replays per variant per round"
    )
    p.add_argument("--duty", type=duty_fraction, default=0.25,
                   help="keep the GPU busy at most this fraction of the time, resting between "
                        "samples so each starts at the boost clock (1: back to back)")  # fmt: skip
    p.add_argument("--variants", nargs="+", help="names to time besides 'shipped' (default all)")
    p.add_argument("--lora", action="store_true", help="with LoRA (rank 16, 4 adapters)")
    p.add_argument("--with-lora", action="store_true",
                   help="time every variant without and with LoRA in the same rounds; "
                        "compare_best.json keeps a variant that wins one layer by --min-gain "
                        "and loses at most 0.5%% on the other")  # fmt: skip
    p.add_argument("--jobs", type=positive_int, default=12, help="compile workers")
    p.add_argument("--out", default=".",
                   help="folder of compare_configs.json and compare_best.json")  # fmt: skip
    p.add_argument("--decode-search", action="store_true",
                   help="time decode_search's variants instead of the named variants")  # fmt: skip
    p.add_argument("--decode-tiles", action="store_true",
                   help="time decode_tile_search's variants instead; compare_best.json as with "
                        "--decode-search")  # fmt: skip
    p.add_argument(
        "--min-gain",
        type=gain_fraction,
        default=0.02,
        help="compare_best.json keeps a variant only when this much faster than shipped",
    )
    p.add_argument(
        "--write-best",
        metavar="JSON",
        help="merge a compare_best.json into moe_policy/experts/triton/configs and exit",
    )
    args = p.parse_args()
    if args.write_best:
        try:
            written = write_best(args.write_best, str(CONFIG_DIR))
        except ValueError as exc:
            p.error(f"--write-best {exc}")
        for path in written:
            print(f"# wrote {path}")
        if not written:
            print(f"# {args.write_best} has no entries: nothing merged")
        return
    try:
        writable_dir(args.out)
    except ValueError as exc:
        p.error(f"--out: {exc}")
    try:
        device = cuda_device_name("the comparison times the layers on the GPU the configs are for")
    except ValueError as exc:
        p.exit(2, f"{p.prog}: error: {exc}\n")

    import multiprocessing as mp

    import torch

    start = time.time()
    make = (
        decode_tile_search if args.decode_tiles
        else decode_search if args.decode_search else variants
    )  # fmt: skip
    plan = {(s, t): make(SHAPES[s], t, device) for s in args.shapes for t in args.tokens}
    plan = {st: vs for st, vs in plan.items() if len(vs) > 1}  # nothing to compare otherwise
    if args.variants:
        offered = {n for vs in plan.values() for n in vs}
        unknown = sorted(set(args.variants) - offered)
        if unknown:
            p.error(f"--variants: no point offers {', '.join(unknown)} (offered: "
                    f"{', '.join(sorted(offered - {'shipped'})) or 'none'})")  # fmt: skip
        keep = {"shipped", *args.variants}
        plan = {st: {n: c for n, c in vs.items() if n in keep} for st, vs in plan.items()}
    modes = [False, True] if args.with_lora else [args.lora]
    tasks = [(s, t, [c.to_dict()], lora) for (s, t), vs in plan.items() for c in vs.values()
             for lora in modes]  # fmt: skip
    with mp.get_context("spawn").Pool(args.jobs) as pool:
        bad = sum(pool.map(compile_configs, tasks, chunksize=1))
    print(
        f"# compiled {len(tasks)} configs in {time.time() - start:.0f}s ({bad} failed)", flush=True
    )
    ceil = measure_ceilings()
    print(f"# copy {ceil['copy_tbps']:.2f} TB/s, matmul {ceil['matmul_tflops']:.0f} TFLOP/s")
    rows = []
    for (s, t), vs in plan.items():
        shape = SHAPES[s]
        backend = layer(shape)
        sets = routing_sets(shape, t, 2)
        loras = layer_lora(shape, t, len(sets)) if True in modes else [None] * len(sets)
        bound = lower_bound_us(shape, t, ceil["copy_tbps"], ceil["matmul_tflops"])
        calls, group = {}, []
        for mode in modes:
            mode_loras = loras if mode else [None] * len(sets)
            ref = call_layer(backend, vs["shipped"], *sets[0], lora=mode_loras[0]).float()
            for name, cfg in vs.items():
                label = _label(name, mode and args.with_lora)
                row: dict[str, Any] = {"shape": s, "T": t, "variant": name,
                                       "config": cfg.to_dict(), "lora": mode}  # fmt: skip
                try:
                    got = call_layer(backend, cfg, *sets[0], lora=mode_loras[0]).float()
                    row["rel_diff"] = float((got - ref).norm() / ref.norm())
                    calls[label] = [
                        lambda b=backend, c=cfg, x=x, tw=tw, ti=ti, lo=lo: call_layer(
                            b, c, x, tw, ti, lora=lo
                        )
                        for (x, tw, ti), lo in zip(sets, mode_loras, strict=True)
                    ]
                except Exception as exc:  # a tile that does not compile or fit is reported
                    row["error"] = f"{type(exc).__name__}: {str(exc)[:160]}"
                group.append(row)
        timed = time_graphs_interleaved(calls, args.rounds, args.replays, args.duty)
        for row in group:
            label = _label(row["variant"], row["lora"] and args.with_lora)
            if label in timed:
                row.update(timed[label])
                row["ratio"] = row["us"] / bound
                shipped = timed[_label("shipped", row["lora"] and args.with_lora)]["us"]
                row["vs_shipped"] = row["us"] / shipped
                print(f"{s:15s} T={t:5d} {label:21s} {row['us']:9.1f} us  x{row['ratio']:.2f}  "
                      f"{row['vs_shipped']:.3f} of shipped  (p20-p80 {row['p20_us']:.1f}-"
                      f"{row['p80_us']:.1f})  diff {row['rel_diff']:.1e}", flush=True)  # fmt: skip
            else:
                print(f"{s:15s} T={t:5d} {label:21s} {row['error']}", flush=True)
        rows.extend(group)
        torch.cuda.empty_cache()
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "compare_configs.json"), "w") as f:
        json.dump({"device": device, "ceilings": ceil, "rows": rows}, f, indent=1)
    if args.lora:  # tile configs are shared with the base layer: LoRA timings do not pick them
        print("# --lora: no compare_best.json (a LoRA timing does not choose base configs)")
    else:
        best = best_entries(rows, args.min_gain)
        for key, entry in best.items():
            lora = f", LoRA {entry['r_lora']:.3f}" if "r_lora" in entry else ""
            print(f"# best {key}: {entry['variant']} ({entry['r']:.3f} of shipped{lora})")
        with open(os.path.join(args.out, "compare_best.json"), "w") as f:
            json.dump({"device": device, "best": best}, f, indent=1)
    print(f"# total {time.time() - start:.0f}s", flush=True)


if __name__ == "__main__":
    main()
