"""What the Triton kernels need to know of the device they run on: whether Triton can run at
all, its multiprocessors and shared memory, and the launch options it accepts.

Off CUDA (Triton's interpreter) the answers are small stand-ins that keep the launchers'
grid rules exercised.
"""

from __future__ import annotations

from functools import lru_cache
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


def triton_runtime_available() -> tuple[bool, str | None]:
    """A CUDA device, or Triton's interpreter (``TRITON_INTERPRET=1``), for Triton backends."""
    import os

    import torch

    if torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1":
        return True, None
    return False, "no CUDA device and TRITON_INTERPRET is not set"


def pdl_launch(pdl: bool) -> dict[str, bool]:
    """Launch keywords of a programmatic dependent launch: ``launch_pdl`` only when asked for,
    as Triton's backends for other GPUs (ROCm's among them) reject the option by name."""
    return {"launch_pdl": True} if pdl else {}


@lru_cache(maxsize=8)
def sm_count(device: torch.device) -> int:
    """Streaming multiprocessors of a CUDA device; 4 elsewhere (Triton's interpreter), a small
    stand-in that keeps grid heuristics exercised."""
    if device.type != "cuda":
        return 4
    import torch

    return int(torch.cuda.get_device_properties(device).multi_processor_count)


def config_limits(device: torch.device) -> dict[str, Any]:
    """What ``triton_config.get_config`` needs to know of a CUDA device, as its keyword
    arguments: its name (tuned files), shared memory to plan for (``smem_limit``) and SMs
    (``num_sms``); nothing off CUDA (the interpreter runs any tile; the defaults are Hopper's)."""
    if device.type != "cuda":
        return {}
    import torch

    return cuda_limits(device.index if device.index is not None else torch.cuda.current_device())


@lru_cache(maxsize=16)
def cuda_limits(index: int) -> dict[str, Any]:
    """``config_limits`` of CUDA device ``index`` (queried once per device)."""
    import torch
    import triton

    from moe_policy.experts.triton.config import smem_budget

    props = triton.runtime.driver.active.utils.get_device_properties(index)
    return {"device_name": torch.cuda.get_device_name(index),
            "smem_limit": smem_budget(int(props["max_shared_mem"])),
            "num_sms": int(props["multiprocessor_count"])}  # fmt: skip
