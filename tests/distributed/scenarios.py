"""Agreement scenarios that one spawned rank runs in order (shared by the gloo tests and run_nccl.py).

Each scenario builds this rank's decisions on a dry-run B200 (platform cuda,
capability 10.0) for Qwen3-30B-A3B, a gated-SiLU BF16 model where FlashInfer wins
when it is installed, calls ``check_agreement`` once inside
``structlog.testing.capture_logs`` and returns a JSON-serialisable outcome.
"Host B" is the upper half of the ranks; the last rank is the odd one out.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]

MODEL = str(REPO / "configs" / "models" / "qwen3-30b-a3b.json")
ALL_PACKAGES = ("deep_ep", "flashinfer", "torch", "triton")
NO_FLASHINFER = ("deep_ep", "torch", "triton")
NO_DEEP_EP = ("flashinfer", "torch", "triton")
LAYERS = range(8)
DRAFT_INDEX = 8


def _selector(environ: Mapping[str, str], packages: Sequence[str]) -> Any:
    from moe_policy import PlatformFacts, Selector

    return Selector(
        MODEL,
        environ=dict(environ),
        platform=PlatformFacts("cuda", "10.0", "NVIDIA B200", tuple(packages)),
    )


def _decisions(
    environ: Mapping[str, str] | None = None,
    packages: Sequence[str] = ALL_PACKAGES,
    layers: Sequence[int] = LAYERS,
    draft: bool = True,
) -> list[Any]:
    selector = _selector(environ or {}, packages)
    out = [selector.select(i) for i in layers]
    if draft:
        out.append(selector.select(DRAFT_INDEX, "draft"))
    return out


def agree(rank: int, world: int, _out: Path) -> dict[str, Any]:
    """Every rank decides the same: agreement."""
    return {"decisions": _decisions()}


def env_backend(rank: int, world: int, _out: Path) -> dict[str, Any]:
    """The last rank alone has MOE_POLICY_BACKEND=triton (others auto -> flashinfer_trtllm)."""
    env = {"MOE_POLICY_BACKEND": "triton"} if rank == world - 1 else {}
    return {"decisions": _decisions(env)}


def packages(rank: int, world: int, _out: Path) -> dict[str, Any]:
    """Host B's ranks (the upper half) lack flashinfer."""
    return {"decisions": _decisions(packages=NO_FLASHINFER if rank >= world // 2 else ALL_PACKAGES)}


def pipeline(rank: int, world: int, _out: Path) -> dict[str, Any]:
    """Rank 1 owns no MoE layer; stage B (upper half) owns other layers and lacks flashinfer."""
    if rank == 1:
        return {"decisions": []}
    if rank >= world // 2 and world > 2:
        return {"decisions": _decisions(packages=NO_FLASHINFER, layers=range(4, 8), draft=False)}
    return {"decisions": _decisions(layers=range(4), draft=False)}


def warn(rank: int, world: int, _out: Path) -> dict[str, Any]:
    """consistency: warn on every rank (env), the last rank requests triton: logged, not raised."""
    env = {"MOE_POLICY_CONSISTENCY": "warn"}
    if rank == world - 1:
        env["MOE_POLICY_BACKEND"] = "triton"
    return {"decisions": _decisions(env)}


def mixed_mode(rank: int, world: int, _out: Path) -> dict[str, Any]:
    """Rank 0 says warn, the others error, the last rank differs: the strictest (error) applies."""
    env = {"MOE_POLICY_CONSISTENCY": "warn"} if rank == 0 else {}
    if rank == world - 1:
        env["MOE_POLICY_BACKEND"] = "triton"
    return {"decisions": _decisions(env)}


def inputs_differ(rank: int, world: int, _out: Path) -> dict[str, Any]:
    """The last rank lacks deep_ep, which no candidate here needs: same backend, other fingerprint."""
    return {"decisions": _decisions(packages=NO_DEEP_EP if rank == world - 1 else ALL_PACKAGES)}


def audited(rank: int, world: int, out: Path) -> dict[str, Any]:
    """Every rank audits to one shared file; rank 1 (no MoE layers) passes the sink explicitly."""
    path = str(out / "audit.jsonl")
    if rank == 1:
        return {"decisions": [], "audit": path}
    return {"decisions": _decisions({"MOE_POLICY_AUDIT_LOG": path})}


def bad_mode(rank: int, world: int, _out: Path) -> dict[str, Any]:
    """The last rank passes an invalid ``mode=``: it raises its PolicyError, the others learn of it."""
    return {"decisions": _decisions(), "mode": "loud" if rank == world - 1 else None}


def raising_selection(rank: int, world: int, _out: Path) -> dict[str, Any]:
    """The last rank passes a generator of selections that raises (strict mode, a requested
    backend its host lacks): it raises its own error, the others AgreementCheckError naming it,
    and none waits on it."""
    last = rank == world - 1
    env = {"MOE_POLICY_MODE": "strict", "MOE_POLICY_BACKEND": "flashinfer_cutlass"} if last else {}
    selector = _selector(env, NO_FLASHINFER if last else ALL_PACKAGES)
    return {"decisions": (selector.select(i) for i in LAYERS)}


def required_audit(rank: int, world: int, out: Path) -> dict[str, Any]:
    """The last rank's required audit sink cannot be opened (its directory is missing): it
    raises AuditWriteError before its summary goes out, the others AgreementCheckError naming
    it, so no rank starts while another has stopped."""
    if rank != world - 1:
        return {"decisions": _decisions()}
    from moe_policy.reporting.audit import AuditSink

    missing = str(out / "no-such-directory" / "audit.jsonl")
    return {"decisions": _decisions(), "audit": AuditSink(missing, required=True)}


SCENARIOS: dict[str, Callable[[int, int, Path], dict[str, Any]]] = {
    "agree": agree,
    "env_backend": env_backend,
    "packages": packages,
    "pipeline": pipeline,
    "warn": warn,
    "mixed_mode": mixed_mode,
    "inputs_differ": inputs_differ,
    "audited": audited,
    "bad_mode": bad_mode,
    "raising_selection": raising_selection,
    "required_audit": required_audit,
}
#: Scenarios that need two ranks or more to mean anything.
MULTI_RANK = (
    "env_backend",
    "packages",
    "pipeline",
    "warn",
    "mixed_mode",
    "inputs_differ",
    "bad_mode",
    "raising_selection",
    "required_audit",
)


def run_scenario(name: str, rank: int, world: int, out: Path, group: Any = None) -> dict[str, Any]:
    """Run one scenario on this rank: build its decisions, check agreement, capture the events."""
    import structlog

    from moe_policy.errors import MoEPolicyError
    from moe_policy.fleet.distributed import DecisionMismatchError, check_agreement

    result: dict[str, Any] = {"scenario": name, "rank": rank, "raised": None, "message": None}
    with structlog.testing.capture_logs() as events:
        setup = SCENARIOS[name](rank, world, out)
        try:
            report = check_agreement(
                setup["decisions"], group, audit=setup.get("audit"), mode=setup.get("mode")
            )
            result["report"] = report.to_dict()
            result["message"] = report.message
        except DecisionMismatchError as exc:
            result.update(raised=type(exc).__name__, message=str(exc), report=exc.report.to_dict())
        except MoEPolicyError as exc:
            result.update(raised=type(exc).__name__, message=str(exc))
    keep = (
        "moe_policy.agreement",
        "moe_policy.decision_mismatch",
        "moe_policy.decision_inputs_differ",
        "moe_policy.audit_failed",
    )
    result["events"] = json.loads(
        json.dumps([e for e in events if e.get("event") in keep], default=str)
    )
    return result


def simulate_hosts(rank: int, world: int) -> None:
    """Stand ranks in for two hosts: the lower half is host-a, the upper half host-b."""
    import moe_policy.fleet.distributed as distributed

    name = "host-a" if rank < max(1, world // 2) else "host-b"
    distributed.hostname = lambda: name  # type: ignore[assignment]


#: Scenarios in which the last rank raises its own error and the others AgreementCheckError.
RAISING = {
    "bad_mode": "PolicyError",
    "raising_selection": "BackendOverrideError",
    "required_audit": "AuditWriteError",
}


def verify(
    name: str, results: Sequence[Mapping[str, Any]], world: int, out: Path | None = None
) -> list[str]:
    """Problems with one scenario's per-rank results (empty: PASS); used by run_nccl.py."""
    problems: list[str] = []
    last = world - 1
    if len(results) != world:
        return [f"{len(results)} of {world} ranks reported"]
    expect_error = name in ("env_backend", "packages", "mixed_mode")
    for r in results:
        if expect_error and r["raised"] != "DecisionMismatchError":
            problems.append(f"rank {r['rank']}: expected DecisionMismatchError, got {r['raised']}")
        if not expect_error and name not in RAISING and r["raised"] is not None:
            problems.append(f"rank {r['rank']}: unexpected {r['raised']}: {r['message']}")
    messages = {r["message"] for r in results}
    if expect_error and len(messages) != 1:
        problems.append("ranks raised different messages")
    text = next(iter(messages)) or ""
    if name == "env_backend" and (
        f"rank {last}" not in text or "env:MOE_POLICY_BACKEND" not in text
    ):
        problems.append(f"message does not name rank {last} and env:MOE_POLICY_BACKEND: {text}")
    if name == "packages" and ("`packages`" not in text or "lacking flashinfer" not in text):
        problems.append(f"message does not name packages lacking flashinfer: {text}")
    if name == "warn":
        for r in results:
            if not any(
                e["event"] == "moe_policy.decision_mismatch" and e["log_level"] == "warning"
                for e in r["events"]
            ):
                problems.append(f"rank {r['rank']}: no moe_policy.decision_mismatch warning event")
    if name in ("agree", "pipeline", "audited"):
        for r in results:
            if not r.get("report", {}).get("agreed"):
                problems.append(f"rank {r['rank']}: not agreed")
    if name == "pipeline" and world > 1 and results[0]["report"]["ranks_without_layers"] != [1]:
        problems.append("rank 1 is not reported as a rank without MoE layers")
    if name == "inputs_differ":
        for r in results:
            if not any(e["event"] == "moe_policy.decision_inputs_differ" for e in r["events"]):
                problems.append(f"rank {r['rank']}: no moe_policy.decision_inputs_differ event")
    if name in RAISING:
        want = ["AgreementCheckError"] * last + [RAISING[name]]
        if [r["raised"] for r in results] != want:
            problems.append(f"expected {want}, got {[r['raised'] for r in results]}")
    if name == "audited" and out is not None:
        problems.extend(_verify_audit(out / "audit.jsonl", world))
    return problems


def _verify_audit(path: Path, world: int) -> list[str]:
    try:
        lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    except OSError as exc:
        return [f"audit log unreadable: {exc}"]
    records = [r for r in lines if r.get("kind") == "agreement"]
    if sorted(r["rank"] for r in records) != list(range(world)):
        return [
            f"agreement audit lines for ranks {sorted(r['rank'] for r in records)}, expected 0..{world - 1}"
        ]
    if any(r["world_size"] != world or r["agreed"] is not True for r in records):
        return ["agreement audit lines carry the wrong world size or outcome"]
    return []
