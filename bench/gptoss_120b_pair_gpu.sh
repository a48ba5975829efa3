#!/usr/bin/env bash
# GPU side, one 2-GPU machine (nvidia-h200-x2), detached over one or more device calls: issue 11's
# gpt-oss-120b rows and issue 14's data-parallel rows in one machine hold, on one random checkpoint.
#   1. the random 120b checkpoint, once, into the tmpfs /mnt/ck120 (gptoss_120b_ab_gpu.sh's);
#   2. at once, one GPU each: GPU 0 our engine (gptoss_120b_ab_gpu.sh with VLLM=0: compiled tests,
#      Offline N x (1024 -> 1278) on MODES, batch 1, batch 1 on B1_MODES, the decode sweep); GPU 1
#      run_mlperf Offline DP=1 through LoadGen (gptoss_dp_gpu.sh, DP_N prompts), then with PEER=1
#      vLLM 0.26.0 on the A/B's shapes once bench/vllm_peer_install.sh (the third call) is done;
#      GPU1_ATTN_SWEEP=1 and GPU1_B1 (batch-1 modes) move those A/B parts to GPU 1, before vLLM;
#      GPU0_DP (gptoss_dp_gpu.sh's runs, e.g. dp1-fp8) has GPU 0 run those instead of the A/B;
#   3. then DP=2 on both GPUs (its table: beside step 2's DP=1); DP2_RUNS adds runs of both GPUs
#      (gptoss_dp_gpu.sh's names, e.g. "dp2 vllm-dp2": vLLM's DP=2 on the same prompts, issue 14's peer).
#   (setsid nohup bash bench/gptoss_120b_pair_gpu.sh > $HOME/pair.log 2>&1 &)   then poll $HOME/pair/done
# The table last: ours (GPU 0) beside vLLM (GPU 1), then the DP table; then the steps that failed
# (each with its exit status, the details in its log; the script's then 1). The two GPUs' runs share
# the host's CPUs, and DP=1's leftover check sees only GPU 1 (nvidia-smi -i).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
RES=$HOME/pair
export CKPT=${CKPT:-/mnt/ck120/gptoss-120b-random}  # the A/B reads the same one (set before gpu_detached's default)
# shellcheck source-path=SCRIPTDIR/..
. bench/gpu_detached.sh
[ "$(nvidia-smi -L | wc -l)" -ge 2 ] || { echo "needs 2 GPUs"; exit 1; }
checkpoint_120b
gpu_prereqs  # the harness's wheels, once, before two scripts would install them at the same time
dp() { CKPT=$CKPT OUT=$HOME/dpres bash bench/gptoss_dp_gpu.sh "${DP_N:-1000}" 1024 1278 "$1"; }
say "GPU 0: ${GPU0_DP:-ours}; GPU 1: DP=1, then vLLM (PEER=${PEER:-1})"
if [ -n "${GPU0_DP:-}" ]; then
  CUDA_VISIBLE_DEVICES=0 dp "$GPU0_DP" > "$RES/dp_gpu0.log" 2>&1 &
  gpu0="GPU 0 $GPU0_DP"
else
  CUDA_VISIBLE_DEVICES=0 RES=$HOME/ab0 VLLM=0 bash bench/gptoss_120b_ab_gpu.sh > "$RES/ab0.log" 2>&1 &
  gpu0="GPU 0 A/B"
fi
ours=$!
# GPU 1's runs in this shell, beside GPU 0's, so that their failed() is kept (a subshell's is lost)
CUDA_VISIBLE_DEVICES=1 dp dp1 > "$RES/dp1.log" 2>&1 || failed "GPU 1 dp1 (exit $?)"
if [ "${PEER:-1}" = 1 ]; then
  CUDA_VISIBLE_DEVICES=1 RES=$HOME/ab1 VLLM=1 MODES='' B1_MODES="${GPU1_B1:-}" SWEEP=0 TESTS=none \
    ATTN_SWEEP=${GPU1_ATTN_SWEEP:-0} \
    bash bench/gptoss_120b_ab_gpu.sh > "$RES/ab1.log" 2>&1 || failed "GPU 1 vLLM A/B (exit $?)"
fi
wait "$ours" || failed "$gpu0 (exit $?)"
say "DP=2 through run_mlperf"
dp "${DP2_RUNS:-dp2}" > "$RES/dp2.log" 2>&1 || failed "DP=2 ${DP2_RUNS:-dp2} (exit $?)"
tables=()  # a table that fails: listed after the group (inside it, failed() would write into the table)
{
  cat "$HOME/ab0/table.txt" "$HOME/ab1/table.txt" 2>/dev/null
  [ -n "${GPU0_DP:-}" ] || for mode in ${MODES-v3}; do
    python3 - "$mode" "$HOME/ab0/$mode/results.jsonl" "$HOME/ab1/vllm/results.jsonl" 2>&1 <<'PY' \
      || tables+=("table $mode (exit $?)")
import json, sys
from pathlib import Path
sys.path.insert(0, "bench")
from gpu_table import table
print(f"== {sys.argv[1]} (GPU 0) beside vLLM (GPU 1)")
table([json.loads(line) for f in sys.argv[2:] if Path(f).exists() for line in open(f)])
PY
  done
  sed -n '/^run /,$p' "$RES/dp2.log"
} >> "$RES/table.txt"
for t in "${tables[@]}"; do failed "$t"; done
finish
