"""Where the built-in configuration lives (``configs/`` in the repository and the wheel)."""

from __future__ import annotations

from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent.parent
#: ``moe_policy/_configs`` links to the repository's ``configs/``; wheels carry a copy.
CONFIG_DIR = PACKAGE_DIR / "_configs"
DEFAULT_POLICY = CONFIG_DIR / "default.yaml"
BACKENDS_CATALOG = CONFIG_DIR / "backends.yaml"
#: Bundled model configs (``<name>.json``) and policy profiles (``<name>.yaml``).
MODELS_DIR = CONFIG_DIR / "models"
PROFILES_DIR = CONFIG_DIR / "profiles"
#: How built-in files are named in origins and records (stable across installs).
DEFAULT_POLICY_NAME = "configs/default.yaml"
BACKENDS_CATALOG_NAME = "configs/backends.yaml"


def display_name(path: Path) -> str:
    """``configs/...`` for a built-in file, whatever the install location."""
    return "configs/" + path.relative_to(CONFIG_DIR).as_posix()


def shown_path(path: str | Path) -> str:
    """How a file is named in origins: ``configs/...`` for a bundled file (a ``--profile``,
    a bundled model's name), else as given."""
    candidate = Path(path)
    if candidate.is_absolute() and candidate.is_relative_to(CONFIG_DIR):
        return display_name(candidate)
    return str(path)


def bundled(folder: Path, suffix: str) -> dict[str, Path]:
    """The bundled files of ``folder`` by name (file name without ``suffix``), sorted."""
    found = {p.name.removesuffix(suffix): p for p in folder.glob(f"*{suffix}")}
    return {name: found[name] for name in sorted(found)}  # by name: a-b after a
