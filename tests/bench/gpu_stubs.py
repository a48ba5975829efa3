"""Stub binaries for the detached GPU scripts' tests (bench/*_gpu.sh run on CPU): the GPU machine's
python3, ncu and nvidia-smi, answering as the real tools print, and a runner for a script under them.

The `stubs` fixture that puts them on PATH is in conftest.py; shared helpers live here, not in
conftest.py, so that tests import them by name (as tests/docker does with docker_fakes.py).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

PYTHON_STUB = r"""#!/usr/bin/env bash
last=${*: -1}
echo "$*" >> "$STUB_LOG"
# STUB_FAIL: a call whose words hold it fails (exit 4), as a crashed bench would
[ -n "${STUB_FAIL:-}" ] && [[ $* == *"$STUB_FAIL"* ]] && { echo "stub python3: failing $*" >&2; exit 4; }
# STUB_FAIL_ENV: a call made with that assignment in its environment fails (one mode's run, where
# the calls of all modes read alike)
if [ -n "${STUB_FAIL_ENV:-}" ] && env | grep -qxF -- "$STUB_FAIL_ENV"; then
  echo "stub python3: failing under $STUB_FAIL_ENV: $*" >&2; exit 4
fi
case "$*" in
  *mlperf_loadgen*) exit 0 ;;  # harness_wheels.sh's probe: the wheels are in
  -|"- "*) exec "$REAL_PYTHON" "$@" ;;  # the scripts' inline tables, read from stdin
  *rand_dataset.py*) ;;
  # no run.json: the dp table shows the run as an error; STUB_LEAVE leaves a process behind in its group
  *run_mlperf.py*) [ -z "${STUB_LEAVE:-}" ] || (sleep 20 > /dev/null 2>&1 &) ;;
  *make_checkpoint*|*make_lora*)
    mkdir -p "$last"; echo '{}' > "$last/config.json"; echo '{}' > "$last/adapter_config.json" ;;
  *moe_pick.py*|*"moe_ncu.py --digest"*|*"moe_ncu.py --sass-digest"*) exec "$REAL_PYTHON" "$@" ;;
  *"-m pytest"*)  # (tmp paths hold "pytest" too); STUB_TESTS_SEE: a file the tests wait 5 s to see
    if [ -n "${STUB_TESTS_SEE:-}" ]; then
      for _ in $(seq 50); do [ -e "$STUB_TESTS_SEE" ] && break; sleep 0.1; done
      [ -e "$STUB_TESTS_SEE" ] || { echo "1 failed: no $STUB_TESTS_SEE"; exit 1; }
    fi
    echo "14 passed in 1.0s" ;;
  # sampling_gpu.sh's benches: the lines its table keeps, saying what they were asked
  *"kernels_gpu.py --only ops"*) echo "kernel         case  ours us"; echo "sample         B=1 greedy  3.4" ;;
  *"kernels_gpu.py --only attn"*) echo "kernel         case  ours us"
    echo "attn-decode    B=64 ctx=8192 full  380.0 heads_first=${GPTOSS_ATTN_HEADS_FIRST:-unset}" ;;
  *draw_sweep_gpu.py*) echo "stub: the draw's launch shapes"
    echo "case  screen  chunk  block  us  default  ratio  ids"
    echo "B=${*: -1} float32  1  65536  1024x4  1.0  2.0  2.00  same" ;;
  *top_p_gpu.py*) echo "top-p 0.9 over [B, 201088] float32, stub; µs a call"; echo "    1 search ${*: -1}" ;;
  *decode_ab_gpu.py*) echo "batch 1 round 1 x: 1.0 tok/s"; echo
    echo "batch 1, 128 -> 256 tokens, $(sed -E 's/.*--sampling ([^ ]*).*/\1/' <<< "$*"), tok/s"
    grep -oE -- "--variant [^ ]*" <<< "$*" | sed 's/--variant //' ;;
  *moe_gpu.py*--no-vllm*)
    echo "     M variant       graph us   gate_up      down  eager us    HBM"
    echo "  1024 v3               805.8     520.8     275.0     815.9  17.5%"
    echo "  1024 L-gu128k128s4   1190.0     470.0     272.8    1190.5  11.8%  spread 1.0%"
    echo "  1024 L-dn128k64s4     841.1     517.1     304.1     847.1  16.8%" ;;
  *moe_gpu.py*) echo "     M variant       graph us   gate_up      down  eager us    HBM"
                echo "  1024 vllm             622.5 - -    1293.0  22.6%" ;;
  *fault_checkpoint.py*) mkdir -p "$3" && echo '{}' > "$3/config.json" && echo "wrote $3" ;;  # SRC DST --edit
  *"--engine agreement"*) echo "workload gptoss"
    echo "greedy_agreement triton=torch 96.9%, faults ${*//[^-]/}" ;;  # the dashes: how many flags
  *vllm_plugin_gpu.py*) echo "greedy agreement 16x32 (pfx/pos)      97.9%/97.9%  100.0%/100.0%" ;;
  *gptoss_lora_gpu.py*)  # the folder after --out (a pattern over "$*" would act on each word)
    prev=; for a in "$@"; do [ "$prev" = --out ] && mkdir -p "$a"; prev=$a; done
    moved=${STUB_LORA_MOVED:-9}; [[ $* == *"--delta 1"* ]] && moved=12
    echo "run_mlperf --backend vllm --lora-modules: runs, greedy agreement with ours 100.0% (target >= 90%)"
    if [ "$moved" = 0 ]; then
      echo "control: the adapter changed none of our sequences, so the agreement says nothing of it"
    else echo "control: on the $moved of 16 sequences the adapter changed, vLLM +LoRA = ours 100.0%"; fi ;;
  *profile_gpu.py*) echo "profile pdl=${GPTOSS_PDL:-unset} tiles=${GPTOSS_V3_DEC_DOWN_TILES:-dflt}" ;;
  *gptoss_gpu.py*"--engine gptoss --decode"*)
    echo "batch-1 decode 128->512  400.0  -  tok/s gu=${GPTOSS_V3_DEC_GATE_UP_TILES:-dflt}" \
      "v3tiles=${GPTOSS_MOE_V3_TILES:-dflt} wtma=${GPTOSS_MOE_V3_WTMA:-unset}" \
      "rope=${GPTOSS_ROPE_IN_ATTN:-dflt} k=${GPTOSS_MOE_KERNELS:-auto}" \
      "tiles=${GPTOSS_V3_DEC_DOWN_TILES:-dflt}" ;;
  *"gptoss_gpu.py"*"--engine vllm"*) echo "workload x"
    echo "offline 1000x(1024->1024)  -  15000.0 tok/s cache=$(basename "${TRITON_CACHE_DIR:-none}")" ;;
  # cold_start_gpu.sh: its recordings add their model's tag to $SPECS' manifest; its engine runs say
  # their cache and the manifest's tags
  *record_specs*) tag=h2880-e32-l24; [[ $* == *ck120* ]] && tag=h2880-e128-l36
    echo "$tag" >> "$SPECS/cuda-90.json"; echo "9 specializations of our kernels met at $tag" ;;
  *"gptoss_gpu.py --engine gptoss --model-path"*)
    echo "workload cache=$(basename "$TRITON_CACHE_DIR") manifest=$(paste -sd, "$SPECS/cuda-90.json")" \
      "workers=${GPTOSS_PRECOMPILE_WORKERS:-threads}" ;;
  *attn_sweep.py*) echo "attention sweep: $*" ;;
  # attn_b1_gpu.sh's and issue10_table_gpu.sh's benches: the lines their tables keep
  *linear_gpu.py*) echo "T variant us"; echo "1 ${*: -1} 3.0" ;;
  *attn_chain_gpu.py*) echo "  ctx  alone  chained"; echo "  4096    5.0     6.0" ;;
  *read_ceiling_gpu.py*) echo "   17.6 MB case  3900 GB/s" ;;
  *gptoss_gpu.py*) echo "offline 1000x(1024->1024)  17000.0  -  tok/s k=${GPTOSS_MOE_KERNELS:-auto}" \
    "tma=${GPTOSS_MOE_V3_TMA:-unset} tiles=${GPTOSS_MOE_V3_TILES:-dflt} wtma=${GPTOSS_MOE_V3_WTMA:-unset}" \
    "unmasked=${GPTOSS_MOE_UNMASKED_ROWS:-unset}" ;;
  *) echo "stub python3: unexpected $*" >&2; exit 3 ;;
esac
"""
NCU_STUB = r"""#!/usr/bin/env bash
echo "ncu $*" >> "$STUB_LOG"
case "$*" in
  *"--page details"*)
    echo '"ID","Kernel Name","Section Name","Metric Name","Metric Unit","Metric Value"'
    echo '"0","_gate_up_v3_kernel","GPU Speed Of Light Throughput","Duration","usecond","480.25"' ;;
  *"--page source"*)
    echo '"Address","Source","Warp Stall Sampling (All Samples)","Warp Stall Sampling (Not-issued Samples)"'
    echo '"00001160","BAR.SYNC.DEFER_BLOCKING 0x0","600","580"'
    echo '"00001110","DEPBAR.LE SB0, 0x6","200","190"' ;;
  *) exit 0 ;;
esac
"""


def run_script(script: str, env: dict[str, str], *args: str, **extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", f"bench/{script}", *args],
        cwd=REPO,
        env={**env, **extra},
        capture_output=True,
        text=True,
        timeout=120,
    )


def first_at(lines: list[str], key: str) -> int:
    """The index of the first of lines that holds key (a script's calls or log, in order)."""
    return next(i for i, line in enumerate(lines) if key in line)


def run_compiler_tool(script: str, *args: str) -> subprocess.CompletedProcess:
    """A bench tool that compiles kernels for sm_90a on CPU (bench/kernels/*_sass.py), in a process of
    its own: the tests' Triton runs interpreted, and an interpreted kernel does not compile."""
    return subprocess.run(
        [sys.executable, f"bench/kernels/{script}", *args],
        cwd=REPO,
        env={**os.environ, "TRITON_INTERPRET": "0"},
        capture_output=True,
        text=True,
        timeout=600,
    )
