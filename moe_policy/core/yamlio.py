"""YAML (and JSON) loading with line:column marks for every key and value.

Files are read by ``read_text``: regular files only, at most ``MAX_FILE_BYTES``, UTF-8.
The text is composed into PyYAML nodes under ``yamlbounds.LIMITS`` (aliases, nodes and
depth counted before anything expands them), the nodes give every key and value its
mark when asked (``yamlmarks``), and the safe constructor builds plain data from the
same nodes. Nothing is
interpolated here.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Hashable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar, cast

from moe_policy.core.origin import Origin
from moe_policy.core.textfile import read_text
from moe_policy.core.values import shown
from moe_policy.errors import PolicyError

#: A key path inside a document: ("rules", 0, "effect").
KeyPath = tuple[Any, ...]


@dataclass(frozen=True)
class LoadedYaml:
    """A document's plain data plus a mark for every key path (value position)."""

    path: str
    data: Any
    marks: Mapping[KeyPath, tuple[int, int]]
    key_marks: Mapping[KeyPath, tuple[int, int]]
    text: str
    #: Set for documents that did not come from a file (an API mapping): every origin.
    fixed_origin: Origin | None = None

    def origin(self, keypath: KeyPath = (), *, at_key: bool = False) -> Origin:
        """``file:PATH:LINE:COL`` of a value (or of its key), falling back to the parent."""
        if self.fixed_origin is not None:
            return self.fixed_origin
        table = self.key_marks if at_key else self.marks
        probe = tuple(keypath)
        while probe:
            if probe in table:
                line, col = table[probe]
                return Origin.file(self.path, line, col)
            if probe in self.marks:
                line, col = self.marks[probe]
                return Origin.file(self.path, line, col)
            probe = probe[:-1]
        return Origin.file(self.path, 1, 1)

    def written(self, keypath: KeyPath) -> str | None:
        """The text of the scalar at ``keypath`` as the file writes it (``on`` where the
        data has ``True``); None for a document that did not come from a file."""
        scalar_text = getattr(self.marks, "scalar_text", None)
        return scalar_text(tuple(keypath)) if scalar_text is not None else None

    def shown(self, keypath: KeyPath, value: Any) -> str:
        """``value`` (found at ``keypath``) as an error message shows it: ``describe``."""
        return describe(value, self.written(keypath))


def describe(value: Any, written: str | None = None) -> str:
    """A document's value as an error message shows it: ``NaN`` (not a number) and
    ``Infinity`` as such, a boolean as the file wrote it (YAML reads ``on``, ``yes`` as
    true), anything else as ``values.shown`` does.

    >>> describe(float("nan")), describe(True, "on")
    ('NaN (not a number)', 'on (YAML reads it as the boolean true)')
    """
    if isinstance(value, float) and math.isnan(value):
        return "NaN (not a number)"
    if isinstance(value, float) and math.isinf(value):
        return f"{'-' if value < 0 else ''}Infinity (not a finite number)"
    if isinstance(value, bool):
        word = "true" if value else "false"
        if written is not None and written != word:
            return f"{written} (YAML reads it as the boolean {word})"
        return f"{word} (a boolean)"
    return shown(value)


def document_kind(display_path: str) -> str:
    """``JSON`` for a ``.json`` file, else ``YAML`` (what a parse error calls the file)."""
    return "JSON" if Path(display_path).suffix.lower() == ".json" else "YAML"


#: What Python's ``json`` writes (and reads back) for a float that is not finite; YAML
#: reads these words as strings.
_JSON_NON_FINITE = frozenset(("NaN", "Infinity", "-Infinity"))


def _json_non_finite_as_floats(root: Any) -> None:
    """In a JSON document, a bare ``NaN``/``Infinity``/``-Infinity`` value is the float
    ``json.loads`` makes of it, not a string, so that a message can say it is not a number."""
    from yaml.nodes import MappingNode, ScalarNode, SequenceNode

    seen: set[int] = set()
    stack = [root]
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, MappingNode):
            stack.extend(value for _key, value in node.value)
        elif isinstance(node, SequenceNode):
            stack.extend(node.value)
        elif (
            isinstance(node, ScalarNode)
            and not node.style  # plain: None from PyYAML, '' from libyaml
            and node.value in _JSON_NON_FINITE
            and node.tag == "tag:yaml.org,2002:str"
        ):
            node.tag = "tag:yaml.org,2002:float"


def _line_col(text: str, index: int) -> tuple[int, int]:
    """1-based line and column of character ``index`` of ``text``."""
    line_start = text.rfind("\n", 0, index) + 1
    return text.count("\n", 0, index) + 1, index - line_start + 1


def _reader_error(exc: Any, text: str, display_path: str) -> PolicyError:
    """A ReaderError (a control character, say) at file:line:col; libyaml counts the
    position in UTF-8 bytes, PyYAML's reader in characters."""
    position = int(exc.position)
    if exc.encoding != "unicode":  # libyaml: a byte offset into the UTF-8 text
        position = len(text.encode("utf-8")[:position].decode("utf-8", errors="ignore"))
    line, col = _line_col(text, min(position, len(text)))
    char = exc.character
    char_shown = f"U+{char:04X}" if isinstance(char, int) else repr(char)
    return PolicyError(
        f"malformed {document_kind(display_path)}: character {char_shown} is not allowed "
        f"({exc.reason})",
        Origin.file(display_path, line, col),
        code="malformed-yaml",
    )


def parse_yaml_text(text: str, display_path: str) -> LoadedYaml:
    """Parse ``text`` (YAML or JSON) under ``yamlbounds.LIMITS``; malformed or oversized
    input -> PolicyError at file:line:col. Values stay as written: nothing is interpolated
    (``settings.interpolation`` expands the one place a policy may name the environment)."""
    import yaml

    from moe_policy.core.yamlbounds import compose_bounded, construct
    from moe_policy.core.yamlmarks import NodeMarks

    kind = document_kind(display_path)
    try:
        root = compose_bounded(text, display_path)
        if root is not None and kind == "JSON" and ("NaN" in text or "Infinity" in text):
            _json_non_finite_as_floats(root)
        data = None if root is None else construct(root, display_path)
    except yaml.reader.ReaderError as exc:
        raise _reader_error(exc, text, display_path) from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        origin = (
            Origin.file(display_path, mark.line + 1, mark.column + 1)
            if mark is not None
            else Origin.file(display_path)
        )
        problem = exc.problem or exc.context or "cannot parse"
        if exc.problem and exc.context:
            problem = f"{exc.problem} ({exc.context})"
        raise PolicyError(f"malformed {kind}: {problem}", origin, code="malformed-yaml") from None
    except yaml.YAMLError as exc:
        raise PolicyError(
            f"malformed {kind}: {exc}", Origin.file(display_path), code="malformed-yaml"
        ) from None
    if root is None:
        return LoadedYaml(display_path, data, {}, {}, text)
    marks, key_marks = NodeMarks(root), NodeMarks(root, at_key=True)
    return LoadedYaml(display_path, data, marks, key_marks, text)


#: While ``memoized()`` is active: (path, tag, mtime, size) -> what was parsed from the file.
_MEMO: dict[tuple[Any, ...], Any] | None = None

T = TypeVar("T")


@contextmanager
def memoized() -> Iterator[None]:
    """Within the block, ``memoized_parse`` parses a file that has not changed once
    (``moe-policy plan`` builds hundreds of Selectors over the same policy files)."""
    global _MEMO
    outer = _MEMO
    if outer is None:
        _MEMO = {}
    try:
        yield
    finally:
        _MEMO = outer


def memoized_parse(path: str | Path, tag: Hashable, build: Callable[[], T]) -> T:
    """``build()`` (which parses ``path``); inside ``memoized()``, once per unchanged file
    and ``tag``. What ``build`` returns is shared: it must not be modified."""
    memo = _MEMO
    if memo is None:
        return build()
    try:
        stat = os.stat(path)
    except OSError:
        return build()
    key = (os.fspath(path), tag, stat.st_mtime_ns, stat.st_size)
    if key not in memo:
        memo[key] = build()
    return cast(T, memo[key])


def load_yaml_file(path: str | Path, *, display_path: str | None = None) -> LoadedYaml:
    """Read (``read_text``) and parse a file; every failure is a PolicyError naming it."""
    display = display_path or str(path)
    return parse_yaml_text(read_text(path, display), display)
