"""The agreement comparison without a process group: summaries in, one verdict for every rank out."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import structlog

from moe_policy import PlatformFacts, Selector
from moe_policy.errors import MoEPolicyError, PolicyError
from moe_policy.fleet.agreement import (
    compare_summaries,
    compress,
    format_ranks,
    local_mode,
    rank_summary,
)
from moe_policy.fleet.distributed import DecisionMismatchError

MODEL = str(Path(__file__).resolve().parents[2] / "configs" / "models" / "qwen3-30b-a3b.json")
FULL = ("flashinfer", "torch", "triton")


def _decisions(
    environ: dict[str, str] | None = None,
    packages: Sequence[str] = FULL,
    layers: Sequence[int] = range(4),
) -> list[Any]:
    sel = Selector(
        MODEL,
        environ=environ or {},
        platform=PlatformFacts("cuda", "10.0", "NVIDIA B200", tuple(packages)),
    )
    return [sel.decide(i) for i in layers]


def _summaries(per_rank: Sequence[list[Any]], hosts: Sequence[str]) -> list[dict[str, Any]]:
    return [
        rank_summary(d, rank=r, host=hosts[r], mode=local_mode(d, None))
        for r, d in enumerate(per_rank)
    ]


def test_ranks_compress_into_ranges_per_host():
    """Rank lists read as ranges, grouped by host: ``ranks 0–3 (host-a), 8–11 (host-c)``."""
    assert compress([7, 0, 1, 2, 3, 9]) == "0–3, 7, 9"
    hosts = {r: "host-a" if r < 4 else "host-b" if r < 8 else "host-c" for r in range(12)}
    assert format_ranks([4, 5, 6, 7], hosts) == "ranks 4–7 (host-b)"
    assert format_ranks([0, 1, 2, 3, 8, 9, 10, 11], hosts) == "ranks 0–3 (host-a), 8–11 (host-c)"
    assert format_ranks([3], hosts) == "rank 3 (host-a)"


def test_eight_ranks_two_hosts_names_the_host_lacking_flashinfer():
    """Ranks 4–7 of host-b lack flashinfer: sides, ranks, host and the missing package are named."""
    per_rank = [_decisions(packages=FULL if r < 4 else ("torch", "triton")) for r in range(8)]
    hosts = ["host-a"] * 4 + ["host-b"] * 4
    reports = [compare_summaries(_summaries(per_rank, hosts), rank=r) for r in range(8)]
    assert {r.message for r in reports} == {reports[0].message}
    report = reports[0]
    assert not report.agreed and report.mode == "error"
    [mismatch] = report.mismatches
    assert mismatch.layers == (("moe", 0), ("moe", 1), ("moe", 2), ("moe", 3))
    assert [(s.backend, s.ranks) for s in mismatch.sides] == [
        ("flashinfer_trtllm", (0, 1, 2, 3)),
        ("triton", (4, 5, 6, 7)),
    ]
    [packages] = mismatch.differences
    assert packages.key == "packages"
    assert packages.values[1].ranks == (4, 5, 6, 7) and packages.values[1].lacking == (
        "flashinfer",
    )
    assert "ranks 4–7 (host-b), lacking flashinfer" in report.message
    assert "layers moe 0–3" in report.message


def test_layers_are_compared_only_among_ranks_that_hold_them():
    """Pipeline stages with disjoint layer ranges never disagree, whatever their inputs."""
    per_rank = [
        _decisions(layers=range(4)),
        [],
        _decisions(packages=("torch", "triton"), layers=range(4, 8)),
    ]
    report = compare_summaries(_summaries(per_rank, ["a", "a", "b"]), rank=1)
    assert report.agreed
    assert (report.layers, report.shared_layers, report.ranks_without_layers) == (8, 0, (1,))


def test_a_policy_rule_on_one_rank_is_named_with_its_file(tmp_path: Path):
    """A rule present on one rank only is a named difference (``rule <id>``, with its file)."""
    policy = tmp_path / "prefer.yaml"
    policy.write_text(
        "rules:\n  - {id: prefer-cutlass, effect: prefer, backends: [flashinfer_cutlass], "
        "reason: test}\n"
    )
    plain = _decisions()
    ruled = _decisions({"MOE_POLICY_FILES": str(policy)})
    report = compare_summaries(_summaries([plain, ruled], ["a", "a"]), rank=0)
    assert not report.agreed
    keys = [d.key for d in report.mismatches[0].differences]
    assert "rule prefer-cutlass" in keys and "policy.files" in keys
    assert str(policy) in report.message


def test_modes_combine_to_the_strictest_and_ranks_without_decisions_defer():
    """error anywhere wins; a rank with no decisions states no mode; all-warn stays warn."""
    warn = _decisions({"MOE_POLICY_CONSISTENCY": "warn"})
    error = _decisions()
    assert compare_summaries(_summaries([warn, error], ["a", "a"]), rank=0).mode == "error"
    assert compare_summaries(_summaries([warn, []], ["a", "a"]), rank=0).mode == "warn"
    assert compare_summaries(_summaries([[], []], ["a", "a"]), rank=0).mode == "error"
    assert local_mode(warn, None) == ("warn", "env:MOE_POLICY_CONSISTENCY")
    assert local_mode(error, "warn") == ("warn", "api:mode")


def test_a_bad_mode_argument_is_a_policy_error():
    """``mode=`` accepts error or warn only."""
    with pytest.raises(PolicyError, match="api:mode"):
        local_mode([], "strict")


def test_mismatch_error_is_a_moe_policy_error():
    """DecisionMismatchError subclasses MoEPolicyError and carries the report."""
    per_rank = [_decisions(), _decisions({"MOE_POLICY_BACKEND": "triton"})]
    report = compare_summaries(_summaries(per_rank, ["a", "b"]), rank=0)
    error = DecisionMismatchError(report)
    assert isinstance(error, MoEPolicyError) and error.report is report
    assert "rank 1 (b)" in str(error) and "env:MOE_POLICY_BACKEND" in str(error)


def test_summary_is_compact_and_json_serialisable():
    """Layers with equal inputs share one inputs entry; the summary is plain JSON."""
    summary = rank_summary(_decisions(layers=range(128)), rank=0, host="a", mode=None)
    assert len(summary["layers"]) == 128 and len(summary["inputs"]) == 1
    assert "layer.index" not in summary["inputs"][0]["context"]
    json.dumps(summary)


def test_single_process_without_a_process_group_agrees_trivially():
    """Without torch.distributed initialised the check is a one-rank check and logs agreement."""
    pytest.importorskip("torch.distributed")
    from moe_policy.fleet.distributed import check_agreement

    with structlog.testing.capture_logs() as events:
        report = check_agreement(_decisions())
    assert report.agreed and report.ranks == (0,)
    assert [e["event"] for e in events] == ["moe_policy.agreement"]


def test_importing_the_module_does_not_import_torch():
    """``moe_policy.fleet.distributed`` imports torch only inside ``check_agreement``."""
    import subprocess

    code = "import sys, moe_policy.fleet.distributed, moe_policy.fleet.agreement, moe_policy.cli.diff; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_nccl_device_prefers_bound_then_set_then_local_rank(monkeypatch):
    """The object collective's GPU: the group's bound device, a device the engine set, LOCAL_RANK's."""
    from types import SimpleNamespace

    from moe_policy.fleet.distributed import nccl_device

    def fakes(bound: int | None, current: int) -> tuple[Any, Any]:
        group = SimpleNamespace(
            bound_device_id=None if bound is None else SimpleNamespace(index=bound)
        )
        dist = SimpleNamespace(group=SimpleNamespace(WORLD=group))
        torch = SimpleNamespace(
            cuda=SimpleNamespace(current_device=lambda: current, device_count=lambda: 4)
        )
        return dist, torch

    monkeypatch.setenv("LOCAL_RANK", "6")
    assert nccl_device(*fakes(bound=3, current=1), None) == 3
    assert nccl_device(*fakes(bound=None, current=1), None) == 1
    assert nccl_device(*fakes(bound=None, current=0), None) == 2  # LOCAL_RANK 6 on 4 visible GPUs
    monkeypatch.delenv("LOCAL_RANK")
    assert nccl_device(*fakes(bound=None, current=0), None) == 0


def test_agreement_record_follows_the_audit_settings(tmp_path: Path):
    """The audit.path setting gets a ``kind: "agreement"`` line; a required audit that fails raises."""
    pytest.importorskip("torch.distributed")
    from moe_policy.fleet.distributed import check_agreement
    from moe_policy.reporting.audit import AuditWriteError

    log = tmp_path / "audit.jsonl"
    with structlog.testing.capture_logs():
        check_agreement(_decisions({"MOE_POLICY_AUDIT_LOG": str(log)}))
    [record] = [json.loads(line) for line in log.read_text().splitlines()]
    assert (record["kind"], record["rank"], record["world_size"], record["agreed"]) == (
        "agreement",
        0,
        1,
        True,
    )
    assert record["local_mode"] == {"value": "error", "origin": record["local_mode"]["origin"]}
    unwritable = {"MOE_POLICY_AUDIT_LOG": str(tmp_path), "MOE_POLICY_AUDIT_REQUIRED": "1"}
    with structlog.testing.capture_logs(), pytest.raises(AuditWriteError):
        check_agreement(_decisions(unwritable))
