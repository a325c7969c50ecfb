"""Logging for the ``moe-policy`` process: structlog to stderr, console or JSON lines.

Only the CLI calls this; the library never configures logging. On a terminal the
events are rendered for people (``ConsoleRenderer``); otherwise, or with
``--log-format json``, each event is one JSON line, so stdout stays machine-readable.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

LOG_FORMATS = ("console", "json")


def pick_format(requested: str | None, stream: Any = None) -> str:
    """``requested``, or console on a terminal and json otherwise."""
    if requested:
        return requested
    stream = stream if stream is not None else sys.stderr
    isatty = getattr(stream, "isatty", None)
    return "console" if isatty is not None and isatty() else "json"


def configure_logging(requested: str | None = None, level: int = logging.INFO) -> str:
    """Configure structlog for this process and return the format chosen."""
    import structlog

    fmt = pick_format(requested)
    renderer: Any
    if fmt == "json":
        renderer = structlog.processors.JSONRenderer(sort_keys=True)
    else:
        renderer = structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    structlog.configure(
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        cache_logger_on_first_use=True,
    )
    return fmt
