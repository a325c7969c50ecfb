"""The package's layering, kept by a check: imports point down the layers, never into
another module's private names.

Layers, lowest first: ``core`` (the torch-free decision path) < ``settings`` <
``reporting`` < ``fleet`` / ``lint`` < the API (``api``, ``testing``, the package root)
< ``cli`` and ``integrations``; ``layer`` is the one bridge from decisions to
``experts`` (the kernels), which import nothing of the policy side (``cli.tune``, the
command that times the kernels, reaches them too). ``errors``,
``_version`` and ``schemas`` (the shipped JSON Schemas) are leaves every layer may use.
Imports under ``if TYPE_CHECKING:`` do not run and are not checked.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.bundled import REPO

PACKAGE = REPO / "moe_policy"
LEAVES = ("moe_policy.errors", "moe_policy._version", "moe_policy.schemas")
CORE = ("moe_policy.core", *LEAVES)
SETTINGS = (*CORE, "moe_policy.settings")
REPORTING = (*CORE, "moe_policy.reporting")
API_BELOW = (*SETTINGS, "moe_policy.reporting", "moe_policy.fleet", "moe_policy.lint")
API = (*API_BELOW, "moe_policy.api", "moe_policy.testing")

#: Module prefix -> the prefixes its imports may name (the longest matching prefix wins).
ALLOWED: dict[str, tuple[str, ...]] = {
    "moe_policy.errors": (),
    "moe_policy._version": (),
    "moe_policy.schemas": ("moe_policy.errors",),
    "moe_policy.core": CORE,
    "moe_policy.settings": SETTINGS,
    "moe_policy.reporting": REPORTING,
    "moe_policy.fleet": (*REPORTING, "moe_policy.fleet"),
    "moe_policy.lint": (*SETTINGS, "moe_policy.lint"),
    "moe_policy.distributed": ("moe_policy.fleet",),
    "moe_policy.api": (*SETTINGS, "moe_policy.reporting"),
    "moe_policy.testing": API,
    "moe_policy": API,  # the package root re-exports the API
    "moe_policy.__main__": (*API, "moe_policy.cli"),  # `python -m moe_policy`: the CLI
    "moe_policy.planning": (*API, "moe_policy.planning"),
    "moe_policy.cli": (*API, "moe_policy.planning", "moe_policy.cli"),
    # the tuner's command: the CLI's one way down to the kernels it times
    "moe_policy.cli.tune": (*API, "moe_policy.cli", "moe_policy.experts"),
    "moe_policy.layer": (*API, "moe_policy.experts"),
    "moe_policy.integrations": (
        *API,
        "moe_policy.layer",
        "moe_policy.experts",
        "moe_policy.integrations",
    ),
    "moe_policy.experts": ("moe_policy.experts", *LEAVES),
}


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _runtime_nodes(tree: ast.AST) -> Iterator[ast.AST]:
    """Every node that runs, skipping ``if TYPE_CHECKING:`` bodies."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                stack.extend(child.orelse)
                continue
            stack.append(child)


def imports(source: str, module: str) -> Iterator[tuple[int, str, tuple[str, ...]]]:
    """``(line, imported module, names)`` for each runtime import of a ``moe_policy`` module."""
    package = module if module.count(".") == 0 else module.rsplit(".", 1)[0]
    for node in _runtime_nodes(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "moe_policy":
                    yield node.lineno, alias.name, ()
        elif isinstance(node, ast.ImportFrom):
            target = node.module or ""
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join([*base, *filter(None, [node.module])])
            if target.split(".")[0] == "moe_policy":
                yield node.lineno, target, tuple(a.name for a in node.names)


def allowed_for(module: str) -> tuple[str, ...]:
    best = max((p for p in ALLOWED if module == p or module.startswith(p + ".")), key=len)
    return ALLOWED[best]


def _within(target: str, prefixes: tuple[str, ...]) -> bool:
    return any(target == p or target.startswith(p + ".") for p in prefixes)


def _targets(target: str, names: tuple[str, ...]) -> list[str]:
    """``from moe_policy import x`` names the submodule ``x`` or else the package root."""
    if target != "moe_policy" or not names:
        return [target]
    return [
        f"moe_policy.{n}" if (PACKAGE / n).is_dir() or (PACKAGE / f"{n}.py").exists() else target
        for n in names
    ]


def _is_module(dotted: str) -> bool:
    path = REPO.joinpath(*dotted.split("."))
    return path.is_dir() or path.with_suffix(".py").exists()


def private_attributes(source: str) -> list[tuple[int, str]]:
    """``module._name`` uses, where ``module`` is a ``moe_policy`` module imported here."""
    tree = ast.parse(source)
    modules: dict[str, str] = {}
    for node in _runtime_nodes(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("moe_policy.") and alias.asname:
                    modules[alias.asname] = alias.name
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("moe_policy"):
            for alias in node.names:
                if _is_module(f"{node.module}.{alias.name}"):
                    modules[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return [
        (node.lineno, f"{modules[node.value.id]}.{node.attr}")
        for node in _runtime_nodes(tree)
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id in modules
        and node.attr.startswith("_")
        and not node.attr.startswith("__")
    ]


def violations(source: str, module: str) -> list[str]:
    """Layer and private-name violations of one module's source."""
    found = []
    allowed = allowed_for(module)
    for line, target, names in imports(source, module):
        for t in _targets(target, names):
            if t != module and not _within(t, allowed):
                found.append(f"{module}:{line} imports {t} (a layer above it)")
        private = [n for n in names if n.startswith("_") and not n.startswith("__")]
        if private and target != module:
            found.append(f"{module}:{line} imports private {', '.join(private)} from {target}")
    found.extend(
        f"{module}:{line} uses private {name}" for line, name in private_attributes(source)
    )
    return found


def package_modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "_configs" not in p.parts)


def test_every_module_of_the_package_keeps_the_layers():
    problems = [
        v for path in package_modules() for v in violations(path.read_text(), module_name(path))
    ]
    assert problems == []


@pytest.mark.parametrize("folder", ["tests", "benchmarks", "tools"])
def test_no_module_imports_a_private_name_of_the_package(folder):
    problems = []
    for path in sorted((REPO / folder).rglob("*.py")):
        for line, target, names in imports(path.read_text(), "outside"):
            private = [n for n in names if n.startswith("_") and not n.startswith("__")]
            if private:
                problems.append(
                    f"{path.relative_to(REPO)}:{line}: {', '.join(private)} from {target}"
                )
    assert problems == []


def test_a_core_module_importing_the_cli_is_caught():
    source = "from moe_policy.cli.app import main\n"
    assert violations(source, "moe_policy.core.context") == [
        "moe_policy.core.context:1 imports moe_policy.cli.app (a layer above it)"
    ]


def test_lazy_imports_count_and_type_checking_imports_do_not():
    source = (
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from moe_policy.settings import Settings\n"
        "def f():\n"
        "    from moe_policy.reporting.events import REPORTER\n"
    )
    assert violations(source, "moe_policy.core.resolver") == [
        "moe_policy.core.resolver:5 imports moe_policy.reporting.events (a layer above it)"
    ]


def test_kernels_never_import_the_policy_side_and_private_names_are_caught():
    assert violations("from moe_policy.api import Selector\n", "moe_policy.experts.base") == [
        "moe_policy.experts.base:1 imports moe_policy.api (a layer above it)"
    ]
    assert violations(
        "from moe_policy.core.rules import _ordered\n", "moe_policy.core.catalog"
    ) == ["moe_policy.core.catalog:1 imports private _ordered from moe_policy.core.rules"]


def test_private_attributes_of_an_imported_module_are_caught():
    source = "from moe_policy.core import platform\nplatform._probe_packages()\n"
    assert violations(source, "moe_policy.api") == [
        "moe_policy.api:2 uses private moe_policy.core.platform._probe_packages"
    ]


def test_relative_imports_resolve_before_judging():
    assert violations("from ..cli import app\n", "moe_policy.core.context") == [
        "moe_policy.core.context:1 imports moe_policy.cli (a layer above it)"
    ]
