"""bench/kernels/moe_pick.py: the engine's tiles chosen from a moe_gpu.py table, one GEMM at a time,
over every M of a bucket; the table's own tiles print nothing."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench" / "kernels"))

from moe_pick import _spec, pick  # noqa: E402

from gptoss.kernels.moe_tiles import _DOWN_TILES_V3, _GATE_UP_TILES_V3, Tiles, _v3_env_tiles  # noqa: E402

TABLE = """\
     M variant       graph us   gate_up      down  eager us    HBM
  1024 v3               811.1     522.2     275.5     821.7  17.4%
  1024 L-gu128k128s4    760.0     470.0     276.0     770.0  18.0%
  1024 L-dn128k64s4     830.0     523.0     290.0     840.0  17.0%
  2048 v3              1112.4     712.5     379.8    1126.3  12.7%
  2048 L-gu128k128s4   1100.0     700.0     380.0    1110.0  12.8%
  2048 L-dn128k64s4    1090.0     713.0     360.0    1100.0  12.9%
 16384 v3              7009.0    4360.9    2250.2    6830.0   2.0%
 16384 L-gu128k128s4   7500.0    4900.0    2251.0    7600.0   1.9%
 16384 L-dn128k64s4    6900.0    4361.0    2100.0    6800.0   2.0%
 16384 vllm            6600.0         -         -    6700.0   2.1%
"""


def test_each_gemm_takes_its_fastest_tiles_summed_over_the_bucket():
    value, notes = pick(TABLE)
    # bucket 128: gate_up 1170.0 (L-gu) < 1234.7 (v3); down 650.0 (L-dn, slower at M 1024) < 655.3 (v3)
    assert (
        value == "gate_up@128=128,128,128,8,4,half;down@128=128,256,64,8,4,half;down@512=128,256,64,8,4,half"
    )
    assert notes[0] == "gate_up@128: L-gu128k128s4 128,128,128,8,4,half (1170.0 us over M [1024, 2048])"
    assert (
        notes[2]
        == f"gate_up@512: v3 {_spec(_GATE_UP_TILES_V3[512])} (the table's) (4360.9 us over M [16384])"
    )


def test_a_variant_missing_an_m_of_the_bucket_is_not_a_candidate():
    lines = [ln for ln in TABLE.splitlines() if not ln.startswith("  2048 L-gu")]
    value, _ = pick("\n".join(lines))
    assert not value.startswith("gate_up@128")


def test_untimed_rows_are_counted_and_named_not_dropped():
    lines = [*TABLE.splitlines(), "  2048 L-dn128k64s4   1090.0         -     360.0    1100.0  12.9%"]
    lines.remove("  2048 L-dn128k64s4    1090.0     713.0     360.0    1100.0  12.9%")
    value, notes = pick("\n".join(lines))
    assert notes[0] == "1 rows untimed, not candidates: L-dn128k64s4 at M 2048"
    assert "down@128" not in value  # L-dn lacks M 2048 now: the table's down wins bucket 128


def test_the_defaults_winning_give_an_empty_value():
    only_v3 = "\n".join(ln for ln in TABLE.splitlines() if " v3 " in ln)
    assert pick(only_v3)[0] == ""
    assert pick("")[1] == [
        f"{g}@{b}: no variant timed at every M of the bucket" for b in (128, 512) for g in ("gate_up", "down")
    ]


def test_few_rows_buckets_at_120b_shapes_by_the_experts_given():
    # --experts 128: M 512 is 16 rows an expert (bucket 16), M 1024 is 32 (bucket 32)
    table = """\
   512 v3              2000.0    1300.0     700.0    2010.0  30.0%
   512 S-h256          1500.0     900.0     600.0    1510.0  40.0%
  1024 v3              2400.0    1500.0     900.0    2410.0  25.0%
  1024 S-h256          2500.0    1400.0    1100.0    2510.0  24.0%
"""
    value, notes = pick(table, experts=128)
    assert value == (
        "gate_up@16=32,128,128,8,4,half;down@16=32,256,128,8,4,half;gate_up@32=64,128,128,8,4,half"
    )
    assert notes[3] == f"down@32: v3 {_spec(_DOWN_TILES_V3[32])} (the table's) (900.0 us over M [1024])"
    # at 20b's 32 experts the same M are buckets 64 and 128: M 512 is a bucket of its own
    assert pick(table)[1][0].startswith("gate_up@64: S-h256 128,128,128,8,4,half (900.0 us")


def test_rows_that_failed_the_output_check_are_named_and_never_picked():
    lines = [
        ln + "  err 6.3e-02 WRONG" if ln.startswith("  1024 L-gu") or ln.startswith("  2048 L-gu") else ln
        for ln in TABLE.splitlines()
    ]
    value, notes = pick("\n".join(lines))
    assert "gate_up@128" not in value  # the fast wrong tiles lose to the table's
    assert (
        notes[0]
        == "2 rows WRONG (output check), not candidates: L-gu128k128s4 at M 1024, L-gu128k128s4 at M 2048"
    )


def test_decode_batches_are_their_own_bucket_named_dec():
    # M <= 16 is the decode bucket whatever the experts; M 64 at 120b is bucket 16
    table = """\
     1 v3                60.0      30.0      25.0      61.0  50.0%
     1 D-64k256s4        55.0      28.0      24.0      56.0  55.0%
    16 v3               200.0     110.0      80.0     201.0  40.0%
    16 D-64k256s4       190.0     108.0      79.0     191.0  41.0%
    64 v3               400.0     250.0     140.0     401.0  30.0%
"""
    value, notes = pick(table, experts=128)
    assert value == "gate_up@dec=16,32,256,4,4;down@dec=16,64,256,4,4"
    assert notes[0] == "gate_up@dec: D-64k256s4 16,32,256,4,4 (136.0 us over M [1, 16])"
    assert notes[2] == f"gate_up@16: v3 {_spec(_GATE_UP_TILES_V3[16])} (the table's) (250.0 us over M [64])"


def test_a_register_capped_winner_keeps_its_cap_in_the_value(monkeypatch):
    """S-h128s3r's tiles carry Tiles.maxnreg: the picked value spells it as GPTOSS_MOE_V3_TILES reads it
    (against bucket 32's tiles before v46, 4 stages uncapped: S-h128s3r's are the table's since)."""
    monkeypatch.setitem(_GATE_UP_TILES_V3, 32, Tiles(64, 64, 128, 4, 4, half=True))
    monkeypatch.setitem(_DOWN_TILES_V3, 32, Tiles(64, 128, 128, 4, 4, half=True))
    table = """\
  1024 v3              2400.0    1500.0     900.0    2410.0  25.0%
  1024 S-h128s3r       2000.0    1200.0     800.0    2010.0  30.0%
"""
    value, _ = pick(table, experts=128)
    assert value == "gate_up@32=64,64,128,4,3,half,r168;down@32=64,128,128,4,3,half,r168"
    assert _v3_env_tiles(value) == {
        (32, True): Tiles(64, 64, 128, 4, 3, half=True, maxnreg=168),
        (32, False): Tiles(64, 128, 128, 4, 3, half=True, maxnreg=168),
    }


def test_a_variant_that_also_unmasks_the_rows_is_no_candidate():
    """L-k128-unmasked is fastest here, but its time holds the unmasked loads too: its tiles are not
    picked; L-k128's (masked, slower than the table) are not either."""
    table = TABLE + "".join(
        f"{m:>6} {name:<16} {us:>8.1f} {gu:>9.1f} {dn:>9.1f} {us:>9.1f}  2.0%\n"
        for m, name, us, gu, dn in [
            (1024, "L-k128-unmasked", 600.0, 380.0, 200.0),
            (2048, "L-k128-unmasked", 900.0, 600.0, 300.0),
            (16384, "L-k128-unmasked", 6000.0, 4000.0, 2000.0),
            (1024, "L-k128", 900.0, 600.0, 290.0),
            (2048, "L-k128", 1200.0, 800.0, 390.0),
            (16384, "L-k128", 7600.0, 5000.0, 2400.0),
        ]
    )
    assert pick(table)[0] == pick(TABLE)[0]
    assert not any("L-k128" in note for note in pick(table)[1])
