"""The launch plan of one standard-format fused-MoE call: every decision the launcher makes,
as a value computed from shapes, dtype, the device's limits and the tile config.

``plan_launch`` is pure (no tensors, no device queries): the same problem on the same
:class:`~moe_policy.experts.triton.device.DeviceLimits` gives the same plan on any machine, so
plans are tested on the CPU. ``fused_moe.launch_plan`` then runs a plan on tensors; what it
still decides there is what only the tensors can tell (whether a TMA descriptor can describe
them).

The decisions and why:

* ``naive``: a decode batch (``config.is_decode_batch``) skips the alignment; block ``b``
  holds pair ``b`` alone.
* ``persistent``: the config asks (``MoEConfig.persistent``) and the batch is aligned and has
  no LoRA (the expand's loop keeps the tile loop from being flattened); a persistent entry
  run per tile takes the default tail tiles (``config.default_tail_m``), as its loop runs none.
* ``stream_k``: a persistent call's last, partial round of tiles is split along K where the
  partial tiles fit the memory the two activation buffers leave of the layer's budget
  (``stream_k_headroom_bytes``), the alignment can be stable (a pair's sums must not depend on
  which block the atomics put it in) and GEMM 1 is not in the two-dot gated form (its up rows
  would need a second partial).
* ``adapter_order``: with LoRA and experts averaging more than a block, pairs are ordered by
  adapter inside each expert, so a busy expert's blocks hold few adapters (the expand runs one
  small dot per adapter in a block).
* ``lora_b_ahead``: LoRA B tiles of each block's lowest and highest slot are loaded before
  the main loop where a block holds few slots (decode, pairs ordered by adapter) or the main
  loop is long (128-row tiles) to hide their latency behind; with short tiles holding many
  slots the registers they take cost more.
* ``pdl``: dependent launches where the config asks and on every LoRA call (each shrink lets
  the next GEMM start at once, and the GEMM streams its weights before it waits for the
  shrink output), on a device that has them.
* ``trigger``: a decode GEMM 1 lets GEMM 2 launch at its start, so GEMM 2's programs take SMs
  GEMM 1 leaves free (``MoEConfig.trigger``, by default when GEMM 1 runs at most one program
  per SM).
* ``fused_sum``: at decode without LoRA GEMM 2's last pair of each token and N tile writes
  the top-k sum, with arrival counters in the output's first bytes of each (token, N tile);
  with LoRA the output holds the w2 shrink output, so the sum kernel stays.
* narrow N tiles (``narrow_tail``): a last N tile at most half full runs a narrower tile.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from typing import Any

from moe_policy.experts.base import ExpertsConfig
from moe_policy.experts.triton.align import max_blocks_for, stable_supported
from moe_policy.experts.triton.config import (
    GemmConfig,
    MoEConfig,
    default_tail_m,
    get_config,
    is_decode_batch,
)
from moe_policy.experts.triton.device import TMA_MAX_BOX, DeviceLimits
from moe_policy.experts.triton.jit import (
    ACT_NONE,
    ACTIVATION_CODES,
    WEIGHT_INPUT,
    WEIGHT_NONE,
    WEIGHT_OUTPUT,
)
from moe_policy.experts.triton.lora import lora_block_sizes

#: Below this many M blocks the LoRA shrink splits K (up to ``SHRINK_MAX_SPLIT`` parts) to
#: fill the GPU.
SHRINK_MIN_PROGRAMS = 128
SHRINK_MAX_SPLIT = 8
#: Widest block of the separate top-k sum kernel: 512 columns (4 warps) beat 1024 at every
#: measured T from 16 to 1024 and H from 1024 to 7168 on the H200 (more programs for few
#: tokens: 2.4 -> 1.5 us at T=16), and 128 or 256 lose at T >= 256.
SUM_MAX_BLOCK_H = 512


@dataclass(frozen=True)
class MoEProblem:
    """Shapes and math of one call: what a plan depends on besides the device and config."""

    num_tokens: int
    top_k: int
    num_experts: int
    hidden: int
    inter: int
    gated: bool = True
    activation: str = "silu"
    elem_bytes: int = 2
    weight_on_input: bool = False
    has_bias: bool = False
    lora_slots: int = 0  # adapter slots; 0 without LoRA
    lora_rank: int = 0  # max rank of the slots
    swiglu_alpha: float = 1.702
    swiglu_limit: float = 7.0

    @classmethod
    def of(
        cls,
        config: ExpertsConfig,
        num_tokens: int,
        elem_bytes: int,
        lora_slots: int = 0,
        lora_rank: int = 0,
    ) -> MoEProblem:
        """The problem of a call of ``config``'s layer on ``num_tokens`` tokens."""
        c = config
        return cls(
            num_tokens, c.top_k, c.num_experts, c.hidden_size, c.intermediate_size, c.gated,
            c.activation, elem_bytes, c.apply_router_weight_on_input, c.has_bias, lora_slots,
            lora_rank, c.swiglu_alpha, c.swiglu_limit,
        )  # fmt: skip

    @property
    def numel(self) -> int:
        """(token, slot) pairs."""
        return self.num_tokens * self.top_k

    @property
    def n1(self) -> int:
        """Rows of w13 per expert."""
        return 2 * self.inter if self.gated else self.inter

    @property
    def has_lora(self) -> bool:
        return self.lora_slots > 0 or self.lora_rank > 0

    @property
    def direct(self) -> bool:
        """k = 1: GEMM 2 writes the layer output, no sum."""
        return self.top_k == 1


@dataclass(frozen=True)
class GemmLaunch:
    """One launch of ``gemm.moe_gemm_kernel``: its grid and constexprs but the two that the
    tensors decide (``A_TMA``, ``B_TMA``: ``a_tma``/``b_tma`` say whether to try)."""

    n: int  # output columns (I for GEMM 1, H for GEMM 2)
    k: int  # reduction
    tile: GemmConfig
    grid: int
    b_rows: int  # rows of a weight box: 2 BLOCK_N for a one-dot gated GEMM 1
    b_tma: bool  # weight tiles through a TMA descriptor, where the tensor allows
    a_tma: bool  # activation tiles through TMA (GEMM 2), where the tensor allows
    constexprs: dict[str, Any] = field(hash=False)

    @property
    def pdl(self) -> bool:
        return bool(self.constexprs["PDL"])


@dataclass(frozen=True)
class LaunchPlan:
    """Every decision of one call (see the module docstring); derived values are properties
    (cached per plan), so that a plan with a decision replaced (``dataclasses.replace``, a
    new plan) stays consistent."""

    problem: MoEProblem
    config: MoEConfig  # tile config, cut for the dtype
    num_sms: int  # programs that run at once (DeviceLimits.num_sms)
    smem_limit: int  # shared memory the LoRA shrinks' tiles may take (DeviceLimits.smem_limit)
    tma: bool  # the device has TMA descriptors (DeviceLimits.tma)
    naive: bool
    persistent: bool
    stream_k: bool
    adapter_order: bool
    lora_b_ahead: bool
    pdl: bool
    trigger: bool
    fused_sum: bool
    narrow_n: bool = True  # narrow last N tiles (``narrow_tail``)

    def __post_init__(self) -> None:
        p = self.problem
        if self.persistent and (self.naive or p.has_lora):
            raise ValueError("persistent GEMMs need an aligned batch without LoRA")
        if self.stream_k and not self.persistent:
            raise ValueError("stream-K tails are a persistent GEMM's")
        if self.fused_sum and not (self.naive and not p.direct and not p.has_lora):
            raise ValueError("the fused top-k sum is a decode batch's with k > 1 and no LoRA")
        if (self.adapter_order or self.lora_b_ahead) and not p.has_lora:
            raise ValueError("adapter order and LoRA B tiles ahead need LoRA")
        if self.trigger and not (self.pdl and self.naive and not p.has_lora):
            raise ValueError("a GEMM-1 trigger is a dependent decode launch's without LoRA")

    # ------------------------------------------------------------------ call-wide values

    @property
    def block_m(self) -> int:
        return self.config.block_m

    @cached_property
    def num_blocks(self) -> int:
        """M blocks of the grids: a static bound, so no host sync (one pair each, naive)."""
        p = self.problem
        return p.numel if self.naive else max_blocks_for(p.numel, p.num_experts, self.block_m)

    @property
    def stable_alignment(self) -> bool:
        """Pairs keep their order inside an expert: stream-K tails sum the same bits each run."""
        return self.stream_k

    @property
    def tail_m(self) -> int:
        """Short tiles for blocks of at most this many rows (0: none)."""
        if self.naive:
            return 0
        if self.config.persistent and not self.persistent:
            return default_tail_m(self.block_m)
        return self.config.tail_m

    @property
    def one_dot1(self) -> bool:
        """Gated GEMM 1 as one ``2 BLOCK_N`` dot (a TMA box holds gate and up rows together)."""
        g1 = self.config.gemm1
        return self.problem.gated and (g1.one_dot or g1.tma)

    @property
    def shrink_split(self) -> int:
        """K parts of the LoRA shrinks: more where few blocks would leave the GPU idle."""
        return max(1, min(SHRINK_MAX_SPLIT, SHRINK_MIN_PROGRAMS // max(1, self.num_blocks)))

    @cached_property
    def block_r(self) -> int:
        """LoRA rank padded to a power of two >= 16 (1 without LoRA)."""
        p = self.problem
        return lora_block_sizes(p.lora_rank if p.has_lora else 1, p.lora_slots)[0]

    @property
    def stream_k_elems(self) -> int:
        """fp32 elements of the stream-K partial tiles (0 without stream-K)."""
        if not self.stream_k:
            return 0
        b_cols = max((2 if self.problem.gated else 1) * self.config.gemm1.block_n,
                     self.config.gemm2.block_n)  # fmt: skip
        return stream_k_workspace_elems(self.num_sms, self.block_m, b_cols)

    @property
    def sum_counters(self) -> tuple[int, int, int] | None:
        """Fused sum: (counters per token, int32 words per output row, words between the
        counters of neighbouring N tiles); None without the fused sum."""
        if not self.fused_sum:
            return None
        p, bn = self.problem, self.config.gemm2.block_n
        return (_cdiv(p.hidden, bn), p.elem_bytes * p.hidden // 4,
                bn * p.elem_bytes // 4)  # fmt: skip

    @property
    def sum_block_h(self) -> int | None:
        """Block of the separate top-k sum kernel; None when GEMM 2 sums or writes the output."""
        if self.problem.direct or self.fused_sum:
            return None
        return min(SUM_MAX_BLOCK_H, _pow2(self.problem.hidden))

    # ------------------------------------------------------------------ shrinks and GEMMs

    @property
    def shrink1(self) -> dict[str, bool]:
        """Dependent-launch options of the x shrink: the call's first kernel at decode."""
        return {"pdl": self.pdl and not self.naive, "trigger": self.pdl}

    @property
    def shrink2(self) -> dict[str, bool]:
        """Dependent-launch options of the activation shrink."""
        return {"pdl": self.pdl, "trigger": self.pdl}

    def _common(self) -> dict[str, Any]:
        p = self.problem
        rank = p.lora_rank if p.has_lora else 1
        return dict(
            NAIVE=self.naive, BLOCK_M=self.block_m, BLOCK_R=self.block_r,
            RANK_MASK=rank < self.block_r, TOP_K=p.top_k, ALPHA=float(p.swiglu_alpha),
            LIMIT=float(p.swiglu_limit), HAS_LORA=p.has_lora, TAIL_M=self.tail_m,
            HAS_BIAS=p.has_bias, PERSISTENT=self.persistent, STREAM_K=self.stream_k,
            LORA_B_AHEAD=self.lora_b_ahead, PDL_LATE=self.pdl and p.has_lora, C_ROW_DIV=1,
        )  # fmt: skip

    def _gemm(self, n: int, k: int, g: GemmConfig, b_rows: int, a_tma: bool,
              **constexprs: Any) -> GemmLaunch:  # fmt: skip
        tiles = self.num_blocks * _cdiv(n, g.block_n)
        b_tma = g.tma and b_rows <= TMA_MAX_BOX and g.block_k <= TMA_MAX_BOX and self.tma
        return GemmLaunch(
            n=n, k=k, tile=g, grid=min(tiles, self.num_sms) if self.persistent else tiles,
            b_rows=b_rows, b_tma=b_tma, a_tma=a_tma and b_tma and self.block_m <= TMA_MAX_BOX,
            constexprs=dict(
                **self._common(), **constexprs, EVEN_K=k % g.block_k == 0, BLOCK_N=g.block_n,
                BLOCK_K=g.block_k, GROUP_M=g.group_m,
                TAIL_N=narrow_tail(n, g.block_n) if self.narrow_n else 0,
            ),
        )  # fmt: skip

    @cached_property
    def gemm1(self) -> GemmLaunch:
        """x [T, H] -> activation [numel, I] in expert-sorted rows."""
        p, g1 = self.problem, self.config.gemm1
        sc = self.sum_counters
        return self._gemm(
            p.inter, p.hidden, g1, (2 if self.one_dot1 else 1) * g1.block_n, False,
            A_ROW_DIV=p.top_k, A_SORTED=False, C_SORTED=True, GATED=p.gated,
            ACT=ACTIVATION_CODES[p.activation],
            WEIGHT_POS=WEIGHT_INPUT if p.weight_on_input else WEIGHT_NONE,
            ONE_DOT=self.one_dot1, SUM_K=0,
            ZERO_CNT=_pow2(sc[0]) if sc else 0,
            PDL=self.pdl and (not self.naive or p.has_lora), TRIGGER=self.trigger,
        )  # fmt: skip

    @cached_property
    def gemm2(self) -> GemmLaunch:
        """activation [numel, I] -> [numel, H] by pair, or the output when k = 1."""
        p, g2 = self.problem, self.config.gemm2
        return self._gemm(
            p.hidden, p.inter, g2, g2.block_n, True,
            A_ROW_DIV=1, A_SORTED=True, C_SORTED=False, GATED=False, ACT=ACT_NONE,
            WEIGHT_POS=WEIGHT_NONE if p.weight_on_input else WEIGHT_OUTPUT, ONE_DOT=False,
            SUM_K=p.top_k if self.fused_sum else 0, ZERO_CNT=0, PDL=self.pdl, TRIGGER=False,
        )  # fmt: skip


def plan_launch(
    problem: MoEProblem,
    device: DeviceLimits,
    config: MoEConfig | None = None,
    naive: bool | None = None,
) -> LaunchPlan:
    """The plan of ``problem`` on ``device``: ``config`` or the tuned/heuristic one
    (``config.get_config``), ``naive`` or the decode rule."""
    p = problem
    cfg = config or get_config(
        p.num_tokens, p.num_experts, p.top_k, p.hidden, p.inter, p.gated,
        elem_bytes=p.elem_bytes, **device.config_kwargs(),
    )  # fmt: skip
    if naive is None:
        naive = is_decode_batch(p.num_tokens, p.top_k, p.num_experts)
    bm, g1 = cfg.block_m, cfg.gemm1
    persistent = cfg.persistent and not naive and not p.has_lora
    one_dot1 = p.gated and (g1.one_dot or g1.tma)
    stream_k = persistent and (one_dot1 or not p.gated) and stable_supported(p.num_experts)
    if stream_k:
        b_cols = max((2 if p.gated else 1) * g1.block_n, cfg.gemm2.block_n)
        elems = stream_k_workspace_elems(device.num_sms, bm, b_cols)
        stream_k = 4 * elems <= stream_k_headroom_bytes(p.numel, p.n1, p.hidden, p.elem_bytes,
                                                        p.direct)  # fmt: skip
    pdl = (cfg.pdl or p.has_lora) and device.pdl
    trigger = (
        pdl and naive and not p.has_lora
        and (cfg.trigger if cfg.trigger is not None
             else p.numel * _cdiv(p.inter, g1.block_n) <= device.num_sms)
    )  # fmt: skip
    return LaunchPlan(
        problem=p, config=cfg, num_sms=device.num_sms, smem_limit=device.smem_limit,
        tma=device.tma, naive=naive, persistent=persistent,
        stream_k=stream_k,
        adapter_order=p.has_lora and not naive and p.numel > p.num_experts * bm,
        lora_b_ahead=p.has_lora and (naive or p.numel > p.num_experts * bm or bm >= 128),
        pdl=pdl, trigger=trigger,
        fused_sum=naive and not p.direct and not p.has_lora and (p.hidden * p.elem_bytes) % 4 == 0,
    )  # fmt: skip


#: ``plan_launch`` memoised: plans are values, so the launcher reuses the one of each (problem,
#: device, config, naive) it has seen instead of planning each call again (tens of
#: microseconds of host time per call). Like ``config.load_tuned``, it does not see tuned files
#: change on disk: clear both (``cache_clear``) after writing one.
cached_plan = lru_cache(maxsize=256)(plan_launch)


def stream_k_workspace_elems(programs: int, block_m: int, b_cols: int) -> int:
    """fp32 elements of the stream-K partial tiles: one per program."""
    return programs * block_m * b_cols


def stream_k_headroom_bytes(numel: int, n1: int, h: int, elem: int, direct: bool) -> int:
    """Bytes the layer's memory budget (one ``numel x max(N1, H)`` and one ``numel x I``
    buffer) leaves beside the call's own: its ``numel x H`` GEMM-2 output (none when k = 1,
    ``direct``)."""
    return numel * (max(n1, h) - (0 if direct else h)) * elem


def narrow_tail(n: int, block_n: int) -> int:
    """Width of the narrow last N tile (the remainder's next power of two, at least 16) when
    that is at most half a tile, else 0."""
    rem = n % block_n
    width = max(16, _pow2(rem)) if rem else 0
    return width if 2 * width <= block_n else 0


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _pow2(n: int) -> int:
    """The smallest power of two >= n (0 for 0), as ``triton.next_power_of_2``."""
    return 1 << (n - 1).bit_length() if n > 0 else 0
