#!/usr/bin/env bash
# GPU side, one H200, detached: greedy agreement (16 prompts x 32 tokens) on a calm random 20b
# (make_checkpoint --init calm: conditioned like a trained model, see its INITS), with known-wrong
# copies of it (bench/fault_checkpoint.py) as the calibration of what a rate detects:
#   1. ours: triton vs torch, alone vs batched, --batch-invariant, and each fault against torch
#      (bench/gptoss_gpu.py --engine agreement --fault ...); DEFAULT=1 also the default draw's rates;
#   VLLM=1, once $HOME/vllm_ready exists (`CKPT= bash bench/vllm_peer_install.sh && touch
#   $HOME/vllm_ready` in a later call, after .wc1 and .wc2):
#   2. issue 12: vLLM with our MoE (the plugin) against its own (bench/vllm_plugin_gpu.py, agreement
#      only);
#   3. issue 13: run_mlperf.py --backend vllm --lora-modules against ours, same random rank-16 adapter
#      (bench/gptoss_lora_gpu.py --parts ours,mlperf, agreement only), with its controls; if the
#      adapter changed fewer than LORA_MIN_MOVED (4) of our 16 sequences, again with --delta 1;
#   KTESTS=1, last: the kernel tests compiled, the whole folder in one pytest run (xdist), its summary a
#   row and its failures in $RES/kernel_tests.txt.
# The table last, then the steps that failed (a fault's copy among them; each with its exit status,
# the script's then 1).
#   (setsid nohup bash bench/calm_agreement_gpu.sh > $HOME/calm.log 2>&1 &)   then poll $HOME/calm/done
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
RES=${RES:-$HOME/calm}
CKPT=${CKPT:-/tmp/ck20c}
# shellcheck source-path=SCRIPTDIR/..
. bench/gpu_detached.sh
bash bench/harness_wheels.sh || failed "harness wheels (exit $?)"
if [ ! -f "$CKPT/config.json" ]; then
  say "calm 20b"
  python3 -m gptoss.tools.make_checkpoint --preset 20b --device cuda --init calm --out "$CKPT" \
    > "$RES/checkpoint.log" 2>&1 || { tail "$RES/checkpoint.log"; exit 1; }
fi
lora() {  # lora NAME [ARGS]: our engine and run_mlperf --backend vllm on one adapter, agreement only
  local name=$1
  shift
  timeout 900 python3 bench/gptoss_lora_gpu.py --model-path "$CKPT" --out "$RES/$name" --parts ours,mlperf \
    --offline '' --c16 '' "$@" > "$RES/$name.txt" 2>&1 || failed "$name (exit $?)"
  row "calm: $name" "$(grep -i 'agreement\|^control' "$RES/$name.txt" | tr '\n' ' ')"
}
faults=()
fault() {  # fault NAME PATTERN OP=VALUE: $CKPT-NAME, one --fault of the agreement run
  # a copy that fails leaves the run without that calibration row: a failed step, the others still run
  [ -f "$CKPT-$1/config.json" ] || python3 bench/fault_checkpoint.py "$CKPT" "$CKPT-$1" --edit "$2" "$3" \
    >> "$RES/faults.log" 2>&1 || {
    local rc=$?
    say "fault $1 failed"; tail -3 "$RES/faults.log"; failed "fault $1 (exit $rc)"; return 0
  }
  faults+=(--fault "$CKPT-$1")
}
fault nosink 'self_attn\.sinks$' set=-inf
fault down12x2 'layers\.12\.mlp\.experts\.down_proj_scales$' add=1
fault attn5x2 'layers\.5\.self_attn\.o_proj\.weight$' mul=2
say "ours: agreement"
timeout 900 python3 bench/gptoss_gpu.py --model-path "$CKPT" --engine agreement "${faults[@]}" \
  --out "$RES/ours" > "$RES/ours.txt" 2>&1 || failed "ours agreement (exit $?)"
row "calm: ours" "$(grep -A3 '^workload' "$RES/ours.txt" | tr '\n' ' ')"
if [ "${DEFAULT:-0}" = 1 ]; then
  [ -f /tmp/ck20/config.json ] || python3 -m gptoss.tools.make_checkpoint --preset 20b --device cuda \
    --out /tmp/ck20 > "$RES/checkpoint_default.log" 2>&1 || failed "default checkpoint (exit $?)"
  say "default draw: agreement"
  timeout 600 python3 bench/gptoss_gpu.py --model-path /tmp/ck20 --engine agreement --out "$RES/default" \
    > "$RES/default.txt" 2>&1 || failed "default agreement (exit $?)"
  row "default: ours" "$(grep -A3 '^workload' "$RES/default.txt" | tr '\n' ' ')"
fi
if [ "${VLLM:-0}" = 1 ] && wait_vllm; then
  say "plugin: vLLM with our MoE against its own"
  timeout 900 python3 bench/vllm_plugin_gpu.py --model-path "$CKPT" --engines vllm,gptoss --decode '' \
    --throughput '' --out "$RES/plugin" > "$RES/plugin.txt" 2>&1 || failed "plugin (exit $?)"
  row "calm: plugin" "$(grep 'greedy agreement' "$RES/plugin.txt")"
  say "LoRA: run_mlperf --backend vllm --lora-modules against ours"
  lora lora
  # The control: an adapter that changes few of our 16 sequences cannot tell an engine that applies it
  # from one that does not. Then once more with a 4x stronger one (make_lora --delta 1).
  moved=$(grep -o 'on the [0-9]* of' "$RES/lora.txt" | awk '{print $3}')
  grep -q 'changed none of our' "$RES/lora.txt" && moved=0
  if [ -n "$moved" ] && [ "$moved" -lt "${LORA_MIN_MOVED:-4}" ]; then
    say "LoRA: the adapter changed $moved of 16 sequences; again at delta 1"
    lora lora_d1 --delta 1
  fi
fi
if [ "${KTESTS:-0}" = 1 ]; then
  say "kernel tests, compiled"
  timeout 900 python3 -m pytest -q -p no:cacheprovider -rf tests/gptoss/kernels > "$RES/kernel_tests.txt" 2>&1 \
    || failed "kernel tests (exit $?)"
  row "kernel tests" "$(tail -1 "$RES/kernel_tests.txt")"
fi
finish
