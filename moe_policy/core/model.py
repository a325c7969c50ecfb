"""MoE facts from a Hugging Face ``config.json`` (or a YAML file in the same keys).

Each fact keeps the ``file:PATH:LINE:COL`` of the key it came from. A missing or
contradictory field is a PolicyError naming the file and the keys.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from moe_policy.core import paths, quantization
from moe_policy.core.origin import Origin
from moe_policy.core.values import parse_bool, parse_int, parse_str, shown
from moe_policy.core.yamlio import LoadedYaml, describe, load_yaml_file
from moe_policy.errors import PolicyError, did_you_mean

# Key variants, most specific first. A dotted name looks inside a nested mapping.
EXPERT_KEYS = (
    "num_local_experts",
    "num_experts",
    "n_routed_experts",
    "moe_num_experts",
    "ffn_config.moe_num_experts",
)
TOP_K_KEYS = (
    "num_experts_per_tok",
    "num_experts_per_token",
    "experts_per_token",
    "moe_top_k",
    "top_k",
    "ffn_config.moe_top_k",
)
HIDDEN_KEYS = ("hidden_size", "d_model", "n_embd")
INTERMEDIATE_KEYS = (
    "moe_intermediate_size",
    "expert_intermediate_size",
    "ffn_config.ffn_hidden_size",
    "intermediate_size",
)
ACTIVATION_KEYS = (
    "mlp_hidden_act",
    "moe_hidden_act",
    "hidden_act",
    "hidden_activation",
    "activation_function",
    "ffn_config.ffn_act_fn.name",
    "activation",
)
#: ``torch_dtype`` in older Hugging Face configs, ``dtype`` in newer ones.
DTYPE_KEYS = ("torch_dtype", "dtype")
#: Where a multimodal config nests its language model's settings.
NESTED_CONFIG_KEYS = ("text_config", "llm_config", "language_config")
#: The router's scoring functions vLLM runs (fused_moe's routers raise "Unsupported scoring
#: function" for any other); compared as written, as vLLM compares them.
SCORING_FUNCS = ("softmax", "sigmoid", "sqrtsoftplus")
#: The top-k methods of public configs: vLLM tests only ``== "noaux_tc"`` (a routing bias),
#: Hugging Face's DeepSeek-V2 code ``greedy`` and ``group_limited_greedy``; a misspelled
#: ``noaux_tc`` would silently drop the bias.
TOPK_METHODS = ("greedy", "group_limited_greedy", "noaux_tc")
SHARED_KEYS = ("n_shared_experts", "num_shared_experts")
SHARED_SIZE_KEYS = ("shared_expert_intermediate_size", "moe_shared_expert_intermediate_size")

_ACTIVATION_NAMES = {
    "silu": "silu",
    "swish": "silu",
    "swiglu": "silu",
    "gelu": "gelu",
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu_tanh": "gelu_tanh",
    "gelu_fast": "gelu_tanh",
    "geglu": "gelu",
    "relu2": "relu2",
    "relu_squared": "relu2",
    "squared_relu": "relu2",
    "relu^2": "relu2",
    "swigluoai": "swigluoai",
    "swiglustep": "swiglustep",
}
_DTYPE_NAMES = {
    "bfloat16": "bf16",
    "bf16": "bf16",
    "float16": "fp16",
    "fp16": "fp16",
    "half": "fp16",
    "float32": "fp32",
    "fp32": "fp32",
    "float": "fp32",
}
#: Model types whose experts are non-gated whatever `hidden_act` says.
_NON_GATED_TYPES = {"nemotron_h"}


@dataclass(frozen=True)
class ModelFacts:
    """MoE facts of a model, as context entries ``model.*`` -> (value, origin)."""

    path: str
    facts: Mapping[str, tuple[Any, Origin]]

    def value(self, key: str) -> Any:
        return self.facts[key][0]


def _doc_origin(loaded: LoadedYaml) -> Origin:
    return loaded.fixed_origin or Origin.file(loaded.path)


def _lookup(data: Mapping[str, Any], dotted: str) -> tuple[bool, Any]:
    node: Any = data
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return False, None
        node = node[part]
    return True, node


class _Reader:
    """Finds key variants in a config (or its `text_config`) and remembers their marks."""

    def __init__(self, loaded: LoadedYaml) -> None:
        self.loaded = loaded
        data = loaded.data if isinstance(loaded.data, Mapping) else {}
        self.scopes: list[tuple[tuple[str, ...], Mapping[str, Any]]] = []
        for nested in NESTED_CONFIG_KEYS:
            sub = data.get(nested)
            if sub is None:
                continue
            if not isinstance(sub, Mapping):
                raise PolicyError(
                    f"{nested}: expected a mapping of the language model's settings, "
                    f"got {loaded.shown((nested,), sub)}",
                    self.origin((), nested),
                    key=nested,
                )
            self.scopes.append(((nested,), sub))
        self.scopes.append(((), data))

    def origin(self, prefix: tuple[str, ...], dotted: str) -> Origin:
        return self.loaded.origin((*prefix, *dotted.split(".")))

    def first(self, keys: tuple[str, ...]) -> tuple[str, Any, Origin] | None:
        """The first variant present, searching nested text configs first."""
        for prefix, scope in self.scopes:
            for key in keys:
                found, value = _lookup(scope, key)
                if found and value is not None:
                    name = ".".join((*prefix, key))
                    return name, value, self.origin(prefix, key)
        return None

    def all_present(self, keys: tuple[str, ...]) -> list[tuple[str, Any, Origin]]:
        hits = []
        for prefix, scope in self.scopes:
            for key in keys:
                found, value = _lookup(scope, key)
                if found and value is not None:
                    hits.append((".".join((*prefix, key)), value, self.origin(prefix, key)))
            if hits:
                return hits
        return hits


def _int_field(
    reader: _Reader, keys: tuple[str, ...], what: str, path: str, *, required: bool = True
) -> tuple[int, Origin] | None:
    hits = reader.all_present(keys)
    if not hits:
        if not required:
            return None
        raise PolicyError(
            f"no {what}: expected one of {', '.join(keys)} (is this a MoE model config?)",
            _doc_origin(reader.loaded),
            key=keys[0],
        )
    values = {}
    for name, value, origin in hits:
        count = _typed(parse_int, (name, value, origin), f"{what} (a positive integer)", minimum=1)
        values[name] = (count, origin)
    distinct = {v for v, _ in values.values()}
    if len(distinct) > 1:
        listing = ", ".join(f"{name}={v} ({o})" for name, (v, o) in values.items())
        raise PolicyError(f"contradictory {what}: {listing}", hits[0][2], key=hits[0][0])
    name, value, origin = hits[0]
    return value, origin


def _typed(parse: Any, hit: tuple[str, Any, Origin], what: str, **limits: Any) -> Any:
    """``parse(value)`` (``moe_policy.core.values``), or a PolicyError naming the key and
    its file:line:col: a count is an integer (not ``true``, not ``2.7``), a flag a boolean."""
    name, value, origin = hit
    if isinstance(value, float) and not math.isfinite(value):  # JSON's NaN, YAML's .inf
        raise PolicyError(f"{name}: {what}: got {describe(value)}", origin, key=name)
    try:
        return parse(value, **limits)
    except ValueError as exc:
        raise PolicyError(f"{name}: {what}: {exc}", origin, key=name) from None


def model_facts_from_loaded(loaded: LoadedYaml) -> ModelFacts:
    """Extract the ``model.*`` context facts from a parsed config document."""
    path = loaded.path
    if not isinstance(loaded.data, Mapping):
        raise PolicyError("a model config must be a mapping of keys", _doc_origin(loaded))
    reader = _Reader(loaded)
    facts: dict[str, tuple[Any, Origin]] = {}

    arch = reader.first(("architectures",))
    if arch is not None:
        if arch[1] == []:
            raise PolicyError(
                f"{arch[0]}: the list is empty (expected a list of class names, "
                'e.g. ["Qwen3MoeForCausalLM"])',
                arch[2],
                key=arch[0],
            )
        value = arch[1][0] if isinstance(arch[1], list) and arch[1] else arch[1]
        if not isinstance(value, str) or not value.strip():
            raise PolicyError(
                f"{arch[0]}: expected a list of class names, got {shown(arch[1])}",
                arch[2],
                key=arch[0],
            )
        facts["model.architecture"] = (value, arch[2])
    model_type_hit = reader.first(("model_type",))
    if model_type_hit is not None and not isinstance(model_type_hit[1], str):
        raise PolicyError(
            f"model_type: expected a string, got {shown(model_type_hit[1])}",
            model_type_hit[2],
            key="model_type",
        )
    model_type = str(model_type_hit[1]) if model_type_hit else ""

    num_experts = _int_field(reader, EXPERT_KEYS, "expert count", path)
    assert num_experts is not None
    facts["model.num_experts"] = num_experts
    top_k = _int_field(reader, TOP_K_KEYS, "top-k (experts per token)", path)
    assert top_k is not None
    facts["model.top_k"] = top_k
    if top_k[0] > num_experts[0]:
        raise PolicyError(
            f"top-k {top_k[0]} exceeds the expert count {num_experts[0]}", top_k[1], key="top_k"
        )
    hidden = _int_field(reader, HIDDEN_KEYS, "hidden size", path)
    assert hidden is not None
    facts["model.hidden_size"] = hidden
    _refuse_null_expert_size(reader)
    inter_hit = reader.first(INTERMEDIATE_KEYS)
    if inter_hit is None:
        raise PolicyError(
            f"no expert intermediate size: expected one of {', '.join(INTERMEDIATE_KEYS)}",
            _doc_origin(loaded),
            key=INTERMEDIATE_KEYS[0],
        )
    inter = _typed(parse_int, inter_hit, "expert intermediate size", minimum=1)
    facts["model.intermediate_size"] = (inter, inter_hit[2])

    # Activation and gating.
    act_hit = reader.first(ACTIVATION_KEYS)
    limit_hit = reader.first(("swiglu_limit",))
    named = (
        _ACTIVATION_NAMES.get(act_hit[1].lower())
        if act_hit is not None and isinstance(act_hit[1], str)
        else None
    )
    # A swiglu_limit means gpt-oss's swigluoai, unless the config names swiglustep (which
    # clamps with that limit too, on the [gate; up] layout and without biases).
    if model_type == "gpt_oss" or (limit_hit is not None and named != "swiglustep"):
        origin = (limit_hit or model_type_hit or (None, None, _doc_origin(loaded)))[2]
        facts["model.activation"] = ("swigluoai", origin)
        facts["model.has_bias"] = (True, origin)
    else:
        if act_hit is None:
            facts["model.activation"] = ("silu", Origin("default", "hf-default-silu"))
        else:
            raw = str(act_hit[1]).lower()
            if not isinstance(act_hit[1], str):
                shown_value = loaded.shown(tuple(act_hit[0].split(".")), act_hit[1])
                raise PolicyError(
                    f"{act_hit[0]}: expected an activation name (a string), got {shown_value}",
                    act_hit[2],
                    key=act_hit[0],
                )
            if raw not in _ACTIVATION_NAMES:
                raise PolicyError(
                    f"{act_hit[0]}: unknown activation {act_hit[1]!r}"
                    f"{did_you_mean(raw, _ACTIVATION_NAMES)} "
                    f"(known: {', '.join(sorted(_ACTIVATION_NAMES))})",
                    act_hit[2],
                    key=act_hit[0],
                )
            facts["model.activation"] = (_ACTIVATION_NAMES[raw], act_hit[2])
    activation = facts["model.activation"][0]
    gated_hit = reader.first(("is_gated", "gated"))
    if gated_hit is not None:
        facts["model.gated"] = (_typed(parse_bool, gated_hit, "gating"), gated_hit[2])
    elif activation == "relu2" or model_type in _NON_GATED_TYPES:
        facts["model.gated"] = (False, facts["model.activation"][1])
    else:
        facts["model.gated"] = (True, facts["model.activation"][1])
    if activation == "relu2" and facts["model.gated"][0]:
        raise PolicyError(
            "relu2 experts are non-gated; `gated: true` contradicts it", facts["model.gated"][1]
        )
    if activation in ("swigluoai", "swiglustep") and not facts["model.gated"][0]:
        raise PolicyError(
            f"{activation} is gated; `gated: false` contradicts it", facts["model.gated"][1]
        )

    # Shared experts.
    shared = reader.first(SHARED_KEYS)
    if shared is not None:
        count = _typed(parse_int, shared, "shared expert count", minimum=0)
        facts["model.shared_experts"] = (count, shared[2])
    else:
        size = reader.first(SHARED_SIZE_KEYS)
        width = _typed(parse_int, size, "shared expert size", minimum=0) if size else 0
        facts["model.shared_experts"] = (
            1 if width > 0 else 0,
            size[2] if size else Origin("default"),
        )

    facts["model.dtype"] = _dtype(reader)

    facts.update(_quantization(reader))

    facts["model.routing"] = _routing(reader, model_type, facts)
    facts["model.router_weight_on_input"] = (
        model_type in ("llama4", "llama4_text"),
        model_type_hit[2] if model_type_hit else Origin("default"),
    )
    facts.setdefault("model.has_bias", (False, Origin("default")))
    return ModelFacts(path, facts)


#: Where a config keeps its quantization settings: ``compression_config`` is what older
#: compressed-tensors exports write (vLLM reads it when ``quantization_config`` is absent).
QUANT_KEYS = ("quantization_config", "compression_config")


def _quantization(reader: _Reader) -> dict[str, tuple[Any, Origin]]:
    """The quantization facts: the config's own ``quantization_config`` (else its
    ``compression_config``), else one in a nested text config, else MLX's or a ModelOpt
    sidecar's (``quantization.from_config``). A quantization mapping is never passed over."""
    top_first = sorted(reader.scopes, key=lambda scope: len(scope[0]))
    for prefix, scope in top_first:
        for key in QUANT_KEYS:
            found, value = _lookup(scope, key)
            if not found or value is None:
                continue
            name = ".".join((*prefix, key))
            if not isinstance(value, Mapping):
                raise PolicyError(
                    f"{name}: expected a mapping (with quant_method), got {shown(value)}",
                    reader.origin(prefix, key),
                    key=name,
                )
            return quantization.quantization_facts(reader.loaded, (*prefix, key))
    return quantization.from_config(reader.loaded)


def _dtype(reader: _Reader) -> tuple[str, Origin]:
    """The weights' dtype from ``torch_dtype`` and/or ``dtype`` (the newer name): both may
    be written (transformers writes both in some versions), but they must agree."""
    hits = reader.all_present(DTYPE_KEYS)
    if not hits:
        return "bf16", Origin("default")
    dtypes = []
    for name, value, origin in hits:
        text = str(value).lower().removeprefix("torch.")
        if not isinstance(value, str) or text not in _DTYPE_NAMES:
            raise PolicyError(
                f"{name}: unknown dtype {value!r}{did_you_mean(text, _DTYPE_NAMES)} "
                f"(known: {', '.join(_DTYPE_NAMES)})",
                origin,
                key=name,
            )
        dtypes.append((_DTYPE_NAMES[text], name, value, origin))
    if len({dtype for dtype, *_ in dtypes}) > 1:
        listing = ", ".join(f"{name}={value!r} ({origin})" for _, name, value, origin in dtypes)
        raise PolicyError(f"contradictory dtype: {listing}", hits[0][2], key=hits[0][0])
    dtype, _name, _value, origin = dtypes[0]
    return dtype, origin


def _refuse_null_expert_size(reader: _Reader) -> None:
    """An expert-specific intermediate size given as null is an error: the dense
    ``intermediate_size`` is not the experts' size, so it is never used in its place."""
    for prefix, scope in reader.scopes:
        for key in INTERMEDIATE_KEYS[:-1]:
            found, value = _lookup(scope, key)
            if found and value is None:
                name = ".".join((*prefix, key))
                raise PolicyError(
                    f"{name}: the expert intermediate size is null (the dense "
                    "intermediate_size is not used in its place; give the experts' size)",
                    reader.origin(prefix, key),
                    key=name,
                )


def _routing(
    reader: _Reader, model_type: str, facts: dict[str, tuple[Any, Origin]]
) -> tuple[str, Origin]:
    scoring = reader.first(("scoring_func",))
    topk_method = reader.first(("topk_method",))
    groups = reader.first(("n_group",))
    for hit, what, known in (
        (scoring, "scoring function", SCORING_FUNCS),
        (topk_method, "top-k method", TOPK_METHODS),
    ):
        if hit is not None and _typed(parse_str, hit, what) not in known:
            name, value, origin = hit
            raise PolicyError(
                f"{name}: unknown {what} {value!r}{did_you_mean(value, known)} "
                f"(known: {', '.join(known)})",
                origin,
                key=name,
            )
    if groups is not None:
        _typed(parse_int, groups, "expert group count", minimum=1)
    if model_type in ("llama4", "llama4_text"):
        return "llama4", reader.first(("model_type",))[2]  # type: ignore[index]
    if topk_method is not None and topk_method[1] == "noaux_tc":
        return "deepseek_v3", topk_method[2]
    if model_type == "nemotron_h" or (
        groups is not None and scoring is not None and scoring[1] == "sigmoid"
    ):
        origin = (groups or scoring or reader.first(("model_type",)))[2]  # type: ignore[index]
        return "deepseek_v3", origin
    if scoring is not None and scoring[1] == "sigmoid":
        return "sigmoid", scoring[2]
    norm = reader.first(("norm_topk_prob",))
    if norm is not None:
        return (
            "renormalize" if _typed(parse_bool, norm, "top-k renormalisation") else "softmax"
        ), norm[2]
    return "renormalize", Origin("default")


def model_facts_from_mapping(config: Mapping[str, Any], origin: Origin | None = None) -> ModelFacts:
    """MoE facts from an in-memory config mapping (origin ``api:model`` by default)."""
    import json

    fixed = origin or Origin.api("model")
    loaded = LoadedYaml(str(fixed), dict(config), {}, {}, json.dumps(config, default=str), fixed)
    return model_facts_from_loaded(loaded)


#: Suffixes of a model file; another dotted name (``mixtral-8x7b-instruct-v0.1``) may be a
#: bundled model's name.
MODEL_FILE_SUFFIXES = (".json", ".yaml", ".yml")


def _path_kind(path: Path) -> str:
    """``dir``, ``missing`` or ``other`` (a file, or a path that reading then reports:
    a FIFO, a device, a name too long to exist)."""
    try:
        return "dir" if path.is_dir() else "other" if path.exists() else "missing"
    except (OSError, ValueError):
        return "other"


def resolve_model_path(spec: str | Path, origin: Origin | str | None = None) -> Path:
    """A model given as a config file, a Hugging Face model directory (its ``config.json``)
    or the name of a bundled config (``qwen3-30b-a3b``); else an error listing the names."""
    path = Path(spec)
    kind = _path_kind(path)
    if kind == "dir":
        config = path / "config.json"
        if _path_kind(config) == "missing":
            raise PolicyError(
                f"model directory {str(path)!r} has no config.json",
                origin or Origin.file(str(path)),
                code="file-not-found",
            )
        return config
    if kind == "other" or path.suffix in MODEL_FILE_SUFFIXES or "/" in str(spec):
        return path
    names = paths.bundled(paths.MODELS_DIR, ".json")
    if str(spec) in names:
        return names[str(spec)]
    raise PolicyError(
        f"no model file or bundled model named {str(spec)!r}{did_you_mean(str(spec), names)}; "
        f"bundled: {', '.join(names)}",
        origin or Origin.file(str(spec)),
        code="file-not-found",
    )


def load_model(path: str | Path, origin: Origin | str | None = None) -> ModelFacts:
    """Read a config.json / YAML model file (or a model directory, or a bundled model's
    name) into MoE facts."""
    resolved = resolve_model_path(path, origin)
    shown = str(path) if Path(path) == resolved else paths.shown_path(resolved)
    loaded = load_yaml_file(resolved, display_path=shown)
    return model_facts_from_loaded(loaded)
