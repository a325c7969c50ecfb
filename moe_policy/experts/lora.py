"""Multi-adapter LoRA state for the routed experts of one MoE layer.

Layout (``S`` w13 slices: 2 gated [gate, up], 1 non-gated; ``L`` adapter slots;
``E`` local experts; ``R`` max rank; ``I`` intermediate size; ``H`` hidden size):

* ``w13_a`` ``[S, L, E, R, H]``, ``w13_b`` ``[S, L, E, I, R]``
* ``w2_a``  ``[L, E, R, I]``,    ``w2_b``  ``[L, E, H, R]``
* ``enabled`` ``[L]`` int32: 1 when the slot holds an adapter.

Adapters of rank ``r < R`` are zero-padded; the LoRA scaling (alpha / r) is folded
into B when an adapter is loaded, so kernels never scale. The math, per (t, k)
with expert ``e`` and slot ``l = token_lora_mapping[t]``::

    h      = W13[e] x + [B13_s[l,e] (A13_s[l,e] x) for s in slices]   # before act, not weighted
    y[t,k] = w * (W2[e] a + B2[l,e] (A2[l,e] a)),  a = act(h)         # router-weighted

Tokens with ``l == -1``, a slot outside ``[0, L)`` or a disabled slot get an exactly zero
delta (a device-side mapping cannot be checked without a host sync, so an out-of-range slot
is defined as "no adapter" rather than read out of bounds). For
``swigluoai`` (interleaved w13) slice 0 (gate) lands on even channels, slice 1 (up)
on odd channels.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from moe_policy.experts.base import check_devices


@dataclass
class MoELoRAAdapters:
    """Resident adapter slots of one MoE layer (allocated once, filled per adapter)."""

    w13_a: torch.Tensor
    w13_b: torch.Tensor
    w2_a: torch.Tensor
    w2_b: torch.Tensor
    enabled: torch.Tensor

    @classmethod
    def allocate(
        cls,
        *,
        num_slots: int,
        num_experts: int,
        hidden_size: int,
        intermediate_size: int,
        max_rank: int,
        num_slices: int,
        dtype: torch.dtype = torch.bfloat16,
        device: torch.device | str = "cpu",
    ) -> MoELoRAAdapters:
        """Zero-filled slots; every slot starts disabled."""
        if num_slices not in (1, 2):
            raise ValueError(f"num_slices must be 1 (non-gated) or 2 (gated), got {num_slices}")
        s, n, e, r, h, i = (
            num_slices,
            num_slots,
            num_experts,
            max_rank,
            hidden_size,
            intermediate_size,
        )

        def z(*shape: int) -> torch.Tensor:
            return torch.zeros(shape, dtype=dtype, device=device)

        return cls(
            w13_a=z(s, n, e, r, h),
            w13_b=z(s, n, e, i, r),
            w2_a=z(n, e, r, i),
            w2_b=z(n, e, h, r),
            enabled=torch.zeros(n, dtype=torch.int32, device=device),
        )

    @property
    def num_slices(self) -> int:
        return int(self.w13_a.shape[0])

    @property
    def num_slots(self) -> int:
        return int(self.w13_a.shape[1])

    @property
    def max_rank(self) -> int:
        return int(self.w13_a.shape[3])

    def set_adapter(
        self,
        slot: int,
        *,
        w13_a: Sequence[torch.Tensor],
        w13_b: Sequence[torch.Tensor],
        w2_a: torch.Tensor,
        w2_b: torch.Tensor,
        scaling: float = 1.0,
    ) -> None:
        """Load one adapter into ``slot``: per slice ``A [E, r, H]``, ``B [E, I, r]``;
        ``w2_a [E, r, I]``, ``w2_b [E, H, r]``; ``scaling`` is folded into B."""
        self._check_slot(slot)
        if len(w13_a) != self.num_slices or len(w13_b) != self.num_slices:
            raise ValueError(
                f"expected {self.num_slices} w13 slices, got {len(w13_a)} A and {len(w13_b)} B"
            )
        if w2_a.dim() != 3:
            raise ValueError(f"adapter w2_a must be [E, r, I], got {tuple(w2_a.shape)}")
        rank = int(w2_a.shape[1])
        if rank > self.max_rank:
            raise ValueError(f"adapter rank {rank} exceeds max_rank {self.max_rank}")
        # copy_ would broadcast an [r, H] or [1, r, H] tensor over every expert: shapes exactly
        _, _, e, _, h = self.w13_a.shape
        i = self.w13_b.shape[3]
        want = {"w13_a": (e, rank, h), "w13_b": (e, i, rank), "w2_a": (e, rank, i),
                "w2_b": (e, h, rank)}  # fmt: skip
        for name, ts in (("w13_a", w13_a), ("w13_b", w13_b), ("w2_a", [w2_a]), ("w2_b", [w2_b])):
            for t in ts:
                if tuple(t.shape) != want[name]:
                    raise ValueError(
                        f"adapter {name} must be {want[name]} (E={e}, H={h}, I={i}, rank "
                        f"{rank} as w2_a's); got {tuple(t.shape)}"
                    )
        self.clear(slot)
        for s in range(self.num_slices):
            a, b = w13_a[s], w13_b[s]
            self.w13_a[s, slot, :, :rank, :].copy_(a)
            self.w13_b[s, slot, :, :, :rank].copy_(b * scaling)
        self.w2_a[slot, :, :rank, :].copy_(w2_a)
        self.w2_b[slot, :, :, :rank].copy_(w2_b * scaling)
        self.enabled[slot] = 1

    def clear(self, slot: int) -> None:
        """Zero a slot and mark it disabled."""
        self._check_slot(slot)
        self.w13_a[:, slot].zero_()
        self.w13_b[:, slot].zero_()
        self.w2_a[slot].zero_()
        self.w2_b[slot].zero_()
        self.enabled[slot] = 0

    def _check_slot(self, slot: int) -> None:
        if not 0 <= slot < self.num_slots:  # a negative slot would index from the end
            raise ValueError(f"slot {slot} out of range 0..{self.num_slots - 1}")


@dataclass
class MoELoRAContext:
    """Adapters plus the per-batch token -> slot mapping (``-1`` = no adapter).

    ``token_lora_mapping`` is ``[T]`` int32 in the standard format and
    ``[E_local, max_tokens]`` in the batched format (one slot per row).
    """

    adapters: MoELoRAAdapters
    token_lora_mapping: torch.Tensor


def check_lora(
    lora: MoELoRAContext, x: torch.Tensor, num_experts: int, inter: int, gated: bool
) -> None:
    """ValueError naming what arrived when ``lora`` does not fit a standard-format layer on
    ``x`` [T, H] (``E`` experts, intermediate ``I``; two w13 slices when gated) or its tensors
    are not on ``x``'s device."""
    ad = lora.adapters
    s = 2 if gated else 1
    shapes = (
        tuple(ad.w13_a.shape),
        tuple(ad.w13_b.shape),
        tuple(ad.w2_a.shape),
        tuple(ad.w2_b.shape),
    )
    if ad.w13_a.dim() != 5:
        raise ValueError(f"LoRA w13_a must be [S, L, E, R, H], got {shapes[0]}")
    _, slots, _, r, _ = ad.w13_a.shape
    (t, h), e, i = x.shape, num_experts, inter
    want = ((s, slots, e, r, h), (s, slots, e, i, r), (slots, e, r, i), (slots, e, h, r))
    if shapes != want:
        raise ValueError(
            f"LoRA shapes (w13_a, w13_b, w2_a, w2_b) {shapes} do not match the layer; "
            f"expected {want} (S={s}, L={slots}, E={e}, R={r}, H={h}, I={i})"
        )
    m, en = lora.token_lora_mapping, ad.enabled
    if tuple(m.shape) != (t,) or m.is_floating_point() or m.dtype == torch.bool:
        raise ValueError(
            f"token_lora_mapping must be int [T={t}], got shape {tuple(m.shape)} dtype {m.dtype}"
        )
    if tuple(en.shape) != (slots,):
        raise ValueError(f"enabled must be [L={slots}], got shape {tuple(en.shape)}")
    names = ("w13_a", "w13_b", "w2_a", "w2_b", "enabled")
    check_devices(x, token_lora_mapping=m, **{f"LoRA {n}": getattr(ad, n) for n in names})
