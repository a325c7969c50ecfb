"""YAML composed under limits, checked before anything expands an alias.

PyYAML composes an alias (``*a``) into the anchored node itself, so a few hundred bytes
of nested aliases describe billions of nodes (a "billion laughs"), which any walk over
the document then expands. The composer here keeps, for every node it has composed,
the size and depth that node has once expanded, and refuses the alias that would take
the document past ``Limits`` at the alias's own line:col, before anything walks it. It
also refuses what the rest of the package cannot represent: recursive aliases,
non-scalar or duplicate mapping keys, tags beyond YAML's core schema, ``%TAG``
directives and integers longer than Python converts.

Events come from libyaml when PyYAML has it (the composer is PyYAML's own, with checks).
"""

from __future__ import annotations

import math
import re
import sys
from dataclasses import dataclass
from typing import Any, ClassVar

import yaml
from yaml.composer import Composer
from yaml.constructor import ConstructorError, SafeConstructor
from yaml.events import (
    AliasEvent,
    DocumentStartEvent,
    Event,
    MappingEndEvent,
    MappingStartEvent,
    SequenceEndEvent,
    SequenceStartEvent,
)
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode
from yaml.resolver import Resolver

from moe_policy.core.origin import Origin
from moe_policy.errors import PolicyError

#: Python refuses to convert longer decimal strings to int (CVE-2020-10735).
_INT_DIGITS = getattr(sys, "get_int_max_str_digits", lambda: 4300)() or 4300
_CORE = "tag:yaml.org,2002:"
#: Explicit tags a document may carry: the JSON/core schema's, nothing that constructs objects.
ALLOWED_TAGS = frozenset(
    _CORE + name for name in ("str", "int", "float", "bool", "null", "map", "seq")
)

_DROPPED = (_CORE + "timestamp", _CORE + "value", _CORE + "float")
#: YAML 1.1's floats plus JSON's exponent form without a dot (``1e-05``), as OmegaConf reads them.
_FLOAT = re.compile(
    r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
    |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
    |\.[0-9_]+(?:[eE][-+][0-9]+)?
    |[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+\.[0-9_]*
    |[-+]?\.(?:inf|Inf|INF)
    |\.(?:nan|NaN|NAN))$""",
    re.X,
)


@dataclass(frozen=True)
class Limits:
    """What one document may hold. A policy of ten thousand rules is about 190,000 nodes."""

    #: Nodes once every alias is expanded (what walking or copying the document visits).
    max_nodes: int = 250_000
    #: Nesting depth once expanded (policies nest about five deep).
    max_depth: int = 64
    #: Alias occurrences (``*name``).
    max_aliases: int = 1_000
    #: Digits of a decimal integer scalar.
    max_int_digits: int = _INT_DIGITS


LIMITS = Limits()


class _BoundedComposer(Composer):  # type: ignore[misc]
    """PyYAML's composer, counting expanded nodes and depth as it goes."""

    path: str
    limits: Limits

    def _bounds_init(self, path: str, limits: Limits) -> None:
        self.path = path
        self.limits = limits
        self._total = 0  # expanded nodes so far
        self._depth = 0
        self._aliases = 0
        self._open: set[int] = set()  # ids of anchored nodes still being composed
        self._expanded: dict[int, tuple[int, int]] = {}  # id(node) -> (size, depth)

    # -- errors -------------------------------------------------------------------------

    def _fail(self, message: str, mark: Any, code: str = "malformed-yaml") -> PolicyError:
        origin = Origin.file(self.path, mark.line + 1, mark.column + 1)
        return PolicyError(message, origin, code=code)

    def _too_large(self, what: str, mark: Any) -> PolicyError:
        return self._fail(f"YAML document too large: {what}", mark, code="too-large")

    # -- composer hooks -----------------------------------------------------------------

    def compose_document(self) -> Node | None:
        event = self.peek_event()
        if isinstance(event, DocumentStartEvent) and event.tags:
            raise self._fail("%TAG directives are not allowed", event.start_mark)
        node: Node | None = super().compose_document()
        return node

    def compose_node(self, parent: Node | None, index: Any) -> Node:
        event: Event = self.peek_event()
        if isinstance(event, AliasEvent):
            return self._alias(event, parent, index)
        tag = getattr(event, "tag", None)
        if tag not in (None, "!") and tag not in ALLOWED_TAGS:
            raise self._fail(
                f"tag {tag!r} is not allowed (only YAML's plain types: "
                "strings, numbers, booleans, null, lists, mappings)",
                event.start_mark,
            )
        self._depth += 1
        self._total += 1
        if self._depth > self.limits.max_depth:
            raise self._too_large(
                f"nested more than {self.limits.max_depth} levels deep", event.start_mark
            )
        if self._total > self.limits.max_nodes:
            raise self._too_large(f"more than {self.limits.max_nodes:,} nodes", event.start_mark)
        node: Node = super().compose_node(parent, index)
        self._depth -= 1
        self._done(node)
        return node

    def _alias(self, event: Any, parent: Node | None, index: Any) -> Node:
        target = self.anchors.get(event.anchor)
        if target is None:  # PyYAML's own "found undefined alias"
            undefined: Node = super().compose_node(parent, index)
            return undefined
        if id(target) in self._open:
            raise self._fail(
                f"recursive alias *{event.anchor}: it refers to a node that contains it",
                event.start_mark,
            )
        self._aliases += 1
        if self._aliases > self.limits.max_aliases:
            raise self._too_large(
                f"more than {self.limits.max_aliases:,} aliases", event.start_mark
            )
        size, depth = self._expanded[id(target)]
        self._total += size
        if self._total > self.limits.max_nodes:
            raise self._too_large(
                f"alias *{event.anchor} expands to {size:,} nodes, taking the document past "
                f"{self.limits.max_nodes:,}",
                event.start_mark,
            )
        if self._depth + depth > self.limits.max_depth:
            raise self._too_large(
                f"alias *{event.anchor} nests the document more than "
                f"{self.limits.max_depth} levels deep",
                event.start_mark,
            )
        self.get_event()
        return target

    def compose_scalar_node(self, anchor: str | None) -> ScalarNode:
        node: ScalarNode = super().compose_scalar_node(anchor)
        if node.tag == _CORE + "int":
            digits = sum(ch.isdigit() for ch in node.value)
            lowered = node.value.lower().lstrip("+-")
            if digits > self.limits.max_int_digits and not lowered.startswith(("0x", "0b")):
                raise self._too_large(
                    f"an integer of {digits:,} digits (at most {self.limits.max_int_digits:,})",
                    node.start_mark,
                )
        return node

    def compose_sequence_node(self, anchor: str | None) -> SequenceNode:
        start = self.get_event()
        tag = start.tag
        if tag is None or tag == "!":
            tag = self.resolve(SequenceNode, None, start.implicit)
        node = SequenceNode(tag, [], start.start_mark, None, flow_style=start.flow_style)
        if anchor is not None:
            self.anchors[anchor] = node
            self._open.add(id(node))
        index = 0
        while not self.check_event(SequenceEndEvent):
            node.value.append(self.compose_node(node, index))
            index += 1
        node.end_mark = self.get_event().end_mark
        self._open.discard(id(node))
        return node

    def compose_mapping_node(self, anchor: str | None) -> MappingNode:
        start = self.get_event()
        tag = start.tag
        if tag is None or tag == "!":
            tag = self.resolve(MappingNode, None, start.implicit)
        node = MappingNode(tag, [], start.start_mark, None, flow_style=start.flow_style)
        if anchor is not None:
            self.anchors[anchor] = node
            self._open.add(id(node))
        seen: dict[str, ScalarNode] = {}
        while not self.check_event(MappingEndEvent):
            key_event = self.peek_event()
            if isinstance(key_event, (MappingStartEvent, SequenceStartEvent)):
                raise self._fail(
                    "a mapping key must be a plain value, not a list or mapping",
                    key_event.start_mark,
                )
            key = self.compose_node(node, None)
            if not isinstance(key, ScalarNode):
                raise self._fail(
                    "a mapping key must be a plain value, not a list or mapping",
                    key_event.start_mark,
                )
            if key.value in seen and key.tag != "tag:yaml.org,2002:merge":
                raise self._fail(
                    f"duplicate key {key.value!r} (first defined at line "
                    f"{seen[key.value].start_mark.line + 1})",
                    key_event.start_mark,
                    code="duplicate-key",
                )
            seen[key.value] = key
            value = self.compose_node(node, key)
            node.value.append((key, value))
        node.end_mark = self.get_event().end_mark
        self._open.discard(id(node))
        return node

    def _done(self, node: Node) -> None:
        if isinstance(node, ScalarNode):
            self._expanded[id(node)] = (1, 1)
            return
        children: list[Node] = (
            [part for pair in node.value for part in pair]
            if isinstance(node, MappingNode)
            else list(node.value)
        )
        stats = [self._expanded[id(child)] for child in children]
        size = 1 + sum(s for s, _ in stats)
        depth = 1 + max((d for _, d in stats), default=0)
        self._expanded[id(node)] = (size, depth)


def _event_parser() -> tuple[Any, ...]:
    """libyaml's event parser when PyYAML has it (about 3x faster), else PyYAML's own."""
    if getattr(yaml, "__with_libyaml__", False):
        from yaml.cyaml import CParser

        return (CParser,)
    from yaml.parser import Parser
    from yaml.reader import Reader
    from yaml.scanner import Scanner

    return (Reader, Scanner, Parser)


_PARSER_BASES = _event_parser()


class _PlainResolver(Resolver):  # type: ignore[misc]
    """YAML 1.1's implicit types as OmegaConf reads them: no timestamps (a date stays a
    string), floats in JSON's exponent form too, and no ``=`` value tag (no safe
    constructor builds it)."""

    yaml_implicit_resolvers: ClassVar[dict[str, list[tuple[str, Any]]]] = {
        first: [(tag, regexp) for tag, regexp in resolvers if tag not in _DROPPED]
        for first, resolvers in Resolver.yaml_implicit_resolvers.items()
    }


_PlainResolver.add_implicit_resolver(_CORE + "float", _FLOAT, list("-+0123456789."))


class _BoundedLoader(_BoundedComposer, *_PARSER_BASES, _PlainResolver):  # type: ignore[misc]
    def __init__(self, text: str, path: str, limits: Limits) -> None:
        first, *rest = _PARSER_BASES
        first.__init__(self, text)
        for base in rest:
            base.__init__(self)
        Composer.__init__(self)
        _PlainResolver.__init__(self)
        self._bounds_init(path, limits)


def compose_bounded(text: str, path: str, limits: Limits = LIMITS) -> Node | None:
    """The document's root node (None when empty); a PolicyError at file:line:col for
    anything over ``limits`` or outside plain YAML, raised before an alias is expanded.
    Syntax errors are PyYAML's own ``YAMLError``."""
    loader = _BoundedLoader(text, path, limits)
    try:
        node: Node | None = loader.get_single_node()
        return node
    finally:
        loader.dispose()


class _PlainConstructor(SafeConstructor):  # type: ignore[misc]
    """The safe constructor, with an explicitly tagged scalar that is not of its type
    (``!!int abc``, ``!!bool maybe``) and an integer of more than ``max_int_digits``
    digits in any base (``0x`` + 5,000 ``f``, sexagesimal) a marked error, not a
    ValueError: a value that large cannot even be printed in an error message."""

    def __init__(self, path: str, limits: Limits) -> None:
        super().__init__()
        self.path = path
        # the most bits a number of max_int_digits decimal digits can need
        self.max_int_bits = math.floor(limits.max_int_digits / math.log10(2))

    def _typed(self, node: ScalarNode, kind: str, build: Any) -> Any:
        try:
            return build(self, node)
        except (ValueError, KeyError, TypeError, IndexError):
            raise ConstructorError(
                None, None, f"{node.value[:40]!r} is not {kind}", node.start_mark
            ) from None

    def construct_yaml_int(self, node: ScalarNode) -> int:
        value: int = self._typed(node, "an integer", SafeConstructor.construct_yaml_int)
        if value.bit_length() > self.max_int_bits:
            mark = node.start_mark
            raise PolicyError(
                f"YAML document too large: an integer of more than {_INT_DIGITS:,} digits",
                Origin.file(self.path, mark.line + 1, mark.column + 1),
                code="too-large",
            )
        return value

    def construct_yaml_float(self, node: ScalarNode) -> float:
        value: float = self._typed(node, "a number", SafeConstructor.construct_yaml_float)
        return value

    def construct_yaml_bool(self, node: ScalarNode) -> bool:
        value: bool = self._typed(node, "a boolean", SafeConstructor.construct_yaml_bool)
        return value


for _tag, _method in (
    ("int", _PlainConstructor.construct_yaml_int),
    ("float", _PlainConstructor.construct_yaml_float),
    ("bool", _PlainConstructor.construct_yaml_bool),
):
    _PlainConstructor.add_constructor(_CORE + _tag, _method)


def construct(node: Node, path: str, limits: Limits = LIMITS) -> Any:
    """Plain Python data of a node from ``compose_bounded`` (an alias stays one shared
    object); a value that is not of its explicit tag's type is PyYAML's marked error."""
    constructor = _PlainConstructor(path, limits)
    return constructor.construct_document(node)
