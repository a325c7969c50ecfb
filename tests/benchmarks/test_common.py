"""CPU checks of what the benchmarks and tools share (``benchmarks.common``): the lower bound,
the GPU state from nvidia-smi, resting between timings, interleaved timing, argparse types."""

from __future__ import annotations

import importlib
import sys

import pytest

from benchmarks import common
from moe_policy.experts.triton.tuning import timing


def test_lower_bound_is_memory_at_decode_and_compute_at_prefill():
    """T=1 reads k experts' weights; T=8192 is the FLOPs at the matmul rate."""
    q = common.SHAPES["qwen3-30b-a3b"]
    copy, mm = 4.0, 800.0
    decode = common.lower_bound_us(q, 1, copy, mm)
    assert abs(decode - (8 * q.bytes_per_expert + 2 * q.hidden * 2) / 4.0e12 * 1e6) < 1e-6
    prefill = common.lower_bound_us(q, 8192, copy, mm)
    assert abs(prefill - common.layer_flops(q, 8192) / 800e12 * 1e6) < 1e-6


def test_gpu_state_line_is_parsed_with_clock_event_reasons():
    """An nvidia-smi line gives clock, power and named clock-event reasons; unavailable fields
    are left out, unknown bits kept as hex, and a line of the wrong shape is refused."""

    got = common.parse_gpu_state("1350, 1980, 667.83, 700.00, 54, 0x0000000000000004\n")
    assert got == {"sm_mhz": 1350.0, "max_sm_mhz": 1980.0, "power_w": 667.83,
                   "power_limit_w": 700.0, "temp_c": 54.0, "throttle": ["sw_power_cap"]}  # fmt: skip
    partial = common.parse_gpu_state("345, 1980, [N/A], [N/A], 36, [N/A]")
    assert partial == {"sm_mhz": 345.0, "max_sm_mhz": 1980.0, "temp_c": 36.0}
    assert common.throttle_reasons(0x1 | 0x20 | 0x4000) == ["idle", "sw_thermal", "0x4000"]
    assert common.throttle_reasons(0) == []
    with pytest.raises(ValueError, match="expected 6 fields"):
        common.parse_gpu_state("1350, 1980")


def test_gpu_state_without_nvidia_smi_is_empty(monkeypatch):
    """No nvidia-smi (a CPU machine) or a failing one: no state, no exception."""
    import subprocess

    def missing(*args, **kwargs):
        raise FileNotFoundError("nvidia-smi")

    monkeypatch.setattr(subprocess, "run", missing)
    assert common.gpu_state() == {}


def test_gpu_state_asks_nvidia_smi_for_the_device_by_uuid(monkeypatch):
    """torch's index counts visible GPUs only (CUDA_VISIBLE_DEVICES=3 makes GPU 3 torch's 0),
    so nvidia-smi is asked by the device's UUID; the index only where torch has no UUID."""
    import subprocess
    import types

    import torch

    assert common.nvidia_smi_id("58a6e41a-0000-1111", 0) == "GPU-58a6e41a-0000-1111"
    assert common.nvidia_smi_id("GPU-58a6", 0) == "GPU-58a6"
    assert common.nvidia_smi_id("MIG-7f3c", 0) == "MIG-7f3c"
    assert common.nvidia_smi_id(None, 2) == "2" and common.nvidia_smi_id("", 1) == "1"
    seen = []

    def fake_run(cmd, **kwargs):
        seen.append(cmd)
        return types.SimpleNamespace(stdout="1980, 1980, 300.0, 700.0, 40, 0x0\n")

    monkeypatch.setattr(subprocess, "run", fake_run)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda i: types.SimpleNamespace(uuid=f"uuid-of-{i}"))  # fmt: skip
    assert common.gpu_state()["sm_mhz"] == 1980.0
    assert common.gpu_state(1) == common.gpu_state()
    assert [c[1] for c in seen] == [
        "--id=GPU-uuid-of-0",
        "--id=GPU-uuid-of-1",
        "--id=GPU-uuid-of-0",
    ]


def test_rest_keeps_the_gpu_busy_at_most_the_duty_fraction():

    assert common.rest_s(10.0, 1.0) == 0.0
    assert common.rest_s(10.0, 0.25) == pytest.approx(0.030)  # 10 ms busy, 30 ms idle
    assert common.rest_s(4.0, 0.5) == pytest.approx(0.004)
    for bad in (0.0, -0.5, 1.5):
        with pytest.raises(ValueError, match="duty must be in"):
            common.rest_s(1.0, bad)


def test_interleaved_timing_rests_after_every_sample_and_rotates_the_order(monkeypatch):
    """Each sample of each variant is followed by a rest of (1/duty - 1) times its busy time;
    the per-call µs divide the per-replay time by the calls captured in the graph."""
    import time

    order, sleeps = [], []
    per_replay_ms = {"a": 2.0, "b": 4.0}

    class FakeGraph:
        def __init__(self, name):
            self.name = name

        def replay(self):
            order.append(self.name)

    def fake_event_ms(fn, calls=1):
        for _ in range(calls):
            fn()
        return per_replay_ms[fn.__self__.name]

    monkeypatch.setattr(timing, "capture_graph", lambda calls: FakeGraph(calls[0]))
    monkeypatch.setattr(timing, "event_ms", fake_event_ms)
    monkeypatch.setattr(time, "sleep", sleeps.append)
    import torch

    # a spin kernel goes first in every sample, so the start event waits for the queued replays
    monkeypatch.setattr(torch.cuda, "_sleep", lambda cycles: order.append(("lead", cycles)))
    out = common.time_graphs_interleaved({"a": ["a", "a"], "b": ["b"]}, 2, 3, 0.25)
    assert out["a"]["us"] == pytest.approx(1000.0)  # 2 ms per replay of a 2-call graph
    assert out["b"]["us"] == pytest.approx(4000.0)
    assert out["a"]["replays"] == 6
    # round 0: a then b; round 1 rotated: b then a; 3 replays per sample after the lead
    lead = [("lead", common.LEAD_CYCLES)]
    assert order == lead + ["a"] * 3 + lead + ["b"] * 3 + lead + ["b"] * 3 + lead + ["a"] * 3
    assert sleeps == pytest.approx([0.018, 0.036, 0.036, 0.018])


@pytest.mark.parametrize("module", ["benchmarks.kernels", "tools.compare_configs"])
@pytest.mark.parametrize(
    ("value", "message"),
    [("0", "must be in (0, 1], got '0'"), ("1.5", "must be in (0, 1], got '1.5'"),
     ("half", "not a number: 'half'")],
)  # fmt: skip
def test_duty_outside_zero_to_one_is_a_usage_error(module, value, message, monkeypatch, capsys):
    mod = importlib.import_module(module)
    monkeypatch.setattr(sys, "argv", [module, "--duty", value])
    with pytest.raises(SystemExit) as exc:
        mod.main()
    assert exc.value.code == 2
    assert f"argument --duty: {message}" in capsys.readouterr().err


@pytest.mark.parametrize(
    "module", ["benchmarks.kernels", "tools.compare_configs", "tools.tune_triton"]
)
def test_token_counts_below_one_are_usage_errors(module, monkeypatch, capsys):
    """A batch of 0 tokens is refused when parsing, in every GPU benchmark and tool."""
    mod = importlib.import_module(module)
    monkeypatch.setattr(sys, "argv", [module, "--tokens", "16", "0"])
    with pytest.raises(SystemExit) as exc:
        mod.main()
    assert exc.value.code == 2
    assert "argument --tokens: must be at least 1, got '0'" in capsys.readouterr().err


def test_shape_corpus_is_real_models_with_their_sources():
    """The corpus file: unique names, each with the Hugging Face repo its numbers come from,
    top-k within the experts; the shipped tuned shapes are marked, the others are untuned."""
    import json

    entries = json.loads(common.CORPUS_FILE.read_text())["shapes"]
    assert len({e["name"] for e in entries}) == len(entries) == len(common.SHAPES) >= 16
    for e in entries:
        assert "/" in e["repo"] and 1 <= e["top_k"] <= e["num_experts"]
    assert set(common.UNTUNED_SHAPES) == {e["name"] for e in entries if not e.get("tuned_h200")}
    assert {"deepseek-v3", "kimi-k2", "granite-3.0-1b-a400m"} <= set(common.UNTUNED_SHAPES)


def test_shape_from_a_hugging_face_config(tmp_path):
    """--model: a config.json (by file or directory) gives its routed-expert layer, named after
    its directory; a config without MoE keys is a PolicyError naming the file."""
    import json

    from moe_policy.errors import PolicyError

    d = tmp_path / "OLMoE-1B-7B"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({
        "model_type": "olmoe", "num_experts": 64, "num_experts_per_tok": 8, "hidden_size": 2048,
        "intermediate_size": 1024, "hidden_act": "silu"}))  # fmt: skip
    s = common.shape_from_model(str(d))
    assert (s.name, s.num_experts, s.top_k, s.hidden, s.inter, s.gated) == (
        "OLMoE-1B-7B", 64, 8, 2048, 1024, True)  # fmt: skip
    assert common.shape_from_model("deepseek-v3") == common.SHAPES["deepseek-v3"]
    (d / "config.json").write_text(json.dumps({"hidden_size": 2048}))
    with pytest.raises(PolicyError, match=r"config\.json"):
        common.shape_from_model(str(d))


def test_kernels_model_flag_errors_name_the_file(tmp_path):
    import subprocess

    bad = tmp_path / "dense.json"
    bad.write_text('{"hidden_size": 4096, "intermediate_size": 11008}')
    out = subprocess.run([sys.executable, "-m", "benchmarks.kernels", "--model", str(bad)],
                         capture_output=True, text=True, timeout=120,
                         cwd=common.CORPUS_FILE.parents[1])  # fmt: skip
    assert out.returncode == 2
    assert out.stderr.strip().splitlines()[-1].startswith(f"kernels.py: error: --model {bad}: ")
