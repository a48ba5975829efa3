"""One variant of bench/kernels/moe_gpu.py's MoE: its kernel family, weight layout and the module
switches it sets (moe_variants.VARIANTS names them)."""

from __future__ import annotations

from dataclasses import dataclass

from gptoss.kernels.moe import Tiles
from gptoss.kernels.moe_tiles import DecTiles


@dataclass(frozen=True, slots=True)
class Variant:
    kernels: str  # weight layout / kernel family
    asm: bool = True
    tiles: dict[tuple[int, bool], Tiles] | None = None  # v2 TILE_OVERRIDE entries
    max_m: int = 1 << 30  # only timed up to this M (tile variants of one bucket)
    min_m: int = 0
    decode: bool = False  # the decode path (moe_decode) at small M, as the engine runs it
    tma: str = "0"  # v3: "down" act expert by expert, down's act tiles by TMA; "all" gate_up's x too
    v3_dec_down: DecTiles | None = None  # v3 at M <= 16: down on moe_v3_dec's split-K slot kernel
    v3_dec_gate_up: DecTiles | None = None  # v3 at M <= 16: gate_up on moe_v3_dec_gu's split-K kernel
    wtma: bool = False  # v3: weight and scale words by TMA at every tile (GPTOSS_MOE_V3_WTMA=1), else never
    # Every module switch as the engine leaves it (the fields above unused), and at decode sizes the
    # engine's fused decode MoE (kernel_model.decode_copy / decode_rows) instead of moe_forward
    engine: bool = False
