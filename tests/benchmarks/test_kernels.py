"""CPU checks of the kernel benchmark's bookkeeping: run merging, the memory budget, the LoRA
overhead's pairing and its usage errors."""

from __future__ import annotations

import json
import os
import re
import sys

import pytest

from benchmarks import common, kernels
from tests.entry_points import main_error


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
    monkeypatch.setattr(sys, "argv", ["benchmarks.kernels", "--merge", *paths, "--out", str(tmp_path),
                                      "--tag", "merged"])  # fmt: skip
    kernels.main()
    merged = json.loads((tmp_path / "merged.json").read_text())
    assert merged["rows"][0]["ratio"] == 1.3 and merged["rows"][0]["ratio_runs"] == [1.4, 1.2, 1.3]
    assert merged["info"]["runs"] == 3
    assert "x1.30 runs 1.40 1.20 1.30" in capsys.readouterr().out

    (tmp_path / "bad.json").write_text('{"info": {},\n "rows": [,]}')
    (tmp_path / "other.json").write_text('{"rows": []}')
    for name, msg in [("bad.json", r"bad.json:2:\d+: not JSON"),
                      ("other.json", r"other.json: not a benchmarks.kernels sweep \(no info, ceilings\)"),
                      ("gone.json", r"gone.json: file not found")]:  # fmt: skip
        monkeypatch.setattr(sys, "argv", ["benchmarks.kernels", "--merge", str(tmp_path / name),
                                          "--out", str(tmp_path)])  # fmt: skip
        with pytest.raises(SystemExit) as exc:
            kernels.main()
        assert exc.value.code == 2
        assert re.search(msg, capsys.readouterr().err)


def test_memory_budget_is_counted_in_allocator_blocks():
    """The budget is two bf16 buffers (plus the LoRA fp32 one), each as the caching
    allocator's 512-byte-multiple block, the unit max_memory_allocated counts in."""
    assert [common.alloc_block(n) for n in (0, 1, 512, 513, 32256)] == [0, 512, 512, 1024, 32256]
    nemo = common.SHAPES["nemotron3-nano"]  # k=6, non-gated N1=I=1856, H=2688
    # T=1: 6*2688*2 = 32256 (a whole block), 6*1856*2 = 22272 -> 22528
    assert kernels.mem_limit_bytes(nemo, 1, lora=False) == 32256 + 22528
    # LoRA: 6*16*(1+1)*4 = 768 fp32 bytes -> 1024
    assert kernels.mem_limit_bytes(nemo, 1, lora=True) == 32256 + 22528 + 1024
    big = kernels.mem_limit_bytes(nemo, 8192, lora=False)
    assert big == 8192 * 6 * (2688 + 1856) * 2  # multiples of 512 already


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


@pytest.mark.parametrize(
    ("flag", "value", "message"),
    [("--runs", "0", "must be at least 1, got '0'"), ("--replays", "-3", "must be at least 2"),
     ("--replays", "1", "must be at least 2, got '1'"), ("--runs", "two", "not an integer: 'two'")],
)  # fmt: skip
def test_kernels_counts_below_one_are_usage_errors(flag, value, message, monkeypatch, capsys):
    """--runs 0 would leave no sweep to write (an IndexError before this check); --replays 1
    would fail every row on the GPU (its p20/p80 need two replays)."""
    monkeypatch.setattr(sys, "argv", ["benchmarks.kernels", flag, value])
    with pytest.raises(SystemExit) as exc:
        kernels.main()
    assert exc.value.code == 2
    assert f"argument {flag}: {message}" in capsys.readouterr().err


def test_batched_format_computes_the_standard_layer():
    """``--format batched`` times what the standard layer computes: each routing set's
    dispatched rows (a tight capacity: the busiest expert's count), through the batched Triton
    layer and combined, give the standard Triton layer's output, with LoRA and without (fp32
    on the CPU, under Triton's interpreter)."""
    torch = pytest.importorskip("torch")
    from moe_policy.experts.testing import make_lora, make_weights, rel_err

    shape = common.MoEShape("tiny", 4, 64, 32, 2, True, "silu")
    cfg = common.experts_config(shape)
    weights = make_weights(cfg, torch.float32, "cpu")
    adapters = make_lora(cfg, num_slots=common.LORA_SLOTS, max_rank=common.LORA_RANK,
                         ranks=[common.LORA_RANK] * common.LORA_SLOTS, dtype=torch.float32,
                         device="cpu")  # fmt: skip
    case = kernels.make_case(shape, 8, weights, adapters, batched=True, device="cpu",
                             dtype=torch.float32)  # fmt: skip
    ids = case.inputs[0][2]
    assert case.batched[0].x.shape[1] == int(torch.bincount(ids.flatten().long()).max())
    for name in ("batched_triton", "batched_triton_lora"):
        impl = kernels.IMPLEMENTATIONS[name]
        ref = kernels.IMPLEMENTATIONS[impl.baseline].build(case)[0]()
        out = kernels.layer_output(case, impl, impl.build(case)[0]())
        assert rel_err(out, ref) < 1e-5, name


def test_a_failed_row_makes_the_exit_status_one_after_writing(tmp_path, monkeypatch):
    """A row that failed keeps its error in the JSON, and the run then exits 1 (a sweep that
    quietly lost a point would look complete)."""
    import json

    path = tmp_path / "k_run1.json"
    error = {"shape": "s", "T": 1, "impl": "triton", "error": "RuntimeError: boom"}
    path.write_text(json.dumps(_payload(4.0, [_row(8, 1.2), error])))
    monkeypatch.setattr(kernels, "plot_ratios", lambda *a, **k: None)
    monkeypatch.setattr(sys, "argv", ["benchmarks.kernels", "--merge", str(path), "--out",
                                      str(tmp_path), "--tag", "merged"])  # fmt: skip
    with pytest.raises(SystemExit, match="1 of 2 rows failed"):
        kernels.main()
    assert json.loads((tmp_path / "merged.json").read_text())["rows"][1] == error


def test_a_run_without_a_gpu_says_so(monkeypatch, capsys):
    """Without a CUDA GPU a sweep was a traceback from torch.cuda ("Torch not compiled with
    CUDA enabled"); the --out folder is checked before."""
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    line = main_error(kernels, monkeypatch, capsys, "--shapes", "mixtral-8x7b", "--tokens", "1")
    assert line.endswith("error: no CUDA GPU: the benchmark times the kernels on one "
                         "(--table and --merge need none)")  # fmt: skip


@pytest.mark.parametrize(
    ("argv", "message"),
    [(["--held", "-1"], "argument --held: must be at least 0, got '-1'"),
     (["--held", "inf"], "argument --held: must be a finite number, got 'inf'"),
     (["--held", "nan"], "argument --held: must be a finite number, got 'nan'"),
     (["--tag", "a/b"], "--tag: a file name without a folder, got 'a/b'"),
     (["--tag", ""], "--tag: a file name without a folder, got ''"),
     (["--missed"], "--missed goes with --table"),
     (["--table", "x.json", "--merge", "y.json"], "argument --merge: not allowed with argument "
      "--table")],
    ids=["held-negative", "held-inf", "held-nan", "tag-folder", "tag-empty", "missed",
         "table-and-merge"],
)  # fmt: skip
def test_flags_that_would_hang_or_be_ignored_are_usage_errors(monkeypatch, capsys, argv,
                                                              message):  # fmt: skip
    """--held inf held the GPU forever, a negative or NaN --held skipped silently, a --tag with
    a folder failed at the end of the sweep, --missed without --table was ignored."""
    assert main_error(kernels, monkeypatch, capsys, *argv).endswith(message)


def test_an_out_that_is_a_file_is_named_before_any_work(tmp_path, monkeypatch, capsys):
    """--out FILE was a FileExistsError traceback from os.makedirs."""
    path = tmp_path / "k_run1.json"
    path.write_text(json.dumps(_payload(4.0, [_row(8, 1.2)])))
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    line = main_error(kernels, monkeypatch, capsys, "--merge", str(path), "--out", str(blocker))
    assert line.endswith(f"error: --out: cannot write to '{blocker}' (not a directory)")


def test_merge_refuses_a_fifo_and_an_empty_sweep(tmp_path, monkeypatch, capsys):
    """A FIFO given to --merge blocked forever; a sweep without rows was merged into a file
    of none (exit 0)."""
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    empty = tmp_path / "empty.json"
    empty.write_text(json.dumps(_payload(4.0, [])))
    for path, why in [(fifo, "cannot read file: it is a FIFO, not a regular file"),
                      (empty, "not a benchmarks.kernels sweep ('rows' is not a non-empty list)")]:  # fmt: skip
        line = main_error(
            kernels, monkeypatch, capsys, "--merge", str(path), "--out", str(tmp_path)
        )
        assert line.endswith(f"error: --merge {path}: {why}")
    assert not (tmp_path / "kernels.json").exists()


@pytest.mark.parametrize(
    ("over", "message"),
    [({"quantization_config": {"quant_method": "fp8"}},
      "the Triton kernels run bf16/fp16 experts; this model's are quantized (fp8)"),
     ({"num_experts": 2048}, "2048 experts per rank; the kernels run at most 1024")],
)  # fmt: skip
def test_model_the_kernels_cannot_run_is_refused(tmp_path, monkeypatch, capsys, over, message):
    """--model took a quantized model (timed as bf16 weights: not its layer) or one with more
    experts than the kernels run, as moe-policy tune refuses them."""
    cfg = {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
           "num_experts": 128, "num_experts_per_tok": 8, "hidden_size": 4096,
           "moe_intermediate_size": 1536, "hidden_act": "silu", **over}  # fmt: skip
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    monkeypatch.setattr(kernels, "SHAPES", dict(kernels.SHAPES))
    line = main_error(kernels, monkeypatch, capsys, "--model", str(path))
    assert line.endswith(f"error: --model {path}: {message}")
