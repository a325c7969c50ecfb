"""Without a structlog configuration, events are records of the stdlib logger ``moe_policy``
(the engine's handlers and levels apply); a configured structlog keeps getting them."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import pytest
import structlog

import moe_policy
from moe_policy import BackendOverrideWarning
from tests.bundled import NEMOTRON, REPO

H200 = {"platform": "cuda", "capability": "9.0", "device_name": "NVIDIA H200"}


@pytest.fixture
def unconfigured_structlog():
    structlog.reset_defaults()
    yield
    structlog.reset_defaults()


def test_events_are_stdlib_records_at_their_levels(unconfigured_structlog, caplog):
    caplog.set_level(logging.INFO, logger="moe_policy")
    with pytest.warns(BackendOverrideWarning):
        moe_policy.select_backend(NEMOTRON, backend="flashinfer_cutlass", lora=True, **H200)
    records = [r for r in caplog.records if r.name == "moe_policy"]
    assert [(r.levelname, r.moe_policy["event"]) for r in records] == [
        ("WARNING", "moe_policy.request_overridden"),
        ("INFO", "moe_policy.decision"),
    ]
    overridden = records[0]
    assert overridden.getMessage().startswith("moe_policy.request_overridden ")
    assert "reason_code=lora_unsupported" in overridden.getMessage()
    assert overridden.moe_policy["origin"] == "api"
    # An engine's "[file:line]" format names moe_policy's call, not structlog's internals.
    package = str(Path(moe_policy.__file__).parent)
    assert all(r.pathname.startswith(package) for r in records), [r.pathname for r in records]
    assert {r.filename for r in records} == {"events.py"}


def test_the_logger_level_filters_before_anything_is_rendered(unconfigured_structlog, caplog):
    caplog.set_level(logging.WARNING, logger="moe_policy")
    moe_policy.select_backend(NEMOTRON, **H200)
    assert [r for r in caplog.records if r.name == "moe_policy"] == []


def test_a_process_that_configured_structlog_keeps_its_pipeline():
    with structlog.testing.capture_logs() as logs:
        moe_policy.select_backend(NEMOTRON, **H200)
    assert [e["event"] for e in logs] == ["moe_policy.decision"]


def test_an_unconfigured_process_prints_nothing_to_stdout():
    """The library writes no event to stdout: a plain script's output stays its own."""
    code = (
        "import logging, sys, warnings, moe_policy\n"
        "logging.basicConfig(stream=sys.stderr, level=logging.INFO)\n"
        "warnings.simplefilter('ignore')\n"
        f"d = moe_policy.select_backend({NEMOTRON!r}, platform='cuda', capability='9.0', "
        "backend='flashinfer_cutlass', lora=True)\n"
        "print(d.backend)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO
    )
    assert done.stdout == "triton\n"
    assert "WARNING:moe_policy:moe_policy.request_overridden" in done.stderr
    assert "INFO:moe_policy:moe_policy.decision" in done.stderr
