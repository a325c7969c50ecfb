"""Tuning the Triton fused-MoE tiles for one model on this GPU (``moe-policy tune``): whole
layers timed in CUDA graphs, the winners written as a tuned file the kernels pick up at run
time. Nothing here imports torch or Triton until a GPU function runs."""
