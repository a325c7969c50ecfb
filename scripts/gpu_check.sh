#!/usr/bin/env bash
# GPU validation on a CUDA machine: end-to-end MoELayer tests, every GPU-marked kernel test,
# the cross-rank agreement scenarios over NCCL (one process per visible GPU) and a short run
# of the kernel benchmark in both formats (its GPU path; not a measurement).
# Usage, from the repository root: bash scripts/gpu_check.sh OUTDIR
# Python packages the machine lacks may lie as wheels in .whl/ (installed into /tmp/site).
set -uo pipefail
out=${1:-${OUT:-/tmp/gpu_check}}
mkdir -p "$out"
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl || exit 1
fi
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi -L | tee "$out/gpus.txt"
rc=0
python3 -m pytest -q -p no:cacheprovider -m gpu tests/layer 2>&1 | tee "$out/layer_gpu.log" || rc=1
python3 -m pytest -q -p no:cacheprovider -m gpu -n 4 tests/kernels 2>&1 | tail -n 30 | tee "$out/kernels_gpu.log" || rc=1
python3 -m tests.distributed.run_nccl "$out/nccl" 2>&1 | tee "$out/nccl.log" || rc=1
{
  python3 -m benchmarks.kernels --shapes qwen3-30b-a3b --tokens 1 256 --replays 5 --held 0 &&
    python3 -m benchmarks.kernels --format batched --shapes gpt-oss-20b --tokens 64 --replays 5 --held 0
} 2>&1 | tee "$out/kernels_bench.log" || rc=1
exit $rc
