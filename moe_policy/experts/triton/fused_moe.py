"""Triton fused MoE, standard ``[T, H]`` format, with optional multi-adapter LoRA: the
launcher (``fused_moe_triton``: check the inputs, plan, run the plan) and ``TritonExperts``.

Math, per token ``t`` and routed slot ``j`` (pair ``i = t*k + j``, expert ``e``, weight ``w``)::

    h      = W13[e] x[t] + dLoRA13            (x w + ... when the weight is on the input)
    a_i    = act(h + b13[e])                  GEMM 1, activation fused in its epilogue
    y_i    = w * (W2[e] a_i + b2[e] + dLoRA2) GEMM 2, router weight fused in its epilogue
    out[t] = sum_j y_{t*k+j}                  top-k sum (deterministic, fixed order)

Pipeline: ``moe_align`` (pairs grouped by expert, padded to BLOCK_M; skipped for tiny batches,
where block ``b`` holds pair ``b`` alone) -> [LoRA shrink of x] -> GEMM 1 + activation
(+ LoRA expand) -> [LoRA shrink of a] -> GEMM 2 + bias + weight (+ LoRA expand) -> top-k sum
(skipped when k = 1: GEMM 2 then writes the output; at decode without LoRA GEMM 2's last pair
of each token and N tile writes the sum). The kernels are in ``gemm.py``; what runs, with
which tiles and options, is the call's :class:`~moe_policy.experts.triton.launch.LaunchPlan`.

Weight layout expected by the kernels (``TritonExperts.convert_weights`` produces it from the
common layout): gated ``w13 [E, 2I, H]`` interleaved, gate of column ``n`` at row ``2n`` and up
at ``2n + 1`` (``swigluoai``'s own layout; the ``[gate; up]`` layout of the other gated
activations, ``swiglustep`` included, is interleaved), or ``[E, I, H]`` non-gated;
``w2 [E, H, I]``; biases ``[E, N1]`` (interleaved like w13) and ``[E, H]``. A gated GEMM-1
program reads the gate and the up rows of the same columns (one ``2 BLOCK_N`` wide dot, split
into even and odd columns, or two dots), so the activation is applied in registers and only
``[numel, I]`` is written, in the alignment's expert-sorted order (``block_rows``), so GEMM 2
and the LoRA shrink read contiguous rows.

Operand loads: pointers, or on Hopper and newer TMA descriptors when the tile config asks
(``GemmConfig.tma``) and rows are 16-byte aligned: the weights viewed as ``[E*N_B, K]`` (a box
may run into the next expert's rows; those columns are masked on store) and, in GEMM 2, the
sorted activation (rows past the block's expert are computed and not stored).

Dependent launches (Hopper+; ``MoEConfig.pdl``, and every LoRA call): every kernel after the
call's first starts while its predecessor drains and waits on it (``gdc_wait``) before it
reads; a LoRA shrink waits, then lets the next GEMM launch, and that GEMM streams its weights
and waits only before the LoRA expand; a decode GEMM 1 may let GEMM 2 launch at its start
(``MoEConfig.trigger``), so GEMM 2's programs take SMs it leaves free. Every program of a
kernel waits, so each kernel ends after its predecessor and the chain stays ordered.

Persistent GEMMs (``MoEConfig.persistent``, aligned batches without LoRA): one program per SM
walks the tiles ``pid, pid + P, ...``; Triton flattens the tile loop and the K loop into one
software-pipelined loop, so the next tile's loads are in flight during this tile's epilogue
(no tail tiles there); a narrow last N tile runs in a second loop, one per block. A last round
that fills at most half the programs is split along K (stream-K) where the partial tiles fit
the memory budget and the alignment can be stable (few experts): long-K tiles otherwise leave
most SMs idle for a whole tile.

Limits: bf16/fp16/fp32 activations and weights of one dtype; ``E <= 1024``; no host
synchronisation (grids come from static bounds, empty blocks exit early), so ``apply`` can be
captured in a CUDA graph. Workspace: ``[T*k, I]`` + ``[T*k, H]`` in the compute dtype (the
second is skipped when k = 1). The alignment's int32 tables and, with LoRA, the fp32 shrink
outputs (``[S, T*k, R]`` and ``[T*k, R]``, times the split-K parts, at most 8, when fewer than
``launch.SHRINK_MIN_PROGRAMS`` blocks exist) are carved out of the output and the ``[T*k, H]``
buffer while those are idle (``workspace.Workspace``); only what does not fit, or everything
when k = 1, is allocated on its own. Stream-K tails add one fp32 tile per SM and a counter each.
"""

from __future__ import annotations

from typing import Any

import torch
import triton

from moe_policy.experts.base import (
    ExpertsConfig,
    FusedMoEExperts,
    check_common_layout,
    check_devices,
    contiguous_layout,
)
from moe_policy.experts.lora import MoELoRAContext, check_lora
from moe_policy.experts.triton.align import moe_align
from moe_policy.experts.triton.config import MoEConfig
from moe_policy.experts.triton.device import (
    device_limits,
    pdl_launch,
    tma_layout,
    triton_runtime_available,
)
from moe_policy.experts.triton.gemm import moe_gemm_kernel, moe_sum_kernel
from moe_policy.experts.triton.jit import (
    KERNEL_GATED_ACTIVATIONS,
    KERNEL_NON_GATED_ACTIVATIONS,
)
from moe_policy.experts.triton.launch import GemmLaunch, LaunchPlan, MoEProblem, cached_plan
from moe_policy.experts.triton.lora import MAX_RANK, lora_shrink
from moe_policy.experts.triton.workspace import Workspace

_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def _check(cond: bool, msg: str) -> None:
    if not cond:
        raise ValueError(msg)


def _check_lora(lora: MoELoRAContext, x: torch.Tensor, e: int, i: int, gated: bool) -> None:
    check_lora(lora, x, e, i, gated)
    ad = lora.adapters
    _check(ad.max_rank <= MAX_RANK, f"LoRA max rank {ad.max_rank} exceeds {MAX_RANK}")
    m = lora.token_lora_mapping
    _check(
        m.dtype == torch.int32 and m.is_contiguous(),
        f"token_lora_mapping must be contiguous int32 [T={x.shape[0]}], got shape "
        f"{tuple(m.shape)} dtype {m.dtype} strides {m.stride()}",
    )
    en = ad.enabled
    _check(
        en.dtype == torch.int32 and en.is_contiguous(),  # the kernels read enabled[slot]
        f"enabled must be contiguous int32 [L={ad.num_slots}], got shape {tuple(en.shape)} "
        f"dtype {en.dtype} strides {en.stride()}",
    )


def fused_moe_triton(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    *,
    activation: str = "silu",
    gated: bool = True,
    w13_bias: torch.Tensor | None = None,
    w2_bias: torch.Tensor | None = None,
    apply_router_weight_on_input: bool = False,
    lora: MoELoRAContext | None = None,
    swiglu_alpha: float = 1.702,
    swiglu_limit: float = 7.0,
    config: MoEConfig | None = None,
    naive: bool | None = None,
    plan: LaunchPlan | None = None,
) -> torch.Tensor:
    """Fused MoE on ``x`` [T, H]; gated w13 interleaved (gate even rows); returns [T, H].

    ``config``: the tile config (default: the tuned file or the heuristic for the device);
    ``naive``: one pair per block, no alignment (default: for decode batches); ``plan``: run
    this plan instead of planning (one made for this call's problem, ``launch.plan_launch``;
    ``config`` and ``naive`` are then not used)."""
    # check shapes, dtypes and strides
    _check(x.dim() == 2 and w13.dim() == 3 and w2.dim() == 3,
           f"expected x [T, H], w13 [E, N1, H], w2 [E, H, I]; got x {tuple(x.shape)}, "
           f"w13 {tuple(w13.shape)}, w2 {tuple(w2.shape)}")  # fmt: skip
    t, h = x.shape
    e, n1, h13 = w13.shape
    i = w2.shape[2]
    want_n1 = 2 * i if gated else i
    _check(
        h13 == h and n1 == want_n1 and tuple(w2.shape[:2]) == (e, h),
        f"shape mismatch: x {tuple(x.shape)}, w13 {tuple(w13.shape)} (want [E, {want_n1}, {h}]), "
        f"w2 {tuple(w2.shape)} (want [{e}, {h}, I])",
    )
    _check(
        x.dtype in _DTYPES and w13.dtype == x.dtype and w2.dtype == x.dtype,
        f"x, w13, w2 must share one of {_DTYPES}; got {x.dtype}, {w13.dtype}, {w2.dtype}",
    )
    _check(x.stride(1) == 1, f"x must have unit stride along H, got strides {x.stride()}")
    _check(
        topk_ids.dim() == 2 and topk_ids.shape == topk_weights.shape and topk_ids.shape[0] == t
        and topk_ids.dtype in (torch.int32, torch.int64) and topk_weights.is_floating_point()
        and topk_ids.is_contiguous() and topk_weights.is_contiguous(),
        f"topk_ids/topk_weights must be contiguous [T={t}, k] int and float; got "
        f"{tuple(topk_ids.shape)} {topk_ids.dtype} strides {topk_ids.stride()}, "
        f"{tuple(topk_weights.shape)} {topk_weights.dtype} strides {topk_weights.stride()}",
    )  # fmt: skip
    _check(0 < e <= 1024, f"1 to 1024 experts are supported, got {e}")
    _check(h > 0 and i > 0, f"hidden and intermediate sizes must be positive, got H={h}, I={i}")
    check_devices(x, w13=w13, w2=w2, topk_weights=topk_weights, topk_ids=topk_ids,
                  w13_bias=w13_bias, w2_bias=w2_bias)  # fmt: skip
    _check(
        activation in (KERNEL_GATED_ACTIVATIONS if gated else KERNEL_NON_GATED_ACTIVATIONS),
        f"activation {activation!r} with gated={gated} is not supported",
    )
    if w13_bias is not None or w2_bias is not None:
        _check(
            w13_bias is not None and w2_bias is not None
            and tuple(w13_bias.shape) == (e, n1) and tuple(w2_bias.shape) == (e, h),
            f"biases must both be given as [E, N1]=[{e}, {n1}] and [E, H]=[{e}, {h}]; got "
            f"{None if w13_bias is None else tuple(w13_bias.shape)}, "
            f"{None if w2_bias is None else tuple(w2_bias.shape)}",
        )  # fmt: skip
    if lora is not None:
        _check_lora(lora, x, e, i, gated)
        if lora.adapters.num_slots == 0 or lora.adapters.max_rank == 0:
            lora = None  # no slot or rank 0: every delta is zero (and B at slot -1 never read)
    lora_shape = (lora.adapters.num_slots, lora.adapters.max_rank) if lora is not None else (0, 0)
    problem = MoEProblem(
        t, topk_ids.shape[1], e, h, i, gated, activation, x.element_size(),
        apply_router_weight_on_input, w13_bias is not None, *lora_shape,
        swiglu_alpha, swiglu_limit,
    )  # fmt: skip
    if plan is None:
        plan = cached_plan(problem, device_limits(x.device), config, naive)
    if plan.problem != problem:
        raise ValueError(f"the plan is for {plan.problem}, not this call's {problem}")
    return launch_plan(plan, x, w13, w2, topk_weights, topk_ids, w13_bias, w2_bias, lora)


def launch_plan(
    plan: LaunchPlan,
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    w13_bias: torch.Tensor | None = None,
    w2_bias: torch.Tensor | None = None,
    lora: MoELoRAContext | None = None,
) -> torch.Tensor:
    """Run ``plan`` on tensors of its problem (``fused_moe_triton`` checked them); returns the
    layer output [T, H]. Decides only what the tensors tell: whether TMA can describe them."""
    p = plan.problem
    t, k, e, h, i = p.num_tokens, p.top_k, p.num_experts, p.hidden, p.inter
    numel = p.numel
    out = (
        torch.empty(t, h, dtype=x.dtype, device=x.device)
        if k > 1
        else torch.zeros(t, h, dtype=x.dtype, device=x.device)
    )
    if numel == 0:
        return out

    # scratch: with k > 1 the output is written only by the last kernel (the top-k sum), so the
    # routing tables and the w2 LoRA shrink output live in it until then, and GEMM 2's output
    # buffer (written by GEMM 2) holds the w13 LoRA shrink output, read by GEMM 1 only; new
    # tensors where they do not fit
    direct = p.direct
    c2 = out if direct else torch.empty(numel, h, dtype=x.dtype, device=x.device)
    work = Workspace(None if direct else out, x.device)
    work13 = Workspace(None if direct else c2, x.device)

    # routing: pairs aligned by expert, or one pair per block
    if plan.naive:
        route = (topk_weights, topk_ids, topk_ids, topk_ids, topk_ids, topk_ids)  # placeholders
    else:
        order = (lora.token_lora_mapping, lora.adapters.enabled) if plan.adapter_order else None
        r = moe_align(topk_ids, e, plan.block_m, alloc=work.take, adapter_order=order,
                      stable=plan.stable_alignment)  # type: ignore[union-attr]  # fmt: skip
        route = (topk_weights, topk_ids, r.sorted_ids, r.expert_ids, r.num_padded, r.block_rows)
    sum_args = None
    if plan.sum_counters is not None:
        n_cnt, words, cnt_step = plan.sum_counters
        sum_args = (out, out.view(torch.int32), t, n_cnt, out.stride(0), words, cnt_step)

    # LoRA: shrink of x for every w13 slice
    if lora is not None:
        ad = lora.adapters
        lora_args = (lora.token_lora_mapping, ad.enabled, ad.num_slots, ad.max_rank)
        shrink_args = dict(
            topk_ids=topk_ids, sorted_ids=route[2], expert_ids=route[3], num_padded=route[4],
            block_rows=route[5], lora_map=lora_args[0], lora_enabled=lora_args[1],
            num_blocks=plan.num_blocks, block_m=plan.block_m, naive=plan.naive,
            split_k=plan.shrink_split, smem_limit=plan.smem_limit,
        )  # fmt: skip
        u13 = lora_shrink(x, ad.w13_a, a_row_div=k, alloc=work13.take, **plan.shrink1,
                          **shrink_args)  # type: ignore[arg-type]  # fmt: skip
        lb13 = ad.w13_b
    else:
        lora_args = (topk_ids, topk_ids, 0, 1)
        u13 = lb13 = x

    # GEMM 1 + activation -> act [numel, I], rows in expert-sorted order
    act_out = torch.empty(numel, i, dtype=x.dtype, device=x.device)
    g1 = plan.gemm1
    b1_desc = weight_descriptor(w13, g1)
    sk = stream_k_buffers(plan.stream_k_elems, plan.num_sms, x.device) if plan.stream_k else None
    common = dict(route=route, lora_args=lora_args, numel=numel, num_experts=e, sk=sk,
                  num_blocks=plan.num_blocks, sum_args=sum_args)  # fmt: skip
    _launch_gemm(x, w13, act_out, None, b1_desc, w13_bias, u13, lb13, g1, **common)

    # LoRA: shrink of the activation for w2
    if lora is not None:
        u2 = lora_shrink(act_out, lora.adapters.w2_a.unsqueeze(0), a_sorted=True, alloc=work.take,
                         **plan.shrink2, **shrink_args)  # type: ignore[arg-type]  # fmt: skip
        lb2 = lora.adapters.w2_b.unsqueeze(0)
    else:
        u2 = lb2 = x

    # GEMM 2 + bias + router weight -> [numel, H] by pair, or the output directly when k == 1
    g2 = plan.gemm2
    b2_desc = weight_descriptor(w2, g2)
    a2_tma = g2.a_tma and b2_desc is not None and tma_layout(act_out)
    a2_desc = _descriptor(act_out, plan.block_m, g2) if a2_tma else None
    _launch_gemm(act_out, w2, c2, a2_desc, b2_desc, w2_bias, u2, lb2, g2, **common)
    if plan.sum_block_h is None:
        return out

    # top-k sum in slot order
    block_h = plan.sum_block_h
    c3 = c2.view(t, k, h)
    moe_sum_kernel[(t, triton.cdiv(h, block_h))](
        c3, topk_ids, out, h, e,
        c3.stride(0), c3.stride(1), c3.stride(2), out.stride(0), out.stride(1),
        TOP_K=k, BLOCK_H=block_h, PDL=plan.pdl, num_warps=4, **pdl_launch(plan.pdl),
    )  # fmt: skip
    return out


def _launch_gemm(
    a: torch.Tensor,
    w: torch.Tensor,
    c: torch.Tensor,
    a_desc: Any,
    b_desc: Any,
    bias: torch.Tensor | None,
    u: torch.Tensor,
    lb: torch.Tensor,
    g: GemmLaunch,
    *,
    route: tuple[torch.Tensor, ...],
    lora_args: tuple[torch.Tensor, torch.Tensor, int, int],
    numel: int,
    num_experts: int,
    num_blocks: int,
    sum_args: tuple[Any, ...] | None,
    sk: tuple[torch.Tensor, torch.Tensor] | None,
) -> None:
    """One grouped GEMM: ``c = epilogue(a @ w[e]^T)`` over the aligned blocks (see the kernel)."""
    lmap, len_, slots, rank = lora_args
    has_lora = g.constexprs["HAS_LORA"]
    sum_out, cnt, num_tokens, n_cnt, stride_st, stride_cnt_t, cnt_step = sum_args or (
        c, route[1], 0, 0, 0, 0, 0,
    )  # fmt: skip
    moe_gemm_kernel[(g.grid,)](
        a, w, c, a_desc, b_desc, bias if bias is not None else a, *route, u, lb, lmap, len_,
        sum_out, cnt, *(sk or (c, cnt)),
        g.n, g.k, numel, num_experts, num_blocks, slots, rank, num_tokens, n_cnt,
        a.stride(0), a.stride(1), w.stride(0), w.stride(1), w.stride(2), c.stride(0), c.stride(1),
        *(bias.stride() if bias is not None else (0, 0)),
        *(u.stride() if has_lora else (0, 0, 0, 0)),
        *(lb.stride() if has_lora else (0, 0, 0, 0, 0)), stride_st, stride_cnt_t, cnt_step,
        A_TMA=a_desc is not None, B_TMA=b_desc is not None,
        U_SPLIT=u.shape[0] if has_lora else 1,
        num_warps=g.tile.num_warps, num_stages=g.tile.num_stages, **pdl_launch(g.pdl),
        **g.constexprs,
    )  # fmt: skip


def stream_k_buffers(
    elems: int, programs: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Partial tiles (uninitialised) and zeroed arrival counters for stream-K tails."""
    return (
        torch.empty(elems, dtype=torch.float32, device=device),
        torch.zeros(programs, dtype=torch.int32, device=device),
    )


def _descriptor(t2d: torch.Tensor, rows: int, g: GemmLaunch) -> Any:
    """TMA descriptor of a 2-D ``[rows_total, K]`` tensor with box ``[rows, BLOCK_K]``."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    return TensorDescriptor.from_tensor(t2d, [rows, g.tile.block_k])


def weight_descriptor(w: torch.Tensor, g: GemmLaunch) -> Any:
    """Descriptor of ``w`` [E, N_B, K] viewed as [E*N_B, K] where the plan asks and TMA can
    describe the tensor; None (pointer loads) otherwise."""
    if not g.b_tma or not w.is_contiguous() or not tma_layout(w):
        return None
    return _descriptor(w.view(-1, w.shape[-1]), g.b_rows, g)


def _interleave_rows(w: torch.Tensor) -> torch.Tensor:
    """[gate; up] rows along dim 1 -> gate at even rows, up at odd rows (a new tensor)."""
    e, n1 = w.shape[0], w.shape[1]
    half = n1 // 2
    return torch.stack([w[:, :half], w[:, half:]], dim=2).reshape(e, n1, *w.shape[2:]).contiguous()


class TritonExperts(FusedMoEExperts):
    """Triton fused MoE (standard format) with multi-adapter LoRA; CUDA-graph capturable."""

    backend = "triton"
    activation_format = "standard"
    supports_lora = True
    gated_activations = KERNEL_GATED_ACTIVATIONS
    non_gated_activations = KERNEL_NON_GATED_ACTIVATIONS

    @classmethod
    def is_available(cls) -> tuple[bool, str | None]:
        """Needs a CUDA device (or Triton's interpreter, TRITON_INTERPRET=1)."""
        return triton_runtime_available()

    def __init__(
        self,
        config: ExpertsConfig,
        w13: torch.Tensor,
        w2: torch.Tensor,
        w13_bias: torch.Tensor | None = None,
        w2_bias: torch.Tensor | None = None,
        *,
        tile_config: MoEConfig | None = None,
    ) -> None:
        super().__init__(config, w13, w2, w13_bias, w2_bias)
        self.tile_config = tile_config

    @staticmethod
    def convert_weights(
        config: ExpertsConfig,
        w13: torch.Tensor,
        w2: torch.Tensor,
        w13_bias: torch.Tensor | None = None,
        w2_bias: torch.Tensor | None = None,
    ) -> dict[str, Any]:
        """Common layout -> interleaved gated w13 (gate even rows, up odd rows); inputs untouched."""
        c = config
        check_common_layout(c, w13, w2, w13_bias, w2_bias)
        if c.gated and c.activation != "swigluoai":  # swigluoai is interleaved already
            w13 = _interleave_rows(w13)
            if w13_bias is not None:
                w13_bias = _interleave_rows(w13_bias.unsqueeze(-1)).squeeze(-1)
        return contiguous_layout(w13, w2, w13_bias, w2_bias)

    def apply(
        self,
        x: torch.Tensor,
        topk_weights: torch.Tensor,
        topk_ids: torch.Tensor,
        lora: MoELoRAContext | None = None,
    ) -> torch.Tensor:
        """Run the routed experts on ``x`` [T, H]; returns [T, H] in ``x.dtype``."""
        c, wt = self.config, self.weights
        return fused_moe_triton(
            x, wt["w13"], wt["w2"], topk_weights, topk_ids,
            activation=c.activation, gated=c.gated,
            w13_bias=wt["w13_bias"], w2_bias=wt["w2_bias"],
            apply_router_weight_on_input=c.apply_router_weight_on_input,
            lora=lora, swiglu_alpha=c.swiglu_alpha, swiglu_limit=c.swiglu_limit,
            config=self.tile_config,
        )  # fmt: skip
