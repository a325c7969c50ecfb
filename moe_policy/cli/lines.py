"""Lines of free text fitted to a width with every word kept whole.

A line wraps at spaces only; a word longer than the line (a long path, an origin such as
``file:/a/b/policy.yaml:3:5``) overflows it instead of being cut, so a path printed here can
be copied from the terminal in one piece. Continuation lines are indented two columns more
than the line's own indent.
"""

from __future__ import annotations

import textwrap

#: How much further than its line a continuation line is indented.
HANG = 2


def fit(line: str, width: int | None, hang: int = HANG) -> str:
    """``line`` wrapped at its spaces to ``width`` columns (None: unchanged)."""
    body = line.lstrip(" ")
    if width is None or len(line) <= width or not body:
        return line
    indent = line[: len(line) - len(body)]
    return "\n".join(
        textwrap.wrap(
            body,
            width,
            initial_indent=indent,
            subsequent_indent=indent + " " * hang,
            break_long_words=False,
            break_on_hyphens=False,
        )
    )
