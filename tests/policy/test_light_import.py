"""The policy path never imports torch or triton: a decision is computable on a laptop."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.bundled import NEMOTRON, REPO

SCRIPT = f"""
import json, sys
import moe_policy
after_import = sorted(m for m in ("torch", "triton", "omegaconf", "structlog") if m in sys.modules)
e = moe_policy.explain({NEMOTRON!r}, platform="cuda", capability="9.0", lora=True)
print(json.dumps({{"after_import": after_import, "backend": e.decision.backend,
                   "heavy": sorted(m for m in ("torch", "triton") if m in sys.modules)}}))
"""


def test_import_and_decide_without_torch_or_triton():
    """`import moe_policy` and a full decision leave torch and triton unimported."""
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, check=True, cwd=REPO
    )
    result = json.loads(out.stdout)
    assert result == {"after_import": [], "backend": "triton", "heavy": []}
