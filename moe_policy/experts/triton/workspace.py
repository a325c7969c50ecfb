"""A bump allocator over a tensor's bytes: short-lived int32/fp32 work buffers carved out of a
buffer that is idle meanwhile (the fused MoE's output, written only by its last kernel).

``Workspace(buf).take(shape, dtype)`` returns a view of the next free bytes of ``buf`` (16-byte
aligned), or a new tensor on ``buf``'s device when ``buf`` is ``None`` or too small, so callers
never have to check. The caller guarantees that nothing reads ``buf`` while the views are in use.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

#: Signature of an allocator: (shape, dtype) -> tensor.
Alloc = Callable[[tuple[int, ...], torch.dtype], torch.Tensor]

_ALIGN = 16


class Workspace:
    """Carves views out of ``buf`` (contiguous) until it is used up, then allocates."""

    def __init__(self, buf: torch.Tensor | None, device: torch.device | None = None) -> None:
        if buf is not None and not buf.is_contiguous():
            raise ValueError("workspace buffer must be contiguous")
        self._bytes = None if buf is None else buf.view(-1).view(torch.uint8)
        self._device = buf.device if buf is not None else device
        self._offset = 0
        self.carved = 0  # bytes handed out as views (for tests and accounting)

    def take(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """An uninitialised tensor of ``shape``: a view of the buffer when it fits."""
        nbytes = math.prod(shape) * dtype.itemsize
        start = -(-self._offset // _ALIGN) * _ALIGN
        if self._bytes is not None and start + nbytes <= self._bytes.numel():
            self._offset = start + nbytes
            self.carved += nbytes
            return self._bytes[start : start + nbytes].view(dtype).view(shape)
        return torch.empty(shape, dtype=dtype, device=self._device)


def fresh(device: torch.device) -> Alloc:
    """An allocator that always allocates (no shared buffer)."""
    return Workspace(None, device).take
