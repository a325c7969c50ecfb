"""The deployment matrix: every deployment a policy change must be checked against.

A YAML file with a top-level ``deployments:`` list; each item names a model (a bundled
model name or a config.json path relative to the file), one or more platforms, and
optionally the parallel layout, LoRA, environment, engine and layer kinds. Lists
expand (models x platforms). Top-level keys starting with ``x-`` are ignored (a place
for YAML anchors). Errors name ``file:LINE:COL``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from moe_policy.core.paths import CONFIG_DIR
from moe_policy.core.yamlio import KeyPath, LoadedYaml, load_yaml_file
from moe_policy.errors import PolicyError, did_you_mean

#: The bundled matrix: the shipped models on H100, H200, B200, MI300X and CPU.
DEFAULT_MATRIX = CONFIG_DIR / "matrices" / "default.yaml"
MODELS_DIR = CONFIG_DIR / "models"

DEPLOYMENT_KEYS = ("name", "model", "platforms", "parallel", "lora", "env", "engine", "layers")
PLATFORM_KEYS = {
    "platform": "platform",
    "capability": "device.capability",
    "device_name": "device.name",
    "packages": "packages",
}
PARALLEL_KEYS = ("tp", "dp", "ep", "all2all", "eplb")
LORA_KEYS = {"enabled": "lora.enabled", "max_rank": "lora.max_rank", "max_loras": "lora.max_loras"}


@dataclass(frozen=True)
class Deployment:
    """One deployment on one platform: what a Selector is built from."""

    name: str
    model: str
    model_path: str
    platform: str
    #: Context keys and values (platform, device, parallel, LoRA), in a stable order.
    values: tuple[tuple[str, Any], ...]
    env: tuple[tuple[str, str], ...] = ()
    engine: str | None = None
    layers: tuple[str, ...] = ("moe",)
    #: ``file:PATH:LINE:COL`` of the deployment's entry; ``source``: the matrix file.
    origin: str = ""
    source: str = ""


def _freeze(value: Any) -> Any:
    if isinstance(value, Mapping):
        return tuple(sorted((str(k), _freeze(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v) for v in value)
    return value


class _Reader:
    def __init__(self, loaded: LoadedYaml, path: Path) -> None:
        self.loaded = loaded
        self.path = path

    def error(self, message: str, keypath: KeyPath, *, at_key: bool = False) -> PolicyError:
        return PolicyError(message, self.loaded.origin(keypath, at_key=at_key))

    def mapping(
        self, value: Any, keypath: KeyPath, keys: Sequence[str], what: str
    ) -> Mapping[str, Any]:
        if not isinstance(value, Mapping):
            raise self.error(f"{what} must be a mapping, got {type(value).__name__}", keypath)
        for key in value:
            if key not in keys:
                raise self.error(
                    f"unknown {what} key {key!r}{did_you_mean(str(key), keys)}",
                    (*keypath, key),
                    at_key=True,
                )
        return value

    def model(self, value: Any, keypath: KeyPath) -> tuple[str, str]:
        if not isinstance(value, str) or not value.strip():
            raise self.error("model must be a bundled model name or a config.json path", keypath)
        bundled = MODELS_DIR / f"{value}.json"
        if "/" not in value and not value.endswith((".json", ".yaml", ".yml")):
            if _regular(bundled):
                return value, str(bundled)
            names = sorted(p.stem for p in MODELS_DIR.glob("*.json"))
            raise self.error(f"unknown model {value!r}{did_you_mean(value, names)}", keypath)
        path = (self.path.parent / value).resolve()
        if not _regular(path):
            raise self.error(f"model config {value!r} not found (looked for {path})", keypath)
        return value, str(path)

    def as_list(self, value: Any) -> list[tuple[int | None, Any]]:
        if isinstance(value, list):
            return list(enumerate(value))
        return [(None, value)]


def _regular(path: Path) -> bool:
    """``path`` is a regular file (a name too long to exist is not one)."""
    try:
        return path.is_file()
    except (OSError, ValueError):
        return False


def _sub(keypath: KeyPath, index: int | None) -> KeyPath:
    return keypath if index is None else (*keypath, index)


def load_matrix(path: str | Path) -> list[Deployment]:
    """Every (deployment, model, platform) of the matrix file, in file order."""
    path = Path(path)
    loaded = load_yaml_file(path)
    reader = _Reader(loaded, path)
    data = loaded.data
    if not isinstance(data, Mapping):
        raise reader.error("a deployment matrix must be a mapping with 'deployments:'", ())
    reader.mapping(
        {k: v for k, v in data.items() if not str(k).startswith("x-")},
        (),
        ("deployments",),
        "matrix",
    )
    items = data.get("deployments")
    if not isinstance(items, list) or not items:
        raise reader.error("'deployments' must be a non-empty list", ("deployments",))
    out: list[Deployment] = []
    for index, item in enumerate(items):
        out.extend(_deployment(reader, item, ("deployments", index)))
    return out


def _deployment(reader: _Reader, item: Any, at: KeyPath) -> list[Deployment]:
    reader.mapping(item, at, DEPLOYMENT_KEYS, "deployment")
    for required in ("name", "model", "platforms"):
        if required not in item:
            raise reader.error(f"deployment has no {required!r}", at)
    name = item["name"]
    if not isinstance(name, str) or not name.strip():
        raise reader.error("name must be a non-empty string", (*at, "name"))
    common: list[tuple[str, Any]] = []
    parallel = item.get("parallel")
    if parallel is not None:
        reader.mapping(parallel, (*at, "parallel"), PARALLEL_KEYS, "parallel")
        common.extend((f"parallel.{k}", parallel[k]) for k in PARALLEL_KEYS if k in parallel)
    lora = item.get("lora")
    if isinstance(lora, bool):
        common.append(("lora.enabled", lora))
    elif lora is not None:
        reader.mapping(lora, (*at, "lora"), tuple(LORA_KEYS), "lora")
        common.extend((LORA_KEYS[k], lora[k]) for k in LORA_KEYS if k in lora)
    env = item.get("env") or {}
    if not isinstance(env, Mapping):
        raise reader.error("env must be a mapping of variable names to values", (*at, "env"))
    env_items = tuple(sorted((str(k), "" if v is None else str(v)) for k, v in env.items()))
    engine = item.get("engine")
    if engine is not None and not isinstance(engine, str):
        raise reader.error("engine must be a string (moe_policy or vllm)", (*at, "engine"))
    layers_value = item.get("layers", ["moe"])
    layers = layers_value if isinstance(layers_value, list) else [layers_value]
    if not layers or not all(isinstance(k, str) for k in layers):
        raise reader.error("layers must be a list of layer kinds", (*at, "layers"))
    origin = str(reader.loaded.origin(at))
    out: list[Deployment] = []
    for m_index, model_value in reader.as_list(item["model"]):
        model, model_path = reader.model(model_value, _sub((*at, "model"), m_index))
        for p_index, platform in reader.as_list(item["platforms"]):
            where = _sub((*at, "platforms"), p_index)
            reader.mapping(platform, where, tuple(PLATFORM_KEYS), "platform")
            if "platform" not in platform:
                raise reader.error("platform entry has no 'platform'", where)
            values = [
                (PLATFORM_KEYS[k], _freeze(platform[k])) for k in PLATFORM_KEYS if k in platform
            ]
            label = str(platform.get("device_name") or platform["platform"])
            out.append(
                Deployment(
                    name=name,
                    model=model,
                    model_path=model_path,
                    platform=label,
                    values=tuple([*values, *((k, _freeze(v)) for k, v in common)]),
                    env=env_items,
                    engine=engine,
                    layers=tuple(layers),
                    origin=origin,
                    source=reader.loaded.path,
                )
            )
    return out
