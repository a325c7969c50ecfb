"""Shared test set-up: GPU tests are skipped cleanly where no CUDA device exists."""

from __future__ import annotations

import os
import shutil

import pytest

# Without a GPU, Triton kernels run under the interpreter; the variable must be set
# before triton is first imported (kernel and layer tests). No torch import here.
if shutil.which("nvidia-smi") is None:
    os.environ.setdefault("TRITON_INTERPRET", "1")

# pytest-xdist's workers run with COLUMNS=80 and LINES=24 in their environment, which the
# console script reads as the terminal's size: the commands a test runs would print an
# 80-column layout under `pytest -n` and the default one without it. Tests that care about
# the width set COLUMNS themselves or run in a pseudo-terminal.
for _size_variable in ("COLUMNS", "LINES"):
    os.environ.pop(_size_variable, None)


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    gpu_items = [item for item in items if item.get_closest_marker("gpu")]
    if not gpu_items or _cuda_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in gpu_items:
        item.add_marker(skip)


# --- policy fixtures --------------------------------------------------------------

from collections.abc import Callable, Iterator, Mapping  # noqa: E402
from typing import Any  # noqa: E402

from tests.bundled import MIXTRAL, NEMOTRON, QWEN3  # noqa: E402


@pytest.fixture(autouse=True)
def _fresh_policy_state() -> Iterator[None]:
    """Each test starts with no cached selectors, probe results or reporting counts."""
    import moe_policy

    moe_policy.reset()
    yield
    moe_policy.reset()


@pytest.fixture
def make_selector() -> Callable[..., Any]:
    """Build a Selector isolated from the real environment: ``environ`` defaults to {}."""
    from moe_policy.api import Selector, explicit_entries
    from moe_policy.core.origin import Origin

    def build(
        model: Any = NEMOTRON,
        *,
        environ: Mapping[str, str] | None = None,
        policy_files: list[str] | None = None,
        overrides: Mapping[str, Any] | None = None,
        **arguments: Any,
    ) -> Any:
        entries = explicit_entries(arguments, overrides, Origin.api())
        return Selector(model, policy_files=policy_files, environ=environ or {}, explicit=entries)

    return build


@pytest.fixture
def h200() -> dict[str, Any]:
    """Dry-run arguments for an H200 (SM90) target."""
    return {"platform": "cuda", "capability": "9.0", "device_name": "NVIDIA H200"}


@pytest.fixture
def b200() -> dict[str, Any]:
    """Dry-run arguments for a B200 (SM100) target."""
    return {"platform": "cuda", "capability": "10.0", "device_name": "NVIDIA B200"}


@pytest.fixture
def nemotron() -> str:
    """Path of the bundled Nemotron-3-Nano config (non-gated relu2 experts, BF16)."""
    return NEMOTRON


@pytest.fixture
def mixtral() -> str:
    return MIXTRAL


@pytest.fixture
def qwen3() -> str:
    return QWEN3
