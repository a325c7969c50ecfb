"""Shell completion generated from the parser: bash really completes, zsh and fish parse."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from moe_policy.cli import app
from tests.bundled import REPO
from tests.cli.runner import run_cli


@pytest.fixture(scope="module")
def bash_script(tmp_path_factory) -> Path:
    run = run_cli("completion", "bash")
    assert run.returncode == 0, run.stderr
    path = tmp_path_factory.mktemp("completion") / "moe-policy.bash"
    path.write_text(run.stdout)
    return path


def complete(script: Path, *words: str) -> list[str]:
    """What bash offers for the command line ``moe-policy WORDS`` (the last word is the
    one being completed), through the generated function, as bash's TAB would call it."""
    line = " ".join(f"'{w}'" for w in ("moe-policy", *words))
    program = (
        f"source '{script}'; COMP_WORDS=({line}); COMP_CWORD={len(words)}; "
        '_moe_policy; printf "%s\\n" "${COMPREPLY[@]}"'
    )
    bash = shutil.which("bash")
    assert bash, "bash is needed for this test"
    done = subprocess.run(
        [bash, "--norc", "--noprofile", "-c", program],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
        check=True,
    )
    return [line for line in done.stdout.splitlines() if line]


@pytest.mark.parametrize(
    ("words", "expected"),
    [
        (("expl",), ["explain"]),
        (("",), list(app.COMMANDS)),
        (("explain", "--pla"), ["--platform"]),
        (("explain", "--platform", ""), ["cuda", "rocm", "cpu", "xpu", "tpu", "oot"]),
        (("explain", "--model", "x.json", "--log-format", "j"), ["json"]),
        (("explain", "--mode", ""), ["warn", "strict"]),
        (("--color", "al"), ["always"]),
        (("lint", "--co"), ["--color"]),
        (("completion", ""), ["bash", "zsh", "fish"]),
        (("plan", "--format", "m"), ["markdown"]),
        (("explain", "--tp", ""), []),
    ],
)
def test_bash_completes_commands_options_and_values(bash_script, words, expected):
    """Commands, options and their values complete as typed."""
    assert complete(bash_script, *words) == expected


def test_bash_completes_file_names_where_a_path_goes(bash_script):
    """--model, --policy and lint's files complete file names."""
    assert sorted(complete(bash_script, "explain", "--model", "configs/models/qwen3")) == [
        "configs/models/qwen3-30b-a3b-gptq-int4.json",
        "configs/models/qwen3-30b-a3b-nvfp4.json",
        "configs/models/qwen3-30b-a3b.json",
    ]
    assert "configs/default.yaml" in complete(bash_script, "lint", "configs/def")
    assert complete(bash_script, "explain", "--policy", "configs/profiles/stri") == [
        "configs/profiles/strict.yaml"
    ]


def test_every_option_of_the_parser_is_in_every_script():
    """Nothing is listed by hand: each option string of each command is in each shell's script."""
    parser = app.build_parser(app.command_modules())
    scripts = {shell: run_cli("completion", shell).stdout for shell in ("bash", "zsh", "fish")}
    for sub in parser.walk():
        for action in sub.actions():
            for flag in action.option_strings:
                for shell, text in scripts.items():
                    spelled = flag if shell != "fish" else flag.lstrip("-")
                    assert spelled in text, (shell, sub.prog, flag)
    for name in app.COMMANDS:
        assert all(name in text for text in scripts.values()), name


@pytest.mark.parametrize("shell", ["bash", "zsh", "fish"])
def test_the_script_parses_in_its_shell(tmp_path, shell):
    """`SHELL -n` accepts the generated script (skipped where the shell is not installed)."""
    program = shutil.which(shell)
    if program is None:
        pytest.skip(f"{shell} is not installed")
    script = tmp_path / f"moe-policy.{shell}"
    script.write_text(run_cli("completion", shell).stdout)
    done = subprocess.run(
        [program, "-n", str(script)], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("moe-policy expl", ["explain"]),
        ("moe-policy explain --pla", ["--platform"]),
        ("moe-policy explain --mode ", ["strict", "warn"]),
        ("moe-policy completion ", ["bash", "fish", "zsh"]),
        ("moe-policy lint configs/profiles/stri", ["configs/profiles/strict.yaml"]),
    ],
)
def test_fish_completes_commands_options_and_values(tmp_path, line, expected):
    """fish's own `complete -C` over the generated script (skipped without fish)."""
    fish = shutil.which("fish")
    if fish is None:
        pytest.skip("fish is not installed")
    script = tmp_path / "moe-policy.fish"
    script.write_text(run_cli("completion", "fish").stdout)
    done = subprocess.run(
        [fish, "--no-config", "-c", f"source {script}; complete -C '{line}'"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
        check=True,
    )
    assert sorted(row.split("\t")[0] for row in done.stdout.splitlines()) == expected


def test_unknown_shell_is_a_usage_error():
    """completion tcsh: exit 2, one line naming the argument and the shells there are."""
    run = run_cli("completion", "tcsh")
    assert run.returncode == 2 and run.stdout == ""
    assert run.errors() == [
        "moe-policy: error: cli:SHELL: invalid choice 'tcsh'; choose from bash, zsh, fish "
        "(see moe-policy completion --help)"
    ]
