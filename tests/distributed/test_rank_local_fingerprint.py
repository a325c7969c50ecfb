"""What legitimately differs between ranks stays out of the fingerprint; what decides is in it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from moe_policy import PlatformFacts, Selector
from moe_policy.core.keys import CONTEXT_KEYS

REPO = Path(__file__).resolve().parents[2]
MODEL = str(REPO / "configs" / "models" / "qwen3-30b-a3b.json")
FULL = ("flashinfer", "torch", "triton")
RULE = (
    "rules:\n  - {id: prefer-cutlass, effect: prefer, backends: [flashinfer_cutlass], reason: r}\n"
)


def fingerprint_of(
    environ: dict[str, str] | None = None,
    packages: tuple[str, ...] = FULL,
    policy_files: list[str] | None = None,
    layer: int = 3,
) -> str:
    """A dry-run B200 decision's fingerprint; every input not named here is pinned."""
    sel = Selector(
        MODEL,
        environ=environ or {},
        policy_files=policy_files,
        platform=PlatformFacts("cuda", "10.0", "NVIDIA B200", packages),
    )
    return sel.decide(layer).fingerprint


def test_only_layer_index_is_rank_local():
    """``layer.index`` is the one rank-local context key (pipeline stages own different layers)."""
    assert [k for k, spec in CONTEXT_KEYS.items() if spec.rank_local] == ["layer.index"]
    assert fingerprint_of(layer=0) == fingerprint_of(layer=47)


def test_rank_host_and_launcher_variables_do_not_enter():
    """RANK, LOCAL_RANK, WORLD_SIZE, HOSTNAME, MASTER_ADDR differ per rank and change nothing."""
    launcher = {
        "RANK": "5",
        "LOCAL_RANK": "1",
        "WORLD_SIZE": "8",
        "HOSTNAME": "host-b",
        "MASTER_ADDR": "10.0.0.1",
        "CUDA_VISIBLE_DEVICES": "1",
    }
    assert fingerprint_of(launcher) == fingerprint_of({})


def test_non_decisive_settings_do_not_enter(tmp_path: Path):
    """A per-rank audit path or the consistency mode does not change what runs."""
    base = fingerprint_of({})
    assert fingerprint_of({"MOE_POLICY_AUDIT_LOG": str(tmp_path / "rank5.jsonl")}) == base
    assert fingerprint_of({"MOE_POLICY_CONSISTENCY": "warn"}) == base


def test_policy_file_path_does_not_enter_but_its_content_does(tmp_path: Path):
    """The same policy at two paths (argument or MOE_POLICY_FILES) gives one fingerprint."""
    a = tmp_path / "host-a" / "policy.yaml"
    b = tmp_path / "host-b" / "other-name.yaml"
    for path in (a, b):
        path.parent.mkdir()
        path.write_text(RULE)
    via_arg = fingerprint_of(policy_files=[str(a)])
    assert via_arg == fingerprint_of(policy_files=[str(b)])
    assert via_arg == fingerprint_of({"MOE_POLICY_FILES": str(b)})
    assert via_arg != fingerprint_of()


def test_another_process_at_another_time_gets_the_same_fingerprint():
    """A fresh interpreter (other pid, other time, other hash seed) computes the same value."""
    code = (
        "import json; from tests.distributed.test_rank_local_fingerprint import fingerprint_of; "
        "print(json.dumps(fingerprint_of()))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
        env={"PYTHONHASHSEED": "123", "PATH": ""},
    )
    assert json.loads(out.stdout) == fingerprint_of()


def test_what_decides_changes_it(tmp_path: Path):
    """MOE_POLICY_BACKEND, the packages and a policy rule each change the fingerprint."""
    policy = tmp_path / "p.yaml"
    policy.write_text(RULE)
    base = fingerprint_of()
    changed = {
        "env backend": fingerprint_of({"MOE_POLICY_BACKEND": "triton"}),
        "packages": fingerprint_of(packages=("torch", "triton")),
        "policy rule": fingerprint_of(policy_files=[str(policy)]),
    }
    assert all(value != base for value in changed.values()), changed
    assert len(set(changed.values())) == 3
