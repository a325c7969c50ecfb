"""Block sizes for the Triton fused-MoE kernels: a heuristic plus optional tuned JSON files.

One :class:`MoEConfig` per call: ``block_m`` (shared by both GEMMs and the LoRA shrink,
because they share one alignment) and one :class:`GemmConfig` for each GEMM. For a gated
GEMM 1, ``block_n`` counts output columns of the activation: the program reads the gate
and the up rows of those columns, so the MMA is ``2 * block_n`` wide.

Tuned files live in ``experts/configs/E={E},N={I},device_name={name}.json`` (written by
``tools/tune_triton.py``) and map a token count to a config; the nearest key in log scale
wins (halfway between two: ``get_config``).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

#: Folder of tuned config files.
CONFIG_DIR = Path(__file__).parent / "configs"
#: Multiprocessors of the part the heuristic was written for (H100/H200).
HEURISTIC_SMS = 132
#: Shared memory a program may use, bytes (Hopper allows 227 KB; keep a margin).
SMEM_LIMIT = 200 * 1024
#: The margin: what a config leaves of the device's per-block opt-in shared memory for
#: barriers and layout conversions (227 KB on Hopper - 27 KB = the 200 KB above).
SMEM_RESERVE = 27 * 1024


def smem_budget(max_shared_mem: int) -> int:
    """Shared memory a config may plan for on a device with ``max_shared_mem`` bytes of opt-in
    shared memory per block (Triton's ``max_shared_mem``): the Hopper figure, or less (A100 163
    KB -> 136 KB, Ada 99 KB -> 72 KB), so that the heuristic's tiles launch there too."""
    return min(SMEM_LIMIT, max_shared_mem - SMEM_RESERVE)


@dataclass(frozen=True)
class GemmConfig:
    """Tile shape and launch parameters of one grouped GEMM."""

    block_n: int
    block_k: int
    group_m: int = 8
    num_warps: int = 4
    num_stages: int = 3
    one_dot: bool = False  # gated GEMM 1: gate and up as one 2*block_n wide dot
    tma: bool = False  # weight tiles (and GEMM 2's activation tiles) through TMA, Hopper+

    def __post_init__(self) -> None:
        # a tuned file is user input: a value Triton would reject, or fail on, deep inside a
        # launch is refused here, when the file is read (``MoEConfig.from_dict``)
        for name in ("block_n", "block_k"):
            _require(name, getattr(self, name), _is_pow2(getattr(self, name), 16, 512),
                     "a power of two from 16 to 512")  # fmt: skip
        _require("group_m", self.group_m, _is_int(self.group_m) and self.group_m >= 1,
                 "an integer >= 1")  # fmt: skip
        _require("num_warps", self.num_warps, _is_pow2(self.num_warps, 1, 16),
                 "1, 2, 4, 8 or 16")  # fmt: skip
        _require("num_stages", self.num_stages,
                 _is_int(self.num_stages) and 1 <= self.num_stages <= 8, "an integer from 1 to 8")  # fmt: skip
        for name in ("one_dot", "tma"):
            _require(name, getattr(self, name), isinstance(getattr(self, name), bool),
                     "true or false")  # fmt: skip


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_pow2(v: Any, lo: int, hi: int) -> bool:
    return _is_int(v) and lo <= v <= hi and v & (v - 1) == 0


def _require(name: str, value: Any, ok: bool, what: str) -> None:
    if not ok:
        raise ValueError(f"{name} must be {what}, got {value!r}")


@dataclass(frozen=True)
class MoEConfig:
    """Configs of one fused-MoE call; ``block_m`` is shared by both GEMMs.

    ``tail_m`` (0 = off, else a power of two from 16 to ``block_m / 2``): a block that holds at
    most ``tail_m`` real rows (an expert's last, partly filled block) runs a ``tail_m``-row tile
    instead of a ``block_m``-row one, so padding rows cost less.

    ``pdl``: every kernel after the call's first is launched as a programmatic dependent
    (Hopper+): it starts while its predecessor drains and waits on it before its first read,
    hiding a launch latency per kernel; worth it where kernels are a few microseconds (decode).

    ``trigger`` (decode with ``pdl``): GEMM 1 lets GEMM 2 launch at its start, so GEMM 2's
    programs start on SMs GEMM 1 leaves free and wait there. ``None``: when GEMM 1's grid is at
    most one program per SM; tuned files set it where a whole-layer comparison says so.

    ``persistent`` (aligned batches without LoRA): both GEMMs launch one program per SM, each
    walking its share of the tiles in one flattened, pipelined loop, so a tile's epilogue
    overlaps the next tile's loads. No tail tiles there (``tail_m`` must be 0); a narrow last N
    tile runs after the full-width ones, in a second loop. Tuned files set it where a
    whole-layer comparison says so, the heuristic where ``default_persistent`` says;
    decode batches and LoRA calls ignore it and run the entry's tiles one program per tile,
    with the default tail tiles (``default_tail_m``).
    """

    block_m: int
    gemm1: GemmConfig
    gemm2: GemmConfig
    tail_m: int = 0
    pdl: bool = False
    trigger: bool | None = None
    persistent: bool = False

    def __post_init__(self) -> None:
        _require("block_m", self.block_m, _is_pow2(self.block_m, 16, 256),
                 "a power of two from 16 to 256")  # fmt: skip
        for name in ("pdl", "persistent"):
            _require(name, getattr(self, name), isinstance(getattr(self, name), bool),
                     "true or false")  # fmt: skip
        _require("trigger", self.trigger, self.trigger is None or isinstance(self.trigger, bool),
                 "true or false")  # fmt: skip
        if self.persistent and self.tail_m:
            raise ValueError(
                f"persistent GEMMs run no tail tiles: set tail_m to 0 (got {self.tail_m})"
            )
        t = self.tail_m
        if not _is_int(t) or (t and (t < 16 or t & (t - 1) or 2 * t > self.block_m)):
            raise ValueError(
                f"tail_m must be 0 or a power of two in [16, block_m/2={self.block_m // 2}], "
                f"got {t!r}"
            )

    def to_dict(self) -> dict[str, Any]:
        """JSON form, as stored in tuned files (``tail_m``, ``pdl``, ``trigger`` only when set)."""
        d: dict[str, Any] = {
            "block_m": self.block_m, "gemm1": asdict(self.gemm1), "gemm2": asdict(self.gemm2),
        }  # fmt: skip
        if self.tail_m:
            d["tail_m"] = self.tail_m
        if self.pdl:
            d["pdl"] = True
        if self.trigger is not None:
            d["trigger"] = self.trigger
        if self.persistent:
            d["persistent"] = True
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> MoEConfig:
        """Inverse of :meth:`to_dict`; raises ValueError on unknown or missing keys."""
        unknown = set(d) - {"block_m", "gemm1", "gemm2", "tail_m", "pdl", "trigger", "persistent"}
        if unknown:
            raise ValueError(f"bad MoE config {d!r}: unknown keys {sorted(unknown)}")
        try:
            trigger = d.get("trigger")
            return cls(
                d["block_m"], GemmConfig(**d["gemm1"]), GemmConfig(**d["gemm2"]),
                tail_m=d.get("tail_m", 0), pdl=d.get("pdl", False), trigger=trigger,
                persistent=d.get("persistent", False),
            )  # fmt: skip
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"bad MoE config {d!r}: {exc}") from exc


def _pow2_at_most(x: int, cap: int, floor: int = 16) -> int:
    """Largest power of two <= min(cap, next_pow2(x)), and at least floor."""
    p = 1
    while p < x:
        p *= 2
    return max(floor, min(cap, p))


def smem_bytes(
    block_m: int, cfg: GemmConfig, b_tiles: int, elem: int = 2, epilogue: bool = False
) -> int:
    """Shared memory of a GEMM tile's pipeline stages, and with ``epilogue`` of an output tile
    of ``elem`` bytes per element beside them (a persistent loop's next loads fly during the
    epilogue, so its layout conversion cannot reuse the stages)."""
    stages = cfg.num_stages * (block_m * cfg.block_k + b_tiles * cfg.block_n * cfg.block_k)
    return (stages + (block_m * b_tiles * cfg.block_n if epilogue else 0)) * elem


def fit_stages(
    block_m: int, cfg: GemmConfig, b_tiles: int, limit: int = SMEM_LIMIT, elem: int = 2,
    epilogue: bool = False,
) -> GemmConfig:  # fmt: skip
    """Fewer pipeline stages (down to 2), then narrower N and K tiles (down to 32), until the
    stages of ``elem``-byte operands (and the output tile, ``epilogue``) fit ``limit`` bytes
    of shared memory."""
    while smem_bytes(block_m, cfg, b_tiles, elem, epilogue) > limit:
        if cfg.num_stages > 2:
            cfg = replace(cfg, num_stages=cfg.num_stages - 1)
        elif cfg.block_n > 32:
            cfg = replace(cfg, block_n=cfg.block_n // 2)
        elif cfg.block_k > 32:
            cfg = replace(cfg, block_k=cfg.block_k // 2)
        else:
            break
    return cfg


def default_tail_m(block_m: int) -> int:
    """Tail tile for ``block_m``: half of a 128-row block, none below (faster at large T with
    and without LoRA; quarter-size tails and tails of 64-row blocks gained nothing)."""
    return block_m // 2 if block_m >= 128 else 0


def is_decode_batch(num_tokens: int, top_k: int, num_experts: int) -> bool:
    """A batch the fused MoE runs with one (token, slot) pair per block and no alignment: at
    most one pair per four experts."""
    return num_tokens * top_k * 4 <= num_experts


def default_pdl(num_tokens: int, num_experts: int, top_k: int) -> bool:
    """Dependent launches for decode batches (``is_decode_batch``), whose kernels last a few
    microseconds. LoRA calls use them at every size anyway (``launch.plan_launch``)."""
    return is_decode_batch(num_tokens, top_k, num_experts)


def expert_rows_quantile(num_tokens: int, num_experts: int, top_k: int) -> float:
    """Rows an expert gets under uniform routing, at mean + 2.5 standard deviations: its count
    is binomial(T, k/E), and a block height at least this tall holds nearly every expert's
    rows in one block, so that each touched expert's weights are read once."""
    p = min(1.0, top_k / num_experts)
    mean = num_tokens * p
    return mean + 2.5 * math.sqrt(num_tokens * p * (1.0 - p))


def heuristic_config(
    num_tokens: int,
    num_experts: int,
    top_k: int,
    hidden: int,
    inter: int,
    gated: bool,
    *,
    smem_limit: int = SMEM_LIMIT,
    num_sms: int = HEURISTIC_SMS,
) -> MoEConfig:
    """Batch-aware default, by what bounds the layer.

    * Decode (``is_decode_batch``): one pair per block, N tiles narrowed until there are about
      four programs per multiprocessor, but no narrower than a 64-wide MMA unless that leaves
      fewer programs than multiprocessors; 4 pipeline stages, 5 where K is above 4096.
    * Below 128 pairs per expert the layer reads weights: BLOCK_M is the smallest power of two
      (16 to 128) that holds an expert's rows at mean + 2.5 sd (``expert_rows_quantile``), so
      that an expert's weights are read by one block row, not two; padding rows cost MMA time
      the memory-bound layer has spare. Deep K tiles (128) and pipelines at 16-64 rows; where
      GEMM 2's K (the intermediate size) is 4 K tiles or fewer, 8 warps and 3 stages (the
      pipeline never fills deeper). 128-row blocks take 8-warp tiles of 64 columns of K.
    * From 128 pairs per expert (compute-bound): 128 x 256 wgmma tiles, persistent GEMMs where
      the N tiles divide I and H (``default_persistent``), else half-height tail tiles."""
    pairs = max(1, num_tokens * top_k)
    per_expert = pairs / num_experts
    decode = is_decode_batch(num_tokens, top_k, num_experts)
    block_m = (
        16 if decode else _pow2_at_most(expert_rows_quantile(num_tokens, num_experts, top_k), 128)
    )
    # expected non-empty blocks, used to keep enough programs in flight at decode
    active = min(num_experts, pairs)
    blocks = max(1, active, pairs // block_m)
    b1 = 2 if gated else 1
    short_k2 = inter <= 4 * 128
    if block_m == 128 and per_expert >= 128:
        # gated: gate and up as one 2*block_n wide wgmma (the 128x256 tile of non-gated GEMMs)
        g1 = GemmConfig(128 if gated else 256, 64, 8, 8, 4, one_dot=gated)
        g2 = GemmConfig(256, 64, 8, 8, 4)
    elif block_m == 128:
        g1 = GemmConfig(64 if gated else 128, 64, 1, 8, 3, one_dot=gated)
        g2 = GemmConfig(128, 64, 1, 8, 3)
    elif short_k2 and not decode:
        g1 = GemmConfig(64 if gated else 128, 128, 1, 8, 3, one_dot=gated)
        g2 = GemmConfig(128, 128, 1, 8, 3)
    elif block_m == 16:
        # memory-bound: narrow N tiles until there are ~4 programs per multiprocessor; decode
        # keeps MMAs 64 wide unless that leaves an SM idle
        def narrow(n: int, b_tiles: int) -> int:
            bn = 128 // b_tiles
            floor = 64 // b_tiles if decode else 32
            while bn > 32 and blocks * -(-n // bn) < 4 * num_sms:
                if bn <= floor and blocks * -(-n // bn) >= num_sms:
                    break
                bn //= 2
            return bn

        # decode: 5 stages where K is long (> 4096), else 4 (5 cost 1-10 % on shorter K)
        s1, s2 = (5, 5) if not decode else (4 + (hidden > 4096), 4 + (inter > 4096))
        g1 = GemmConfig(narrow(inter, b1), 128, 1, 4, s1)
        g2 = GemmConfig(narrow(hidden, 1), 128, 1, 4, s2)
    else:
        g1 = GemmConfig(64 if gated else 128, 128, 1, 4, 5)
        g2 = GemmConfig(128, 128, 1, 4, 5)
    # clamp tiles to the problem; TMA tiles where the GPU and the tensors allow (the launcher
    # falls back to pointers otherwise)
    g1 = replace(g1, block_n=_pow2_at_most(inter, g1.block_n),
                 block_k=_pow2_at_most(hidden, g1.block_k), tma=True)  # fmt: skip
    g2 = replace(g2, block_n=_pow2_at_most(hidden, g2.block_n),
                 block_k=_pow2_at_most(inter, g2.block_k), tma=True)  # fmt: skip
    g1, g2 = fit_stages(block_m, g1, b1, smem_limit), fit_stages(block_m, g2, 1, smem_limit)
    persistent = per_expert >= 128 and default_persistent(
        block_m, inter, hidden, g1.block_n, g2.block_n
    )
    return MoEConfig(
        block_m, g1, g2,
        tail_m=0 if persistent else default_tail_m(block_m),
        pdl=default_pdl(num_tokens, num_experts, top_k), persistent=persistent,
    )  # fmt: skip


def default_persistent(block_m: int, inter: int, hidden: int, bn1: int, bn2: int) -> bool:
    """Persistent GEMMs for 128-row prefill tiles whose N tiles divide I and H (faster on the
    tiles this heuristic gives). Where N leaves a narrow last tile (Nemotron: 1856, 2688;
    gpt-oss-20b: 2880) the persistent loop runs no tail tiles and wins nothing reliable, even
    with the narrow tiles in a second loop."""
    return block_m == 128 and inter % bn1 == 0 and hidden % bn2 == 0


def normalize_device_name(name: str) -> str:
    """CUDA device name -> file-name form (spaces to '_'; any H200 variant -> NVIDIA_H200)."""
    if "H200" in name:
        return "NVIDIA_H200"
    return name.strip().replace(" ", "_")


def config_file_name(num_experts: int, inter: int, device_name: str) -> str:
    """File name of the tuned configs for (E, N = intermediate size, device)."""
    return f"E={num_experts},N={inter},device_name={normalize_device_name(device_name)}.json"


#: Environment variable naming a directory of tuned files (``moe-policy tune`` writes
#: them there); its files win over the shipped ones, which stay the fallback.
TUNED_DIR_ENV = "MOE_POLICY_TUNED_CONFIG_DIR"


def tuned_dirs() -> list[Path]:
    """Where tuned files are looked up, first match wins: the user's directory
    (``MOE_POLICY_TUNED_CONFIG_DIR``, when set) and the shipped ``CONFIG_DIR``."""
    user = os.environ.get(TUNED_DIR_ENV, "").strip()
    return ([Path(user)] if user else []) + [CONFIG_DIR]


def load_tuned(num_experts: int, inter: int, device_name: str) -> dict[int, MoEConfig] | None:
    """Tuned configs keyed by token count from the first directory of ``tuned_dirs`` holding
    the (E, N, device) file, or None when none does; ValueError naming the file when it is not
    a tuned file."""
    name = config_file_name(num_experts, inter, device_name)
    for folder in tuned_dirs():
        path = folder / name
        if path.is_file():
            return _load_tuned_file(str(path))
    return None


def read_tuned_file(path: str) -> dict[int, MoEConfig]:
    """The configs of one tuned file by token count; ValueError naming the file when it cannot
    be read or is not a tuned file (a FIFO, which would block the read, or a directory)."""
    if os.path.exists(path) and not os.path.isfile(path):
        raise ValueError(f"{path}: not a tuned config file (not a regular file)")
    try:
        raw = json.loads(Path(path).read_text())
        table = raw.get("configs", raw)
        return {int(m): MoEConfig.from_dict(c) for m, c in table.items()}
    except (OSError, ValueError, AttributeError, TypeError) as exc:
        raise ValueError(f"{path}: not a tuned config file ({exc})") from exc


@lru_cache(maxsize=64)
def _load_tuned_file(path: str) -> dict[int, MoEConfig]:
    return read_tuned_file(path)


#: Forget the parsed tuned files (after one was written or replaced).
load_tuned.cache_clear = _load_tuned_file.cache_clear  # type: ignore[attr-defined]


def get_config(
    num_tokens: int,
    num_experts: int,
    top_k: int,
    hidden: int,
    inter: int,
    gated: bool,
    device_name: str | None = None,
    *,
    smem_limit: int = SMEM_LIMIT,
    num_sms: int = HEURISTIC_SMS,
    elem_bytes: int = 2,
) -> MoEConfig:
    """Tuned config nearest to ``num_tokens`` (in log scale) when a file exists, else the
    heuristic for a device with ``num_sms`` multiprocessors and ``smem_limit`` bytes of shared
    memory to plan for (``smem_budget``; tuned files are per device and used as written for
    2-byte dtypes); either cut to fit for wider operands (``fit_to_dtype``, fp32).

    A count halfway (in log scale) between two tuned ones, as every power of two is between
    the files' 1, 16, 64, 256, 1024, 4096 and 8192, takes the upper entry when its tiles are
    prefill tiles (BLOCK_M >= 64), else the lower: so the tuned files' comparisons said
    (compared exactly: float log distances would leave such ties to rounding)."""
    table = load_tuned(num_experts, inter, device_name) if device_name else None
    if table:
        cfg = table[nearest_tuned_key(table, num_tokens)]
    else:
        cfg = heuristic_config(
            num_tokens, num_experts, top_k, hidden, inter, gated, smem_limit=smem_limit,
            num_sms=num_sms,
        )  # fmt: skip
    return fit_to_dtype(cfg, gated, elem_bytes, smem_limit)


def fit_to_dtype(cfg: MoEConfig, gated: bool, elem_bytes: int, smem_limit: int) -> MoEConfig:
    """``cfg`` (tuned or planned for 2-byte operands) with its GEMM tiles cut to fit
    ``smem_limit`` when operands take ``elem_bytes`` bytes: fp32 doubles every tile, and the
    H200's prefill tiles then asked for 384-459 KB of its 227 KB (out of resources at launch).
    The output tile is counted too: in fp32 a 128 x 256 one is 128 KB, and the LoRA tiles
    take what the budget's margin leaves (checked by compiling: ``tools/smem_check.py``).
    2-byte dtypes get ``cfg`` as it is."""
    if elem_bytes <= 2:
        return cfg
    g1 = fit_stages(cfg.block_m, cfg.gemm1, 2 if gated else 1, smem_limit, elem_bytes, True)
    g2 = fit_stages(cfg.block_m, cfg.gemm2, 1, smem_limit, elem_bytes, True)
    return replace(cfg, gemm1=g1, gemm2=g2)


def nearest_tuned_key(table: dict[int, MoEConfig], num_tokens: int) -> int:
    """The token count of ``table`` nearest to ``num_tokens`` in log scale, ties as
    ``get_config`` says (compared exactly: t^2 against the neighbours' product)."""
    keys = sorted(table)
    t = max(1, num_tokens)
    if t <= keys[0]:
        return keys[0]
    if t >= keys[-1]:
        return keys[-1]
    hi = next(m for m in keys if m >= t)
    if t == hi:
        return hi
    lo = keys[keys.index(hi) - 1]
    if t * t != lo * hi:
        return lo if t * t < lo * hi else hi
    return hi if table[hi].block_m >= 64 else lo
