"""User policy files, in the order given (later files win)."""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from moe_policy.core.canonical import sha256_hex
from moe_policy.core.origin import Origin
from moe_policy.core.problems import ProblemSink
from moe_policy.core.rules import Rule
from moe_policy.core.yamlio import load_yaml_file, memoized_parse
from moe_policy.errors import PolicyError
from moe_policy.settings.base import Entry, FileInfo, Source, SourceOutput
from moe_policy.settings.schema import parse_policy_document

if TYPE_CHECKING:
    from moe_policy.core.catalog import Catalog


class PolicyFilesSource(Source):
    """Reads each policy file; a missing file is an error naming where it was listed."""

    layer = "policy file"

    def __init__(self, files: Sequence[tuple[str, Origin]]) -> None:
        self.files = tuple(files)

    def __repr__(self) -> str:
        return f"PolicyFilesSource({[path for path, _ in self.files]!r})"

    def load(self, catalog: Catalog) -> SourceOutput:
        out = SourceOutput(self.layer)
        for path, listed_at in self.files:
            if not Path(path).is_file():
                raise PolicyError(f"policy file {path!r} not found", listed_at)
            settings, rules, info = memoized_parse(
                path, ("policy file", id(catalog)), partial(self._parse, path, catalog)
            )
            out.settings.extend(settings)
            out.rules.extend(rules)
            out.files.append(info)
        return out

    def _parse(self, path: str, catalog: Catalog) -> tuple[list[Entry], list[Rule], FileInfo]:
        loaded = load_yaml_file(path)
        settings, rules = parse_policy_document(loaded, catalog, ProblemSink(strict=True))
        return settings, rules, FileInfo(path, self.layer, True, sha256_hex(loaded.text))
