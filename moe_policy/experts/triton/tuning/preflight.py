"""Checks made before any GPU work, so that a long run does not fail at its end: an output
folder that can be written, a CUDA GPU to time on. Each raises ValueError saying why not."""

from __future__ import annotations

import os
import tempfile


def writable_dir(path: str) -> str:
    """``path``, created if missing and checked writable (a file is written and removed)."""
    if os.path.exists(path) and not os.path.isdir(path):
        raise ValueError(f"cannot write to {path!r} (not a directory)")
    try:
        os.makedirs(path, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".write-check-"):
            pass
    except OSError as exc:
        raise ValueError(f"cannot write to {path!r} ({exc.strerror or exc})") from None
    return path


def cuda_device_name(why: str) -> str:
    """The CUDA device's name; without torch or a CUDA GPU a ValueError ending in ``why``
    (what the GPU is needed for)."""
    try:
        import torch
    except ImportError:
        raise ValueError(
            "the kernels are not installed: pip install 'moe-policy[kernels]'"
        ) from None
    if not torch.cuda.is_available():
        raise ValueError(f"no CUDA GPU: {why}")
    return str(torch.cuda.get_device_name())
