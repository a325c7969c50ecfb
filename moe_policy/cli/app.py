"""``moe-policy``: the command-line entry point (explain, lint, backends, diff, plan, schema,
models, tune, completion).

Each subcommand lives in ``moe_policy/cli/<name>.py`` and exposes
``add_parser(subparsers)`` and ``run(args) -> int``. ``COMMANDS`` is the one list
of them; only the module of the command named on the line is imported.

Exit codes (documented in the README and in ``--help``): 0 decided (warn-mode overrides
included), 1 lint found an error, 2 bad input (policy, env, model, flags), 3 refused in
strict mode, 4 no feasible backend. Errors are one line on stderr that names the
origin of the bad value (argparse errors too: ``cli:--flag``); no traceback.

This is the only place that configures logging (``moe_policy.cli.logsetup``);
the library never does.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import os
import sys
from collections.abc import Sequence
from types import ModuleType

from moe_policy.cli.parser import Parser, help_epilog
from moe_policy.errors import BackendOverrideError, MoEPolicyError, NoFeasibleBackendError

#: Every subcommand, in help order; each is ``moe_policy.cli.<name>``.
COMMANDS = (
    "explain",
    "lint",
    "backends",
    "diff",
    "plan",
    "schema",
    "models",
    "tune",
    "completion",
)

EXIT_OK = 0
EXIT_LINT_ERROR = 1
EXIT_BAD_INPUT = 2
EXIT_REFUSED = 3
EXIT_NO_BACKEND = 4
COLOR_HELP = "colour: auto (on a terminal, unless NO_COLOR is set), always or never"


def command_modules(names: Sequence[str] = COMMANDS) -> dict[str, ModuleType]:
    """The modules of the commands ``names``, in order."""
    return {name: importlib.import_module(f"moe_policy.cli.{name}") for name in names}


def requested_commands(argv: Sequence[str]) -> tuple[str, ...]:
    """Only the command named on the line (its module alone is imported), else all of them."""
    first = next((arg for arg in argv if not arg.startswith("-")), None)
    return (first,) if first in COMMANDS else COMMANDS


def build_parser(commands: dict[str, ModuleType]) -> Parser:
    """The top-level parser with one subparser per available command."""
    from moe_policy.cli.terminal import COLOR_CHOICES

    parser = Parser(
        prog="moe-policy",
        description="Explain, lint and audit the fused-MoE kernel backend policy.",
        epilog=help_epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    from moe_policy._version import __version__

    parser.add_argument("--version", action="version", version=f"moe-policy {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    subparsers.required = True
    parser.add_argument("--color", choices=COLOR_CHOICES, default=None, help=COLOR_HELP)
    for module in commands.values():
        module.add_parser(subparsers)
    for sub in parser.commands.values():  # also after the command; SUPPRESS keeps the top's
        sub.add_argument(
            "--color", choices=COLOR_CHOICES, default=argparse.SUPPRESS, help=COLOR_HELP
        )
    return parser


def error_line(exc: BaseException) -> str:
    """The one stderr line for an error (multi-line library messages joined)."""
    first, *rest = [part.strip(" -") for part in str(exc).splitlines() if part.strip()] or [""]
    if rest:
        first = f"{first} " if first.endswith(":") else f"{first}; "
    return f"moe-policy: error: {first}{'; '.join(rest)}"


def exit_code(exc: MoEPolicyError) -> int:
    """The documented exit code for a library error."""
    if isinstance(exc, BackendOverrideError):
        return EXIT_REFUSED
    if isinstance(exc, NoFeasibleBackendError):
        return EXIT_NO_BACKEND
    return EXIT_BAD_INPUT


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv``, configure logging for the terminal, run the command.

    Called without ``argv`` (the console script), the process is short-lived: cyclic
    garbage collection is switched off and the heap frozen before exit, which spares
    the interpreter a full collection over every imported object at shutdown (about a
    fifth of an ``explain`` run). Callers that pass ``argv`` keep the collector as is.
    """
    console = argv is None
    if console:
        gc.disable()
    try:
        return _main(list(sys.argv[1:] if argv is None else argv))
    finally:
        if console:
            gc.freeze()


def _main(argv: list[str]) -> int:
    commands = command_modules(requested_commands(argv))
    args = build_parser(commands).parse_args(argv)
    from moe_policy.cli.logsetup import LEVELS, configure_logging

    verbosity = getattr(args, "verbosity", 0)
    configure_logging(
        getattr(args, "log_format", None),
        LEVELS[max(-1, min(1, verbosity))],
        args.color,
        report_on_terminal=not getattr(args, "json", False) and sys.stdout.isatty(),
    )
    try:
        return int(commands[args.command].run(args))
    except MoEPolicyError as exc:
        print(error_line(exc), file=sys.stderr)
        return exit_code(exc)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `moe-policy ... | head`: the reader left; nothing more to say
        silence_stdout()
        return EXIT_OK


def silence_stdout() -> None:
    """Point stdout at /dev/null after a broken pipe, so the exit flush does not fail."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
