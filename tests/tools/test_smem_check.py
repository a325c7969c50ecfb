"""The Triton MoE's kernels fit pre-Hopper GPUs' shared memory, compiled without the GPU
(``tools.smem_check``): the launcher is dry-run on meta tensors, each recorded launch is
compiled for the part's architecture and its shared memory compared with the opt-in limit.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")

from benchmarks.common import SHAPES
from tools import smem_check

REPO = Path(__file__).resolve().parents[2]


def _run(tmp_path, *flags: str) -> tuple[int, list[dict], str]:
    """The script as a user runs it (compiling needs Triton's compiler, not the interpreter
    the CPU test session turns on); its exit status, JSON results and stdout."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    path = tmp_path / "smem.json"
    cmd = [sys.executable, "-m", "tools.smem_check", "--json", str(path), *flags]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO, timeout=900)
    assert out.returncode in (0, 1), out.stderr[-3000:]
    return out.returncode, json.loads(path.read_text()), out.stdout


def _kernels(results: list[dict], **where) -> list[str]:
    return [r["kernel"] for r in results if all(r[k] == v for k, v in where.items())]


def test_every_kernel_of_qwen3_fits_an_ada_part(tmp_path):
    """L40S (sm_89, 99 KB per block): decode and prefill, LoRA or not, both activation formats.
    The dry run records the launches the launcher makes: decode has no alignment and sums in
    GEMM 2, prefill aligns and sums in its own kernel, LoRA adds a shrink before each GEMM."""
    rc, res, stdout = _run(tmp_path, "--parts", "l40s", "--shapes", "qwen3-30b-a3b",
                           "--tokens", "1", "4096")  # fmt: skip
    assert rc == 0 and all(r["fits"] for r in res), stdout
    assert all(r["limit"] == 101376 and 0 <= r["shared"] <= r["limit"] for r in res)
    std = {"fmt": "standard", "tokens": 1}
    assert _kernels(res, **std, lora=False) == ["moe_gemm_kernel"] * 2
    assert _kernels(res, **std, lora=True) == [
        "lora_shrink_kernel", "moe_gemm_kernel", "lora_shrink_kernel", "moe_gemm_kernel",
        "moe_sum_kernel",
    ]  # fmt: skip
    prefill = _kernels(res, fmt="standard", tokens=4096, lora=False)
    assert prefill[:1] == ["align_count_kernel"] and prefill[-3:] == [
        "moe_gemm_kernel", "moe_gemm_kernel", "moe_sum_kernel",
    ]  # fmt: skip
    assert _kernels(res, fmt="batched", tokens=4096, lora=True).count("_lora_shrink_kernel") == 2
    # the GEMMs are real tiles, not trivially small: the prefill ones use shared memory
    assert min(r["shared"] for r in res if r["kernel"] == "moe_gemm_kernel") > 16 * 1024
    assert "of 99" in stdout


def test_tiles_planned_for_hopper_would_not_fit_and_are_reported(tmp_path):
    """The check can fail: configs planned for Hopper's 200 KB overflow an A10 (sm_86, 99 KB);
    the script exits 1 and marks those launches OVER. This is what the launcher's
    device-aware budget (triton_config.smem_budget) prevents."""
    rc, res, stdout = _run(tmp_path, "--parts", "a10", "--shapes", "mixtral-8x7b",
                           "--tokens", "4096", "--no-lora", "--formats", "standard",
                           "--plan-smem", "204800")  # fmt: skip
    over = [r for r in res if not r["fits"]]
    assert rc == 1 and over, stdout
    assert {r["kernel"] for r in over} == {"moe_gemm_kernel"}
    assert all(r["shared"] > 101376 for r in over)
    assert "OVER" in stdout and f"{len(res) - len(over)} of {len(res)} launches fit" in stdout


def test_fp32_fits_the_h200(tmp_path):
    """fp32 on Hopper, with TMA descriptors and the tuned H200 file: Mixtral's persistent,
    stream-K prefill GEMMs once asked for up to 459 KB of the H200's 227 KB (a launch
    failure the H200 showed); cut for 4-byte operands, every launch fits."""
    rc, res, stdout = _run(tmp_path, "--parts", "h200", "--shapes", "mixtral-8x7b",
                           "--tokens", "4096", "--formats", "standard", "--dtypes", "fp32")  # fmt: skip
    assert rc == 0 and all(r["fits"] for r in res), stdout
    assert all(r["limit"] == 232448 for r in res)
    assert _kernels(res, lora=False).count("moe_gemm_kernel") == 2
    assert all(r["config"]["persistent"] for r in res)


def test_every_kernel_compiles_for_rocm_and_fits(tmp_path):
    """MI300X (gfx942, 64 KB of LDS): the catalog lets ``triton`` run on ROCm; every launch
    compiles for AMD and fits, and none passes an option ROCm's Triton rejects (no TMA or
    dependent launches there: ROCm reports gfx9 parts as compute capability 9)."""
    rc, res, stdout = _run(tmp_path, "--parts", "mi300x", "--shapes", "qwen3-30b-a3b",
                           "--tokens", "1", "4096")  # fmt: skip
    assert rc == 0 and all(r["fits"] and r["error"] is None for r in res), stdout
    assert {r["fmt"] for r in res} == {"standard", "batched"}
    assert all(r["limit"] == 65536 for r in res)


def test_a_launch_option_the_backend_rejects_is_reported():
    """A dependent-launch option on a launch for ROCm (whose Triton backend refuses the
    keyword at launch) is a LaunchOptionError, not a compiled kernel."""
    code = (
        "from tools import smem_check as s\n"
        "_, launches = s.dry_run_standard(s.Call('mi300x', 'qwen3-30b-a3b', 1))\n"
        "gemm = next(x for x in launches if x.name == 'moe_gemm_kernel')\n"
        "gemm.kwargs['launch_pdl'] = False\n"
        "try:\n"
        "    s.compile_launch(gemm, s.PARTS['mi300x'])\n"
        "except s.LaunchOptionError as exc:\n"
        "    print('REJECTED', exc)\n"
        "print('ON_CUDA', s.compile_launch(gemm, s.PARTS['a100']).metadata.shared > 0)\n"
    )  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         cwd=REPO, timeout=600)  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    assert "REJECTED moe_gemm_kernel: Triton's hip backend rejects launch option(s) " \
           "['launch_pdl']" in out.stdout  # fmt: skip
    assert "ON_CUDA True" in out.stdout


@pytest.mark.parametrize(("flags", "message"),
                         [(["--tokens", "0"], "argument --tokens: must be at least 1, got '0'"),
                          (["--parts", "b200"], "argument --parts: invalid choice: 'b200'"),
                          (["--plan-smem", "lots"], "argument --plan-smem: not an integer: 'lots'"),
                          (["--json", "{tmp}"], "--json: cannot write to '{tmp}' (a directory)"),
                          (["--summary-json", "{tmp}/f/s.json"],
                           "--summary-json: cannot write to '{tmp}/f' (not a directory)")])  # fmt: skip
def test_bad_arguments_are_named(flags, message, tmp_path):
    """A bad flag value is an argparse error naming the flag, not a traceback; an output path
    that cannot be written is one before any compile (it was a traceback after all of them)."""
    (tmp_path / "f").write_text("")
    flags = [f.format(tmp=tmp_path) for f in flags]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-m", "tools.smem_check", *flags], capture_output=True,
                         text=True, env=env, cwd=REPO, timeout=120)  # fmt: skip
    assert out.returncode == 2 and message.format(tmp=tmp_path) in out.stderr, out.stderr[-2000:]
    assert "Traceback" not in out.stderr


def test_refuses_the_interpreter():
    """Under TRITON_INTERPRET=1 the script says why it cannot compile instead of a traceback."""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    out = subprocess.run([sys.executable, "-m", "tools.smem_check"], capture_output=True,
                         text=True, env=env, cwd=REPO, timeout=120)  # fmt: skip
    assert out.returncode != 0 and "unset TRITON_INTERPRET" in out.stderr


@pytest.mark.parametrize(
    ("shape", "t", "rows"),
    [("qwen3-30b-a3b", 1, 16), ("qwen3-30b-a3b", 1024, 128), ("mixtral-8x7b", 4096, 2048),
     ("nemotron3-nano", 64, 16)],
)  # fmt: skip
def test_batched_rows_are_twice_the_mean_share(shape, t, rows):
    """Rows per expert of the batched dry run: 2x the uniform mean, >= 16, a power of two."""
    assert smem_check.batched_rows(SHAPES[shape], t) == rows


def test_integer_arguments_specialize_as_triton_does():
    """1 becomes a constant, multiples of 16 are marked divisible ("D"), unless the kernel
    says do_not_specialize; tensors are pointers of their dtype; None is a constant."""
    import torch
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import make_backend

    cuda = make_backend(GPUTarget("cuda", 90, 32))
    p = type("P", (), {"name": "x"})()
    fixed = type("P", (), {"name": "x", "do_not_specialize": True})()
    assert smem_check.specialize(p, 1, cuda) == ("constexpr", 1, None)
    assert smem_check.specialize(fixed, 1, cuda) == ("i32", None, None)
    assert smem_check.specialize(p, 4096, cuda) == ("i32", None, "D")
    assert smem_check.specialize(fixed, 4096, cuda) == ("i32", None, None)
    assert smem_check.specialize(p, 2**33, cuda) == ("i64", None, "D")
    assert smem_check.specialize(p, None, cuda) == ("constexpr", None, None)
    t = torch.empty(2, dtype=torch.bfloat16, device="meta")
    assert smem_check.specialize(p, t, cuda) == ("*bf16", None, "D")
    with pytest.raises(TypeError, match="cannot specialize x"):
        smem_check.specialize(p, "oops", cuda)
