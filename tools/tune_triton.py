"""Tune the Triton fused-MoE block sizes on this GPU; writes ``E={E},N={I},device_name=...json``.

The decode trigger (``MoEConfig.trigger``) is not tuned here: it pays off through overlap of
the two GEMMs, which kernel-by-kernel timing cannot see; ``python -m tools.compare_configs
--decode-search`` finds those entries. Writing a file keeps the entries of token counts this
run did not tune.

Small by design (a vLLM-style full sweep takes over an hour): for each token count, the
heuristic's BLOCK_M and one neighbour, and a short list of GEMM-1 and GEMM-2 tiles. GEMM 1 and
GEMM 2 are separate kernels, so one layer call times one GEMM-1 and one GEMM-2 candidate at
once (device time per kernel, from the profiler, median over routing sets). Per BLOCK_M the
best GEMM 1 and best GEMM 2 are kept; the BLOCK_M with the smallest sum wins. Candidates are
compiled first by ``--jobs`` worker processes, then timed one at a time in this process.

    python -m tools.tune_triton --shapes qwen3-30b-a3b --tokens 1 64 1024 --out moe_policy/experts/triton/configs
    python -m tools.tune_triton --from-log tune_log.json --out moe_policy/experts/triton/configs
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from dataclasses import replace
from typing import Any

from benchmarks.common import (
    SHAPES,
    MoEShape,
    add_shape_args,
    cuda_device_name,
    kernel_times,
    nonnegative_int,
    positive_float,
    read_json,
    routing_sets,
    writable_dir,
)
from moe_policy.experts.triton.config import (
    GemmConfig,
    MoEConfig,
    default_pdl,
    default_tail_m,
    fit_stages,
    heuristic_config,
)
from moe_policy.experts.triton.tuning.inputs import call_layer
from moe_policy.experts.triton.tuning.report import kept_configs, tuned_file_path
from tools.layer import compile_configs, layer

#: (block_n, block_k, num_warps, num_stages) candidates by BLOCK_M; gated GEMM-1 block_n
#: counts activation columns (the MMA is twice as wide), so its list is halved.
_DECODE = [
    (16, 128, 4, 4),
    (32, 128, 4, 4),
    (64, 128, 4, 4),
    (64, 64, 4, 5),
    (128, 64, 4, 4),
    (64, 256, 4, 3),
    (32, 256, 4, 3),
]
_MID = [
    (64, 64, 4, 4),
    (128, 64, 4, 4),
    (128, 64, 8, 4),
    (64, 128, 4, 3),
    (128, 128, 8, 3),
    (256, 64, 8, 3),
]
_PREFILL = [
    (256, 64, 8, 4),
    (256, 64, 8, 3),
    (128, 64, 8, 4),
    (128, 128, 8, 3),
    (256, 32, 8, 5),
    (128, 64, 4, 4),
]
#: BLOCK_M 256: the accumulator allows at most 128 MMA columns with 8 warps.
_HUGE = [
    (128, 64, 8, 4),
    (128, 64, 8, 3),
    (128, 32, 8, 5),
]
_NEIGHBOURS = {16: (32,), 32: (16, 64), 64: (32, 128), 128: (64, 256), 256: (128,)}


def _tiles(block_m: int, gated_gemm1: bool) -> list[tuple[int, int, int, int, bool]]:
    """(block_n, block_k, warps, stages, one_dot); gated GEMM 1 at BLOCK_M >= 64 is one-dot
    (the form a TMA box serves), with two-dot forms of the first tiles too."""
    base = {256: _HUGE, 128: _PREFILL, 64: _MID}.get(block_m, _DECODE)
    if gated_gemm1 and block_m >= 64:
        halved = [(max(32, bn // 2), bk, w, s) for bn, bk, w, s in base]
        return [(*t, True) for t in halved] + [(*t, False) for t in halved[:2]]
    return [(*t, False) for t in base]


def candidates(shape: MoEShape, t: int, tma: bool = True) -> list[MoEConfig]:
    """Paired (GEMM-1, GEMM-2) candidates for the heuristic BLOCK_M and its neighbours
    (BLOCK_M 256 only where an expert gets at least 256 rows on average)."""
    h = heuristic_config(t, shape.num_experts, shape.top_k, shape.hidden, shape.inter, shape.gated)
    per_expert = t * shape.top_k / shape.num_experts
    bms = [h.block_m] + [
        bm
        for bm in _NEIGHBOURS[h.block_m]
        if t * shape.top_k >= bm and (bm < 256 or per_expert >= 256)
    ]
    out = [replace(h, gemm1=replace(h.gemm1, tma=tma), gemm2=replace(h.gemm2, tma=tma))]
    for bm in bms:
        t1 = _tiles(bm, shape.gated)
        t2 = _tiles(bm, False)
        gm = 1 if bm <= 32 else 8
        for j in range(max(len(t1), len(t2))):
            a, b = t1[j % len(t1)], t2[j % len(t2)]
            g1 = GemmConfig(a[0], a[1], gm, a[2], a[3], a[4], tma=tma)
            g2 = GemmConfig(b[0], b[1], gm, b[2], b[3], tma=tma)
            g1 = fit_stages(bm, g1, 2 if shape.gated else 1)
            c = MoEConfig(bm, g1, fit_stages(bm, g2, 1))
            if c not in out:
                out.append(c)
    return out


# ---------------------------------------------------------------- timing


def time_config(shape: MoEShape, t: int, cfg: MoEConfig, sets: list) -> dict[str, float] | None:
    """Median device µs of GEMM 1, GEMM 2 and everything else over the routing sets."""
    backend = layer(shape)
    g1, g2, rest = [], [], []
    try:
        call_layer(backend, cfg, *sets[0])
        for x, tw, ti in sets:
            ks = kernel_times(lambda x=x, tw=tw, ti=ti: call_layer(backend, cfg, x, tw, ti))
            gemms = [us for n, us in ks if "moe_gemm" in n]
            g1.append(gemms[0])
            g2.append(gemms[1])
            rest.append(sum(us for n, us in ks if "moe_gemm" not in n))
    except Exception as exc:
        print(f"  {cfg} failed: {type(exc).__name__}: {str(exc)[:200]}", flush=True)
        return None
    return {
        "g1": statistics.median(g1),
        "g2": statistics.median(g2),
        "rest": statistics.median(rest),
    }


def tune_point(shape: MoEShape, t: int, cands: list[MoEConfig]) -> tuple[MoEConfig, dict[str, Any]]:
    """Best config at (shape, t) and the measurements behind it."""
    sets = routing_sets(shape, t, 3 if t <= 1024 else 2)
    res = [(c, time_config(shape, t, c, sets)) for c in cands]
    best: tuple[float, MoEConfig] | None = None
    for bm in sorted({c.block_m for c in cands}):
        ok = [(c, r) for c, r in res if r is not None and c.block_m == bm]
        if not ok:
            continue
        c1, r1 = min(ok, key=lambda cr: cr[1]["g1"])
        c2, r2 = min(ok, key=lambda cr: cr[1]["g2"])
        total = r1["g1"] + r2["g2"] + statistics.median(r["rest"] for _, r in ok)
        if best is None or total < best[0]:
            best = (total, MoEConfig(bm, c1.gemm1, c2.gemm2, tail_m=default_tail_m(bm),
                                     pdl=default_pdl(t, shape.num_experts, shape.top_k)))  # fmt: skip
    if best is None:
        raise RuntimeError(f"no candidate ran for {shape.name} T={t}")
    heur = res[0][1]
    log = {
        "best_us": best[0],
        "heuristic_us": None if heur is None else heur["g1"] + heur["g2"] + heur["rest"],
        "all": [(c.to_dict(), r) for c, r in res],
    }
    return best[1], log


def write_config_file(shape: MoEShape, table: dict[str, Any], device: str, triton_version: str,
                      out: str) -> str:  # fmt: skip
    """Write one tuned file (token count -> config dict); returns its path. An existing file
    keeps its entries for token counts this run did not tune (such as decode entries from
    ``tools.compare_configs --decode-search``); a replaced entry's ``trigger`` or ``persistent`` is
    reported, since kernel-by-kernel timing cannot choose them."""
    path = check_tuned_file(shape, device, out)
    merged: dict[str, Any] = {}
    if os.path.exists(path):
        with open(path) as f:
            raw = json.load(f)
        merged = raw.get("configs", raw)
        kept = sorted(set(merged) - set(table), key=int)
        if kept:
            print(f"# {os.path.basename(path)}: kept entries {kept} (not tuned in this run)")
        for key, how in (("trigger", "--decode-search"), ("persistent", "--variants persistent")):
            lost = sorted(
                (t for t in table if key in merged.get(t, {}) and key not in table[t]), key=int
            )
            if lost:
                print(f"# {os.path.basename(path)}: entries {lost} lose their {key}; re-run "
                      f"python -m tools.compare_configs {how}")  # fmt: skip
    merged.update(table)
    configs = dict(sorted(merged.items(), key=lambda kv: int(kv[0])))
    payload = {"triton_version": triton_version, "device_name": device, "configs": configs}
    os.makedirs(out, exist_ok=True)
    with open(path, "w") as f:
        json.dump(payload, f, indent=1)
        f.write("\n")
    return path


def check_tuned_file(shape: MoEShape, device: str, out: str) -> str:
    """The path of the shape's tuned file in ``out``; ValueError naming it when a file there
    is not a tuned file (a run would fail on it only when writing, its tuning lost)."""
    path = tuned_file_path(shape, device, out)
    try:
        kept_configs(path)
    except ValueError as exc:
        raise ValueError(f"{exc}; move it away") from None
    return path


def configs_by_shape(
    path: str, section: str, entries: dict[str, Any], field: str
) -> dict[str, dict[str, Any]]:
    """``{shape: {T: config}}`` from ``entries`` keyed ``<shape>/<T>``, each entry's config
    under ``field``; ValueError naming ``path``, ``section`` and the entry when a key is not
    a known shape and token count or a config is malformed (nothing is written then)."""
    tables: dict[str, dict[str, Any]] = {}
    for key, entry in entries.items():
        name, _, t = key.partition("/")
        if name not in SHAPES or not t.isdigit() or int(t) < 1:
            raise ValueError(f"{path}: {section}: {key!r} is not <shape>/<token count> of a "
                             "shape in benchmarks.common.SHAPES")  # fmt: skip
        config = entry.get(field) if isinstance(entry, dict) else None
        if not isinstance(config, dict):
            raise ValueError(f"{path}: {section}.{key}: no {field!r}")
        try:
            MoEConfig.from_dict(config)
        except ValueError as exc:
            raise ValueError(f"{path}: {section}.{key}.{field}: {exc}") from None
        tables.setdefault(name, {})[str(int(t))] = config
    return tables


def read_log(log_path: str) -> tuple[str, str, dict[str, dict[str, Any]]]:
    """(device, Triton version, per shape name its best configs by token count) of a
    ``tune_log.json``; ValueError naming the file and entry when it is not one."""
    logs = read_json(log_path)
    if not (isinstance(logs, dict) and isinstance(logs.get("device"), str)
            and isinstance(logs.get("triton"), str) and isinstance(logs.get("points"), dict)):  # fmt: skip
        raise ValueError(f"{log_path}: not a tune_log.json (no 'device', 'triton' and 'points')")
    tables = configs_by_shape(log_path, "points", logs["points"], "best")
    if not tables:
        raise ValueError(f"{log_path}: no points")
    return logs["device"], logs["triton"], tables


def write_from_log(log_path: str, out: str) -> None:
    """Config files from a tuning log: ``tune_log.json`` keeps each point's best config, so the
    files can be written on another machine than the GPU one that tuned. ValueError naming
    the file when the log, or a tuned file already in ``out``, is not one (nothing written)."""
    device, version, tables = read_log(log_path)
    for name in tables:
        check_tuned_file(SHAPES[name], device, out)
    for name, table in tables.items():
        path = write_config_file(SHAPES[name], table, device, version, out)
        print(f"# wrote {path}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_shape_args(p)
    p.add_argument("--out", default=".", help="folder of the tuned files and tune_log.json")
    p.add_argument("--jobs", type=nonnegative_int, default=8,
                   help="compile workers (0: compile while timing)")  # fmt: skip
    p.add_argument(
        "--deadline-s", type=positive_float, default=1e9, help="stop timing new points after this"
    )
    p.add_argument("--from-log", help="write the config files of a tune_log.json and exit")
    args = p.parse_args()
    try:
        writable_dir(args.out)
    except ValueError as exc:
        p.error(f"--out: {exc}")
    if args.from_log:
        try:
            device, _, tables = read_log(args.from_log)
        except ValueError as exc:
            p.error(f"--from-log {exc}")
        try:
            for name in tables:
                check_tuned_file(SHAPES[name], device, args.out)
        except ValueError as exc:
            p.error(f"--out: {exc}")
        write_from_log(args.from_log, args.out)
        return
    try:
        device = cuda_device_name("tuning times the kernels on the GPU they are tuned for")
    except ValueError as exc:
        p.exit(2, f"{p.prog}: error: {exc}\n")
    try:
        for s in args.shapes:  # a file there that is not a tuned file stops the run now
            check_tuned_file(SHAPES[s], device, args.out)
    except ValueError as exc:
        p.error(f"--out: {exc}")

    import multiprocessing as mp

    import triton

    start = time.time()
    plan = {(s, t): candidates(SHAPES[s], t) for s in args.shapes for t in args.tokens}
    print(f"# {sum(len(c) for c in plan.values())} configs over {len(plan)} points", flush=True)
    if args.jobs > 0:
        tasks = []
        for (s, t), cands in plan.items():
            for j in range(0, len(cands), 4):
                tasks.append((s, t, [c.to_dict() for c in cands[j : j + 4]], False))
        tasks.sort(key=lambda tk: tk[0])  # one shape per worker as far as possible
        with mp.get_context("spawn").Pool(args.jobs) as pool:
            bad = sum(
                pool.map(compile_configs, tasks, chunksize=max(1, len(tasks) // (4 * args.jobs)))
            )
        print(f"# compiled in {time.time() - start:.0f}s ({bad} failed)", flush=True)
    logs: dict[str, Any] = {"device": device, "triton": triton.__version__, "points": {}}
    for s in args.shapes:
        shape = SHAPES[s]
        table: dict[str, Any] = {}
        for t in args.tokens:
            if time.time() - start > args.deadline_s:
                print(f"# deadline: {s} T={t} not tuned", flush=True)
                continue
            best, log = tune_point(shape, t, plan[(s, t)])
            table[str(t)] = best.to_dict()
            logs["points"][f"{s}/{t}"] = {**log, "best": best.to_dict()}
            print(f"{s:15s} T={t:5d} best {log['best_us']:9.1f}us heuristic {log['heuristic_us']}us "
                  f"-> {best}", flush=True)  # fmt: skip
        if not table:
            continue
        path = write_config_file(shape, table, device, triton.__version__, args.out)
        print(f"# wrote {path}", flush=True)
    with open(os.path.join(args.out, "tune_log.json"), "w") as f:
        json.dump(logs, f)
    print(f"# total {time.time() - start:.0f}s", flush=True)


if __name__ == "__main__":
    main()
