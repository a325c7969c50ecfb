"""The audit file under failure: fragments, size limits, killed writers, rotation, links,
FIFOs and foreign files. A record is whole on its own line or visibly absent."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from moe_policy.reporting.audit import AuditSink


def lines(path: Path) -> list[bytes]:
    data = path.read_bytes()
    assert data.endswith(b"\n") or not data
    return data.split(b"\n")[:-1]


def test_a_record_after_a_fragment_starts_on_its_own_line(tmp_path):
    path = tmp_path / "audit.jsonl"
    path.write_bytes(b'{"backend": "tri')  # a writer died mid-line
    sink = AuditSink(str(path))
    assert sink.write({"n": 1}) is None and sink.write({"n": 2}) is None
    assert lines(path) == [b'{"backend": "tri', b'{"n":1}', b'{"n":2}']


def test_new_files_are_private(tmp_path):
    path = tmp_path / "audit.jsonl"
    AuditSink(str(path)).write({"n": 1})
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


@pytest.mark.parametrize("kind", ["symlink", "fifo", "directory", "hard link", "policy file"])
def test_what_is_not_the_audit_file_is_refused_without_writing(tmp_path, kind):
    target = tmp_path / "target.txt"
    target.write_text("version: 1\n")
    path = tmp_path / "audit.jsonl"
    if kind == "symlink":
        path.symlink_to(target)
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    elif kind == "hard link":
        path.write_text('{"n":0}\n')
        os.link(path, tmp_path / "other.jsonl")
    else:
        path = target
    started = time.monotonic()
    error = AuditSink(str(path)).write({"n": 1})
    assert isinstance(error, OSError)
    assert time.monotonic() - started < 5  # a FIFO with no reader must not block
    assert target.read_text() == "version: 1\n"


def test_rotation_reopens_the_path(tmp_path):
    path = tmp_path / "audit.jsonl"
    sink = AuditSink(str(path))
    sink.write({"n": 1})
    path.rename(tmp_path / "audit.jsonl.1")
    sink.write({"n": 2})
    (tmp_path / "audit.jsonl.1").unlink()
    path.unlink()
    sink.write({"n": 3})
    assert lines(path) == [b'{"n":3}']
    assert sink.written == 3


WRITER = """
import os, resource, sys
from moe_policy.reporting.audit import AuditSink
limit = int(sys.argv[2])
if limit:
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    import signal; signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
sink = AuditSink(sys.argv[1])
errors = 0
for n in range(int(sys.argv[3])):
    blob = "x" * int(sys.argv[4])
    if sink.write({"pid": os.getpid(), "n": n, "blob": blob}) is not None:
        errors += 1
print(errors)
"""


def run_writer(path: Path, limit: int, count: int, size: int) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", WRITER, str(path), str(limit), str(count), str(size)],
        stdout=subprocess.PIPE,
        text=True,
    )


def test_a_size_limit_hit_mid_record_is_reported_and_leaves_the_next_line_clean(tmp_path):
    path = tmp_path / "audit.jsonl"
    limited = run_writer(path, limit=1_500_000, count=3, size=1_000_000)
    assert int(limited.communicate()[0]) >= 1  # the failed writes were reported
    healthy = run_writer(path, limit=0, count=2, size=10)
    assert int(healthy.communicate()[0]) == 0
    parsed, fragments = [], []
    for line in lines(path):
        try:
            parsed.append(json.loads(line))
        except ValueError:
            fragments.append(line)
    assert len(fragments) <= 1  # the record cut by the limit, on its own line
    survivors = [r for r in parsed if r["pid"] == healthy.pid]
    assert [r["n"] for r in survivors] == [0, 1]


def test_writers_killed_mid_record_lose_only_their_own_records(tmp_path):
    path = tmp_path / "audit.jsonl"
    survivors = [run_writer(path, limit=0, count=200, size=100) for _ in range(3)]
    victims = [run_writer(path, limit=0, count=50, size=3_000_000) for _ in range(3)]
    time.sleep(0.3)
    for victim in victims:
        victim.send_signal(signal.SIGKILL)
    for proc in (*survivors, *victims):
        proc.wait()
    # the file may end in a victim's fragment when every survivor finished before the kill;
    # the next writer's record still starts on its own line
    last = run_writer(path, limit=0, count=1, size=10)
    assert int(last.communicate()[0]) == 0
    victim_pids = {v.pid for v in victims}
    counts: dict[int, int] = {}
    for line in lines(path):
        try:
            record = json.loads(line)
        except ValueError:
            continue  # a killed writer's fragment, alone on its line
        counts[record["pid"]] = counts.get(record["pid"], 0) + 1
    for proc in survivors:
        assert counts[proc.pid] == 200
    assert counts[last.pid] == 1
    assert set(counts) - {p.pid for p in survivors} - {last.pid} <= victim_pids


def test_selectors_of_one_file_share_a_descriptor_that_reset_closes(tmp_path, make_selector, h200):
    import moe_policy
    from tests.bundled import NEMOTRON

    path = str(tmp_path / "audit.jsonl")
    first = make_selector(NEMOTRON, audit_log=path, **h200)
    second = make_selector(NEMOTRON, audit_log=path, lora=True, **h200)
    assert first.audit is second.audit
    first.select()
    second.select()
    fd = first.audit._fd  # the sink's own descriptor, read to prove it is closed
    assert fd is not None and os.fstat(fd)
    moe_policy.reset()
    with pytest.raises(OSError):
        os.fstat(fd)
    assert len(lines(Path(path))) == 2


def test_the_module_level_api_audits_without_deadlocking(tmp_path):
    """select_backend builds its cached selector under the cache's lock; opening the audit
    sink inside that build must not wait on the same lock (a thread that hangs fails this)."""
    import threading

    import moe_policy
    from tests.bundled import NEMOTRON

    path = tmp_path / "audit.jsonl"
    done: list[str] = []

    def decide() -> None:
        done.append(
            moe_policy.select_backend(
                NEMOTRON, audit_log=str(path), platform="cuda", capability="9.0"
            ).backend
        )

    worker = threading.Thread(target=decide, daemon=True)
    worker.start()
    worker.join(timeout=30)
    assert done == ["triton"]
    assert len(lines(path)) == 1


def test_a_path_with_a_nul_byte_is_a_failed_write_not_a_crash(tmp_path):
    """A policy file can spell ``"\\0"`` in a path: os.open's ValueError used to escape
    ``select`` as a traceback; it is a failed write like any other (warned, or raised when
    required)."""
    import structlog

    from moe_policy.api import Selector
    from moe_policy.reporting.audit import AuditWriteError
    from tests.bundled import NEMOTRON

    target = str(tmp_path / "a\0b.jsonl")
    error = AuditSink(target).write({"n": 1})
    assert isinstance(error, OSError) and "NUL" in str(error)
    assert list(tmp_path.iterdir()) == []
    for required in (False, True):
        policy = tmp_path.parent / f"{tmp_path.name}-nul-{required}.yaml"
        policy.write_text(
            f'version: 1\naudit:\n  path: "{tmp_path}/a\\0b.jsonl"\n'
            f"  required: {str(required).lower()}\n"
        )
        selector = Selector(
            NEMOTRON, environ={}, policy_files=[str(policy)], platform="cuda", capability="9.0"
        )
        if required:
            with pytest.raises(AuditWriteError, match="NUL byte"):
                selector.select(0)
            continue
        with structlog.testing.capture_logs() as logs:
            assert selector.select(0).backend == "triton"
        [failed] = [e for e in logs if e["event"] == "moe_policy.audit_failed"]
        assert "NUL byte" in failed["error"]


FORKING = """
import json, os, sys
import structlog
structlog.configure(logger_factory=structlog.ReturnLoggerFactory())
from moe_policy.api import Selector
path, model = sys.argv[1], sys.argv[2]
env = {"MOE_POLICY_AUDIT_LOG": path}
Selector(model, environ=env, platform="cuda", capability="9.0").select(0)
children = []
for k in range(4):
    pid = os.fork()
    if pid == 0:  # each child decides after the fork: three of their own, one the parent's
        keywords = {"max_loras": k + 1, "lora": True} if k < 3 else {}
        Selector(model, environ=env, platform="cuda", capability="9.0", **keywords).select(0)
        os._exit(0)
    children.append(pid)
print(json.dumps([os.waitpid(pid, 0)[1] for pid in children]))
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_forked_children_issue_decision_ids_and_counts_of_their_own(tmp_path):
    """Decision ids are a per-process prefix and a counter, and counts are per process: four
    children forked after the parent decided each get a prefix and a count of their own."""
    from tests.bundled import NEMOTRON, REPO

    path = tmp_path / "audit.jsonl"
    out = subprocess.run(
        [sys.executable, "-c", FORKING, str(path), NEMOTRON],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    assert out.returncode == 0 and json.loads(out.stdout) == [0, 0, 0, 0], out.stderr
    records = [json.loads(line) for line in lines(path)]
    assert len(records) == 5 and len({r["pid"] for r in records}) == 5
    assert len({r["fingerprint"] for r in records}) == 4
    prefixes = {r["decision_id"].split("-")[0] for r in records}
    assert len(prefixes) == 5, [r["decision_id"] for r in records]
    # The child that repeats the parent's decision counts it as its own first.
    assert all(r["count"] == 1 for r in records), [r["count"] for r in records]
