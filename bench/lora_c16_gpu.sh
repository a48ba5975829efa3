#!/usr/bin/env bash
# GPU side, one H100, detached over several device calls (vLLM arrives in later calls): issue 13's
# concurrency-16 row and the Offline row, ours and vLLM 0.26.0 on the same machine.
#   nohup bash bench/lora_c16_gpu.sh > $HOME/c16.log 2>&1 &    (poll $HOME/flat/done)
# Ours: bench/moe_flat_ab_gpu.sh (c16 with the adapter, decode MoE on the slot kernels and on the
# default, then Offline 1000 x (1024 -> 1024)); then, once $HOME/vllm_ready exists
# (bench/vllm_peer_install.sh), vLLM's c16 with the same adapter and its Offline and batch-1 rows.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
RES=${RES:-$HOME/flat}; mkdir -p "$RES"; rm -f "$RES/done"
CKPT=${CKPT:-/tmp/ck20}; ADAPTER=$RES/lora-r16
export PYTHONUNBUFFERED=1 TRITON_INTERPRET=0 RES CKPT
trap 'touch "$RES/done"' EXIT
CKPT=$CKPT ADAPTER=$ADAPTER RES=$RES bash bench/gpu_assets.sh || exit 1
bash bench/moe_flat_ab_gpu.sh
for _ in $(seq 120); do [ -f "$HOME/vllm_ready" ] && break; sleep 5; done
[ -f "$HOME/vllm_ready" ] || { echo "no vLLM"; exit 1; }
timeout 420 python3 bench/gptoss_lora_gpu.py --model-path "$CKPT" --out "$RES/lora_vllm" --adapter "$ADAPTER" \
  --parts vllm --offline '' > "$RES/lora_vllm.txt" 2>&1
echo "vllm c16 lora | $(grep -h '"c16"' "$RES/lora_vllm/results.jsonl" 2>/dev/null)" | tee -a "$RES/ab.txt"
timeout 420 python3 bench/gptoss_gpu.py --model-path "$CKPT" --engine vllm --throughput 1000x1024x1024 \
  --decode 128x512 > "$RES/vllm.txt" 2>&1
echo "vllm | $(sed -n '/^workload/,$p' "$RES/vllm.txt" | tr '\n' ' ')" | tee -a "$RES/ab.txt"
