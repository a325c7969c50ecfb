#!/usr/bin/env bash
# GPU validation in one device call: end-to-end MoELayer tests, every GPU-marked kernel
# test, and the cross-rank agreement scenarios over NCCL (one process per visible GPU).
# Usage (on the GPU machine, repository root, wheels in .whl/): bash scripts/gpu_check.sh OUTDIR
set -uo pipefail
out=${1:-${OUT:-/tmp/gpu_check}}
mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi -L | tee "$out/gpus.txt"
rc=0
python3 -m pytest -q -p no:cacheprovider -m gpu tests/layer 2>&1 | tee "$out/layer_gpu.log" || rc=1
python3 -m pytest -q -p no:cacheprovider -m gpu -n 4 tests/kernels 2>&1 | tail -n 30 | tee "$out/kernels_gpu.log" || rc=1
python3 -m tests.distributed.run_nccl "$out/nccl" 2>&1 | tee "$out/nccl.log" || rc=1
exit $rc
