"""User policy files, in the order given (later files win)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from functools import partial
from typing import TYPE_CHECKING

from moe_policy.core import paths
from moe_policy.core.canonical import sha256_hex
from moe_policy.core.origin import Origin
from moe_policy.core.problems import ProblemSink
from moe_policy.core.rules import Rule
from moe_policy.core.textfile import check_regular
from moe_policy.core.yamlio import load_yaml_file, memoized_parse
from moe_policy.errors import PolicyError
from moe_policy.settings.base import Entry, FileInfo, Source, SourceOutput
from moe_policy.settings.interpolation import ALLOWED_VARIABLES, environment_used
from moe_policy.settings.schema import parse_policy_document

if TYPE_CHECKING:
    from moe_policy.core.catalog import Catalog


class PolicyFilesSource(Source):
    """Reads each policy file; a missing file is an error naming where it was listed.

    ``environ`` is where ``audit.path`` interpolates from (``settings.interpolation``);
    None reads ``os.environ``. Only the variables a policy may name are kept.
    """

    layer = "policy file"

    def __init__(
        self, files: Sequence[tuple[str, Origin]], environ: Mapping[str, str] | None = None
    ) -> None:
        self.files = tuple(files)
        source = os.environ if environ is None else environ
        self.environ: Mapping[str, str] = {
            name: source[name] for name in ALLOWED_VARIABLES if name in source
        }

    def __repr__(self) -> str:
        return f"PolicyFilesSource({[path for path, _ in self.files]!r})"

    def load(self, catalog: Catalog) -> SourceOutput:
        out = SourceOutput(self.layer)
        tag = ("policy file", id(catalog), environment_used(self.environ))
        for path, listed_at in self.files:
            try:
                check_regular(path)
            except PolicyError as exc:
                if exc.code != "file-not-found":
                    raise
                raise PolicyError(
                    f"policy file {path!r} not found", listed_at, code="file-not-found"
                ) from None
            settings, rules, info = memoized_parse(path, tag, partial(self._parse, path, catalog))
            out.settings.extend(settings)
            out.rules.extend(rules)
            out.files.append(info)
        return out

    def _parse(self, path: str, catalog: Catalog) -> tuple[list[Entry], list[Rule], FileInfo]:
        shown = paths.shown_path(path)
        loaded = load_yaml_file(path, display_path=shown)
        sink = ProblemSink(strict=True)
        settings, rules = parse_policy_document(loaded, catalog, sink, environ=self.environ)
        return settings, rules, FileInfo(shown, self.layer, True, sha256_hex(loaded.text))
