"""What each variant of bench/kernels/moe_gpu.py runs: its module switches (switches, dec_switches,
restored afterwards) and its parts, the whole MoE and each GEMM alone with routing and act
precomputed (variant_parts, dec_parts, engine_decode: the engine's decode step)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from functools import partial
from unittest import mock

import torch
import torch.nn.functional as F
from moe_dec_variants import DecVariant
from moe_peer import ALPHA, LIMIT, TOP_K, H, I
from moe_variants import Variant

from gptoss.kernel_model import decode_copy, decode_rows
from gptoss.kernels import moe, moe_common, moe_decode, moe_tiles, moe_v3, moe_v3_dec, moe_v3_dec_gu
from gptoss.kernels.moe import moe_forward
from gptoss.kernels.moe_routing import route_and_group


@contextmanager
def _patched(attrs: list[tuple[object, str, object]], dicts: list[tuple[dict, dict]]) -> Iterator[None]:
    """Each (module, name, value) set and each dict's items replaced while the block runs, all restored
    after it."""
    with ExitStack() as stack:
        for owner, name, value in attrs:
            stack.enter_context(mock.patch.object(owner, name, value))
        for d, items in dicts:
            stack.enter_context(mock.patch.dict(d, items, clear=True))
        yield


def dec_switches(v: DecVariant) -> AbstractContextManager:
    """The decode path's switches a DecVariant needs (its tiles, probe and reach), restored afterwards."""
    tiles = {k: t for k, t in ((True, v.gate_up), (False, v.down)) if t is not None}
    attrs = [
        (moe_decode, "ENABLED", True),
        (moe_decode, "PROBE", v.probe),
        (moe_decode, "MAX_T", max(moe_decode.MAX_T, v.max_m)),  # the rows variants (120b) run past T 16
    ]
    return _patched(attrs, [(moe_tiles.DEC_TILE_OVERRIDE, tiles)])


def dec_parts(ck: dict[str, torch.Tensor], w: moe.MoEWeights, x: torch.Tensor) -> dict[str, Callable]:
    """The decode forward, its router and each GEMM alone (routing and act precomputed)."""
    rw, rb = ck["router_w"], ck["router_b"]
    r = route_and_group(F.linear(x, rw, rb), TOP_K)
    gu, dn = moe_tiles.dec_tiles(True, H, x.shape[0]), moe_tiles.dec_tiles(False, I, x.shape[0])
    act = moe_decode.gate_up_dec(x, r, w, ALPHA, LIMIT, gu)

    return {
        "moe": lambda: moe_forward(x, rw, rb, TOP_K, w, ALPHA, LIMIT),
        "router": lambda: route_and_group(F.linear(x, rw, rb), TOP_K),
        "gate_up": lambda: moe_decode.gate_up_dec(x, r, w, ALPHA, LIMIT, gu),
        "down": lambda: moe_decode.down_dec(act, r, w, dn),
    }


def switches(v: Variant) -> AbstractContextManager:
    """The module switches a variant needs, restored afterwards (for the engine's only its tiles and
    UNMASKED_ROWS)."""
    if v.engine:
        attrs: list[tuple[object, str, object]] = []
        if v.engine_gate_up is not None:  # both tile sets: every decode batch takes them
            attrs += [
                (moe_v3_dec_gu, name, v.engine_gate_up) for name in ("V3_GATE_UP_DEC", "V3_GATE_UP_DEC_BIG")
            ]
        if v.engine_down is not None:
            attrs += [(moe_v3_dec, name, v.engine_down) for name in ("V3_DOWN_DEC", "V3_DOWN_DEC_BIG")]
        if v.unmasked:  # else the engine's own setting (GPTOSS_MOE_UNMASKED_ROWS)
            attrs.append((moe_common, "UNMASKED_ROWS", True))
        return _patched(attrs, [])
    tma_down, tma_x = moe_v3._tma_mode(v.tma)
    every = frozenset(range(1, moe_tiles.DECODE_MAX_T + 1))
    attrs = [
        # "v3": the table's tiles at every M; the v3-dd variants the split-K down (-gu: and gate_up)
        # on their tiles at every decode M (both default tile sets: below moe_v3_dec_sizes.BIG_FROM and
        # from it)
        (moe_v3_dec, "TOKENS", every if v.v3_dec_down is not None else frozenset()),
        (moe_v3_dec, "V3_DOWN_DEC", v.v3_dec_down or moe_v3_dec.V3_DOWN_DEC),
        (moe_v3_dec, "V3_DOWN_DEC_BIG", v.v3_dec_down or moe_v3_dec.V3_DOWN_DEC_BIG),
        (moe_v3_dec_gu, "TOKENS", every if v.v3_dec_gate_up is not None else frozenset()),
        (moe_v3_dec_gu, "V3_GATE_UP_DEC", v.v3_dec_gate_up or moe_v3_dec_gu.V3_GATE_UP_DEC),
        (moe_v3_dec_gu, "V3_GATE_UP_DEC_BIG", v.v3_dec_gate_up or moe_v3_dec_gu.V3_GATE_UP_DEC_BIG),
        (moe_common, "USE_ASM", v.asm),
        # off: the M-tile kernels at every M (the decode path's variants: DEC_VARIANTS)
        (moe_decode, "ENABLED", v.decode),
        (moe_v3, "TMA_DOWN", tma_down),
        (moe_v3, "TMA_X", tma_x),
        (moe_v3, "TMA_W", "1" if v.wtma else "0"),  # "v3": the cp.async path, whatever the default
        (moe_v3_dec, "WTMA", v.wtma),
        (moe_v3_dec_gu, "WTMA", v.wtma),
        (moe_common, "UNMASKED_ROWS", v.unmasked),
    ]
    return _patched(attrs, [(moe.TILE_OVERRIDE, v.tiles or {})])


def variant_parts(
    ck: dict[str, torch.Tensor], w: moe.MoEWeights, x: torch.Tensor, engine: bool = False
) -> dict[str, Callable]:
    """The whole forward and each GEMM alone (routing and act precomputed), as moe_forward runs them;
    engine: at decode sizes as the engine's decode step runs them (engine_decode)."""
    if engine and (dw := decode_copy(x, w)) is not None:
        return engine_decode(ck, dw, x)
    t, e = x.shape[0], w.shape[0]
    r = route_and_group(F.linear(x, ck["router_w"], ck["router_b"]), TOP_K)
    full = w
    w = moe.for_rows(w, t, TOP_K)  # the copy moe_forward runs (dual: v2 or v3 by M)
    if w.layout == "bits":
        gu_tiles = moe.choose_tiles_v2(t, TOP_K, e, I, H, gate_up=True)
        dn_tiles = moe.choose_tiles_v2(t, TOP_K, e, H, I, gate_up=False)
        gate_up, down = moe.gate_up_v2, moe.down_v2
    elif w.layout in ("v3", "v3ds"):
        gu_tiles = moe.choose_tiles_v3(t, TOP_K, e, I, H, gate_up=True)
        dn_tiles = moe.choose_tiles_v3(t, TOP_K, e, H, I, gate_up=False, cp_async=moe_v3.pointer_down(x, w))
        srt, tx = moe_v3.tma_plan(x)  # the TMA variants (the gather pass inside gate_up)
        gate_up = partial(moe.gate_up_v3, sorted_rows=srt, tma_x=tx)
        down = partial(moe.down_v3, sorted_rows=srt)
        if t in moe_v3_dec.TOKENS and w.layout == "v3" and not srt:
            down = lambda act, r, w, _tiles: moe_v3_dec.down_v3_dec(act, r, w)  # noqa: E731
        if t in moe_v3_dec_gu.TOKENS and w.layout == "v3" and not srt:
            gate_up = lambda x, r, w, a, lim, _tiles: moe_v3_dec_gu.gate_up_v3_dec(x, r, w, a, lim)  # noqa: E731
    else:
        gu_tiles = moe.choose_tiles(t, TOP_K, e, I, H, gate_up=True)
        dn_tiles = moe.choose_tiles(t, TOP_K, e, H, I, gate_up=False)
        gate_up, down = moe.gate_up, moe.down
    act = gate_up(x, r, w, ALPHA, LIMIT, gu_tiles)
    return {
        "moe": lambda: moe_forward(x, ck["router_w"], ck["router_b"], TOP_K, full, ALPHA, LIMIT),
        "gate_up": lambda: gate_up(x, r, w, ALPHA, LIMIT, gu_tiles),
        "down": lambda: down(act, r, w, dn_tiles),
    }


def engine_decode(ck: dict[str, torch.Tensor], w: moe.MoEWeights, x: torch.Tensor) -> dict[str, Callable]:
    """A decode batch's MoE as the engine's step runs it on w (kernel_model.decode_copy's choice: 20b's
    v3 copy at batch 1, its v2 decode kernels at 2-16 tokens): the router GEMV, the expert GEMMs with
    the gate_up routing the logits itself (kernel_model.decode_rows), the combine. The engine fuses
    the router into the add + RMSNorm before it and the combine into the one after it (norm_logits,
    fused_add_rms_norm's combine=); here each is a launch of its own. gate_up / down: each GEMM alone
    on the kernels decode_rows takes, routing precomputed."""
    rw, rb = ck["router_w"], ck["router_b"]

    def forward() -> torch.Tensor:
        y, routing = decode_rows(x, F.linear(x, rw, rb), TOP_K, w, ALPHA, LIMIT)
        return moe.combine(y, routing.weights, x.dtype)

    parts = dec_parts(ck, w, x) if w.layout == "bits" else variant_parts(ck, w, x)
    return {"moe": forward, "gate_up": parts["gate_up"], "down": parts["down"]}
