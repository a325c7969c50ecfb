"""CPU checks of the tuning tools: the variants and searches ``tools.compare_configs`` times,
how it picks and merges winners, its main loop with the GPU faked, and how
``tools.tune_triton`` writes a tuned file."""

from __future__ import annotations

import pytest

from benchmarks.common import SHAPES
from moe_policy.experts.triton.config import CONFIG_DIR, SMEM_LIMIT, smem_bytes
from tests.entry_points import main_error
from tools import compare_configs, tune_triton


def test_compare_variants_flip_the_trigger_only_where_dependent_launches_are_on():
    """compare_configs offers the decode trigger flipped where the config launches dependents
    (the shipped H200 Qwen3 T=1 entry sets it: "no_trigger"), and not for prefill configs."""

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
        assert smem_bytes(base.block_m, g, 2 if changed == "gemm1" else 1) <= SMEM_LIMIT
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
    src = CONFIG_DIR / name
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
    with pytest.raises(ValueError, match="no tuned file to merge mixtral-8x7b into"):
        compare_configs.write_best(str(path), str(tmp_path))


def test_best_entries_with_lora_need_a_win_on_one_layer_and_no_loss_on_the_other():
    """--with-lora rows: a variant wins when one layer (base or LoRA) beats shipped by the
    margin and the other loses at most the slack; among winners the lowest sum of the two
    relative times; a variant whose LoRA timing is missing or disagrees gets no verdict."""

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
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA H200")
    monkeypatch.setattr(compare_configs, "measure_ceilings",
                        lambda: {"copy_tbps": 4.0, "matmul_tflops": 700.0})  # fmt: skip
    monkeypatch.setattr(compare_configs, "layer", lambda shape: None)
    monkeypatch.setattr(
        compare_configs, "routing_sets", lambda shape, t, n: [(None, None, None)] * n
    )
    monkeypatch.setattr(compare_configs, "layer_lora", lambda shape, t, n: ["ctx"] * n)
    monkeypatch.setattr(compare_configs, "call_layer",
                        lambda b, c, x, tw, ti, lora=None: torch.ones(4))  # fmt: skip
    monkeypatch.setattr(compare_configs, "time_graphs_interleaved", fake_time)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(sys, "argv", ["tools.compare_configs", "--shapes", "qwen3-30b-a3b",
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

    name = "E=128,N=768,device_name=NVIDIA_H200.json"
    src = CONFIG_DIR / name
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
    assert (
        "entries ['8192'] lose their persistent; re-run python -m tools.compare_configs --variants"
        in out
    )


_GEMM = {"block_n": 32, "block_k": 64}
_ENTRY = {"block_m": 16, "gemm1": _GEMM, "gemm2": _GEMM}


@pytest.mark.parametrize(
    ("log", "message"),
    [(None, "{path}: file not found"),
     ("{", "{path}:1:2: not JSON (Expecting property name enclosed in double quotes)"),
     ([1], "{path}: not a tune_log.json (no 'device', 'triton' and 'points')"),
     ({"device": "X", "triton": "3", "points": {}}, "{path}: no points"),
     ({"device": "X", "triton": "3", "points": {"nope/1": {"best": _ENTRY}}},
      "{path}: points: 'nope/1' is not <shape>/<token count> of a shape in "
      "benchmarks.common.SHAPES"),
     ({"device": "X", "triton": "3", "points": {"mixtral-8x7b": {"best": _ENTRY}}},
      "{path}: points: 'mixtral-8x7b' is not <shape>/<token count> of a shape in "
      "benchmarks.common.SHAPES"),
     ({"device": "X", "triton": "3", "points": {"mixtral-8x7b/1": {}}},
      "{path}: points.mixtral-8x7b/1: no 'best'"),
     ({"device": "X", "triton": "3", "points": {"mixtral-8x7b/1": {"best": {"block_m": 16}}}},
      "{path}: points.mixtral-8x7b/1.best: bad MoE config {{'block_m': 16}}: 'gemm1'")],
    ids=["missing", "not-json", "a-list", "no-points", "unknown-shape", "no-token-count",
         "no-best", "bad-config"],
)  # fmt: skip
def test_tuner_from_log_refuses_what_is_no_log_and_writes_nothing(tmp_path, monkeypatch, capsys,
                                                                  log, message):  # fmt: skip
    """--from-log was a traceback for each of these (FileNotFoundError, JSONDecodeError,
    TypeError, KeyError, ValueError), and wrote a malformed config ({"block_m": 16}) as a
    tuned file without a word."""
    import json

    path = tmp_path / "tune_log.json"
    if log is not None:
        path.write_text(log if isinstance(log, str) else json.dumps(log))
    out = tmp_path / "out"
    line = main_error(tune_triton, monkeypatch, capsys, "--from-log", str(path), "--out", str(out))
    assert line.endswith("error: --from-log " + message.format(path=path)), line
    assert not any(out.iterdir())


def test_tuner_from_log_refuses_a_fifo_and_a_broken_tuned_file_in_out(tmp_path, monkeypatch,
                                                                      capsys):  # fmt: skip
    """A FIFO blocked --from-log forever; a file in --out that is not a tuned file was a
    KeyError traceback after the others were written."""
    import json
    import os

    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    line = main_error(tune_triton, monkeypatch, capsys, "--from-log", str(fifo), "--out",
                       str(tmp_path))  # fmt: skip
    assert line.endswith(f"--from-log {fifo}: cannot read file: it is a FIFO, not a regular file")
    log = tmp_path / "tune_log.json"
    log.write_text(json.dumps({"device": "NVIDIA H200", "triton": "3.6",
                               "points": {"mixtral-8x7b/1": {"best": _ENTRY}}}))  # fmt: skip
    bad = tmp_path / "E=8,N=14336,device_name=NVIDIA_H200.json"
    bad.write_text('{"triton_version": "3.6"}')
    line = main_error(tune_triton, monkeypatch, capsys, "--from-log", str(log), "--out",
                       str(tmp_path))  # fmt: skip
    assert f"error: --out: {bad}: not a tuned config file (" in line
    assert line.endswith("; move it away")
    assert bad.read_text() == '{"triton_version": "3.6"}'


@pytest.mark.parametrize("module", [tune_triton, compare_configs], ids=["tune", "compare"])
def test_gpu_runs_without_the_kernels_say_so_before_any_work(module, tmp_path, monkeypatch,
                                                             capsys):  # fmt: skip
    """The GPU runs check for torch and a CUDA GPU first (``benchmarks.common.cuda_device_name``;
    ``test_kernels`` sees its "no CUDA GPU" line): the tuner spawned its compile workers and
    died in them (a CUDA generator RuntimeError), the comparison on torch.cuda, both
    tracebacks. torch is hidden here, so that no test pays its import."""
    import sys

    monkeypatch.setitem(sys.modules, "torch", None)
    line = main_error(module, monkeypatch, capsys, "--shapes", "mixtral-8x7b", "--tokens", "1",
                       "--out", str(tmp_path))  # fmt: skip
    assert line.endswith("error: the kernels are not installed: pip install 'moe-policy[kernels]'")


@pytest.mark.parametrize(
    ("module", "argv", "message"),
    [(tune_triton, ["--jobs", "-1"], "argument --jobs: must be at least 0, got '-1'"),
     (tune_triton, ["--deadline-s", "nan"], "argument --deadline-s: must be a finite number, got "
      "'nan'"),
     (tune_triton, ["--out", "{file}"], "--out: cannot write to '{file}' (not a directory)"),
     (compare_configs, ["--jobs", "0"], "argument --jobs: must be at least 1, got '0'"),
     (compare_configs, ["--min-gain", "-0.1"], "argument --min-gain: must be in [0, 1), got "
      "'-0.1'"),
     (compare_configs, ["--out", "{file}"], "--out: cannot write to '{file}' (not a directory)")],
    ids=["tune-jobs", "tune-deadline", "tune-out", "compare-jobs", "compare-gain", "compare-out"],
)  # fmt: skip
def test_tool_flags_are_checked_before_any_work(module, argv, message, tmp_path, monkeypatch,
                                                capsys):  # fmt: skip
    """--jobs 0 was a ValueError from the worker pool (compare_configs) and -1 silently 0
    (tune_triton), --deadline-s nan never stopped, a negative --min-gain kept slower
    variants, and --out naming a file failed when the results were written, after the GPU
    work."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    argv = [a.format(file=blocker) for a in argv]
    assert main_error(module, monkeypatch, capsys, *argv).endswith(message.format(file=blocker))


@pytest.mark.parametrize(
    ("best", "message"),
    [("[]", "{path}: not a compare_best.json (no 'device' and 'best')"),
     ('{"device": "NVIDIA H200", "best": {"qwen3-30b-a3b": {}}}',
      "{path}: best: 'qwen3-30b-a3b' is not <shape>/<token count> of a shape in "
      "benchmarks.common.SHAPES"),
     ('{"device": "NVIDIA H200", "best": {"qwen3-30b-a3b/1": 5}}',
      "{path}: best.qwen3-30b-a3b/1: no 'config'"),
     ('{"device": "NVIDIA H200", "best": {"qwen3-30b-a3b/1": {"config": {"block_m": 16}}}}',
      "{path}: best.qwen3-30b-a3b/1.config: bad MoE config {{'block_m': 16}}: 'gemm1'")],
    ids=["a-list", "no-token-count", "no-config", "bad-config"],
)  # fmt: skip
def test_write_best_refuses_what_is_no_compare_best(tmp_path, monkeypatch, capsys, best,
                                                    message):  # fmt: skip
    """--write-best was a traceback for each (TypeError, ValueError, AttributeError, the
    malformed config's ValueError); the shipped tuned files are not touched."""
    path = tmp_path / "compare_best.json"
    path.write_text(best)
    before = {p.name: p.read_text() for p in CONFIG_DIR.iterdir()}
    line = main_error(compare_configs, monkeypatch, capsys, "--write-best", str(path))
    assert line.endswith("error: --write-best " + message.format(path=path)), line
    assert {p.name: p.read_text() for p in CONFIG_DIR.iterdir()} == before


def test_write_best_of_no_entries_says_nothing_was_merged(tmp_path, monkeypatch, capsys):
    """A compare_best.json without winners merged nothing, silently."""
    import sys

    path = tmp_path / "compare_best.json"
    path.write_text('{"device": "NVIDIA H200", "best": {}}')
    monkeypatch.setattr(sys, "argv", ["tools.compare_configs", "--write-best", str(path)])
    compare_configs.main()
    assert capsys.readouterr().out == f"# {path} has no entries: nothing merged\n"


def test_compare_refuses_a_variant_no_point_offers(tmp_path, monkeypatch, capsys):
    """--variants with a misspelt name timed shipped alone and wrote no winner, silently (the
    GPU faked: the names are checked before anything runs on it)."""
    import sys
    import types

    monkeypatch.setattr(compare_configs, "cuda_device_name", lambda why: "NVIDIA H200")
    monkeypatch.setitem(sys.modules, "torch", types.ModuleType("torch"))
    line = main_error(compare_configs, monkeypatch, capsys, "--shapes", "qwen3-30b-a3b",
                       "--tokens", "256", "--variants", "plian", "--out", str(tmp_path))  # fmt: skip
    assert "error: --variants: no point offers plian (offered: " in line and "plain" in line
