"""``moe-policy tune`` on a machine without a GPU: every bad input is one error line naming its
origin (exit 2) before any GPU work, the candidates it would time, its table, and the kernels
picking a written file up from ``MOE_POLICY_TUNED_CONFIG_DIR``."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from benchmarks.common import SHAPES
from moe_policy.cli import tune as tune_cli
from moe_policy.experts.triton import config as tc
from moe_policy.experts.triton.tuning import report, search
from tests.cli.runner import Run, run_cli


def run_tune(*args: str, env: dict[str, str] | None = None) -> Run:
    return run_cli("tune", *args, env=env)


def error_line(out: Run) -> str:
    assert out.returncode == 2, out.stdout + out.stderr
    lines = out.errors()
    assert len(lines) == 1 and "Traceback" not in out.stderr, out.stderr
    assert lines[0].startswith("moe-policy: error: ")
    return lines[0]


@pytest.fixture
def hf_config(tmp_path):
    def write(**over):
        cfg = {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
               "num_experts": 128, "num_experts_per_tok": 8, "hidden_size": 4096,
               "moe_intermediate_size": 1536, "hidden_act": "silu", "torch_dtype": "bfloat16"}  # fmt: skip
        cfg.update(over)
        path = tmp_path / "config.json"
        path.write_text(json.dumps(cfg))
        return str(path)

    return write


def test_no_gpu_is_one_error_after_the_inputs_check(hf_config, tmp_path):
    line = error_line(run_tune("--model", hf_config(), "--out", str(tmp_path / "tuned")))
    assert line.endswith("no CUDA GPU: tuning times the kernels on the GPU they will run on")
    assert (tmp_path / "tuned").is_dir()  # the directory was checked (created, written) first


def test_unwritable_directory_is_named(hf_config, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    line = error_line(run_tune("--model", hf_config(), "--out", str(blocker / "sub")))
    assert "cli:--out: cannot write to" in line and "Not a directory" in line


def test_directory_from_the_environment_or_none(hf_config, tmp_path):
    blocker = tmp_path / "f"
    blocker.write_text("")
    line = error_line(run_tune("--model", hf_config(), env={tc.TUNED_DIR_ENV: str(blocker / "x")}))
    assert f"env:{tc.TUNED_DIR_ENV}: cannot write to" in line
    line = error_line(run_tune("--model", hf_config()))
    assert line.endswith(f"cli:--out: no directory: give --out DIR or set {tc.TUNED_DIR_ENV}")


@pytest.mark.parametrize(("over", "args", "want"), [
    ({"quantization_config": {"quant_method": "fp8"}}, (),
     "the Triton kernels run bf16/fp16 experts; this model's are quantized (fp8)"),
    ({"hidden_act": "relu2", "is_gated": True}, (), "relu2 experts are non-gated"),
    ({"hidden_act": "mish"}, (), "unknown activation 'mish'"),
    ({"num_experts": 2048}, ("--ep", "1"), "2048 experts per rank; the kernels run at most 1024"),
    ({}, ("--tp", "5"), "cli:--tp: 5 does not divide the expert intermediate size 1536"),
    ({}, ("--ep", "3"), "cli:--ep: 3 does not divide the expert count 128"),
])  # fmt: skip
def test_models_the_kernels_cannot_run(hf_config, tmp_path, over, args, want):
    line = error_line(run_tune("--model", hf_config(**over), "--out", str(tmp_path), *args))
    assert want in line


def test_missing_model_file_names_it(tmp_path):
    line = error_line(run_tune("--model", str(tmp_path / "nope.json"), "--out", str(tmp_path)))
    assert "nope.json" in line and "not found" in line


def test_rank_shapes_split_the_layer(hf_config):
    shape, quant = tune_cli.model_shape(hf_config(), tp=2, ep=4)
    assert quant == "none"
    assert (shape.num_experts, shape.top_k, shape.inter, shape.hidden) == (32, 2, 768, 4096)
    assert shape.name.endswith("-tp2-ep4")


@pytest.mark.parametrize("t", [1, 16, 256, 1024, 4096])
def test_candidates_start_with_the_heuristic_and_fit(t):
    s = SHAPES["qwen3-235b-a22b"]
    cands = search.candidates(s, t)
    assert cands[0] == tc.heuristic_config(t, s.num_experts, s.top_k, s.hidden, s.inter, s.gated)
    assert len(cands) == len(set(cands)) > 4
    for c in cands:
        assert tc.MoEConfig.from_dict(c.to_dict()) == c
        for g, b in ((c.gemm1, 2), (c.gemm2, 1)):
            assert tc.smem_bytes(c.block_m, g, b) <= tc.SMEM_LIMIT
    if t >= 1024:
        assert any(c.persistent for c in cands) and any(not c.persistent for c in cands)


def test_report_table_and_tuned_file_round_trip(tmp_path, monkeypatch, capsys):
    s = SHAPES["qwen3-235b-a22b"]
    best = search.candidates(s, 256)[3]
    rows = [{"T": 256, "bound_us": 1000.0, "heuristic_us": 1100.0, "tuned_us": 1000.0,
             "config": best.to_dict(), "candidates": 9}]  # fmt: skip
    table = report.report_table(rows)
    assert table.splitlines()[2] == "| 256 | 1100.0 | 1000.0 | +10.0% | 1.00 |"
    path = report.write_outputs(s, "NVIDIA H200", rows, str(tmp_path))
    assert Path(path).name == "E=128,N=1536,device_name=NVIDIA_H200.json"
    assert json.loads((tmp_path / "tune_report.json").read_text())["rows"] == rows
    try:
        import matplotlib  # noqa: F401
    except ImportError:  # no PNG, and the line says how to get one
        assert "pip install 'moe-policy[plots]'" in capsys.readouterr().out
        assert not (tmp_path / "tune_report.png").exists()
    else:
        assert (tmp_path / "tune_report.png").stat().st_size > 0
    monkeypatch.setenv(tc.TUNED_DIR_ENV, str(tmp_path))
    tc.load_tuned.cache_clear()
    try:
        assert tc.get_config(256, 128, 8, 4096, 1536, True, "NVIDIA H200") == best
        assert tc.get_config(200, 128, 8, 4096, 1536, True, "NVIDIA H200") == best
    finally:
        tc.load_tuned.cache_clear()


def test_a_new_run_keeps_the_token_counts_it_does_not_tune(tmp_path):
    s = SHAPES["qwen3-235b-a22b"]
    old, new = search.candidates(s, 1)[1], search.candidates(s, 256)[2]
    row = {"T": 256, "bound_us": 1000.0, "heuristic_us": 1100.0, "tuned_us": 1000.0,
           "config": new.to_dict(), "candidates": 9}  # fmt: skip
    report.write_outputs(s, "NVIDIA H200", [{**row, "T": 1, "config": old.to_dict()}],
                         str(tmp_path))  # fmt: skip
    path = report.write_outputs(s, "NVIDIA H200", [row], str(tmp_path))
    assert tc.read_tuned_file(path) == {1: old, 256: new}
    assert list(json.loads(Path(path).read_text())["configs"]) == ["1", "256"]


def test_a_file_that_is_not_a_tuned_file_stops_the_run_before_tuning(tmp_path, monkeypatch):
    """Without a GPU here, the GPU check is replaced; the run stops on the file, which it
    leaves as it was, before any tuning."""
    s = SHAPES["qwen3-235b-a22b"]
    bad = Path(report.tuned_file_path(s, "NVIDIA H200", str(tmp_path)))
    bad.write_text('{"configs": {"1": {"block_m": 16}}}')
    monkeypatch.setattr(tune_cli, "require_gpu", lambda: "NVIDIA H200")
    monkeypatch.setattr(search, "tune", lambda *a: pytest.fail("tuned despite the bad file"))
    args = argparse.Namespace(model="qwen3-30b-a3b", tp=1, ep=1, tokens=[1], lora=False,
                                       out=str(tmp_path), jobs=1, rounds=1)  # fmt: skip
    monkeypatch.setattr(tune_cli, "model_shape", lambda *a: (s, "none"))
    with pytest.raises(tune_cli.TuneError) as err:
        tune_cli.run(args)
    msg = str(err.value)
    assert msg.startswith(f"cli:--out: {bad}: not a tuned config file") and "move it away" in msg
    assert bad.read_text() == '{"configs": {"1": {"block_m": 16}}}'


def test_an_out_that_is_a_file_says_so(hf_config, tmp_path):
    """An existing file as --out read "(File exists)", which does not say what is wrong."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    line = error_line(run_tune("--model", hf_config(), "--out", str(blocker)))
    assert line.endswith(f"cli:--out: cannot write to '{blocker}' (not a directory)")


@pytest.mark.parametrize("what", ["fifo", "report-dir"])
def test_what_the_run_would_block_on_or_fail_to_write_stops_it_first(tmp_path, monkeypatch,
                                                                      what):  # fmt: skip
    """A FIFO where the tuned file goes blocked the run's read of the earlier file forever; a
    directory named tune_report.json failed the run after the tuning (a traceback). Both stop
    it before any tuning now (the GPU check replaced, as above)."""
    import os
    import signal

    s = SHAPES["qwen3-235b-a22b"]
    if what == "fifo":
        bad = Path(report.tuned_file_path(s, "NVIDIA H200", str(tmp_path)))
        os.mkfifo(bad)
        want = f"cli:--out: {bad}: not a tuned config file (not a regular file)"
    else:
        bad = tmp_path / "tune_report.json"
        bad.mkdir()
        want = f"cli:--out: {bad} is not a regular file"
    monkeypatch.setattr(tune_cli, "require_gpu", lambda: "NVIDIA H200")
    monkeypatch.setattr(tune_cli, "model_shape", lambda *a: (s, "none"))
    monkeypatch.setattr(search, "tune", lambda *a: pytest.fail("tuned despite the bad path"))
    args = argparse.Namespace(model="qwen3-30b-a3b", tp=1, ep=1, tokens=[1], lora=False,
                              out=str(tmp_path), jobs=1, rounds=1)  # fmt: skip

    def blocked(*_: object) -> None:
        raise TimeoutError("the run blocked on the FIFO")

    old = signal.signal(signal.SIGALRM, blocked)
    signal.alarm(10)
    try:
        with pytest.raises(tune_cli.TuneError) as err:
            tune_cli.run(args)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    assert str(err.value).startswith(want) and "move it away" in str(err.value)
