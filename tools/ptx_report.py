"""Compile the Triton fused-MoE GEMM for a GPU target on any machine and report its memory ops.

No GPU is needed: Triton compiles for ``--arch`` (default sm_90a, Hopper) and the bundled
``ptxas`` assembles. The report counts, per thread, the global loads and stores by width
(``ld.global.b16`` is a scalar 16-bit load, ``ld.global.v4.b32`` a 16-byte vector), the async
copies (``cp.async.cg`` 16 bytes, ``cp.async.bulk.tensor`` TMA) and the registers and spill bytes
``ptxas -v`` prints. Scalar loads in a tile's inner code are the smell this catches: LoRA
operands once loaded as scalars and cost up to 22 % of the LoRA layer.

Integer arguments are marked 16-divisible and unit strides constant, as Triton specializes them
at launch for contiguous bf16 tensors; the counts are what the device compiles, up to Triton
version differences (this machine's Triton may be newer than the GPU machine's).

    python -m tools.ptx_report --lora               # GEMM 1 and 2 of a 128-row prefill tile
    python -m tools.ptx_report --block-m 16 --block-n 64 --block-k 128 --naive --lora
    python -m tools.ptx_report --align-bins 1024 --block-m 16  # the alignment's tables
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import re
import subprocess
import sys
import tempfile
from collections import Counter
from typing import Any

#: Arguments never specialized (runtime sizes the kernels mark do_not_specialize, or may be odd).
_NOT_DIVISIBLE = {"numel", "num_blocks", "num_slots", "lora_rank", "num_experts", "num_tokens",
                  "n_cnt", "rank"}  # fmt: skip
#: Pointer arguments by element type (others are the layer dtype).
_INT_POINTERS = {"topk_ids_ptr", "sorted_ids_ptr", "expert_ids_ptr", "num_padded_ptr",
                 "block_rows_ptr", "lora_map_ptr", "lora_enabled_ptr", "cnt_ptr",
                 "sk_cnt_ptr"}  # fmt: skip
_FP32_POINTERS = {"lora_u_ptr", "topk_w_ptr", "sk_ws_ptr"}
#: Strides that are 1 for contiguous operands (Triton specializes an argument equal to 1).
_UNIT_STRIDES = {"stride_ak", "stride_bk", "stride_cn", "stride_ur", "stride_lbr", "stride_bias_n"}
_OPS = re.compile(
    r"\b(ld\.global[\w.:]*|st\.global[\w.:]*|cp\.async\.(?:cg|ca)[\w.:]*|cp\.async\.bulk\.tensor)"
)


def gemm_constexprs(
    *, gemm1: bool, lora: bool, block_m: int, block_n: int, block_k: int, tail_m: int = 0,
    gated: bool = True, naive: bool = False, top_k: int = 8, persistent: bool = False,
    stream_k: bool = False,
) -> dict[str, Any]:  # fmt: skip
    """The constexpr arguments ``fused_moe_triton`` passes for one GEMM (TMA weights, one-dot
    gated GEMM 1, TMA activations in GEMM 2, rank-16 LoRA with 4 slots)."""
    one_dot = gemm1 and gated
    return dict(
        A_ROW_DIV=top_k if gemm1 else 1, A_SORTED=not gemm1, A_TMA=not gemm1, B_TMA=True,
        C_SORTED=gemm1, C_ROW_DIV=1, TOP_K=top_k, GATED=gemm1 and gated, ACT=1 if gemm1 else 0,
        ALPHA=1.702, LIMIT=7.0, WEIGHT_POS=0 if gemm1 else 2, HAS_BIAS=False, HAS_LORA=lora,
        NAIVE=naive, ONE_DOT=one_dot, EVEN_K=True, BLOCK_M=block_m, BLOCK_N=block_n,
        BLOCK_K=block_k, BLOCK_R=16, U_SPLIT=1, RANK_MASK=False, GROUP_M=1 if block_m <= 32 else 8,
        TAIL_M=tail_m, SUM_K=0, ZERO_CNT=0, PDL=False, PDL_LATE=False, TAIL_N=0, TRIGGER=False,
        LORA_B_AHEAD=lora, PERSISTENT=persistent, STREAM_K=stream_k,
    )  # fmt: skip


def _compile(
    kernel: Any, const: dict[str, Any], types: dict[str, str], *, num_warps: int,
    num_stages: int, arch: int, dtype: str,
) -> Any:  # fmt: skip
    """Compile a jit kernel for ``sm_<arch>``: ``const`` are its constexprs, ``types`` the
    non-default argument types; other pointers are ``dtype``, other arguments i32. Pointers and
    integers outside ``_NOT_DIVISIBLE`` count as 16-divisible, as Triton specializes them."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    params = list(inspect.signature(kernel.fn).parameters)
    missing = set(const) - set(params)
    if missing:
        raise ValueError(f"not arguments of {kernel.fn.__name__}: {sorted(missing)}")
    sig = {
        p: "constexpr" if p in const else types.get(p, f"*{dtype}" if p.endswith("_ptr") else "i32")
        for p in params
    }  # fmt: skip
    attrs = {
        (params.index(p),): [["tt.divisibility", 16]]
        for p, t in sig.items()
        if t.startswith("*") or (t == "i32" and p not in _NOT_DIVISIBLE)
    }
    src = ASTSource(
        kernel, sig, constexprs={(params.index(k),): v for k, v in const.items()}, attrs=attrs
    )
    options = {"num_warps": num_warps, "num_stages": num_stages}
    return triton.compile(src, target=GPUTarget("cuda", arch, 32), options=options)


def compile_gemm(
    constexprs: dict[str, Any], *, num_warps: int, num_stages: int, arch: int = 90,
    dtype: str = "bf16",
) -> Any:  # fmt: skip
    """Compile ``moe_gemm_kernel`` for ``sm_<arch>`` with these constexprs; a CompiledKernel."""
    from moe_policy.experts.triton.gemm import moe_gemm_kernel

    const = {**constexprs, **{s: 1 for s in _UNIT_STRIDES}}
    types = {p: "*i32" for p in _INT_POINTERS} | {p: "*fp32" for p in _FP32_POINTERS}
    b_cols = 2 * const["BLOCK_N"] if const["GATED"] and const["ONE_DOT"] else const["BLOCK_N"]
    for desc, on, rows in (("a_desc", const["A_TMA"], const["BLOCK_M"]),
                           ("b_desc", const["B_TMA"], b_cols)):  # fmt: skip
        if on:
            types[desc] = f"tensordesc<{dtype}[{rows}, {const['BLOCK_K']}]>"
        else:
            const[desc] = None
    return _compile(moe_gemm_kernel, const, types, num_warps=num_warps,
                    num_stages=num_stages, arch=arch, dtype=dtype)  # fmt: skip


def compile_shrink(
    *, block_m: int = 128, num_slices: int = 2, arch: int = 90, dtype: str = "bf16"
) -> Any:
    """Compile ``lora_shrink_kernel`` (rank 16, 4 slots: 64 slot-expanded columns, as
    ``lora_shrink`` launches it for x) for ``sm_<arch>``; a CompiledKernel."""
    from moe_policy.experts.triton.lora import lora_shrink_kernel

    const = dict(
        A_ROW_DIV=8, A_SORTED=False, TOP_K=8, NUM_SLICES=num_slices, NAIVE=False,
        BLOCK_M=block_m, BLOCK_R=16, LR_BLOCK=64, BLOCK_K=64 if block_m > 64 else 128,
        K_STEPS=32, RANK_MASK=False, PDL=False, TRIGGER=False, stride_ak=1, stride_lak=1,
        stride_ur=1,
    )  # fmt: skip
    types = {p: "*i32" for p in _INT_POINTERS} | {"u_ptr": "*fp32"}
    return _compile(lora_shrink_kernel, const, types, num_warps=4 if block_m <= 64 else 8,
                    num_stages=3, arch=arch, dtype=dtype)  # fmt: skip


def compile_align(*, num_bins: int, block_m: int, arch: int = 90) -> dict[str, Any]:
    """Compile the multi-program alignment kernels that write the block tables, as
    ``moe_align`` launches them for ``num_bins`` bins (the one-launch kernel only up to its
    bin limit), for ``sm_<arch>``; CompiledKernels by name. Their [bins, columns] sentinel
    tiles are what spills registers when too wide."""
    from moe_policy.experts.triton import align

    ints = {p: "*i32" for p in ("counts_ptr", "cursor_ptr", "topk_ids_ptr", *_INT_POINTERS)}
    const = dict(BLOCK_M=block_m, NUM_BINS=num_bins, BLOCK_CHUNK=64,
                 SENT_COLS=align.sentinel_cols(num_bins), CURSOR_STEP=1)  # fmt: skip
    kernels = {"align_offsets": _compile(align.align_offsets_kernel, {**const, "SUB": 1}, ints,
                                         num_warps=4, num_stages=1, arch=arch, dtype="i32")}  # fmt: skip
    if num_bins <= align.ONE_PASS_MAX_BINS:
        kernels["align_one_pass"] = _compile(
            align.align_one_pass_kernel,
            {**const, "TOP_K": 8, "CHUNK": align.PAIRS_PER_PROGRAM}, ints, num_warps=4,
            num_stages=1, arch=arch, dtype="i32",
        )  # fmt: skip
    return kernels


def memory_ops(ptx: str) -> Counter[str]:
    """Global loads/stores by width and async copies, per thread, in the PTX text."""
    return Counter(_OPS.findall(ptx))


def loop_count(ttgir: str) -> int:
    """``scf.for`` loops in the TTGIR. A persistent GEMM whose tile loop flattened with its K
    loop has two (the pipelined loop and the copy Triton keeps for an empty K loop); one whose
    tile loop did not flatten has three or more (checked on sm_90a, Triton 3.9: an expand slot
    loop with a runtime bound keeps the persistent LoRA GEMM at three)."""
    return len(re.findall(r"\bscf\.for\b", ttgir))


def scalar_global_loads(ops: Counter[str]) -> int:
    """Global loads narrower than a vector (``ld.global.b16``, ``.b32``, ``.u16`` ...)."""
    return sum(n for op, n in ops.items() if op.startswith("ld.global") and ".v" not in op)


def ptxas_usage(ptx: str, arch: int = 90) -> tuple[int, int]:
    """(registers, spill store bytes) from ``ptxas -v`` on ``ptx`` (for ``sm_<arch>``, with
    the ``a`` suffix from sm_90 on, as Triton compiles: there is no ``sm_80a``)."""
    from triton.backends.nvidia.compiler import get_ptxas, sm_arch_from_capability

    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "k.ptx")
        with open(src, "w") as f:
            f.write(ptx)
        out = subprocess.run(
            [get_ptxas(arch).path, "-v", f"-arch={sm_arch_from_capability(arch)}", src, "-o",
             src + ".cubin"],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
    regs = re.search(r"Used (\d+) registers", out.stderr)
    spill = re.search(r"(\d+) bytes spill stores", out.stderr)
    return (int(regs.group(1)) if regs else -1, int(spill.group(1)) if spill else 0)


def report(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """Per kernel: memory ops, registers and spill bytes."""
    kernels: dict[str, Any] = {}
    if args.align_bins:
        kernels = compile_align(num_bins=args.align_bins, block_m=args.block_m, arch=args.arch)
    elif args.lora:
        kernels["shrink"] = compile_shrink(block_m=args.block_m, arch=args.arch)
    persistent = args.persistent or args.stream_k
    for gemm1, bn in () if args.align_bins else ((True, args.block_n), (False, args.block_n2)):
        c = gemm_constexprs(gemm1=gemm1, lora=args.lora, block_m=args.block_m, block_n=bn,
                            block_k=args.block_k,
                            tail_m=0 if args.naive or persistent else args.tail_m,
                            naive=args.naive, persistent=persistent,
                            stream_k=args.stream_k)  # fmt: skip
        name = "gemm1" if gemm1 else "gemm2"
        kernels[name] = compile_gemm(
            c, num_warps=args.warps, num_stages=args.stages, arch=args.arch
        )
    out = {}
    for name, k in kernels.items():
        regs, spill = ptxas_usage(k.asm["ptx"], args.arch)
        out[name] = {"ops": dict(memory_ops(k.asm["ptx"])), "registers": regs,
                     "spill_bytes": spill, "loops": loop_count(k.asm["ttgir"])}  # fmt: skip
    return out


#: Compute capabilities ``--arch`` compiles for (bf16 MMAs need sm_80; LLVM aborts the whole
#: process on an architecture it does not know).
ARCHS = (80, 86, 87, 89, 90, 100, 103, 110, 120, 121)
#: ``--align-bins``: powers of two up to the bins of 1,024 experts (``moe_align`` launches
#: ``next_power_of_2(experts + 1)`` bins).
MAX_ALIGN_BINS = 2048


def tile_problem(args: argparse.Namespace) -> str | None:
    """What makes the flags no tile the kernels launch (the checks a tuned config gets,
    ``MoEConfig``), naming the flag; None when they are one."""
    from moe_policy.experts.triton.config import GemmConfig, MoEConfig

    if args.arch not in ARCHS:
        return f"--arch: one of {', '.join(map(str, ARCHS))}, got {args.arch}"
    if args.align_bins:
        b = args.align_bins
        if not 2 <= b <= MAX_ALIGN_BINS or b & (b - 1):
            return f"--align-bins: a power of two from 2 to {MAX_ALIGN_BINS}, got {b}"
    persistent = args.persistent or args.stream_k
    tail = 0 if args.naive or persistent or args.align_bins else args.tail_m
    g = GemmConfig(16, 16)
    for flag, make in (
        ("--block-n", lambda: GemmConfig(args.block_n, 16)),
        ("--block-n2", lambda: GemmConfig(args.block_n2, 16)),
        ("--block-k", lambda: GemmConfig(16, args.block_k)),
        ("--warps", lambda: GemmConfig(16, 16, num_warps=args.warps)),
        ("--stages", lambda: GemmConfig(16, 16, num_stages=args.stages)),
        ("--block-m", lambda: MoEConfig(args.block_m, g, g)),
        ("--tail-m", lambda: MoEConfig(args.block_m, g, g, tail_m=tail)),
    ):
        try:
            make()
        except ValueError as exc:
            return f"{flag}: {exc}"
    return None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--lora", action="store_true", help="with LoRA (and report the x shrink)")
    p.add_argument("--naive", action="store_true", help="decode: one pair per block")
    p.add_argument("--persistent", action="store_true", help="persistent GEMMs (tail tiles off)")
    p.add_argument("--stream-k", action="store_true", help="persistent GEMMs with stream-K tails")
    p.add_argument("--block-m", type=int, default=128)
    p.add_argument("--block-n", type=int, default=128, help="GEMM 1 activation columns")
    p.add_argument("--block-n2", type=int, default=256, help="GEMM 2 columns")
    p.add_argument("--block-k", type=int, default=64)
    p.add_argument("--tail-m", type=int, default=64)
    p.add_argument("--warps", type=int, default=8)
    p.add_argument("--stages", type=int, default=4)
    p.add_argument("--arch", type=int, default=90,
                   help=f"compute capability to compile for: one of {', '.join(map(str, ARCHS))}")  # fmt: skip
    p.add_argument(
        "--align-bins",
        type=int,
        default=0,
        metavar="BINS",
        help="report the alignment's block-table kernels for this many bins instead",
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    args = p.parse_args()
    problem = tile_problem(args)
    if problem:
        p.error(problem)
    if os.environ.get("TRITON_INTERPRET") == "1":
        sys.exit("ptx_report compiles for a GPU target: unset TRITON_INTERPRET")
    rep = report(args)
    if args.json:
        print(json.dumps(rep))
        return
    for name, r in rep.items():
        ops = Counter(r["ops"])
        print(f"{name}: {r['registers']} registers, {r['spill_bytes']} B spilled, "
              f"{scalar_global_loads(ops)} scalar global loads, {r['loops']} loops")  # fmt: skip
        for op, n in sorted(ops.items()):
            print(f"  {n:4d}  {op}")


if __name__ == "__main__":
    main()
