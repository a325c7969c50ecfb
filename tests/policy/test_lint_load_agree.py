"""Property: lint and the loader share one validator of rule operands.

Over generated rules (every context key, every operator, operands of every YAML type,
including the ones that used to be read by truthiness or int()), a policy file is
lint-clean exactly when it loads, and a rule that loads can be evaluated on every
value its keys can take without raising.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from moe_policy.core.catalog import load_catalog
from moe_policy.core.keys import CONTEXT_KEYS
from moe_policy.core.rules import OPERATORS
from moe_policy.errors import PolicyError
from moe_policy.lint.checks import lint_file
from moe_policy.settings import resolve_settings

CATALOG = load_catalog()
#: Findings about what rules do together, not about whether a file loads.
SEMANTIC = {
    "shadowed-rule",
    "conflicting-rules",
    "rule-never-matches",
    "require-no-backend",
    "forbid-no-backend",
    "priority-unreachable",
}

#: Hostile operands: every YAML type, the strings truthiness and int() misread.
HOSTILE = [None, True, False, 0, 1, 2, -1, 10**30, 2.5, 9.0, "9.0", "90", "cuda", "false", "2", ""]
SCALARS = st.sampled_from(HOSTILE)
KEYS = st.sampled_from(sorted(CONTEXT_KEYS))


def _valid_values(key: str) -> list[Any]:
    """Values a context can hold for ``key`` (what a condition is evaluated on)."""
    spec = CONTEXT_KEYS[key]
    if spec.choices is not None:
        return list(spec.choices)
    return {
        "int": [0, 1, 2, 7, 128],
        "bool": [True, False],
        "capability": ["8.0", "9.0", "10.3"],
        "list": [(), ("torch", "triton"), ("flashinfer",)],
    }.get(spec.type, ["x", "NVIDIA H200"])


def _fitting(key: str) -> list[Any]:
    """Operands that fit ``key`` (package names for the list key, positive integers)."""
    if CONTEXT_KEYS[key].type == "list":
        return ["flashinfer", "triton"]
    return [v for v in _valid_values(key) if v != 0]


def _operand(key: str) -> st.SearchStrategy[Any]:
    fitting = st.sampled_from(_fitting(key))
    one = st.one_of(fitting, fitting, SCALARS)
    return st.one_of(one, st.lists(one, max_size=2), st.sampled_from([{"a": 1}, {}]))


def _condition(key: str) -> st.SearchStrategy[Any]:
    operators = st.sampled_from([*OPERATORS, "gte"])
    return st.one_of(
        _operand(key), st.dictionaries(operators, _operand(key), min_size=1, max_size=2)
    )


#: ``when`` mappings of one or two keys, each operand drawn for its key or hostile.
WHEN = st.lists(KEYS.flatmap(lambda k: st.tuples(st.just(k), _condition(k))), max_size=2).map(dict)


def _outcomes(when: dict[str, Any]) -> tuple[list[str], Any]:
    rule = {"id": "r", "when": when, "effect": "forbid", "backends": ["triton"], "reason": "x"}
    return _lint_and_load({"version": 1, "rules": [rule]})


def _lint_and_load(document: dict[str, Any]) -> tuple[list[str], Any]:
    """(lint's errors about loading, the loaded settings or the loader's PolicyError)."""
    text = yaml.safe_dump(document)
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "policy.yaml"
        path.write_text(text)
        errors = [
            f"{f.origin}: {f.message}"
            for f in lint_file(str(path), CATALOG)
            if f.severity == "error" and f.code not in SEMANTIC
        ]
        try:
            loaded: Any = resolve_settings(CATALOG, policy_files=[str(path)], environ={})
        except PolicyError as exc:
            loaded = exc
    return errors, loaded


@settings(
    derandomize=True, max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
@given(when=WHEN)
def test_lint_clean_exactly_when_the_file_loads(when):
    """Lint reports the loader's error; no error, and the rule loads and each of
    its conditions evaluates on every value its key can take."""
    errors, loaded = _outcomes(when)
    if isinstance(loaded, PolicyError):
        assert errors, f"lint passed a file the loader refuses: {loaded}"
        assert str(loaded) in errors, f"lint did not report the loader's error: {loaded}"
        return
    assert errors == [], f"lint refused a file that loads: {errors}"
    [rule] = [r for r in loaded.rules if r.id == "r"]
    for condition in rule.conditions:  # never raises: every operand fits its key's values
        for value in (*_valid_values(condition.key), None):
            assert isinstance(condition.test(value), bool)


POOL = [*HOSTILE, [1, 2], ["cuda", None], [], {"a": 1}, {}]


def test_every_operand_the_validator_accepts_evaluates_on_every_value_of_its_key():
    """Exhaustively, every key x operator x operand of the pool: the one validator (which
    lint and the loader both call) either refuses the operand with an error, or the
    condition it builds evaluates to a boolean on every value the key can take."""
    from moe_policy.core.origin import Origin
    from moe_policy.core.problems import ProblemSink
    from moe_policy.core.rules import parse_conditions

    accepted = 0
    for key in CONTEXT_KEYS:
        for op in OPERATORS:
            for operand in (*POOL, *_fitting(key)):
                sink = ProblemSink(strict=False)
                conditions = parse_conditions(
                    {key: {op: operand}}, lambda *_a, **_k: Origin.file("p.yaml", 1, 1), (), sink
                )
                assert len(conditions) + len(sink.problems) == 1, (key, op, operand)
                for condition in conditions:
                    accepted += 1
                    for value in (*_valid_values(key), None):
                        assert isinstance(condition.test(value), bool), (key, op, operand, value)
    assert accepted > 500  # the pool is not all refused


#: Values for the top-level settings: the hostile pool, each setting's good values, near misses.
SETTING = st.sampled_from(
    [
        *HOSTILE,
        *("warn", "strict", "error", "auto", "triton", "a.jsonl", " "),
        *(["triton"], ["tritn"], ["triton", "triton"], ["triton", 7], ["triton", "tritn"]),
    ]
)
DOCUMENTS = st.fixed_dictionaries(
    {},
    optional={
        "version": st.one_of(st.just(1), SETTING),
        "mode": SETTING,
        "consistency": SETTING,
        "backend": SETTING,
        "audit": st.one_of(
            SETTING, st.fixed_dictionaries({}, optional={"path": SETTING, "required": SETTING})
        ),
        "priority": st.dictionaries(st.sampled_from(["cuda", "rocm", "gpu"]), SETTING, max_size=2),
    },
)


@settings(
    derandomize=True, max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
@given(document=DOCUMENTS)
# Two errors at one place (safe_dump writes the shared list once, as an alias): lint
# reports both, the loader stops at the first it meets.
@example(document={"version": ["tritn"], "priority": {"cuda": ["tritn"]}})
@example(document={"priority": {"cuda": ["triton", "triton"], "rocm": ["triton", "tritn"]}})
def test_settings_lint_clean_exactly_when_the_file_loads(document):
    """The same for the top-level settings (version, mode, audit, priority lists...)."""
    errors, loaded = _lint_and_load(document)
    if isinstance(loaded, PolicyError):
        assert errors, f"lint passed a file the loader refuses: {loaded}"
        assert str(loaded) in errors, f"lint did not report the loader's error: {loaded}"
    else:
        assert errors == [], f"lint refused a file that loads: {errors}"


@settings(derandomize=True, max_examples=60, deadline=None)
@given(backends=st.lists(st.sampled_from(["triton", "flashinfer_cutlass", "tritn", 7]), max_size=4))
def test_rule_backends_lint_clean_exactly_when_the_file_loads(backends):
    """The same for a rule's backends: unknown names and repeats (``duplicate-backend``)."""
    rule = {"id": "r", "effect": "demote", "backends": backends, "reason": "x"}
    errors, loaded = _lint_and_load({"version": 1, "rules": [rule]})
    if isinstance(loaded, PolicyError):
        assert str(loaded) in errors, f"lint did not report the loader's error: {loaded}"
    else:
        assert errors == [], f"lint refused a file that loads: {errors}"
        [rule_loaded] = [r for r in loaded.rules if r.id == "r"]
        assert len(set(rule_loaded.backends)) == len(rule_loaded.backends)
