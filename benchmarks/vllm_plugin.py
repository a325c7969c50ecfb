"""What the vLLM plugin costs per model load: 48 MoE layers of one signature, selected by
vLLM 0.33's own oracle and by the plugin, on the CPU (a faked H200, as in the tests).

    .venv-vllm/bin/python -m benchmarks.vllm_plugin [--layers 48] [--loads 20] [--out FILE]

Needs the environment of ``make test-vllm``. Each "load" starts from an empty selector cache,
so the plugin's figure includes building its selector (settings, context, one resolution).
Prints the median per load; ``--out`` writes the numbers as JSON.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import time
import warnings
from pathlib import Path

from benchmarks.common import check_out_file, positive_int


def time_loads(select: object, layers: int, loads: int) -> list[float]:
    """Milliseconds per load of ``layers`` selections (fresh moe_policy caches each load)."""
    from moe_policy.core.state import STATE
    from tests.integrations.vllm.harness import MODELS, Case, faked_platform, moe_config

    qwen3_h200 = Case(name="qwen3-30b-a3b/h200", capability=(9, 0), **MODELS["qwen3-30b-a3b"])
    times = []
    with faked_platform(qwen3_h200), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config = moe_config(qwen3_h200)
        for _ in range(loads):
            STATE.selectors.clear()
            STATE.reporting.clear()
            start = time.perf_counter()
            for _ in range(layers):
                select(moe_config=config)  # type: ignore[operator]
            times.append((time.perf_counter() - start) * 1e3)
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=positive_int, default=48)
    parser.add_argument("--loads", type=positive_int, default=20)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    try:  # written at the end: a path that cannot be written fails before the timing
        if args.out:
            check_out_file(str(args.out))
    except ValueError as exc:
        parser.error(f"--out: {exc}")
    try:  # vLLM (and the test harness that fakes its platform) only in make test-vllm's venv
        from vllm.model_executor.layers.fused_moe.oracle.unquantized import (
            select_unquantized_moe_backend as vllm_select,
        )

        from moe_policy.integrations.vllm.selection import select_unquantized_moe_backend
    except ImportError as exc:
        parser.exit(2, f"{parser.prog}: error: needs vLLM ({exc}): run it with "
                       ".venv-vllm/bin/python after make test-vllm\n")  # fmt: skip
    logging.getLogger("vllm").setLevel(logging.ERROR)
    logging.getLogger("moe_policy").setLevel(logging.ERROR)
    vllm_ms = time_loads(vllm_select, args.layers, args.loads)
    ours_ms = time_loads(select_unquantized_moe_backend, args.layers, args.loads)
    result = {
        "layers": args.layers,
        "loads": args.loads,
        "vllm_ms_median": statistics.median(vllm_ms),
        "plugin_ms_median": statistics.median(ours_ms),
        "plugin_extra_ms_median": statistics.median(ours_ms) - statistics.median(vllm_ms),
    }
    print(
        f"{args.layers} layers per load, median of {args.loads}: vLLM's oracle "
        f"{result['vllm_ms_median']:.2f} ms, the plugin {result['plugin_ms_median']:.2f} ms "
        f"(+{result['plugin_extra_ms_median']:.2f} ms)"
    )
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
