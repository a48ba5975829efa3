#!/usr/bin/env bash
# GPU side, one H200, detached over several device calls: random gpt-oss-120b, our engine once per
# MoE kernel family (MODES, default "v3": GPTOSS_MOE_KERNELS; v3 = one v3 copy that every batch runs,
# 120b's default since v22; v2 = the decode kernels + the v2 GEMMs), then vLLM 0.26.0 on the same
# checkpoint and shapes (bench/gptoss_gpu.py: batch-1 128 -> 512, Offline N x (1024 -> 1278), N =
# 2000 on an H200), once $HOME/vllm_ready exists (bench/vllm_peer_install.sh in the third call).
# Between them (v23): the decode-batch MoE at 120b shapes, M 1-16, on the v3 decode tiles and their
# candidates beside the v2 decode kernels ("slot") and vLLM's matmul_ogs (bench/kernels/moe_gpu.py),
# then batch 1 alone (B1_MODES, default "v3old v2 v3pick"): v3old the tiles decode batches took
# before v23, v3pick the sweep's fastest (moe_pick.py), skipped where the table's own win,
# v3unfused the v3 default with GPTOSS_FUSED_DECODE=0 (routing and combine unfused), v3norm with
# GPTOSS_ROUTER=norm (a routing launch, not the routing inside gate_up), v3tab with GPTOSS_V3_DEC_DOWN=0
# (batch 1's down on v3's decode tiles, as before v24, not on moe_v3_dec's split-K slot kernel), and
# NAME=ENV=VALUE[+ENV=VALUE...] the v3 default under those variables (e.g. sk64=GPTOSS_ATTN_SPLIT_KEYS=64). VLLM_B1=1: vLLM
# runs batch 1 alone (its Offline 2000 takes ~7 min). VLLM=0 runs ours only (no
# wait for the install); MODES= (empty) skips the Offline run, and takes NAME=ENV=VALUE as B1_MODES does; SWEEP=0 the sweep (SWEEP_VARIANTS its
# variants, SWEEP_MS its M list, SWEEP_PEER=0 without vLLM's kernel, so without waiting for it); TESTS the compiled tests' -k expression (none: no tests, all: every test of TEST_FILES,
# default the few-rows files). A mode NAME-fp8 (MODES or B1_MODES, e.g. v3-fp8) runs NAME with
# --kv-cache-dtype fp8 --max-num-seqs FP8_SEQS. ATTN_SWEEP=1: decode attention's settings, bf16 then fp8 KV (attn_sweep.py).
# PROFILE=1: bench/profile_gpu.py at batch 1 after the batch-1 modes; NCU_STEP=1: then Nsight Compute
# on one batch-1 step (bench/moe_ncu_gpu.sh TARGET=step, NCU_LIMIT s); both before vLLM's run. The
# compiled tests (TESTS_LIMIT s, default 420) run while the checkpoint is written.
#   (setsid nohup bash bench/gptoss_120b_ab_gpu.sh > $HOME/ab.log 2>&1 &)   then poll $HOME/ab/done
# One table a mode last (ours beside vLLM): $HOME/ab/table.txt; then the steps that failed (each with
# its exit status; the script's then 1).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
RES=${RES:-$HOME/ab}
CKPT=${CKPT:-/mnt/ck120/gptoss-120b-random}  # a tmpfs: the disk has 64 GiB, the checkpoint 61 GiB
# shellcheck source-path=SCRIPTDIR/..
. bench/gpu_detached.sh
export VLLM_NO_USAGE_STATS=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_USE_FLASHINFER_SAMPLER=0
# N: 2000 on an H200; 600 on an H100, where vLLM's KV cache holds ~40 sequences (v22: 1,617 tok/s)
# and 2000 would outlast its 900 s limit.
N=${N:-$(nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 && echo 2000 || echo 600)}
SHAPES=(--decode 128x512 --throughput "${N}x1024x1278" --max-model-len 4096 --trace)
[ "${VLLM:-1}" = 1 ] && vllm_script
TEST_FILES=${TEST_FILES:-tests/gptoss/kernels/test_moe_v3.py tests/gptoss/kernels/test_moe_v3_tiles.py
  tests/gptoss/kernels/test_kernel_engine.py tests/gptoss/kernels/test_moe_decode.py
  tests/gptoss/kernels/test_moe_decode_flat.py tests/gptoss/kernels/test_norm_route.py
  tests/gptoss/kernels/test_moe_v3_dec.py}
# The compiled tests run while the checkpoint is written (~80 s; compiling them is CPU work), and
# the timed runs start once both are done (v33: 228 tests took over 480 s, mostly compiling).
if [ "${TESTS:-}" != none ]; then  # TESTS=none: no tests (another GPU of the machine runs them)
  say "compiled tests (beside the checkpoint)"
  select=(-k "${TESTS:-few_rows or v3_weights or routing_the_logits}")
  [ "${TESTS:-}" = all ] && select=()
  # shellcheck disable=SC2086  # TEST_FILES is a list of paths
  # the whole log too (tests_full.txt): v29 kept only the tail, and which assertion failed was lost
  # (the tests' exit status is the job's, not the tail's)
  (timeout "${TESTS_LIMIT:-420}" python3 -m pytest -q -n 0 -p no:cacheprovider -rf $TEST_FILES "${select[@]}" \
    > "$RES/tests_full.txt" 2>&1; rc=$?; tail -12 "$RES/tests_full.txt" > "$RES/tests.txt"; exit $rc) &
  tests_pid=$!
fi
checkpoint_120b
gpu_prereqs
if [ "${TESTS:-}" != none ]; then
  wait "$tests_pid" || failed "compiled tests (exit $?)"
  cat "$RES/tests.txt"
  row "compiled tests" "$(grep -E "FAILED|passed|failed" "$RES/tests.txt" | tr '\n' ' ')"
fi
if [ "${ATTN_SWEEP:-0}" = 1 ]; then
  for kv in auto fp8; do
    say "decode attention sweep, KV $kv"
    timeout 300 python3 bench/kernels/attn_sweep.py --configs 64,4,3 32,4,3 --kv-cache-dtype $kv \
      > "$RES/attn_$kv.txt" 2>&1 || failed "attention sweep $kv (exit $?)"
    cat "$RES/attn_$kv.txt"
  done
fi
ours() {  # ours MODE KERNELS V3_TILES SHAPES...: one engine process, rows into $RES/MODE
  local mode=$1 kernels=$2 tiles=$3
  shift 3
  say "ours $mode (GPTOSS_MOE_KERNELS=$kernels GPTOSS_MOE_V3_TILES=${tiles:-${GPTOSS_MOE_V3_TILES:-}})"
  # tiles unset: the environment's (a NAME=GPTOSS_MOE_V3_TILES=... mode's), not the table forced
  GPTOSS_MOE_KERNELS=$kernels GPTOSS_MOE_V3_TILES=${tiles:-${GPTOSS_MOE_V3_TILES:-}} timeout 900 python3 bench/gptoss_gpu.py \
    --model-path "$CKPT" --engine gptoss "$@" --out "$RES/$mode" > "$RES/ours_$mode.txt" 2>&1 \
    || failed "ours $mode (exit $?)"
  row "ours $mode" "$(sed -n '/^workload/,$p' "$RES/ours_$mode.txt" | tr '\n' ' ')"
}
MODES=${MODES-v3}  # set but empty: no Offline run
B1_MODES=${B1_MODES-v3old v2 v3pick}
# NAME-fp8: e4m3 caches, and room for the twice as many sequences they hold (FP8_SEQS; the bench's
# default cap, 1024, is above the ~880 a bf16 cache holds on an H200, below the ~1,800 of an fp8 one)
kv_args() { kv=(); [[ $1 == *-fp8 ]] && kv=(--kv-cache-dtype fp8 --max-num-seqs "${FP8_SEQS:-1792}"); return 0; }
mode_run() {  # mode_run MODE SHAPES...: NAME=ENV=VALUE[+ENV=VALUE...] the default kernels under those
  local mode=$1 assigns a  # variables; NAME[-fp8] that kernel family (on an fp8 cache)
  shift
  case $mode in
    *=*) read -ra assigns <<< "$(tr '+' ' ' <<< "${mode#*=}")"
         # exported for this call only (local -x) but in this shell, where ours' failed() is kept (a
         # subshell's is lost); NAME= (no variables) runs no local -x, which bare would list them all
         for a in "${assigns[@]}"; do local -x "${a?}"; done
         ours "${mode%%=*}" v3 "" "$@" ;;
    *) kv_args "$mode"; ours "$mode" "${mode%-fp8}" "" "$@" "${kv[@]}" ;;
  esac
}
for mode in $MODES; do mode_run "$mode" "${SHAPES[@]}"; done
have_vllm=0 waited=0
# VLLM=0: ours only, no wait. The sweep times vLLM's kernel beside ours, so it waits for the install
# here (SWEEP_PEER=0: ours alone, no wait); without it the batch-1 modes run while vLLM installs, and
# the wait comes before vLLM's run.
if [ "${VLLM:-1}" = 1 ] && [ "${SWEEP:-1}" = 1 ] && [ "${SWEEP_PEER:-1}" = 1 ]; then
  waited=1; wait_vllm && have_vllm=1
fi
pick=
if [ "${SWEEP:-1}" = 1 ]; then
  say "decode-batch MoE sweep, 120b shapes"
  peer=$([ $have_vllm = 1 ] && echo ,vllm)
  timeout 600 python3 bench/kernels/moe_gpu.py --experts 128 --ms "${SWEEP_MS:-1,2,4,8,16}" --rounds 3 \
    --variants "${SWEEP_VARIANTS:-v3,D-old,D-64k128s6,D-64k64s8,D-128k64s8,slot}$peer" > "$RES/moe_dec.txt" 2>&1 \
    || failed "sweep (exit $?)"
  tail -40 "$RES/moe_dec.txt"
  pick=$(python3 bench/kernels/moe_pick.py "$RES/moe_dec.txt" --experts 128 2> "$RES/pick.txt") \
    || failed "sweep pick (exit $?)"
  row "sweep pick" "${pick:-none, the table wins}: $(tr '\n' ' ' < "$RES/pick.txt")"
fi
B1=(--decode 128x512 --max-model-len 4096)
for mode in $B1_MODES; do
  case $mode in
    v3old) ours v3old v3 "gate_up@dec=32,64,128,4,4,half;down@dec=32,128,128,4,4,half" "${B1[@]}" ;;
    v3pick) [ -n "$pick" ] && ours v3pick v3 "$pick" "${B1[@]}" ;;
    v3unfused)  # the decode MoE through moe_forward (7 launches a layer), as before v23
      export GPTOSS_FUSED_DECODE=0
      ours v3unfused v3 "" "${B1[@]}"
      unset GPTOSS_FUSED_DECODE ;;
    v3norm)  # routed by norm_route's routing launch, not inside the v3 gate_up
      export GPTOSS_ROUTER=norm
      ours v3norm v3 "" "${B1[@]}"
      unset GPTOSS_ROUTER ;;
    v3tab)  # batch 1's down on v3's decode tiles, not the split-K slot kernel (moe_v3_dec)
      export GPTOSS_V3_DEC_DOWN=0
      ours v3tab v3 "" "${B1[@]}"
      unset GPTOSS_V3_DEC_DOWN ;;
    *) mode_run "$mode" "${B1[@]}" ;;
  esac
done
if [ "${PROFILE:-0}" = 1 ]; then  # where batch 1's step goes now (the defaults; PDL on: "added" µs)
  say "batch-1 profile"
  timeout 300 python3 bench/profile_gpu.py --model-path "$CKPT" --batch 1 --steps 10 > "$RES/profile.txt" 2>&1 \
    || failed "profile (exit $?)"
  sed -n '/^batch 1/,$p' "$RES/profile.txt"
fi
if [ "${NCU_STEP:-0}" = 1 ]; then  # Nsight Compute's counters of every kernel of one batch-1 step
  say "ncu on the step"
  RES=$RES/ncu TARGET=step CKPT=$CKPT timeout "${NCU_LIMIT:-420}" bash bench/moe_ncu_gpu.sh > "$RES/ncu.log" 2>&1 \
    || failed "ncu step (exit $?)"
  tail -40 "$RES/ncu.log"
fi
[ "${VLLM:-1}" = 1 ] && [ $waited = 0 ] && wait_vllm && have_vllm=1
if [ $have_vllm = 1 ]; then
  say "vLLM"
  vshapes=("${SHAPES[@]}")
  [ "${VLLM_B1:-0}" = 1 ] && vshapes=("${B1[@]}")  # batch 1 only: vLLM's Offline 2000 takes ~7 min
  timeout 900 python3 bench/gptoss_gpu.py --model-path "$CKPT" --engine vllm "${vshapes[@]}" \
    --vllm-script "$VLLM_SCRIPT" --out "$RES/vllm" > "$RES/vllm.txt" 2>&1 || failed "vllm (exit $?)"
fi
for mode in $MODES $B1_MODES; do
  mode=${mode%%=*}
  [ -f "$RES/$mode/results.jsonl" ] || continue
  echo "== $mode" >> "$RES/table.txt"
  python3 - "$RES/$mode/results.jsonl" "$RES/vllm/results.jsonl" >> "$RES/table.txt" 2>&1 <<'PY' \
    || failed "table $mode (exit $?)"
import json, sys
from pathlib import Path
sys.path.insert(0, "bench")
from gpu_table import table
table([json.loads(line) for f in sys.argv[1:] if Path(f).exists() for line in open(f)])
PY
done
finish
