"""CPU checks of ``benchmarks.kernels --table``: fixed-ceiling ratios, the README table and the
targets of a standard sweep, the table of a batched one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import kernels as kt
from benchmarks.common import SHAPES, layer_bytes, layer_flops, lower_bound_us

REPO = Path(__file__).resolve().parents[2]

MIB = 2**20


def _row(shape: str, t: int, impl: str, ratio: float, **extra) -> dict:
    """A timed row ``ratio`` times the fixed-ceiling bound, with rates that match its time."""
    s = SHAPES[shape]
    us = ratio * lower_bound_us(s, t, kt.FIXED_COPY_TBPS, kt.FIXED_MATMUL_TFLOPS)
    return {"shape": shape, "T": t, "impl": impl, "us": us, "ratio": ratio * 0.97,
            "tbps": layer_bytes(s, t) / (us * 1e-6) / 1e12,
            "tflops": layer_flops(s, t) / (us * 1e-6) / 1e12,
            "extra_mem_bytes": MIB, "mem_limit_bytes": 2 * MIB, **extra}  # fmt: skip


def _sweep() -> dict:
    rows = [
        _row("mixtral-8x7b", 1, "triton", 1.12),
        _row("mixtral-8x7b", 1, "triton_lora", 1.4, overhead_vs_triton=1.3),
        _row("mixtral-8x7b", 64, "triton", 1.02),
        _row("mixtral-8x7b", 64, "triton_lora", 1.3, overhead_vs_triton=1.25),
        _row("mixtral-8x7b", 8192, "triton", 1.05, ratio_held=1.07),
        _row("mixtral-8x7b", 8192, "triton_lora", 1.1, overhead_vs_triton=1.05),
        {"shape": "mixtral-8x7b", "T": 16, "impl": "naive_loop", "skipped": "no"},
    ]
    return {"info": {"device": "X"}, "ceilings": {}, "rows": rows}


def test_fixed_ratio_uses_the_fixed_ceilings_not_the_sweeps():
    r = _row("qwen3-30b-a3b", 4096, "triton", 1.37)
    assert kt.fixed_ratio(r) == pytest.approx(1.37)
    assert r["ratio"] != pytest.approx(1.37)  # the sweep's own ceilings are not used


def test_checks_name_each_target_and_point():
    found = {(c.target, c.t): c for c in kt.checks(_sweep())}
    assert found[("bound ratio, T = 1", 1)].met  # 1.12 <= 1.3
    assert found[("bound ratio, T = 1", 1)].own_ceilings == pytest.approx(1.12 * 0.97)
    assert "(own ceilings 1.09)" in found[("bound ratio, T = 1", 1)].line()
    assert found[("no slower than vLLM (ratio)", 1)].limit == 1.16
    assert found[("no slower than vLLM (ratio)", 64)].met  # 1.02 <= 1.03
    assert found[("bound ratio, 16 <= T <= 256", 64)].met
    assert not found[("LoRA / base layer, T >= 64", 64)].met  # 1.25 > 1.2
    assert found[("LoRA / base layer, T = 1", 1)].met  # 1.3 <= 1.35
    assert found[("vLLM time / ours, T >= 4096", 8192)].value == pytest.approx(1.46 / 1.05)
    assert found[("vLLM time / ours, T >= 4096", 8192)].met
    tf = found[("TFLOP/s, Mixtral T = 8192", 8192)]
    assert tf.higher_is_better and tf.met and tf.value > 600
    assert found[("extra memory / budget", 8192)].value == pytest.approx(0.5)
    assert "MISSED" in found[("LoRA / base layer, T >= 64", 64)].line()


def test_markdown_table_row():
    table = kt.markdown_table(_sweep()).splitlines()
    assert table[0] == "| shape | T=1 | T=64 | T=8192 | LoRA × (T≥64) | LoRA × (T=1) |"
    cells = [c.strip() for c in table[2].strip("|").split("|")]
    assert cells[0] == "mixtral-8x7b"
    assert cells[1].endswith("µs 1.12 [1.16]")
    assert cells[2] == "1.02 [1.03]"
    assert cells[3].startswith("1.05 [1.46] (held 1.07; ") and cells[3].endswith(" TF/s)")
    assert cells[4:] == ["1.05–1.25", "1.30"]


def test_cli_prints_table_and_tally(tmp_path):
    path = tmp_path / "sweep.json"
    path.write_text(json.dumps(_sweep()))
    out = subprocess.run([sys.executable, "-m", "benchmarks.kernels", "--table", str(path), "--missed"],
                         capture_output=True, text=True, check=True, cwd=REPO).stdout  # fmt: skip
    assert "| mixtral-8x7b |" in out
    assert "MISSED LoRA / base layer, T >= 64" in out and "met   " not in out
    assert out.rstrip().endswith("1 missed")


@pytest.mark.parametrize(
    ("content", "message"),
    [("{", "not JSON"), ('{"rows": []}', "not a benchmarks.kernels sweep"),
     ('{"info": {}, "ceilings": {}, "rows": [{"shape": "nope", "T": 1, "impl": "triton"}]}',
      "shapes not in benchmarks.common.SHAPES: nope")],
)  # fmt: skip
def test_cli_rejects_bad_input_naming_the_file(tmp_path, content, message):
    path = tmp_path / "bad.json"
    path.write_text(content)
    res = subprocess.run([sys.executable, "-m", "benchmarks.kernels", "--table", str(path)],
                         capture_output=True, text=True, cwd=REPO)  # fmt: skip
    assert res.returncode == 2
    assert str(path) in res.stderr and message in res.stderr


def _batched_row(t: int, impl: str, us: float, **extra) -> dict:
    return {"shape": "qwen3-30b-a3b", "T": t, "impl": impl, "us": us, **extra}


def test_batched_table_shows_each_row_over_the_standard_layer_of_the_same_work():
    """A batched sweep: µs per implementation, and beside each non-standard row its time over
    the standard Triton layer with the same LoRA (the row's ``overhead_vs_<baseline>``)."""
    payload = {"info": {"format": "batched"}, "ceilings": {}, "rows": [
        _batched_row(64, "triton", 40.0),
        _batched_row(64, "triton_lora", 52.0, overhead_vs_triton=1.3),
        _batched_row(64, "batched_triton", 44.0, overhead_vs_triton=1.1),
        _batched_row(64, "batched_triton_lora", 57.2, overhead_vs_triton_lora=1.1),
        {"shape": "qwen3-30b-a3b", "T": 64, "impl": "torch_grouped_mm", "error": "no"},
    ]}  # fmt: skip
    lines = kt.batched_table(payload).splitlines()
    assert lines[0].split() == ["shape", "T", "triton", "triton_lora", "batched_triton",
                                "batched_triton_lora"]  # fmt: skip
    assert lines[1].split() == ["qwen3-30b-a3b", "64", "40.0", "52.0", "44.0", "(1.10x)",
                                "57.2", "(1.10x)"]  # fmt: skip


def test_table_reads_a_batched_sweep_saved_with_meta(tmp_path):
    """A batched sweep saved as ``{"meta", "rows"}`` (``+lora`` names, ``vs_triton``) renders
    like one of today's: the LoRA rows compared with the standard LoRA layer."""
    rows = [
        {"shape": "mixtral-8x7b", "T": 16, "impl": "triton", "us": 30.0, "vs_triton": 1.0},
        {"shape": "mixtral-8x7b", "T": 16, "impl": "triton+lora", "us": 40.0, "vs_triton": 1.0},
        {"shape": "mixtral-8x7b", "T": 16, "impl": "batched_triton+lora", "us": 48.0,
         "vs_triton": 1.2},
    ]  # fmt: skip
    path = tmp_path / "batched.json"
    path.write_text(json.dumps({"meta": {"device": "X", "ceilings": {"copy_tbps": 4.2}},
                                "rows": rows}))  # fmt: skip
    payload = kt.load_sweep(str(path))
    assert payload["info"]["format"] == "batched" and payload["ceilings"] == {"copy_tbps": 4.2}
    by_impl = {r["impl"]: r for r in payload["rows"]}
    assert by_impl["batched_triton_lora"]["overhead_vs_triton_lora"] == 1.2
    assert "overhead_vs_triton" not in by_impl["triton_lora"]  # its old 1.0 was itself
    out = subprocess.run([sys.executable, "-m", "benchmarks.kernels", "--table", str(path)],
                         capture_output=True, text=True, check=True, cwd=REPO).stdout  # fmt: skip
    assert out.splitlines()[1].split()[-2:] == ["48.0", "(1.20x)"]


_SHAPE = {"name": "m", "num_experts": 8, "hidden": 64, "inter": 64, "top_k": 2, "gated": True,
          "activation": "silu"}  # fmt: skip


@pytest.mark.parametrize(
    ("payload", "message"),
    [({"info": {}, "ceilings": {}, "rows": []}, "not a benchmarks.kernels sweep ('rows' is not "
      "a non-empty list)"),
     ({"info": [], "ceilings": {}, "rows": [{}]}, "('info' is not an object)"),
     ({"info": {}, "ceilings": {}, "rows": [1]}, "rows[0]: not an object: 1"),
     ({"info": {}, "ceilings": {}, "rows": [{"shape": "mixtral-8x7b"}]},
      "rows[0]: 'T' must be a token count (an integer >= 1), got None"),
     ({"info": {}, "ceilings": {}, "rows": [{"shape": "mixtral-8x7b", "T": "1", "impl": "triton"}]},
      "rows[0]: 'T' must be a token count"),
     ({"info": {}, "ceilings": {}, "rows": [{"shape": "mixtral-8x7b", "T": 1, "impl": "nope"}]},
      "rows[0]: 'impl' must be one of triton, "),
     ({"info": {}, "ceilings": {}, "rows": [{"shape": "mixtral-8x7b", "T": 1, "impl": "triton",
                                             "us": "x"}]},
      "rows[0]: 'us' must be a finite number, got 'x'"),
     ({"info": {}, "ceilings": {}, "rows": [{"shape": "mixtral-8x7b", "T": 1, "impl": "triton",
                                             "us": 10.0}]},
      "rows[0] (mixtral-8x7b T=1 triton): no tflops, extra_mem_bytes, mem_limit_bytes"),
     ({"info": {"shapes": {"m": {"name": "m"}}}, "ceilings": {},
       "rows": [{"shape": "m", "T": 1, "impl": "triton"}]},
      "info.shapes.m: missing ['activation', 'gated', 'hidden', 'inter', 'num_experts', 'top_k']"),
     ({"info": {"shapes": {"m": {**_SHAPE, "num_experts": 0}}}, "ceilings": {},
       "rows": [{"shape": "m", "T": 1, "impl": "triton"}]},
      "info.shapes.m: 'num_experts' must be an integer >= 1, got 0"),
     ({"meta": [], "rows": []}, "('meta' must be an object, 'rows' a list of objects)")],
    ids=["no-rows", "info-list", "row-int", "no-T", "T-string", "unknown-impl", "us-string",
         "no-memory", "shape-fields", "shape-zero", "meta-list"],
)  # fmt: skip
def test_table_refuses_what_is_no_sweep_naming_file_and_row(tmp_path, monkeypatch, capsys,
                                                             payload, message):  # fmt: skip
    """A saved sweep is checked before it is printed: a row the table cannot read was a
    traceback (a string figure, a missing field), an empty one a table of nothing, exit 0."""
    path = tmp_path / "sweep.json"
    path.write_text(json.dumps(payload))
    monkeypatch.setattr(sys, "argv", ["benchmarks.kernels", "--table", str(path)])
    with pytest.raises(SystemExit) as exc:
        kt.main()
    assert exc.value.code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert message in last and f": error: --table {path}: " in last, last


def test_table_refuses_a_fifo_without_blocking(tmp_path):
    fifo = tmp_path / "sweep.json"
    os.mkfifo(fifo)
    res = subprocess.run([sys.executable, "-m", "benchmarks.kernels", "--table", str(fifo)],
                         capture_output=True, text=True, cwd=REPO, timeout=20)  # fmt: skip
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert (
        res.stderr.strip()
        .splitlines()[-1]
        .endswith(f"error: --table {fifo}: cannot read file: it is a FIFO, not a regular file")
    )


def test_table_of_a_sweep_with_a_recorded_model_shape(tmp_path, capsys, monkeypatch):
    """A --model sweep records its shape; --table reads it from the file (a valid one)."""
    row = {"shape": "m", "T": 1, "impl": "triton", "us": 5.0, "tflops": 1.0,
           "extra_mem_bytes": 1, "mem_limit_bytes": 2}  # fmt: skip
    path = tmp_path / "sweep.json"
    path.write_text(json.dumps({"info": {"shapes": {"m": _SHAPE}}, "ceilings": {}, "rows": [row]}))
    monkeypatch.setattr(kt, "SHAPES", dict(kt.SHAPES))  # the file's shape is registered
    monkeypatch.setattr(sys, "argv", ["benchmarks.kernels", "--table", str(path)])
    kt.main()
    assert "| m | 5.0 µs" in capsys.readouterr().out
