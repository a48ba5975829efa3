#!/usr/bin/env bash
# GPU side, after bench/moe_flat_gpu.sh on the same machine (its checkpoint and adapter): the
# concurrency-16 LoRA run with the decode MoE on the slot kernels and on the default (flat from BM 8),
# alternating ROUNDS times, then a warm Offline 1000 x (1024 -> 1024). Rows appended to $RES/ab.txt.
#   bash bench/moe_flat_ab_gpu.sh
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
RES=${RES:-$HOME/flat}; CKPT=${CKPT:-/tmp/ck20}; ADAPTER=$RES/lora-r16
export PYTHONUNBUFFERED=1 TRITON_INTERPRET=0
for round in $(seq "${ROUNDS:-2}"); do
  for mode in slot default; do
    f=""; [ $mode = slot ] && f=0
    GPTOSS_MOE_FLAT=$f timeout 300 python3 bench/gptoss_lora_gpu.py --model-path "$CKPT" \
      --out "$RES/ab_${mode}_$round" --adapter "$ADAPTER" --parts ours --offline '' > "$RES/ab_${mode}_$round.txt" 2>&1
    echo "c16 lora $mode r$round | $(grep -h '"c16"' "$RES/ab_${mode}_$round/results.jsonl" 2>/dev/null)" | tee -a "$RES/ab.txt"
  done
done
[ -n "${OFFLINE:-1}" ] && timeout 300 python3 bench/gptoss_gpu.py --model-path "$CKPT" --engine gptoss \
  --throughput 1000x1024x1024 > "$RES/ab_offline.txt" 2>&1
echo "offline default | $(grep '^offline 1000x' "$RES/ab_offline.txt" | tail -1)" | tee -a "$RES/ab.txt"
