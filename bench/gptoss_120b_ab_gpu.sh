#!/usr/bin/env bash
# GPU side, one H200, detached over several device calls: random gpt-oss-120b, our engine once per
# MoE kernel family (MODES, default "v2 v3": GPTOSS_MOE_KERNELS; v2 = the decode kernels + the v2
# GEMMs; v3 = one v3 copy that every batch runs, 120b's default since v22), then vLLM 0.26.0 on the same
# checkpoint and shapes (bench/gptoss_gpu.py: batch-1 128 -> 512, Offline N x (1024 -> 1278), N =
# ${N:-2000}), once $HOME/vllm_ready exists (bench/vllm_peer_install.sh in the third call).
#   (setsid nohup bash bench/gptoss_120b_ab_gpu.sh > $HOME/ab.log 2>&1 &)   then poll $HOME/ab/done
# One table a mode last (ours beside vLLM): $HOME/ab/table.txt.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
RES=${RES:-$HOME/ab}
CKPT=/mnt/ck120/gptoss-120b-random  # a tmpfs: the disk has 64 GiB, the checkpoint 61 GiB
# shellcheck source-path=SCRIPTDIR/..
. bench/gpu_detached.sh
export VLLM_NO_USAGE_STATS=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_USE_FLASHINFER_SAMPLER=0
SHAPES=(--decode 128x512 --throughput "${N:-2000}x1024x1278" --max-model-len 4096 --trace)
vllm_script
mkdir -p /mnt/ck120
grep -q " /mnt/ck120 " /proc/mounts || mount -t tmpfs -o size=72g tmpfs /mnt/ck120 || exit 1
if [ ! -f "$CKPT/config.json" ]; then
  say "120b checkpoint"
  python3 -m gptoss.tools.make_checkpoint --preset 120b --device cuda --out "$CKPT" > "$RES/checkpoint.log" 2>&1 \
    || { tail "$RES/checkpoint.log"; exit 1; }
  tail -1 "$RES/checkpoint.log"
fi
gpu_prereqs
say "compiled few-rows tests"
timeout 300 python3 -m pytest -q -p no:cacheprovider tests/gptoss/kernels/test_moe_v3.py -k "few_rows" \
  2>&1 | tail -4 | tee "$RES/tests.txt"
row "few-rows tile tests" "$(tail -1 "$RES/tests.txt")"
for mode in ${MODES:-v2 v3}; do
  say "ours, GPTOSS_MOE_KERNELS=$mode"
  GPTOSS_MOE_KERNELS=$mode timeout 900 python3 bench/gptoss_gpu.py --model-path "$CKPT" --engine gptoss \
    "${SHAPES[@]}" --out "$RES/$mode" > "$RES/ours_$mode.txt" 2>&1
  row "ours $mode" "$(sed -n '/^workload/,$p' "$RES/ours_$mode.txt" | tr '\n' ' ')"
done
if wait_vllm; then
  say "vLLM"
  timeout 900 python3 bench/gptoss_gpu.py --model-path "$CKPT" --engine vllm "${SHAPES[@]}" \
    --vllm-script "$VLLM_SCRIPT" --out "$RES/vllm" > "$RES/vllm.txt" 2>&1
fi
for mode in ${MODES:-v2 v3}; do
  echo "== GPTOSS_MOE_KERNELS=$mode" >> "$RES/table.txt"
  python3 - "$RES/$mode/results.jsonl" "$RES/vllm/results.jsonl" >> "$RES/table.txt" 2>&1 <<'PY'
import json, sys
from pathlib import Path
sys.path.insert(0, "bench")
from gptoss_gpu import table
table([json.loads(line) for f in sys.argv[1:] if Path(f).exists() for line in open(f)])
PY
done
finish
