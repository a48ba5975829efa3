#!/usr/bin/env bash
# GPU side, one H100, detached over several device calls: the decode MoE's kernel choices (the
# expert-slot kernels, the flat ones: moe_decode_flat, GPTOSS_MOE_FLAT=P), then the engine and vLLM
# 0.26.0 side by side.
#   nohup bash bench/moe_flat_gpu.sh > $HOME/flat.log 2>&1 &     (then poll $HOME/flat/done)
# Steps: the 20b checkpoint and a rank-16 adapter; compiled tests (flat = slot bit for bit at 20b
# shapes); the decode MoE's kernel table (slot and flat variants, M 1-16, CUDA graphs); the best
# flat P by the sum of its graph times; batch-1 decode 128 -> 512 (two rounds) and concurrency 16
# with the adapter for each of MODES; Offline 1000 x (1024 -> 1024) on the default kernels; then, once
# $HOME/vllm_ready exists (bench/vllm_peer_install.sh finished in a later call), vLLM's batch-1,
# Offline and concurrency-16 rows on the same machine. One table last: $HOME/flat/table.txt; then
# the steps that failed (each with its exit status; the script's then 1).
# PARTS (default all: tests kernels b1 c16 offline vllm) picks steps, e.g. issue 13's c16 row with
# its peer: PARTS="c16 offline vllm" MODES="slot=GPTOSS_MOE_FLAT=0 default=" bash bench/moe_flat_gpu.sh
# KMS / KEXPERTS: the kernel table's M list and experts (128: 120b, e.g. KVARIANTS=v2,rows-d16-flat4).
# Two more parts, not in the default: attn (bench/kernels/attn_sweep.py: decode attention's launch
# settings) and profile (bench/profile_gpu.py at batch 1, and at batch 1000 with 1536-token contexts).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
RES=${RES:-$HOME/flat}
# shellcheck source-path=SCRIPTDIR/..
. bench/gpu_detached.sh
ADAPTER=$RES/lora-r16
PARTS=" ${PARTS:-tests kernels b1 c16 offline vllm} "; has() { [[ $PARTS == *" $1 "* ]]; }
if has vllm; then vllm_script; fi
gpu_prereqs
[ -f "$ADAPTER/adapter_config.json" ] || python3 -m gptoss.make_lora --model "$CKPT" --rank 16 --out "$ADAPTER" \
  > "$RES/adapter.log" 2>&1 || { tail "$RES/adapter.log"; exit 1; }
if has tests; then
  say "compiled tests"
  python3 -m pytest -q -n 0 -p no:cacheprovider tests/gptoss/kernels/test_moe_decode_flat.py \
    tests/gptoss/kernels/test_moe_decode.py tests/gptoss/kernels/test_moe_lora_kernel.py \
    tests/gptoss/kernels/test_lora_attn_kernel.py 2>&1 | tail -6 | tee "$RES/tests.txt" \
    || failed "compiled tests (exit $?)"  # pipefail: pytest's status, not tee's
fi
P=4  # moe_tiles.FLAT_PER_SM, unless the kernel table finds a better P
if has kernels; then
  say "decode MoE kernels"
  python3 bench/kernels/moe_gpu.py --no-vllm --ms "${KMS:-1,2,4,8,16}" --experts "${KEXPERTS:-32}" \
    --variants "${KVARIANTS:-slot,dec,flat3,flat4,probe-loads,probe-compute}" > "$RES/kernels.txt" 2>&1 \
    || failed "kernels (exit $?)"
  sed -n '/^ *M variant/,$p' "$RES/kernels.txt"
  # The best flat P: the smallest sum of graph_us over M (rows "M variant graph_us ...").
  best=$(awk '$2 ~ /^flat[0-9]+$/ && $3 ~ /^[0-9.]+$/ {s[$2]+=$3} END {for (v in s) print s[v], v}' \
    "$RES/kernels.txt" | sort -n | head -1 | sed 's/.*flat//')
  P=${best:-$P}; say "flat P = $P"
fi
if has attn; then  # decode attention's (BLOCK_N, warps, stages) at batch 1 and Offline decode shapes
  say "decode attention sweep"
  python3 bench/kernels/attn_sweep.py > "$RES/attn.txt" 2>&1 || failed "attention sweep (exit $?)"
  cat "$RES/attn.txt"
fi
if has profile; then  # where a batch-1 step and an Offline 1024 -> 1024 decode step (~1000 rows, ~1.5k context) go
  say "profiles"
  python3 bench/profile_gpu.py --model-path "$CKPT" --batch 1 --steps 20 > "$RES/profile_b1.txt" 2>&1 \
    || failed "profile b1 (exit $?)"
  python3 bench/profile_gpu.py --model-path "$CKPT" --batch 1000 --prompt-len 1536 --steps 5 \
    > "$RES/profile_b1000.txt" 2>&1 || failed "profile b1000 (exit $?)"
  grep -h -A16 "^batch" "$RES/profile_b1.txt" "$RES/profile_b1000.txt"
fi
# Engine modes: name=ENV (+-separated assignments, as values may hold commas); "flat" forces P at every T.
MODES=${MODES:-"slot=GPTOSS_MOE_FLAT=0 flat=GPTOSS_MOE_FLAT=$P default="}
in_mode() {  # in_mode FUNCTION ENV...: FUNCTION with ENV exported for this call only (local -x), in
  local f=$1 a  # this shell: its failed() is kept (a subshell's is lost)
  shift
  for a; do local -x "${a?}"; done
  "$f"
}
each_mode() {  # each_mode LABEL FUNCTION: FUNCTION once a mode, with $name set and the mode's variables
  local m rest envs
  for m in $MODES; do
    name=${m%%=*}; rest=${m#*=}; read -ra envs <<< "${rest//+/ }"
    say "$1, $name"
    in_mode "$2" "${envs[@]}"
  done
}
b1() {
  python3 bench/gptoss_gpu.py --model-path "$CKPT" --engine gptoss --decode 128x512 > "$RES/b1_${name}_$round.txt" 2>&1 \
    || failed "b1 $name r$round (exit $?)"
  row "gptoss b1 128x512 $name r$round" "$(grep '^batch-1 decode' "$RES/b1_${name}_$round.txt" | tail -1)"
}
c16() {
  timeout 400 python3 bench/gptoss_lora_gpu.py --model-path "$CKPT" --out "$RES/lora_$name" \
    --adapter "$ADAPTER" --parts ours --offline '' > "$RES/lora_$name.txt" 2>&1 || failed "c16 $name (exit $?)"
  row "gptoss c16 lora $name" "$(grep -h '"c16"' "$RES/lora_$name/results.jsonl" 2>/dev/null | tail -1)"
}
if has b1; then
  for round in $(seq "${ROUNDS:-2}"); do each_mode "batch-1 decode (round $round)" b1; done
fi
has c16 && each_mode "concurrency 16 with the adapter" c16
offline() {
  timeout 400 python3 bench/gptoss_gpu.py --model-path "$CKPT" --engine gptoss \
    --throughput 1000x1024x1024 > "$RES/offline_$name.txt" 2>&1 || failed "offline $name (exit $?)"
  row "gptoss offline 1000x1024x1024 $name" "$(grep '^offline 1000x' "$RES/offline_$name.txt" | tail -1)"
}
has offline && each_mode "Offline 1000x1024x1024" offline
if has vllm; then
  wait_vllm || exit 1
  say "vLLM c16 with the adapter"
  timeout 560 python3 bench/gptoss_lora_gpu.py --model-path "$CKPT" --out "$RES/lora_vllm" --adapter "$ADAPTER" \
    --parts vllm --offline '' > "$RES/lora_vllm.txt" 2>&1 || failed "vllm c16 (exit $?)"
  row "vllm c16 lora" "$(grep -h '"c16"' "$RES/lora_vllm/results.jsonl" 2>/dev/null | tail -1)"
  vllm_engine
fi
finish
