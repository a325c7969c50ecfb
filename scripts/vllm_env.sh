#!/usr/bin/env bash
# Build the environment for the vLLM differential tests (tests/integrations/vllm/): vLLM 0.33.0's
# real MoE selection code on a CPU machine, without vLLM's CUDA dependency chain.
#
#   bash scripts/vllm_env.sh [DIR]        # DIR defaults to .venv-vllm (in the repository root)
#   DIR/bin/python -m pytest -q tests/integrations/vllm
#
# Steps: torch==2.13.0 (on the CI machines a CPU build from a local index); vllm==0.33.0 with
# --no-deps; the pinned pure-Python closure in requirements/vllm-oracle.txt, also --no-deps, so no
# resolver can pull nvidia-*/triton/flashinfer; this package (--no-deps -e .) with its runtime deps
# and pytest; then a check that no CUDA package came in and that the modules the harness needs
# import. A stamp records the inputs (this script, the requirements, pyproject.toml): a second run
# with the same inputs returns at once; a changed input rebuilds DIR from scratch.
# Needs no standard input. PYTHON picks the interpreter (default python3, 3.10+).
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo"
dir=${1:-.venv-vllm}
case $dir in /*) ;; *) dir="$repo/$dir" ;; esac  # absolute: the checks run from /tmp
reqs=requirements/vllm-oracle.txt
stamp="$dir/.vllm-oracle-stamp"

key=$(cat scripts/vllm_env.sh "$reqs" pyproject.toml | sha256sum | cut -d' ' -f1)
if [[ -f "$stamp" && "$(cat "$stamp")" == "$key" && -x "$dir/bin/python" ]]; then
  echo "vllm env up to date: $dir"
  exit 0
fi

start=$SECONDS
step() { echo "[vllm_env +$((SECONDS - start))s] $*"; }
export PIP_NO_INPUT=1 PIP_DISABLE_PIP_VERSION_CHECK=1

if [[ -e "$dir" ]]; then
  if [[ ! -f "$dir/pyvenv.cfg" ]]; then
    echo "vllm_env.sh: $dir exists and is not a virtual environment; not touching it" >&2
    exit 1
  fi
  step "inputs changed or last build incomplete: rebuilding $dir"
  rm -rf "$dir"
fi
step "venv $dir"
"${PYTHON:-python3}" -m venv "$dir"
py="$dir/bin/python"
# -qq: the machine's pip configuration names local indexes that lack most packages, and pip
# warns about each of them; errors still show.
pip=("$py" -m pip install -qq)

step "torch==2.13.0"
# -c: torch's own dependencies (filelock, sympy, ...) take the versions pinned in $reqs.
"${pip[@]}" -c "$reqs" torch==2.13.0
step "vllm==0.33.0 (--no-deps)"
"${pip[@]}" --no-deps vllm==0.33.0
step "$reqs (--no-deps)"
"${pip[@]}" --no-deps -r "$reqs"
step "moe-policy (--no-deps -e .), its runtime dependencies, pytest"
# Built with the setuptools pinned in $reqs (pyproject: setuptools>=77), so no isolated build env.
"${pip[@]}" --no-deps --no-build-isolation -e .
# pyproject.toml [project].dependencies; -c keeps PyYAML pinned.
"${pip[@]}" -c "$reqs" 'PyYAML>=6.0' \
  'structlog>=24.1' 'tabulate>=0.9' 'pytest>=8'

step "checks"
if "$py" -m pip list --format=freeze 2>/dev/null |
  grep -iE '^(nvidia-|cuda-|triton==|flashinfer|xformers|cupy)'; then
  echo "vllm_env.sh: CUDA packages were installed into $dir (listed above)" >&2
  exit 1
fi
# Imported from /tmp, so that nothing in the work tree shadows an installed package.
(cd /tmp && "$py" - <<'EOF'
import vllm.model_executor.layers.fused_moe.config
import vllm.model_executor.layers.fused_moe.oracle.unquantized
import vllm.model_executor.layers.fused_moe.oracle.fp8
import vllm.model_executor.layers.fused_moe.oracle.int8
import vllm.model_executor.layers.fused_moe.oracle.int_wna16  # needs compressed_tensors
import vllm.model_executor.layers.fused_moe.oracle.mxfp4
import vllm.model_executor.layers.fused_moe.oracle.mxfp8
import vllm.model_executor.layers.fused_moe.oracle.nvfp4
import vllm.model_executor.layers.fused_moe.oracle.w4a8
import vllm.model_executor.layers.fused_moe.oracle.w4a8_int8
import vllm.model_executor.layers.fused_moe.unquantized_fused_moe_method
import vllm.plugins
import vllm.lora.layers.fused_moe
import moe_policy
import pytest
import torch
import vllm

assert vllm.__version__ == "0.33.0", vllm.__version__
assert not torch.version.cuda, torch.version.cuda
print(f"vllm {vllm.__version__}, torch {torch.__version__}: imports ok")
EOF
)

echo "$key" >"$stamp"
step "vllm env ready: $dir"
