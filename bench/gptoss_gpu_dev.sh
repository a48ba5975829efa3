#!/usr/bin/env bash
# GPU side, one device call, no vLLM needed: GPU kernel tests at full shapes, our kernels' timings,
# then our engine's end-to-end numbers and greedy agreement (bench/gptoss_gpu.py).
#   bash bench/gptoss_gpu_dev.sh [KERNEL_PARTS] [-- extra bench/gptoss_gpu.py flags]
# With vLLM installed on the machine (bench/vllm_gpu_prepare.sh, three transfers), the kernel
# table also times vLLM's kernels; add --engine gptoss,vllm,agreement for the end-to-end peer.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
RES=${OUT:-$PWD/gptoss_gpu_out}; mkdir -p "$RES"
CKPT=${CKPT:-/tmp/gptoss20b-random}
PARTS=${1:-moe,attn,ops}; shift || true; [ "${1:-}" = "--" ] && shift
export PYTHONUNBUFFERED=1 VLLM_USE_FLASHINFER_SAMPLER=0 TRITON_INTERPRET=0
t0=$(date +%s); say() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
nvidia-smi -L
if [ ! -f "$CKPT/config.json" ]; then
  mk=gptoss.tools.make_checkpoint; [ -f gptoss/tools/make_checkpoint.py ] || mk=gptoss.make_checkpoint
  python3 -m "$mk" --preset 20b --device cuda --out "$CKPT" > "$RES/checkpoint.log" 2>&1 &
  ckpt_pid=$!
fi
bash bench/harness_wheels.sh
say "kernel tests on the GPU"
python3 -m pytest -q -x -n 0 -p no:cacheprovider tests/gptoss/kernels 2>&1 | tail -15 | tee "$RES/kernel_tests.txt"
say "kernel timings"
python3 bench/kernels_gpu.py --only "$PARTS" --out "$RES" 2>&1 | tee "$RES/kernels.txt" | tail -60
[ -n "${ckpt_pid:-}" ] && { wait "$ckpt_pid" || { tail "$RES/checkpoint.log"; exit 1; }; }
say "engine"
python3 bench/gptoss_gpu.py --model-path "$CKPT" --engine gptoss,agreement --out "$RES" "$@" 2>&1 | tee "$RES/engine.txt" | tail -40
say "done"
