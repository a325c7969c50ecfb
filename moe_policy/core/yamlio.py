"""YAML (and JSON) loading with line:column marks for every key and value.

Values are loaded through OmegaConf (so interpolations such as ``${oc.env:VAR}`` work
and lists replace rather than concatenate on merge); OmegaConf keeps no source
positions, so the same text is also composed into PyYAML nodes to read the marks.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar, cast

from moe_policy.core.origin import Origin
from moe_policy.errors import PolicyError

#: A key path inside a document: ("rules", 0, "effect").
KeyPath = tuple[Any, ...]


@dataclass(frozen=True)
class LoadedYaml:
    """A document's plain data plus a mark for every key path (value position)."""

    path: str
    data: Any
    marks: dict[KeyPath, tuple[int, int]]
    key_marks: dict[KeyPath, tuple[int, int]]
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


def _yaml_module() -> Any:
    import yaml

    return yaml


def _safe_loader() -> Any:
    yaml = _yaml_module()
    return getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _walk_marks(
    node: Any,
    path: KeyPath,
    marks: dict[KeyPath, tuple[int, int]],
    key_marks: dict[KeyPath, tuple[int, int]],
) -> None:
    yaml = _yaml_module()
    marks[path] = (node.start_mark.line + 1, node.start_mark.column + 1)
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            key = key_node.value
            child = (*path, key)
            key_marks[child] = (key_node.start_mark.line + 1, key_node.start_mark.column + 1)
            _walk_marks(value_node, child, marks, key_marks)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            _walk_marks(item, (*path, index), marks, key_marks)


def _check_duplicate_keys(node: Any, loaded_path: str) -> None:
    yaml = _yaml_module()
    if isinstance(node, yaml.MappingNode):
        seen: dict[str, Any] = {}
        for key_node, value_node in node.value:
            if key_node.value in seen:
                first = seen[key_node.value]
                raise PolicyError(
                    f"duplicate key {key_node.value!r} (first defined at line "
                    f"{first.start_mark.line + 1})",
                    Origin.file(
                        loaded_path, key_node.start_mark.line + 1, key_node.start_mark.column + 1
                    ),
                    code="duplicate-key",
                )
            seen[key_node.value] = key_node
            _check_duplicate_keys(value_node, loaded_path)
    elif isinstance(node, yaml.SequenceNode):
        for item in node.value:
            _check_duplicate_keys(item, loaded_path)


def parse_yaml_text(text: str, display_path: str, *, use_omegaconf: bool = True) -> LoadedYaml:
    """Parse ``text`` (YAML or JSON); malformed input -> PolicyError at file:line:col."""
    yaml = _yaml_module()
    try:
        root = yaml.compose(text, Loader=_safe_loader())
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        origin = (
            Origin.file(display_path, mark.line + 1, mark.column + 1)
            if mark is not None
            else Origin.file(display_path)
        )
        problem = exc.problem or exc.context or "cannot parse"
        raise PolicyError(f"malformed YAML: {problem}", origin, code="malformed-yaml") from None
    except yaml.YAMLError as exc:
        raise PolicyError(
            f"malformed YAML: {exc}", Origin.file(display_path), code="malformed-yaml"
        ) from None
    marks: dict[KeyPath, tuple[int, int]] = {}
    key_marks: dict[KeyPath, tuple[int, int]] = {}
    if root is None:
        return LoadedYaml(display_path, None, marks, key_marks, text)
    _check_duplicate_keys(root, display_path)
    _walk_marks(root, (), marks, key_marks)
    if use_omegaconf and isinstance(root, (yaml.MappingNode, yaml.SequenceNode)):
        data = _load_with_omegaconf(text, display_path)
    else:
        data = yaml.load(text, Loader=_safe_loader())
    return LoadedYaml(display_path, data, marks, key_marks, text)


def _load_with_omegaconf(text: str, display_path: str) -> Any:
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    try:
        cfg = OmegaConf.create(text)
        return OmegaConf.to_container(cfg, resolve=True)
    except OmegaConfBaseException as exc:
        key = getattr(exc, "full_key", None)
        where = f" at {key}" if key else ""
        message = str(exc).splitlines()[0]
        raise PolicyError(
            f"cannot load policy{where}: {message}", Origin.file(display_path)
        ) from None


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


def load_yaml_file(
    path: str | Path, *, display_path: str | None = None, use_omegaconf: bool = True
) -> LoadedYaml:
    """Read and parse a file; a missing or unreadable file is a PolicyError naming it."""
    shown = display_path or str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise PolicyError("file not found", Origin.file(shown), code="file-not-found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise PolicyError(
            f"cannot read file: {exc}", Origin.file(shown), code="unreadable"
        ) from None
    return parse_yaml_text(text, shown, use_omegaconf=use_omegaconf)
