"""One variant of bench/kernels/moe_gpu.py's MoE: its kernel family, weight layout and the module
switches it sets (moe_variants.VARIANTS names them)."""

from __future__ import annotations

from dataclasses import dataclass

from gptoss.kernels.moe import Tiles
from gptoss.kernels.moe_tiles import DecTiles
from gptoss.kernels.moe_v3_dec_sizes import parse_dec_tiles


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
    # With engine: the split-K gate_up's / down's tiles at every decode batch (both of its tile sets,
    # moe_v3_dec_sizes.batch_tiles' small and big), where the engine takes those kernels
    engine_gate_up: DecTiles | None = None
    engine_down: DecTiles | None = None
    # The v3 GEMMs' x / act loads without row masks (moe_common.UNMASKED_ROWS; v74's SASS)
    unmasked: bool = False


def engine_tiles(spec: str) -> Variant:
    """The engine's variant with other split-K decode tiles, from "gu:TILES", "dn:TILES" or
    "gu:TILES+dn:TILES" (TILES as moe_v3_dec_sizes.parse_dec_tiles reads them, e.g. 16,32,512,2,2,3)."""
    tiles: dict[str, DecTiles] = {}
    for part in spec.split("+"):
        gemm, _, value = part.partition(":")
        if gemm not in ("gu", "dn") or gemm in tiles:
            raise ValueError(f"--dec-tiles: each part is gu:TILES or dn:TILES, each GEMM once, got {spec!r}")
        tiles[gemm] = parse_dec_tiles(value, f"--dec-tiles {gemm}")
    return Variant("dual", engine=True, engine_gate_up=tiles.get("gu"), engine_down=tiles.get("dn"))
