"""Policy lint: every planted defect is found at its line, and nothing in configs/ is flagged."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from moe_policy.core.catalog import load_catalog
from moe_policy.core.rules import Condition
from moe_policy.core.yamlio import parse_yaml_text
from moe_policy.lint.checks import Finding, lint_document, lint_file, lint_paths
from moe_policy.lint.overlap import satisfiable
from tests.bundled import REPO

FIXTURES = REPO / "tests" / "fixtures" / "lint"
EXPECT = re.compile(r"#\s*expect:\s*([a-z-]+)")


def expected(path: Path) -> set[tuple[int, str]]:
    """(line, code) pairs from the fixture's ``# expect: code`` comments."""
    return {
        (number, match.group(1))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if (match := EXPECT.search(line))
    }


def found(findings: list[Finding]) -> set[tuple[int, str]]:
    return {(int(f.location.rsplit(":", 2)[1]), f.code) for f in findings}


@pytest.mark.parametrize("fixture", sorted(p.name for p in FIXTURES.glob("*.yaml")))
def test_each_planted_defect_is_found_at_its_line_and_nothing_else(fixture):
    """A fixture's `# expect:` comments are exactly the findings lint reports."""
    path = FIXTURES / fixture
    findings = lint_file(str(path))
    assert expected(path), "a fixture must plant at least one defect"
    assert found(findings) == expected(path)
    assert all(f.origin.startswith(f"file:{path}:") for f in findings)


def test_configs_lint_clean():
    """The built-in policy and every profile have no findings at all."""
    paths = [
        str(REPO / "configs" / "default.yaml"),
        *map(str, sorted((REPO / "configs" / "profiles").glob("*.yaml"))),
    ]
    assert lint_paths(paths) == []


def test_unknown_names_come_with_did_you_mean():
    """Unknown backends and context keys suggest the closest known name."""
    messages = [f.message for f in lint_file(str(FIXTURES / "structural.yaml"))]
    assert any("did you mean 'flashinfer_trtllm'" in m for m in messages)
    assert any("did you mean 'lora.enabled'" in m for m in messages)


def test_severities_errors_and_warnings():
    """Contradictions are errors; an unreachable priority entry and prefer-vs-demote are warnings."""
    by_code = {}
    for name in ("conflicting.yaml", "no-backend.yaml"):
        for f in lint_file(str(FIXTURES / name)):
            by_code.setdefault(f.code, set()).add(f.severity)
    assert by_code["priority-unreachable"] == {"warning"}
    assert by_code["require-no-backend"] == {"error"}
    assert by_code["conflicting-rules"] == {"error", "warning"}


def _lint(text: str) -> list[Finding]:
    return lint_document(parse_yaml_text(text, "inline.yaml"))


def test_rules_that_cannot_match_together_do_not_conflict():
    """prefer A and forbid A under disjoint conditions (different platforms) is fine."""
    text = """
version: 1
rules:
  - {id: a, when: {platform: cuda, lora.enabled: true}, effect: prefer, backends: [triton], reason: r}
  - {id: b, when: {platform: rocm}, effect: forbid, backends: [triton], reason: r}
"""
    assert _lint(text) == []


def test_audit_rules_neither_shadow_nor_conflict():
    """A rule in audit action changes nothing, so it cannot make another rule dead."""
    text = """
version: 1
rules:
  - {id: a, effect: forbid, action: audit, backends: [flashinfer_cutlass], reason: r}
  - {id: b, when: {platform: cuda}, effect: prefer, backends: [flashinfer_cutlass], reason: r}
"""
    assert _lint(text) == []


def test_malformed_yaml_is_a_finding_not_a_crash(tmp_path):
    """A file lint cannot parse is one error finding at the position of the problem."""
    bad = tmp_path / "bad.yaml"
    bad.write_text("rules: [\n")
    [finding] = lint_file(str(bad))
    assert (finding.severity, finding.code) == ("error", "malformed-yaml")
    assert finding.location.startswith(f"{bad}:2:")
    [missing] = lint_file(str(tmp_path / "absent.yaml"))
    assert missing.code == "file-not-found"


@pytest.mark.parametrize(
    ("conditions", "result"),
    [
        ([Condition("platform", "eq", "cuda"), Condition("platform", "eq", "rocm")], False),
        ([Condition("parallel.tp", "gt", 4), Condition("parallel.tp", "lt", 5)], False),
        ([Condition("parallel.tp", "ge", 4), Condition("parallel.tp", "le", 4)], True),
        (
            [
                Condition("device.capability", "in", ("10.0", "10.3")),
                Condition("device.capability", "lt", "10.0"),
            ],
            False,
        ),
        (
            [
                Condition("device.capability", "ge", "9.0"),
                Condition("device.capability", "lt", "10.0"),
            ],
            True,
        ),
        ([Condition("lora.enabled", "eq", True), Condition("lora.enabled", "ne", True)], False),
        (
            [
                Condition("packages", "eq", "flashinfer"),
                Condition("packages", "not_in", ("flashinfer",)),
            ],
            False,
        ),
        (
            [
                Condition("packages", "in", ("aiter", "flashinfer")),
                Condition("packages", "ne", "aiter"),
            ],
            True,
        ),
        (
            [
                Condition("model.intermediate_size_per_partition", "multiple_of", 256),
                Condition("model.intermediate_size_per_partition", "not_multiple_of", 128),
            ],
            False,
        ),
        (
            [Condition("device.name", "exists", False), Condition("device.name", "eq", "H200")],
            False,
        ),
        ([Condition("platform", "eq", "cuda"), Condition("parallel.dp", "gt", 1)], True),
    ],
)
def test_satisfiability_per_key(conditions, result):
    """Conditions on one key are decided exactly for comparison and membership operators."""
    assert satisfiable(conditions) is result


def test_a_rule_with_a_structural_error_is_left_out_of_the_semantic_checks():
    """A dropped (misspelt) condition must not make a rule look unconditional and shadow others."""
    text = """
version: 1
rules:
  - {id: a, when: {lora.enable: true}, effect: forbid, backends: [triton], reason: r}
  - {id: b, when: {platform: cuda}, effect: prefer, backends: [triton], reason: r}
  - {id: c, effect: require, backends: [tritn], reason: r}
"""
    assert {f.code for f in _lint(text)} == {"unknown-context-key", "unknown-backend"}


def _lint_file(tmp_path: Path, text: str, engine: str | None = None) -> list[Finding]:
    from moe_policy.core.engines import resolve_engine

    path = tmp_path / "policy.yaml"
    path.write_text(text)
    profile = resolve_engine(engine)
    return lint_file(str(path), load_catalog(profile), profile)


def test_a_required_backend_outside_the_priority_list_is_rankable(tmp_path):
    """require makes the backends it names rankable, so one outside priority.cuda that can
    run is selected: not require-no-backend (selection picks torch_grouped_mm there)."""
    text = """
version: 1
rules:
  - id: sm120-requires-grouped-mm
    when: {platform: cuda, device.capability: "12.0"}
    effect: require
    backends: [torch_grouped_mm]
    reason: r
  - id: xpu-requires-triton
    when: {platform: xpu}
    effect: require
    backends: [triton]
    reason: r
"""
    assert _lint_file(tmp_path, text) == []


def test_a_capability_condition_confines_a_rule_to_cuda_and_rocm(tmp_path):
    """device.capability is unknown off CUDA and ROCm, so a require on a capability range
    is not checked against cpu, xpu, tpu or oot, nor does it overlap a cpu-only rule."""
    text = """
version: 1
rules:
  - id: hopper-triton-only
    when: {device.capability: {ge: "9.0", lt: "10.0"}}
    effect: require
    backends: [triton, batched_triton]
    reason: r
  - id: cpu-forbids-reference
    when: {platform: cpu}
    effect: forbid
    backends: [reference]
    reason: r
  - id: hopper-prefers-reference
    when: {device.capability: "9.0"}
    effect: prefer
    backends: [reference]
    reason: r
"""
    assert _lint_file(tmp_path, text) == []


def test_vllm_rules_for_another_oracle_are_checked_by_that_oracle(tmp_path):
    """With --engine vllm, a require pinned to nvfp4 layers names the nvfp4 oracle's
    backends: the unquantized catalog does not check it, the nvfp4 one does."""
    text = """
version: 1
rules:
  - id: nvfp4-on-hopper-uses-marlin
    when: {platform: cuda, device.capability: "9.0", model.quantization: nvfp4}
    effect: require
    backends: [marlin]
    reason: r
  - id: unquantized-requires-marlin
    when: {platform: cuda, model.quantization: none}
    effect: require
    backends: [marlin]
    reason: r
"""
    assert [f.code for f in _lint_file(tmp_path, text, "vllm")] == ["require-no-backend"]
    assert _lint_file(tmp_path, text, "vllm/nvfp4") == []


def test_a_bad_list_item_is_found_at_the_item():
    """An unknown, misspelt or repeated name inside a list (a priority list, a rule's
    backends, a condition's list operand) is reported at that item's line:col."""
    path = FIXTURES / "list-items.yaml"
    findings = [(f.location, f.code, f.message) for f in lint_file(str(path))]
    at = f"{path}:"
    assert findings == [
        (
            at + "4:10",
            "unknown-backend",
            "priority.cuda: unknown backend 'tritn' (did you mean 'triton'?)",
        ),
        (at + "5:25", "duplicate-backend", "priority.rocm lists aiter twice; first at 5:10"),
        (at + "9:7", "duplicate-backend", "priority.cpu lists cpu twice; first at 7:7"),
        (
            at + "12:34",
            "invalid-value",
            "platform: 'rcom' is not one of cuda, rocm, cpu, xpu, tpu, oot (did you mean 'rocm'?)",
        ),
        (
            at + "17:37",
            "invalid-value",
            "model.activation: 'swiglu' is not one of silu, gelu, gelu_tanh, swigluoai, "
            "swigluoai_uninterleave, swiglustep, situ, relu2 (did you mean 'swigluoai'?)",
        ),
        (
            at + "24:40",
            "duplicate-backend",
            "rule backend-named-twice: backends lists triton twice; first at 24:16",
        ),
    ]


#: One defect per file: (text, the finding's line:col, code, message).
LIST_ITEM_DEFECTS = [
    (
        "priority: {cuda: [tritn, flashinfer_cutlass]}\n",
        "1:19",
        "unknown-backend",
        "priority.cuda: unknown backend 'tritn' (did you mean 'triton'?)",
    ),
    (
        "priority:\n  cuda: [triton, flashinfer_cutlass, triton]\n",
        "2:38",
        "duplicate-backend",
        "priority.cuda lists triton twice; first at 2:10",
    ),
    (
        "priority:\n  cuda:\n    - triton\n    - 7\n",
        "4:7",
        "invalid-value",
        "priority.cuda: expected a list of backend names, got ['triton', 7]",
    ),
    (
        "rules:\n  - id: r\n    when: {platform: {in: [cuda, rcom]}}\n"
        "    effect: demote\n    backends: [triton]\n    reason: x\n",
        "3:34",
        "invalid-value",
        "platform: 'rcom' is not one of cuda, rocm, cpu, xpu, tpu, oot (did you mean 'rocm'?)",
    ),
    (
        "rules:\n  - id: r\n    when: {packages: {not_in: [flashinfer, 3]}}\n"
        "    effect: demote\n    backends: [triton]\n    reason: x\n",
        "3:44",
        "invalid-value",
        "packages: expected a package name, got 3",
    ),
    (
        "rules:\n  - id: r\n    when:\n      model.activation:\n        - silu\n        - swiglu\n"
        "    effect: demote\n    backends: [triton]\n    reason: x\n",
        "6:11",
        "invalid-value",
        "model.activation: 'swiglu' is not one of silu, gelu, gelu_tanh, swigluoai, "
        "swigluoai_uninterleave, swiglustep, situ, relu2 (did you mean 'swigluoai'?)",
    ),
    (
        "rules:\n  - id: r\n    effect: forbid\n    backends: [triton, tritn]\n    reason: x\n",
        "4:24",
        "unknown-backend",
        "rule r: unknown backend 'tritn' (did you mean 'triton'?)",
    ),
    (
        "rules:\n  - id: r\n    effect: demote\n    backends:\n      - triton\n"
        "      - flashinfer_cutlass\n      - triton\n    reason: x\n",
        "7:9",
        "duplicate-backend",
        "rule r: backends lists triton twice; first at 5:9",
    ),
]


@pytest.mark.parametrize(("text", "where", "code", "message"), LIST_ITEM_DEFECTS)
def test_lint_and_load_name_the_same_list_item(tmp_path, text, where, code, message):
    """Lint's one finding and the loader's PolicyError are the same, at the item."""
    from moe_policy.errors import PolicyError
    from moe_policy.settings import resolve_settings

    path = tmp_path / "policy.yaml"
    path.write_text(text)
    [finding] = lint_file(str(path))
    assert (finding.severity, finding.location, finding.code, finding.message) == (
        "error",
        f"{path}:{where}",
        code,
        message,
    )
    with pytest.raises(PolicyError) as caught:
        resolve_settings(load_catalog(), policy_files=[str(path)], environ={})
    assert str(caught.value) == f"file:{path}:{where}: {message}"
