"""What the benchmarks and tools share: the shape corpus, measured ceilings, GPU state, memory
accounting, argparse types, JSON and plots. The layer shapes, their lower bound, random inputs
and CUDA-graph timing live in ``moe_policy.experts.triton.tuning`` (the tuner ships with the
package) and are imported from here by the benchmarks; the bound's ceilings are measured in
the same run (``measure_ceilings``).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import statistics
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from moe_policy.cli.tune import shape_from_model
from moe_policy.experts.triton.tuning.inputs import (
    LORA_RANK,
    LORA_SLOTS,
    lora_contexts,
    routing_sets,
    shape_adapters,
    shape_weights,
)
from moe_policy.experts.triton.tuning.preflight import cuda_device_name, writable_dir
from moe_policy.experts.triton.tuning.shapes import (
    FIXED_COPY_TBPS,
    FIXED_MATMUL_TFLOPS,
    MoEShape,
    expected_experts,
    experts_config,
    layer_bytes,
    layer_flops,
    lower_bound_us,
)
from moe_policy.experts.triton.tuning.timing import (
    LEAD_CYCLES,
    capture_graph,
    event_ms,
    replays_us,
    rest_s,
    time_graphs_interleaved,
)

__all__ = [  # this module's names and the tuning modules' it passes on to the benchmarks
    "ALLOC_GRANULE",
    "CORPUS_FILE",
    "DEFAULT_SHAPES",
    "DEFAULT_TOKENS",
    "FIXED_COPY_TBPS",
    "FIXED_MATMUL_TFLOPS",
    "LEAD_CYCLES",
    "LORA_RANK",
    "LORA_SLOTS",
    "SHAPES",
    "THROTTLE_BITS",
    "UNTUNED_SHAPES",
    "MoEShape",
    "add_shape_args",
    "alloc_block",
    "at_least",
    "capture_graph",
    "check_out_file",
    "cuda_device_name",
    "duty_fraction",
    "event_ms",
    "expected_experts",
    "experts_config",
    "gpu_state",
    "kernel_times",
    "layer_bytes",
    "layer_flops",
    "load_shapes",
    "lora_contexts",
    "lower_bound_us",
    "measure_ceilings",
    "nonnegative_float",
    "nonnegative_int",
    "nvidia_smi_id",
    "parse_gpu_state",
    "peak_extra_bytes",
    "plot_ratios",
    "positive_float",
    "positive_int",
    "read_json",
    "replays_us",
    "rest_s",
    "routing_sets",
    "shape_adapters",
    "shape_from_model",
    "shape_weights",
    "throttle_reasons",
    "time_eager_us",
    "time_graph_held_us",
    "time_graph_us",
    "time_graphs_interleaved",
    "writable_dir",
    "write_json",
]


#: The shape corpus: routed-expert layers of public MoE models (``moe_shapes.json`` beside this
#: module, each entry naming the Hugging Face repo its numbers come from).
CORPUS_FILE = Path(__file__).with_name("moe_shapes.json")


def load_shapes(path: Path = CORPUS_FILE) -> dict[str, MoEShape]:
    """The shapes of a corpus file, by name (``{"shapes": [{name, num_experts, top_k, hidden,
    inter, activation, gated, has_bias?}]}``; other keys document the entry)."""
    entries = json.loads(path.read_text())["shapes"]
    return {
        e["name"]: MoEShape(
            e["name"],
            int(e["num_experts"]),
            int(e["hidden"]),
            int(e["inter"]),
            int(e["top_k"]),
            bool(e["gated"]),
            str(e["activation"]),
            bool(e.get("has_bias", False)),
        )
        for e in entries
    }


SHAPES: dict[str, MoEShape] = load_shapes()
#: Corpus shapes without a shipped tuned H200 file: where the heuristic runs.
UNTUNED_SHAPES = tuple(
    e["name"] for e in json.loads(CORPUS_FILE.read_text())["shapes"] if not e.get("tuned_h200")
)


#: What the GPU benchmarks and tuning tools run by default: three shapes, decode to prefill.
DEFAULT_SHAPES = ("nemotron3-nano", "mixtral-8x7b", "qwen3-30b-a3b")
DEFAULT_TOKENS = (1, 16, 64, 256, 1024, 4096, 8192)


# ---------------------------------------------------------------- timing


def _events_median_ms(fn: Callable[[], Any], reps: int, warmup: int = 3) -> float:
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    return statistics.median(event_ms(fn) for _ in range(reps))


def _held_ms(fn: Callable[[], Any], seconds: float, per_sample: int = 10) -> float:
    """Median ms of ``fn`` over the second half of ``seconds`` of back-to-back eager calls
    (event-timed in samples of ``per_sample``): the rate once the board sits at its power
    limit. Eager, not graph-replayed: in a CUDA graph a device-to-device copy becomes a memcpy
    node that the copy engines run (2.75 TB/s on the H200, not the SMs' 4.2)."""
    import time

    times = []
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        times.append(event_ms(fn, per_sample))
    return statistics.median(times[len(times) // 2 :])


def measure_ceilings(reps: int = 10, held_s: float = 0.0) -> dict[str, float]:
    """Device-to-device copy bandwidth (TB/s, read + write) and bf16 8192^3 matmul rate
    (TFLOP/s): medians of ``reps`` calls (a short burst), or with ``held_s`` > 0 of calls held
    back to back for that many seconds each. An H200 at its power limit lowers its SM clock
    under a long matmul load (from 1980 to 1300-1500 MHz), so long prefill layers see the held
    matmul rate, not the burst's."""
    import torch

    def timed(fn: Callable[[], Any]) -> float:
        return _held_ms(fn, held_s) if held_s > 0 else _events_median_ms(fn, reps)

    def copy_ms(n: int) -> float:
        src = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        dst = torch.empty_like(src)
        return timed(lambda: dst.copy_(src))

    def matmul_ms(m: int) -> float:
        a = torch.randn(m, m, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(m, m, device="cuda", dtype=torch.bfloat16)
        return timed(lambda: a @ b)

    n, m = 1 << 30, 8192  # 2 GiB copied each way; an 8192^3 product on random data
    copy_tbps = 2 * n * 2 / (copy_ms(n) * 1e-3) / 1e12
    mm_tflops = 2 * m**3 / (matmul_ms(m) * 1e-3) / 1e12
    torch.cuda.empty_cache()
    return {"copy_tbps": copy_tbps, "matmul_tflops": mm_tflops}


#: NVML clock-event ("throttle") reason bits, as ``nvidia-smi`` reports them.
THROTTLE_BITS = {
    0x1: "idle", 0x2: "app_clocks", 0x4: "sw_power_cap", 0x8: "hw_slowdown", 0x10: "sync_boost",
    0x20: "sw_thermal", 0x40: "hw_thermal", 0x80: "hw_power_brake", 0x100: "display_clocks",
}  # fmt: skip
_GPU_FIELDS = ("clocks.sm", "clocks.max.sm", "power.draw", "power.limit", "temperature.gpu",
               "clocks_throttle_reasons.active")  # fmt: skip


def throttle_reasons(mask: int) -> list[str]:
    """Names of the set bits of an NVML clock-event mask (unknown bits as hex)."""
    names = [name for bit, name in THROTTLE_BITS.items() if mask & bit]
    rest = mask & ~sum(THROTTLE_BITS)
    return names + ([hex(rest)] if rest else [])


def parse_gpu_state(line: str) -> dict[str, Any]:
    """One ``nvidia-smi --query-gpu=<_GPU_FIELDS> --format=csv,noheader,nounits`` line ->
    ``sm_mhz``, ``max_sm_mhz``, ``power_w``, ``power_limit_w``, ``temp_c``, ``throttle``;
    fields the driver reports as unavailable are left out."""
    keys = ("sm_mhz", "max_sm_mhz", "power_w", "power_limit_w", "temp_c")
    parts = [p.strip() for p in line.strip().split(",")]
    if len(parts) != len(_GPU_FIELDS):
        raise ValueError(f"expected {len(_GPU_FIELDS)} fields from nvidia-smi, got {line!r}")
    out: dict[str, Any] = {}
    for key, val in zip(keys, parts, strict=False):
        try:
            out[key] = float(val)
        except ValueError:
            continue  # "[N/A]", "[Not Supported]"
    with contextlib.suppress(ValueError):  # "[N/A]"
        out["throttle"] = throttle_reasons(int(parts[-1], 16))
    return out


def nvidia_smi_id(uuid: str | None, index: int) -> str:
    """``nvidia-smi --id`` of a CUDA device: its UUID (``GPU-...``) where torch reports one,
    since torch's index counts only the visible GPUs (``CUDA_VISIBLE_DEVICES``) and
    nvidia-smi's counts all of them; else the index."""
    if uuid:
        uuid = str(uuid)
        return uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}"
    return str(index)


def gpu_state(index: int | None = None) -> dict[str, Any]:
    """SM clock, power and clock-event reasons of CUDA device ``index`` (default: the current
    one) now (empty without nvidia-smi): sampled right after a timing, it says whether the
    board was power- or heat-limited."""
    import subprocess

    import torch

    uuid = None
    if torch.cuda.is_available():
        index = torch.cuda.current_device() if index is None else index
        uuid = getattr(torch.cuda.get_device_properties(index), "uuid", None)
    index = 0 if index is None else index
    cmd = ["nvidia-smi", f"--id={nvidia_smi_id(uuid, index)}",
           f"--query-gpu={','.join(_GPU_FIELDS)}", "--format=csv,noheader,nounits"]  # fmt: skip
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=10, check=True)
        return parse_gpu_state(res.stdout.splitlines()[0])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return {}


def _converted(text: str, convert: Callable[[str], Any], noun: str) -> Any:
    """``convert(text)`` for an argparse type; ArgumentTypeError "not <noun>" when it fails."""
    import argparse

    try:
        value = convert(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not {noun}: {text!r}") from None
    return value


def duty_fraction(text: str) -> float:
    """argparse type of ``--duty``: a float in (0, 1]."""
    import argparse

    duty = _converted(text, float, "a number")
    if not 0.0 < duty <= 1.0:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {text!r}")
    return float(duty)


def add_shape_args(
    p: Any, shapes: Sequence[str] = DEFAULT_SHAPES, tokens: Sequence[int] = DEFAULT_TOKENS
) -> None:
    """``--shapes`` (names in ``SHAPES``) and ``--tokens`` (counts >= 1) of an argparse parser,
    defaulting to ``shapes`` and ``tokens``."""
    p.add_argument("--shapes", nargs="+", default=list(shapes), choices=sorted(SHAPES))
    p.add_argument("--tokens", nargs="+", type=positive_int, default=list(tokens))


def positive_int(text: str) -> int:
    """argparse type of counts (``--runs``, ``--replays``, ``--tokens``): an integer >= 1."""
    return at_least(1)(text)


def nonnegative_int(text: str) -> int:
    """argparse type of counts where 0 means none (``--warmup``): an integer >= 0."""
    return at_least(0)(text)


def at_least(low: int) -> Callable[[str], int]:
    """argparse type: an integer >= ``low``."""
    import argparse

    def convert(text: str) -> int:
        n = _converted(text, int, "an integer")
        if n < low:
            raise argparse.ArgumentTypeError(f"must be at least {low}, got {text!r}")
        return int(n)

    return convert


def _finite(text: str) -> float:
    import argparse

    x = float(_converted(text, float, "a number"))
    if not math.isfinite(x):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
    return x


def positive_float(text: str) -> float:
    """argparse type of durations that must pass (``--deadline``): a finite number > 0."""
    import argparse

    x = _finite(text)
    if x <= 0:
        raise argparse.ArgumentTypeError(f"must be greater than 0, got {text!r}")
    return x


def nonnegative_float(text: str) -> float:
    """argparse type of durations where 0 means off (``--held``): a finite number >= 0."""
    import argparse

    x = _finite(text)
    if x < 0:
        raise argparse.ArgumentTypeError(f"must be at least 0, got {text!r}")
    return x


# ---------------------------------------------------------------- files and the GPU


def read_json(path: str) -> Any:
    """The JSON document in the regular file ``path``; ValueError ``"<path>[:line:col]: why"``
    when it cannot be read (missing, a directory; a FIFO or a device is refused, not read,
    so that nothing blocks) or is not JSON."""
    from moe_policy.core.textfile import read_text
    from moe_policy.errors import PolicyError

    try:
        text = read_text(path)
    except PolicyError as exc:
        where = (exc.origin or path).removeprefix("file:")
        raise ValueError(f"{where}: {exc.message}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}:{exc.lineno}:{exc.colno}: not JSON ({exc.msg})") from None


def check_out_file(path: str) -> str:
    """``path``, a results file written at the end of a run, checked before it: not a
    directory, FIFO or device, its folder created if missing and writable; ValueError."""
    if os.path.isdir(path):
        raise ValueError(f"cannot write to {path!r} (a directory)")
    if os.path.exists(path) and not os.path.isfile(path):
        raise ValueError(f"cannot write to {path!r} (not a regular file)")
    writable_dir(os.path.dirname(path) or ".")
    if os.path.exists(path) and not os.access(path, os.W_OK):
        raise ValueError(f"cannot write to {path!r} (Permission denied)")
    return path


def time_graph_us(
    calls: Sequence[Callable[[], Any]], replays: int = 20, duty: float = 1.0
) -> dict[str, float]:
    """Capture ``calls`` once in a CUDA graph, replay it; per-call µs (median, p20, p80).
    ``duty`` < 1: the GPU rests after each replay (``rest_s``)."""
    graph = capture_graph(calls)
    per = [replays_us(graph, 1, len(calls), duty) for _ in range(replays)]
    del graph
    q = statistics.quantiles(per, n=5)
    return {"us": statistics.median(per), "p20_us": q[0], "p80_us": q[-1], "replays": replays}


def time_graph_held_us(calls: Sequence[Callable[[], Any]], seconds: float) -> dict[str, float]:
    """Per-call µs of ``calls`` captured in a CUDA graph and replayed back to back for
    ``seconds`` (``_held_ms``): the rate once a power-capped board has clocked down."""
    graph = capture_graph(calls)
    us = _held_ms(graph.replay, seconds) * 1e3 / len(calls)
    del graph
    return {"held_us": us, "held_s": seconds}


def kernel_times(fn: Callable[[], Any]) -> list[tuple[str, float]]:
    """(name, device µs) of each kernel one eager call of ``fn`` launches, in launch order
    (from the torch profiler)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    evs = [ev for ev in prof.events() if str(getattr(ev, "device_type", "")).endswith("CUDA")]
    evs.sort(key=lambda ev: ev.time_range.start)
    return [(ev.name, ev.time_range.elapsed_us()) for ev in evs]


def time_eager_us(calls: Sequence[Callable[[], Any]], reps: int = 20) -> dict[str, float]:
    """Event-timed eager calls (for code that cannot be graph-captured); median µs per call."""
    i = [0]

    def one() -> None:
        calls[i[0] % len(calls)]()
        i[0] += 1

    ms = [_events_median_ms(one, 1, warmup=0) for _ in range(reps)]
    q = statistics.quantiles(ms, n=5)
    return {
        "us": statistics.median(ms) * 1e3,
        "p20_us": q[0] * 1e3,
        "p80_us": q[-1] * 1e3,
        "replays": reps,
    }


#: PyTorch's CUDA caching allocator hands out blocks of whole multiples of 512 bytes, and
#: ``max_memory_allocated`` counts those blocks.
ALLOC_GRANULE = 512


def alloc_block(nbytes: int) -> int:
    """Bytes the caching allocator charges for a tensor of ``nbytes``."""
    return -(-nbytes // ALLOC_GRANULE) * ALLOC_GRANULE


def peak_extra_bytes(fn: Callable[[], Any]) -> int:
    """Peak memory of one call beyond what was allocated before it and the tensor it returns
    (the returned tensor's allocator block: all counts are in the allocator's blocks)."""
    import torch

    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    out = fn()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated()
    out_bytes = alloc_block(out.numel() * out.element_size()) if out is not None else 0
    return int(peak - before - out_bytes)


def write_json(path: str, payload: dict[str, Any]) -> None:
    """Write results (dataclasses converted) as indented JSON."""

    def conv(o: Any) -> Any:
        if hasattr(o, "__dataclass_fields__"):
            return asdict(o)
        raise TypeError(type(o))

    with open(path, "w") as f:
        json.dump(payload, f, indent=1, default=conv)


def plot_ratios(rows: list[dict[str, Any]], path: str, title: str) -> None:
    """One panel per shape: ratio to the lower bound vs T (log x), one line per implementation."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shapes = sorted({r["shape"] for r in rows})
    fig, axes = plt.subplots(1, len(shapes), figsize=(5 * len(shapes), 4), squeeze=False)
    for ax, shape in zip(axes[0], shapes, strict=True):
        impls = sorted({r["impl"] for r in rows if r["shape"] == shape})
        for impl in impls:
            pts = sorted((r["T"], r["ratio"]) for r in rows
                         if r["shape"] == shape and r["impl"] == impl and r.get("ratio"))  # fmt: skip
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=impl)
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("tokens T")
        ax.set_ylabel("time / lower bound")
        ax.set_title(shape)
        ax.legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
