"""Cross-rank agreement on 4 gloo ranks (torch.multiprocessing spawn), every scenario in one group.

The group runs once per test session (``tests.distributed.group`` in a subprocess, so this process
never imports torch for it); with pytest-xdist the workers share that one run
through a lock file. Ranks 0–1 stand in for host-a, ranks 2–3 for host-b.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch.distributed")

HERE = Path(__file__).resolve().parent
WORLD = 4
#: Seconds before the whole group is killed (it takes about 20 s on two cores).
GROUP_TIMEOUT = 150


def _run_group(out: Path) -> None:
    cmd = [
        sys.executable,
        "-m",
        "tests.distributed.group",
        "--backend",
        "gloo",
        "--nproc",
        str(WORLD),
        "--out",
        str(out),
        "--simulate-hosts",
        "--timeout",
        str(GROUP_TIMEOUT - 10),
        "--pg-timeout",
        "30",
    ]
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        cwd=HERE.parents[1],
    )
    try:
        output, _ = proc.communicate(timeout=GROUP_TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        pytest.fail(f"the gloo group hung (killed after {GROUP_TIMEOUT} s):\n{output[-4000:]}")
    if proc.returncode != 0:
        pytest.fail(f"the gloo group failed (exit {proc.returncode}):\n{output[-4000:]}")


@pytest.fixture(scope="session")
def group_dir(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> Path:
    """The directory holding every rank's results (one run, shared by xdist workers)."""
    base = tmp_path_factory.getbasetemp()
    root = base if worker_id == "master" else base.parent
    out = root / "gloo-agreement"
    with open(root / "gloo-agreement.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (out / "done").exists():
            _run_group(out)
            (out / "done").write_text("")
    return out


@pytest.fixture(scope="session")
def results(group_dir: Path) -> dict[str, list[dict[str, Any]]]:
    """Scenario name -> the per-rank outcomes, in rank order."""
    by_scenario: dict[str, list[dict[str, Any]]] = {}
    for rank in range(WORLD):
        data = json.loads((group_dir / f"rank{rank}.json").read_text())
        for result in data["results"]:
            assert result["raised"] != "crash", result["message"]
            by_scenario.setdefault(result["scenario"], []).append(result)
    return by_scenario


def _events(result: dict[str, Any], name: str) -> Iterator[dict[str, Any]]:
    return (e for e in result["events"] if e["event"] == name)


def test_agreement_passes_on_every_rank(results):
    """Identical decisions: every rank gets an agreed report and an info ``moe_policy.agreement`` event."""
    for r in results["agree"]:
        assert r["raised"] is None
        assert r["report"]["agreed"] is True
        assert (r["report"]["layers"], r["report"]["shared_layers"]) == (9, 9)
        [event] = _events(r, "moe_policy.agreement")
        assert event["log_level"] == "info"
        assert (event["agreed"], event["rank"], event["world_size"]) == (True, r["rank"], WORLD)


def test_env_backend_on_rank_3_fails_every_rank_naming_rank_3(results):
    """MOE_POLICY_BACKEND on rank 3 only: the same DecisionMismatchError on all 4 ranks."""
    outcomes = results["env_backend"]
    assert [r["raised"] for r in outcomes] == ["DecisionMismatchError"] * WORLD
    assert len({r["message"] for r in outcomes}) == 1
    message = outcomes[0]["message"]
    assert "rank 3 (host-b)" in message
    assert "env:MOE_POLICY_BACKEND" in message
    mismatch = outcomes[0]["report"]["mismatches"][0]
    assert [(s["backend"], s["ranks"]) for s in mismatch["sides"]] == [
        ("flashinfer_trtllm", [0, 1, 2]),
        ("triton", [3]),
    ]
    [request] = [d for d in mismatch["differences"] if d["key"] == "request"]
    assert [(v["value"], v["ranks"], v["origins"]) for v in request["values"]] == [
        (None, [0, 1, 2], []),
        ("triton", [3], ["env:MOE_POLICY_BACKEND"]),
    ]


def test_host_without_flashinfer_is_named_by_packages(results):
    """Ranks 2–3 (host-b) lack flashinfer on a dry-run B200: the error names ``packages`` and the host."""
    outcomes = results["packages"]
    assert [r["raised"] for r in outcomes] == ["DecisionMismatchError"] * WORLD
    message = outcomes[0]["message"]
    assert "`packages`" in message and "lacking flashinfer" in message
    assert "ranks 2–3 (host-b)" in message
    differences = outcomes[0]["report"]["mismatches"][0]["differences"]
    assert [d["key"] for d in differences] == ["packages"]
    assert differences[0]["values"][1]["lacking"] == ["flashinfer"]


def test_rank_without_moe_layers_participates(results):
    """Rank 1 has no MoE layer and the two stages own different layers: agreement, no error."""
    for r in results["pipeline"]:
        assert r["raised"] is None
        report = r["report"]
        assert report["agreed"] is True
        assert report["ranks_without_layers"] == [1]
        assert (report["layers"], report["shared_layers"]) == (8, 4)


def test_warn_mode_logs_instead_of_raising(results):
    """consistency: warn: no exception, a ``moe_policy.decision_mismatch`` warning on every rank."""
    for r in results["warn"]:
        assert r["raised"] is None
        assert r["report"]["agreed"] is False and r["report"]["mode"] == "warn"
        [event] = _events(r, "moe_policy.decision_mismatch")
        assert event["log_level"] == "warning"
        assert event["mismatched_layers"] == 9
        assert "env:MOE_POLICY_BACKEND" in event["detail"]


def test_strictest_mode_applies_on_every_rank(results):
    """Rank 0 says warn, the others error: every rank raises, so no rank runs on alone."""
    outcomes = results["mixed_mode"]
    assert [r["raised"] for r in outcomes] == ["DecisionMismatchError"] * WORLD
    assert "`consistency` differs" in outcomes[0]["message"]


def test_same_backend_with_other_inputs_passes_with_a_warning(results):
    """Rank 3 lacks only deep_ep: backends agree, fingerprints differ: passes, warns naming packages."""
    for r in results["inputs_differ"]:
        assert r["raised"] is None and r["report"]["agreed"] is True
        [event] = _events(r, "moe_policy.decision_inputs_differ")
        assert event["log_level"] == "warning"
        assert event["differences"][0]["differences"][0]["key"] == "packages"


def test_a_rank_that_cannot_build_its_summary_fails_every_rank(results):
    """An invalid ``mode=`` on rank 3: it raises PolicyError, the others AgreementCheckError naming it."""
    outcomes = results["bad_mode"]
    assert [r["raised"] for r in outcomes] == ["AgreementCheckError"] * 3 + ["PolicyError"]
    assert "rank 3 (host-b)" in outcomes[0]["message"] and "api:mode" in outcomes[0]["message"]


def test_a_rank_whose_selection_raises_inside_the_check_fails_every_rank(results):
    """Rank 3's decisions are a generator whose first selection raises (strict mode, a
    backend its host lacks): it raises BackendOverrideError, the others AgreementCheckError
    naming it, after the one round; none is left waiting in the collective."""
    outcomes = results["raising_selection"]
    assert [r["raised"] for r in outcomes] == ["AgreementCheckError"] * 3 + ["BackendOverrideError"]
    assert "rank 3 (host-b)" in outcomes[0]["message"]
    assert "BackendOverrideError" in outcomes[0]["message"]


def test_a_required_audit_one_rank_cannot_open_fails_every_rank(results):
    """Rank 3's required audit file cannot be opened: it raises AuditWriteError, the others
    AgreementCheckError naming it, instead of three ranks starting and one stopping."""
    outcomes = results["required_audit"]
    assert [r["raised"] for r in outcomes] == ["AgreementCheckError"] * 3 + ["AuditWriteError"]
    assert "rank 3 (host-b)" in outcomes[0]["message"]
    assert "AuditWriteError" in outcomes[0]["message"]
    assert "no-such-directory" in outcomes[3]["message"]


def test_outcome_is_audited_once_per_rank(results, group_dir):
    """Each rank appends one ``kind: "agreement"`` line with its rank and the world size."""
    lines = [json.loads(x) for x in (group_dir / "audit.jsonl").read_text().splitlines()]
    records = [x for x in lines if x.get("kind") == "agreement"]
    assert sorted(x["rank"] for x in records) == list(range(WORLD))
    for record in records:
        assert (
            record["world_size"] == WORLD and record["agreed"] is True and record["mode"] == "error"
        )
        assert {"timestamp", "host", "pid", "layers", "mismatched_layers"} <= set(record)
    assert any(x.get("kind") is None for x in lines)  # the decisions themselves are audited too
    import jsonschema

    import moe_policy

    validator = jsonschema.Draft202012Validator(moe_policy.schema("audit"))
    for line in lines:  # both kinds, as the ranks wrote them into one file
        validator.validate(line)
