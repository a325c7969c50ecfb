"""Kernel tests: Triton runs under its interpreter where no CUDA GPU exists.

TRITON_INTERPRET must be set before triton is first imported, so it is set here,
at collection time. The interpreter gets bf16 ``tl.dot`` wrong, so interpreted
tests use fp16/fp32 and bf16 is checked on the GPU (see ``moe_cases.dtypes_for_device``).
"""

from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")

ON_GPU = torch.cuda.is_available()
if not ON_GPU:
    os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture
def device() -> str:
    return "cuda" if ON_GPU else "cpu"


@pytest.fixture(autouse=True)
def _seeded_torch() -> None:
    """Every kernel test starts from the same torch RNG state, so a failure reproduces whatever
    ran before it in the worker (unseeded inputs once made a tolerance check flaky)."""
    torch.manual_seed(0)
