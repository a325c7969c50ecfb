"""Terminal tables and headings for the human output (tabulate, imported on first use).

Text wraps only at spaces and, inside a path too long for its column, after a ``/``;
an identifier (``device.capability``, ``flashinfer_cutlass``) is never split: a token
longer than its column overflows it instead.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Sequence
from typing import Any

#: The width a table fits when none is given (the output's width off a terminal).
WIDTH = 100
#: The gap between two table columns.
GAP = 2
#: How far a last cell that does not fit beside its row is indented under it.
STACK_INDENT = 4
#: A hanging table's last column: the first columns keep their natural widths if that
#: leaves it ``HANG_MIN`` columns, else they are fitted to leave it ``HANG_ROOM``.
HANG_MIN = 12
HANG_ROOM = 20
_PATH_PIECE = re.compile(r"[^/]*/+|[^/]+")


def _pieces(word: str) -> list[str]:
    """``word`` cut after each ``/`` (``a/b/c`` -> ``a/``, ``b/``, ``c``)."""
    return _PATH_PIECE.findall(word) or [word]


def _wrap_line(line: str, width: int, follow: str | None = None) -> list[str]:
    """``line`` in lines of ``width``, the spaces between words kept as written;
    continuation lines start with ``follow`` (by default two spaces more than the
    line's own indent, none for a line without one)."""
    body = line.lstrip(" ")
    indent = line[: len(line) - len(body)]
    if follow is None:
        follow = indent + "  " if indent else ""
    out: list[str] = []
    current, at_start = indent, True
    for space, word in re.findall(r"( *)([^ ]+)", body):
        pieces = _pieces(word) if len(follow) + len(word) > width else [word]
        for i, piece in enumerate(pieces):
            sep = "" if at_start else space if i == 0 else ""
            if at_start or len(current) + len(sep) + len(piece) <= width:
                current += sep + piece
            else:
                out.append(current)
                current = follow + piece
            at_start = False
    out.append(current if not at_start else "")
    return out


def wrap(text: str, width: int | None) -> str:
    """``text`` wrapped to ``width`` columns at spaces (and after ``/`` in a path that does
    not fit a line); continuation lines of an indented line are indented two more."""
    if width is None:
        return text
    return "\n".join(part for line in text.splitlines() or [""] for part in _wrap_line(line, width))


def fill(text: str, width: int, indent: int = 0) -> str:
    """``text`` as one paragraph filled to ``width`` (wrapped as :func:`wrap` does),
    continuation lines indented by ``indent`` columns."""
    return "\n".join(_wrap_line(" ".join(text.splitlines()), width, " " * indent))


def _narrowest(cell: str) -> int:
    """The narrowest column ``cell`` wraps into without splitting a word or path piece."""
    narrowest = 1
    for line in cell.splitlines():
        indent = len(line) - len(line.lstrip(" "))
        follow = indent + 2 if indent else 0
        for word in line.split():
            narrowest = max(narrowest, follow + max(len(p) for p in _pieces(word)))
    return narrowest


def _share(narrowest: list[int], natural: list[int], available: int) -> list[int]:
    """Water-filling: each column up to a common level, within its narrowest and natural."""

    def widths_at(level: int) -> list[int]:
        return [max(lo, min(level, hi)) for lo, hi in zip(narrowest, natural, strict=True)]

    level = 0
    while level < max(natural) and sum(widths_at(level + 1)) <= available:
        level += 1
    widths = widths_at(level)
    spare = available - sum(widths)
    for i, width in enumerate(widths):
        if spare > 0 and width == level < natural[i]:
            widths[i] += 1
            spare -= 1
    return widths


def _height(columns: Sequence[Sequence[str]], widths: Sequence[int]) -> tuple[int, int]:
    """How many lines the table's rows take at ``widths``, then how many cells wrap."""
    lines = wrapped = 0
    for row in zip(*columns, strict=True):
        counts = [
            len(wrap(c, w).splitlines()) - len(c.splitlines())
            for c, w in zip(row, widths, strict=True)
        ]
        lines += max(len(c.splitlines()) + n for c, n in zip(row, counts, strict=True))
        wrapped += sum(1 for n in counts if n)
    return lines, wrapped


def fit_widths(columns: Sequence[Sequence[str]], total: int) -> list[int]:
    """Column widths that fit ``total`` columns (gaps included) where the words allow.

    Candidates: the space shared evenly (a column narrower than its share keeps its
    natural width, none goes below its longest word), and the same with some columns
    kept at their natural width first; the one with the fewest lines wins (then the
    fewest wrapped cells, then the even share).
    """
    natural = [
        max((len(line) for cell in col for line in cell.splitlines()), default=1) for col in columns
    ]
    narrowest = [
        min(max((_narrowest(cell) for cell in col), default=1), width)
        for col, width in zip(columns, natural, strict=True)
    ]
    available = total - GAP * (len(columns) - 1)
    if sum(natural) <= available:
        return natural
    if sum(narrowest) >= available:
        return narrowest
    best = _share(narrowest, natural, available)
    best_height = _height(columns, best)
    for kept in itertools.product((False, True), repeat=len(columns)):
        low = [hi if keep else lo for keep, lo, hi in zip(kept, narrowest, natural, strict=True)]
        if not any(kept) or all(kept) or sum(low) > available:
            continue
        widths = _share(low, natural, available)
        height = _height(columns, widths)
        if height < best_height:
            best, best_height = widths, height
    return best


def table(
    rows: Sequence[Sequence[Any]],
    headers: Sequence[str],
    widths: Sequence[int | None] | None = None,
    total: int | None = None,
) -> str:
    """A plain-text table; numbers stay as written, empty cells show ``-``.

    Cells wrap at ``widths`` (None: no limit), or, given ``total``, at widths chosen so
    the table fits ``total`` columns (:func:`fit_widths`). Where even the longest words
    of every column do not fit side by side, the last cell of a row goes under the row
    unless it fits beside it (:func:`_hanging`). With two spaces between columns, a table
    fits ``WIDTH`` when the widths sum to at most ``WIDTH - 2 * (columns - 1)``.
    """
    texts = [["-" if cell is None or cell == "" else str(cell) for cell in row] for row in rows]
    if total is None:
        limits = list(widths) if widths is not None else [None] * len(headers)
        return _tabulate(texts, headers, limits)
    columns = [[str(h)] + [row[i] for row in texts] for i, h in enumerate(headers)]
    available = total - GAP * (len(columns) - 1)
    if len(columns) > 2 and sum(_narrowest_of(col) for col in columns) > available:
        return _hanging(texts, headers, total)
    return _tabulate(texts, headers, list(fit_widths(columns, total)))


def _narrowest_of(column: Sequence[str]) -> int:
    natural = max((len(line) for cell in column for line in cell.splitlines()), default=1)
    return min(natural, max((_narrowest(cell) for cell in column), default=1))


def _hanging(texts: list[list[str]], headers: Sequence[str], total: int) -> str:
    """A table whose last cell stays beside its row where it fits that row's height,
    and otherwise goes on the lines under the row, indented by ``STACK_INDENT``."""
    firsts = [[h, *(row[i] for row in texts)] for i, h in enumerate(headers[:-1])]
    natural = [max(len(line) for cell in col for line in cell.splitlines()) for col in firsts]
    gaps = GAP * (len(headers) - 1)
    if sum(natural) + gaps + HANG_MIN <= total:
        limits = natural
    else:
        limits = fit_widths(firsts, total - GAP - HANG_ROOM)
    last = max(HANG_MIN, total - sum(limits) - gaps)
    cells: list[list[str]] = []
    below: list[list[str]] = []
    for row in texts:
        wrapped = [wrap(cell, limit) for cell, limit in zip(row[:-1], limits, strict=True)]
        height = max(len(cell.splitlines()) for cell in wrapped)
        tail = wrap(row[-1], last)
        beside = _narrowest(row[-1]) <= last and len(tail.splitlines()) <= height
        cells.append([*wrapped, tail if beside else ""])
        below.append([] if beside else wrap(row[-1], total - STACK_INDENT).splitlines())
    lines = _tabulate(cells, headers, [None] * len(headers)).splitlines()
    out, at = lines[:2], 2  # the header and the rule
    pad = " " * STACK_INDENT
    for row, under in zip(cells, below, strict=True):
        height = max(len(cell.splitlines()) for cell in row)
        out.extend(lines[at : at + height])
        at += height
        out.extend(pad + line for line in under)
    return "\n".join(out)


def _tabulate(texts: list[list[str]], headers: Sequence[str], limits: Sequence[int | None]) -> str:
    import tabulate as tabulate_module

    tabulate_module.MIN_PADDING = 0  # column width = widest cell; the 2-space gap stays
    cells = [[wrap(cell, limit) for cell, limit in zip(row, limits, strict=True)] for row in texts]
    return str(
        tabulate_module.tabulate(
            cells,
            headers=list(headers),
            tablefmt="simple",
            disable_numparse=True,
        )
    )


def paint_column(text: str, column: int, paint: Callable[[str], str]) -> str:
    """``text`` (a :func:`table`) with the words of one column passed through ``paint``.

    The column's span is read from the dashed rule under the headers; only the body
    rows are painted, and ``paint`` may add invisible escapes only.
    """
    lines = text.splitlines()
    if len(lines) < 2:
        return text
    spans = [m.span() for m in re.finditer(r"-+", lines[1])]
    if column >= len(spans):
        return text
    start, end = spans[column]
    out = lines[:2]
    for line in lines[2:]:
        cell = line[start:end]
        word = cell.strip()
        if word:
            lead = cell[: len(cell) - len(cell.lstrip())]
            cell = lead + paint(word) + cell[len(lead) + len(word) :]
        out.append(line[:start] + cell + line[end:])
    return "\n".join(out)


def heading(title: str, note: str = "", width: int = WIDTH) -> str:
    """A section title, underlined, with an optional note after it (wrapped to ``width``)."""
    text = fill(f"{title}  ({note})" if note else title, width, indent=2)
    return f"{text}\n{'=' * min(max(len(line) for line in text.splitlines()), width)}"


def value_text(value: Any) -> str:
    """A context or settings value as people write it (lists comma-joined, None as null)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(str(v) for v in value) + "]"
    return str(value)
