"""Typed parsing of single values: booleans, integers and compute capabilities.

Every source reads its values through these functions, so no value is ever read by
Python truthiness or by ``int()``/``float()``:

* typed values (YAML and JSON documents, ``--set``, API keywords) must already have the
  type: a boolean is ``true``/``false`` (the string ``"false"`` is refused, never true),
  an integer is an integer (``true`` is not 1, ``2.0`` is not 2);
* text (environment variables, CLI flags) is parsed exactly: ``true``/``false``/``1``/``0``
  for a boolean, ASCII decimal digits for an integer (``２``, ``1_000``, `` 4`` are refused);
* a compute capability is ``MAJOR.MINOR`` exactly (major 0-99, minor 0-9): ``9.0``,
  ``10.3``; ``9.0000001`` or ``99999.99999`` are refused, never rounded.

Each function raises ``ValueError`` with a message saying what was expected; the caller
adds the origin (``file:PATH:LINE:COL``, ``env:NAME``, ``cli:--flag``).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

#: Integers longer than this are refused before any conversion (no 4,300-digit parsing).
MAX_INT_DIGITS = 18
_INT_TEXT = re.compile(rf"[+-]?[0-9]{{1,{MAX_INT_DIGITS}}}", re.ASCII)
_CAPABILITY_TEXT = re.compile(r"(0|[1-9][0-9]?)\.([0-9])", re.ASCII)
_TRUE_TEXT = ("true", "1")
_FALSE_TEXT = ("false", "0")
CAPABILITY_MAJOR_MAX = 99
CAPABILITY_MINOR_MAX = 9


def shown(value: Any) -> str:
    """A value as an error message shows it: its repr, with the type when that is the point."""
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    if isinstance(value, str):
        return f"{text} (a string)"
    if isinstance(value, (list, tuple, dict)):
        return f"{text} (a {type(value).__name__})"
    return text


def parse_bool(value: Any) -> bool:
    """A typed boolean: ``True`` or ``False`` only.

    >>> parse_bool(False)
    False
    >>> parse_bool("false")
    Traceback (most recent call last):
    ...
    ValueError: expected a boolean (true or false, unquoted), got 'false' (a string)
    """
    if isinstance(value, bool):
        return value
    raise ValueError(f"expected a boolean (true or false, unquoted), got {shown(value)}")


def parse_str(value: Any) -> str:
    """A typed string: not a number, a list or a mapping read through ``str()``."""
    if isinstance(value, str):
        return value
    raise ValueError(f"expected a string, got {shown(value)}")


def bool_from_text(text: str) -> bool:
    """A boolean written as text: ``true``/``false``/``1``/``0`` (any case), nothing else.

    >>> bool_from_text("0")
    False
    """
    word = text.strip().lower() if isinstance(text, str) else None
    if word in _TRUE_TEXT:
        return True
    if word in _FALSE_TEXT:
        return False
    raise ValueError(f"expected true, false, 1 or 0, got {text!r}")


def is_decimal(text: str) -> bool:
    """``text`` is ASCII decimal digits only (``str.isdigit`` also takes ``²`` and ``٣``,
    which ``int()`` then refuses or reads as another number).

    >>> is_decimal("12"), is_decimal("１２"), is_decimal("²")
    (True, False, False)
    """
    return text.isascii() and text.isdigit()


def _in_range(number: int, minimum: int | None, maximum: int | None) -> int:
    if minimum is not None and number < minimum:
        raise ValueError(f"must be at least {minimum}, got {number}")
    if maximum is not None and number > maximum:
        raise ValueError(f"must be at most {maximum}, got {number}")
    return number


def parse_int(value: Any, *, minimum: int | None = None, maximum: int | None = None) -> int:
    """A typed integer (not a boolean, not a float, at most ``MAX_INT_DIGITS`` digits).

    >>> parse_int(4, minimum=1)
    4
    >>> parse_int(True)
    Traceback (most recent call last):
    ...
    ValueError: expected an integer, got True
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"expected an integer, got {shown(value)}")
    if abs(value) >= 10**MAX_INT_DIGITS:
        raise ValueError(f"integer out of range (more than {MAX_INT_DIGITS} digits)")
    return _in_range(value, minimum, maximum)


def int_from_text(text: str, *, minimum: int | None = None, maximum: int | None = None) -> int:
    """An integer written as ASCII decimal digits with an optional sign, nothing else.

    >>> int_from_text("12")
    12
    >>> int_from_text("1_000")
    Traceback (most recent call last):
    ...
    ValueError: expected an integer in ASCII decimal digits, got '1_000'
    """
    if not isinstance(text, str) or not _INT_TEXT.fullmatch(text):
        if isinstance(text, str) and re.fullmatch(r"[+-]?[0-9]+", text, re.ASCII):
            raise ValueError(f"integer out of range (more than {MAX_INT_DIGITS} digits)")
        raise ValueError(f"expected an integer in ASCII decimal digits, got {text!r}")
    return _in_range(int(text), minimum, maximum)


def _capability_parts(major: int, minor: int, value: Any) -> str:
    if not (0 <= major <= CAPABILITY_MAJOR_MAX and 0 <= minor <= CAPABILITY_MINOR_MAX):
        raise ValueError(_capability_error(value))
    return f"{major}.{minor}"


def _capability_error(value: Any) -> str:
    return (
        f"not a compute capability: {value!r} (expected MAJOR.MINOR, e.g. 9.0 or 10.3; "
        f"major 0-{CAPABILITY_MAJOR_MAX}, minor 0-{CAPABILITY_MINOR_MAX})"
    )


def capability_from_text(text: str) -> str:
    """``"9.0"`` -> ``"9.0"``: ``MAJOR.MINOR`` exactly, ASCII digits, no leading zeros.

    >>> capability_from_text("10.3")
    '10.3'
    """
    match = _CAPABILITY_TEXT.fullmatch(text) if isinstance(text, str) else None
    if match is None:
        raise ValueError(_capability_error(text))
    return _capability_parts(int(match[1]), int(match[2]), text)


def parse_capability(value: Any) -> str:
    """A typed compute capability, normalised to ``"MAJOR.MINOR"``.

    A string as in :func:`capability_from_text`; a YAML float whose written form is
    ``MAJOR.MINOR`` (``9.0``); or a ``(major, minor)`` pair of integers (a device probe).
    """
    if isinstance(value, str):
        return capability_from_text(value)
    if isinstance(value, float):
        return capability_from_text(repr(value))
    if isinstance(value, (tuple, list)) and len(value) == 2:
        major, minor = value
        if all(isinstance(v, int) and not isinstance(v, bool) for v in (major, minor)):
            return _capability_parts(major, minor, value)
    raise ValueError(_capability_error(value))


def names_from_text(text: str) -> list[str]:
    """A list of names written ``[a, b]`` (``[]`` is empty); each name non-empty.

    >>> names_from_text("[triton, torch]")
    ['triton', 'torch']
    """
    body = text.strip()
    if not (body.startswith("[") and body.endswith("]")):
        raise ValueError(f"expected a list written [a, b], got {text!r}")
    inner = body[1:-1].strip()
    if not inner:
        return []
    names = [_unquoted(part.strip()) for part in inner.split(",")]
    if not all(names) or any(c in name for name in names for c in "[]{}"):
        raise ValueError(f"expected a list of names written [a, b], got {text!r}")
    return names


def _unquoted(text: str) -> str:
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        return text[1:-1]
    return text


#: Parsers of text by kind of value (the ``type`` of a context key or setting).
TEXT_PARSERS: dict[str, Callable[[str], Any]] = {
    "int": int_from_text,
    "bool": bool_from_text,
    "capability": capability_from_text,
    "list": names_from_text,
}


def from_text(kind: str, text: str) -> Any:
    """A value of ``kind`` (int, bool, capability, list, or anything else: a string) written
    as text; ``null`` is no value. Quotes around a string are dropped (``"a b"``)."""
    stripped = text.strip()
    if stripped == "null":
        return None
    parse = TEXT_PARSERS.get(kind)
    return parse(stripped) if parse is not None else _unquoted(stripped)
