"""On a GPU: a manifest recorded by gptoss.tools.record_specs, precompiled into an empty Triton cache,
leaves nothing for the engine's start-up and run to compile: every launch reads the disk cache."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.gptoss.kernels.conftest import DEVICE

pytestmark = pytest.mark.skipif(DEVICE != "cuda", reason="the manifest lists what a GPU compiles")
REPO = Path(__file__).resolve().parents[3]

# With the manifest's specializations precompiled, an engine start (its warm-up included) and the
# recording's workload add no entry to the cache: no compile, only loads.
START = textwrap.dedent(
    """
    import json, os, random, sys
    from pathlib import Path
    from gptoss.checkpoint import load_config
    from gptoss.engine import EngineConfig, LLMEngine
    from gptoss.precompile import Precompile, SpecRecorder, load_specs, manifest_path, model_tag, spec_id
    from gptoss.sampling import SamplingParams

    from triton.runtime import driver

    ck, specs, cache = Path(sys.argv[1]), Path(sys.argv[2]), os.environ["TRITON_CACHE_DIR"]
    cfg = load_config(ck)
    stats = Precompile.for_model(cfg, folder=specs).wait()
    before = set(os.listdir(cache))
    with SpecRecorder() as rec:
        eng = LLMEngine(
            EngineConfig(ck, device="cuda", max_num_seqs=64, max_model_len=4096, precompile=False)
        )
        rng = random.Random(0)
        prompts = [[rng.randrange(cfg.vocab_size) for _ in range(rng.randrange(1, 2049))] for _ in range(40)]
        eng.generate(prompts, SamplingParams(max_new_tokens=32, temperature=0.0, ignore_eos=True))
    # what the run compiled, if anything: each new cache entry's files, and each specialization met
    # that the manifest lacks, beside the fields in which it differs from its kernel's nearest entry
    new = {d: sorted(os.listdir(Path(cache, d))) for d in set(os.listdir(cache)) - before}
    manifest = manifest_path(driver.active.get_current_target(), specs)
    listed = {spec_id(s) for s in load_specs(manifest, model_tag(cfg))[0]}
    missed = []
    for s in rec.specs:
        if spec_id(s) in listed:
            continue
        flat = lambda x: {f"{k}.{i}" if isinstance(v, dict) else k: w for k, v in x.items()
                          for i, w in (v.items() if isinstance(v, dict) else [(None, v)])}
        near = [flat(json.loads(t)) for t in listed if json.loads(t)["name"] == s["name"]]
        f = flat(s)
        diffs = min(([k for k in f if n.get(k) != f[k]] for n in near), key=len, default=["name"])
        missed.append([s["name"], {k: f[k] for k in diffs}])
    print(json.dumps({"stats": stats.info(), "new": new, "met": len(rec.specs), "missed": missed}))
    """
)


def test_a_precompiled_manifest_leaves_the_engine_nothing_to_compile(kernel_checkpoint, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    specs = tmp_path / "specs"
    rec = subprocess.run(
        [sys.executable, "-m", "gptoss.tools.record_specs", "--model-path", str(kernel_checkpoint)]
        + ["--out", str(specs / "x.json"), "--max-num-seqs", "64", "--prompts", "40"],
        env=env | {"TRITON_CACHE_DIR": str(tmp_path / "a")},
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert rec.returncode == 0, rec.stderr[-3000:]
    # the manifest's name is this GPU's: the same as Precompile.for_model looks for
    from triton.runtime import driver

    from gptoss.precompile import manifest_path

    (specs / "x.json").rename(manifest_path(driver.active.get_current_target(), specs))
    run = subprocess.run(
        [sys.executable, "-c", START, str(kernel_checkpoint), str(specs)],
        env=env | {"TRITON_CACHE_DIR": str(tmp_path / "b")},
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout.splitlines()[-1])
    stats = out["stats"]
    assert stats["specs"] > 20 and stats["compiled"] == stats["specs"] and stats["failed"] == 0, stats
    assert not out["new"] and not out["missed"], json.dumps(out, indent=1)[-12000:]
