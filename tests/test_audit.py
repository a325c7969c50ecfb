"""The JSON-lines audit sink: concurrent writers lose nothing; a broken sink warns or raises."""

from __future__ import annotations

import errno
import json
import multiprocessing
import os
from collections import Counter
from pathlib import Path

import pytest
import structlog

from moe_policy.api import Selector
from moe_policy.core.origin import Origin
from moe_policy.reporting.audit import AuditWriteError
from moe_policy.settings import Entry
from tests.bundled import NEMOTRON

PROCESSES = 8
DECISIONS = 500
AUDIT_KEYS = {"timestamp", "host", "pid", "rank", "world_size", "count"}


def _dry_run(path: str, *extra: Entry) -> list[Entry]:
    api = Origin.api()
    return [
        Entry("audit.path", path, api),
        Entry("platform", "cuda", api),
        Entry("device.capability", "9.0", api),
        Entry("lora.enabled", True, api),
        *extra,
    ]


def _select_many(path: str) -> int:
    """Worker: one Selector, DECISIONS selections, every one audited into ``path``."""
    structlog.configure(logger_factory=structlog.ReturnLoggerFactory())  # keep the worker quiet
    selector = Selector(NEMOTRON, environ={}, explicit=_dry_run(path))
    for _ in range(DECISIONS):
        selector.select()
    return os.getpid()


@pytest.mark.slow
def test_eight_processes_share_one_audit_file_without_torn_or_lost_lines(tmp_path):
    """8 processes x 500 decisions into one O_APPEND file: exactly 4000 whole JSON lines."""
    path = str(tmp_path / "audit.jsonl")
    with multiprocessing.get_context("spawn").Pool(PROCESSES) as pool:
        pids = pool.map(_select_many, [path] * PROCESSES)
    lines = Path(path).read_bytes().split(b"\n")
    assert lines[-1] == b""
    records = [json.loads(line) for line in lines[:-1]]  # a torn line would not parse
    assert len(records) == PROCESSES * DECISIONS
    per_pid = Counter(r["pid"] for r in records)
    assert per_pid == dict.fromkeys(pids, DECISIONS)
    # Repeats are counted, never dropped: each process numbers its decisions 1..500.
    for pid in pids:
        assert sorted(r["count"] for r in records if r["pid"] == pid) == list(
            range(1, DECISIONS + 1)
        )
    assert len({r["fingerprint"] for r in records}) == 1
    assert all(set(r) >= AUDIT_KEYS and r["backend"] == "triton" for r in records)


def _broken_targets(tmp_path: Path) -> list[tuple[str, str]]:
    targets = [("missing directory", str(tmp_path / "no" / "such" / "dir" / "audit.jsonl"))]
    if Path("/dev/full").exists():
        targets.append(("full disk", "/dev/full"))
    return targets


def test_read_only_directory_gives_a_warning_event_and_a_decision(tmp_path):
    """A directory the process may not write to: the decision comes back, with moe_policy.audit_failed."""
    if os.geteuid() == 0:
        pytest.skip(
            "root writes into read-only directories; see the missing-directory and full-disk cases"
        )
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o555)
    selector = Selector(NEMOTRON, environ={}, explicit=_dry_run(str(locked / "audit.jsonl")))
    with structlog.testing.capture_logs() as logs:
        decision = selector.select()
    assert decision.backend == "triton"
    [failed] = [e for e in logs if e["event"] == "moe_policy.audit_failed"]
    assert failed["log_level"] == "warning" and "Permission denied" in failed["error"]


@pytest.mark.parametrize("case", ["missing directory", "full disk"])
def test_unwritable_audit_target_gives_a_warning_event_and_a_decision(tmp_path, case):
    """A sink that cannot write (missing directory, full disk) warns for every lost line,
    naming the decision and counting the failures; the decision is returned."""
    targets = dict(_broken_targets(tmp_path))
    if case not in targets:
        pytest.skip(f"no {case} target on this system")
    selector = Selector(NEMOTRON, environ={}, explicit=_dry_run(targets[case]))
    with structlog.testing.capture_logs() as logs:
        first = selector.select()
        second = selector.select()
    assert first.backend == second.backend == "triton"
    failures = [e for e in logs if e["event"] == "moe_policy.audit_failed"]
    assert [e["failures"] for e in failures] == [1, 2]
    assert [e["decision_id"] for e in failures] == [first.decision_id, second.decision_id]
    assert {e["log_level"] for e in failures} == {"warning"}
    assert {e["path"] for e in failures} == {targets[case]}


def test_permission_error_takes_the_same_path(tmp_path, monkeypatch):
    """EACCES from open (a read-only directory for a non-root user) warns and still decides."""
    real_open = os.open
    target = str(tmp_path / "audit.jsonl")

    def refuse(path, *args, **kwargs):
        if path == target:
            raise PermissionError(errno.EACCES, "Permission denied", path)
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", refuse)
    selector = Selector(NEMOTRON, environ={}, explicit=_dry_run(target))
    with structlog.testing.capture_logs() as logs:
        decision = selector.select()
    assert decision.backend == "triton"
    [failed] = [e for e in logs if e["event"] == "moe_policy.audit_failed"]
    assert "Permission denied" in failed["error"]


@pytest.mark.parametrize("case", ["missing directory", "full disk"])
def test_required_audit_that_cannot_be_written_raises(tmp_path, case):
    """With audit.required the same failure is an AuditWriteError naming the path."""
    targets = dict(_broken_targets(tmp_path))
    if case not in targets:
        pytest.skip(f"no {case} target on this system")
    required = Entry("audit.required", True, Origin.api())
    selector = Selector(NEMOTRON, environ={}, explicit=_dry_run(targets[case], required))
    with pytest.raises(AuditWriteError, match="could not be written") as info:
        selector.select()
    assert targets[case] in str(info.value)


def test_audit_required_from_a_policy_file(tmp_path):
    """`audit: {required: true}` in a policy file makes a failed write an error too."""
    policy = tmp_path / "audit.yaml"
    policy.write_text(
        f"version: 1\naudit:\n  path: {tmp_path}/missing/audit.jsonl\n  required: true\n"
    )
    api = Origin.api()
    explicit = [Entry("platform", "cuda", api), Entry("device.capability", "9.0", api)]
    selector = Selector(NEMOTRON, environ={}, policy_files=[str(policy)], explicit=explicit)
    assert selector.settings.values["audit.required"].origin == f"file:{policy}:4:13"
    with pytest.raises(AuditWriteError):
        selector.select()


def test_audit_path_from_the_environment(tmp_path):
    """MOE_POLICY_AUDIT_LOG turns the sink on; every select appends one line."""
    path = tmp_path / "env-audit.jsonl"
    api = Origin.api()
    selector = Selector(
        NEMOTRON,
        environ={"MOE_POLICY_AUDIT_LOG": str(path)},
        explicit=[Entry("platform", "cuda", api), Entry("device.capability", "9.0", api)],
    )
    for _ in range(3):
        selector.select()
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["count"] for r in records] == [1, 2, 3]


ENGINE_WITHOUT_LOGGING = """
import sys
from moe_policy.api import Selector
selector = Selector(sys.argv[1], environ={"MOE_POLICY_AUDIT_LOG": sys.argv[2]},
                    platform="cuda", capability="9.0")
print(selector.select(0).backend)
"""


def test_a_newline_in_a_field_never_splits_the_stdlib_log_line(tmp_path):
    """An engine that configured no logging: the audit_failed warning reaches stderr through
    Python's last-resort handler, once and on one line, even when the path holds a newline
    (values with any whitespace or control character are quoted); stdout stays clean."""
    import subprocess
    import sys

    from tests.bundled import REPO

    target = str(tmp_path / "missing\nERROR:moe_policy.forged" / "audit.jsonl")
    out = subprocess.run(
        [sys.executable, "-c", ENGINE_WITHOUT_LOGGING, NEMOTRON, target],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout == "triton\n"
    [line] = out.stderr.splitlines()
    assert line.startswith("moe_policy.audit_failed ")
    assert f"path={target!r}" in line
