"""Logging for the ``moe-policy`` process: structlog to stderr, console or JSON lines.

Only the CLI calls this; the library never configures logging. On a terminal the
events are rendered for people (``ConsoleRenderer``, coloured as ``--color``,
``NO_COLOR`` and ``FORCE_COLOR`` allow); otherwise, or with ``--log-format json``,
each event is one JSON line, so stdout stays machine-readable.

When the format was not asked for and the human report goes to a terminal, the events
that only repeat what the report shows (the decision, an override or adaptation, an
audit-only rule, an ignored knob, no feasible backend) are left out; ``-v`` keeps them,
and ``--log-format console|json`` always prints every event, as scripts expect.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import MutableMapping
from typing import Any

LOG_FORMATS = ("console", "json")
#: Events whose content the human report of ``explain`` already shows.
REPORTED_EVENTS = frozenset(
    {
        "moe_policy.decision",
        "moe_policy.request_overridden",
        "moe_policy.request_adapted",
        "moe_policy.rule_audit",
        "moe_policy.knob_ignored",
        "moe_policy.no_feasible_backend",
    }
)
#: ``-q`` / none / ``-v`` -> the lowest level printed.
LEVELS = {-1: logging.WARNING, 0: logging.INFO, 1: logging.DEBUG}


def pick_format(requested: str | None, stream: Any = None) -> str:
    """``requested``, or console on a terminal and json otherwise."""
    if requested:
        return requested
    stream = stream if stream is not None else sys.stderr
    isatty = getattr(stream, "isatty", None)
    return "console" if isatty is not None and isatty() else "json"


def drop_reported(_logger: Any, _method: str, event_dict: MutableMapping[str, Any]) -> Any:
    """Leave out an event the human report on the terminal already shows."""
    import structlog

    if event_dict.get("event") in REPORTED_EVENTS:
        raise structlog.DropEvent
    return event_dict


def configure_logging(
    requested: str | None = None,
    level: int = logging.INFO,
    color: str | None = None,
    report_on_terminal: bool = False,
) -> str:
    """Configure structlog for this process and return the format chosen.

    ``color`` is the ``--color`` choice for stderr; ``report_on_terminal`` says the human
    report goes to a terminal, so events that repeat it are left out (only when the
    format was not ``requested``).
    """
    import structlog

    from moe_policy.cli.terminal import use_color

    fmt = pick_format(requested)
    renderer: Any
    if fmt == "json":
        renderer = structlog.processors.JSONRenderer(sort_keys=True)
    else:
        renderer = structlog.dev.ConsoleRenderer(colors=use_color(color, sys.stderr))
    processors: list[Any] = [structlog.processors.add_log_level]
    if report_on_terminal and not requested and level > logging.DEBUG:
        processors.append(drop_reported)
    structlog.configure(
        processors=[
            *processors,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        cache_logger_on_first_use=True,
    )
    return fmt
