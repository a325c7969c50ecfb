"""The worst crafted inputs through the installed console script itself (a real process
per case, its peak memory from ``wait4``): the in-process worker runs exactly what
``moe-policy`` runs, and these cases show it."""

from __future__ import annotations

import pytest

from tests.fuzz.crafted import CRAFTED_MODELS, CRAFTED_POLICIES
from tests.fuzz.generators import CONFIGS
from tests.fuzz.keep import assert_kept
from tests.fuzz.pool import Case, run_console_script

QWEN3 = str(CONFIGS / "models" / "qwen3-30b-a3b.json")
H200 = ("--platform", "cuda", "--capability", "9.0")

CASES = [
    Case(
        "policy",
        ("explain", "--model", QWEN3, *H200, "--policy", "p.yaml"),
        files={"p.yaml": CRAFTED_POLICIES["billion laughs (9x9)"]},
        note="alias bomb",
    ),
    Case(
        "policy",
        ("lint", "p.yaml"),
        files={"p.yaml": CRAFTED_POLICIES["recursive alias"]},
        note="recursive alias (lint)",
    ),
    Case(
        "policy",
        ("explain", "--model", QWEN3, *H200, "--policy", "p.yaml"),
        files={"p.yaml": CRAFTED_POLICIES["secret in the reason"]},
        note="secret in a reason",
    ),
    Case(
        "special",
        ("explain", "--model", QWEN3, *H200, "--policy", "fifo"),
        specials={"fifo": "fifo"},
        note="a FIFO as policy",
    ),
    Case("special", ("explain", "--model", "/dev/zero", *H200), note="/dev/zero as model"),
    Case(
        "model",
        ("explain", "--model", "config.json", *H200),
        files={"config.json": CRAFTED_MODELS["nesting 100000 deep"]},
        note="deep JSON",
    ),
    Case(
        "flags",
        ("explain", "--model", QWEN3, *H200, "--set", "parallel.tp=" + "1" * 4400),
        note="a 4,400-digit --set",
    ),
    Case(
        "flags", ("explain", "--model", QWEN3, *H200, "--tp", "\uff12"), note="a full-width digit"
    ),
    Case(
        "env",
        ("explain", "--model", QWEN3, *H200),
        env={"MOE_POLICY_AUDIT_LOG": "{dir}/fifo"},
        specials={"fifo": "fifo"},
        note="a FIFO as audit log",
    ),
]


#: Exit codes other than 2: lint reports a broken file as a finding (exit 1); an audit
#: that is not required warns (``audit_failed``) and the decision stands.
EXIT = {"recursive alias (lint)": 1, "a FIFO as audit log": 0}


@pytest.mark.parametrize("case", CASES, ids=[case.note for case in CASES])
def test_the_console_script_keeps_the_contract(case):
    outcome = run_console_script(case)
    assert_kept(outcome)
    assert outcome.rc == EXIT.get(case.note, 2), outcome.stderr
    if case.note == "a FIFO as audit log":
        assert '"event": "moe_policy.audit_failed"' in outcome.stderr
