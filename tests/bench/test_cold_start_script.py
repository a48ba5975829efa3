"""bench/cold_start_gpu.sh's control flow on CPU, under the stub binaries of gpu_stubs.py: which engine
runs it starts on which Triton cache and flags, and that every engine process and recording finds the
manifest recorded earlier in the run, even after a later device call's copy of the checkout has put
the committed one back (2026-12-03: the 20b-pre-warm row ran with no manifest)."""

from __future__ import annotations

from pathlib import Path

from tests.bench.gpu_stubs import first_at, run_script


def run_cold(stubs: dict[str, str], tmp_path: Path, **env: str):
    """The script with its results in tmp_path/cold and its manifest in tmp_path/specs, no tests."""
    (tmp_path / "specs").mkdir(exist_ok=True)
    p = run_script(
        "cold_start_gpu.sh",
        stubs,
        RES=str(tmp_path / "cold"),
        SPECS=str(tmp_path / "specs"),
        TESTS="0",
        **env,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    return p


def cold(stubs: dict[str, str], tmp_path: Path, **env: str):
    """run_cold's table."""
    run_cold(stubs, tmp_path, **env)
    assert (tmp_path / "cold" / "done").exists()
    return (tmp_path / "cold" / "table.txt").read_text()


def engine_calls(tmp_path: Path) -> list[str]:
    calls = (tmp_path / "calls.log").read_text().splitlines()
    return [c for c in calls if "gptoss_gpu.py --engine gptoss" in c or "record_specs" in c]


def test_modes_caches_and_the_recorded_manifest(stubs, tmp_path):
    table = cold(
        stubs, tmp_path, CK120=str(tmp_path / "ck120"), WARM20="pre nopre pre-warm", WARM120="pre-b1"
    )
    calls = engine_calls(tmp_path)
    assert [c.split(" --model-path ")[0].split()[-1] for c in calls] == [
        "gptoss.tools.record_specs",
        "gptoss",
        "gptoss",
        "gptoss",
        "gptoss.tools.record_specs",
        "gptoss",
    ]
    pre, nopre, pre_warm, b1 = calls[1], calls[2], calls[3], calls[5]
    assert "--throughput 1000x1024x1024" in pre and "--no-precompile" not in pre
    assert "--no-precompile" in nopre and "--throughput" in nopre
    assert "--throughput" not in pre_warm and "--no-precompile" not in pre_warm
    assert "ck120" in b1 and "--throughput" not in b1 and "--max-model-len 4096" in b1
    # each engine process on its own emptied cache, but -warm on the one pre left; each saw the manifest
    # the first recording wrote (the stub's lists its entries' tags)
    assert "20b-pre | workload cache=tc_20b-pre manifest=h2880-e32-l24 " in table
    assert "20b-nopre | workload cache=tc_20b-nopre manifest=h2880-e32-l24 " in table
    assert "20b-pre-warm | workload cache=tc_20b-pre manifest=h2880-e32-l24 " in table
    assert "120b-pre-b1 | workload cache=tc_120b-pre-b1 manifest=h2880-e32-l24,h2880-e128-l36 " in table
    assert (tmp_path / "cold" / "cuda-90.json").read_text().split() == ["h2880-e32-l24", "h2880-e128-l36"]


def test_a_checkout_copied_again_gets_the_recorded_manifest_back(stubs, tmp_path):
    """The device's next call replaces the tree's manifest with the committed one; the script's own
    recording (kept in RES) goes back in before the next engine process."""
    res, specs = tmp_path / "cold", tmp_path / "specs"
    specs.mkdir()
    res.mkdir()
    (res / "cuda-90.json").write_text("h2880-e32-l24\n")  # what an earlier call of this run recorded
    (specs / "cuda-90.json").write_text("committed\n")
    table = cold(stubs, tmp_path, RECORD="0", WARM20="pre", RUN120="0")
    assert "20b-pre | workload cache=tc_20b-pre manifest=h2880-e32-l24 " in table


def test_vllm_runs_after_the_20b_modes_on_an_empty_cache(stubs, tmp_path):
    table = cold(stubs, tmp_path, RECORD="0", WARM20="pre", RUN120="0", VLLM="1")
    calls = (tmp_path / "calls.log").read_text().splitlines()
    ours = first_at(calls, "--engine gptoss")
    theirs = first_at(calls, "--engine vllm")
    assert ours < theirs and "--decode 128x512 --throughput 1000x1024x1024" in calls[theirs]
    assert (
        table.splitlines()[-1]
        == "vllm b1 + offline | workload x offline 1000x(1024->1024)  -  15000.0 tok/s cache=tc_vllm "
    )


def test_a_manifest_that_cannot_go_back_is_said_not_swallowed(stubs, tmp_path):
    res = tmp_path / "cold"
    res.mkdir()
    (res / "cuda-90.json").write_text("h2880-e32-l24\n")
    p = run_script(
        "cold_start_gpu.sh",
        stubs,
        RES=str(res),
        SPECS=str(tmp_path / "no-such-folder"),
        TESTS="0",
        RECORD="0",
        WARM20="pre",
        RUN120="0",
    )
    assert p.returncode == 0, p.stdout + p.stderr
    said = [x for x in p.stdout.splitlines() if "specs_back:" in x]
    assert len(said) == 1 and said[0].endswith(
        f"could not copy {res}/cuda-90.json into {tmp_path}/no-such-folder"
    )


def test_the_timed_rows_wait_for_vllms_install_and_run_without_it_when_it_never_comes(stubs, tmp_path):
    """vLLM's install (a later device call) must not overlap our start-ups: the wait comes first."""
    (Path(stubs["HOME"]) / "vllm_ready").unlink()
    p = run_cold(stubs, tmp_path, RECORD="0", WARM20="pre", RUN120="0", VLLM="1", VLLM_WAIT_S="0")
    said = [x.split("] ", 1)[-1] for x in p.stdout.splitlines() if x.startswith("[")]
    assert said[:3] == [
        "waiting for vLLM ($HOME/vllm_ready)",
        "no vLLM",
        f"20b-pre (cache tc_20b-pre): "
        f"--model-path {stubs['CKPT']} --decode 128x512 --throughput 1000x1024x1024",
    ]
    calls = (tmp_path / "calls.log").read_text()
    assert "--engine gptoss" in calls and "--engine vllm" not in calls
    table = (tmp_path / "cold" / "table.txt").read_text()
    assert table.startswith("vllm | not installed within 0 s: no vLLM rows\n20b-pre | workload ")


def test_procs_runs_the_precompile_in_processes_and_the_next_mode_does_not(stubs, tmp_path):
    table = cold(stubs, tmp_path, RECORD="0", WARM20="procs pre", RUN120="0")
    rows = table.splitlines()
    assert rows[0].startswith("20b-procs | workload cache=tc_20b-procs ")
    assert rows[0].endswith(" workers=processes ")
    assert rows[1].startswith("20b-pre | workload cache=tc_20b-pre ") and rows[1].endswith(
        " workers=threads "
    )
