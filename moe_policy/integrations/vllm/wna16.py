"""What vLLM's weight-only integer (int_wna16) oracle is asked, as policy facts: the layer's
int4/int8 scheme from the calling method's quantization config (GPTQ or AWQ), and a
``--moe-backend`` request in the oracle's vocabulary (``map_wna16_backend``). Imports vLLM
lazily; only the vLLM integration uses this module.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from moe_policy.core.origin import Origin
from moe_policy.errors import PolicyError
from moe_policy.integrations.vllm.facts import mapped_request_entry, vllm_origin
from moe_policy.settings import Entry

#: ``--moe-backend`` values of vLLM's int_wna16 oracle (map_wna16_backend) -> catalog names.
#: vLLM maps an explicit request to exactly that backend: no batched variant is swapped in.
WNA16_REQUESTABLE: Mapping[str, str] = {
    "triton": "triton",
    "marlin": "marlin",
    "humming": "humming",
    "flashinfer_trtllm": "flashinfer_trtllm",
    "emulation": "emulation",
    "rdna3": "rdna3",
}

#: vLLM's quantization config classes whose MoE methods the profile describes, by format.
DESCRIBED_CONFIGS: Mapping[str, str] = {"AutoGPTQConfig": "gptq", "AutoAWQConfig": "awq"}


@dataclass(frozen=True)
class Wna16Call:
    """The arguments of one ``select_wna16_moe_backend`` call besides the layer's config."""

    quant_config: Any
    may_have_zp: bool
    may_have_bias: bool
    allow_tile_padding: bool

    @property
    def fmt(self) -> str:
        name = type(self.quant_config).__name__
        if name not in DESCRIBED_CONFIGS:
            raise PolicyError(
                f"int_wna16 MoE layers quantized by {name}: the vLLM profile describes the "
                f"GPTQ and AWQ methods only ({', '.join(DESCRIBED_CONFIGS)})",
                vllm_origin("quant_config"),
            )
        return DESCRIBED_CONFIGS[name]

    @property
    def bits(self) -> int:
        config = self.quant_config
        if self.fmt == "awq":
            return int(config.weight_bits)
        return int(config.quant_type.size_bits)

    @property
    def group_size(self) -> int | None:
        size = getattr(self.quant_config, "group_size", None)
        return None if size is None or int(size) <= 0 else int(size)

    @property
    def key(self) -> tuple[Any, ...]:
        return (self.fmt, self.bits, self.group_size, self.may_have_zp, self.may_have_bias,
                self.allow_tile_padding, bool(getattr(self.quant_config, "desc_act", False)))  # fmt: skip


def wna16_facts(call: Wna16Call) -> dict[str, tuple[Any, Origin]]:
    """The ``model.*`` quantization facts of a weight-only integer layer."""
    origin = vllm_origin("quant_config")
    size = call.group_size
    return {
        "model.quantization": (f"int{call.bits}", origin),
        "model.quant.format": (call.fmt, vllm_origin("quant_method")),
        "model.quant.weight_scale": ("channel" if size is None else "group", origin),
        "model.quant.block": (None, origin),
        "model.quant.group_size": (size, origin),
        "model.quant.activation": ("none", vllm_origin("activation_key")),
        "model.quant.symmetric": (not call.may_have_zp, vllm_origin("may_have_zp")),
    }


def wna16_request_entry(value: str) -> Entry | None:
    """``--moe-backend`` as the int_wna16 oracle's request (None: auto)."""
    return mapped_request_entry(value, WNA16_REQUESTABLE, "WNA16")
