"""Fingerprints: the same situation gives the same fingerprint everywhere; what decides changes it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.bundled import NEMOTRON, REPO

SCRIPT = """
import json, sys
from moe_policy.api import Selector, explicit_entries
from moe_policy.core.origin import Origin
policy = sys.argv[1] if len(sys.argv) > 1 else None
sel = Selector({model!r}, environ={{}}, policy_files=[policy] if policy else None,
               explicit=explicit_entries(dict(platform="cuda", capability="9.0", lora=True), None, Origin.api()))
print(json.dumps([sel.decide(i).fingerprint for i in (0, 7)]))
"""


def _fingerprints(*args: str, seed: str) -> list[str]:
    env = {**os.environ, "PYTHONHASHSEED": seed}
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT.format(model=NEMOTRON), *args],
        capture_output=True,
        text=True,
        check=True,
        env=env,
        cwd=REPO,
    )
    return json.loads(out.stdout)


def test_fresh_processes_with_other_hash_seeds_agree(tmp_path: Path):
    """Two interpreters with different PYTHONHASHSEED compute identical fingerprints."""
    assert _fingerprints(seed="1") == _fingerprints(seed="12345")


def test_policy_path_does_not_enter_the_fingerprint(tmp_path: Path):
    """The same policy content at two paths gives one fingerprint; other content another."""
    a = tmp_path / "a" / "policy.yaml"
    b = tmp_path / "b" / "renamed.yaml"
    c = tmp_path / "c.yaml"
    for path in (a, b):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("mode: warn\n")
    c.write_text("mode: strict\n")
    fa, fb, fc = (_fingerprints(str(p), seed="0")[0] for p in (a, b, c))
    assert fa == fb != fc


def test_layer_index_is_rank_local_unless_a_rule_uses_it(make_selector, h200, tmp_path: Path):
    """Layers 0 and 7 share a fingerprint, unless a rule conditions on layer.index."""
    sel = make_selector(NEMOTRON, **h200)
    assert sel.decide(0).fingerprint == sel.decide(7).fingerprint
    policy = tmp_path / "p.yaml"
    policy.write_text(
        "rules:\n  - {id: first-layer, when: {layer.index: 0}, effect: prefer, backends: [flashinfer_cutlass], reason: x}\n"
    )
    sel = make_selector(NEMOTRON, policy_files=[str(policy)], **h200)
    assert sel.decide(0).fingerprint != sel.decide(7).fingerprint
    assert (sel.decide(0).backend, sel.decide(7).backend) == ("flashinfer_cutlass", "triton")


def test_what_decides_changes_the_fingerprint(make_selector, h200):
    """A request, the packages or the mode each change the fingerprint."""
    base = make_selector(NEMOTRON, **h200).decide().fingerprint
    assert make_selector(NEMOTRON, backend="triton", **h200).decide().fingerprint != base
    assert (
        make_selector(NEMOTRON, packages=["torch", "triton"], **h200).decide().fingerprint != base
    )
    assert make_selector(NEMOTRON, mode="strict", **h200).decide().fingerprint != base
    assert make_selector(NEMOTRON, **h200).decide().fingerprint == base


def test_rule_content_enters_the_fingerprint(make_selector, h200, tmp_path: Path):
    """Policies whose rules share ids but differ in backends or action decide differently,
    so their fingerprints differ (also when the digests are computed in one process)."""
    rules = {
        "forbid-triton": "{id: r, effect: forbid, backends: [triton], reason: x}",
        "forbid-cutlass": "{id: r, effect: forbid, backends: [flashinfer_cutlass], reason: x}",
        "audit-triton": "{id: r, effect: forbid, backends: [triton], reason: x, action: audit}",
    }
    decisions = {}
    for name, rule in rules.items():
        policy = tmp_path / f"{name}.yaml"
        policy.write_text(f"rules:\n  - {rule}\n")
        decisions[name] = make_selector(NEMOTRON, policy_files=[str(policy)], **h200).decide()
    assert {name: d.backend for name, d in decisions.items()} == {
        "forbid-triton": "flashinfer_cutlass",
        "forbid-cutlass": "triton",
        "audit-triton": "triton",
    }
    assert len({d.fingerprint for d in decisions.values()}) == 3


def test_record_has_no_host_pid_or_time(make_selector, h200):
    """The decision record itself carries no host, pid or timestamp (the audit line adds them)."""
    record = make_selector(NEMOTRON, **h200).decide().to_dict()
    assert not {"host", "pid", "timestamp"} & set(record)
