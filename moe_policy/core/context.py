"""SelectionContext: the frozen facts a decision is made from, each with its origin.

The keys are those of ``moe_policy.core.keys.CONTEXT_KEYS``. Passes read only the context;
nothing in it is looked up lazily.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from moe_policy.core.decision import Request


@dataclass(frozen=True)
class SelectionContext:
    """Frozen facts (value + origin per key), the explicit request and the mode."""

    values: Mapping[str, Any]
    origins: Mapping[str, str]
    request: Request | None = None
    mode: str = "warn"

    def __getitem__(self, key: str) -> Any:
        return self.values[key]

    def get(self, key: str, default: Any = None) -> Any:
        return self.values.get(key, default)

    def __iter__(self) -> Iterator[str]:
        return iter(self.values)

    @property
    def format(self) -> str:
        return str(self.values.get("parallel.activation_format", "standard"))

    def items_with_origin(self) -> dict[str, tuple[Any, str]]:
        return {key: (self.values[key], self.origins.get(key, "default")) for key in self.values}
