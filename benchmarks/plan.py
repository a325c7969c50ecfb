"""``moe-policy plan`` over a 500-deployment matrix (a benchmark, not a test): prints the time.

Writes a matrix of 500 deployments into a temporary directory, each a different
combination of model (the four bundled ones), platform (H100, H200, B200, MI300X, CPU),
tensor- and data-parallel size, LoRA and environment, then times one plan from
``configs/default.yaml`` to a copy whose ``hopper-demotes-flashinfer`` rule is audit-only,
in process (matrix load and plan; the interpreter start and imports are not counted).
Each run starts with empty caches. Target: < 1 s on the 2-core CI machine.

Usage: python -m benchmarks.plan [--deployments 500] [--runs 3]
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks.common import positive_int

REPO = Path(__file__).resolve().parent.parent
TARGET_S = 1.0
MODELS = ("deepseek-v3", "mixtral-8x7b-instruct-v0.1", "nemotron-3-nano-30b-a3b", "qwen3-30b-a3b")
PLATFORMS = (
    '{platform: cuda, capability: "9.0", device_name: NVIDIA H100}',
    '{platform: cuda, capability: "9.0", device_name: NVIDIA H200}',
    '{platform: cuda, capability: "10.0", device_name: NVIDIA B200}',
    "{platform: rocm, device_name: AMD Instinct MI300X}",
    "{platform: cpu, device_name: CPU}",
)
ENVS = ("{}", "{MOE_POLICY_BACKEND: triton}", "{MOE_POLICY_BACKEND: flashinfer_cutlass}")
RULE = "  - id: hopper-demotes-flashinfer\n"
#: Deployments ``write_matrix`` can make, each a different combination.
COMBINATIONS = len(ENVS) * 2 * 2 * 4 * len(PLATFORMS) * len(MODELS)


def write_matrix(path: Path, count: int) -> None:
    """``count`` deployments, each a different combination."""
    combos = itertools.product(ENVS, (False, True), (1, 2), (1, 2, 4, 8), PLATFORMS, MODELS)
    lines = ["deployments:"]
    for i, (env, lora, dp, tp, platform, model) in zip(range(count), combos, strict=False):
        lines.append(
            f"  - {{name: d{i:04d}, model: {model}, platforms: {platform}, "
            f"parallel: {{tp: {tp}, dp: {dp}}}, lora: {str(lora).lower()}, env: {env}}}"
        )
    path.write_text("\n".join(lines) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--deployments", type=positive_int, default=500,
                        help=f"how many of the {COMBINATIONS} combinations")  # fmt: skip
    parser.add_argument("--runs", type=positive_int, default=3)
    args = parser.parse_args()
    if args.deployments > COMBINATIONS:
        parser.error(f"--deployments: at most {COMBINATIONS} (the different combinations), "
                     f"got {args.deployments}")  # fmt: skip

    from moe_policy.planning import load_matrix, plan

    with tempfile.TemporaryDirectory(prefix="moe-policy-bench-plan-") as tmp:
        matrix = Path(tmp) / "matrix.yaml"
        write_matrix(matrix, args.deployments)
        text = (REPO / "configs" / "default.yaml").read_text()
        new = Path(tmp) / "policy.yaml"
        new.write_text(text.replace(RULE, RULE + "    action: audit\n", 1))
        old = str(REPO / "configs" / "default.yaml")
        times = []
        for _ in range(args.runs):
            start = time.perf_counter()
            result = plan(load_matrix(matrix), [old], [str(new)])
            times.append(time.perf_counter() - start)
    median = statistics.median(times)
    print(
        f"moe-policy plan: {result.deployments} deployments, {result.decided} layer decisions, "
        f"{result.selectors} selectors, {len(result.cells)} changing"
    )
    print(
        f"median {median:.3f} s over {args.runs} runs (min {min(times):.3f} s, max {max(times):.3f} s)"
    )
    print(f"target < {TARGET_S:.1f} s: {'met' if median < TARGET_S else 'NOT met'}")


if __name__ == "__main__":
    main()
