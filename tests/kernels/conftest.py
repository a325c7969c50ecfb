"""Kernel tests: Triton runs under its interpreter where no CUDA GPU exists.

TRITON_INTERPRET must be set before triton is first imported, so it is set here,
at collection time. The interpreter gets bf16 ``tl.dot`` wrong, so interpreted
tests use fp16/fp32 and bf16 is checked on the GPU (see
``moe_policy.experts.testing.dtypes_for_device``).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

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


@pytest.fixture
def record_launches(monkeypatch: pytest.MonkeyPatch) -> Callable[..., list[tuple[str, dict]]]:
    """``record_launches(module, attr, *, log=None, rewrite=None)`` replaces the Triton kernel
    ``module.attr`` by a recorder for this test: each launch appends ``(attr, kwargs)`` to
    ``log`` (a new list when None, returned; the launch grid is kwargs ``"_grid"``) and runs
    the kernel, with its keyword arguments passed through ``rewrite`` when given."""

    def record(
        module: Any,
        attr: str,
        *,
        log: list[tuple[str, dict]] | None = None,
        rewrite: Callable[[dict], dict] | None = None,
    ) -> list[tuple[str, dict]]:
        launches: list[tuple[str, dict]] = [] if log is None else log
        kernel = getattr(module, attr)

        class Recorder:
            def __getitem__(self, grid: Any) -> Callable[..., Any]:
                def launch(*args: Any, **kwargs: Any) -> Any:
                    launches.append((attr, {**kwargs, "_grid": grid}))
                    return kernel[grid](*args, **(rewrite(kwargs) if rewrite else kwargs))

                return launch

        monkeypatch.setattr(module, attr, Recorder())
        return launches

    return record
