"""The tuner's outputs: the before/after table, the tuned file the kernels read
(``MOE_POLICY_TUNED_CONFIG_DIR``), ``tune_report.json`` and ``tune_report.png``."""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from typing import Any

from moe_policy.experts.triton.config import config_file_name, read_tuned_file
from moe_policy.experts.triton.tuning.shapes import MoEShape


def report_table(results: list[dict[str, Any]]) -> str:
    """The before/after table: µs and bound ratio of the heuristic and the tuned config."""
    lora = any("tuned_lora_us" in r for r in results)
    head = "| T | heuristic µs | tuned µs | gain | tuned / bound |"
    head += " LoRA heuristic µs | LoRA tuned µs |" if lora else ""
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in results:
        cells = [str(r["T"]), f"{r['heuristic_us']:.1f}", f"{r['tuned_us']:.1f}",
                 f"{r['heuristic_us'] / r['tuned_us'] - 1:+.1%}",
                 f"{r['tuned_us'] / r['bound_us']:.2f}"]  # fmt: skip
        if lora:
            cells += [f"{r['heuristic_lora_us']:.1f}", f"{r['tuned_lora_us']:.1f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def tuned_file_path(shape: MoEShape, device: str, out: str) -> str:
    """Where the tuned file of ``shape`` on ``device`` goes in ``out``."""
    return os.path.join(out, config_file_name(shape.num_experts, shape.inter, device))


def kept_configs(path: str) -> dict[int, dict[str, Any]]:
    """The entries of a tuned file already at ``path`` (none when there is no file), which a
    new run keeps for the token counts it does not tune; ValueError naming the file when it is
    not a tuned file (it is not overwritten)."""
    if not os.path.exists(path):
        return {}
    return {t: c.to_dict() for t, c in read_tuned_file(path).items()}


def write_outputs(shape: MoEShape, device: str, results: list[dict[str, Any]], out: str) -> str:
    """The tuned file (token count -> config; entries of an earlier file for other token counts
    kept), ``tune_report.json`` and ``tune_report.png``."""
    import triton

    path = tuned_file_path(shape, device, out)
    configs = {**kept_configs(path), **{int(r["T"]): r["config"] for r in results}}
    payload = {"triton_version": triton.__version__, "device_name": device, "model": shape.name,
               "configs": {str(t): configs[t] for t in sorted(configs)}}  # fmt: skip
    with open(path, "w") as f:
        json.dump(payload, f, indent=1)
        f.write("\n")
    with open(os.path.join(out, "tune_report.json"), "w") as f:
        json.dump({"shape": asdict(shape), "device": device, "rows": results}, f, indent=1)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 4))
        ts = [r["T"] for r in results]
        ax.plot(ts, [r["heuristic_us"] / r["bound_us"] for r in results], marker="o",
                label="heuristic")  # fmt: skip
        ax.plot(ts, [r["tuned_us"] / r["bound_us"] for r in results], marker="o", label="tuned")
        ax.axhline(1.0, color="k", lw=0.8)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("tokens T")
        ax.set_ylabel("whole layer / lower bound")
        ax.set_title(f"{shape.name} on {device}")
        ax.legend()
        fig.tight_layout()
        fig.savefig(os.path.join(out, "tune_report.png"), dpi=110)
    except ImportError:
        print("# no plot: matplotlib is not installed (pip install 'moe-policy[plots]')")
    return path
