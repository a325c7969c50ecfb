"""No GPU: a ``kernels.py`` sweep JSON as the README table and issue 4's targets, met or missed.

Ratios here are to the lower bound at the issue's fixed ceilings (4.29 TB/s copy, 781 TFLOP/s
bf16 matmul), the basis of vLLM's figures, recomputed from each row's bytes and FLOPs rates;
the sweep's own ``ratio`` (its measured ceilings) is shown beside the verdicts.

    python -m benchmarks.kernels_table benchmarks/results/kernels_h200.json
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

from benchmarks.common import SHAPES, lower_bound_us
from benchmarks.kernels import VLLM_RATIO, load_sweep

#: Issue 4's ceilings (TB/s, TFLOP/s): vLLM's figures are ratios to the bound at these.
FIXED_COPY_TBPS, FIXED_MATMUL_TFLOPS = 4.29, 781.0


def fixed_ratio(row: dict[str, Any]) -> float:
    """Time over the lower bound at the fixed ceilings."""
    shape = SHAPES[row["shape"]]
    return float(row["us"]) / lower_bound_us(shape, row["T"], FIXED_COPY_TBPS, FIXED_MATMUL_TFLOPS)


@dataclass(frozen=True)
class Check:
    """One target at one point: the figure, the limit and whether it holds."""

    target: str
    shape: str
    t: int
    value: float
    limit: float
    higher_is_better: bool = False
    #: bound ratios: the same figure at the sweep's own measured ceilings (``ratio``)
    own_ceilings: float | None = None

    @property
    def met(self) -> bool:
        return self.value >= self.limit if self.higher_is_better else self.value <= self.limit

    def line(self) -> str:
        op = ">=" if self.higher_is_better else "<="
        verdict = "met   " if self.met else "MISSED"
        own = "" if self.own_ceilings is None else f"  (own ceilings {self.own_ceilings:.2f})"
        return (f"{verdict} {self.target:34s} {self.shape:15s} T={self.t:<5d} "
                f"{self.value:6.2f} {op} {self.limit:g}{own}")  # fmt: skip


def _rows(payload: dict[str, Any]) -> dict[tuple[str, int, str], dict[str, Any]]:
    return {(r["shape"], r["T"], r["impl"]): r for r in payload["rows"] if "us" in r}


def checks(payload: dict[str, Any]) -> list[Check]:
    """Issue 4's targets at every point the sweep timed (Triton layer and its LoRA row)."""
    rows = _rows(payload)
    out: list[Check] = []
    for (shape, t, impl), r in sorted(rows.items()):
        if impl != "triton":
            continue
        ratio = fixed_ratio(r)
        vllm = VLLM_RATIO.get((shape, t))
        if vllm is not None:
            out.append(Check("no slower than vLLM (ratio)", shape, t, ratio, vllm))
            if t >= 4096:
                out.append(Check("vLLM time / ours, T >= 4096", shape, t, vllm / ratio, 1.25, True))
        own = r.get("ratio")
        if t == 1:
            out.append(Check("bound ratio, T = 1", shape, t, ratio, 1.3, own_ceilings=own))
        elif 16 <= t <= 256:
            out.append(Check("bound ratio, 16 <= T <= 256", shape, t, ratio, 1.15,
                             own_ceilings=own))  # fmt: skip
        elif t >= 1024:
            out.append(Check("bound ratio, T >= 1024", shape, t, ratio, 1.4, own_ceilings=own))
        if shape == "mixtral-8x7b" and t == 8192:
            out.append(Check("TFLOP/s, Mixtral T = 8192", shape, t, r["tflops"], 600.0, True))
        out.append(Check("extra memory / budget", shape, t,
                         r["extra_mem_bytes"] / r["mem_limit_bytes"], 1.0))  # fmt: skip
        lora = rows.get((shape, t, "triton_lora"))
        if lora is not None and "overhead_vs_triton" in lora:
            limit = 1.35 if t == 1 else 1.2
            if t == 1 or t >= 64:
                out.append(Check(f"LoRA / base layer, T {'= 1' if t == 1 else '>= 64'}", shape,
                                 t, lora["overhead_vs_triton"], limit))  # fmt: skip
            out.append(Check("LoRA extra memory / budget", shape, t,
                             lora["extra_mem_bytes"] / lora["mem_limit_bytes"], 1.0))  # fmt: skip
    return out


def markdown_table(payload: dict[str, Any]) -> str:
    """The README's table: per shape the Triton layer's fixed-ceiling ratio at each T (µs at
    T=1, vLLM's figure in brackets, the held ratio and TFLOP/s at T=8192 where measured) and
    the LoRA overhead over T >= 64 and at T = 1."""
    rows = _rows(payload)
    shapes = list(dict.fromkeys(s for s, _, i in rows if i == "triton"))
    ts = sorted({t for _, t, i in rows if i == "triton"})
    head = ["shape", *(f"T={t}" for t in ts), "LoRA × (T≥64)", "LoRA × (T=1)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for s in shapes:
        cells = [s]
        for t in ts:
            r = rows.get((s, t, "triton"))
            if r is None:
                cells.append("–")
                continue
            c = f"{fixed_ratio(r):.2f}"
            if t == 1:
                c = f"{r['us']:.1f} µs {c}"
            if (s, t) in VLLM_RATIO:
                c += f" [{VLLM_RATIO[(s, t)]:.2f}]"
            extra = [f"held {r['ratio_held']:.2f}"] if "ratio_held" in r else []
            if t == 8192:
                extra.append(f"{r['tflops']:.0f} TF/s")
            cells.append(c + (f" ({'; '.join(extra)})" if extra else ""))
        over: list[float] = [
            rows[(s, t, "triton_lora")]["overhead_vs_triton"]
            for t in ts
            if t >= 64 and "overhead_vs_triton" in rows.get((s, t, "triton_lora"), {})
        ]
        cells.append(f"{min(over):.2f}–{max(over):.2f}" if over else "–")
        one = rows.get((s, 1, "triton_lora"), {}).get("overhead_vs_triton")
        cells.append("–" if one is None else f"{one:.2f}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("sweep", help="a kernels.py JSON (e.g. benchmarks/results/kernels_h200.json)")
    p.add_argument("--missed", action="store_true", help="list only the targets missed")
    args = p.parse_args()
    try:
        payload = load_sweep(args.sweep)
    except ValueError as exc:
        p.error(str(exc).replace("--merge ", ""))
    unknown = sorted({r["shape"] for r in payload["rows"]} - set(SHAPES))
    if unknown:
        p.error(f"{args.sweep}: shapes not in benchmarks.common.SHAPES: {', '.join(unknown)}")
    print(markdown_table(payload))
    print()
    found = checks(payload)
    for c in found:
        if c.met and args.missed:
            continue
        print(c.line())
    missed = sum(not c.met for c in found)
    print(f"# {len(found) - missed} of {len(found)} target checks met, {missed} missed")


if __name__ == "__main__":
    main()
