#!/usr/bin/env bash
# GPU side, one H100, detached over several device calls: the decode MoE's kernel choices (the
# expert-slot kernels, the flat ones: moe_decode_flat, GPTOSS_MOE_FLAT=P; register prefetch:
# GPTOSS_MOE_REG=1), then the engine and vLLM 0.26.0 side by side.
#   nohup bash bench/moe_flat_gpu.sh > $HOME/flat.log 2>&1 &     (then poll $HOME/flat/done)
# Steps: the 20b checkpoint and a rank-16 adapter; compiled tests (flat = slot bit for bit at 20b
# shapes); the decode MoE's kernel table (slot and flat variants, M 1-16, CUDA graphs); the best
# flat P by the sum of its graph times; batch-1 decode 128 -> 512 (two rounds) and concurrency 16
# with the adapter for each of MODES; Offline 1000 x (1024 -> 1024) on the default kernels; then, once
# $HOME/vllm_ready exists (bench/vllm_peer_install.sh finished in a later call), vLLM's batch-1,
# Offline and concurrency-16 rows on the same machine. One table last: $HOME/flat/table.txt.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
RES=${RES:-$HOME/flat}; mkdir -p "$RES"; rm -f "$RES/done"
CKPT=${CKPT:-/tmp/ck20}; ADAPTER=$RES/lora-r16
export PYTHONUNBUFFERED=1 TRITON_INTERPRET=0
t0=$(date +%s); say() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
trap 'touch "$RES/done"' EXIT
nvidia-smi -L
CKPT=$CKPT ADAPTER=$ADAPTER RES=$RES bash bench/gpu_assets.sh || exit 1
say "compiled tests"
python3 -m pytest -q -p no:cacheprovider tests/gptoss/kernels/test_moe_decode_flat.py \
  tests/gptoss/kernels/test_moe_decode.py tests/gptoss/kernels/test_moe_lora_kernel.py \
  tests/gptoss/kernels/test_lora_attn_kernel.py 2>&1 | tail -6 | tee "$RES/tests.txt"
say "decode MoE kernels"
python3 bench/kernels/moe_gpu.py --no-vllm --ms 1,2,4,8,16 \
  --variants "${KVARIANTS:-slot,dec,dec-reg,dec-reg-gu,flat3,flat4,probe-loads,probe-compute}" > "$RES/kernels.txt" 2>&1
sed -n '/^ *M variant/,$p' "$RES/kernels.txt"
# The best flat P: the smallest sum of graph_us over M (rows "M variant graph_us ...").
P=$(awk '$2 ~ /^flat[0-9]+$/ && $3 ~ /^[0-9.]+$/ {s[$2]+=$3} END {for (v in s) print s[v], v}' "$RES/kernels.txt" \
  | sort -n | head -1 | sed 's/.*flat//')
P=${P:-2}; say "flat P = $P"
row() { echo "$1 | $2" | tee -a "$RES/table.txt"; }
: > "$RES/table.txt"
# Engine modes: name=ENV (comma-separated assignments); "flat" forces the best P at every T.
MODES=${MODES:-"slot=GPTOSS_MOE_FLAT=0 flat=GPTOSS_MOE_FLAT=$P default= reg=GPTOSS_MOE_REG=1"}
for round in 1 2; do
  for m in $MODES; do
    name=${m%%=*}; rest=${m#*=}; read -ra envs <<< "${rest//,/ }"
    say "batch-1 decode, $name (round $round)"
    env "${envs[@]}" python3 bench/gptoss_gpu.py --model-path "$CKPT" --engine gptoss --decode 128x512 \
      > "$RES/b1_${name}_$round.txt" 2>&1
    row "gptoss b1 128x512 $name r$round" "$(grep '^batch-1 decode' "$RES/b1_${name}_$round.txt" | tail -1)"
  done
done
for m in $MODES; do
  name=${m%%=*}; rest=${m#*=}; read -ra envs <<< "${rest//,/ }"
  say "concurrency 16 with the adapter, $name"
  env "${envs[@]}" timeout 400 python3 bench/gptoss_lora_gpu.py --model-path "$CKPT" --out "$RES/lora_$name" \
    --adapter "$ADAPTER" --parts ours --offline '' > "$RES/lora_$name.txt" 2>&1
  row "gptoss c16 lora $name" "$(grep -h '"c16"' "$RES/lora_$name/results.jsonl" 2>/dev/null | tail -1)"
done
say "Offline 1000x1024x1024 (shared KV pool), default kernels"
timeout 400 python3 bench/gptoss_gpu.py --model-path "$CKPT" --engine gptoss \
  --throughput 1000x1024x1024 > "$RES/offline.txt" 2>&1
row "gptoss offline 1000x1024x1024" "$(grep '^offline 1000x' "$RES/offline.txt" | tail -1)"
grep -o '"kv_[a-z_]*": [0-9a-z"]*' "$RES/offline.txt" | sort -u | head -4
say "waiting for vLLM (\$HOME/vllm_ready)"
for _ in $(seq 180); do [ -f "$HOME/vllm_ready" ] && break; sleep 5; done
if [ -f "$HOME/vllm_ready" ]; then
  say "vLLM c16 with the adapter"
  timeout 560 python3 bench/gptoss_lora_gpu.py --model-path "$CKPT" --out "$RES/lora_vllm" --adapter "$ADAPTER" \
    --parts vllm --offline '' > "$RES/lora_vllm.txt" 2>&1
  row "vllm c16 lora" "$(grep -h '"c16"' "$RES/lora_vllm/results.jsonl" 2>/dev/null | tail -1)"
  say "vLLM batch-1 and Offline"
  timeout 560 python3 bench/gptoss_gpu.py --model-path "$CKPT" --engine vllm --decode 128x512 \
    --throughput 1000x1024x1024 > "$RES/vllm.txt" 2>&1
  row "vllm b1 + offline" "$(sed -n '/^workload/,$p' "$RES/vllm.txt" | tr '\n' ' ')"
fi
say "done"
echo "== table"; cat "$RES/table.txt"
