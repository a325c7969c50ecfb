"""Our whole Triton MoE layer beside vLLM's two Triton fused-MoE GEMMs on one GPU, over the
shape corpus; ``--table`` renders a saved run and names every missed target (no GPU).

vLLM's kernel never enters this repository: ``--extract WHEEL`` reads vLLM's released wheel
(``pip download --no-deps vllm==0.33.0``) and writes its bf16 kernel (``fused_moe_kernel``
and ``write_zeros_to_output``), its ``get_default_config`` and its tuned ``E=..,N=..,
device_name=...json`` files into ``--vllm-dir`` (default ``build/vs_vllm``, git-ignored), a
folder small enough to carry to a GPU machine the wheel cannot reach. A run then loads them
from there.

What is timed, per shape and token count, as CUDA-graph replays of several routing sets,
interleaved round by round, the GPU resting half the time (``--rounds`` rounds):

* ``ours``: exactly what ``TritonExperts.apply`` runs (alignment, both GEMMs, activation,
  top-k sum), with the shipped tuned file or the heuristic;
* ``vllm``: vLLM's two GEMMs as vLLM launches them for bf16 (its config: its tuned file for
  the device, the nearest token count, else ``get_default_config``; one pair per block, no
  alignment, when ``T*k*4 <= E``; its alignment precomputed outside the timing; no
  activation, no sum);
* where either side has a tuned file, ``ours_heur`` (our heuristic) and ``vllm_default``
  (vLLM's default config) in the same rounds.

Each point also checks our output against vLLM's GEMMs with the activation and the top-k sum
done in torch (``rel_err_vs_vllm``; silu and relu2 layers). Targets checked by ``--table``:
ours <= vLLM's GEMMs at every point, <= 1.15x the lower bound for 16 <= T <= 256, and at least
1.2x faster at T >= 4096.

    python -m benchmarks.vs_vllm --extract vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64.whl
    python -m benchmarks.vs_vllm --out DIR                  # GPU: every corpus shape
    python -m benchmarks.vs_vllm --table benchmarks/results/vs_vllm_h200.json
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import json
import math
import os
import sys
import time
import zipfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from benchmarks.common import (
    FIXED_COPY_TBPS,
    FIXED_MATMUL_TFLOPS,
    SHAPES,
    MoEShape,
    cuda_device_name,
    lower_bound_us,
    positive_float,
    positive_int,
    read_json,
    routing_sets,
    writable_dir,
    write_json,
)

#: Where vLLM's extracted kernel and configs go by default (``build/`` is git-ignored).
DEFAULT_VLLM_DIR = "build/vs_vllm"
#: The module inside vLLM's wheel, and the names taken from it.
VLLM_MODULE = "vllm/model_executor/layers/fused_moe/fused_moe.py"
VLLM_CONFIGS = "vllm/model_executor/layers/fused_moe/configs/"
VLLM_NAMES = ("write_zeros_to_output", "fused_moe_kernel", "get_default_config")
DEFAULT_TOKENS = (1, 16, 64, 256, 1024, 4096, 8192)

#: What the extracted functions need of vLLM, for bf16 on CUDA.
_PRELUDE = '''"""Extracted from {wheel} by benchmarks.vs_vllm (not part of the repository)."""
import triton
import triton.language as tl


class envs:
    VLLM_BATCH_INVARIANT = False


class current_platform:
    @staticmethod
    def is_rocm():
        return False


def should_moe_wna16_use_cuda(*args, **kwargs):
    return False


def next_power_of_2(n):
    return triton.next_power_of_2(n)

'''


class VsVllmError(Exception):
    """Bad input: one line naming where it came from."""


# ---------------------------------------------------------------- vLLM's kernel, extracted


def extract_vllm(wheel: str, dest: str) -> list[str]:
    """Write vLLM's kernel functions (``VLLM_NAMES``) as ``dest/vllm_moe.py`` and its tuned
    config files into ``dest/configs``; returns the config files' names."""
    from moe_policy.core.textfile import check_regular
    from moe_policy.errors import PolicyError

    origin = f"cli:--extract: {wheel}"
    try:  # a FIFO or a device is refused before it is opened (zipfile would block on it)
        check_regular(wheel)
    except PolicyError as exc:
        raise VsVllmError(f"{origin}: {exc.message}") from None
    try:
        with zipfile.ZipFile(wheel) as zf:
            try:
                src = zf.read(VLLM_MODULE).decode()
            except KeyError:
                raise VsVllmError(f"{origin}: not a vLLM wheel (no {VLLM_MODULE})") from None
            configs = {
                os.path.basename(n): zf.read(n)
                for n in zf.namelist()
                if n.startswith(VLLM_CONFIGS) and n.endswith(".json")
                and ",dtype=" not in n and ",block_shape=" not in n
            }  # fmt: skip
    except (OSError, zipfile.BadZipFile) as exc:
        raise VsVllmError(f"{origin}: {getattr(exc, 'strerror', None) or exc}") from None
    tree = ast.parse(src)
    found = {
        node.name: node
        for node in tree.body
        if isinstance(node, ast.FunctionDef) and node.name in VLLM_NAMES
    }
    missing = [n for n in VLLM_NAMES if n not in found]
    if missing:
        raise VsVllmError(f"{origin}: {VLLM_MODULE} has no {', '.join(missing)}")
    parts = []
    for name in VLLM_NAMES:
        node = found[name]
        decorators = "".join(f"@{ast.get_source_segment(src, d)}\n" for d in node.decorator_list)
        parts.append(decorators + str(ast.get_source_segment(src, node)))
    out = Path(dest)
    text = _PRELUDE.format(wheel=os.path.basename(wheel)) + "\n\n".join(parts) + "\n"
    try:
        (out / "configs").mkdir(parents=True, exist_ok=True)
        (out / "vllm_moe.py").write_text(text)
        for name, data in configs.items():
            (out / "configs" / name).write_bytes(data)
    except OSError as exc:
        where = exc.filename or dest
        raise VsVllmError(f"cli:--vllm-dir: cannot write {where} "
                          f"({exc.strerror or exc})") from None  # fmt: skip
    return sorted(configs)


def extracted_path(vllm_dir: str) -> Path:
    """``vllm_dir/vllm_moe.py``; VsVllmError when there is none (no ``--extract`` yet)."""
    path = Path(vllm_dir) / "vllm_moe.py"
    if not path.is_file():
        raise VsVllmError(
            f"cli:--vllm-dir: {vllm_dir} holds no vllm_moe.py; run --extract WHEEL first"
        )
    return path


def load_vllm(vllm_dir: str) -> Any:
    """The extracted module (``extract_vllm``) as a Python module; VsVllmError naming the
    file when it is missing or does not import (Triton missing, the file edited)."""
    path = extracted_path(vllm_dir)
    spec = importlib.util.spec_from_file_location("vllm_moe_extracted", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except (ImportError, SyntaxError) as exc:
        raise VsVllmError(f"cli:--vllm-dir: {path}: does not import ({exc}); run --extract "
                          "WHEEL again") from None  # fmt: skip
    return module


def vllm_tuned_table(vllm_dir: str, shape: MoEShape, device: str) -> dict[int, dict] | None:
    """vLLM's tuned bf16 configs for the shape on the device, by token count, or None (its
    files are named as ours: ``config.config_file_name``)."""
    from moe_policy.experts.triton.config import config_file_name

    path = Path(vllm_dir) / "configs" / config_file_name(shape.num_experts, shape.inter, device)
    if not path.is_file():
        return None
    raw = json.loads(path.read_text())
    return {int(k): v for k, v in raw.items() if k != "triton_version"}


def vllm_config(
    module: Any, table: dict[int, dict] | None, shape: MoEShape, t: int, tuned: bool = True
) -> tuple[dict[str, int], str]:
    """vLLM's config at ``t`` tokens: the tuned entry nearest to ``t`` (vLLM's ``abs``
    distance) or ``get_default_config``; and which of the two."""
    if tuned and table:
        return dict(table[min(table, key=lambda m: abs(m - t))]), "tuned"
    cfg = module.get_default_config(t, shape.num_experts, shape.inter, shape.hidden,
                                    shape.top_k, None)  # fmt: skip
    return dict(cfg), "default"


def vllm_rows(rows: int, top_k: int, num_experts: int, block_m: int, aligned: bool) -> int:
    """vLLM's ``EM``: the sorted-id rows its grid covers for a GEMM over ``rows`` A rows of
    ``top_k`` pairs each (``invoke_fused_moe_triton_kernel``, ``moe_align_block_size``)."""
    pairs = rows * top_k
    if not aligned:
        return pairs * block_m
    em = pairs + num_experts * (block_m - 1)
    if pairs < num_experts:
        em = min(em, pairs * block_m)
    if rows < block_m:
        em = min(em, pairs * block_m)
    return em


# ---------------------------------------------------------------- the calls (GPU)


def _vllm_gemm(module: Any, cfg: dict[str, int], num_experts: int) -> Callable[..., None]:
    """One GEMM as vLLM launches it for bf16: (A, B, C, bias, routed weights, mul, top_k,
    sorted ids or None, expert ids, rows in use)."""
    import triton
    import triton.language as tl

    bm = cfg["BLOCK_SIZE_M"]

    def gemm(a, b, c, bias, tw, mul, top_k, sorted_ids, expert_ids, used) -> None:  # type: ignore[no-untyped-def]
        em = vllm_rows(a.size(0), top_k, num_experts, bm, sorted_ids is not None)
        conf = {k: v for k, v in cfg.items() if k != "BLOCK_SIZE_K"}
        conf["SPLIT_K"] = 1
        grid = (triton.cdiv(em, bm) * triton.cdiv(b.size(1), conf["BLOCK_SIZE_N"]),)
        module.fused_moe_kernel[grid](
            a, b, c, bias, None, None, tw, sorted_ids, expert_ids, used,
            b.size(1), b.size(2), em, a.size(0) * top_k,
            a.stride(0), a.stride(1), b.stride(0), b.stride(2), b.stride(1),
            c.stride(1), c.stride(2), 0, 0, 0, 0, 0,
            bias.stride(0) if bias is not None else 0, bias.stride(1) if bias is not None else 0,
            0, 0,
            MUL_ROUTED_WEIGHT=mul, top_k=top_k, compute_type=tl.bfloat16, use_fp8_w8a8=False,
            use_int8_w8a8=False, use_int8_w8a16=False, per_channel_quant=False,
            naive_block_assignment=sorted_ids is None, HAS_BIAS=bias is not None,
            BLOCK_SIZE_K=cfg["BLOCK_SIZE_K"], SWAP_AB=False, USE_TD=False, **conf,
        )  # fmt: skip

    return gemm


def vllm_calls(
    module: Any, shape: MoEShape, cfg: dict[str, int], weights: tuple, sets: list, num_experts: int
) -> list[Callable[[], Any]]:
    """Per routing set, vLLM's two GEMMs (its GEMM 2 reads a fixed activation); each call has
    a ``checked()`` twin that runs the activation and top-k sum in torch, for the output check
    (None for activations it does not model)."""
    import torch

    from moe_policy.experts.triton.align import moe_align

    w13, w2, b13, b2 = weights
    k = shape.top_k
    gemm = _vllm_gemm(module, cfg, num_experts)
    calls = []
    for x, tw, ti in sets:
        t, numel = x.shape[0], x.shape[0] * k
        if t * k * 4 <= num_experts:  # vLLM's one pair per block
            sorted_ids, expert_ids = None, ti.view(-1)
            used = torch.full((1,), numel * cfg["BLOCK_SIZE_M"], dtype=torch.int32,
                              device=x.device)  # fmt: skip
        else:
            r = moe_align(ti, num_experts, cfg["BLOCK_SIZE_M"])
            sorted_ids, expert_ids, used = r.sorted_ids, r.expert_ids, r.num_padded
        route = (sorted_ids, expert_ids, used)
        c1 = torch.empty(t, k, w13.shape[1], dtype=x.dtype, device=x.device)
        a2 = torch.randn(numel, shape.inter, dtype=x.dtype, device=x.device) * 0.1
        c3 = torch.empty(t, k, shape.hidden, dtype=x.dtype, device=x.device)

        def both(x=x, tw=tw, c1=c1, a2=a2, c3=c3, route=route) -> None:  # type: ignore[no-untyped-def]
            gemm(x, w13, c1, b13, tw, False, k, *route)
            gemm(a2, w2, c3, b2, tw, True, 1, *route)

        def checked(x=x, tw=tw, c1=c1, c3=c3, route=route, numel=numel):  # type: ignore[no-untyped-def]
            gemm(x, w13, c1, b13, tw, False, k, *route)
            h = c1.view(numel, -1).float()
            if shape.activation == "silu":  # our gated layout: gate at even rows, up at odd
                act = torch.nn.functional.silu(h[:, 0::2]) * h[:, 1::2]
            elif shape.activation == "relu2":
                act = torch.relu(h) ** 2
            else:
                return None
            gemm(act.to(x.dtype).contiguous(), w2, c3, b2, tw, True, 1, *route)
            return c3.float().sum(1)

        both.checked = checked  # type: ignore[attr-defined]
        calls.append(both)
    return calls


def our_calls(shape: MoEShape, plan: Any, weights: tuple, sets: list, direct: bool = False
              ) -> list[Callable[[], Any]]:  # fmt: skip
    """Per routing set, our layer run from ``plan`` (``direct``: without the launcher's checks,
    for compile workers that hold fewer experts than the plan's problem)."""
    from moe_policy.experts.triton.fused_moe import fused_moe_triton, launch_plan

    w13, w2, b13, b2 = weights
    out = []
    for x, tw, ti in sets:
        if direct:
            out.append(lambda x=x, tw=tw, ti=ti: launch_plan(plan, x, w13, w2, tw, ti, b13, b2))
        else:
            out.append(lambda x=x, tw=tw, ti=ti: fused_moe_triton(
                x, w13, w2, tw, ti, activation=shape.activation, gated=shape.gated,
                w13_bias=b13, w2_bias=b2, plan=plan))  # fmt: skip
    return out


def point(shape: MoEShape, t: int, vllm_dir: str, module: Any, weights: tuple, sets: list,
          direct: bool = False) -> tuple[dict[str, list], dict[str, Any]]:  # fmt: skip
    """Every timed variant of one (shape, T): calls per name, and what each ran."""
    import torch

    from moe_policy.experts.triton.config import heuristic_config, load_tuned
    from moe_policy.experts.triton.device import device_limits
    from moe_policy.experts.triton.launch import MoEProblem, plan_launch

    dev = sets[0][0].device
    limits = device_limits(dev)
    device = torch.cuda.get_device_name(dev)
    problem = MoEProblem(t, shape.top_k, shape.num_experts, shape.hidden, shape.inter,
                         shape.gated, shape.activation, 2, False, shape.has_bias)  # fmt: skip
    plan = plan_launch(problem, limits)
    calls = {"ours": our_calls(shape, plan, weights, sets, direct)}
    meta: dict[str, Any] = {"ours_config": plan.config.to_dict()}
    if load_tuned(shape.num_experts, shape.inter, device) is not None:
        heur = plan_launch(problem, limits, heuristic_config(
            t, shape.num_experts, shape.top_k, shape.hidden, shape.inter, shape.gated,
            smem_limit=limits.smem_limit, num_sms=limits.tile_sms))  # fmt: skip
        if heur != plan:
            calls["ours_heur"] = our_calls(shape, heur, weights, sets, direct)
    table = vllm_tuned_table(vllm_dir, shape, device)
    cfg, source = vllm_config(module, table, shape, t)
    calls["vllm"] = vllm_calls(module, shape, cfg, weights, sets, shape.num_experts)
    meta.update(vllm_config=cfg, vllm_source=source)
    if table:
        default, _ = vllm_config(module, None, shape, t)
        calls["vllm_default"] = vllm_calls(module, shape, default, weights, sets,
                                           shape.num_experts)  # fmt: skip
    return calls, meta


def layer_weights(shape: MoEShape, num_experts: int, random: bool = True) -> tuple:
    """bf16 weights in our kernel layout (w13 [E, N1, H], w2 [E, H, I], biases): random, or
    uninitialised for compile workers."""
    import torch

    def make(*size: int) -> Any:
        t = torch.empty(*size, device="cuda", dtype=torch.bfloat16)
        return t.normal_(0.0, 0.02) if random else t

    return (make(num_experts, shape.n1, shape.hidden), make(num_experts, shape.hidden, shape.inter),
            make(num_experts, shape.n1) if shape.has_bias else None,
            make(num_experts, shape.hidden) if shape.has_bias else None)  # fmt: skip


def _compile(task: tuple[str, int, str]) -> list[str]:
    """Worker: launch every variant of one point once on a few experts, so that Triton's disk
    cache holds the kernels (plans are for the real expert count); failures."""
    name, t, vllm_dir = task
    shape = SHAPES[name]
    few = min(shape.num_experts, max(2, shape.top_k))
    module = load_vllm(vllm_dir)
    calls, _ = point(shape, t, vllm_dir, module, layer_weights(shape, few, random=False),
                     routing_sets(shape, t, 1, num_experts=few), direct=True)  # fmt: skip
    bad = []
    for n, fns in calls.items():
        try:
            fns[0]()
        except Exception as exc:  # reported; the run goes on
            bad.append(f"{n}: {exc!r}"[:300])
    return bad


def run(module: Any, shapes: Sequence[str], tokens: Sequence[int], vllm_dir: str, rounds: int,
        jobs: int, deadline: float, out: str | None) -> dict[str, Any]:  # fmt: skip
    """Time every point with vLLM's extracted ``module`` (from ``vllm_dir``, which the compile
    workers load again); the payload (written to ``out`` after each point)."""
    import multiprocessing as mp

    import torch

    from benchmarks.common import time_graphs_interleaved
    from moe_policy.experts.testing import rel_err

    start = time.time()
    tasks = [(s, t, vllm_dir) for s in shapes for t in tokens]
    with mp.get_context("spawn").Pool(max(1, jobs)) as pool:
        for (s, t, _), bad in zip(tasks, pool.map(_compile, tasks), strict=True):
            if bad:
                print(f"# {s} T={t}: compile failed: {bad}", flush=True)
    print(f"# compiled {len(tasks)} points in {time.time() - start:.0f}s", flush=True)
    payload: dict[str, Any] = {
        "device": torch.cuda.get_device_name(), "rounds": rounds, "duty": 0.5,
        "ceilings": {"copy_tbps": FIXED_COPY_TBPS, "matmul_tflops": FIXED_MATMUL_TFLOPS},
        "rows": [],
    }  # fmt: skip
    for s in shapes:
        shape = SHAPES[s]
        weights = layer_weights(shape, shape.num_experts)
        for t in tokens:
            if time.time() - start > deadline:
                print(f"# deadline: stopped before {s} T={t}", flush=True)
                return payload
            n_sets = 8 if t <= 256 else (4 if t <= 1024 else 2)
            sets = routing_sets(shape, t, n_sets)
            calls, meta = point(shape, t, vllm_dir, module, weights, sets)
            ours = calls["ours"][0]()
            ref = calls["vllm"][0].checked()  # type: ignore[attr-defined]
            bound = lower_bound_us(shape, t, FIXED_COPY_TBPS, FIXED_MATMUL_TFLOPS)
            replays = max(1, min(20, math.ceil(600 / (n_sets * bound * 1.3))))
            timed = time_graphs_interleaved(calls, rounds, replays, 0.5)
            row = {"shape": s, "T": t, "bound_us": bound, **meta,
                   "us": {n: v["us"] for n, v in timed.items()},
                   "p20": {n: v["p20_us"] for n, v in timed.items()},
                   "p80": {n: v["p80_us"] for n, v in timed.items()},
                   "rel_err_vs_vllm": None if ref is None else rel_err(ours, ref.double())}  # fmt: skip
            payload["rows"].append(row)
            us = row["us"]
            print(f"{s:22s} T={t:5d} ours {us['ours']:9.1f} vllm {us['vllm']:9.1f} "
                  f"x{us['ours'] / us['vllm']:.3f} bound {bound:8.1f}", flush=True)  # fmt: skip
            if out:
                write_json(os.path.join(out, "vs_vllm.json"), payload)
            del calls, sets
        del weights
        torch.cuda.empty_cache()
    print(f"# done in {time.time() - start:.0f}s", flush=True)
    return payload


# ---------------------------------------------------------------- the table (no GPU)


def misses(payload: dict[str, Any]) -> list[str]:
    """Every missed target of a saved run, one line each."""
    found = []
    for r in payload["rows"]:
        us, t, bound = r["us"], r["T"], r["bound_us"]
        o, v = us["ours"], us["vllm"]
        where = f"{r['shape']} T={t}"
        if o > v:
            found.append(f"{where}: {100 * (o / v - 1):.1f} % slower than vLLM's GEMMs")
        if 16 <= t <= 256 and o / bound > 1.15:
            found.append(f"{where}: {o / bound:.2f} x the bound (vLLM's GEMMs {v / bound:.2f})")
        if t >= 4096 and v / o < 1.2:
            note = " (vLLM within 1.2 x of the bound: out of reach)" if v / bound < 1.2 else ""
            # rounded down, so that a miss never reads as 1.200
            found.append(f"{where}: {math.floor(v / o * 1000) / 1000:.3f} x faster than "
                         f"vLLM{note}")  # fmt: skip
        heur, default = us.get("ours_heur", o), us.get("vllm_default", v)
        if ("ours_heur" in us or "vllm_default" in us) and heur > default:
            found.append(f"{where}: the heuristic {100 * (heur / default - 1):.1f} % slower "
                         "than vLLM's default config")  # fmt: skip
    return found


def markdown_table(payload: dict[str, Any], corpus: dict[str, dict[str, Any]]) -> str:
    """The docs' table: per shape and T, ours / vLLM's GEMMs in µs and their ratio (bold when
    ours is slower), and for 16 <= T <= 256 ours over the bound (bold above 1.15)."""
    by: dict[str, dict[int, dict[str, Any]]] = {}
    for r in payload["rows"]:
        by.setdefault(r["shape"], {})[r["T"]] = r
    tokens = sorted({r["T"] for r in payload["rows"]})
    lines = ["| shape (E, k, H, I) | " + " | ".join(f"T={t}" for t in tokens) + " |",
             "|---|" + "---|" * len(tokens)]  # fmt: skip
    for name in [n for n in corpus if n in by] + sorted(set(by) - set(corpus)):
        e = corpus.get(name, {})
        label = name + (" (tuned file)" if e.get("tuned_h200") else "")
        if e:
            label += f" ({e['num_experts']}, {e['top_k']}, {e['hidden']}, {e['inter']})"
        cells = []
        for t in tokens:
            r = by[name].get(t)
            if r is None:
                cells.append("-")
                continue
            o, v = r["us"]["ours"], r["us"]["vllm"]
            cell = f"{o:.0f} / {v:.0f} " + (f"**{o / v:.3f}**" if o > v else f"{o / v:.3f}")
            if 16 <= t <= 256:
                b = o / r["bound_us"]
                cell += f" [**{b:.2f}**]" if b > 1.15 else f" [{b:.2f}]"
            cells.append(cell)
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def load_run(path: str) -> dict[str, Any]:
    """A saved run; VsVllmError naming the file (and the row) when it is not one: unreadable,
    not JSON, no rows, a row without its shape and T, a time that is not a number > 0."""
    origin = f"cli:--table: {path}"
    try:
        payload = read_json(path)
    except ValueError as exc:
        raise VsVllmError(f"cli:--table: {exc}") from None
    rows = payload.get("rows") if isinstance(payload, dict) else None
    if not isinstance(rows, list) or not rows:
        raise VsVllmError(f"{origin}: not a vs_vllm run (no list of rows)")
    for i, r in enumerate(rows):
        problem = _row_problem(r)
        if problem:
            raise VsVllmError(f"{origin}: not a vs_vllm run: rows[{i}]: {problem}")
    return dict(payload)


def _time(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0


def _row_problem(r: Any) -> str | None:
    """What makes ``r`` no row of a saved run, or None."""
    if not isinstance(r, dict):
        return f"not an object: {r!r}"[:200]
    if not isinstance(r.get("shape"), str):
        return f"'shape' must be a shape's name, got {r.get('shape')!r}"
    t = r.get("T")
    if not (isinstance(t, int) and not isinstance(t, bool) and t >= 1):
        return f"'T' must be a token count (an integer >= 1), got {t!r}"
    if not _time(r.get("bound_us")):
        return f"'bound_us' must be a number > 0, got {r.get('bound_us')!r}"
    us = r.get("us")
    if not isinstance(us, dict):
        return f"'us' must be an object of times by variant, got {us!r}"[:200]
    for name in ("ours", "vllm", "ours_heur", "vllm_default"):
        if (name in ("ours", "vllm") or name in us) and not _time(us.get(name)):
            return f"'us.{name}' must be a number > 0, got {us.get(name)!r}"
    return None


def corpus_entries() -> dict[str, dict[str, Any]]:
    """The corpus file's entries by name, in its order."""
    from benchmarks.common import CORPUS_FILE

    return {e["name"]: e for e in json.loads(CORPUS_FILE.read_text())["shapes"]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.vs_vllm",
                                description=__doc__.split("\n")[0])  # fmt: skip
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--extract", metavar="WHEEL",
                      help="no GPU: write vLLM's kernel and configs from its wheel into "
                           "--vllm-dir")  # fmt: skip
    p.add_argument("--vllm-dir", default=DEFAULT_VLLM_DIR,
                   help=f"the extracted kernel and configs (default {DEFAULT_VLLM_DIR})")  # fmt: skip
    p.add_argument("--shapes", nargs="+", choices=list(SHAPES), default=list(SHAPES))
    p.add_argument("--tokens", nargs="+", type=positive_int, default=list(DEFAULT_TOKENS))
    p.add_argument("--rounds", type=positive_int, default=6)
    p.add_argument("--jobs", type=positive_int, default=min(16, os.cpu_count() or 1),
                   help="compile workers")  # fmt: skip
    p.add_argument("--deadline", type=positive_float, default=math.inf, metavar="S",
                   help="stop starting new points after S seconds (the JSON keeps the others)")  # fmt: skip
    p.add_argument("--out", metavar="DIR", help="write vs_vllm.json here, after every point")
    mode.add_argument("--table", metavar="JSON",
                      help="no GPU: print a saved run as the docs' table and every missed "
                           "target")  # fmt: skip
    args = p.parse_args(argv)
    try:
        if args.table:
            payload = load_run(args.table)
            print(markdown_table(payload, corpus_entries()))
            missed = misses(payload)
            print(f"\n{len(missed)} missed:" if missed else "\nevery target met")
            for line in missed:
                print(f"- {line}")
            return 0
        if args.extract:
            names = extract_vllm(args.extract, args.vllm_dir)
            print(f"# wrote {args.vllm_dir}/vllm_moe.py and {len(names)} config files")
            return 0
        extracted_path(args.vllm_dir)
        if args.out:
            try:
                writable_dir(args.out)
            except ValueError as exc:
                raise VsVllmError(f"cli:--out: {exc}") from None
        try:
            cuda_device_name("the comparison times both kernels on one GPU")
        except ValueError as exc:
            raise VsVllmError(str(exc)) from None
        module = load_vllm(args.vllm_dir)
    except VsVllmError as exc:
        print(f"vs_vllm: error: {exc}", file=sys.stderr)
        return 2
    run(module, args.shapes, args.tokens, args.vllm_dir, args.rounds, args.jobs, args.deadline,
        args.out)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
