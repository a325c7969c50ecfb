"""``moe-policy plan``: what a policy change does to every deployment of a matrix."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.bundled import REPO
from tests.cli.runner import run_cli

DEFAULT = REPO / "configs" / "default.yaml"
RULE = "  - id: hopper-demotes-flashinfer\n"


@pytest.fixture()
def audited(tmp_path: Path) -> tuple[Path, int]:
    """configs/default.yaml with hopper-demotes-flashinfer set to action: audit; its line."""
    text = DEFAULT.read_text()
    assert RULE in text
    text = text.replace(RULE, RULE + "    action: audit\n", 1)
    path = tmp_path / "policy.yaml"
    path.write_text(text)
    line = text.splitlines().index(RULE.rstrip("\n")) + 1
    return path, line


def test_audit_change_shows_hopper_backend_changes(audited: tuple[Path, int]) -> None:
    path, line = audited
    run = run_cli("plan", "--from", "configs/default.yaml", "--to", str(path), "--json")
    assert run.returncode == 1, run.stderr
    changes = run.json()["changes"]
    backend = {
        (c["deployment"], c["platform"])
        for c in changes
        if any(ch["field"] == "backend" for ch in c["changes"])
    }
    assert backend
    assert {platform for _, platform in backend} == {"NVIDIA H100", "NVIDIA H200"}
    # exactly the non-LoRA Hopper deployments that ran Triton only because of the rule
    from moe_policy import Selector
    from moe_policy.planning import DEFAULT_MATRIX, load_matrix
    from moe_policy.settings import Entry

    expected = set()
    for d in load_matrix(DEFAULT_MATRIX):
        if d.platform not in ("NVIDIA H100", "NVIDIA H200"):
            continue
        backends = []
        for files in (["configs/default.yaml"], [str(path)]):
            selector = Selector(
                d.model_path,
                policy_files=files,
                environ={},
                explicit=[Entry(k, v, "api") for k, v in d.values],
            )
            backends.append(selector.decide(None, "moe").backend)
        if backends[0] != backends[1]:
            expected.add((d.name, d.platform))
    assert backend == expected
    origin = f"file:{path}:{line}:5"
    for cell in changes:
        for change in cell["changes"]:
            assert {"id": "hopper-demotes-flashinfer", "origin": origin} in change["rules"]
    table = run_cli("plan", "--from", "configs/default.yaml", "--to", str(path))
    assert table.returncode == 1
    assert "hopper-demotes-flashinfer" in table.stdout and origin in table.stdout
    assert "triton -> flashinfer_cutlass" in table.stdout
    assert "B200" not in table.stdout and "MI300X" not in table.stdout


def test_same_policy_no_changes() -> None:
    run = run_cli("plan", "--from", "configs/default.yaml", "--to", "configs/default.yaml")
    assert run.returncode == 0, run.stderr
    assert "no changes" in run.stdout


def test_typo_backend_in_new_policy(audited: tuple[Path, int], tmp_path: Path) -> None:
    path, _ = audited
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        path.read_text().replace(
            "[flashinfer_trtllm, flashinfer_cutlass]", "[flashinfer_trtlm, flashinfer_cutlass]", 1
        )
    )
    run = run_cli("plan", "--from", "configs/default.yaml", "--to", str(bad))
    assert run.returncode == 2
    errors = run.errors()
    assert len(errors) == 1, run.stderr
    assert errors[0].startswith(f"moe-policy: error: file:{bad}:")
    assert "flashinfer_trtlm" in errors[0] and run.stdout == ""


def test_git_revision(audited: tuple[Path, int]) -> None:
    path, _ = audited
    same = run_cli(
        "plan", "--from", "git:HEAD:configs/default.yaml", "--to", "configs/default.yaml"
    )
    assert same.returncode == 0, same.stderr
    changed = run_cli("plan", "--from", "git:HEAD:configs/default.yaml", "--to", str(path))
    assert changed.returncode == 1, changed.stderr
    # the old side's origins are shown as the revision, not the temporary file
    reverted = run_cli("plan", "--from", str(path), "--to", "git:HEAD:configs/default.yaml")
    assert reverted.returncode == 1, reverted.stderr
    assert "hopper-demotes-flashinfer (git:HEAD:configs/default.yaml:" in reverted.stdout
    bad = run_cli("plan", "--from", "git:no-such-rev:configs/default.yaml", "--to", str(path))
    assert bad.returncode == 2 and bad.errors()[0].startswith("moe-policy: error: cli:--from")


def test_json_and_markdown(audited: tuple[Path, int]) -> None:
    path, line = audited
    record = run_cli("plan", "--to", str(path), "--json")
    assert record.returncode == 1
    data = record.json()
    assert data["changed"] is True and data["changes"]
    first = data["changes"][0]
    assert {"deployment", "platform", "layer", "old", "new", "changes"} <= set(first)
    md = run_cli("plan", "--to", str(path), "--format", "markdown")
    assert md.returncode == 1
    assert md.stdout.startswith("### moe-policy plan")
    assert "| deployment | platform |" in md.stdout
    assert f"hopper-demotes-flashinfer (file:{path}:{line}:5)" in md.stdout
    assert "triton → flashinfer_cutlass" in md.stdout


def test_profile_strict_refuses(tmp_path: Path) -> None:
    matrix = tmp_path / "matrix.yaml"
    matrix.write_text(
        "deployments:\n"
        "  - name: nano-lora\n"
        "    model: nemotron-3-nano-30b-a3b\n"
        "    platforms: {platform: cuda, capability: '9.0', device_name: NVIDIA H200}\n"
        "    lora: true\n"
        "    env: {MOE_POLICY_BACKEND: flashinfer_cutlass}\n"
    )
    run = run_cli("plan", "--to", "strict", "--matrix", str(matrix))
    assert run.returncode == 1, run.stderr
    assert "refuses to start" in run.stdout


@pytest.mark.parametrize(
    ("body", "line", "col", "needle"),
    [
        (
            "deployments:\n  - name: a\n    model: qwen3-30b-a3b\n    platfroms: []\n",
            4,
            5,
            "did you mean 'platforms'",
        ),
        (
            "deployments:\n  - name: a\n    model: no-such-model\n    platforms: {platform: cpu}\n",
            3,
            12,
            "unknown model",
        ),
        (
            "deployments:\n  - name: a\n    model: qwen3-30b-a3b\n    platforms: {platform: cpu, capabilty: '9.0'}\n",
            4,
            32,
            "did you mean 'capability'",
        ),
    ],
)
def test_matrix_errors_name_origin(
    tmp_path: Path, body: str, line: int, col: int, needle: str
) -> None:
    matrix = tmp_path / "matrix.yaml"
    matrix.write_text(body)
    run = run_cli("plan", "--to", "configs/default.yaml", "--matrix", str(matrix))
    assert run.returncode == 2
    errors = run.errors()
    assert len(errors) == 1, run.stderr
    assert errors[0].startswith(f"moe-policy: error: file:{matrix}:{line}:{col}:"), errors[0]
    assert needle in errors[0]


def test_a_new_rule_shows_only_where_it_matches() -> None:
    """Adding the TRT-LLM LoRA profile changes B200 LoRA deployments only; the rule's other
    deployments (not matched) are no change."""
    run = run_cli("plan", "--to", "prefer-trtllm-lora", "--json")
    assert run.returncode == 1, run.stderr
    changes = run.json()["changes"]
    assert changes and {c["platform"] for c in changes} == {"NVIDIA B200"}
    assert all(c["deployment"].endswith("-lora") for c in changes)


def test_git_revision_that_is_an_option_is_refused(tmp_path: Path) -> None:
    """``git:--output=FILE:PATH`` must not reach ``git show`` as an option (it would write
    FILE and read the new policy as empty)."""
    target = tmp_path / "written"
    spec = f"git:--output={target}:configs/default.yaml"
    run = run_cli("plan", "--from", "configs/default.yaml", "--to", spec)
    assert run.returncode == 2, run.stderr
    assert run.errors() == [
        f"moe-policy: error: cli:--to: expected git:REV:PATH, got {spec!r} "
        "(a revision cannot start with '-')"
    ]
    assert not list(tmp_path.iterdir())


def test_json_and_format_together_are_refused() -> None:
    """``--json --format markdown`` is one error, not markdown silently dropped."""
    run = run_cli("plan", "--to", "strict", "--format", "markdown", "--json")
    assert run.returncode == 2 and run.stdout == ""
    assert run.errors() == [
        "moe-policy: error: cli:--json: not allowed with argument --format "
        "(see moe-policy plan --help)"
    ]


def test_a_deployment_of_several_models_names_the_model_of_each_row(tmp_path: Path) -> None:
    """Two models under one deployment: their rows would read alike, so the table and the
    markdown name the model beside the deployment (a one-model deployment keeps its name)."""
    matrix = tmp_path / "matrix.yaml"
    matrix.write_text(
        "deployments:\n"
        "  - name: adapters\n"
        "    model: [nemotron-3-nano-30b-a3b, qwen3-30b-a3b]\n"
        "    platforms: {platform: cuda, capability: '9.0', device_name: NVIDIA H200}\n"
        "    lora: true\n"
        "    env: {MOE_POLICY_BACKEND: flashinfer_cutlass}\n"
        "  - name: solo\n"
        "    model: qwen3-30b-a3b\n"
        "    platforms: {platform: cuda, capability: '9.0', device_name: NVIDIA H200}\n"
        "    lora: true\n"
        "    env: {MOE_POLICY_BACKEND: flashinfer_cutlass}\n"
    )
    table = run_cli("plan", "--to", "strict", "--matrix", str(matrix))
    assert table.returncode == 1, table.stderr
    rows = [line for line in table.stdout.splitlines() if "NVIDIA H200" in line]
    assert {line.split("  ")[0] for line in rows} == {
        "adapters (nemotron-3-nano-30b-a3b)",
        "adapters (qwen3-30b-a3b)",
        "solo",
    }
    markdown = run_cli("plan", "--to", "strict", "--matrix", str(matrix), "--format", "markdown")
    assert "| adapters (qwen3-30b-a3b) |" in markdown.stdout
    assert "| solo |" in markdown.stdout
