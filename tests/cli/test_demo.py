"""`make demo`'s script runs end to end with the installed console script (it checks every
exit code it expects and fails otherwise)."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.bundled import REPO
from tests.cli.runner import SCRIPT


def test_the_demo_script_passes_every_step():
    env = {**os.environ, "MOE_POLICY_CLI": str(SCRIPT), "PYTHON": sys.executable}
    done = subprocess.run(
        ["bash", "scripts/demo.sh"], cwd=REPO, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert done.stdout.count("as expected") == 6
    assert "Demo complete: every step exited as expected." in done.stdout
    assert "vllm==0.33 cannot run this deployment" in done.stderr


def test_make_demo_sets_up_the_base_package_only():
    """`make demo` builds its own environment with `pip install -e .` (no extras, so no torch)
    and does not depend on the full development environment `make test` builds."""
    # run from `make test` too: a nested make would add "Entering directory" lines
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    done = subprocess.run(
        ["make", "--no-print-directory", "-n", "-B", "demo"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    commands = done.stdout.splitlines()
    assert "python3 -m venv --without-pip .venv-demo" in commands
    (install,) = [c for c in commands if " install " in c]
    assert install.endswith("install -q -e .")
    assert not any(
        word in done.stdout for word in ("torch", "[kernels", "[test", ".venv/", "setup")
    )
    assert commands[-1].startswith(
        "MOE_POLICY_CLI=.venv-demo/bin/moe-policy PYTHON=.venv-demo/bin/python bash scripts/demo.sh"
    )


def test_the_demo_says_how_to_get_its_environment(tmp_path):
    """Run by hand without `make demo`'s environment: one line naming what is missing."""
    env = {**os.environ, "MOE_POLICY_CLI": str(tmp_path / "nowhere" / "moe-policy")}
    done = subprocess.run(
        ["bash", "scripts/demo.sh"], cwd=REPO, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2
    assert done.stderr == f"demo: {tmp_path}/nowhere/moe-policy not found; run `make demo`\n"
