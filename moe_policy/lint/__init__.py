"""Policy lint: the loader's own structural checks plus semantic ones (shadowed, conflicting rules)."""

from moe_policy.lint.checks import Finding, lint_document, lint_file, lint_paths

__all__ = ["Finding", "lint_document", "lint_file", "lint_paths"]
