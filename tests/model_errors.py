"""Where a model config's error points: the one error loading a file, and the LINE:COL of a
key's value in the file's text."""

from __future__ import annotations

from pathlib import Path

import pytest

from moe_policy.core.model import load_model
from moe_policy.errors import PolicyError


def load_error(path: Path) -> tuple[str, str]:
    """(origin, message) of the one error loading ``path``."""
    with pytest.raises(PolicyError) as info:
        load_model(path)
    origin, _, message = str(info.value).partition(": ")
    return origin, message


def line_col(text: str, index: int) -> str:
    """``LINE:COL`` (1-based) of character ``index`` of ``text``."""
    return f"{text.count(chr(10), 0, index) + 1}:{index - text.rfind(chr(10), 0, index)}"


def value_at(text: str, needle: str) -> str:
    """``LINE:COL`` of the value in the one occurrence of ``needle`` (``"key": `` or
    ``"key": value``)."""
    assert text.count(needle) == 1, needle
    return line_col(text, text.index(needle) + needle.index(": ") + 2)
