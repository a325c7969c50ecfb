"""What a library user gets from the installed package: one version, types, a module entry."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
from importlib.resources import files

import moe_policy
from tests.bundled import REPO


def test_one_version_everywhere():
    """pyproject reads the version from moe_policy._version; metadata and CLI agree."""
    assert importlib.metadata.version("moe-policy") == moe_policy.__version__
    text = (REPO / "pyproject.toml").read_text()
    assert 'dynamic = ["version"]' in text
    assert 'version = {attr = "moe_policy._version.__version__"}' in text


def test_python_dash_m_is_the_cli():
    done = subprocess.run(
        [sys.executable, "-m", "moe_policy", "--version"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert done.stdout.strip() == f"moe-policy {moe_policy.__version__}"
    bad = subprocess.run(
        [sys.executable, "-m", "moe_policy", "nope"], capture_output=True, text=True
    )
    assert bad.returncode == 2 and bad.stderr.startswith("moe-policy: error:")


def test_typed_and_licensed():
    assert (files("moe_policy") / "py.typed").is_file()
    assert (
        (REPO / "LICENSE")
        .read_text()
        .startswith("\n                                 Apache License")
    )
    meta = importlib.metadata.metadata("moe-policy")
    assert meta["License-Expression"] == "Apache-2.0"
