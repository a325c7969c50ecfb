"""The package as a user installs it: the wheel built from this tree goes into a fresh virtual
environment without torch, and the console script, ``python -m moe_policy``, the bundled
models and the types work from outside the checkout; the sdist builds the same wheel.

The base dependencies come from the package index pip is configured with (its cache when
warm); nothing else is installed into the fresh environment.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from tests.bundled import REPO

pytestmark = pytest.mark.slow

#: What a copy of the tree for building leaves out (environments, build output, caches).
NOT_SOURCE = shutil.ignore_patterns(
    ".git",
    ".venv*",
    "build",
    "dist",
    "*.egg-info",
    "__pycache__",
    ".*_cache",
    ".hypothesis",
    "out",
    ".whl",
)
BUILD = "import sys, setuptools.build_meta as b; print(getattr(b, sys.argv[1])(sys.argv[2]))"
QWEN_ON_H200 = ("--model", "qwen3-30b-a3b", "--platform", "cuda", "--capability", "9.0", "--lora")


def clean_env(**extra: str) -> dict[str, str]:
    """The environment without anything that would point Python at the checkout."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")
        and not k.startswith(("MOE_POLICY_", "VLLM_"))
    }
    env.update(extra)
    return env


def run(*argv: str | Path, cwd: Path, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(a) for a in argv],
        cwd=cwd,
        env=clean_env(**extra),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def build(hook: str, source: Path, out: Path) -> Path:
    """Run a PEP 517 hook of setuptools (this interpreter's) in ``source``."""
    out.mkdir(parents=True, exist_ok=True)
    done = run(sys.executable, "-c", BUILD, hook, out, cwd=source)
    assert done.returncode == 0, done.stderr[-3000:]
    return out / done.stdout.strip().splitlines()[-1]


def contents(wheel: Path) -> dict[str, str]:
    """Every file of a wheel with its sha256, the RECORD (which lists the hashes) aside."""
    with zipfile.ZipFile(wheel) as archive:
        return {
            name: hashlib.sha256(archive.read(name)).hexdigest()
            for name in archive.namelist()
            if not name.endswith(".dist-info/RECORD")
        }


def prepare(root: Path) -> dict[str, Path]:
    """Copy the tree, build its sdist and wheel, install the wheel into a fresh environment
    (no pip of its own, no torch)."""
    source = root / "source"
    shutil.copytree(REPO, source, symlinks=True, ignore=NOT_SOURCE)
    sdist = build("build_sdist", source, root / "sdist")
    wheel = build("build_wheel", source, root / "wheel")
    env = root / "env"
    done = run(sys.executable, "-m", "venv", "--without-pip", env, cwd=root)
    assert done.returncode == 0, done.stderr
    done = run(
        sys.executable, "-m", "pip", "--python", env / "bin" / "python", "install", "-q", wheel,
        cwd=root,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return {"source": source, "sdist": sdist, "wheel": wheel, "env": env}


@pytest.fixture(scope="session")
def built(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> dict[str, Path]:
    """The tree's sdist and wheel and the environment holding the wheel, made once per
    session (pytest-xdist workers share them through a lock file)."""
    base = tmp_path_factory.getbasetemp()
    root = (base if worker_id == "master" else base.parent) / "packaging"
    with open(f"{root}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        made = root / "made.json"
        if not made.exists():
            shutil.rmtree(root, ignore_errors=True)
            root.mkdir()
            paths = prepare(root)
            made.write_text(json.dumps({k: str(v) for k, v in paths.items()}))
    return {k: Path(v) for k, v in json.loads(made.read_text()).items()}


@pytest.fixture
def venv(built: dict[str, Path]) -> Path:
    return built["env"]


@pytest.fixture(scope="module")
def outside(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A working directory that is not the checkout (no configs/, no moe_policy/)."""
    return tmp_path_factory.mktemp("elsewhere")


def test_the_wheel_carries_the_package_data(built: dict[str, Path]) -> None:
    names = set(contents(built["wheel"]))
    for needed in (
        "moe_policy/py.typed",
        "moe_policy/_configs/default.yaml",
        "moe_policy/_configs/backends.yaml",
        "moe_policy/_configs/models/qwen3-30b-a3b.json",
        "moe_policy/_configs/profiles/strict.yaml",
        "moe_policy/schemas/decision.v1.json",
        "moe_policy/schemas/audit.v1.json",
        "moe_policy/schemas/policy.v1.json",
        "moe_policy/schemas/matrix.v1.json",
    ):
        assert needed in names, needed
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    assert not any(n.startswith(("tests/", "benchmarks/", "configs/")) for n in names)
    shipped = {
        n.removeprefix("moe_policy/_configs/")
        for n in names
        if n.startswith("moe_policy/_configs/")
    }
    tracked = {
        p.relative_to(REPO / "configs").as_posix()
        for p in (REPO / "configs").rglob("*")
        if p.is_file()
    }
    assert shipped == tracked


def test_the_sdist_builds_the_same_wheel(built: dict[str, Path], tmp_path: Path) -> None:
    with tarfile.open(built["sdist"]) as archive:
        archive.extractall(tmp_path, filter="data")
    (unpacked,) = tmp_path.iterdir()
    again = build("build_wheel", unpacked, tmp_path / "wheel")
    assert again.name == built["wheel"].name
    assert contents(again) == contents(built["wheel"])


def test_the_fresh_environment_has_the_base_dependencies_only(venv: Path) -> None:
    listed = run(
        sys.executable, "-m", "pip", "--python", venv / "bin" / "python", "list", "--format=json",
        cwd=venv,
    )  # fmt: skip
    assert listed.returncode == 0, listed.stderr
    names = {p["name"].lower() for p in json.loads(listed.stdout)}
    assert {"moe-policy", "pyyaml", "structlog", "tabulate"} <= names
    assert not names & {"torch", "triton", "numpy", "pytest", "jsonschema", "omegaconf"}


def test_version_matches_the_metadata(venv: Path, outside: Path) -> None:
    python = venv / "bin" / "python"
    meta = run(
        python, "-c", "import importlib.metadata as m; print(m.version('moe-policy'))", cwd=outside
    )
    cli = run(python, "-m", "moe_policy", "--version", cwd=outside)
    assert meta.returncode == 0 and cli.returncode == 0, meta.stderr + cli.stderr
    assert cli.stdout.strip() == f"moe-policy {meta.stdout.strip()}"
    where = run(python, "-c", "import moe_policy; print(moe_policy.__file__)", cwd=outside)
    assert Path(where.stdout.strip()).is_relative_to(venv), where.stdout


def test_explain_a_bundled_model_from_outside_the_checkout(venv: Path, outside: Path) -> None:
    done = run(venv / "bin" / "moe-policy", "explain", *QWEN_ON_H200, "--json", cwd=outside)
    assert done.returncode == 0, done.stderr
    record = json.loads(done.stdout)
    assert record["backend"] == "triton"
    assert record["context"]["lora.enabled"]["value"] is True
    assert record["policy"]["files"][0]["path"] == "configs/default.yaml"
    human = run(venv / "bin" / "python", "-m", "moe_policy", "explain", *QWEN_ON_H200, cwd=outside)
    assert human.returncode == 0, human.stderr
    assert "triton" in human.stdout
    torch = run(venv / "bin" / "python", "-c", "import torch", cwd=outside)
    assert torch.returncode == 1 and "No module named 'torch'" in torch.stderr


def test_the_schemas_and_models_commands_work_installed(venv: Path, outside: Path) -> None:
    models = run(venv / "bin" / "moe-policy", "models", "--json", cwd=outside)
    assert models.returncode == 0, models.stderr
    assert "qwen3-30b-a3b" in {m["name"] for m in json.loads(models.stdout)}
    schema = run(venv / "bin" / "moe-policy", "schema", "audit", cwd=outside)
    assert schema.returncode == 0, schema.stderr
    assert "decision.v1.json" in json.loads(schema.stdout)["$defs"]


def test_mypy_sees_the_real_types(venv: Path, outside: Path) -> None:
    """py.typed is installed: a user's mypy reads the annotations (no Any, no missing stubs)."""
    user = outside / "serving.py"
    user.write_text(
        "import moe_policy\n"
        "decision = moe_policy.select_backend('config.json', platform='cuda')\n"
        "reveal_type(decision)\n"
        "reveal_type(moe_policy.schema('audit'))\n"
        "backend: int = decision.backend\n"
    )
    done = run(
        sys.executable, "-m", "mypy", "--strict", "--no-incremental",
        "--python-executable", venv / "bin" / "python", user.name,
        cwd=outside,
    )  # fmt: skip
    out = done.stdout
    assert 'Revealed type is "moe_policy.core.decision.Decision"' in out, out
    assert re.search(r'Revealed type is "(builtins\.)?dict\[(builtins\.)?str, Any\]"', out), out
    assert "serving.py:5: error: Incompatible types in assignment" in out, out
    assert "[import-untyped]" not in out and "[import-not-found]" not in out, out
    assert done.returncode == 1


def test_the_demo_runs_on_the_base_install(venv: Path) -> None:
    """What `make demo` shows needs nothing but the base package."""
    done = run(
        "bash", REPO / "scripts" / "demo.sh", cwd=REPO,
        MOE_POLICY_CLI=str(venv / "bin" / "moe-policy"), PYTHON=str(venv / "bin" / "python"),
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "Demo complete: every step exited as expected." in done.stdout
