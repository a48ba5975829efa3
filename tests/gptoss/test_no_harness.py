"""The engine, its server and its tools stand alone: importable and runnable with no `harness` (or
`backends`) package, as the dependency order harness -> backends -> gptoss says. data/ is a leaf too."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

BLOCK = (
    "import sys\n"
    "for name in ('harness', 'backends'):\n"
    "    sys.modules[name] = None  # import name -> ImportError\n"
)


def _run(code: str, tmp_path: Path) -> str:
    done = subprocess.run(
        [sys.executable, "-c", BLOCK + code, str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_the_engine_generates_without_the_harness(tmp_path):
    out = _run(
        "import gptoss.engine, gptoss.serve.main, gptoss.serve.app, gptoss.default\n"
        "from gptoss.engine import EngineConfig, LLMEngine\n"
        "from gptoss.sampling import SamplingParams\n"
        "from gptoss.tools.make_checkpoint import preset_config, write_checkpoint\n"
        "path = write_checkpoint(preset_config('tiny'), __import__('pathlib').Path(sys.argv[1]) / 'tiny', "
        "seed=0)\n"
        "engine = LLMEngine(EngineConfig(path, device='cpu', dtype='float32', kv_cache_tokens=1024))\n"
        "(ids,) = engine.generate([[1, 2, 3]], SamplingParams(max_new_tokens=4, temperature=0.0, "
        "ignore_eos=True))\n"
        "print(len(ids), all(0 <= i < engine.vocab_size for i in ids))\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('harness', 'backends') and "
        "sys.modules[m]))\n",
        tmp_path,
    )
    assert out.split("\n")[:2] == ["4 True", "[]"]


def test_serve_parses_its_flags_and_data_checks_files_without_the_harness(tmp_path):
    out = _run(
        "from gptoss.serve.main import parse_args\n"
        "print(parse_args(['--seed', '3', '--max-num-seqs', '2', '--lora', 'a=/x', '--lora', '/y']).engine)\n"
        "from data.checksums import main\n"
        "print(main([sys.argv[1] + '/perf_eval_ref.parquet']))\n",
        tmp_path,
    )
    assert "EngineConfig(model_path=None, device=None, dtype='bfloat16', max_num_seqs=2" in out
    assert "seed=3, kernels=None, cuda_graphs=True, decode_steps=8, warm_kernels=True, " in out
    assert "warm_kernels=True, precompile=True, batch_invariant=False" in out
    assert "batch_invariant=False, lora=('a=/x', '/y'))" in out
    assert out.rstrip().endswith("no such file\n1")
