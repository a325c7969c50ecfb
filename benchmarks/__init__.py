"""Benchmarks a user runs from the repository root (``python -m benchmarks.<name>``): the policy
path (``policy``), the CLI (``cli``), the cross-rank agreement check (``consistency``) and the
fused-MoE kernels on a GPU (``kernels``); ``common`` holds what they share with ``tools``.
See ``benchmarks/README.md``."""
