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
