"""CPU checks of the GEMM-ceiling benchmark's bookkeeping: rows computed, FLOPs, the table."""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))

import gemm_ceiling
from _bench_util import SHAPES


def test_padded_rows_counts_whole_blocks_and_tail_tiles():
    """Each expert's pairs fill 128-row blocks; a last block of at most tail_m pairs runs a
    tail_m-row tile; experts without pairs compute nothing."""
    assert gemm_ceiling.padded_rows([256, 257, 0, 1], 128) == 256 + 384 + 0 + 128
    assert gemm_ceiling.padded_rows([256, 257, 0, 1], 128, tail_m=64) == 256 + 320 + 0 + 64
    assert gemm_ceiling.padded_rows([200], 128, tail_m=64) == 256  # 72 > 64: a full block
    assert gemm_ceiling.padded_rows([], 64) == 0
    with pytest.raises(ValueError, match="block_m must be > 0"):
        gemm_ceiling.padded_rows([1], 0)


def test_gemm_flops_follow_the_layer_shapes():
    """Non-gated GEMM 1 is rows x H x I; gated rows x H x 2I; GEMM 2 rows x I x H."""
    nem, mix = SHAPES["nemotron3-nano"], SHAPES["mixtral-8x7b"]
    assert gemm_ceiling.gemm_flops(nem, 10) == (2.0 * 10 * 2688 * 1856, 2.0 * 10 * 1856 * 2688)
    assert gemm_ceiling.gemm_flops(mix, 1)[0] == 2.0 * 4096 * 2 * 14336


def test_our_gemms_needs_exactly_two_gemm_launches():
    names = ["_align_count_kernel", "_moe_gemm_kernel", "_moe_gemm_kernel", "_moe_sum_kernel"]
    assert gemm_ceiling.our_gemms(names) == [1, 2]
    with pytest.raises(RuntimeError, match="expected two _moe_gemm_kernel"):
        gemm_ceiling.our_gemms(names[:2])


def test_table_has_one_line_per_gemm_with_each_implementation():
    per = {i: {"us": 100.0, "tflops_computed": 700.0, "tflops_routed": 600.0}
           for i in gemm_ceiling.IMPLS}  # fmt: skip
    point = {"shape": "qwen3-30b-a3b", "T": 4096, "pairs": 100, "padded_rows": 125,
             "gemms": {"gemm1": per, "gemm2": per}}  # fmt: skip
    lines = gemm_ceiling.table([point]).splitlines()
    assert len(lines) == 4
    assert lines[2].split()[:4] == ["qwen3-30b-a3b", "4096", "1.250", "gemm1"]
    assert lines[3].split()[3:] == ["gemm2"] + ["100.0", "700"] * len(gemm_ceiling.IMPLS)
