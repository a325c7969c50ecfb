"""``moe-policy diff``: per-layer differences between two audit logs or two decision records."""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import structlog

from moe_policy import PlatformFacts, Selector
from moe_policy.cli import diff

REPO = Path(__file__).resolve().parents[2]
MODEL = str(REPO / "configs" / "models" / "qwen3-30b-a3b.json")
FULL = ("flashinfer", "torch", "triton")


def _audit_log(
    path: Path,
    environ: dict[str, str] | None = None,
    packages: tuple[str, ...] = FULL,
    layers: range = range(4),
    repeats: int = 2,
) -> Path:
    """Write an audit log the way an engine does: every layer selected ``repeats`` times."""
    sel = Selector(
        MODEL,
        environ={"MOE_POLICY_AUDIT_LOG": str(path), **(environ or {})},
        platform=PlatformFacts("cuda", "10.0", "NVIDIA B200", packages),
    )
    with structlog.testing.capture_logs():  # keep the decision events off stdout
        for _ in range(repeats):
            for i in layers:
                sel.select(i)
    return path


def _record(path: Path, environ: dict[str, str] | None = None, layer: int | None = None) -> Path:
    """An ``explain --json``-style record: one indented JSON document."""
    sel = Selector(
        MODEL, environ=environ or {}, platform=PlatformFacts("cuda", "10.0", "NVIDIA B200", FULL)
    )
    path.write_text(json.dumps(sel.decide(layer).to_dict(), indent=2))
    return path


def _run(a: Path, b: Path, *, as_json: bool = True, shared_only: bool = False) -> int:
    return diff.run(argparse.Namespace(a=str(a), b=str(b), json=as_json, shared_only=shared_only))


def _json(
    capsys: pytest.CaptureFixture[str], a: Path, b: Path, **kw: Any
) -> tuple[int, dict[str, Any]]:
    code = _run(a, b, **kw)
    return code, json.loads(capsys.readouterr().out)


def test_identical_logs_exit_0(tmp_path: Path, capsys):
    """Two logs of the same deployment (other pids, times, repeat counts) are identical."""
    a = _audit_log(tmp_path / "a.jsonl")
    b = _audit_log(tmp_path / "b.jsonl", repeats=3)
    code, result = _json(capsys, a, b)
    assert code == 0 and result["identical"] is True
    assert result["identical_layers"] == [["moe", i] for i in range(4)]


def test_differing_logs_name_each_key_value_and_origin(tmp_path: Path, capsys):
    """Host B lacks flashinfer and sets MOE_POLICY_BACKEND: backend, packages and request differ."""
    a = _audit_log(tmp_path / "a.jsonl")
    b = _audit_log(
        tmp_path / "b.jsonl", {"MOE_POLICY_BACKEND": "triton"}, packages=("torch", "triton")
    )
    code, result = _json(capsys, a, b)
    assert code == 1 and result["identical"] is False
    [group] = result["differences"]
    assert group["layers"] == [["moe", i] for i in range(4)]
    d = group["differences"]
    assert (d["backend"]["a"], d["backend"]["b"]) == ("flashinfer_trtllm", "triton")
    assert d["fingerprint"]["a"] != d["fingerprint"]["b"]
    assert d["context"]["packages"]["a"] == {"value": list(FULL), "origin": "probe"}
    assert d["context"]["packages"]["b"]["value"] == ["torch", "triton"]
    assert set(d["context"]) == {"packages"}
    assert d["request"] == {
        "a": None,
        "b": {"backend": "triton", "origin": "env:MOE_POLICY_BACKEND"},
    }


def test_human_output_shows_both_sides(tmp_path: Path, capsys):
    """The default table names the layers, the key and each side's value with its origin."""
    a = _audit_log(tmp_path / "a.jsonl")
    b = _audit_log(tmp_path / "b.jsonl", packages=("torch", "triton"))
    code = _run(a, b, as_json=False)
    out = capsys.readouterr().out
    assert code == 1
    assert "layers moe 0–3 differ:" in out
    assert "packages: A [flashinfer, torch, triton] (probe) | B [torch, triton] (probe)" in out


def test_policy_files_and_rules_differ(tmp_path: Path, capsys):
    """A policy file on one side shows its hash and the rule it adds."""
    policy = tmp_path / "p.yaml"
    policy.write_text(
        "rules:\n  - {id: prefer-cutlass, effect: prefer, backends: [flashinfer_cutlass], reason: r}\n"
    )
    a = _record(tmp_path / "a.json")
    b = _record(tmp_path / "b.json", {"MOE_POLICY_FILES": str(policy)})
    code, result = _json(capsys, a, b)
    d = result["differences"][0]["differences"]
    assert code == 1
    assert [f["path"] for f in d["policy_files"]["b"]] == [
        f["path"] for f in d["policy_files"]["a"]
    ] + [str(policy)]
    assert d["rules"]["prefer-cutlass"]["a"] is None
    assert d["rules"]["prefer-cutlass"]["b"]["origin"].startswith(f"file:{policy}")


def test_two_single_records_are_compared_whatever_their_layers(tmp_path: Path, capsys):
    """Two ``explain --json`` records pair up even for different layers; the layer is a difference."""
    a = _record(tmp_path / "a.json", layer=3)
    b = _record(tmp_path / "b.json", layer=5)
    code, result = _json(capsys, a, b)
    assert code == 1
    assert set(result["differences"][0]["differences"]) == {"layer"}
    same_a = _record(tmp_path / "c.json", layer=3)
    assert _json(capsys, a, same_a)[0] == 0


def test_layers_on_one_side_only(tmp_path: Path, capsys):
    """Layers only one log holds make the logs differ, unless ``--shared-only``."""
    a = _audit_log(tmp_path / "a.jsonl", layers=range(4))
    b = _audit_log(tmp_path / "b.jsonl", layers=range(2, 6))
    code, result = _json(capsys, a, b)
    assert code == 1
    assert result["only_in_a"] == [["moe", 0], ["moe", 1]] and result["only_in_b"] == [
        ["moe", 4],
        ["moe", 5],
    ]
    assert _json(capsys, a, b, shared_only=True)[0] == 0


def test_agreement_lines_are_skipped(tmp_path: Path, capsys):
    """``kind: "agreement"`` lines in an audit log are not decision records and are skipped."""
    a = _audit_log(tmp_path / "a.jsonl")
    b = _audit_log(tmp_path / "b.jsonl")
    with b.open("a") as fh:
        fh.write(json.dumps({"kind": "agreement", "rank": 0, "agreed": True}) + "\n")
    code, result = _json(capsys, a, b)
    assert code == 0 and result["b"]["skipped"] == 1


@pytest.mark.parametrize(
    ("bad_line", "problem"),
    [
        ('{"not": "a record"}', "not a decision record (missing"),
        ("not json", "not JSON"),
        ("[1]", "not a decision record (a JSON list)"),
    ],
)
def test_bad_line_exits_2_naming_file_and_line(tmp_path: Path, capsys, bad_line: str, problem: str):
    """A line that is not a decision record is exit 2 with ``file:PATH:LINE`` on stderr."""
    good = _audit_log(tmp_path / "a.jsonl")
    bad = tmp_path / "bad.jsonl"
    first = good.read_text().splitlines()[0]
    bad.write_text(f"{first}\n\n{bad_line}\n")
    code = _run(good, bad)
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith(f"moe-policy: error: file:{bad}:3") and f": {problem}" in err


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (lambda r: r["layer"].update(index="strict"), "layer.index an integer"),
        (lambda r: r.update(rules=[[1]]), "rules must be objects"),
        (lambda r: r["rules"].append({"id": "x", "backends": [1]}), "backends are strings"),
        (lambda r: r.update(policy={"files": [3]}), "policy must be an object"),
        (lambda r: r.update(requested="triton"), "requested must be an object"),
        (lambda r: r["context"].update(platform=[1]), "each context entry must be an object"),
    ],
)
def test_a_record_whose_fields_have_the_wrong_types_exits_2(
    tmp_path: Path, capsys, change: Any, problem: str
):
    """A line that parses but holds the wrong types where diff reads is bad input, not a crash."""
    good = _audit_log(tmp_path / "a.jsonl")
    record = json.loads(good.read_text().splitlines()[0])
    change(record)
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(record) + "\n")
    assert _run(good, bad) == 2
    err = capsys.readouterr().err
    assert (
        err.startswith(f"moe-policy: error: file:{bad}:1: not a decision record") and problem in err
    )


@pytest.mark.parametrize(
    ("line", "problem"),
    [("[" * 100_000 + "]" * 100_000, "nested too deeply"), ("9" * 5000, "4300 digits")],
)
def test_a_line_json_cannot_hold_exits_2(tmp_path: Path, capsys, line: str, problem: str):
    good = _audit_log(tmp_path / "a.jsonl")
    bad = tmp_path / "bad.jsonl"
    bad.write_text(line + "\n")
    assert _run(good, bad) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"moe-policy: error: file:{bad}:1: not JSON") and problem in err


def test_text_that_is_not_utf8_exits_2_at_its_line_and_column(tmp_path: Path, capsys):
    good = _audit_log(tmp_path / "a.jsonl")
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b'{"a": 1}\n{"b": "\xff"}\n')
    assert _run(good, bad) == 2
    assert capsys.readouterr().err.startswith(f"moe-policy: error: file:{bad}:2:8: invalid UTF-8")


def test_a_fifo_or_a_directory_is_refused_without_waiting(tmp_path: Path, capsys):
    import os

    good = _audit_log(tmp_path / "a.jsonl")
    os.mkfifo(tmp_path / "fifo")
    for other in (tmp_path / "fifo", tmp_path):
        assert _run(good, other) == 2
        assert "cannot read: not a regular file" in capsys.readouterr().err


def test_unreadable_file_exits_2(tmp_path: Path, capsys):
    """A missing file is exit 2 naming it."""
    good = _audit_log(tmp_path / "a.jsonl")
    code = _run(good, tmp_path / "missing.jsonl")
    assert code == 2 and "missing.jsonl: cannot read" in capsys.readouterr().err


def test_console_script(tmp_path: Path):
    """``moe-policy diff A B --json`` through the installed console script: exit 1 and JSON out."""
    script = Path(sys.executable).with_name("moe-policy")
    if not script.exists() and shutil.which("moe-policy") is None:
        pytest.skip("console script not installed")
    a = _audit_log(tmp_path / "a.jsonl")
    b = _audit_log(tmp_path / "b.jsonl", packages=("torch", "triton"))
    out = subprocess.run(
        [str(script), "diff", str(a), str(b), "--json"], capture_output=True, text=True
    )
    assert out.returncode == 1, out.stderr
    assert json.loads(out.stdout)["differences"][0]["differences"]["backend"]["b"] == "triton"
