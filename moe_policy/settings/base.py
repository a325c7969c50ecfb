"""The settings-source contract: each source yields entries with their origins."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from moe_policy.core.decision import Notice
from moe_policy.core.origin import Origin
from moe_policy.core.rules import Rule

if TYPE_CHECKING:
    from moe_policy.core.catalog import Catalog


@dataclass(frozen=True)
class Entry:
    """One value for a settings key (``mode``) or a context key (``parallel.tp``)."""

    key: str
    value: Any
    origin: Origin


@dataclass(frozen=True)
class FileInfo:
    """A policy file that was looked for: found or missing, and its content hash."""

    path: str
    layer: str
    found: bool
    sha256: str | None = None


@dataclass
class SourceOutput:
    """What one source contributes: settings, context facts, rules, notices, files, and the
    packages an engine switch takes out (``Entry("packages", name, origin)``)."""

    layer: str
    settings: list[Entry] = field(default_factory=list)
    context: list[Entry] = field(default_factory=list)
    rules: list[Rule] = field(default_factory=list)
    notices: list[Notice] = field(default_factory=list)
    files: list[FileInfo] = field(default_factory=list)
    switched_off: list[Entry] = field(default_factory=list)


class Source(ABC):
    """A settings layer. Later sources in ``SOURCES`` win over earlier ones."""

    layer: ClassVar[str]

    @abstractmethod
    def load(self, catalog: Catalog) -> SourceOutput:
        """Read this layer (files, env snapshot, arguments) into entries."""
