"""``moe-policy completion bash|zsh|fish``: a shell completion script, generated from the parser.

Every subcommand, option and choice the parser knows is in the script; nothing is
listed by hand, so a new option completes once it is added. An option's value
completes from its ``choices``, from a metavar of ``|``-separated words
(``warn|strict``), or as a file name when its metavar names a ``PATH``, ``FILE`` or
``DIR``; positional arguments complete their choices or file names.

Install (each prints the script to stdout):

    moe-policy completion bash > ~/.local/share/bash-completion/completions/moe-policy
    moe-policy completion zsh > "${fpath[1]}/_moe-policy"
    moe-policy completion fish > ~/.config/fish/completions/moe-policy.fish
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from typing import Any

SHELLS = ("bash", "zsh", "fish")
PROG = "moe-policy"
_WORD = re.compile(r"[a-z0-9][a-z0-9_.=-]*")


@dataclass(frozen=True)
class Option:
    """One option as completion sees it."""

    flags: tuple[str, ...]
    help: str
    takes_value: bool
    values: tuple[str, ...]  # the words its value completes from
    files: bool  # its value is a file name
    repeatable: bool


@dataclass(frozen=True)
class Command:
    """A parser level: the top level (name ``""``) or one subcommand."""

    name: str
    help: str
    options: tuple[Option, ...]
    positional_values: tuple[str, ...]  # words a positional argument completes from
    positional_files: bool


def _values(action: argparse.Action) -> tuple[str, ...]:
    if action.choices is not None and not isinstance(action.choices, dict):
        return tuple(str(c) for c in action.choices)
    metavar = action.metavar if isinstance(action.metavar, str) else ""
    words = metavar.split("|")
    if len(words) > 1 and all(_WORD.fullmatch(w) for w in words):
        return tuple(words)
    return ()


def _files(action: argparse.Action) -> bool:
    metavar = action.metavar if isinstance(action.metavar, str) else str(action.dest)
    return any(word in metavar.upper() for word in ("PATH", "FILE", "DIR"))


def _summary(text: str | None) -> str:
    """The first sentence of ``text``, at most 70 characters, cut at a space."""
    text = " ".join((text or "").split())
    text = re.split(r"(?<=[.;])\s", text, maxsplit=1)[0].rstrip(".;")
    if len(text) > 70:
        text = text[:70].rsplit(" ", 1)[0] + "..."
    return text


def describe(parser: Any, name: str = "") -> list[Command]:
    """``parser`` (a :class:`moe_policy.cli.parser.Parser`) and its subcommands, top level first."""
    options: list[Option] = []
    values: tuple[str, ...] = ()
    files = False
    for action in parser.actions():
        if action.help == argparse.SUPPRESS:
            continue
        if action.option_strings:
            options.append(
                Option(
                    flags=tuple(action.option_strings),
                    help=_summary(action.help),
                    takes_value=action.nargs != 0,
                    values=_values(action) if action.nargs != 0 else (),
                    files=action.nargs != 0 and not _values(action) and _files(action),
                    repeatable=isinstance(action.default, list) or action.default == [],
                )
            )
        elif parser.commands and action.choices is parser.commands:
            values = tuple(parser.commands)
        else:
            values = values or _values(action)
            files = files or (not _values(action))
    commands = [
        Command(name, _summary(parser.description), tuple(options), values, files and not values)
    ]
    for sub_name, sub in parser.commands.items():
        commands.extend(describe(sub, sub_name))
    return commands


# -- bash ----------------------------------------------------------------------------------


def _bash_case(patterns: list[str], body: str) -> str:
    return f"        {'|'.join(patterns)}) {body} ;;"


def bash(commands: list[Command]) -> str:
    """A bash completion function for ``moe-policy`` (``complete -F``)."""
    top, subs = commands[0], commands[1:]
    names = " ".join(c.name for c in subs)
    value_cases: list[str] = []
    option_cases: list[str] = []
    positional_cases: list[str] = []
    for command in commands:
        key = command.name or "-"
        for option in command.options:
            if not option.takes_value:
                continue
            patterns = [f"{key}:{flag}" for flag in option.flags]
            if option.values:
                words = " ".join(option.values)
                body = f'COMPREPLY=($(compgen -W "{words}" -- "$cur")); return'
            elif option.files:
                body = 'COMPREPLY=($(compgen -f -- "$cur")); return'
            else:
                body = "COMPREPLY=(); return"
            value_cases.append(_bash_case(patterns, body))
        flags = " ".join(f for option in command.options for f in option.flags)
        option_cases.append(_bash_case([key], f'opts="{flags}"'))
        if command.positional_values:
            words = " ".join(command.positional_values)
            body = f'COMPREPLY=($(compgen -W "{words}" -- "$cur"))'
        elif command.positional_files:
            body = 'COMPREPLY=($(compgen -f -- "$cur"))'
        else:
            body = "COMPREPLY=()"
        positional_cases.append(_bash_case([key], body))
    del top
    return "\n".join(
        [
            f"# bash completion for {PROG}; generated by `{PROG} completion bash`",
            "_moe_policy() {",
            '    local cur="${COMP_WORDS[COMP_CWORD]}" prev="${COMP_WORDS[COMP_CWORD-1]}"',
            '    local cmd="-" opts="" i',
            "    for ((i = 1; i < COMP_CWORD; i++)); do",
            '        case "${COMP_WORDS[i]}" in',
            f"            {names.replace(' ', '|')}) cmd=" + '"${COMP_WORDS[i]}"; break ;;',
            "        esac",
            "    done",
            '    case "$cmd:$prev" in',
            *value_cases,
            "    esac",
            '    case "$cmd" in',
            *option_cases,
            "    esac",
            '    if [[ "$cur" == -* ]]; then',
            '        COMPREPLY=($(compgen -W "$opts" -- "$cur"))',
            "        return",
            "    fi",
            '    case "$cmd" in',
            *positional_cases,
            "    esac",
            "}",
            f"complete -o filenames -F _moe_policy {PROG}",
            "",
        ]
    )


# -- zsh -----------------------------------------------------------------------------------


def _zsh_text(text: str) -> str:
    escaped = re.sub(r"([\[\]:\\])", r"\\\1", text)
    return escaped.replace("'", "'\\''")


def _zsh_option(option: Option) -> list[str]:
    specs = []
    for flag in option.flags:
        spec = f"{'*' if option.repeatable else ''}{flag}[{_zsh_text(option.help)}]"
        if option.takes_value:
            if option.values:
                spec += f":value:({' '.join(option.values)})"
            elif option.files:
                spec += ":file:_files"
            else:
                spec += ":value: "
        specs.append(f"'{spec}'")
    return specs


def _zsh_positional(command: Command) -> list[str]:
    if command.positional_values:
        return [f"'*:argument:({' '.join(command.positional_values)})'"]
    if command.positional_files:
        return ["'*:file:_files'"]
    return []


def zsh(commands: list[Command]) -> str:
    """A zsh completion function (``#compdef moe-policy``) built on ``_arguments``."""
    top, subs = commands[0], commands[1:]
    described = [f"        '{c.name}:{_zsh_text(c.help)}'" for c in subs]
    top_specs = [s for o in top.options for s in _zsh_option(o)]
    lines = [
        f"#compdef {PROG}",
        f"# zsh completion for {PROG}; generated by `{PROG} completion zsh`",
        "_moe_policy() {",
        "    local curcontext=$curcontext state line",
        "    local -a commands",
        "    commands=(",
        *described,
        "    )",
        "    _arguments -C \\",
        *(f"        {spec} \\" for spec in top_specs),
        "        '1:command:->command' \\",
        "        '*::argument:->argument' && return",
        "    case $state in",
        "        command) _describe -t commands 'moe-policy command' commands ;;",
        "        argument)",
        "            case $line[1] in",
    ]
    for command in subs:
        specs = [s for o in command.options for s in _zsh_option(o)] + _zsh_positional(command)
        lines.append(f"                {command.name}) _arguments \\")
        lines.extend(f"                    {spec} \\" for spec in specs)
        lines.append("                    ;;")
    lines += [
        "            esac",
        "            ;;",
        "    esac",
        "}",
        "# autoloaded from $fpath as _moe-policy: complete now; sourced: register the function",
        'if [ "$funcstack[1]" = "_moe-policy" ]; then',
        '    _moe_policy "$@"',
        "else",
        f"    compdef _moe_policy {PROG}",
        "fi",
        "",
    ]
    # the last spec of each _arguments call must not end the line with a backslash
    return re.sub(r" \\\n(\s+;;)", r"\n\1", "\n".join(lines))


# -- fish ----------------------------------------------------------------------------------


def _fish_text(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _fish_option(condition: str, option: Option) -> str:
    parts = [f"complete -c {PROG} -n {_fish_text(condition)}"]
    for flag in option.flags:
        if flag.startswith("--"):
            parts.append(f"-l {flag[2:]}")
        elif len(flag) == 2:
            parts.append(f"-s {flag[1]}")
        else:
            parts.append(f"-o {flag[1:]}")
    if option.takes_value:
        if option.values:
            parts.append(f"-x -a {_fish_text(' '.join(option.values))}")
        elif option.files:
            parts.append("-r -F")
        else:
            parts.append("-x")
    if option.help:
        parts.append(f"-d {_fish_text(option.help)}")
    return " ".join(parts)


def fish(commands: list[Command]) -> str:
    """fish ``complete`` lines for every subcommand and option."""
    top, subs = commands[0], commands[1:]
    lines = [
        f"# fish completion for {PROG}; generated by `{PROG} completion fish`",
        f"complete -c {PROG} -f",
    ]
    lines += [_fish_option("__fish_use_subcommand", o) for o in top.options]
    for command in subs:
        lines.append(
            f"complete -c {PROG} -n __fish_use_subcommand -a {command.name}"
            + (f" -d {_fish_text(command.help)}" if command.help else "")
        )
    for command in subs:
        condition = f"__fish_seen_subcommand_from {command.name}"
        lines += [_fish_option(condition, o) for o in command.options]
        if command.positional_values:
            words = _fish_text(" ".join(command.positional_values))
            lines.append(f"complete -c {PROG} -n {_fish_text(condition)} -x -a {words}")
        elif command.positional_files:
            lines.append(f"complete -c {PROG} -n {_fish_text(condition)} -F")
    return "\n".join(lines) + "\n"


GENERATORS = {"bash": bash, "zsh": zsh, "fish": fish}


def script(shell: str) -> str:
    """The completion script for ``shell``, from the parser of every command."""
    from moe_policy.cli.app import build_parser, command_modules

    return GENERATORS[shell](describe(build_parser(command_modules())))


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``completion``."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "completion",
        help="print a shell completion script (bash, zsh or fish)",
        description="Print a completion script for SHELL, generated from this parser. "
        "bash: moe-policy completion bash > ~/.local/share/bash-completion/completions/"
        'moe-policy; zsh: moe-policy completion zsh > "${fpath[1]}/_moe-policy"; fish: '
        "moe-policy completion fish > ~/.config/fish/completions/moe-policy.fish",
    )
    parser.add_argument("shell", choices=SHELLS, metavar="SHELL", help="bash, zsh or fish")
    return parser


def run(args: argparse.Namespace) -> int:
    """Print the script."""
    sys.stdout.write(script(args.shell))
    return 0
