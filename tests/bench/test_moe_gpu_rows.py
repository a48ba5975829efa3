"""bench/kernels/moe_gpu.py's rows: each variant's output is checked against the v2 kernels' and a
row past the bound says WRONG (its time is no result; moe_pick skips it); a graph capture of ours
that fails fails the bench, the vLLM peer's is reported and its row keeps the eager time."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("triton")
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench" / "kernels"))

import torch  # noqa: E402
from moe_gpu import ERR_LIMIT, _capture, _err, _fmt_row  # noqa: E402

ROW = {"M": 1024, "variant": "S-h256", "graph_us": 900.0, "gate_up_us": 600.0, "down_us": 280.0}
ROW |= {"eager_us": 910.0, "hbm": 0.4}


def test_err_is_the_relative_norm_against_the_reference():
    ref = torch.tensor([[3.0, 4.0]])
    assert _err(ref.bfloat16(), ref) == 0.0
    assert _err(torch.tensor([[3.0, 4.5]]), ref) == pytest.approx(0.1)


def test_a_row_past_the_bound_says_wrong():
    ok = _fmt_row(ROW | {"err": 4.9e-3})
    assert ok.endswith("  err 4.9e-03") and "WRONG" not in ok
    bad = _fmt_row(ROW | {"err": ERR_LIMIT * 3})
    assert bad.endswith("  err 6.0e-02 WRONG")
    assert _fmt_row(ROW).endswith("40.0%")  # no check (no reference): no err column


def _broken() -> None:
    raise ValueError("boom")


def test_our_capture_failure_fails_the_bench_and_the_peers_is_reported(capsys, monkeypatch):
    import timing

    monkeypatch.setattr(timing, "PEER_FAILED", [])
    monkeypatch.setattr(timing, "EAGER", [])
    with pytest.raises(ValueError, match="boom"):
        _capture(_broken)
    assert timing.PEER_FAILED == []  # ours raised: not a peer failure
    assert _capture(_broken, peer=True) is None
    assert capsys.readouterr().err == "vLLM MoE graph capture (eager time only): ValueError: boom\n"
    assert timing.PEER_FAILED == ["vLLM MoE graph capture (eager time only)"]
    timing.peer_failed("FA3 peer unavailable", "no sink dtype it takes")
    timing.EAGER.append("decode B=1 ours")
    timing.report()
    assert capsys.readouterr().out == (
        "\n1 case(s) timed eagerly, host time included: decode B=1 ours\n"
        "\n2 peer failure(s), no peer figure there: vLLM MoE graph capture (eager time only), "
        "FA3 peer unavailable\n"
    )


def test_the_engine_variant_leaves_every_switch_as_the_engine_runs():
    """The "engine" rows (kernels_gpu.py's MoE column) time the module defaults; before 2026-12-02 its
    switches put v3's weights on cp.async and batch 1 on v2's decode kernels, which the engine no
    longer ran. A tile variant's switches do change them, and are restored after."""
    from moe_parts import switches as _switches
    from moe_variants import VARIANTS

    from gptoss.kernels import moe, moe_common, moe_decode, moe_v3, moe_v3_dec, moe_v3_dec_gu

    def state() -> tuple:
        return (
            moe_common.USE_ASM,
            dict(moe.TILE_OVERRIDE),
            moe_decode.ENABLED,
            (moe_v3.TMA_DOWN, moe_v3.TMA_X, moe_v3.TMA_W),
            (moe_v3_dec.WTMA, moe_v3_dec_gu.WTMA, moe_v3_dec.TOKENS, moe_v3_dec_gu.TOKENS),
        )

    before = state()
    with _switches(VARIANTS["engine"]):
        assert state() == before
    with _switches(VARIANTS["v3"]):
        assert state() != before
        assert (moe_v3.TMA_W, moe_v3_dec.TOKENS) == ("0", frozenset())
    assert state() == before


def test_the_unmasked_variant_is_the_engine_without_row_masks_only_inside_its_switches():
    """engine-unmasked: the engine's switches but moe_common.UNMASKED_ROWS, which the GEMM launches then
    pass (UNMASKED=True); outside, the launches pass nothing, so their keys are the manifest's."""
    from moe_parts import switches as _switches
    from moe_variants import VARIANTS

    from gptoss.kernels import moe_common

    assert VARIANTS["engine-unmasked"].engine and not VARIANTS["engine"].unmasked
    assert moe_common.unmasked_args() == {}
    with _switches(VARIANTS["engine-unmasked"]):
        assert moe_common.UNMASKED_ROWS is True and moe_common.unmasked_args() == {"UNMASKED": True}
    with _switches(VARIANTS["engine"]):
        assert moe_common.unmasked_args() == {}
    assert moe_common.UNMASKED_ROWS is False


def test_the_bk128_variants_set_the_wide_tiles_and_the_switch_as_named():
    """L-k128 / L-k128-unmasked: BK 128 on the BM-256 tiles of buckets 128 and 512, masked and not; the
    "v3" variants leave the rows masked unless named -unmasked."""
    from moe_parts import switches as _switches
    from moe_variants import VARIANTS

    from gptoss.kernels import moe, moe_common
    from gptoss.kernels.moe_tiles import Tiles

    gu, dn = Tiles(256, 64, 128, 8, 3, half=True), Tiles(256, 128, 128, 8, 3, half=True)
    want = {(128, True): gu, (512, True): gu, (128, False): dn, (512, False): dn}
    for name, unmasked in (("L-k128", False), ("L-k128-unmasked", True)):
        with _switches(VARIANTS[name]):
            assert moe.TILE_OVERRIDE == want and moe_common.UNMASKED_ROWS is unmasked
    for name, unmasked in (("v3", False), ("v3-unmasked", True)):
        with _switches(VARIANTS[name]):
            assert moe.TILE_OVERRIDE == {} and moe_common.UNMASKED_ROWS is unmasked
    assert moe.TILE_OVERRIDE == {} and moe_common.UNMASKED_ROWS is False


def test_hbm_shares_read_the_expert_bytes_over_the_moe_and_over_its_gemms():
    """4 experts' bytes (52.8 MB at 20b) at 4.3 TB/s: over a 38.1 us MoE graph ~32 %; over its GEMMs
    alone (14.9 + 8.9 us) ~52 %; a part not timed gives no share."""
    from moe_gpu import EXPERT_BYTES, hbm_fracs

    assert EXPERT_BYTES == 13_219_200  # w13 8.29 MB + w2 4.15 MB + their scales
    got = hbm_fracs(4, 38.1, 14.9, 8.9, 4.3e12)
    assert got["hbm"] == pytest.approx(4 * EXPERT_BYTES / 38.1e-6 / 4.3e12)
    assert round(got["hbm"], 3) == 0.323 and round(got["hbm_gemms"], 3) == 0.517
    assert hbm_fracs(4, None, None, 8.9, 4.3e12) == {"hbm": None, "hbm_gemms": None}


def test_a_decode_variant_sets_its_tiles_and_probe_and_restores_them():
    from moe_dec_variants import DEC_VARIANTS
    from moe_parts import dec_switches

    from gptoss.kernels import moe_decode, moe_tiles

    v = next(d for d in DEC_VARIANTS.values() if d.gate_up is not None)

    def state() -> tuple:
        return moe_decode.ENABLED, moe_decode.PROBE, moe_decode.MAX_T, dict(moe_tiles.DEC_TILE_OVERRIDE)

    before = state()
    with dec_switches(v):
        assert moe_tiles.DEC_TILE_OVERRIDE[True] == v.gate_up and moe_decode.ENABLED
        assert (moe_decode.PROBE, moe_decode.MAX_T) == (v.probe, max(before[2], v.max_m))
    assert state() == before


def test_print_table_writes_the_title_a_header_and_the_rows(capsys):
    import timing

    timing.print_table("MoE, H200", ["kernels", "µs"], ["| a | 1.00 |", "| b | 2.00 |"])
    out = capsys.readouterr().out
    assert out == "\nMoE, H200\n\n| kernels | µs |\n|---|---|\n| a | 1.00 |\n| b | 2.00 |\n"


def test_our_failed_cases_are_counted_and_make_report_return_their_number(capsys, monkeypatch):
    import timing

    for name in ("EAGER", "PEER_FAILED", "CASE_FAILED"):
        monkeypatch.setattr(timing, name, [])
    assert timing.report() == 0
    timing.case_failed("gate_up loads kparts 1", ValueError("too much shared memory"))
    timing.case_failed("G 64,512,3", "one launch differs from two launches")
    assert timing.PEER_FAILED == []
    out, err = capsys.readouterr()
    assert err == (
        "gate_up loads kparts 1: ValueError: too much shared memory\n"
        "G 64,512,3: one launch differs from two launches\n"
    )
    assert timing.report() == 2
    assert capsys.readouterr().out == "\n2 case(s) of ours failed: gate_up loads kparts 1, G 64,512,3\n"
