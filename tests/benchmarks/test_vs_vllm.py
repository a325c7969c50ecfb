"""CPU checks of the side-by-side benchmark against vLLM's Triton kernel: extracting vLLM's
kernel from a wheel (a wheel-shaped zip written here; the real one is not in the repository),
vLLM's config choice and grid rows, the table and misses of the saved run the docs cite, and
its usage errors."""

from __future__ import annotations

import json
import re
import zipfile
from pathlib import Path

import pytest

from benchmarks import vs_vllm
from benchmarks.common import MoEShape

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "benchmarks" / "results" / "vs_vllm_h200.json"

#: A stand-in for vLLM's fused_moe.py: vLLM imports that must not be copied, the three
#: functions the benchmark takes, and one it must leave.
FAKE_MODULE = """
import vllm.envs as envs
from vllm.platforms import current_platform
from vllm.triton_utils import tl, triton


@triton.jit
def write_zeros_to_output(c_ptr, N):
    pass


@triton.jit
def fused_moe_kernel(a_ptr, N, BLOCK_SIZE_M: tl.constexpr):
    write_zeros_to_output(a_ptr, N)


def fused_experts_impl(x):
    raise AssertionError("not extracted")


def get_default_config(M, E, N, K, topk, dtype, block_shape=None):
    if envs.VLLM_BATCH_INVARIANT or current_platform.is_rocm():
        raise AssertionError("stubbed")
    return {"BLOCK_SIZE_M": 16 if M <= 32 else 64, "E": E, "N": N, "K": K}
"""


def _wheel(tmp_path: Path, module: str | None = FAKE_MODULE) -> Path:
    path = tmp_path / "vllm-0.0.0-py3-none-any.whl"
    prefix = "vllm/model_executor/layers/fused_moe/"
    with zipfile.ZipFile(path, "w") as zf:
        if module is not None:
            zf.writestr(prefix + "fused_moe.py", module)
        zf.writestr(prefix + "configs/E=8,N=64,device_name=NVIDIA_H200.json",
                    json.dumps({"1": {"BLOCK_SIZE_M": 16}, "64": {"BLOCK_SIZE_M": 32},
                                "256": {"BLOCK_SIZE_M": 64}, "triton_version": "3.6"}))  # fmt: skip
        zf.writestr(prefix + "configs/E=8,N=64,device_name=NVIDIA_H200,dtype=fp8_w8a8.json", "{}")
    return path


def test_extract_takes_the_kernel_and_bf16_configs_only(tmp_path):
    """The extracted module holds the three functions (decorators kept) and no vLLM import;
    it imports without vLLM; the fp8 config file is left behind."""
    pytest.importorskip("triton")
    dest = tmp_path / "x"
    assert vs_vllm.extract_vllm(str(_wheel(tmp_path)), str(dest)) == [
        "E=8,N=64,device_name=NVIDIA_H200.json"
    ]
    text = (dest / "vllm_moe.py").read_text()
    assert not re.search(r"^\s*(import|from) vllm", text, re.MULTILINE)
    assert "fused_experts_impl" not in text
    assert text.count("@triton.jit") == 2
    module = vs_vllm.load_vllm(str(dest))
    assert module.get_default_config(16, 8, 64, 32, 2, None) == {
        "BLOCK_SIZE_M": 16, "E": 8, "N": 64, "K": 32
    }  # fmt: skip
    assert sorted(p.name for p in (dest / "configs").iterdir()) == [
        "E=8,N=64,device_name=NVIDIA_H200.json"
    ]


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda d: d / "missing.whl", "file not found"),
        (lambda d: (d / "text.whl").write_text("not a zip") and d / "text.whl", "zip"),
        (lambda d: _wheel(d, module=None), "not a vLLM wheel"),
        (lambda d: _wheel(d, module="def get_default_config():\n    pass\n"),
         "no write_zeros_to_output, fused_moe_kernel"),
    ],
    ids=["missing", "not-a-zip", "no-module", "no-kernel"],
)  # fmt: skip
def test_extract_errors_name_the_flag_and_file(tmp_path, capsys, make, message):
    path = make(tmp_path)
    assert vs_vllm.main(["--extract", str(path), "--vllm-dir", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"vs_vllm: error: cli:--extract: {path}")
    assert message in err


def test_a_run_needs_the_extracted_kernel_and_a_gpu(tmp_path, capsys):
    assert vs_vllm.main(["--vllm-dir", str(tmp_path / "none")]) == 2
    assert "run --extract WHEEL first" in capsys.readouterr().err
    pytest.importorskip("triton")
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    vs_vllm.extract_vllm(str(_wheel(tmp_path)), str(tmp_path / "x"))
    assert vs_vllm.main(["--vllm-dir", str(tmp_path / "x")]) == 2
    assert "no CUDA GPU" in capsys.readouterr().err


def test_vllm_config_is_its_nearest_tuned_entry_or_its_default(tmp_path):
    """vLLM picks the tuned entry nearest in plain distance (not log scale), else its
    default; the file is looked up under vLLM's spelling of the device."""
    pytest.importorskip("triton")
    dest = tmp_path / "x"
    vs_vllm.extract_vllm(str(_wheel(tmp_path)), str(dest))
    module = vs_vllm.load_vllm(str(dest))
    shape = MoEShape("s", 8, 32, 64, 2, True, "silu")
    table = vs_vllm.vllm_tuned_table(str(dest), shape, "NVIDIA H200 NVL")
    assert table is not None and sorted(table) == [1, 64, 256]
    assert vs_vllm.vllm_config(module, table, shape, 100) == ({"BLOCK_SIZE_M": 32}, "tuned")
    assert vs_vllm.vllm_config(module, table, shape, 170) == ({"BLOCK_SIZE_M": 64}, "tuned")
    assert vs_vllm.vllm_config(module, table, shape, 100, tuned=False)[1] == "default"
    assert vs_vllm.vllm_tuned_table(str(dest), shape, "NVIDIA H100 80GB HBM3") is None


@pytest.mark.parametrize(
    ("rows", "top_k", "e", "bm", "aligned", "want"),
    [
        (1, 8, 256, 16, False, 8 * 16),  # one pair per block
        (16, 8, 256, 16, True, 128 * 16),  # fewer pairs than experts: at most a block each
        (64, 8, 64, 32, True, 512 + 64 * 31),  # the padded bound
        (512, 1, 64, 32, True, 512 + 64 * 31),  # GEMM 2: rows are pairs, top_k 1
        (4, 1, 8, 16, True, 4 * 16),  # fewer rows than a block
    ],
)
def test_vllm_rows_are_its_sorted_id_rows(rows, top_k, e, bm, aligned, want):
    assert vs_vllm.vllm_rows(rows, top_k, e, bm, aligned) == want


def test_the_saved_run_is_the_docs_table_and_its_misses(capsys):
    """``--table`` on the cited run prints the table docs/performance.md shows, and the docs'
    count of missed targets is the run's."""
    assert vs_vllm.main(["--table", str(RESULTS)]) == 0
    out = capsys.readouterr().out
    table, _, rest = out.partition("\n\n")
    doc = (REPO / "docs" / "performance.md").read_text()
    assert table.strip() in doc
    targets = [line for line in rest.splitlines()[1:] if "heuristic" not in line]
    stated = re.search(r"(\d+) of the 126 × 3 checks", doc)
    assert stated is not None and int(stated.group(1)) == len(targets)
    assert len({(r["shape"], r["T"]) for r in json.loads(RESULTS.read_text())["rows"]}) == 126


def test_table_refuses_a_file_that_is_not_a_run(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"rows": [{"shape": "s"}]}))
    assert vs_vllm.main(["--table", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"cli:--table: {bad}: not a vs_vllm run" in err


_GOOD_ROW = {"shape": "s", "T": 1, "bound_us": 1.0, "us": {"ours": 1.0, "vllm": 1.0}}


@pytest.mark.parametrize(
    ("payload", "message"),
    [({"rows": []}, "not a vs_vllm run (no list of rows)"),
     ([1, 2], "not a vs_vllm run (no list of rows)"),
     ({"rows": [{**_GOOD_ROW, "T": True}]},
      "rows[0]: 'T' must be a token count (an integer >= 1), got True"),
     ({"rows": [{**_GOOD_ROW, "us": {"ours": "1", "vllm": 1.0}}]},
      "rows[0]: 'us.ours' must be a number > 0, got '1'"),
     ({"rows": [{**_GOOD_ROW, "us": {"ours": 1e400, "vllm": 1.0}}]},
      "rows[0]: 'us.ours' must be a number > 0, got inf"),
     ({"rows": [{**_GOOD_ROW, "us": {"ours": 1.0, "vllm": 1.0, "ours_heur": "x"}}]},
      "rows[0]: 'us.ours_heur' must be a number > 0, got 'x'"),
     ({"rows": [{**_GOOD_ROW, "bound_us": "nan"}]},
      "rows[0]: 'bound_us' must be a number > 0, got 'nan'")],
    ids=["no-rows", "a-list", "T-bool", "us-string", "us-inf", "heuristic-string", "bound-nan"],
)  # fmt: skip
def test_table_checks_every_row_it_prints(tmp_path, capsys, payload, message):
    """A time the table formats or compares was a traceback as a string, an infinite time read
    as "inf % slower", a run without rows printed an empty table and "every target met"."""
    bad = tmp_path / "run.json"
    bad.write_text(json.dumps(payload).replace("Infinity", "1e400"))
    assert vs_vllm.main(["--table", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"vs_vllm: error: cli:--table: {bad}: ")
    assert message in err


def test_table_and_extract_refuse_a_fifo_without_blocking(tmp_path):
    """--table and --extract on a FIFO blocked forever (json and zipfile read it)."""
    import os
    import subprocess
    import sys

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for flag in ("--table", "--extract"):
        out = subprocess.run([sys.executable, "-m", "benchmarks.vs_vllm", flag, str(fifo)],
                             capture_output=True, text=True, cwd=REPO, timeout=20)  # fmt: skip
        assert out.returncode == 2, out.stderr
        assert out.stderr == (f"vs_vllm: error: cli:{flag}: {fifo}: cannot read file: it is a "
                              "FIFO, not a regular file\n")  # fmt: skip


def test_extract_into_a_folder_it_cannot_write_names_it(tmp_path, capsys):
    """--vllm-dir naming a file was a NotADirectoryError traceback."""
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    assert vs_vllm.main(["--extract", str(_wheel(tmp_path)), "--vllm-dir", str(blocker)]) == 2
    err = capsys.readouterr().err
    assert (
        err == f"vs_vllm: error: cli:--vllm-dir: cannot write {blocker}/configs (Not a directory)\n"
    )


@pytest.mark.parametrize(
    ("argv", "message"),
    [(["--deadline", "nan"], "argument --deadline: must be a finite number, got 'nan'"),
     (["--deadline", "-5"], "argument --deadline: must be greater than 0, got '-5'"),
     (["--table", "a.json", "--extract", "b.whl"],
      "argument --extract: not allowed with argument --table")],
)  # fmt: skip
def test_flags_that_would_be_ignored_are_usage_errors(capsys, argv, message):
    """--deadline nan never stopped a run and --deadline -5 stopped it before the first point;
    --extract beside --table was ignored."""
    with pytest.raises(SystemExit) as exc:
        vs_vllm.main(argv)
    assert exc.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].endswith(message)


def test_an_out_that_is_a_file_is_named_before_the_gpu_check(tmp_path, capsys):
    pytest.importorskip("triton")
    vs_vllm.extract_vllm(str(_wheel(tmp_path)), str(tmp_path / "x"))
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    assert vs_vllm.main(["--vllm-dir", str(tmp_path / "x"), "--out", str(blocker)]) == 2
    assert capsys.readouterr().err == (
        f"vs_vllm: error: cli:--out: cannot write to '{blocker}' (not a directory)\n"
    )
