"""The audit file under a crowd: eight processes deciding 500 layers each into one file,
writers killed in the middle of multi-MB records, writers whose size limit
(``RLIMIT_FSIZE``) is hit halfway, and the file rotated and deleted while they write.

What must hold: every line on disk parses, except a fragment of a record whose writer died
or hit its limit in the middle of it, and that fragment stands alone on its line; every
record a writer was told was written is on disk exactly once; every failed write was
reported (``AuditWriteError`` when the audit is required, an ``audit_failed`` event when not).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.bundled import QWEN3, REPO

#: One writer: decides ``count`` layers with the real API and reports each decision to
#: the audit file, padded by ``pad`` bytes (multi-MB records for the writers to be killed).
#: It prints which layers it was told were written, which failed, and the events it saw.
WRITER = """
import json, os, resource, signal, sys
role, path, count, pad, limit, required = sys.argv[1:7]
count, pad, limit, required = int(count), int(pad), int(limit), required == "1"
if limit:  # the limit falls ``limit`` bytes past the file's size when this writer starts
    limit += os.path.getsize(path)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
from structlog.testing import capture_logs
from moe_policy.api import Selector
from moe_policy.reporting.audit import AuditSink, AuditWriteError
from moe_policy.reporting.events import Reporter

padding = "x" * pad
failed_writes = []

class Marked(AuditSink):
    # Each record names its writer first (keys are sorted), so a fragment says whose it is.
    def write(self, record):
        error = super().write({**record, "_writer": role, "padding": padding})
        if error is not None:
            failed_writes.append(record["layer"]["index"])
        return error

sink = Marked(path, required=required)
selector = Selector(sys.argv[7], environ={}, platform="cuda", capability="9.0")
reporter = Reporter()
written, raised = [], []
with capture_logs() as events:
    for layer in range(count):
        decision = selector.decide(layer_index=layer)
        try:
            reporter.report(decision, sink)
        except AuditWriteError:
            raised.append(layer)
            continue
        if layer not in failed_writes:
            written.append(layer)
failed_events = [e for e in events if e["event"] == "moe_policy.audit_failed"]
print(json.dumps({"role": role, "written": written, "raised": raised,
                  "failed": failed_writes, "failed_events": len(failed_events)}))
"""


def start_writer(
    path: Path, role: str, *, count: int = 500, pad: int = 0, limit: int = 0, required: bool = True
) -> subprocess.Popen[str]:
    args = [role, str(path), str(count), str(pad), str(limit), "1" if required else "0", QWEN3]
    return subprocess.Popen(
        [sys.executable, "-c", WRITER, *args], stdout=subprocess.PIPE, text=True, cwd=REPO
    )


def finish(proc: subprocess.Popen[str]) -> dict[str, Any]:
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, f"writer exited {proc.returncode}"
    result: dict[str, Any] = json.loads(out)
    return result


def lock_holder(path: Path) -> int | None:
    """The pid holding the exclusive flock on ``path`` (from /proc/locks), if any."""
    inode = os.stat(path).st_ino
    with open("/proc/locks", encoding="ascii") as locks:
        for line in locks:
            fields = line.split()
            if "->" in fields or len(fields) < 6 or fields[1] != "FLOCK":
                continue
            if fields[5].endswith(f":{inode}"):
                return int(fields[4])
    return None


def parse(data: bytes) -> tuple[list[dict[str, Any]], list[bytes]]:
    """The file's lines as records, and the lines that are not records (fragments)."""
    assert data.endswith(b"\n") or not data, "the file ends inside a line"
    records, fragments = [], []
    for line in data.split(b"\n")[:-1]:
        try:
            records.append(json.loads(line))
        except ValueError:
            fragments.append(line)
    return records, fragments


def layers_of(records: list[dict[str, Any]], role: str) -> Counter[int]:
    return Counter(r["layer"]["index"] for r in records if r["_writer"] == role)


@pytest.mark.slow
def test_eight_writers_with_kills_mid_record_and_a_size_limit_lose_only_what_failed(tmp_path):
    path = tmp_path / "audit.jsonl"
    path.write_bytes(b"")
    # Four plain writers, two whose size limit falls halfway through the run (one with the
    # audit required, one not), and two writing 4 MB records that are killed mid-write.
    survivors = {f"survivor-{i}": start_writer(path, f"survivor-{i}", pad=20_000) for i in range(4)}
    limited = {
        "limited-required": start_writer(path, "limited-required", pad=50_000, limit=40_000_000),
        "limited-warn": start_writer(
            path, "limited-warn", pad=50_000, limit=40_000_000, required=False
        ),
    }
    victims = {
        f"victim-{i}": start_writer(path, f"victim-{i}", count=40, pad=4_000_000) for i in range(2)
    }
    pids = {proc.pid: role for role, proc in victims.items()}
    killed_holding_the_lock = 0
    deadline = time.monotonic() + 60
    time.sleep(0.5)  # every victim has written a record or two by now
    while pids and time.monotonic() < deadline:
        holder = lock_holder(path)
        if holder in pids:  # the victim is inside its write: kill it there
            os.kill(holder, signal.SIGKILL)
            victims[pids.pop(holder)].wait()
            killed_holding_the_lock += 1
    for proc in victims.values():  # a victim never seen writing is killed anyway
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    results = {role: finish(proc) for role, proc in {**survivors, **limited}.items()}

    assert killed_holding_the_lock >= 1, "no victim was seen inside its write (/proc/locks)"
    records, fragments = parse(path.read_bytes())
    for role in survivors:
        assert layers_of(records, role) == Counter(range(500)), f"{role} lost or repeated records"
    for role in limited:
        result = results[role]
        assert Counter(result["written"]) == layers_of(records, role)
        assert result["written"] and result["failed"], f"{role}: the limit was not hit halfway"
        assert len(result["written"]) + len(result["failed"]) == 500
    # Every failed write was reported: raised when required, an event when not.
    assert results["limited-required"]["raised"] == results["limited-required"]["failed"]
    assert results["limited-warn"]["raised"] == []
    assert results["limited-warn"]["failed_events"] == len(results["limited-warn"]["failed"])
    # A fragment is the start of one record of a writer that died or hit its limit, alone.
    allowed = {role.encode() for role in (*victims, *limited)}
    owners = Counter()
    for fragment in fragments:
        assert fragment.startswith(b'{"_writer":"'), fragment[:80]
        owner = fragment[len(b'{"_writer":"') :].partition(b'"')[0]
        assert owner in allowed, f"a fragment of {owner!r}, which neither died nor hit a limit"
        assert fragment.count(b'{"_writer"') == 1, "a record glued onto a fragment"
        owners[owner] += 1
    assert all(n == 1 for n in owners.values()), owners
    victim_fragments = sum(owners[role.encode()] for role in victims)
    print(
        f"\n{len(records)} whole records, {len(fragments)} fragments "
        f"({victim_fragments} of killed writers, {killed_holding_the_lock} killed holding the lock); "
        f"limited writers: {[len(results[r]['failed']) for r in limited]} failed writes; "
        f"{path.stat().st_size / 1e6:.0f} MB"
    )


@pytest.mark.slow
def test_rotation_and_deletion_mid_run_lose_no_record_reported_written(tmp_path):
    """logrotate's moves, with four writers running: the live file renamed away, then the
    new live file archived and deleted (under the writers' lock, as a careful operator
    would). Every record reported written is in exactly one of the files."""
    import fcntl

    path = tmp_path / "audit.jsonl"
    rotated = tmp_path / "audit.jsonl.1"
    writers = {f"writer-{i}": start_writer(path, f"writer-{i}", pad=10_000) for i in range(4)}

    def lines_in(target: Path) -> int:
        try:
            return target.read_bytes().count(b"\n")
        except FileNotFoundError:
            return 0

    while lines_in(path) < 300:
        time.sleep(0.01)
    path.rename(rotated)
    while lines_in(path) < 300:
        time.sleep(0.01)
    fd = os.open(path, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)
    archived = path.read_bytes()
    path.unlink()
    fcntl.flock(fd, fcntl.LOCK_UN)
    os.close(fd)
    results = {role: finish(proc) for role, proc in writers.items()}

    records: list[dict[str, Any]] = []
    for data in (rotated.read_bytes(), archived, path.read_bytes()):
        whole, fragments = parse(data)
        assert fragments == []
        records.extend(whole)
    for role, result in results.items():
        assert result["raised"] == [] and result["failed"] == []
        assert layers_of(records, role) == Counter(range(500)), f"{role} lost or repeated records"


FORKED = """
import json, os, sys
from moe_policy.reporting.audit import AuditSink
sink = AuditSink(sys.argv[1])
assert sink.write({"_writer": "parent", "n": -1}) is None  # the file is open before the fork
children = []
for w in range(3):
    pid = os.fork()
    if pid == 0:
        errors = sum(
            sink.write({"_writer": f"child-{w}", "n": n, "pad": "x" * 1_000_000}) is not None
            for n in range(30)
        )
        os._exit(errors)
    children.append(pid)
errors = sum(
    sink.write({"_writer": "parent", "n": n, "pad": "x" * 1_000_000}) is not None
    for n in range(30)
)
print(errors + sum(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in children))
"""


@pytest.mark.slow
def test_forked_writers_of_one_sink_take_turns(tmp_path):
    """A sink opened before ``fork`` is shared by parent and children: each must write
    through its own descriptor, or the writers' lock does not separate them (an inherited
    descriptor shares its lock) and records are cut by blank lines (40 of 161 before)."""
    path = tmp_path / "audit.jsonl"
    done = subprocess.run(
        [sys.executable, "-c", FORKED, str(path)], capture_output=True, text=True, cwd=REPO
    )
    assert done.returncode == 0 and done.stdout.strip() == "0", done.stderr
    records, fragments = parse(path.read_bytes())
    assert fragments == []
    assert Counter(r["_writer"] for r in records) == {
        "parent": 31,
        "child-0": 30,
        "child-1": 30,
        "child-2": 30,
    }
