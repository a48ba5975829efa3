"""The v3 MoE's tile choice (gptoss.kernels.moe_tiles.choose_tiles_v3): its buckets by rows an expert,
the benchmarks' TILE_OVERRIDE and the GPTOSS_MOE_V3_TILES override, and the values it refuses."""

from __future__ import annotations

import pytest

from gptoss.kernels import moe_tiles
from gptoss.kernels.moe_tiles import TILE_OVERRIDE, Tiles, _v3_env_tiles, choose_tiles_v3


def test_choose_tiles_v3_buckets_and_override():
    wide_gu, wide_dn = Tiles(256, 64, 64, 8, 3, half=True), Tiles(256, 128, 64, 8, 3, half=True)
    wide_gu4, wide_dn4 = Tiles(256, 64, 64, 8, 4, half=True), Tiles(256, 128, 64, 8, 4, half=True)
    assert choose_tiles_v3(1024, 4, 32, 2880, 2880, gate_up=True) == wide_gu4  # 8 warps: 128 weight rows
    assert choose_tiles_v3(1024, 4, 32, 2880, 2880, gate_up=False) == wide_dn4
    # Bucket 512 from 512 rows an expert (M 4096 at 20b, 3 stages); 511 rows stay in bucket 128 (4).
    assert choose_tiles_v3(4096, 4, 32, 2880, 2880, gate_up=False) == wide_dn
    assert choose_tiles_v3(4088, 4, 32, 2880, 2880, gate_up=False) == wide_dn4
    assert choose_tiles_v3(16384, 4, 32, 2880, 2880, gate_up=True) == wide_gu
    # Few rows (buckets 16-64, since v21): BM twice the bucket on a half body; 32 rows an expert at M 256;
    # buckets 16 and 32 at 3 stages under a register cap (since v46: 4 / 3 programs an SM)
    assert choose_tiles_v3(256, 4, 32, 2880, 2880, gate_up=True) == Tiles(
        64, 64, 128, 4, 3, half=True, maxnreg=168
    )
    assert choose_tiles_v3(256, 4, 32, 2880, 2880, gate_up=False) == Tiles(
        64, 128, 128, 4, 3, half=True, maxnreg=168
    )
    assert choose_tiles_v3(512, 4, 128, 2880, 2880, gate_up=True) == Tiles(
        32, 64, 128, 4, 3, half=True, maxnreg=128
    )
    assert choose_tiles_v3(17, 4, 8, 64, 64, gate_up=True) == Tiles(32, 64, 64, 4, 3, half=True, maxnreg=128)
    # Decode batches (T <= 16, any expert count): one BM-16 tile an expert, 64 weight rows a program
    for t, e in ((1, 128), (16, 128), (16, 32)):
        assert choose_tiles_v3(t, 4, e, 2880, 2880, gate_up=True) == Tiles(16, 32, 128, 4, 4)
        assert choose_tiles_v3(t, 4, e, 2880, 2880, gate_up=False) == Tiles(16, 64, 128, 4, 4)
    assert choose_tiles_v3(17, 4, 128, 2880, 2880, gate_up=True) == Tiles(
        32, 64, 128, 4, 3, half=True, maxnreg=128
    )
    assert choose_tiles_v3(1, 4, 8, 64, 64, gate_up=True) == Tiles(16, 32, 64, 4, 4)
    assert choose_tiles_v3(1024, 4, 32, 96, 64, gate_up=True) == wide_gu4
    assert choose_tiles_v3(1024, 4, 32, 96, 64, gate_up=False).warps == 8  # BN 128 (N 96's power of 2)
    TILE_OVERRIDE[(128, True)] = Tiles(64, 256, 128, 8, 4)
    try:
        assert choose_tiles_v3(1024, 4, 32, 2880, 2880, gate_up=True) == Tiles(64, 256, 128, 8, 4)
        assert choose_tiles_v3(4096, 4, 32, 2880, 2880, gate_up=True) == wide_gu
        assert choose_tiles_v3(2048, 4, 32, 2880, 2880, gate_up=False) == wide_dn4
    finally:
        TILE_OVERRIDE.clear()


def test_v3_tiles_from_the_environment(monkeypatch):
    """GPTOSS_MOE_V3_TILES: without @bucket both large buckets; TILE_OVERRIDE still wins."""
    env = _v3_env_tiles("gate_up=128,128,128,8,4,half; down@512=256,128,64,8,2")
    assert env == {
        (128, True): Tiles(128, 128, 128, 8, 4, half=True),
        (512, True): Tiles(128, 128, 128, 8, 4, half=True),
        (512, False): Tiles(256, 128, 64, 8, 2),
    }
    monkeypatch.setattr(moe_tiles, "V3_ENV_TILES", env)
    assert choose_tiles_v3(1024, 4, 32, 2880, 2880, gate_up=True) == Tiles(128, 128, 128, 8, 4, half=True)
    assert choose_tiles_v3(1024, 4, 32, 2880, 2880, gate_up=False) == Tiles(256, 128, 64, 8, 4, half=True)
    assert choose_tiles_v3(16384, 4, 32, 2880, 2880, gate_up=False) == Tiles(256, 128, 64, 8, 2)
    assert choose_tiles_v3(16384, 4, 32, 2880, 2880, gate_up=True) == Tiles(128, 128, 128, 8, 4, half=True)
    monkeypatch.setitem(TILE_OVERRIDE, (128, True), Tiles(64, 256, 128, 8, 4))
    assert choose_tiles_v3(1024, 4, 32, 2880, 2880, gate_up=True) == Tiles(64, 256, 128, 8, 4)
    assert _v3_env_tiles("") == {} and _v3_env_tiles(None) == {}
    dec = _v3_env_tiles("gate_up@dec=32,64,128,4,4,half")
    assert dec == {(moe_tiles.DECODE_BUCKET, True): Tiles(32, 64, 128, 4, 4, half=True)}
    monkeypatch.setattr(moe_tiles, "V3_ENV_TILES", dec)
    assert choose_tiles_v3(1, 4, 128, 2880, 2880, gate_up=True) == Tiles(32, 64, 128, 4, 4, half=True)
    assert choose_tiles_v3(1, 4, 128, 2880, 2880, gate_up=False) == Tiles(16, 64, 128, 4, 4)


@pytest.mark.parametrize(
    ("value", "match"),
    [
        ("gateup=128,128,128,8,4", "'gateup=128,128,128,8,4' is not gate_up|down"),
        ("down@256=128,128,64,8,4", "buckets 16, 32, 64, 128, 512, dec"),
        ("down@0=16,64,128,4,6", "buckets 16, 32, 64, 128, 512, dec"),  # the decode bucket by name only
        ("down=128,128,64,8", "is not gate_up"),
        ("down=128,128,64,8,4,full", "is not gate_up"),
        ("down=128,128,96,8,4", "BK a multiple of 64"),
        ("down=96,128,64,8,4", "BM a power of 2"),
        ("down=8,128,64,8,4", "BM a power of 2 >= 16"),
        ("down=128,128,64,8,0", ">= 1 stage"),
        ("down=128,128,64,2,3", "4 or 8 warps"),
        ("down=128,128,64,8,3,r168,half", "is not gate_up"),  # half before the register cap
        ("down=128,128,64,8,3,half,r300", "is not gate_up"),  # above sm_90's 255 a thread
        ("down=128,128,64,8,3,half,r", "is not gate_up"),
        ("down=128,128,64,8,3,half,r168,r128", "is not gate_up"),
    ],
)
def test_v3_env_tiles_refuse_bad_values(value, match):
    with pytest.raises(ValueError, match=match):
        _v3_env_tiles(value)


def test_bucket_64_takes_the_bk64_tiles_unless_its_down_comes_by_cp_async(monkeypatch):
    """Bucket 64 (20b's M 257-512, 120b's 1025-2048) on S-h256k64's tiles since v44; their down races on
    the cp.async path (moe_v3.racy_pointer_down), so there the down keeps S-h128's. An override is
    taken as given either way."""
    from gptoss.kernels.moe_v3 import racy_pointer_down

    gu, dn = Tiles(128, 128, 64, 8, 6, half=True), Tiles(128, 256, 64, 8, 6, half=True)
    for t, e in ((512, 32), (2048, 128)):
        assert choose_tiles_v3(t, 4, e, 2880, 2880, gate_up=True) == gu
        assert choose_tiles_v3(t, 4, e, 2880, 2880, gate_up=True, cp_async=True) == gu
        assert choose_tiles_v3(t, 4, e, 2880, 2880, gate_up=False) == dn
        safe = choose_tiles_v3(t, 4, e, 2880, 2880, gate_up=False, cp_async=True)
        assert safe == Tiles(128, 128, 128, 4, 4, half=True)
        assert racy_pointer_down(dn) and not racy_pointer_down(safe)
    # Bucket 32 keeps its tiles either way
    assert choose_tiles_v3(256, 4, 32, 2880, 2880, gate_up=False, cp_async=True) == Tiles(
        64, 128, 128, 4, 3, half=True, maxnreg=168
    )
    monkeypatch.setitem(TILE_OVERRIDE, (64, False), dn)
    assert choose_tiles_v3(512, 4, 32, 2880, 2880, gate_up=False, cp_async=True) == dn


def test_a_register_cap_from_the_environment_reaches_the_tiles(monkeypatch):
    """GPTOSS_MOE_V3_TILES's rNREG is Tiles.maxnreg, with or without half, and choose_tiles_v3 keeps it
    (it rebuilds the tiles to fit N and K): bench/kernels/moe_variants.py's "S-h128s3r" in the engine."""
    env = _v3_env_tiles("gate_up@32=64,64,128,4,3,half,r168; down@32=64,128,128,4,3,r160")
    assert env == {
        (32, True): Tiles(64, 64, 128, 4, 3, half=True, maxnreg=168),
        (32, False): Tiles(64, 128, 128, 4, 3, maxnreg=160),
    }
    monkeypatch.setattr(moe_tiles, "V3_ENV_TILES", env)
    assert choose_tiles_v3(256, 4, 32, 2880, 2880, gate_up=True).maxnreg == 168
    assert choose_tiles_v3(256, 4, 32, 2880, 2880, gate_up=False).maxnreg == 160
    assert choose_tiles_v3(1024, 4, 32, 2880, 2880, gate_up=True).maxnreg is None  # bucket 128: the table's


def test_every_table_tile_reads_back_from_its_spec():
    """tiles_spec writes what GPTOSS_MOE_V3_TILES reads (moe_pick.py's values), caps included."""
    from gptoss.kernels.moe_tiles import _DOWN_TILES_V3, _GATE_UP_TILES_V3, tiles_spec

    capped = Tiles(64, 64, 128, 4, 3, half=True, maxnreg=168)
    for t in [*_GATE_UP_TILES_V3.values(), *_DOWN_TILES_V3.values(), capped]:
        assert _v3_env_tiles(f"down@64={tiles_spec(t)}") == {(64, False): t}
    assert tiles_spec(capped) == "64,64,128,4,3,half,r168"
