"""Paths of the bundled configuration and model configs the tests decide for."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
MODELS = REPO / "configs" / "models"
NEMOTRON = str(MODELS / "nemotron-3-nano-30b-a3b.json")
MIXTRAL = str(MODELS / "mixtral-8x7b-instruct-v0.1.json")
QWEN3 = str(MODELS / "qwen3-30b-a3b.json")
DEEPSEEK = str(MODELS / "deepseek-v3.json")
#: A gpt-oss-20b-shaped config (interleaved swigluoai with clamp and biases).
GPT_OSS: Mapping[str, Any] = {
    "architectures": ["GptOssForCausalLM"],
    "model_type": "gpt_oss",
    "hidden_size": 2880,
    "intermediate_size": 2880,
    "num_local_experts": 32,
    "num_experts_per_tok": 4,
    "hidden_act": "silu",
    "swiglu_limit": 7.0,
    "torch_dtype": "bfloat16",
}
