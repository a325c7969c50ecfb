"""Tools for the Triton kernels, run from the repository root (``python -m tools.<name>``):
tuning the tile configs on a GPU (``tune_triton``, ``compare_configs``) and compile checks that
need no GPU (``smem_check``, ``ptx_report``). See ``benchmarks/README.md``."""
