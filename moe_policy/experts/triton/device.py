"""What the Triton kernels need to know of the device they run on: whether Triton can run at
all, its multiprocessors and shared memory, and the launch options it accepts.

Off CUDA (Triton's interpreter) the answers are small stand-ins that keep the launchers'
grid rules exercised.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from moe_policy.experts.triton.config import HEURISTIC_SMS, SMEM_LIMIT, smem_budget

if TYPE_CHECKING:
    import torch


def triton_runtime_available() -> tuple[bool, str | None]:
    """A CUDA device, or Triton's interpreter (``TRITON_INTERPRET=1``), for Triton backends."""
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
    """Streaming multiprocessors of a CUDA device; ``INTERPRETER_SMS`` elsewhere."""
    if device.type != "cuda":
        return INTERPRETER_SMS
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

    props = triton.runtime.driver.active.utils.get_device_properties(index)
    return {"device_name": torch.cuda.get_device_name(index),
            "smem_limit": smem_budget(int(props["max_shared_mem"])),
            "num_sms": int(props["multiprocessor_count"])}  # fmt: skip


@lru_cache(maxsize=16)
def has_tma(index: int) -> bool:
    """An NVIDIA GPU of compute capability 9 or newer: TMA descriptors and dependent launches.
    ROCm builds of torch report AMD's gfx9 parts (MI300X: 9.4) as capability 9 too."""
    import torch

    return torch.version.hip is None and torch.cuda.get_device_capability(index)[0] >= 9


#: SMs of Triton's interpreter: a small stand-in, so that grids sized by SMs (persistent
#: GEMMs, stream-K tails) run several rounds on small test shapes.
INTERPRETER_SMS = 4


@dataclass(frozen=True)
class DeviceLimits:
    """What the launch plan needs to know of the device: a plain value, so that a plan can be
    made for any part on any machine (``device_limits`` queries the one a tensor is on)."""

    #: Programs that run at once: the grid of persistent GEMMs, stream-K parts, the trigger rule.
    num_sms: int = INTERPRETER_SMS
    #: Shared memory a tile config may plan for, bytes (``config.smem_budget``).
    smem_limit: int = SMEM_LIMIT
    #: CUDA device name, for tuned config files; None: the heuristic.
    device_name: str | None = None
    #: SMs the tile heuristic plans for: the device's own; off CUDA the Hopper part's, so that
    #: interpreted runs take the tiles a GPU would.
    tile_sms: int = HEURISTIC_SMS
    #: Programmatic dependent launches (Hopper or newer, compiled).
    pdl: bool = False
    #: TMA descriptors (Hopper or newer, or the interpreter, which emulates them).
    tma: bool = False

    def config_kwargs(self) -> dict[str, Any]:
        """``config.get_config``'s device keywords."""
        return {"device_name": self.device_name, "smem_limit": self.smem_limit,
                "num_sms": self.tile_sms}  # fmt: skip


def device_limits(device: torch.device) -> DeviceLimits:
    """The :class:`DeviceLimits` of ``device`` (queried; cached per CUDA device)."""
    import torch

    interpreted = os.environ.get("TRITON_INTERPRET") == "1"
    if device.type != "cuda":
        return DeviceLimits(num_sms=sm_count(device), tma=interpreted)
    index = device.index if device.index is not None else torch.cuda.current_device()
    limits = cuda_limits(index)
    hopper = has_tma(index)
    return DeviceLimits(
        num_sms=sm_count(device), smem_limit=limits["smem_limit"],
        device_name=limits["device_name"], tile_sms=limits["num_sms"],
        pdl=hopper and not interpreted, tma=hopper or interpreted,
    )  # fmt: skip


#: TMA box sides are at most 256 elements.
TMA_MAX_BOX = 256


def tma_layout(t: torch.Tensor) -> bool:
    """Whether TMA can describe ``t``: unit inner stride, 16-byte aligned base and rows."""
    es = t.element_size()
    return (
        t.stride(-1) == 1
        and (t.stride(-2) * es) % 16 == 0
        and t.data_ptr() % 16 == 0
        and all((st * es) % 16 == 0 for st in t.stride()[:-1])
    )
