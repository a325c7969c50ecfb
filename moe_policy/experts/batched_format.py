"""Batched activation format: ``[E_local, max_tokens, H]`` plus per-expert token counts.

This is the layout that expert-parallel low-latency all-to-all (DeepEP low-latency
dispatch) delivers to the experts: row ``m`` of expert ``e`` holds the ``m``-th routed
(token, slot) pair of that expert; rows at or past ``expert_num_tokens[e]`` are padding.
The router weight is not applied by the experts in this format: the combine step
(DeepEP low-latency combine, or :func:`combine_from_batched` here) multiplies each row
by its router weight and sums over the top-k slots of each token.

The two helpers below emulate dispatch and combine on one device so that batched
experts can be compared with :func:`moe_policy.experts.reference.fused_moe_reference`.
Torch only, vectorised; they read the counts back to the host once (to check the
capacity), so they are test and benchmark helpers, not graph-capturable.
"""

from __future__ import annotations

from typing import NamedTuple

import torch


class BatchedDispatch(NamedTuple):
    """What a batched dispatch delivers, plus what the combine needs."""

    #: ``[E, M, H]`` routed token rows per expert; padding rows are zero.
    x: torch.Tensor
    #: ``[E]`` int32 number of valid rows per expert.
    expert_num_tokens: torch.Tensor
    #: ``[E, M]`` int64 flat (token, slot) index ``t * top_k + j`` of each row, ``-1`` on padding.
    index_map: torch.Tensor
    #: ``[E, M]`` int32 LoRA slot of each row (``-1`` = none, and on padding); None without LoRA.
    lora_mapping: torch.Tensor | None


def dispatch_to_batched(
    x: torch.Tensor,
    topk_ids: torch.Tensor,
    num_experts: int,
    max_tokens_per_expert: int,
    token_lora_mapping: torch.Tensor | None = None,
    *,
    input_weights: torch.Tensor | None = None,
) -> BatchedDispatch:
    """Scatter ``x`` [T, H] by ``topk_ids`` [T, k] into the batched ``[E, M, H]`` format.

    Rows keep token order inside each expert. ``topk_ids`` entries outside
    ``0..num_experts-1`` (experts on another rank) are dropped. ``input_weights``
    ([T, k], optional) multiplies each row by its router weight, for models that apply
    the weight on the input (combine then passes ``apply_router_weight=False``).
    Raises ``ValueError`` when an expert receives more than ``max_tokens_per_expert``.
    """
    if x.dim() != 2 or topk_ids.dim() != 2 or topk_ids.shape[0] != x.shape[0]:
        raise ValueError(
            f"expected x [T, H] and topk_ids [T, k]; got x {tuple(x.shape)}, "
            f"topk_ids {tuple(topk_ids.shape)}"
        )
    if token_lora_mapping is not None and token_lora_mapping.shape != (x.shape[0],):
        raise ValueError(
            f"token_lora_mapping must be [T={x.shape[0]}], got {tuple(token_lora_mapping.shape)}"
        )
    if input_weights is not None and input_weights.shape != topk_ids.shape:
        raise ValueError(
            f"input_weights {tuple(input_weights.shape)} must match topk_ids {tuple(topk_ids.shape)}"
        )
    t_count, hidden = x.shape
    top_k = topk_ids.shape[1]
    e_count, m_cap, dev = num_experts, max_tokens_per_expert, x.device

    # Flat (token, slot) pairs on this rank, grouped by expert in token order (stable sort).
    ids = topk_ids.reshape(-1).long()
    valid = (ids >= 0) & (ids < e_count)
    key = torch.where(valid, ids, torch.full_like(ids, e_count))
    order = torch.sort(key, stable=True).indices
    sorted_key = key[order]
    counts = torch.zeros(e_count + 1, dtype=torch.int64, device=dev)
    counts.scatter_add_(0, key, torch.ones_like(key))
    counts = counts[:e_count]
    if t_count > 0 and int(counts.max()) > m_cap:
        raise ValueError(
            f"expert receives {int(counts.max())} tokens, more than max_tokens_per_expert={m_cap}"
        )
    # Position of each pair inside its expert: its sorted index minus the expert's start.
    starts = torch.cumsum(counts, 0) - counts
    n_valid = int(valid.sum())
    order, sorted_key = order[:n_valid], sorted_key[:n_valid]
    pos = torch.arange(n_valid, device=dev) - starts[sorted_key]

    # Scatter rows, their flat pair index and their LoRA slot into the padded layout.
    xb = x.new_zeros(e_count, m_cap, hidden)
    rows = x[order // top_k]
    if input_weights is not None:
        w = input_weights.reshape(-1)[order].to(torch.float32).unsqueeze(1)
        rows = (rows.to(torch.float32) * w).to(x.dtype)
    xb[sorted_key, pos] = rows
    index_map = torch.full((e_count, m_cap), -1, dtype=torch.int64, device=dev)
    index_map[sorted_key, pos] = order
    lora_mapping = None
    if token_lora_mapping is not None:
        lora_mapping = torch.full((e_count, m_cap), -1, dtype=torch.int32, device=dev)
        lora_mapping[sorted_key, pos] = token_lora_mapping.to(torch.int32)[order // top_k]
    return BatchedDispatch(xb, counts.to(torch.int32), index_map, lora_mapping)


def combine_from_batched(
    yb: torch.Tensor,
    index_map: torch.Tensor,
    topk_weights: torch.Tensor,
    num_tokens: int,
    *,
    apply_router_weight: bool = True,
) -> torch.Tensor:
    """``yb`` [E, M, H] -> [T, H]: router-weighted sum of each token's rows (accumulated in
    fp32, or in fp64 for fp64 rows).

    Only rows with ``index_map >= 0`` are read, so padding rows may hold anything.
    """
    if yb.dim() != 3 or index_map.shape != yb.shape[:2]:
        raise ValueError(
            f"expected yb [E, M, H] and index_map [E, M]; got yb {tuple(yb.shape)}, "
            f"index_map {tuple(index_map.shape)}"
        )
    if topk_weights.dim() != 2 or topk_weights.shape[0] != num_tokens:
        raise ValueError(
            f"topk_weights must be [T={num_tokens}, k], got {tuple(topk_weights.shape)}"
        )
    top_k = topk_weights.shape[1]
    flat_map = index_map.reshape(-1)
    sel = torch.nonzero(flat_map >= 0, as_tuple=True)[0]
    pair = flat_map[sel]
    acc = torch.promote_types(yb.dtype, torch.float32)
    y = yb.reshape(-1, yb.shape[2])[sel].to(acc)
    if apply_router_weight:
        y = y * topk_weights.reshape(-1)[pair].to(acc).unsqueeze(1)
    out = torch.zeros(num_tokens, yb.shape[2], dtype=acc, device=yb.device)
    out.index_add_(0, pair // top_k, y)
    return out.to(yb.dtype)
