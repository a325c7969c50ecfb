"""The tuner's search loop (``moe_policy.experts.triton.tuning.search.tune``) end to end on the
CPU: the layer calls run under Triton's interpreter in fp16; only what needs a GPU is replaced
(the SM count, the compile workers, CUDA-graph timing, which here calls each variant once and
reports made-up times)."""

from __future__ import annotations

import multiprocessing
from dataclasses import asdict
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from moe_policy.experts.triton import device as device_mod  # noqa: E402
from moe_policy.experts.triton.tuning import inputs, search, timing  # noqa: E402
from moe_policy.experts.triton.tuning.shapes import MoEShape  # noqa: E402

SHAPE = MoEShape("tiny", num_experts=8, hidden=64, inter=32, top_k=2, gated=True,
                 activation="silu")  # fmt: skip


@pytest.fixture
def cpu_tuner(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """The GPU-only parts replaced; returns what the fake timing saw."""
    if torch.cuda.is_available():
        pytest.skip("the GPU runs the real tuner (`moe-policy tune`)")
    seen: dict[str, Any] = {"variants": [], "calls": 0}

    class NoWorkers:
        def __init__(self, _n: int) -> None:
            pass

        def __enter__(self) -> NoWorkers:
            return self

        def __exit__(self, *exc: object) -> None:
            pass

        def map(self, fn: Any, tasks: list[Any]) -> list[int]:
            seen["compile_tasks"] = len(tasks)
            return [0] * len(tasks)

    class Context:
        Pool = NoWorkers

    cpu, fp16 = {"device": "cpu"}, {"device": "cpu", "dtype": torch.float16}
    made = {name: getattr(inputs, name) for name in
            ("shape_weights", "routing_sets", "shape_adapters", "lora_contexts")}  # fmt: skip
    for name, fn in made.items():  # the real input makers, on the CPU in fp16
        extra = cpu if name == "lora_contexts" else fp16
        monkeypatch.setattr(inputs, name, lambda *a, fn=fn, extra=extra, **k: fn(*a, **k, **extra))

    def fake_timing(variants: dict[str, Any], rounds: int, replays: int, duty: float) -> Any:
        seen["variants"].append(sorted(variants))
        for calls in variants.values():
            calls[0]()  # the variant's own lambda, as a graph capture would run it
            seen["calls"] += 1
        # candidate "2" is made the fastest, with and without LoRA; every other takes 100 us
        return {name: {"us": 90.0 if name.split("+")[0] == "2" else 100.0} for name in variants}

    monkeypatch.setattr(multiprocessing, "get_context", lambda kind: Context)
    monkeypatch.setattr(device_mod, "cuda_limits", lambda index: {"num_sms": 132})
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(timing, "time_graphs_interleaved", fake_timing)
    return seen


def test_tune_times_every_candidate_and_keeps_the_fastest(cpu_tuner):
    cands = search.candidates(SHAPE, 16)
    rows = search.tune(SHAPE, [16], lora=False, jobs=2, rounds=1)
    assert cpu_tuner["compile_tasks"] == 1
    [row] = rows
    assert row["T"] == 16 and row["candidates"] == len(cpu_tuner["variants"][0])
    assert cpu_tuner["calls"] == row["candidates"] >= 4  # every kept candidate ran
    assert row["heuristic_us"] == 100.0 and row["tuned_us"] == 90.0
    assert row["config"] == cands[2].to_dict()
    assert row["bound_us"] > 0


def test_tune_with_lora_times_each_candidate_with_and_without_it(cpu_tuner):
    """With LoRA every kept candidate is timed twice, and the winner is the fastest base plus
    LoRA layer (the fake times make candidate "2" fastest both ways)."""
    cands = search.candidates(SHAPE, 64)
    [row] = search.tune(SHAPE, [64], lora=True, jobs=1, rounds=1)
    names = cpu_tuner["variants"][0]
    assert len(names) == 2 * row["candidates"] and "0+lora" in names
    assert row["config"] == cands[2].to_dict()
    assert (row["heuristic_lora_us"], row["tuned_lora_us"]) == (100.0, 90.0)


@pytest.mark.parametrize("lora", [False, True])
def test_compile_task_launches_every_candidate_and_counts_failures(monkeypatch, lora):
    """The compile worker launches each candidate on a few experts with the real expert
    count's plan, with LoRA too when the task asks, and counts the configs that fail."""
    from moe_policy.experts.triton import fused_moe

    launched: list[tuple[int, bool]] = []
    real = fused_moe.launch_plan

    def spy(plan: Any, *args: Any) -> Any:
        launched.append((plan.problem.num_experts, args[-1] is not None))
        return real(plan, *args)

    monkeypatch.setattr(fused_moe, "launch_plan", spy)
    cands = [c.to_dict() for c in search.candidates(SHAPE, 16)[:2]]
    broken = dict(cands[0], block_m=24)  # not a power of two: rejected before any launch
    task = (asdict(SHAPE), 16, [*cands, broken], lora)
    assert search.compile_task(task, device="cpu", dtype=torch.float16) == 1
    runs = [(SHAPE.num_experts, False)] + ([(SHAPE.num_experts, True)] if lora else [])
    assert launched == runs * len(cands)
