"""The Triton fused-MoE kernels: alignment, tile configs and heuristics, LoRA, the fused and
batched layers, and the tuned configs in ``configs/``."""
