"""What the Triton MoE kernels compile to for Hopper, checked without a GPU (``tools.ptx_report``).

The LoRA operands of the GEMM epilogue and the shrink's output rows must move as 16-byte
vectors: as scalars (interleaved slices, a runtime rank mask, a per-column store mask) they
cost up to 22 % of the LoRA layer on the H200.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from tests.entry_points import main_error

pytest.importorskip("triton")

from tools import ptx_report

REPO = Path(__file__).resolve().parents[2]


def test_memory_ops_are_counted_by_width():
    """Loads, stores and async copies are told apart by width; only non-vector loads are scalar."""
    ptx = """
        ld.global.b16 {%rs1}, [%rd1];
        ld.global.v4.b32 {%r1, %r2, %r3, %r4}, [%rd2];
        @%p1 ld.global.b32 %r5, [%rd3];
        st.global.v4.b32 [%rd4], {%r1, %r2, %r3, %r4};
        cp.async.cg.shared.global [%r6], [%rd5], 16;
        cp.async.bulk.tensor.2d.shared::cta.global.mbarrier::complete_tx::bytes [%r7], [%rd6];
        ld.shared.b32 %r8, [%r9];
    """
    ops = ptx_report.memory_ops(ptx)
    assert ops == Counter({
        "ld.global.b16": 1, "ld.global.v4.b32": 1, "ld.global.b32": 1, "st.global.v4.b32": 1,
        "cp.async.cg.shared.global": 1, "cp.async.bulk.tensor": 1,
    })  # fmt: skip
    assert ptx_report.scalar_global_loads(ops) == 2


def _report(*flags: str) -> dict:
    """Run the report as the script does (compiling needs Triton's compiler, not its
    interpreter, which the CPU test session turns on), small tiles for speed."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    cmd = [sys.executable, "-m", "tools.ptx_report", "--json", "--block-m", "64", "--block-n", "64",
           "--block-n2", "128", "--tail-m", "0", "--warps", "4", "--stages", "3", *flags]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def reports() -> dict:
    return {"base": _report(), "lora": _report("--lora")}


def _vector_loads(ops: dict) -> int:
    return sum(n for op, n in ops.items() if op.startswith("ld.global.v"))


@pytest.mark.parametrize("gemm", ["gemm1", "gemm2"], ids=["gemm1-one-dot", "gemm2"])
def test_lora_expand_loads_vectors(gemm, reports):
    """With LoRA the GEMM adds 16-byte loads (u and B) and no 16-bit scalar loads; without
    LoRA it has no global vector loads at all (operands come by async copy)."""
    base, lora = reports["base"][gemm]["ops"], reports["lora"][gemm]["ops"]
    assert _vector_loads(base) == 0 and _vector_loads(lora) > 0, (base, lora)
    assert not any(op.startswith("ld.global.b16") for op in lora), lora
    assert reports["lora"][gemm]["spill_bytes"] == 0


def test_lora_shrink_stores_rows_as_vectors(reports):
    """The shrink stores each row's own adapter columns with vector stores only."""
    ops = reports["lora"]["shrink"]["ops"]
    stores = {op: n for op, n in ops.items() if op.startswith("st.global")}
    assert stores and all(".v" in op for op in stores), stores


def test_refuses_the_interpreter():
    """Under TRITON_INTERPRET=1 the script says why it cannot compile instead of a traceback."""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    out = subprocess.run([sys.executable, "-m", "tools.ptx_report"], capture_output=True,
                         text=True, env=env, cwd=REPO, timeout=120)  # fmt: skip
    assert out.returncode != 0 and "unset TRITON_INTERPRET" in out.stderr


def test_persistent_gemms_flatten_their_tile_loop():
    """A persistent GEMM's tile loop flattens with its K loop into one pipelined loop (two
    ``scf.for`` in the TTGIR: that loop and Triton's copy for an empty K loop). A loop with a
    runtime bound inside a tile (as the LoRA expand's slot loop) would make it three, and the
    next tile's loads would no longer fly during the epilogue."""
    rep = _report("--persistent")
    assert {name: r["loops"] for name, r in rep.items()} == {"gemm1": 2, "gemm2": 2}
    assert ptx_report.loop_count("scf.for %a = ...\n scf.for %b = ...\n scf.forall") == 2


@pytest.mark.parametrize("bins", [512, 1024])
def test_alignment_block_tables_stay_in_registers(bins):
    """The alignment kernels that write the block tables keep their [bins, columns] sentinel
    tiles in registers up to 1,024 bins (16 columns of 1,024 bins spilled 816 bytes a thread,
    and that kernel took 9 us of a Qwen3-Next-80B layer on the H200)."""
    rep = _report("--align-bins", str(bins), "--block-m", "128")
    assert set(rep) == ({"align_offsets", "align_one_pass"} if bins <= 512 else {"align_offsets"})
    assert {name: r["spill_bytes"] for name, r in rep.items()} == dict.fromkeys(rep, 0)


@pytest.mark.parametrize(
    ("flags", "message"),
    [(["--block-m", "100"], "--block-m: block_m must be a power of two from 16 to 256, got 100"),
     (["--block-n2", "48"], "--block-n2: block_n must be a power of two from 16 to 512, got 48"),
     (["--block-k", "0"], "--block-k: block_k must be a power of two from 16 to 512, got 0"),
     (["--warps", "3"], "--warps: num_warps must be 1, 2, 4, 8 or 16, got 3"),
     (["--stages", "0"], "--stages: num_stages must be an integer from 1 to 8, got 0"),
     (["--block-m", "64"], "--tail-m: tail_m must be 0 or a power of two in [16, block_m/2=32], "
      "got 64"),
     (["--arch", "12"], "--arch: one of 80, 86, 87, 89, 90, 100, 103, 110, 120, 121, got 12"),
     (["--align-bins", "3"], "--align-bins: a power of two from 2 to 2048, got 3")],
)  # fmt: skip
def test_tiles_the_kernels_never_launch_are_usage_errors(flags, message, monkeypatch, capsys):
    """Each was a Triton compile traceback (a power-of-two assertion, an arange range), a
    report of a config no launch uses (--stages 0, a 64-row tail of a 64-row block), or, for
    an architecture LLVM does not know, an abort of the whole process."""
    assert main_error(ptx_report, monkeypatch, capsys, *flags).endswith(f"error: {message}")


def test_ptxas_assembles_pre_hopper_targets_without_the_a_suffix():
    """--arch 80 (or 86, 89) compiled, then failed in ptxas on "-arch=sm_80a", which does not
    exist: the suffix is for sm_90 and later, as Triton spells it."""
    ptx = ".version 7.0\n.target sm_80\n.address_size 64\n.visible .entry k()\n{\n  ret;\n}\n"
    regs, spill = ptx_report.ptxas_usage(ptx, 80)
    assert regs >= 0 and spill == 0
