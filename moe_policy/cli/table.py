"""Terminal tables and headings for the human output (tabulate, imported on first use)."""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from typing import Any

#: The output fits a terminal this wide.
WIDTH = 100


def wrap(text: str, width: int | None) -> str:
    """``text`` wrapped at spaces to ``width`` columns; continuation lines are indented."""
    if width is None:
        return text
    out: list[str] = []
    for line in text.splitlines() or [""]:
        indent = " " * (len(line) - len(line.lstrip(" ")))
        out.extend(
            textwrap.wrap(
                line,
                width,
                break_on_hyphens=False,
                subsequent_indent=indent + "  " if indent else "",
            )
            or [""]
        )
    return "\n".join(out)


def table(
    rows: Sequence[Sequence[Any]],
    headers: Sequence[str],
    widths: Sequence[int | None] | None = None,
) -> str:
    """A plain-text table; cells wrap at ``widths`` (None: no limit); numbers stay as written.

    With two spaces between columns, a table fits ``WIDTH`` when the widths sum to
    at most ``WIDTH - 2 * (columns - 1)``.
    """
    import tabulate as tabulate_module

    tabulate_module.MIN_PADDING = 0  # column width = widest cell; the 2-space gap stays
    limits = list(widths) if widths is not None else [None] * len(headers)
    cells = [
        [
            wrap("-" if cell is None or cell == "" else str(cell), limit)
            for cell, limit in zip(row, limits, strict=True)
        ]
        for row in rows
    ]
    return str(
        tabulate_module.tabulate(
            cells,
            headers=list(headers),
            tablefmt="simple",
            disable_numparse=True,
        )
    )


def heading(title: str, note: str = "") -> str:
    """A section title, underlined, with an optional note after it."""
    text = f"{title}  ({note})" if note else title
    return f"{text}\n{'=' * min(len(text), WIDTH)}"


def value_text(value: Any) -> str:
    """A context or settings value as people write it (lists comma-joined, None as null)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(str(v) for v in value) + "]"
    return str(value)
