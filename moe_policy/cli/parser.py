"""The argument parser of ``moe-policy``: errors in the one-line form, and a parser that
can be walked (shell completion is generated from it).

An argparse error is one stderr line that starts with the origin of the bad value, as
every other error does, and exits 2::

    moe-policy: error: cli:--log-format: invalid choice 'jsn' (did you mean 'json'?); \
choose from console, json (see moe-policy explain --help)
    moe-policy: error: cli:COMMAND: unknown command 'explian' (did you mean 'explain'?); \
choose from explain, lint, ... (see moe-policy --help)
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Iterator
from typing import Any, NoReturn

from moe_policy.errors import did_you_mean

EXIT_BAD_INPUT = 2
PROG = "moe-policy"
#: What the value of each origin-less message is about (argparse's wording, Python 3.9+).
_ARGUMENT = re.compile(r"argument (?P<name>[^:]+): (?P<rest>.*)", re.DOTALL)
_CHOICE = re.compile(
    r"invalid choice: (?P<value>'.*?'|\".*?\"|\S+)(?: \(choose from (?P<choices>.*)\))?$"
)
_REQUIRED = re.compile(r"the following arguments are required: (?P<names>.*)")
_UNRECOGNIZED = re.compile(r"unrecognized arguments: (?P<args>.*)")
_AMBIGUOUS = re.compile(r"ambiguous option: (?P<option>\S+) could match (?P<matches>.*)")
_ONE_OF = re.compile(r"one of the arguments (?P<names>.*) is required")


class Parser(argparse.ArgumentParser):
    """argparse with one-line, origin-first errors (exit 2) instead of usage dumps; it
    can list its actions (``actions()``) and its subcommands (``commands``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        #: The subcommand parsers by name, when ``add_subparsers`` was called.
        self.commands: dict[str, Parser] = {}
        #: How the subcommand argument is named in messages (its metavar).
        self.command_name = ""
        super().__init__(*args, **kwargs)

    def add_subparsers(self, **kwargs: Any) -> Any:
        action = super().add_subparsers(**kwargs)
        self.commands = action.choices  # filled as commands are added
        self.command_name = str(kwargs.get("metavar") or kwargs.get("dest") or "")
        return action

    def actions(self) -> list[argparse.Action]:
        """Every action of this parser, in order, those in argument groups included.

        argparse has no public list of them; ``_actions`` is the one that completion
        generators (argcomplete, shtab) read too, stable since Python 2.7.
        """
        return list(self._actions)

    def parse_args(self, args: Any = None, namespace: Any = None) -> Any:
        """As argparse's, but an unknown option is reported by the subcommand it was given
        to (its options for the did-you-mean, its ``--help`` to see); one given before the
        command, whose value would be read as the command, is named as an unknown option."""
        if self.commands:
            self._check_leading_options(list(sys.argv[1:] if args is None else args))
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            command = self.commands.get(str(getattr(parsed, "command", "")), self)
            command.error(f"unrecognized arguments: {' '.join(extras)}")
        return parsed

    def _check_leading_options(self, args: list[str]) -> None:
        """An unknown option before the command where no command follows it (``--colour
        never backends``: argparse would read ``never`` as the command) is an unknown option
        with a did-you-mean, not an unknown command."""
        known = {o: a for a in self.actions() for o in a.option_strings}
        unknown: str | None = None
        index = 0
        while index < len(args) and args[index].startswith("-") and args[index] != "--":
            flag, has_value = args[index].split("=", 1)[0], "=" in args[index]
            action = known.get(flag)
            if action is None and flag.startswith("--") and self.allow_abbrev:
                matches = [a for o, a in known.items() if o.startswith(flag)]
                action = matches[0] if len(set(matches)) == 1 else None
                if len(set(matches)) > 1:
                    return  # ambiguous: argparse says so
            if action is None:
                unknown = unknown or flag
            elif action.nargs != 0 and not has_value:
                index += 1  # the option's value
            index += 1
        if unknown is None:
            return
        command = self.commands.get(args[index]) if index < len(args) else None
        if command is None:
            self.error(f"unrecognized arguments: {unknown}")
        if any(unknown in a.option_strings for a in command.actions()):
            name = args[index]
            self.exit(
                EXIT_BAD_INPUT,
                f"{PROG}: error: cli:{unknown}: an option of {name}, given before it (put it "
                f"after the command: {PROG} {name} {unknown} ...) (see {command.prog} --help)\n",
            )
        # otherwise the option is reported as unrecognized by the command (parse_args)

    def walk(self) -> Iterator[Parser]:
        """This parser and every subcommand parser below it."""
        yield self
        for sub in self.commands.values():
            yield from sub.walk()

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_BAD_INPUT, f"{PROG}: error: {self.explain_error(message)}\n")

    def explain_error(self, message: str) -> str:
        """argparse's ``message`` as ``cli:<flag>: <what is wrong> (see <prog> --help)``."""
        origin, text = self._origin_and_text(message)
        return f"cli:{origin}: {text} (see {self.prog} --help)"

    def _option_strings(self) -> list[str]:
        return sorted({o for p in self.walk() for a in p.actions() for o in a.option_strings})

    def _origin_and_text(self, message: str) -> tuple[str, str]:
        match = _ARGUMENT.match(message)
        if match:
            names = match["name"].split("/")
            name = next((n for n in names if n.startswith("--")), names[0])
            return name, self._argument_text(name, match["rest"])
        match = _REQUIRED.match(message)
        if match:
            first, *others = [n.strip() for n in match["names"].split(",")]
            also = (
                f"; so {'is' if len(others) == 1 else 'are'} {', '.join(others)}" if others else ""
            )
            return first.split("/")[-1], f"required{also}"
        match = _UNRECOGNIZED.match(message)
        if match:
            first = match["args"].split()[0] if match["args"].split() else match["args"]
            if first.startswith("-"):
                flag = first.split("=", 1)[0]
                hint = did_you_mean(flag, self._option_strings())
                return flag, f"unknown option{hint}"
            return first, "unexpected argument"
        match = _AMBIGUOUS.match(message)
        if match:
            return match["option"], f"ambiguous option: could be {match['matches']}"
        match = _ONE_OF.match(message)
        if match:
            names = match["names"].split()
            return names[0].split("/")[-1], f"one of {' '.join(names)} is required"
        return "", message

    def _argument_text(self, name: str, rest: str) -> str:
        match = _CHOICE.match(rest)
        if not match:
            return rest
        value = match["value"].strip("'\"")
        listing = match["choices"] or ""
        # Python < 3.12.8 quotes each choice ('a', 'b'); later versions do not (a, b)
        choices = re.findall(r"'((?:[^'\\]|\\.)*)'", listing) or [
            c.strip() for c in listing.split(",") if c.strip()
        ]
        what = "unknown command" if name == self.command_name else "invalid choice"
        listed = f"; choose from {', '.join(choices)}" if choices else ""
        return f"{what} {value!r}{did_you_mean(value, choices)}{listed}"


EXAMPLES = (
    "moe-policy explain --model qwen3-30b-a3b --platform cuda --capability 9.0 --lora",
    "moe-policy explain --model config.json --profile strict --json > decision.json",
    "moe-policy explain --model qwen3-30b-a3b --platform rocm -q",
    "moe-policy lint configs/default.yaml configs/profiles/*.yaml",
    "moe-policy diff before.jsonl after.jsonl",
    "moe-policy plan --from configs/default.yaml --to serving.yaml",
    "moe-policy completion bash > ~/.local/share/bash-completion/completions/moe-policy",
)
#: What the variables that set no single key are for (the others name their key).
VARIABLE_NOTES = {
    "MOE_POLICY_FILES": "policy files, os.pathsep-separated (--policy replaces them)",
    "MOE_POLICY_ENGINE": "the engine the decision is for (as --engine)",
    "MOE_POLICY_AUDIT_DIR": "the directory of the audit profile's audit.path",
    "MOE_POLICY_TUNED_CONFIG_DIR": "tuned Triton tile files (moe-policy tune), before the shipped ones",
}
TERMINAL_VARIABLES = (
    ("NO_COLOR", "any value: no colour (--color wins)"),
    ("FORCE_COLOR", "any value: colour even off a terminal (--color wins)"),
    ("COLUMNS", "the output width (default: the terminal's, else 100; 60 to 160)"),
)
EXIT_CODES = (
    (0, "decided (warn-mode overrides included); lint clean, diff identical, plan unchanged"),
    (1, "lint found an error; diff: different; plan: changes"),
    (2, "bad input: policy, environment, model or flags (one error line naming its origin)"),
    (3, "refused in strict mode"),
    (4, "no feasible backend"),
)


def help_epilog() -> str:
    """The end of ``moe-policy --help``: examples, environment variables, exit codes."""
    from moe_policy.settings.env import OUR_VARIABLES

    variables = [
        (name, f"sets {key}" if key else VARIABLE_NOTES.get(name, ""))
        for name, key in OUR_VARIABLES.items()
    ]
    variables += list(TERMINAL_VARIABLES)
    width = max(len(name) for name, _ in variables) + 2
    return "\n".join(
        [
            "examples:",
            *(f"  {example}" for example in EXAMPLES),
            "",
            "environment:",
            *(f"  {name:<{width}}{text}" for name, text in variables),
            "",
            "exit codes:",
            *(f"  {code}  {text}" for code, text in EXIT_CODES),
        ]
    )
