"""Check, without that GPU, that every kernel the Triton MoE launches fits another GPU's shared memory.

The configs are planned for a device's shared memory (``triton_config.smem_budget``), but the
plan is a model: the compiler adds barriers, layout conversions and the LoRA tiles. This tool
takes the model out of the loop. It dry-runs the real launcher (``fused_moe_triton``, and the
batched format's ``batched_moe_triton``) on meta tensors, with the config ``get_config`` gives
for the target part, records every kernel launch instead of running it, compiles each recorded
launch for the target architecture with its exact constexprs and options, and compares the
compiled kernel's shared memory with the part's opt-in limit per block. No GPU is needed:
Triton compiles for any ``sm_<arch>`` and bundles ``ptxas``.

On pre-Hopper parts (sm_70 to sm_89) and on ROCm (MI300X, gfx942) the meta tensors see no
TMA or dependent launches, as such a GPU does; for Hopper (``h200``) the dry run turns both
on, so the descriptors and the tuned H200 files are compiled as the H200 runs them. A launch
option the part's Triton backend does not know (``launch_pdl`` on ROCm) is reported too: it
would be a KeyError at launch there.

    python -m tools.smem_check                      # every part, every shape, LoRA or not
    python -m tools.smem_check --parts l40s --shapes qwen3-30b-a3b --tokens 1 4096
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import itertools
import json
import os
import sys
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from types import ModuleType
from typing import Any
from unittest import mock

from benchmarks.common import (
    LORA_RANK,
    LORA_SLOTS,
    SHAPES,
    MoEShape,
    add_shape_args,
    check_out_file,
    positive_int,
)


@dataclass(frozen=True)
class Part:
    """A GPU as the launcher sees it: tuned-file name, architecture, opt-in shared memory per
    block, SM (CU) count, and the Triton backend that compiles for it."""

    device_name: str
    arch: int | str
    max_shared_mem: int
    num_sms: int
    backend: str = "cuda"

    @property
    def target(self) -> Any:
        from triton.backends.compiler import GPUTarget

        return GPUTarget(self.backend, self.arch, 32 if self.backend == "cuda" else 64)

    @property
    def hopper(self) -> bool:
        """TMA descriptors and dependent launches (NVIDIA, compute capability 9 or newer)."""
        return self.backend == "cuda" and isinstance(self.arch, int) and self.arch >= 90


#: Opt-in shared memory per block as CUDA reports it (``cudaDevAttrMaxSharedMemoryPerBlockOptin``,
#: what Triton's ``max_shared_mem`` returns; CUDA programming guide, compute capability tables:
#: 7.0 96 KB, 7.5 64 KB, 8.0 163 KB, 8.6/8.9 99 KB, 9.0 227 KB), and the MI300X's 64 KB of
#: local data share per CU. The backends.yaml catalog lets ``triton`` run from capability 7.0
#: and on ROCm.
PARTS: dict[str, Part] = {
    "v100": Part("Tesla V100-SXM2-32GB", 70, 98304, 80),
    "t4": Part("Tesla T4", 75, 65536, 40),
    "a100": Part("NVIDIA A100-SXM4-80GB", 80, 166912, 108),
    "a10": Part("NVIDIA A10", 86, 101376, 72),
    "l40s": Part("NVIDIA L40S", 89, 101376, 142),
    "h200": Part("NVIDIA H200", 90, 232448, 132),
    "mi300x": Part("AMD Instinct MI300X", "gfx942", 65536, 304, backend="hip"),
}
TOKENS = (1, 4, 64, 1024, 4096)
#: Layer dtypes by short name (torch attribute names).
TORCH_DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}


@dataclass
class Launch:
    """One recorded kernel launch: the jit function, its positional and keyword arguments."""

    name: str
    fn: Any
    args: tuple[Any, ...]
    kwargs: dict[str, Any]


def part_limits(call: Call) -> dict[str, Any]:
    """What ``config_limits`` returns on the call's part (``get_config``'s keywords)."""
    part = PARTS[call.part]
    return {"device_name": part.device_name, "smem_limit": planned_smem(call),
            "num_sms": part.num_sms}  # fmt: skip


@contextlib.contextmanager
def as_on(call: Call) -> Iterator[None]:
    """Within the block, the launchers see the call's part for the meta tensors: its name,
    shared memory budget and SM count, and on Hopper or newer TMA and dependent launches (the
    device queries that find them on a GPU)."""
    from moe_policy.experts.triton import batched as batched_triton
    from moe_policy.experts.triton import fused_moe as triton_moe
    from moe_policy.experts.triton.device import DeviceLimits

    part, limits = PARTS[call.part], part_limits(call)
    hopper = part.hopper
    device = DeviceLimits(num_sms=part.num_sms, smem_limit=limits["smem_limit"],
                          device_name=part.device_name, tile_sms=part.num_sms, pdl=hopper,
                          tma=hopper)  # fmt: skip
    with contextlib.ExitStack() as stack:
        stack.enter_context(mock.patch.object(triton_moe, "device_limits", lambda d: device))
        stack.enter_context(mock.patch.object(batched_triton, "sm_count", lambda d: part.num_sms))
        stack.enter_context(mock.patch.object(batched_triton, "config_limits", lambda d: limits))
        yield


@dataclass(frozen=True)
class Call:
    """One layer call to dry-run: where, which layer, how many tokens, which format."""

    part: str
    shape: str
    tokens: int
    lora: bool = False
    fmt: str = "standard"
    dtype: str = "bf16"
    plan_smem: int | None = None  # plan configs for this much shared memory, not the budget


@dataclass
class Result:
    """One compiled launch of a call: its kernel and shared memory against the part's limit."""

    call: Call
    kernel: str
    shared: int
    limit: int
    config: dict[str, Any] = field(default_factory=dict)
    error: str | None = None  # the launch could not run there at all (LaunchOptionError)

    @property
    def fits(self) -> bool:
        return self.error is None and self.shared <= self.limit

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self.call), "kernel": self.kernel, "shared": self.shared,
                "limit": self.limit, "fits": self.fits, "config": self.config,
                "error": self.error}  # fmt: skip


def _kernel_modules() -> list[ModuleType]:
    from moe_policy.experts.triton import align
    from moe_policy.experts.triton import batched as batched_triton
    from moe_policy.experts.triton import fused_moe as triton_moe
    from moe_policy.experts.triton import lora as triton_lora

    return [align, triton_moe, triton_lora, batched_triton]


@contextlib.contextmanager
def recorded_launches() -> Iterator[list[Launch]]:
    """Within the block, ``kernel[grid](...)`` of the MoE modules' jit kernels records the
    launch instead of running it; the kernels are restored on exit."""
    from triton.runtime.jit import JITFunction

    log: list[Launch] = []

    class _Recorder:
        def __init__(self, name: str, fn: Any) -> None:
            self.name, self.fn = name, fn

        def __getitem__(self, grid: Any) -> Any:
            return lambda *args, **kwargs: log.append(Launch(self.name, self.fn, args, kwargs))

    saved: list[tuple[ModuleType, str, Any]] = []
    try:
        for mod in _kernel_modules():
            for name, obj in list(vars(mod).items()):
                if isinstance(obj, JITFunction) and name.endswith("_kernel"):
                    saved.append((mod, name, obj))
                    setattr(mod, name, _Recorder(name, obj))
        yield log
    finally:
        for mod, name, obj in saved:
            setattr(mod, name, obj)


def _meta_inputs(
    shape: MoEShape, t: int, lora: bool, lora_rows: tuple[int, ...] | None = None,
    dtype: str = "bf16",
) -> dict[str, Any]:  # fmt: skip
    """Meta tensors of one layer call in ``dtype``; the LoRA mapping is ``[t]`` or ``lora_rows``."""
    import torch

    from moe_policy.experts.lora import MoELoRAAdapters, MoELoRAContext

    e, h, i, k = shape.num_experts, shape.hidden, shape.inter, shape.top_k

    layer_dtype = getattr(torch, TORCH_DTYPES[dtype])

    def meta(*size: int, dtype: Any = layer_dtype) -> Any:
        return torch.empty(*size, dtype=dtype, device="meta")

    inputs = {
        "x": meta(t, h), "w13": meta(e, shape.n1, h), "w2": meta(e, h, i),
        "topk_weights": meta(t, k, dtype=torch.float32), "topk_ids": meta(t, k, dtype=torch.int32),
        "w13_bias": meta(e, shape.n1) if shape.has_bias else None,
        "w2_bias": meta(e, h) if shape.has_bias else None, "lora": None,
    }  # fmt: skip
    if lora:
        ad = MoELoRAAdapters.allocate(
            num_slots=LORA_SLOTS, num_experts=e, hidden_size=h, intermediate_size=i,
            max_rank=LORA_RANK, num_slices=2 if shape.gated else 1, dtype=layer_dtype,
            device="meta",
        )  # fmt: skip
        inputs["lora"] = MoELoRAContext(ad, meta(*(lora_rows or (t,)), dtype=torch.int32))
    return inputs


def planned_smem(call: Call) -> int:
    """Shared memory the configs plan for: the launcher's budget on the part, or the call's."""
    from moe_policy.experts.triton.config import smem_budget

    part = PARTS[call.part]
    return call.plan_smem if call.plan_smem is not None else smem_budget(part.max_shared_mem)


def dry_run_standard(call: Call) -> tuple[dict[str, Any], list[Launch]]:
    """The standard format's launches of ``call`` (its config from get_config for the part)."""
    from moe_policy.experts.triton.config import get_config
    from moe_policy.experts.triton.fused_moe import fused_moe_triton

    shape, t = SHAPES[call.shape], call.tokens
    inp = _meta_inputs(shape, t, call.lora, dtype=call.dtype)
    with as_on(call), recorded_launches() as log:
        fused_moe_triton(
            inp["x"], inp["w13"], inp["w2"], inp["topk_weights"], inp["topk_ids"],
            activation=shape.activation, gated=shape.gated, w13_bias=inp["w13_bias"],
            w2_bias=inp["w2_bias"], lora=inp["lora"],
        )  # fmt: skip
    # the config the launcher chose (the same call it makes)
    cfg = get_config(t, shape.num_experts, shape.top_k, shape.hidden, shape.inter, shape.gated,
                     elem_bytes=inp["x"].element_size(), **part_limits(call))  # fmt: skip
    return cfg.to_dict(), log


def specialize(p: Any, value: Any, backend: Any) -> tuple[str, Any, Any]:
    """(signature type, constexpr value, attribute string) of one runtime argument, by
    Triton's own launcher rules for ``backend`` (``native_specialize_impl``, what ``kernel[grid]``
    runs): None and integer 1 become constants, tensors are pointers of their dtype, TMA
    descriptors are typed by their box, ``"D"`` marks a 16-divisible value or address."""
    from triton._C.libtriton import native_specialize_impl

    specialize = not getattr(p, "do_not_specialize", False)
    align = not getattr(p, "do_not_specialize_on_alignment", False)
    try:
        ty, attr = native_specialize_impl(
            backend, value, getattr(p, "is_const", False), specialize, align
        )
    except TypeError as exc:
        raise TypeError(f"cannot specialize {p.name}={value!r}: {exc}") from exc
    return (ty, attr, None) if ty == "constexpr" else (ty, None, attr)


class LaunchOptionError(ValueError):
    """A launch passes an option the target's Triton backend does not know (a KeyError at
    launch on that GPU)."""


def compile_launch(launch: Launch, part: Part) -> Any:
    """Compile a recorded launch for ``part``; a CompiledKernel (``metadata.shared``). Raises
    LaunchOptionError when the part's backend would refuse one of the launch options."""
    import triton
    from triton.compiler import ASTSource
    from triton.compiler.compiler import make_backend

    fn = launch.fn
    kwargs = dict(launch.kwargs)
    names = [p.name for p in fn.params]
    options = {k: kwargs.pop(k) for k in list(kwargs) if k not in names}
    backend = make_backend(part.target)
    accepted = vars(backend.parse_options({}))
    rejected = sorted(set(options) - set(accepted))
    if rejected:
        raise LaunchOptionError(
            f"{launch.name}: Triton's {part.backend} backend rejects launch option(s) {rejected}"
        )
    values = dict(zip(names, launch.args, strict=False)) | kwargs
    sig: dict[str, str] = {}
    constexprs: dict[tuple[int, ...], Any] = {}
    attrs: dict[tuple[int, ...], Any] = {}
    for idx, p in enumerate(fn.params):
        value = values.get(p.name, p.default)
        if value is inspect.Parameter.empty:
            raise ValueError(f"{launch.name}: no value recorded for argument {p.name}")
        if p.is_constexpr:
            sig[p.name] = "constexpr"
            constexprs[(idx,)] = value
            continue
        ty, const, attr = specialize(p, value, backend)
        sig[p.name] = ty
        if ty == "constexpr":
            constexprs[(idx,)] = const
        elif attr:
            attrs[(idx,)] = backend.parse_attr(attr)
    src = ASTSource(fn, sig, constexprs=constexprs, attrs=attrs)
    return triton.compile(src, target=part.target, options=options)


def batched_rows(shape: MoEShape, t: int) -> int:
    """Rows per expert of the batched format for ``t`` tokens: twice the uniform mean (the
    busiest expert's share), at least 16, a power of two."""
    mean = -(-t * shape.top_k // shape.num_experts)
    return max(16, 1 << (2 * mean - 1).bit_length())


def dry_run_batched(call: Call) -> tuple[dict[str, Any], list[Launch]]:
    """The batched format's launches of ``call`` (``batched_rows`` rows per expert)."""
    import torch

    from moe_policy.experts.triton import batched as batched_triton

    shape = SHAPES[call.shape]
    m = batched_rows(shape, call.tokens)
    e, h = shape.num_experts, shape.hidden
    inp = _meta_inputs(shape, m, call.lora, lora_rows=(e, m), dtype=call.dtype)
    with as_on(call), recorded_launches() as log:
        batched_triton.batched_fused_experts(
            torch.empty(e, m, h, dtype=getattr(torch, TORCH_DTYPES[call.dtype]), device="meta"),
            torch.empty(e, dtype=torch.int32, device="meta"), inp["w13"], inp["w2"],
            activation=shape.activation, gated=shape.gated, w13_bias=inp["w13_bias"],
            w2_bias=inp["w2_bias"], lora=inp["lora"],
        )  # fmt: skip
    return {"rows_per_expert": m}, log


DRY_RUNS = {"standard": dry_run_standard, "batched": dry_run_batched}


def check(call: Call) -> list[Result]:
    """Every kernel of one layer call: compiled shared memory against the part's limit."""
    part = PARTS[call.part]
    info, launches = DRY_RUNS[call.fmt](call)
    out = []
    for launch in launches:
        try:
            shared = int(compile_launch(launch, part).metadata.shared)
        except LaunchOptionError as exc:
            out.append(Result(call, launch.name, 0, part.max_shared_mem, info, str(exc)))
            continue
        out.append(Result(call, launch.name, shared, part.max_shared_mem, info))
    return out


def _line(r: Result) -> str:
    c = r.call
    if r.error:
        return f"FAIL {c.part:5s} {c.shape:15s} T={c.tokens:<5d} {c.fmt:8s} {r.error}"
    return (f"{'ok  ' if r.fits else 'OVER'} {c.part:5s} {c.shape:15s} T={c.tokens:<5d} "
            f"{c.fmt:8s} {c.dtype:4s} {'lora' if c.lora else '    '} {r.kernel:22s} "
            f"{r.shared / 1024:6.1f} KB of {r.limit / 1024:.0f}")  # fmt: skip


def _triton_version() -> str:
    import triton

    return str(triton.__version__)


def summary(results: list[Result]) -> list[dict[str, Any]]:
    """Per part, dtype and format: launches, how many fit, and the largest one."""
    groups: dict[tuple[str, str, str], list[Result]] = {}
    for r in results:
        groups.setdefault((r.call.part, r.call.dtype, r.call.fmt), []).append(r)
    out = []
    for (part, dtype, fmt), rs in groups.items():
        top = max(rs, key=lambda r: r.shared)
        out.append({"part": part, "dtype": dtype, "fmt": fmt, "launches": len(rs),
                    "fit": sum(r.fits for r in rs), "limit": top.limit, "max_shared": top.shared,
                    "max_at": {**asdict(top.call), "kernel": top.kernel}})  # fmt: skip
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--parts", nargs="+", default=list(PARTS), choices=sorted(PARTS))
    add_shape_args(p, shapes=SHAPES, tokens=TOKENS)
    p.add_argument("--formats", nargs="+", default=list(DRY_RUNS), choices=sorted(DRY_RUNS))
    p.add_argument("--dtypes", nargs="+", default=["bf16"], choices=sorted(TORCH_DTYPES))
    p.add_argument("--no-lora", action="store_true", help="only calls without LoRA")
    p.add_argument("--plan-smem", type=positive_int, metavar="BYTES",
                   help="plan configs for this much shared memory instead of the part's budget "
                        "(e.g. 204800, Hopper's, to see what would not fit)")  # fmt: skip
    p.add_argument("--json", metavar="PATH", help="also write every result as JSON")
    p.add_argument("--summary-json", metavar="PATH",
                   help="write the per part/dtype/format summary as JSON")  # fmt: skip
    args = p.parse_args()
    for flag, path in (("--json", args.json), ("--summary-json", args.summary_json)):
        try:  # written after every compile: a path that cannot be written fails now
            if path:
                check_out_file(path)
        except ValueError as exc:
            p.error(f"{flag}: {exc}")
    if os.environ.get("TRITON_INTERPRET") == "1":
        sys.exit("smem_check compiles for a GPU target: unset TRITON_INTERPRET")
    calls = [
        Call(part, shape, t, lora, fmt, dtype, args.plan_smem)
        for part, shape, t, fmt, dtype, lora in itertools.product(
            args.parts, args.shapes, args.tokens, args.formats, args.dtypes,
            (False,) if args.no_lora else (False, True),
        )
    ]  # fmt: skip
    results: list[Result] = []
    for call in calls:
        for r in check(call):
            results.append(r)
            print(_line(r), flush=True)
    over = [r for r in results if not r.fits]
    for g in summary(results):
        at = g["max_at"]
        print(f"# {g['part']:5s} {g['dtype']:4s} {g['fmt']:8s} {g['fit']} of {g['launches']} "
              f"fit; largest {g['max_shared'] / 1024:.1f} KB of {g['limit'] / 1024:.0f} "
              f"({at['shape']} T={at['tokens']}{' lora' if at['lora'] else ''} {at['kernel']})")  # fmt: skip
    print(f"# {len(results) - len(over)} of {len(results)} launches fit")
    if args.json:
        with open(args.json, "w") as f:
            json.dump([r.to_dict() for r in results], f)
    if args.summary_json:
        with open(args.summary_json, "w") as f:
            json.dump({"argv": sys.argv[1:], "triton": _triton_version(),
                       "groups": summary(results)}, f, indent=1)  # fmt: skip
    sys.exit(1 if over else 0)


if __name__ == "__main__":
    main()
