"""The launch plan as a value: made from shapes, dtype, device limits and the tile config on
any machine, no tensors, no device queries, no module state."""

from __future__ import annotations

import dataclasses

import pytest

pytest.importorskip("triton")

from moe_policy.experts.base import ExpertsConfig
from moe_policy.experts.triton import config as tc
from moe_policy.experts.triton.device import DeviceLimits
from moe_policy.experts.triton.launch import MoEProblem, narrow_tail, plan_launch

H200 = DeviceLimits(num_sms=132, device_name="NVIDIA H200", tile_sms=132, pdl=True, tma=True)
ADA = DeviceLimits(num_sms=142, smem_limit=72 * 1024, device_name="NVIDIA L40S", tile_sms=142)
QWEN3 = ExpertsConfig(128, 2048, 768, 8, "silu")
MIXTRAL = ExpertsConfig(8, 4096, 14336, 2, "silu")
PERSISTENT = tc.MoEConfig(
    128, tc.GemmConfig(128, 64, 8, 8, 4, one_dot=True, tma=True),
    tc.GemmConfig(256, 64, 8, 8, 4, tma=True), persistent=True,
)  # fmt: skip


def test_decode_without_lora_sums_in_gemm2_and_launches_dependents_where_the_device_can():
    plan = plan_launch(MoEProblem.of(QWEN3, 1, 2), H200)
    assert plan.naive and plan.fused_sum and plan.sum_block_h is None
    assert plan.num_blocks == 8 and plan.tail_m == 0 and not plan.persistent
    assert plan.pdl == plan.config.pdl  # no LoRA: the config says
    g1, g2 = plan.gemm1, plan.gemm2
    assert g2.constexprs["SUM_K"] == 8 and g1.constexprs["ZERO_CNT"] > 0
    assert g1.constexprs["PDL"] is False  # the call's first kernel
    assert not plan_launch(MoEProblem.of(QWEN3, 1, 2), ADA).pdl


def test_lora_calls_launch_dependents_and_never_persistent():
    problem = MoEProblem.of(QWEN3, 4096, 2, lora_slots=4, lora_rank=16)
    plan = plan_launch(problem, H200, PERSISTENT)
    assert plan.pdl and not plan.persistent and not plan.stream_k
    assert plan.tail_m == tc.default_tail_m(128)  # a persistent entry run per tile
    assert plan.adapter_order and plan.lora_b_ahead
    assert plan.gemm1.constexprs["PDL_LATE"] and plan.shrink1 == {"pdl": True, "trigger": True}
    assert plan.sum_block_h == 512  # H = 2048 in blocks of at most 512
    assert not plan_launch(problem, ADA, PERSISTENT).pdl


def test_persistent_grids_are_one_program_per_sm_with_stream_k_where_memory_allows():
    plan = plan_launch(MoEProblem.of(MIXTRAL, 1024, 2), H200, PERSISTENT)
    assert plan.persistent and plan.tail_m == 0
    assert plan.gemm1.grid == plan.gemm2.grid == 132
    # Mixtral's N1 = 28672 > H leaves room beside GEMM 2's output: stream-K, stable alignment
    assert plan.stream_k and plan.stable_alignment
    assert plan.stream_k_elems == 132 * 128 * 256
    # Qwen3's N1 = 1536 < H = 2048: no room
    qwen = plan_launch(MoEProblem.of(QWEN3, 4096, 2), H200, PERSISTENT)
    assert qwen.persistent and not qwen.stream_k and qwen.stream_k_elems == 0
    per_tile = dataclasses.replace(plan, persistent=False, stream_k=False)
    assert per_tile.gemm1.grid > 132 and per_tile.tail_m == tc.default_tail_m(128)


def test_narrow_last_n_tiles_and_tma_boxes():
    assert narrow_tail(200, 64) == 16 and narrow_tail(88, 64) == 32 and narrow_tail(256, 64) == 0
    assert narrow_tail(100, 64) == 0  # 36 columns left: more than half a tile runs full width
    nemotron = ExpertsConfig(128, 2688, 1856, 6, "relu2", gated=False)
    plan = plan_launch(MoEProblem.of(nemotron, 4096, 2), H200)
    g1 = plan.gemm1
    assert g1.constexprs["TAIL_N"] == narrow_tail(1856, g1.tile.block_n)
    assert dataclasses.replace(plan, narrow_n=False).gemm1.constexprs["TAIL_N"] == 0
    assert g1.b_tma and plan.gemm2.a_tma
    no_tma = plan_launch(MoEProblem.of(nemotron, 4096, 2), ADA)
    assert not no_tma.gemm1.b_tma and not no_tma.gemm2.a_tma


def test_decode_trigger_follows_the_sm_count_or_the_config():
    problem = MoEProblem.of(QWEN3, 1, 2)
    tiles = tc.MoEConfig(16, tc.GemmConfig(64, 128), tc.GemmConfig(64, 128), pdl=True)
    programs = 8 * -(-768 // 64)  # pairs x GEMM-1 N tiles
    few = dataclasses.replace(H200, num_sms=programs)
    assert plan_launch(problem, few, tiles).trigger
    assert not plan_launch(problem, dataclasses.replace(few, num_sms=programs - 1), tiles).trigger
    forced = dataclasses.replace(tiles, trigger=True)
    assert plan_launch(problem, dataclasses.replace(few, num_sms=1), forced).trigger
    assert not plan_launch(problem, ADA, forced).trigger  # no dependent launches there


def test_plans_are_values_and_refuse_inconsistent_decisions():
    problem = MoEProblem.of(QWEN3, 256, 2)
    assert plan_launch(problem, H200) == plan_launch(problem, H200)
    plan = plan_launch(problem, H200, PERSISTENT)
    with pytest.raises(ValueError, match="stream-K"):
        dataclasses.replace(plan, persistent=False, stream_k=True)
    with pytest.raises(ValueError, match="fused top-k sum"):
        dataclasses.replace(plan, fused_sum=True)
    with pytest.raises(ValueError, match="need LoRA"):
        dataclasses.replace(plan, lora_b_ahead=True)
    lora = MoEProblem.of(QWEN3, 256, 2, lora_slots=2, lora_rank=8)
    with pytest.raises(ValueError, match="persistent GEMMs need"):
        dataclasses.replace(plan_launch(lora, H200), persistent=True)


def test_dtype_and_device_limits_reach_the_tile_config():
    fp32 = plan_launch(MoEProblem.of(QWEN3, 4096, 4), ADA)
    want = tc.get_config(4096, 128, 8, 2048, 768, True, "NVIDIA L40S", smem_limit=72 * 1024,
                         num_sms=142, elem_bytes=4)  # fmt: skip
    assert fp32.config == want and fp32.smem_limit == 72 * 1024


def test_the_launcher_refuses_a_plan_of_another_problem():
    torch = pytest.importorskip("torch")
    from moe_policy.experts.triton.fused_moe import fused_moe_triton

    x = torch.zeros(3, 64, dtype=torch.float16)
    ids = torch.tensor([[0, 1], [1, 2], [2, 3]], dtype=torch.int32)
    other = plan_launch(MoEProblem(4, 2, 4, 64, 96, elem_bytes=2), DeviceLimits())
    with pytest.raises(ValueError, match="the plan is for"):
        fused_moe_triton(x, torch.zeros(4, 192, 64, dtype=torch.float16),
                         torch.zeros(4, 64, 96, dtype=torch.float16), torch.rand(3, 2), ids,
                         plan=other)  # fmt: skip
