"""The built-in policy, ``configs/default.yaml``: the lowest layer."""

from __future__ import annotations

from typing import TYPE_CHECKING

from moe_policy.core.canonical import sha256_hex
from moe_policy.core.engines import MOE_POLICY, EngineProfile
from moe_policy.core.problems import ProblemSink
from moe_policy.core.rules import Rule
from moe_policy.core.yamlio import load_yaml_file, memoized_parse
from moe_policy.settings.base import Entry, FileInfo, Source, SourceOutput
from moe_policy.settings.schema import parse_policy_document

if TYPE_CHECKING:
    from moe_policy.core.catalog import Catalog


class BuiltinSource(Source):
    """Reads the packaged default policy of an engine (``configs/default.yaml`` for this
    package's own layer)."""

    layer = "built-in"

    def __init__(self, engine: EngineProfile = MOE_POLICY) -> None:
        self.engine = engine

    def __repr__(self) -> str:
        return f"BuiltinSource({self.engine.policy_name!r})"

    def load(self, catalog: Catalog) -> SourceOutput:
        name = self.engine.policy_name

        def parse() -> tuple[list[Entry], list[Rule], FileInfo]:
            loaded = load_yaml_file(self.engine.policy_path, display_path=name)
            settings, rules = parse_policy_document(loaded, catalog, ProblemSink(strict=True))
            return settings, rules, FileInfo(name, self.layer, True, sha256_hex(loaded.text))

        settings, rules, info = memoized_parse(
            self.engine.policy_path, ("builtin", name, id(catalog)), parse
        )
        return SourceOutput(self.layer, settings=list(settings), rules=list(rules), files=[info])
