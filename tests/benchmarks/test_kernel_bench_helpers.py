"""CPU checks of the kernel benchmark's bookkeeping: run merging and the lower bound."""

from __future__ import annotations

import os
import re
import sys

import pytest

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


def test_even_number_of_runs_takes_the_slower_middle_run():
    """Two runs: the slower one is reported (a median that never flatters), both ratios kept."""
    merged = kernels.median_of_runs(
        [_payload(4, [_row(1, 1.0, overhead_vs_triton=1.3)]),
         _payload(4, [_row(1, 2.0, overhead_vs_triton=1.1)])]
    )  # fmt: skip
    assert merged["rows"][0]["ratio"] == 2.0
    assert merged["rows"][0]["ratio_runs"] == [1.0, 2.0]
    assert merged["rows"][0]["overhead_vs_triton"] == 1.3  # the larger, not the mean 1.2
    four = [_payload(4, [_row(1, r)]) for r in (1.3, 1.1, 1.4, 1.2)]
    assert kernels.median_of_runs(four)["rows"][0]["ratio"] == 1.3


def test_merge_writes_the_median_of_saved_sweeps(tmp_path, monkeypatch, capsys):
    """--merge (no GPU) reads the per-run JSONs a cut-off --runs call left and writes their
    median like --runs does; a missing, malformed or foreign file is named in the error."""
    import json

    paths = []
    for i, ratio in enumerate((1.4, 1.2, 1.3)):
        path = tmp_path / f"k_run{i + 1}.json"
        path.write_text(json.dumps(_payload(4.0 + i / 10, [_row(8, ratio)])))
        paths.append(str(path))
    monkeypatch.setattr(kernels, "plot_ratios", lambda *a, **k: None)
    monkeypatch.setattr(sys, "argv", ["kernels.py", "--merge", *paths, "--out", str(tmp_path),
                                      "--tag", "merged"])  # fmt: skip
    kernels.main()
    merged = json.loads((tmp_path / "merged.json").read_text())
    assert merged["rows"][0]["ratio"] == 1.3 and merged["rows"][0]["ratio_runs"] == [1.4, 1.2, 1.3]
    assert merged["info"]["runs"] == 3
    assert "x1.30 runs 1.40 1.20 1.30" in capsys.readouterr().out

    (tmp_path / "bad.json").write_text('{"info": {},\n "rows": [,]}')
    (tmp_path / "other.json").write_text('{"rows": []}')
    for name, msg in [("bad.json", r"bad.json:2:\d+: not JSON"),
                      ("other.json", r"other.json: not a kernels.py sweep \(no info, ceilings\)"),
                      ("gone.json", r"gone.json: No such file")]:  # fmt: skip
        monkeypatch.setattr(sys, "argv", ["kernels.py", "--merge", str(tmp_path / name)])
        with pytest.raises(SystemExit) as exc:
            kernels.main()
        assert exc.value.code == 2
        assert re.search(msg, capsys.readouterr().err)


def test_lower_bound_is_memory_at_decode_and_compute_at_prefill():
    """T=1 reads k experts' weights; T=8192 is the FLOPs at the matmul rate."""
    q = SHAPES["qwen3-30b-a3b"]
    copy, mm = 4.0, 800.0
    decode = lower_bound_us(q, 1, copy, mm)
    assert abs(decode - (8 * q.bytes_per_expert + 2 * q.hidden * 2) / 4.0e12 * 1e6) < 1e-6
    prefill = lower_bound_us(q, 8192, copy, mm)
    assert abs(prefill - layer_flops(q, 8192) / 800e12 * 1e6) < 1e-6


def test_memory_budget_is_counted_in_allocator_blocks():
    """The budget is two bf16 buffers (plus the LoRA fp32 one), each as the caching
    allocator's 512-byte-multiple block, the unit max_memory_allocated counts in."""
    from _bench_util import alloc_block

    assert [alloc_block(n) for n in (0, 1, 512, 513, 32256)] == [0, 512, 512, 1024, 32256]
    nemo = SHAPES["nemotron3-nano"]  # k=6, non-gated N1=I=1856, H=2688
    # T=1: 6*2688*2 = 32256 (a whole block), 6*1856*2 = 22272 -> 22528
    assert kernels.mem_limit_bytes(nemo, 1, lora=False) == 32256 + 22528
    # LoRA: 6*16*(1+1)*4 = 768 fp32 bytes -> 1024
    assert kernels.mem_limit_bytes(nemo, 1, lora=True) == 32256 + 22528 + 1024
    big = kernels.mem_limit_bytes(nemo, 8192, lora=False)
    assert big == 8192 * 6 * (2688 + 1856) * 2  # multiples of 512 already


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


def test_compare_variants_switch_persistent_gemms():
    """A persistent shipped entry (H200 Qwen3 T=4096) is offered with one program per tile and
    the default tail tiles; a per-tile entry (T=1024) is offered persistent, without tails."""
    import compare_configs

    prefill = compare_configs.variants(SHAPES["qwen3-30b-a3b"], 4096, "NVIDIA H200")
    assert prefill["shipped"].persistent and prefill["shipped"].tail_m == 0
    back = prefill["not_persistent"]
    assert not back.persistent and back.tail_m == 64
    assert not prefill["plain"].persistent and prefill["plain"].tail_m == 0
    assert "persistent" not in prefill
    mid = compare_configs.variants(SHAPES["qwen3-30b-a3b"], 1024, "NVIDIA H200")
    assert not mid["shipped"].persistent and mid["shipped"].tail_m == 64
    assert mid["persistent"].persistent and mid["persistent"].tail_m == 0
    assert "not_persistent" not in mid


def test_decode_search_varies_stages_with_the_trigger_for_decode_batches_only():
    """Decode (one pair per block, dependent launches): the trigger forced on with GEMM 1 one
    stage shallower or not and GEMM 2 zero to two, never below 2; nothing for prefill."""
    import compare_configs

    found = compare_configs.decode_search(SHAPES["mixtral-8x7b"], 1, "NVIDIA H200")
    base = found.pop("shipped")
    assert base.gemm1.num_stages == 3 and base.gemm2.num_stages == 3 and base.trigger is None
    assert set(found) == {"trig_g1s3_g2s3", "trig_g1s3_g2s2", "trig_g1s2_g2s3", "trig_g1s2_g2s2"}
    for name, cfg in found.items():
        assert cfg.trigger is True and cfg.pdl
        assert name == f"trig_g1s{cfg.gemm1.num_stages}_g2s{cfg.gemm2.num_stages}"
        assert cfg.gemm1.block_n == base.gemm1.block_n and cfg.gemm2.block_n == base.gemm2.block_n
    assert list(compare_configs.decode_search(SHAPES["mixtral-8x7b"], 1024, "NVIDIA H200")) == [
        "shipped"
    ]


def test_decode_tile_search_varies_one_gemm_tile_at_a_time_within_shared_memory():
    """Decode: each variant changes one GEMM's tile (the other as shipped), names say which,
    the trigger is flipped both ways where dependent launches are on, tiles over the
    shared-memory budget or wider than the GEMM are left out; nothing for prefill."""
    import compare_configs

    from moe_policy.experts.triton.config import SMEM_LIMIT, _smem_bytes

    shape = SHAPES["qwen3-30b-a3b"]  # gated, H=2048, I=768
    found = compare_configs.decode_tile_search(shape, 1, "NVIDIA H200")
    base = found.pop("shipped")
    assert base.pdl and found
    for name, cfg in found.items():
        gemm, n, k, st, trig = name.split("_")
        changed, kept = ("gemm1", "gemm2") if gemm == "g1" else ("gemm2", "gemm1")
        g = getattr(cfg, changed)
        assert getattr(cfg, kept) == getattr(base, kept)
        assert (f"n{g.block_n}", f"k{g.block_k}", f"s{g.num_stages}") == (n, k, st)
        assert cfg.trigger is (trig == "trig")
        assert _smem_bytes(base.block_m, g, 2 if changed == "gemm1" else 1) <= SMEM_LIMIT
        assert g.block_n <= (shape.inter if changed == "gemm1" else shape.hidden)
    on = {n.rsplit("_", 1)[0] for n in found if n.endswith("_trig")}
    off = {n.rsplit("_", 1)[0] for n in found if n.endswith("_notrig")}
    # the shipped tiles with the shipped trigger (on) are "shipped" itself
    shipped_tiles = {f"g{i}_n{g.block_n}_k{g.block_k}_s{g.num_stages}"
                     for i, g in ((1, base.gemm1), (2, base.gemm2))}  # fmt: skip
    assert base.trigger is True and off - on == shipped_tiles and on <= off
    assert list(compare_configs.decode_tile_search(shape, 1024, "NVIDIA H200")) == ["shipped"]


def test_best_entries_keep_the_fastest_variant_past_the_margin_and_merge(tmp_path):
    """Per point the fastest variant wins if it beats shipped by more than the margin and its
    output agrees with shipped's (a faster wrong or NaN result never wins); the merge writes
    it as that point's entry of the shape's tuned file, and refuses a shape without one."""
    import json

    import compare_configs

    rows = [
        {"shape": "qwen3-30b-a3b", "T": 3, "variant": "shipped", "vs_shipped": 1.0,
         "config": {}},
        {"shape": "qwen3-30b-a3b", "T": 3, "variant": "a", "vs_shipped": 0.97,
         "config": {"block_m": 16, "gemm1": {"block_n": 32, "block_k": 64},
                    "gemm2": {"block_n": 32, "block_k": 64}, "pdl": True, "trigger": True}},
        {"shape": "qwen3-30b-a3b", "T": 3, "variant": "b", "vs_shipped": 0.95, "config": {
            "block_m": 16, "gemm1": {"block_n": 64, "block_k": 64},
            "gemm2": {"block_n": 64, "block_k": 64}, "pdl": True, "trigger": True}},
        {"shape": "qwen3-30b-a3b", "T": 3, "variant": "wrong", "vs_shipped": 0.5,
         "rel_diff": 0.3, "config": {}},
        {"shape": "qwen3-30b-a3b", "T": 3, "variant": "nan", "vs_shipped": 0.5,
         "rel_diff": float("nan"), "config": {}},
        {"shape": "qwen3-30b-a3b", "T": 1, "variant": "c", "vs_shipped": 0.99, "config": {}},
        {"shape": "qwen3-30b-a3b", "T": 2, "variant": "d", "error": "did not compile"},
    ]  # fmt: skip
    best = compare_configs.best_entries(rows, 0.02)
    assert list(best) == ["qwen3-30b-a3b/3"] and best["qwen3-30b-a3b/3"]["variant"] == "b"
    import shutil

    name = "E=128,N=768,device_name=NVIDIA_H200.json"
    src = os.path.join(os.path.dirname(compare_configs.__file__), "..", "moe_policy", "experts",
                       "triton", "configs", name)  # fmt: skip
    target = tmp_path / name
    shutil.copy(src, target)
    path = tmp_path / "best.json"
    path.write_text(json.dumps({"device": "NVIDIA H200", "best": best}))
    assert compare_configs.write_best(str(path), str(tmp_path)) == [str(target)]
    merged = json.loads(target.read_text())["configs"]
    assert merged["3"] == best["qwen3-30b-a3b/3"]["config"]
    assert list(merged) == sorted(merged, key=int) and "1" in merged
    path.write_text(json.dumps({"device": "NVIDIA H200", "best": {
        "mixtral-8x7b/3": best["qwen3-30b-a3b/3"]}}))  # fmt: skip
    with pytest.raises(SystemExit, match="no tuned file to merge mixtral-8x7b into"):
        compare_configs.write_best(str(path), str(tmp_path))


def test_best_entries_with_lora_need_a_win_on_one_layer_and_no_loss_on_the_other():
    """--with-lora rows: a variant wins when one layer (base or LoRA) beats shipped by the
    margin and the other loses at most the slack; among winners the lowest sum of the two
    relative times; a variant whose LoRA timing is missing or disagrees gets no verdict."""
    import compare_configs

    def pair(t, name, base, lora, **lora_extra):
        cfg = {"block_m": 16, "name": name}
        return [{"shape": "s", "T": t, "variant": name, "lora": False, "vs_shipped": base,
                 "config": cfg},
                {"shape": "s", "T": t, "variant": name, "lora": True, "vs_shipped": lora,
                 "config": cfg, **lora_extra}]  # fmt: skip

    rows = [
        *pair(1, "shipped", 1.0, 1.0),
        *pair(1, "lora_only", 1.004, 0.95),  # LoRA -5%, base +0.4%: wins
        *pair(1, "base_pays", 1.02, 0.90),  # LoRA -10% but base +2%: refused
        *pair(1, "both", 0.97, 0.99),  # base -3%, LoRA -1%: sum 1.96 > lora_only's 1.954
        *pair(2, "lora_costs", 0.95, 1.01),  # base -5% but LoRA +1%: refused
        *pair(2, "lora_wrong", 0.90, 0.80, rel_diff=0.5),  # LoRA output disagrees: no verdict
        *pair(3, "small", 0.99, 0.99),  # neither past the margin
    ]
    rows.append({"shape": "s", "T": 3, "variant": "base_only", "lora": False,
                 "vs_shipped": 0.5, "config": {}})  # no LoRA timing at a LoRA point  # fmt: skip
    best = compare_configs.best_entries(rows, 0.02)
    assert list(best) == ["s/1"]
    assert best["s/1"]["variant"] == "lora_only"
    assert (best["s/1"]["r"], best["s/1"]["r_lora"]) == (1.004, 0.95)
    assert best["s/1"]["config"] == {"block_m": 16, "name": "lora_only"}
    # the slack is a parameter: at 0.03 the base cost of base_pays is tolerated (sum 1.92)
    assert compare_configs.best_entries(rows, 0.02, slack=0.03)["s/1"]["variant"] == "base_pays"


def test_compare_main_with_lora_times_both_layers_and_writes_the_winner(tmp_path, monkeypatch):
    """compare_configs' main loop with the GPU parts faked: --with-lora times each variant's
    base and LoRA layer under their own labels in one set of rounds, each relative to
    shipped's layer of the same kind, and compare_best.json holds the variant that wins the
    LoRA layer without costing the base one."""
    import json
    import multiprocessing
    import sys

    import compare_configs
    import torch

    # variant -> (base us, LoRA us) of the fake timing; "plain" wins LoRA, costs nothing
    speed = {"shipped": (100.0, 130.0), "plain": (100.2, 120.0)}
    speed.update({n: (104.0, 131.0) for n in ("tail16", "no_pdl", "pdl", "persistent",
                                             "heuristic", "tail32", "not_persistent")})  # fmt: skip
    timed_labels = []

    class FakePool:
        def __init__(self, *a, **k): ...
        def __enter__(self):
            return self

        def __exit__(self, *a):
            return False

        def map(self, fn, tasks, chunksize=1):
            return [0 for _ in tasks]

    class FakeContext:
        Pool = FakePool

    def fake_time(calls, rounds, replays, duty):
        assert duty == 0.25  # the default: samples rest so that each starts at the boost clock
        timed_labels.extend(calls)
        out = {}
        for label in calls:
            name, lora = label.removesuffix("+lora"), label.endswith("+lora")
            us = speed[name][lora]
            out[label] = {"us": us, "p20_us": us, "p80_us": us, "replays": rounds * replays}
        return out

    monkeypatch.setattr(multiprocessing, "get_context", lambda kind: FakeContext())
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA H200")
    monkeypatch.setattr(compare_configs, "measure_ceilings",
                        lambda: {"copy_tbps": 4.0, "matmul_tflops": 700.0})  # fmt: skip
    monkeypatch.setattr(compare_configs, "_layer", lambda shape: (None, None))
    monkeypatch.setattr(compare_configs, "_inputs", lambda shape, t, n: [(None, None, None)] * n)
    monkeypatch.setattr(compare_configs, "_lora_contexts", lambda shape, t, n: ["ctx"] * n)
    monkeypatch.setattr(compare_configs, "_call",
                        lambda b, c, x, tw, ti, lora=None: torch.ones(4))  # fmt: skip
    monkeypatch.setattr(compare_configs, "time_graphs_interleaved", fake_time)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(sys, "argv", ["compare_configs.py", "--shapes", "qwen3-30b-a3b",
                                      "--tokens", "256", "--with-lora", "--variants", "plain",
                                      "tail16", "--out", str(tmp_path)])  # fmt: skip
    compare_configs.main()
    assert sorted(timed_labels) == sorted(
        ["shipped", "plain", "tail16", "shipped+lora", "plain+lora", "tail16+lora"]
    )  # fmt: skip
    rows = json.loads((tmp_path / "compare_configs.json").read_text())["rows"]
    got = {(r["variant"], r["lora"]): round(r["vs_shipped"], 4) for r in rows}
    assert got[("plain", False)] == 1.002 and got[("plain", True)] == round(120 / 130, 4)
    assert got[("shipped", True)] == 1.0
    best = json.loads((tmp_path / "compare_best.json").read_text())["best"]
    assert list(best) == ["qwen3-30b-a3b/256"]
    assert best["qwen3-30b-a3b/256"]["variant"] == "plain"


def test_tuner_file_write_keeps_untuned_entries_and_reports_lost_triggers(tmp_path, capsys):
    """A tuning run replaces the entries of the token counts it tuned, keeps the others (the
    hand-found decode entries), sorts them, and says which replaced entries had a trigger or
    persistent GEMMs (both chosen by whole-layer comparisons the tuner cannot make)."""
    import json
    import shutil

    import tune_triton

    name = "E=128,N=768,device_name=NVIDIA_H200.json"
    src = os.path.join(os.path.dirname(tune_triton.__file__), "..", "moe_policy", "experts",
                       "triton", "configs", name)  # fmt: skip
    shutil.copy(src, tmp_path / name)
    before = json.loads((tmp_path / name).read_text())["configs"]
    entry = {"block_m": 16, "gemm1": {"block_n": 32, "block_k": 64},
             "gemm2": {"block_n": 32, "block_k": 64}}  # fmt: skip
    assert before["8192"].get("persistent") is True  # the shipped file's prefill entry
    tune_triton.write_config_file(SHAPES["qwen3-30b-a3b"],
                                  {"1": entry, "16": entry, "8192": entry},
                                  "NVIDIA H200", "3.6.0", str(tmp_path))  # fmt: skip
    after = json.loads((tmp_path / name).read_text())["configs"]
    assert after["1"] == entry and after["16"] == entry and after["8192"] == entry
    assert {k: after[k] for k in ("2", "4", "6")} == {k: before[k] for k in ("2", "4", "6")}
    assert list(after) == sorted(after, key=int)
    out = capsys.readouterr().out
    assert "kept entries ['2', '4', '6', '64'" in out
    assert "entries ['1'] lose their trigger" in out
    assert "entries ['8192'] lose their persistent; re-run compare_configs.py --variants" in out


def test_gpu_state_line_is_parsed_with_clock_event_reasons():
    """An nvidia-smi line gives clock, power and named clock-event reasons; unavailable fields
    are left out, unknown bits kept as hex, and a line of the wrong shape is refused."""
    from _bench_util import parse_gpu_state, throttle_reasons

    got = parse_gpu_state("1350, 1980, 667.83, 700.00, 54, 0x0000000000000004\n")
    assert got == {"sm_mhz": 1350.0, "max_sm_mhz": 1980.0, "power_w": 667.83,
                   "power_limit_w": 700.0, "temp_c": 54.0, "throttle": ["sw_power_cap"]}  # fmt: skip
    partial = parse_gpu_state("345, 1980, [N/A], [N/A], 36, [N/A]")
    assert partial == {"sm_mhz": 345.0, "max_sm_mhz": 1980.0, "temp_c": 36.0}
    assert throttle_reasons(0x1 | 0x20 | 0x4000) == ["idle", "sw_thermal", "0x4000"]
    assert throttle_reasons(0) == []
    with pytest.raises(ValueError, match="expected 6 fields"):
        parse_gpu_state("1350, 1980")


def test_gpu_state_without_nvidia_smi_is_empty(monkeypatch):
    """No nvidia-smi (a CPU machine) or a failing one: no state, no exception."""
    import subprocess

    from _bench_util import gpu_state

    def missing(*args, **kwargs):
        raise FileNotFoundError("nvidia-smi")

    monkeypatch.setattr(subprocess, "run", missing)
    assert gpu_state() == {}


def test_gpu_state_asks_nvidia_smi_for_the_device_by_uuid(monkeypatch):
    """torch's index counts visible GPUs only (CUDA_VISIBLE_DEVICES=3 makes GPU 3 torch's 0),
    so nvidia-smi is asked by the device's UUID; the index only where torch has no UUID."""
    import subprocess
    import types

    import torch
    from _bench_util import gpu_state, nvidia_smi_id

    assert nvidia_smi_id("58a6e41a-0000-1111", 0) == "GPU-58a6e41a-0000-1111"
    assert nvidia_smi_id("GPU-58a6", 0) == "GPU-58a6"
    assert nvidia_smi_id("MIG-7f3c", 0) == "MIG-7f3c"
    assert nvidia_smi_id(None, 2) == "2" and nvidia_smi_id("", 1) == "1"
    seen = []

    def fake_run(cmd, **kwargs):
        seen.append(cmd)
        return types.SimpleNamespace(stdout="1980, 1980, 300.0, 700.0, 40, 0x0\n")

    monkeypatch.setattr(subprocess, "run", fake_run)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda i: types.SimpleNamespace(uuid=f"uuid-of-{i}"))  # fmt: skip
    assert gpu_state()["sm_mhz"] == 1980.0
    assert gpu_state(1) == gpu_state()
    assert [c[1] for c in seen] == [
        "--id=GPU-uuid-of-0",
        "--id=GPU-uuid-of-1",
        "--id=GPU-uuid-of-0",
    ]


def test_rest_keeps_the_gpu_busy_at_most_the_duty_fraction():
    from _bench_util import rest_s

    assert rest_s(10.0, 1.0) == 0.0
    assert rest_s(10.0, 0.25) == pytest.approx(0.030)  # 10 ms busy, 30 ms idle
    assert rest_s(4.0, 0.5) == pytest.approx(0.004)
    for bad in (0.0, -0.5, 1.5):
        with pytest.raises(ValueError, match="duty must be in"):
            rest_s(1.0, bad)


def test_interleaved_timing_rests_after_every_sample_and_rotates_the_order(monkeypatch):
    """Each sample of each variant is followed by a rest of (1/duty - 1) times its busy time;
    the per-call µs divide the per-replay time by the calls captured in the graph."""
    import time

    import _bench_util

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

    monkeypatch.setattr(_bench_util, "_capture_graph", lambda calls: FakeGraph(calls[0]))
    monkeypatch.setattr(_bench_util, "_event_ms", fake_event_ms)
    monkeypatch.setattr(time, "sleep", sleeps.append)
    import torch

    # a spin kernel goes first in every sample, so the start event waits for the queued replays
    monkeypatch.setattr(torch.cuda, "_sleep", lambda cycles: order.append(("lead", cycles)))
    out = _bench_util.time_graphs_interleaved({"a": ["a", "a"], "b": ["b"]}, 2, 3, 0.25)
    assert out["a"]["us"] == pytest.approx(1000.0)  # 2 ms per replay of a 2-call graph
    assert out["b"]["us"] == pytest.approx(4000.0)
    assert out["a"]["replays"] == 6
    # round 0: a then b; round 1 rotated: b then a; 3 replays per sample after the lead
    lead = [("lead", _bench_util.LEAD_CYCLES)]
    assert order == lead + ["a"] * 3 + lead + ["b"] * 3 + lead + ["b"] * 3 + lead + ["a"] * 3
    assert sleeps == pytest.approx([0.018, 0.036, 0.036, 0.018])


def test_lora_overhead_comes_from_one_interleaved_timing_of_both_layers(monkeypatch):
    seen = {}

    def fake_interleaved(variants, rounds, replays, duty):
        seen.update(variants=dict(variants), rounds=rounds, duty=duty)
        return {"base": {"us": 200.0}, "this": {"us": 250.0}}

    monkeypatch.setattr(kernels, "time_graphs_interleaved", fake_interleaved)
    base, lora = [lambda: None], [lambda: None]
    got = kernels.overhead_pair("triton", base, lora, 0.25)
    assert got == {"overhead_vs_triton": 1.25, "pair_us": {"base": 200.0, "this": 250.0}}
    assert seen["variants"] == {"base": base, "this": lora}
    assert seen["duty"] == 0.25 and seen["rounds"] == kernels.PAIR_ROUNDS


@pytest.mark.parametrize("script", ["kernels", "compare_configs"])
@pytest.mark.parametrize(
    ("value", "message"),
    [("0", "must be in (0, 1], got '0'"), ("1.5", "must be in (0, 1], got '1.5'"),
     ("half", "not a number: 'half'")],
)  # fmt: skip
def test_duty_outside_zero_to_one_is_a_usage_error(script, value, message, monkeypatch, capsys):
    import importlib

    mod = importlib.import_module(script)
    monkeypatch.setattr(sys, "argv", [f"{script}.py", "--duty", value])
    with pytest.raises(SystemExit) as exc:
        mod.main()
    assert exc.value.code == 2
    assert f"argument --duty: {message}" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [("--runs", "0", "must be at least 1, got '0'"), ("--replays", "-3", "must be at least 1"),
     ("--runs", "two", "not an integer: 'two'")],
)  # fmt: skip
def test_kernels_counts_below_one_are_usage_errors(flag, value, message, monkeypatch, capsys):
    """--runs 0 would leave no sweep to write (an IndexError before this check)."""
    monkeypatch.setattr(sys, "argv", ["kernels.py", flag, value])
    with pytest.raises(SystemExit) as exc:
        kernels.main()
    assert exc.value.code == 2
    assert f"argument {flag}: {message}" in capsys.readouterr().err


@pytest.mark.parametrize("script", ["kernels", "compare_configs", "tune_triton", "kernels_batched"])
def test_token_counts_below_one_are_usage_errors(script, monkeypatch, capsys):
    """A batch of 0 tokens is refused when parsing, in every GPU benchmark script."""
    import importlib

    mod = importlib.import_module(script)
    monkeypatch.setattr(sys, "argv", [f"{script}.py", "--tokens", "16", "0"])
    with pytest.raises(SystemExit) as exc:
        mod.main()
    assert exc.value.code == 2
    assert "argument --tokens: must be at least 1, got '0'" in capsys.readouterr().err
