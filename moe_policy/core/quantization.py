"""The MoE experts' weight quantization, read from a model's ``quantization_config``.

One scheme per model (``model.quantization``: fp8, mxfp8, mxfp4, nvfp4, int8, int4,
w4a8_fp8, w4a8_int8) plus how it is scaled (``model.quant.*``): the weight scale
granularity (tensor, channel, block with its shape, group with its size), how the
activations are quantized (none for weight-only, static or dynamic per tensor, dynamic
per token, dynamic per group), whether integer weights are symmetric, and the checkpoint
format it was read from. Each fact keeps the ``file:PATH:LINE:COL`` of its key.

Formats read: Hugging Face fine-grained fp8 (``quant_method: fp8``, ``weight_block_size``),
FBGEMM fp8, compressed-tensors ``config_groups``, NVIDIA ModelOpt (``quant_method:
modelopt`` with ``quant_algo``, or the ``hf_quant_config.json`` beside the config), gpt-oss
``mxfp4``, MLX (``quantization: {bits, group_size}``), AWQ and GPTQ. A scheme this module
does not know is a PolicyError naming the key, never a guess.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from moe_policy.core.origin import Origin
from moe_policy.core.values import parse_bool, parse_int
from moe_policy.core.yamlio import KeyPath, LoadedYaml, load_yaml_file
from moe_policy.errors import PolicyError, did_you_mean

Facts = dict[str, tuple[Any, Origin]]

#: Weight scale granularities and activation quantizations, in the context's vocabulary.
WEIGHT_SCALES = ("tensor", "channel", "block", "group")
ACTIVATION_SCHEMES = ("none", "static_tensor", "dynamic_tensor", "dynamic_token", "dynamic_group")
FORMATS = ("fp8", "fbgemm_fp8", "compressed-tensors", "modelopt", "mxfp4", "mlx", "awq", "gptq")


class _Doc:
    """Values and origins inside one quantization mapping of a loaded document."""

    def __init__(self, loaded: LoadedYaml, prefix: KeyPath) -> None:
        self.loaded = loaded
        self.prefix = prefix

    def node(self, *path: Any) -> Any:
        node: Any = self.loaded.data
        for part in (*self.prefix, *path):
            if not isinstance(node, Mapping) or part not in node:
                return None
            node = node[part]
        return node

    def present(self, *path: Any) -> bool:
        """The key at ``path`` is written (with any value, null included)."""
        *parents, last = path
        parent = self.node(*parents)
        return isinstance(parent, Mapping) and last in parent

    def shown(self, value: Any, *path: Any) -> str:
        """``value`` (at ``path``) as a message shows it (``LoadedYaml.shown``)."""
        return self.loaded.shown((*self.prefix, *path), value)

    def origin(self, *path: Any) -> Origin:
        return self.loaded.origin((*self.prefix, *path))

    def name(self, *path: Any) -> str:
        return ".".join(str(p) for p in (*self.prefix, *path))

    def error(self, message: str, *path: Any) -> PolicyError:
        return PolicyError(
            f"{self.name(*path)}: {message}", self.origin(*path), key=self.name(*path)
        )


def _facts(
    doc: _Doc,
    where: tuple[Any, ...],
    scheme: str,
    fmt: str,
    weight_scale: str,
    activation: str,
    *,
    block: str | None = None,
    group_size: int | None = None,
    symmetric: bool = True,
    activation_at: tuple[Any, ...] | None = None,
) -> Facts:
    origin = doc.origin(*where)
    return {
        "model.quantization": (scheme, origin),
        "model.quant.format": (
            fmt,
            doc.origin("quant_method") if doc.node("quant_method") else origin,
        ),
        "model.quant.weight_scale": (weight_scale, origin),
        "model.quant.block": (block, origin),
        "model.quant.group_size": (group_size, origin),
        "model.quant.activation": (
            activation,
            doc.origin(*activation_at) if activation_at is not None else origin,
        ),
        "model.quant.symmetric": (symmetric, origin),
    }


def _positive_int(doc: _Doc, value: Any, *path: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise doc.error(f"expected a positive integer, got {doc.shown(value, *path)}", *path)
    return value


def _integer(doc: _Doc, value: Any, *path: Any) -> int:
    """An integer as written: ``8.0`` and ``true`` are refused, as everywhere in the package."""
    try:
        return parse_int(value)
    except ValueError:
        raise doc.error(f"expected an integer, got {doc.shown(value, *path)}", *path) from None


def _flag(doc: _Doc, value: Any, *path: Any) -> bool:
    """A boolean as written: the string ``"false"`` is refused, never read as true."""
    try:
        return parse_bool(value)
    except ValueError:
        raise doc.error(
            f"expected a boolean (true or false, unquoted), got {doc.shown(value, *path)}", *path
        ) from None


def _choice(doc: _Doc, value: Any, known: tuple[str, ...], what: str, *path: Any) -> str:
    """One of ``known``, spelled exactly as vLLM compares it; else an error with a
    did-you-mean (a case-insensitive match first)."""
    if isinstance(value, str) and value in known:
        return value
    if not isinstance(value, str):
        raise doc.error(
            f"expected {what} ({' or '.join(known)}), got {doc.shown(value, *path)}", *path
        )
    raise doc.error(
        f"unknown {what} {value!r}{did_you_mean(value, known)} (known: {', '.join(known)})", *path
    )


# --- Hugging Face fine-grained fp8 (vLLM's Fp8Config) ------------------------------------------


#: vLLM's Fp8Config.ACTIVATION_SCHEMES (compared as written: ``Dynamic`` is refused).
FP8_ACTIVATION_SCHEMES = ("dynamic", "static")


def _hf_fp8(doc: _Doc) -> Facts:
    # Absent: dynamic. Present, it is one of vLLM's two schemes (null, "" and false too
    # are errors, never read as the default).
    act_at: tuple[Any, ...] | None = None
    scheme = "dynamic"
    if doc.present("activation_scheme"):
        act_at = ("activation_scheme",)
        scheme = _choice(
            doc, doc.node(*act_at), FP8_ACTIVATION_SCHEMES, "fp8 activation scheme", *act_at
        )
    block = doc.node("weight_block_size")
    if block is None:
        activation = "static_tensor" if scheme == "static" else "dynamic_tensor"
        return _facts(
            doc, ("quant_method",), "fp8", "fp8", "tensor", activation, activation_at=act_at
        )
    if not isinstance(block, list) or len(block) != 2:
        raise doc.error(f"expected [block_n, block_k], got {block!r}", "weight_block_size")
    n = _positive_int(doc, block[0], "weight_block_size", 0)
    k = _positive_int(doc, block[1], "weight_block_size", 1)
    if scheme == "static":
        raise doc.error(
            "block-scaled fp8 quantizes activations dynamically; activation_scheme 'static' "
            "contradicts weight_block_size",
            "activation_scheme",
        )
    return _facts(
        doc, ("weight_block_size",), "fp8", "fp8", "block", "dynamic_group", block=f"{n}x{k}",
        activation_at=act_at,
    )  # fmt: skip


def _fbgemm_fp8(doc: _Doc) -> Facts:
    return _facts(doc, ("quant_method",), "fp8", "fbgemm_fp8", "channel", "dynamic_token")


# --- gpt-oss mxfp4 -------------------------------------------------------------------------------


def _mxfp4(doc: _Doc) -> Facts:
    # gpt-oss: e2m1 weights with an e8m0 scale per 32 values; activations stay bf16.
    return _facts(doc, ("quant_method",), "mxfp4", "mxfp4", "group", "none", group_size=32)


# --- compressed-tensors ---------------------------------------------------------------------------


def _ct_weights(doc: _Doc, group: str) -> tuple[str, str, str | None, int | None, bool]:
    """(scheme base, weight scale, block, group size, symmetric) of one config group."""
    path = ("config_groups", group, "weights")
    weights = doc.node(*path)
    if not isinstance(weights, Mapping):
        raise doc.error("expected a mapping of the weights' quantization", *path)
    # compressed-tensors' QuantizationArgs defaults: 8 bits, int, symmetric.
    bits = _integer(doc, weights["num_bits"], *path, "num_bits") if "num_bits" in weights else 8
    kind = str(weights.get("type", "int")).lower()
    strategy = str(weights.get("strategy", "tensor")).lower()
    symmetric = (
        _flag(doc, weights["symmetric"], *path, "symmetric") if "symmetric" in weights else True
    )
    size = weights.get("group_size")
    if size is not None:
        size = _integer(doc, size, *path, "group_size")
    if kind == "float" and bits == 8:
        if strategy in ("tensor", "channel"):
            return "fp8", strategy, None, None, True
        if strategy == "block":
            shape = weights.get("block_structure")
            if not isinstance(shape, list) or len(shape) != 2:
                raise doc.error(
                    f"expected [block_n, block_k], got {shape!r}", *path, "block_structure"
                )
            n = _positive_int(doc, shape[0], *path, "block_structure", 0)
            k = _positive_int(doc, shape[1], *path, "block_structure", 1)
            return "fp8", "block", f"{n}x{k}", None, True
        if strategy == "group" and size == 32:
            return "mxfp8", "group", None, 32, True
    if kind == "float" and bits == 4 and strategy in ("tensor_group", "group"):
        if size == 16:
            return "nvfp4", "group", None, 16, True
        if size == 32:
            return "mxfp4", "group", None, 32, True
    if kind == "int" and bits in (4, 8):
        if strategy == "group":
            return (
                f"int{bits}",
                "group",
                None,
                _positive_int(doc, size, *path, "group_size"),
                symmetric,
            )
        if strategy in ("channel", "tensor"):
            return f"int{bits}", strategy, None, None, symmetric
    raise doc.error(
        f"no MoE quantization scheme for {bits}-bit {kind} weights with strategy {strategy!r}"
        + (f" and group size {size}" if size else ""),
        *path,
    )


def _ct_activation(doc: _Doc, group: str, base: str) -> tuple[str, str]:
    """(scheme, activation quantization) of one config group whose weights are ``base``."""
    path = ("config_groups", group, "input_activations")
    acts = doc.node(*path)
    if acts is None:
        return base, "none"
    if not isinstance(acts, Mapping):
        raise doc.error("expected a mapping or null", *path)
    bits = _integer(doc, acts["num_bits"], *path, "num_bits") if "num_bits" in acts else 8
    kind = str(acts.get("type", "int")).lower()
    strategy = str(acts.get("strategy", "tensor")).lower()
    dynamic = acts.get("dynamic", False)
    # compressed-tensors' `DynamicType | bool` (it lowercases a string: "LOCAL" is "local")
    if not isinstance(dynamic, bool) and not (
        isinstance(dynamic, str) and dynamic.lower() == "local"
    ):
        raise doc.error(
            f"expected true, false or 'local', got {doc.shown(dynamic, *path, 'dynamic')}",
            *path,
            "dynamic",
        )
    if strategy in ("tensor_group", "group"):
        activation = "dynamic_group"
    elif strategy == "token":
        activation = "dynamic_token"
    elif strategy == "tensor":
        activation = "static_tensor" if dynamic is False else "dynamic_tensor"
    else:
        raise doc.error(f"unknown activation strategy {strategy!r}", *path, "strategy")
    pair = (base, kind, bits)
    if pair in (
        ("fp8", "float", 8),
        ("mxfp8", "float", 8),
        ("nvfp4", "float", 4),
        ("mxfp4", "float", 4),
    ):
        return base, activation
    if pair == ("int8", "int", 8):
        return "int8", activation
    if base == "int4" and kind == "float" and bits == 8:
        return "w4a8_fp8", activation
    if base == "int4" and kind == "int" and bits == 8:
        return "w4a8_int8", activation
    if base == "mxfp4" and kind == "float" and bits == 8:
        return "mxfp4", activation  # W4A8: mxfp4 weights, fp8/mxfp8 activations
    raise doc.error(f"no MoE scheme for {base} weights with {bits}-bit {kind} activations", *path)


def _ct_group(doc: _Doc) -> str:
    """The config group that quantizes the experts' Linear layers."""
    groups = doc.node("config_groups")
    if not isinstance(groups, Mapping) or not groups:
        raise doc.error(
            "compressed-tensors needs a non-empty `config_groups` mapping", "config_groups"
        )
    for name, spec in groups.items():
        targets = spec.get("targets") if isinstance(spec, Mapping) else None
        if targets is not None and not isinstance(targets, list):
            raise doc.error(
                'expected a list of the layers this group quantizes (e.g. ["Linear"]), got '
                f"{doc.shown(targets, 'config_groups', name, 'targets')}",
                "config_groups",
                name,
                "targets",
            )
    linear = [
        name
        for name, spec in groups.items()
        if isinstance(spec, Mapping)
        and any(str(t) == "Linear" or "expert" in str(t) for t in spec.get("targets") or ())
    ]
    if len(linear) > 1:
        experts = [
            n for n in linear if any("expert" in str(t) for t in groups[n].get("targets") or ())
        ]
        if len(experts) == 1:
            return str(experts[0])
        raise doc.error(
            f"several config groups target Linear layers ({', '.join(map(str, linear))}); "
            "which one quantizes the experts is ambiguous",
            "config_groups",
        )
    if not linear:
        raise doc.error("no config group targets the Linear layers of the experts", "config_groups")
    return str(linear[0])


def _compressed_tensors(doc: _Doc) -> Facts:
    group = _ct_group(doc)
    base, scale, block, size, symmetric = _ct_weights(doc, group)
    scheme, activation = _ct_activation(doc, group, base)
    weights_at = ("config_groups", group, "weights")
    acts_at = ("config_groups", group, "input_activations")
    return _facts(
        doc, weights_at, scheme, "compressed-tensors", scale, activation, block=block,
        group_size=size, symmetric=symmetric, activation_at=acts_at,
    )  # fmt: skip


# --- ModelOpt ------------------------------------------------------------------------------------

_MODELOPT_ALGOS: Mapping[str, tuple[str, str, str, int | None, str | None]] = {
    # quant_algo -> (scheme, weight scale, activation, group size, block)
    "FP8": ("fp8", "tensor", "static_tensor", None, None),
    "FP8_PER_CHANNEL_PER_TOKEN": ("fp8", "channel", "dynamic_token", None, None),
    "FP8_PB_WO": ("fp8", "block", "none", None, "128x128"),
    "NVFP4": ("nvfp4", "group", "dynamic_group", 16, None),
    "W4A16_NVFP4": ("nvfp4", "group", "none", 16, None),
    "MXFP8": ("mxfp8", "group", "dynamic_group", 32, None),
}


def _modelopt_algo(doc: _Doc) -> tuple[str, tuple[Any, ...]]:
    algo = doc.node("quant_algo")
    if algo is None:
        raise doc.error("ModelOpt quantization without `quant_algo`", "quant_algo")
    if str(algo).upper() != "MIXED_PRECISION":
        return str(algo).upper(), ("quant_algo",)
    layers = doc.node("quantized_layers")
    if not isinstance(layers, Mapping):
        raise doc.error("MIXED_PRECISION needs a `quantized_layers` mapping", "quantized_layers")
    experts = {
        name: spec
        for name, spec in layers.items()
        if "expert" in str(name) and isinstance(spec, Mapping)
    }
    algos = {str(spec.get("quant_algo", "")).upper() for spec in experts.values()}
    if len(algos) != 1:
        found = ", ".join(sorted(algos)) or "none"
        raise doc.error(
            f"the experts' layers need one quant_algo, found: {found}", "quantized_layers"
        )
    first = next(iter(experts))
    return algos.pop(), ("quantized_layers", first, "quant_algo")


def _modelopt(doc: _Doc) -> Facts:
    algo, where = _modelopt_algo(doc)
    if algo not in _MODELOPT_ALGOS:
        raise doc.error(
            f"unknown ModelOpt quant_algo {algo!r}{did_you_mean(algo, _MODELOPT_ALGOS)} "
            f"(known: {', '.join(_MODELOPT_ALGOS)})",
            *where,
        )
    scheme, scale, activation, size, block = _MODELOPT_ALGOS[algo]
    return _facts(doc, where, scheme, "modelopt", scale, activation, block=block, group_size=size)


# --- weight-only integer formats ------------------------------------------------------------------


def _int_bits(doc: _Doc, *keys: str) -> tuple[str, int]:
    """(key, bits) of the first of ``keys`` written: an integer, 4 or 8. None written is an
    error, as in vLLM (``get_from_keys(config, ["bits"])`` raises), never a default."""
    key = next((k for k in keys if doc.present(k)), None)
    if key is None:
        alternatives = "".join(f" (or `{k}`)" for k in keys[1:])
        raise PolicyError(
            f"{doc.name()}: missing key `{keys[0]}`{alternatives}: the integer weights' "
            "bit width (4 or 8)",
            doc.origin(),
            key=doc.name(keys[0]),
        )
    bits = _integer(doc, doc.node(key), key)
    if bits not in (4, 8):
        raise doc.error(
            f"{bits}-bit integer weights are not a MoE scheme vLLM's oracles select (4 or 8)", key
        )
    return key, bits


def _group(doc: _Doc, key: str) -> tuple[str, int | None]:
    size = doc.node(key)
    if size is None:
        return "channel", None
    if _integer(doc, size, key) == -1:
        return "channel", None
    return "group", _positive_int(doc, size, key)


def _symmetric(doc: _Doc, key: str, *, inverted: bool = False) -> bool:
    """A boolean key (``sym``, or AWQ's ``zero_point`` when ``inverted``); absent: symmetric
    for ``sym``, a zero point for ``zero_point`` (what AutoGPTQ and AutoAWQ write)."""
    if not doc.present(key):
        return not inverted
    value = _flag(doc, doc.node(key), key)
    return not value if inverted else value


def _awq(doc: _Doc) -> Facts:
    # vLLM's AutoAWQConfig reads the first of ["w_bit", "bits"] (get_from_keys).
    bits_key, bits = _int_bits(doc, "w_bit", "bits")
    size_key = "group_size" if doc.node("group_size") is not None else "q_group_size"
    scale, size = _group(doc, size_key)
    symmetric = _symmetric(doc, "zero_point", inverted=True)
    return _facts(doc, (bits_key,), f"int{bits}", "awq", scale, "none", group_size=size, symmetric=symmetric)  # fmt: skip


def _gptq(doc: _Doc) -> Facts:
    bits_key, bits = _int_bits(doc, "bits")
    scale, size = _group(doc, "group_size")
    symmetric = _symmetric(doc, "sym")
    return _facts(doc, (bits_key,), f"int{bits}", "gptq", scale, "none", group_size=size, symmetric=symmetric)  # fmt: skip


def _mlx(doc: _Doc) -> Facts:
    _key, bits = _int_bits(doc, "bits")
    scale, size = _group(doc, "group_size")
    # MLX's affine quantization: a scale and a bias per group (asymmetric).
    return _facts(doc, ("bits",), f"int{bits}", "mlx", scale, "none", group_size=size, symmetric=False)  # fmt: skip


READERS: Mapping[str, Callable[[_Doc], Facts]] = {
    "fp8": _hf_fp8,
    "fbgemm_fp8": _fbgemm_fp8,
    "mxfp4": _mxfp4,
    "compressed-tensors": _compressed_tensors,
    "compressed_tensors": _compressed_tensors,
    "modelopt": _modelopt,
    "modelopt_fp4": _modelopt,
    "awq": _awq,
    "gptq": _gptq,
}


def quantization_facts(loaded: LoadedYaml, prefix: KeyPath) -> Facts:
    """The ``model.quantization`` and ``model.quant.*`` facts of the quantization mapping at
    ``prefix`` in ``loaded`` (a config's ``quantization_config``, an MLX ``quantization``, or
    an ``hf_quant_config.json``'s ``quantization``)."""
    doc = _Doc(loaded, prefix)
    data = doc.node()
    if not isinstance(data, Mapping):
        raise doc.error(f"expected a mapping of quantization settings, got {type(data).__name__}")
    method = data.get("quant_method")
    if method is None:
        if "quant_algo" in data:  # hf_quant_config.json's `quantization`
            return _modelopt(doc)
        if "bits" in data:
            return _mlx(doc)
        raise doc.error(
            "no `quant_method` (and not MLX's {bits, group_size}): the scheme is unknown",
            "quant_method",
        )
    name = str(method).lower()
    if name not in READERS:
        raise doc.error(
            f"unknown quant_method {method!r}{did_you_mean(name, READERS)} "
            f"(known: {', '.join(READERS)})",
            "quant_method",
        )
    return READERS[name](doc)


def unquantized(origin: Origin) -> Facts:
    """The facts of a model without quantization."""
    return {
        "model.quantization": ("none", origin),
        "model.quant.format": (None, origin),
        "model.quant.weight_scale": (None, origin),
        "model.quant.block": (None, origin),
        "model.quant.group_size": (None, origin),
        "model.quant.activation": ("none", origin),
        "model.quant.symmetric": (None, origin),
    }


#: ModelOpt writes its settings beside config.json in older exports.
MODELOPT_SIDECAR = "hf_quant_config.json"


def from_config(loaded: LoadedYaml) -> Facts:
    """The quantization facts of a model config: its ``quantization_config``, else MLX's
    ``quantization: {bits, group_size}``, else a ModelOpt ``hf_quant_config.json`` in the
    same directory, else unquantized."""
    data = loaded.data if isinstance(loaded.data, Mapping) else {}
    if data.get("quantization_config") is not None:
        return quantization_facts(loaded, ("quantization_config",))
    mlx = data.get("quantization")
    if isinstance(mlx, Mapping) and "bits" in mlx:
        return quantization_facts(loaded, ("quantization",))
    if loaded.fixed_origin is None:
        sidecar = Path(loaded.path).parent / MODELOPT_SIDECAR
        if sidecar.is_file():
            beside = load_yaml_file(sidecar, display_path=str(sidecar))
            return quantization_facts(beside, ("quantization",))
    return unquantized(Origin("default"))
