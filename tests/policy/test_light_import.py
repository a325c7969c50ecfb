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


WITHOUT_TORCH = f"""
import json, sys
sys.modules["torch"] = None  # as on the base install: `import torch` raises ImportError
from moe_policy import Selector
from moe_policy.distributed import check_agreement
selector = Selector({NEMOTRON!r}, environ={{}}, platform="cuda", capability="9.0")
report = check_agreement(selector.select(i) for i in range(3))
print(json.dumps({{"agreed": report.agreed, "world_size": report.world_size,
                   "layers": report.layers}}))
"""


def test_the_agreement_check_runs_without_torch_as_a_group_of_one():
    """The base install has no torch, so no process group: the check compares this process's
    decisions alone instead of failing on the import."""
    out = subprocess.run(
        [sys.executable, "-c", WITHOUT_TORCH], capture_output=True, text=True, cwd=REPO
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {"agreed": True, "world_size": 1, "layers": 3}
