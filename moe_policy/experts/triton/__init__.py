"""The Triton fused-MoE kernels: device facts (``device``), shared jit helpers (``jit``),
alignment (``align``), tile configs and heuristics (``config``, tuned files in ``configs/``),
LoRA (``lora``), the standard format's kernels (``gemm``), launch plan (``launch``) and
launcher and experts class (``fused_moe``), the batched format (``batched``), the scratch
allocator (``workspace``) and the whole-layer tuner behind ``moe-policy tune`` (``tuning``)."""
