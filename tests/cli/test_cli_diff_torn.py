"""``moe-policy diff`` over an audit log that holds a torn line: the start of one record whose
write was cut short (a full disk, RLIMIT_FSIZE, a writer killed mid-write), alone on its line."""

from __future__ import annotations

import json
from pathlib import Path

from tests.cli.runner import H200, NEMOTRON_REL, run_cli


def _torn_events(stderr: str) -> list[dict]:
    """The ``moe_policy.diff_torn_lines`` events (JSON lines: stderr is not a terminal)."""
    events = [json.loads(line) for line in stderr.splitlines()]
    return [e for e in events if e["event"] == "moe_policy.diff_torn_lines"]


def _decide(log: Path, index: int) -> None:
    """One decision appended to ``log`` by the library's own audit writer."""
    run = run_cli(
        "explain", "--model", NEMOTRON_REL, *H200, "--set", f"layer.index={index}",
        "--audit-log", str(log), "-q",
    )  # fmt: skip
    assert run.returncode == 0, run.stderr


def _cut_short(log: Path, size: int = 337) -> None:
    """What a writer killed mid-record leaves: the first ``size`` bytes of a record, no newline
    (the next record's write starts a new line first)."""
    record = log.read_bytes().split(b"\n")[0]
    with log.open("ab") as fh:
        fh.write(record[:size])


def test_diff_skips_a_torn_line_and_names_it(tmp_path: Path):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    for log in (a, b):
        for index in range(3):
            _decide(log, index)
    _cut_short(a)
    _decide(a, 3)
    _decide(b, 3)
    lines = a.read_text().split("\n")
    assert lines[3].startswith("{") and len(lines[3]) == 337 and lines[4].startswith("{")

    run = run_cli("diff", str(a), str(b))
    assert run.returncode == 0, run.stderr
    [event] = _torn_events(run.stderr)
    assert (event["level"], event["path"], event["lines"]) == ("warning", str(a), [4])
    assert event["detail"].startswith("skipped 1 torn line: the start of a record")
    words = " ".join(run.stdout.split())  # a long temporary path wraps the line
    assert words.startswith(f"A: {a} (4 records, 4 layers)") and words.endswith(" identical")

    data = run_cli("diff", "--json", str(b), str(a))
    assert data.returncode == 0, data.stderr
    assert data.json()["b"]["torn_lines"] == [4] and data.json()["a"]["torn_lines"] == []


def test_several_torn_lines_and_a_difference_keep_the_exit_code(tmp_path: Path):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    _decide(a, 0)
    _cut_short(a, 40)
    _decide(a, 1)
    _cut_short(a, 1)  # the file ends inside a torn line: nothing after it
    _decide(b, 0)
    run = run_cli("diff", str(a), str(b))
    assert run.returncode == 1, run.stderr  # layer 1 only in A
    [event] = _torn_events(run.stderr)
    assert (event["path"], event["lines"]) == (str(a), [2, 4])
    assert event["detail"].startswith("skipped 2 torn lines:")


def test_a_line_that_does_not_start_a_record_is_still_bad_input(tmp_path: Path):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    _decide(a, 0)
    _decide(b, 0)
    with a.open("a") as fh:
        fh.write("not json\n")
    run = run_cli("diff", str(a), str(b))
    assert run.returncode == 2 and run.stdout == ""
    assert run.stderr.splitlines() == [
        f"moe-policy: error: file:{a}:2:1: not JSON (Expecting value)"
    ]


def test_a_truncated_explain_json_document_is_named_where_it_breaks(tmp_path: Path):
    """A record printed over several lines (``explain --json``) that is cut short is one
    JSON document that does not parse, not a log of torn lines."""
    doc, b = tmp_path / "doc.json", tmp_path / "b.jsonl"
    _decide(b, 0)
    doc.write_text('{\n  "schema_version": 1,\n  "backend": "tr')
    run = run_cli("diff", str(doc), str(b))
    assert run.returncode == 2 and run.stdout == ""
    assert run.stderr.splitlines() == [
        f"moe-policy: error: file:{doc}:3:14: not JSON (Unterminated string starting at)"
    ]
