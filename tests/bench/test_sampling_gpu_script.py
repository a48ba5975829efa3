"""bench/sampling_gpu.sh (the sampling filters' device call) end to end on CPU under the stub
binaries: which benches it runs in which order, with which variants (they follow the defaults:
the masked copy and the sort are the switched-off ones), and an unknown run stops it with its name."""

from __future__ import annotations

from tests.bench.gpu_stubs import first_at, run_script


def test_runs_tests_ops_tiles_then_the_decodes_and_records_last(stubs, tmp_path):
    res = tmp_path / "sg"
    p = run_script(
        "sampling_gpu.sh",
        stubs,
        RES=str(res),
        RUNS="top_k_p top_p",
        TILES="256x2x4",
        RECORD="1",
        SPECS=str(tmp_path),
    )
    assert p.returncode == 0, p.stdout + p.stderr
    calls = (tmp_path / "calls.log").read_text().splitlines()
    # the tests run in the background beside the checkpoint's writing (either may log first), and
    # are waited for before the ops
    order = [
        first_at(calls, key)
        for key in (
            "make_checkpoint",
            "kernels_gpu.py --only ops",
            "top_p_gpu.py --tiles 256x2x4",
            "top_k=50",
            "--sampling temperature=1,top_p=0.9,seed=7",
            "record_specs",
        )
    ]
    assert order == sorted(order), calls
    assert first_at(calls, "-m pytest") < order[1], calls
    top_k = next(c for c in calls if "top_k=50" in c)
    assert top_k.endswith("--variant mask=sampling.USE_CUT=False --variant cut=")
    assert "--batch 1,64,256 --max-num-seqs 256 --decode 128x256" in top_k
    top_p = next(c for c in calls if "decode_ab_gpu.py" in c and "top_k" not in c)
    assert top_p.endswith(
        "--variant sort=sampling_filter.TOP_P_SEARCH=False --variant search=sampling.USE_CUT=False "
        "--variant search_cut="
    )
    assert "--max-model-len 4096" in next(c for c in calls if "record_specs" in c)
    table = (res / "table.txt").read_text().splitlines()
    assert table[0] == "compiled tests | 14 passed in 1.0s"
    assert "sample         B=1 greedy  3.4" in table
    assert "    1 search 256x2x4" in table
    i = table.index("== decode top_k_p (temperature=1,top_k=50,top_p=0.9,seed=7)")
    assert table[i + 1 : i + 4] == [
        "batch 1, 128 -> 256 tokens, temperature=1,top_k=50,top_p=0.9,seed=7, tok/s",
        "mask=sampling.USE_CUT=False",
        "cut=",
    ]
    assert table[-1].startswith("record_specs | 9 specializations")
    assert (res / "done").exists()


def test_an_unknown_run_stops_the_call_and_says_which(stubs, tmp_path):
    res = tmp_path / "sg"
    p = run_script(
        "sampling_gpu.sh",
        stubs,
        RES=str(res),
        RUNS="greedy bogus top_p",
        OPS="0",
        TESTS="none",
        RECORD="1",
        SPECS=str(tmp_path),
    )
    assert p.returncode == 2
    assert "unknown run bogus (top_p, top_k_p, screen, shape, greedy, none)" in p.stdout
    calls = (tmp_path / "calls.log").read_text()
    assert "--sampling greedy --variant default=" in calls
    assert "top_p=0.9" not in calls and "record_specs" not in calls and "-m pytest" not in calls
    assert (res / "done").exists()  # the poll's marker, however the script ends


def test_a_failed_step_is_listed_after_the_table_and_fails_the_script(stubs, tmp_path):
    """call 1 of v66: the ops part crashed and the script still said nothing and exited 0."""
    res = tmp_path / "sg"
    p = run_script(
        "sampling_gpu.sh",
        stubs,
        RES=str(res),
        RUNS="greedy top_k_p",
        STUB_FAIL="top_k=50",
        TILES="256x2x4",
    )
    assert p.returncode == 1, p.stdout + p.stderr
    assert "FAILED: decode top_k_p (exit 4)" in p.stdout
    assert p.stdout.splitlines()[-1] == "1 step(s) failed: decode top_k_p (exit 4)"
    assert "--sampling greedy --variant default=" in (tmp_path / "calls.log").read_text()  # the others ran
    # the compiled tests run in the background beside the checkpoint: their status is waited for too
    p = run_script("sampling_gpu.sh", stubs, RES=str(res), RUNS="greedy", STUB_FAIL="-m pytest")
    assert p.returncode == 1
    assert p.stdout.splitlines()[-1] == "1 step(s) failed: compiled tests (exit 4)"


def test_runs_none_records_without_a_decode(stubs, tmp_path):
    """v67's call 2: the manifest alone (RUNS=none, where an empty RUNS means every run)."""
    res = tmp_path / "sg"
    p = run_script(
        "sampling_gpu.sh",
        stubs,
        RES=str(res),
        RUNS="none",
        OPS="0",
        TESTS="none",
        RECORD="1",
        SPECS=str(tmp_path),
    )
    assert p.returncode == 0, p.stdout + p.stderr
    calls = (tmp_path / "calls.log").read_text()
    assert "decode_ab_gpu.py" not in calls and "record_specs" in calls
    assert (res / "table.txt").read_text().splitlines()[-1].startswith("record_specs | ")


def test_the_screen_run_times_the_draw_unscreened_and_in_both_modes(stubs, tmp_path):
    p = run_script(
        "sampling_gpu.sh",
        stubs,
        RES=str(tmp_path / "sg"),
        RUNS="screen",
        OPS="0",
        BATCH="256,1024",
        MAX_NUM_SEQS="1024",
    )
    assert p.returncode == 0, p.stdout + p.stderr
    calls = (tmp_path / "calls.log").read_text().splitlines()
    screen = next(c for c in calls if "decode_ab_gpu.py" in c)
    assert "--batch 256,1024 --max-num-seqs 1024 --decode 128x256" in screen  # where the draw weighs most
    assert screen.endswith(
        "--sampling temperature=1,seed=7 --variant off=sampling_draw.SCREEN=0 --variant local= "
        "--variant shared=sampling_draw.SCREEN=2"
    )
    assert "tests/gptoss/kernels/test_sampling_screen.py" in next(c for c in calls if "-m pytest" in c)


def test_the_sweep_and_the_shape_run_time_the_draws_launch_shape(stubs, tmp_path):
    res = tmp_path / "sg"
    p = run_script(
        "sampling_gpu.sh",
        stubs,
        RES=str(res),
        RUNS="shape",
        SWEEP="64,256,1024",
        TESTS="none",
        BATCH="256,1024",
    )
    assert p.returncode == 0, p.stdout + p.stderr
    calls = (tmp_path / "calls.log").read_text().splitlines()
    assert first_at(calls, "kernels_gpu.py --only ops") < first_at(
        calls, "draw_sweep_gpu.py --batch 64,256,1024"
    )
    assert first_at(calls, "draw_sweep_gpu.py") < first_at(calls, "decode_ab_gpu.py")
    shape = next(c for c in calls if "decode_ab_gpu.py" in c)
    assert shape.endswith(
        "--sampling temperature=1,seed=7 --variant default= --variant "
        "v69=sampling_draw.SCREEN_BLOCK=1024+sampling_draw.SCREEN_WARPS=4+"
        "sampling_draw.SCREEN_CHUNK_MAX=16384 --variant "
        "b512=sampling_draw.SCREEN_BLOCK=512+sampling_draw.SCREEN_WARPS=2+sampling_draw.SCREEN_CHUNK_MAX=16384"
    )
    table = (res / "table.txt").read_text().splitlines()
    i = table.index("case  screen  chunk  block  us  default  ratio  ids")
    assert table[i + 1] == "B=64,256,1024 float32  1  65536  1024x4  1.0  2.0  2.00  same"
    assert "== decode shape (temperature=1,seed=7)" in table
