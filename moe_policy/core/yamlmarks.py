"""Line:column of any key path of a composed YAML document, looked up in its nodes.

A table of every key path of a document costs a tuple per node (up to 64 long), so
hundreds of megabytes for a document near ``yamlbounds.LIMITS``; the marks are found
instead by walking the composed nodes along the path when asked (aliases followed, as
the data has them). Mapping keys are matched by their text, as written.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

#: Mappings with more entries than this get a key index on first lookup.
_INDEXED = 8


class NodeMarks(Mapping[tuple[Any, ...], tuple[int, int]]):
    """``{keypath: (line, col)}`` of each value, or with ``at_key`` of each mapping key."""

    def __init__(self, root: Node, *, at_key: bool = False) -> None:
        self.root = root
        self.at_key = at_key
        self._index: dict[int, dict[Any, tuple[Node, Node]]] = {}

    def _entry(self, node: MappingNode, part: Any) -> tuple[Node, Node] | None:
        if len(node.value) <= _INDEXED:
            return next(((k, v) for k, v in node.value if k.value == part), None)
        index = self._index.get(id(node))
        if index is None:
            index = self._index[id(node)] = {}
            for key_node, value_node in node.value:
                index.setdefault(key_node.value, (key_node, value_node))
        return index.get(part)

    def _find(self, keypath: tuple[Any, ...]) -> Node | None:
        node: Node = self.root
        key_node: Node | None = None
        for part in keypath:
            if isinstance(node, MappingNode):
                entry = self._entry(node, part)
                if entry is None:
                    return None
                key_node, node = entry
            elif isinstance(node, SequenceNode):
                if type(part) is not int or not 0 <= part < len(node.value):
                    return None
                key_node, node = None, node.value[part]
            else:
                return None
        return key_node if self.at_key else node

    def scalar_text(self, keypath: tuple[Any, ...]) -> str | None:
        """The text of the scalar at ``keypath`` as written (``on`` for a value YAML reads
        as ``True``), or None when there is no scalar there."""
        node = self._find(tuple(keypath)) if isinstance(keypath, tuple) else None
        return node.value if isinstance(node, ScalarNode) else None

    def __getitem__(self, keypath: tuple[Any, ...]) -> tuple[int, int]:
        node = self._find(tuple(keypath)) if isinstance(keypath, tuple) else None
        if node is None:
            raise KeyError(keypath)
        return node.start_mark.line + 1, node.start_mark.column + 1

    def _paths(self, node: Node, path: tuple[Any, ...], keyed: bool) -> Iterator[tuple[Any, ...]]:
        """Every path below ``node``; ``keyed``: ``path`` ends in a mapping key."""
        if keyed or not self.at_key:
            yield path
        if isinstance(node, MappingNode):
            for key_node, value_node in node.value:
                yield from self._paths(value_node, (*path, key_node.value), True)
        elif isinstance(node, SequenceNode):
            for index, item in enumerate(node.value):
                yield from self._paths(item, (*path, index), False)

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        return self._paths(self.root, (), False)

    def __len__(self) -> int:
        return sum(1 for _ in self)
