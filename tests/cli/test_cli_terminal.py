"""explain on a real terminal: sized to it, nothing split, colour only where allowed, -q, -v."""

from __future__ import annotations

import io
import re
from collections import Counter

import pytest

from moe_policy.cli.explain_text import Layout, render
from moe_policy.cli.terminal import DEFAULT_WIDTH, MAX_WIDTH, MIN_WIDTH, output_width, use_color
from tests.cli.pty_runner import ESCAPE, run_in_terminal
from tests.cli.runner import run_cli

LORA_ON_H200 = ("--model", "qwen3-30b-a3b", "--platform", "cuda", "--capability", "9.0", "--lora")
CUTLASS = {"MOE_POLICY_BACKEND": "flashinfer_cutlass"}
#: A decision id differs per process; everything else in the report is reproducible.
DECISION_ID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{8},?$")
RULE_OR_GAP = re.compile(r"^[-=]+$")


def tokens(text: str) -> Counter[str]:
    """The report's words, each cut after a '/' (the only place a word may wrap), without
    table rules and the per-process decision id."""
    found: Counter[str] = Counter()
    for word in text.split():
        for piece in re.findall(r"[^/]*/+|[^/]+", word):
            if not RULE_OR_GAP.match(piece) and not DECISION_ID.match(piece):
                found[piece] += 1
    return found


@pytest.fixture(scope="module")
def unwrapped() -> str:
    """The same report, in process, on a line of unlimited width (no wrapping at all)."""
    from moe_policy.api import Selector
    from moe_policy.cli.explain import add_parser as add_explain
    from moe_policy.cli.explain import flag_entries
    from moe_policy.cli.parser import Parser

    parser = Parser(prog="moe-policy")
    add_explain(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["explain", *LORA_ON_H200])
    monkeypatch = pytest.MonkeyPatch()
    monkeypatch.setenv("MOE_POLICY_BACKEND", "flashinfer_cutlass")
    try:
        selector = Selector(args.model, explicit=flag_entries(args))
        return render(selector.explain(), args.model, Layout(width=100_000))
    finally:
        monkeypatch.undo()


@pytest.mark.parametrize("columns", [80, 160])
def test_report_fits_the_terminal_and_splits_no_identifier_or_path(unwrapped, columns):
    """At 80 and 160 columns every line fits, and every word of the unwrapped report is
    printed whole (paths may continue on the next line after a '/')."""
    run = run_in_terminal(
        "explain", *LORA_ON_H200, columns=columns, env={**CUTLASS, "NO_COLOR": "1"}
    )
    assert run.returncode == 0, run.output
    report = run.output[run.output.index("moe-policy explain:") :]
    assert max(len(line) for line in run.lines) <= columns
    assert tokens(report) == tokens(unwrapped)
    assert "device.capability" in report and "model.intermediate_size_per_partition" in report


def test_wider_terminal_uses_its_width():
    """160 columns give fewer, longer lines than 80 (the layout follows the terminal)."""
    narrow = run_in_terminal("explain", *LORA_ON_H200, columns=80, env={"NO_COLOR": "1"})
    wide = run_in_terminal("explain", *LORA_ON_H200, columns=160, env={"NO_COLOR": "1"})
    assert len(wide.lines) < len(narrow.lines)
    assert max(len(line) for line in wide.lines) > 100


def test_terminal_report_is_coloured_and_no_color_turns_it_off():
    """Colour on a terminal by default; NO_COLOR=1 or --color never: no escape code at all."""
    coloured = run_in_terminal("explain", *LORA_ON_H200, columns=100, env=CUTLASS)
    assert ESCAPE in coloured.output
    for env, extra in (({"NO_COLOR": "1"}, ()), ({}, ("--color", "never"))):
        plain = run_in_terminal(
            "explain", *LORA_ON_H200, *extra, columns=100, env={**CUTLASS, **env}
        )
        assert plain.returncode == 0
        assert ESCAPE not in plain.output and "\x1b" not in plain.output, (env, extra)


def test_colour_through_a_pipe_only_when_forced():
    """Piped: no colour; FORCE_COLOR=1 or --color always: colour; NO_COLOR loses to the flag."""
    assert ESCAPE not in run_cli("explain", *LORA_ON_H200).stdout
    assert ESCAPE in run_cli("explain", *LORA_ON_H200, env={"FORCE_COLOR": "1"}).stdout
    assert ESCAPE in run_cli("explain", *LORA_ON_H200, "--color", "always").stdout
    assert ESCAPE in run_cli("--color", "always", "explain", *LORA_ON_H200).stdout
    forced = run_cli("explain", *LORA_ON_H200, "--color", "always", env={"NO_COLOR": "1"})
    assert ESCAPE in forced.stdout
    assert (
        ESCAPE
        not in run_cli("explain", *LORA_ON_H200, env={"NO_COLOR": "1", "FORCE_COLOR": "1"}).stdout
    )


def test_quiet_prints_the_decision_line_only():
    """-q on a terminal: one line, the decision; the override is in it, not in a log line."""
    run = run_in_terminal(
        "explain", *LORA_ON_H200, "-q", columns=80, env={**CUTLASS, "NO_COLOR": "1"}
    )
    assert run.returncode == 0
    [line] = [line for line in run.lines if line.strip()]
    assert line.startswith("layer moe: triton (TritonExperts, standard format), overridden")
    assert "env:MOE_POLICY_BACKEND" in line and "lora_unsupported" in line
    piped = run_cli("explain", *LORA_ON_H200, "--quiet", env=CUTLASS)
    assert piped.returncode == 0 and piped.stdout.count("\n") == 1


def test_quiet_line_says_what_strict_mode_refuses_and_when_nothing_runs():
    """-q in strict mode names the refused request (exit 3); no backend at all says so (exit 4)."""
    strict = run_cli("explain", *LORA_ON_H200, "--mode", "strict", "-q", env=CUTLASS)
    assert strict.returncode == 3
    assert strict.stdout == (
        "layer moe: refused in strict mode: flashinfer_cutlass from env:MOE_POLICY_BACKEND "
        "(lora_unsupported)\n"
    )
    fp8 = run_cli("explain", "--model", "deepseek-v3", "--platform", "cuda", "-q")
    assert (fp8.returncode, fp8.stdout) == (4, "layer moe: no feasible backend\n")


def test_log_lines_do_not_repeat_the_report_on_a_terminal():
    """On a terminal the decision and override events are in the report only; -v and an
    asked-for --log-format print them."""
    env = {**CUTLASS, "NO_COLOR": "1"}
    default = run_in_terminal("explain", *LORA_ON_H200, columns=100, env=env)
    assert "moe_policy.decision" not in default.output
    assert "moe_policy.request_overridden" not in default.output
    assert "override:" in default.output  # the report says it
    for extra in (("-v",), ("--log-format", "console")):
        shown = run_in_terminal("explain", *LORA_ON_H200, *extra, columns=100, env=env)
        assert "moe_policy.request_overridden" in shown.output, extra
        assert "moe_policy.decision" in shown.output, extra


def test_columns_sets_the_width_off_a_terminal_within_limits():
    """COLUMNS=80 through a pipe gives the 80-column layout; below the minimum it is clamped."""
    at_80 = run_cli("explain", *LORA_ON_H200, env={"COLUMNS": "80"})
    assert max(len(line) for line in at_80.stdout.splitlines()) <= 80
    tiny = run_cli("explain", *LORA_ON_H200, env={"COLUMNS": "20"}).stdout
    at_min = run_cli("explain", *LORA_ON_H200, env={"COLUMNS": str(MIN_WIDTH)}).stdout
    assert tokens(tiny) == tokens(at_min)
    assert [len(line) for line in tiny.splitlines()] == [len(line) for line in at_min.splitlines()]


def test_width_and_colour_rules():
    """COLUMNS wins and is clamped; a bad COLUMNS is ignored; the colour flag beats the env."""
    pipe = io.StringIO()  # no terminal
    assert output_width(pipe, {"COLUMNS": "120"}) == 120
    assert output_width(pipe, {"COLUMNS": "5"}) == MIN_WIDTH
    assert output_width(pipe, {"COLUMNS": "999"}) == MAX_WIDTH
    assert output_width(pipe, {"COLUMNS": "wide"}) == output_width(pipe, {}) == DEFAULT_WIDTH
    assert use_color("never", pipe, {"FORCE_COLOR": "1"}) is False
    assert use_color("always", pipe, {"NO_COLOR": "1"}) is True
    assert use_color("auto", pipe, {"NO_COLOR": "1", "FORCE_COLOR": "1"}) is False
    assert use_color(None, pipe, {"FORCE_COLOR": "1"}) is True
    assert use_color(None, pipe, {"NO_COLOR": "", "TERM": "xterm"}) is False
