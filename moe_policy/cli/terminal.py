"""What the terminal allows: how wide the output may be and whether it may be coloured.

Width: ``COLUMNS`` when it is a positive integer, else the terminal's width when the
stream is a terminal, else ``DEFAULT_WIDTH``; always clamped to ``MIN_WIDTH`` ..
``MAX_WIDTH`` (narrower tables are unreadable, wider lines are hard to follow).

Colour (the first that applies wins): ``--color always|never``; ``NO_COLOR`` set to any
non-empty value (no colour); ``FORCE_COLOR`` set to any non-empty value (colour);
``TERM=dumb`` (no colour); else colour exactly when the stream is a terminal
(``--color auto``, the default).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TextIO

COLOR_CHOICES = ("auto", "always", "never")
#: Width when the output is not a terminal and ``COLUMNS`` is not set.
DEFAULT_WIDTH = 100
MIN_WIDTH = 60
MAX_WIDTH = 160


def _isatty(stream: Any) -> bool:
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty is not None and isatty())
    except ValueError:  # a closed stream
        return False


def output_width(stream: TextIO | None = None, environ: Mapping[str, str] | None = None) -> int:
    """The width to lay the output out for, in columns (see the module docstring)."""
    environ = os.environ if environ is None else environ
    stream = sys.stdout if stream is None else stream
    width = DEFAULT_WIDTH
    columns = environ.get("COLUMNS", "").strip()
    if columns.isascii() and columns.isdigit() and int(columns) > 0:
        width = int(columns)
    elif _isatty(stream):
        try:
            width = os.get_terminal_size(stream.fileno()).columns or DEFAULT_WIDTH
        except (OSError, ValueError):
            width = DEFAULT_WIDTH
    return max(MIN_WIDTH, min(MAX_WIDTH, width))


def use_color(
    choice: str | None = None,
    stream: TextIO | None = None,
    environ: Mapping[str, str] | None = None,
) -> bool:
    """Whether output to ``stream`` may carry colour escapes (see the module docstring)."""
    environ = os.environ if environ is None else environ
    if choice == "always":
        return True
    if choice == "never":
        return False
    if environ.get("NO_COLOR"):
        return False
    if environ.get("FORCE_COLOR"):
        return True
    if environ.get("TERM") == "dumb":
        return False
    return _isatty(sys.stdout if stream is None else stream)


RESET = "\033[0m"
CODES = {"bold": "1", "dim": "2", "red": "31", "green": "32", "yellow": "33", "cyan": "36"}


@dataclass(frozen=True)
class Style:
    """Colour and emphasis for one stream; every method returns its text unchanged when
    colour is off, so layout never depends on it."""

    color: bool = False

    def paint(self, text: str, *names: str) -> str:
        """``text`` in the SGR styles ``names`` (``bold``, ``dim``, ``red``, ``green``, ...)."""
        if not self.color or not text or not names:
            return text
        return f"\033[{';'.join(CODES[name] for name in names)}m{text}{RESET}"

    def bold(self, text: str) -> str:
        return self.paint(text, "bold")

    def dim(self, text: str) -> str:
        return self.paint(text, "dim")

    def good(self, text: str) -> str:
        return self.paint(text, "bold", "green")

    def warn(self, text: str) -> str:
        return self.paint(text, "bold", "yellow")

    def bad(self, text: str) -> str:
        return self.paint(text, "bold", "red")


PLAIN = Style(False)


def style_for(choice: str | None = None, stream: TextIO | None = None) -> Style:
    """The style for ``stream`` under ``--color choice`` and the environment."""
    return Style(use_color(choice, stream))
