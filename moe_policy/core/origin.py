"""Where a value came from: ``file:PATH:LINE:COL``, ``env:NAME``, ``cli:--flag``, ``api``, ``default``.

>>> str(Origin.file("policy.yaml", 3, 5))
'file:policy.yaml:3:5'
>>> str(Origin.env("MOE_POLICY_BACKEND"))
'env:MOE_POLICY_BACKEND'
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Origin:
    """One value's source. ``kind`` is file, env, cli, api, default, probe, derived, or an
    engine's name for a value read from that engine's own objects (``vllm:moe_config.num_experts``)."""

    kind: str
    locator: str = ""
    line: int | None = None
    col: int | None = None

    @classmethod
    def file(cls, path: str, line: int | None = None, col: int | None = None) -> Origin:
        return cls("file", path, line, col)

    @classmethod
    def env(cls, name: str) -> Origin:
        return cls("env", name)

    @classmethod
    def cli(cls, flag: str) -> Origin:
        return cls("cli", flag)

    @classmethod
    def api(cls, argument: str = "") -> Origin:
        return cls("api", argument)

    @classmethod
    def derived(cls, from_key: str) -> Origin:
        return cls("derived", from_key)

    @classmethod
    def engine(cls, engine: str, field: str) -> Origin:
        """A value the engine itself holds (its config objects, platform, env knobs)."""
        return cls(engine, field)

    def __str__(self) -> str:
        if self.kind == "file":
            text = f"file:{self.locator}"
            if self.line is not None:
                text += f":{self.line}"
                if self.col is not None:
                    text += f":{self.col}"
            return text
        if self.kind in ("api", "default", "probe") and not self.locator:
            return self.kind
        return f"{self.kind}:{self.locator}"
