"""CPU checks of the kernel benchmark's bookkeeping: run merging and the lower bound."""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))

import kernels
from _bench_util import SHAPES, layer_flops, lower_bound_us


def _payload(ceil: float, rows: list[dict]) -> dict:
    return {"info": {"device": "X"}, "ceilings": {"copy_tbps": ceil}, "rows": rows}


def _row(t: int, ratio: float, **extra) -> dict:
    return {"shape": "s", "T": t, "impl": "triton_lora", "ratio": ratio, "us": ratio, **extra}


def test_median_of_runs_keeps_the_median_row_and_every_ratio():
    """Each point keeps its median-ratio run whole; the LoRA overhead is the median of runs."""
    runs = [
        _payload(4.1, [_row(1, 1.30, overhead_vs_triton=1.2), {"shape": "s", "T": 2,
                                                                "impl": "x", "skipped": "no"}]),
        _payload(4.2, [_row(1, 1.10, overhead_vs_triton=1.4)]),
        _payload(4.3, [_row(1, 1.20, overhead_vs_triton=1.1)]),
    ]  # fmt: skip
    merged = kernels.median_of_runs(runs)
    by_t = {r["T"]: r for r in merged["rows"]}
    assert by_t[1]["ratio"] == 1.20 and by_t[1]["us"] == 1.20
    assert by_t[1]["ratio_runs"] == [1.30, 1.10, 1.20]
    assert by_t[1]["overhead_vs_triton"] == 1.2
    assert by_t[2] == {"shape": "s", "T": 2, "impl": "x", "skipped": "no"}
    assert merged["info"]["runs"] == 3
    assert [c["copy_tbps"] for c in merged["ceilings_runs"]] == [4.1, 4.2, 4.3]


def test_even_number_of_runs_takes_the_lower_middle():
    merged = kernels.median_of_runs([_payload(4, [_row(1, 2.0)]), _payload(4, [_row(1, 1.0)])])
    assert merged["rows"][0]["ratio"] == 1.0


def test_lower_bound_is_memory_at_decode_and_compute_at_prefill():
    """T=1 reads k experts' weights; T=8192 is the FLOPs at the matmul rate."""
    q = SHAPES["qwen3-30b-a3b"]
    copy, mm = 4.0, 800.0
    decode = lower_bound_us(q, 1, copy, mm)
    assert abs(decode - (8 * q.bytes_per_expert + 2 * q.hidden * 2) / 4.0e12 * 1e6) < 1e-6
    prefill = lower_bound_us(q, 8192, copy, mm)
    assert abs(prefill - layer_flops(q, 8192) / 800e12 * 1e6) < 1e-6


def test_compare_variants_flip_the_trigger_only_where_dependent_launches_are_on():
    """compare_configs offers the decode trigger flipped where the config launches dependents
    (the shipped H200 Qwen3 T=1 entry sets it: "no_trigger"), and not for prefill configs."""
    import compare_configs

    decode = compare_configs.variants(SHAPES["qwen3-30b-a3b"], 1, "NVIDIA H200")
    assert decode["shipped"].trigger is True and decode["no_trigger"].trigger is False
    assert "trigger" not in decode
    prefill = compare_configs.variants(SHAPES["qwen3-30b-a3b"], 4096, "NVIDIA H200")
    assert not prefill["shipped"].pdl
    assert "trigger" not in prefill and "no_trigger" not in prefill
    assert prefill["pdl"].pdl and prefill["pdl"].trigger is None
