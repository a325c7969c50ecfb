"""CUDA-graph timing: calls captured in one graph and replayed, event-timed, several variants
interleaved round by round so that clock and thermal drift fall on all of them alike."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from typing import Any


def event_ms(fn: Callable[[], Any], calls: int = 1) -> float:
    """ms per call of ``calls`` back-to-back calls of ``fn``, timed with CUDA events."""
    import torch

    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(calls):
        fn()
    b.record()
    b.synchronize()
    return a.elapsed_time(b) / calls


def rest_s(busy_ms: float, duty: float) -> float:
    """Seconds to leave the GPU idle after ``busy_ms`` of work so that it runs at most a
    ``duty`` fraction of the time (``duty`` 1: no rest)."""
    if not 0.0 < duty <= 1.0:
        raise ValueError(f"duty must be in (0, 1], got {duty}")
    return busy_ms * 1e-3 * (1.0 / duty - 1.0)


#: GPU clock cycles of a spin kernel queued before each timed sample (~50 µs at 1.98 GHz):
#: the start event then fires once the CPU has queued the replays behind it, so a sample times
#: the GPU, not the graph launch's host latency, which a decode layer timed one replay per
#: sample after a rest would otherwise carry (H200, Qwen3 T=1: 25.9 instead of 24.9 µs).
LEAD_CYCLES = 100_000


def replays_us(graph: Any, replays: int, calls: int, duty: float = 1.0) -> float:
    """Event-timed ``replays`` back-to-back replays of ``graph``; µs per call. With ``duty``
    < 1 the GPU then rests (``rest_s``), so that a power-capped board comes back to its boost
    clock before the next sample."""
    import time

    import torch

    torch.cuda._sleep(LEAD_CYCLES)
    ms = event_ms(graph.replay, replays)
    time.sleep(rest_s(ms * replays, duty))
    return ms * 1e3 / calls


def capture_graph(calls: Sequence[Callable[[], Any]]) -> Any:
    """Warm ``calls`` on a side stream (compile, allocate), capture them in one CUDA graph,
    replay it once; returns the graph."""
    import torch

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for fn in calls:
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for fn in calls:
            fn()
    graph.replay()
    torch.cuda.synchronize()
    return graph


def time_graphs_interleaved(
    variants: dict[str, Sequence[Callable[[], Any]]],
    rounds: int = 10,
    replays: int = 5,
    duty: float = 1.0,
) -> dict[str, dict[str, float]]:
    """Per-call µs of several variants, each captured in its own CUDA graph and timed in
    ``rounds`` rounds of ``replays`` replays, the variants in a rotated order every round, so
    that clock and thermal drift fall on all of them alike (median and p20/p80 over rounds).
    ``duty`` < 1: the GPU rests after each sample (``rest_s``), so that every sample starts
    near the boost clock instead of wherever the power cap left the previous one."""
    graphs = {name: (capture_graph(calls), len(calls)) for name, calls in variants.items()}
    names = list(graphs)
    per: dict[str, list[float]] = {n: [] for n in names}
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            graph, n_calls = graphs[name]
            per[name].append(replays_us(graph, replays, n_calls, duty))
    del graphs
    out = {}
    for name, xs in per.items():
        q = statistics.quantiles(xs, n=5) if len(xs) > 1 else [xs[0], xs[0]]
        out[name] = {"us": statistics.median(xs), "p20_us": q[0], "p80_us": q[-1],
                     "replays": rounds * replays}  # fmt: skip
    return out
