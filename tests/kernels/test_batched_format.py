"""Batched-format dispatch/combine helpers: layout, counts, padding, LoRA slots, round trip."""

from __future__ import annotations

import pytest
import torch

from moe_policy.experts.batched_format import combine_from_batched, dispatch_to_batched


def _routing(t: int, e: int, k: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.stack([torch.randperm(e, generator=g)[:k] for _ in range(t)]).to(torch.int32)
    return ids, torch.rand(t, k, generator=g)


def test_rows_land_in_token_order_with_counts_and_padding() -> None:
    """Each expert's rows are its tokens in order; counts match; padding rows are zero / -1."""
    t, h, e, k, m = 7, 5, 4, 2, 6
    x = torch.randn(t, h)
    ids, _ = _routing(t, e, k)
    lora_map = torch.arange(t, dtype=torch.int32) % 3 - 1
    d = dispatch_to_batched(x, ids, e, m, lora_map)
    assert d.x.shape == (e, m, h) and d.index_map.shape == (e, m) and d.lora_mapping is not None
    for ex in range(e):
        pairs = [(tt, j) for tt in range(t) for j in range(k) if int(ids[tt, j]) == ex]
        n = len(pairs)
        assert int(d.expert_num_tokens[ex]) == n
        for row, (tt, j) in enumerate(pairs):
            assert torch.equal(d.x[ex, row], x[tt])
            assert int(d.index_map[ex, row]) == tt * k + j
            assert int(d.lora_mapping[ex, row]) == int(lora_map[tt])
        assert torch.all(d.x[ex, n:] == 0)
        assert torch.all(d.index_map[ex, n:] == -1) and torch.all(d.lora_mapping[ex, n:] == -1)
    assert d.expert_num_tokens.dtype == torch.int32


def test_identity_experts_round_trip_gives_weighted_sum() -> None:
    """dispatch -> identity -> combine = x * sum_k w (ids outside 0..E-1 contribute nothing);
    fp64 rows are summed in fp64 (an fp32 sum missed fp64's tolerance for some inputs)."""
    t, h, e, k = 9, 8, 5, 3
    x = torch.randn(t, h, dtype=torch.float64, generator=torch.Generator().manual_seed(7))
    ids, w = _routing(t, e, k, seed=1)
    ids[2, 1] = -1  # expert on another rank
    d = dispatch_to_batched(x, ids, e, t)
    out = combine_from_batched(d.x, d.index_map, w.double(), t)
    w_local = torch.where(ids >= 0, w.double(), 0.0)
    torch.testing.assert_close(out, x * w_local.sum(1, keepdim=True))
    assert int(d.expert_num_tokens.sum()) == t * k - 1


def test_combine_ignores_padding_rows() -> None:
    """Garbage (NaN) in padding rows does not reach the output."""
    t, h, e, k = 4, 6, 4, 1
    x = torch.randn(t, h)
    ids = torch.tensor([[0], [0], [2], [3]], dtype=torch.int32)
    w = torch.rand(t, k)
    d = dispatch_to_batched(x, ids, e, 3)
    yb = d.x.clone()
    yb[d.index_map < 0] = float("nan")
    out = combine_from_batched(yb, d.index_map, w, t)
    torch.testing.assert_close(out, x * w)


def test_input_weights_scale_rows_and_combine_skips_weight() -> None:
    """Router weight on the input: rows pre-scaled, combine unweighted."""
    t, h, e = 5, 4, 3
    x = torch.randn(t, h)
    ids = torch.tensor([[0], [1], [2], [1], [0]], dtype=torch.int32)
    w = torch.rand(t, 1)
    d = dispatch_to_batched(x, ids, e, 2, input_weights=w)
    out = combine_from_batched(d.x, d.index_map, w, t, apply_router_weight=False)
    torch.testing.assert_close(out, x * w)


def test_capacity_overflow_and_bad_shapes_raise() -> None:
    """More tokens than max_tokens_per_expert, or mismatched shapes, raise ValueError."""
    x = torch.randn(3, 4)
    ids = torch.zeros(3, 1, dtype=torch.int32)
    with pytest.raises(ValueError, match="max_tokens_per_expert=2"):
        dispatch_to_batched(x, ids, 2, 2)
    with pytest.raises(ValueError, match="topk_ids"):
        dispatch_to_batched(x, ids[:2], 2, 4)
    with pytest.raises(ValueError, match="token_lora_mapping"):
        dispatch_to_batched(x, ids, 2, 4, torch.zeros(2, dtype=torch.int32))


def test_empty_batch() -> None:
    """T = 0 gives an all-padding batch and an empty combine."""
    x = torch.randn(0, 4)
    d = dispatch_to_batched(x, torch.zeros(0, 2, dtype=torch.int32), 3, 2)
    assert torch.all(d.expert_num_tokens == 0) and torch.all(d.index_map == -1)
    out = combine_from_batched(d.x, d.index_map, torch.zeros(0, 2), 0)
    assert out.shape == (0, 4)
