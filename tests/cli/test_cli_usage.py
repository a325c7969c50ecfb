"""Argument-parser errors read like every other error, and --help says what a user needs."""

from __future__ import annotations

import pytest

from moe_policy.settings.env import OUR_VARIABLES
from tests.cli.runner import run_cli

MODEL = ("--model", "qwen3-30b-a3b")

# (argv, the one stderr line expected)
CASES = [
    (
        ("explian",),
        "moe-policy: error: cli:COMMAND: unknown command 'explian' (did you mean 'explain'?); "
        "choose from {commands} (see moe-policy --help)",
    ),
    (
        ("explain", *MODEL, "--platfrom", "cuda"),
        "moe-policy: error: cli:--platfrom: unknown option (did you mean '--platform'?) "
        "(see moe-policy explain --help)",
    ),
    (
        ("explain", "--platform", "cuda"),
        "moe-policy: error: cli:--model: required (see moe-policy explain --help)",
    ),
    (
        ("explain", *MODEL, "--log-format", "jsn"),
        "moe-policy: error: cli:--log-format: invalid choice 'jsn' (did you mean 'json'?); "
        "choose from console, json (see moe-policy explain --help)",
    ),
    (
        ("explain", *MODEL, "--color", "sometimes"),
        "moe-policy: error: cli:--color: invalid choice 'sometimes'; choose from auto, always, "
        "never (see moe-policy explain --help)",
    ),
    (
        ("explain", *MODEL, "--tp"),
        "moe-policy: error: cli:--tp: expected one argument (see moe-policy explain --help)",
    ),
    (
        ("explain", *MODEL, "stray"),
        "moe-policy: error: cli:stray: unexpected argument (see moe-policy explain --help)",
    ),
    (
        ("diff", "a.jsonl"),
        "moe-policy: error: cli:B: required (see moe-policy diff --help)",
    ),
    ((), "moe-policy: error: cli:COMMAND: required (see moe-policy --help)"),
    (
        ("--colour", "never", "backends"),
        "moe-policy: error: cli:--colour: unknown option (did you mean '--color'?) "
        "(see moe-policy --help)",
    ),
    (
        ("--colour",),
        "moe-policy: error: cli:--colour: unknown option (did you mean '--color'?) "
        "(see moe-policy --help)",
    ),
    (
        ("--json", "backends"),
        "moe-policy: error: cli:--json: an option of backends, given before it (put it after "
        "the command: moe-policy backends --json ...) (see moe-policy backends --help)",
    ),
]


@pytest.mark.parametrize(("argv", "expected"), CASES, ids=lambda v: " ".join(v)[:40])
def test_parser_errors_are_one_line_origin_first_exit_2(argv, expected):
    """Each usage error: exit 2, nothing on stdout, one line `moe-policy: error: cli:...`."""
    from moe_policy.cli.app import COMMANDS

    run = run_cli(*argv)
    assert run.returncode == 2
    assert run.stdout == ""
    assert run.stderr.splitlines() == [expected.format(commands=", ".join(COMMANDS))]


def test_help_lists_examples_environment_and_exit_codes():
    """--help: examples, every MOE_POLICY_* variable the settings read, the colour and width
    variables, and the five exit codes."""
    run = run_cli("--help")
    assert run.returncode == 0
    text = run.stdout
    examples = text[text.index("examples:") : text.index("environment:")]
    assert "moe-policy explain --model" in examples and "moe-policy completion bash" in examples
    for name in [*OUR_VARIABLES, "NO_COLOR", "FORCE_COLOR", "COLUMNS"]:
        assert f"\n  {name} " in text, name
    codes = text[text.index("exit codes:") :].splitlines()[1:]
    assert [line.split()[0] for line in codes if line.strip()] == ["0", "1", "2", "3", "4"]
    assert "--color" in text and "completion" in text


def test_explain_help_shows_the_output_options():
    """explain --help lists -q/--quiet, -v/--verbose and --color."""
    text = run_cli("explain", "--help").stdout
    for option in ("-q, --quiet", "-v, --verbose", "--color"):
        assert option in text, option
    assert "examples:\n  moe-policy explain --model" in text and "4 no feasible backend" in text


@pytest.mark.parametrize(
    "listing", ["'console', 'json'", "console, json"], ids=["quoted", "python-3.12.8+"]
)
def test_choice_errors_read_the_same_whatever_argparse_version_wrote_them(listing):
    """argparse quotes the choices before Python 3.12.8 and not after; the line is the same."""
    from moe_policy.cli.parser import Parser

    message = f"argument --log-format: invalid choice: 'jsn' (choose from {listing})"
    assert Parser(prog="moe-policy explain").explain_error(message) == (
        "cli:--log-format: invalid choice 'jsn' (did you mean 'json'?); choose from console, "
        "json (see moe-policy explain --help)"
    )


@pytest.mark.parametrize("color", [("--color", "never"), ("--col", "never"), ("--color=never",)])
def test_a_known_option_before_the_command_still_works(color):
    """The check for unknown options before the command leaves the known ones (and argparse's
    abbreviations of them) alone."""
    run = run_cli(*color, "backends")
    assert run.returncode == 0, run.stderr
