"""``moe-policy tune``: tune the Triton fused-MoE tiles for one model on this GPU and write a
tuned file the kernels pick up at run time from ``MOE_POLICY_TUNED_CONFIG_DIR``.

Unlike ``tools.tune_triton`` in the source tree (one GEMM at a time), every candidate is timed
as what an engine runs: the whole layer captured in a CUDA graph, all candidates of a token
count replayed in interleaved rounds (``moe_policy.experts.triton.tuning``). ``--tp N`` tunes
the layer a tensor-parallel rank runs (intermediate size / N), ``--ep N`` the one an
expert-parallel rank runs (E / N experts, each token's k slots spread over the ranks: k / N
per rank, at least 1). Every input is checked before any GPU work: a bad one is one error line
naming its origin (exit 2). Needs the ``kernels`` extra (torch, Triton) and a CUDA GPU.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from moe_policy.errors import MoEPolicyError
from moe_policy.experts.triton.config import TUNED_DIR_ENV  # no torch, no Triton

if TYPE_CHECKING:
    from moe_policy.experts.triton.tuning.shapes import MoEShape


class TuneError(MoEPolicyError):
    """Bad input or a machine that cannot tune, named by its origin (exit 2)."""


def _positive_int(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {text!r}")
    return n


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register ``tune`` and its options."""
    from moe_policy.cli.parser import Parser

    p: Parser = subparsers.add_parser(
        "tune",
        help="tune the Triton kernels' tiles for one model on this GPU",
        description="Time candidate tile configs of one model's routed-experts layer as whole "
        "layers in CUDA graphs on this GPU and write the winners as a tuned file that the "
        f"Triton kernels read from ${TUNED_DIR_ENV}.",
    )
    p.add_argument("--model", required=True,
                   help="a Hugging Face config.json, model directory or bundled model name")  # fmt: skip
    p.add_argument("--tp", type=_positive_int, default=1, help="tensor-parallel ranks")
    p.add_argument("--ep", type=_positive_int, default=1, help="expert-parallel ranks")
    from moe_policy.experts.triton.tuning.search import TUNE_TOKENS  # no torch, no Triton

    p.add_argument("--tokens", nargs="+", type=_positive_int, default=list(TUNE_TOKENS),
                   help=f"token counts to tune (default: {' '.join(map(str, TUNE_TOKENS))})")  # fmt: skip
    p.add_argument("--lora", action="store_true",
                   help="time every candidate with LoRA too (rank 16, 4 adapters); the winner "
                        "is the fastest base + LoRA layer")  # fmt: skip
    p.add_argument("--out", help=f"directory of the tuned file (default: ${TUNED_DIR_ENV})")
    p.add_argument("--jobs", type=_positive_int, default=min(16, os.cpu_count() or 1),
                   help="compile workers")  # fmt: skip
    p.add_argument("--rounds", type=_positive_int, default=6, help="interleaved timing rounds")
    return p


def shape_from_model(spec: str) -> MoEShape:
    """The routed-expert layer of a Hugging Face ``config.json`` (a file, a model directory or
    a bundled model's name), named after the file; PolicyError naming the file and key when
    the config has no MoE facts."""
    from moe_policy.core.model import load_model

    return _shape_of(load_model(spec))


def _shape_of(facts: Any) -> MoEShape:
    """The routed-expert layer of loaded model facts."""
    from moe_policy.experts.triton.tuning.shapes import MoEShape

    path = Path(facts.path)
    name = path.parent.name if path.name == "config.json" else path.stem
    return MoEShape(name, int(facts.value("model.num_experts")),
                    int(facts.value("model.hidden_size")),
                    int(facts.value("model.intermediate_size")), int(facts.value("model.top_k")),
                    bool(facts.value("model.gated")), str(facts.value("model.activation")),
                    bool(facts.value("model.has_bias")))  # fmt: skip


def model_shape(spec: str, tp: int, ep: int) -> tuple[MoEShape, str]:
    """The layer one rank runs of the model ``spec``, and its quantization; PolicyError (naming
    the file and key) when the config has no MoE facts, TuneError when the file cannot be read,
    the split does not divide, or the kernels cannot run it."""
    from moe_policy.core.model import load_model
    from moe_policy.experts.triton.tuning.shapes import KERNEL_ACTIVATIONS

    try:
        facts = load_model(spec)
        shape, quant = _shape_of(facts), str(facts.value("model.quantization"))
    except OSError as exc:
        raise TuneError(f"cli:--model: {spec}: {exc.strerror or exc}") from None
    need = KERNEL_ACTIVATIONS.get(shape.activation, "missing")
    if need == "missing" or (need is not None and need != shape.gated):
        raise TuneError(f"cli:--model: {spec}: the Triton kernels do not run {shape.activation!r} "
                        f"experts with gated={shape.gated}")  # fmt: skip
    if quant != "none":
        raise TuneError(f"cli:--model: {spec}: the Triton kernels run bf16/fp16 experts; this model's "
                        f"are quantized ({quant})")  # fmt: skip
    if shape.inter % tp:
        raise TuneError(f"cli:--tp: {tp} does not divide the expert intermediate size "
                        f"{shape.inter}")  # fmt: skip
    if shape.num_experts % ep:
        raise TuneError(f"cli:--ep: {ep} does not divide the expert count {shape.num_experts}")
    e = shape.num_experts // ep
    k = max(1, min(e, round(shape.top_k / ep)))
    if e > 1024:
        raise TuneError(f"cli:--model: {spec}: {e} experts per rank; the kernels run at most 1024")
    name = shape.name + (f"-tp{tp}" if tp > 1 else "") + (f"-ep{ep}" if ep > 1 else "")
    return replace(shape, name=name, num_experts=e, top_k=k, inter=shape.inter // tp), quant


def writable_dir(path: str, origin: str) -> str:
    """``path`` created if missing and checked writable (a file is written and removed)."""
    from moe_policy.experts.triton.tuning.preflight import writable_dir as checked

    try:
        return checked(path)
    except ValueError as exc:
        raise TuneError(f"{origin}: {exc}") from None


def require_gpu() -> str:
    """The CUDA device's name; TuneError without torch or a GPU (tuning times the GPU it
    tunes for)."""
    from moe_policy.experts.triton.tuning.preflight import cuda_device_name

    try:
        return cuda_device_name("tuning times the kernels on the GPU they will run on")
    except ValueError as exc:
        raise TuneError(str(exc)) from None


def run(args: argparse.Namespace) -> int:
    """Check the inputs, tune, write the tuned file and the report, print the table."""
    shape, _ = model_shape(args.model, args.tp, args.ep)
    out = args.out or os.environ.get(TUNED_DIR_ENV, "").strip()
    if not out:
        raise TuneError(f"cli:--out: no directory: give --out DIR or set {TUNED_DIR_ENV}")
    origin = "cli:--out" if args.out else f"env:{TUNED_DIR_ENV}"
    out = writable_dir(out, origin)
    device = require_gpu()
    from moe_policy.experts.triton.tuning.report import (
        kept_configs,
        report_table,
        tuned_file_path,
        write_outputs,
    )
    from moe_policy.experts.triton.tuning.search import tune

    try:  # an earlier file's other token counts are kept; one that is not a tuned file stops it
        kept = set(kept_configs(tuned_file_path(shape, device, out))) - set(args.tokens)
    except ValueError as exc:
        raise TuneError(f"{origin}: {exc}; move it away or tune into another directory") from None
    for name in ("tune_report.json", "tune_report.png"):  # written after the tuning
        report = os.path.join(out, name)
        if os.path.exists(report) and not os.path.isfile(report):
            raise TuneError(f"{origin}: {report} is not a regular file; move it away or tune "
                            "into another directory")  # fmt: skip
    if kept:
        print(f"# keeping the file's entries for T={sorted(kept)}", flush=True)

    results = tune(shape, sorted(set(args.tokens)), args.lora, args.jobs, args.rounds)
    path = write_outputs(shape, device, results, out)
    print(report_table(results))
    gain = [r["heuristic_us"] / r["tuned_us"] for r in results]
    print(f"# wrote {path} (gain over the heuristic {min(gain) - 1:+.1%} to {max(gain) - 1:+.1%});"
          f" set {TUNED_DIR_ENV}={out} for the kernels to use it")  # fmt: skip
    sys.stdout.flush()
    return 0
