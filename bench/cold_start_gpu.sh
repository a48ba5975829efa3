#!/usr/bin/env bash
# GPU side, one H200, detached over several device calls: what a fresh machine's first runs compile
# inside their timing, and how long it starts, now that the engine warms its kernels at start-up
# (gptoss.warmup) and compiles the recorded ones while it loads (gptoss.precompile). Each engine
# process starts on an empty Triton cache (TRITON_CACHE_DIR), as on a new machine or container.
#   1. tests/gptoss/kernels/test_warmup_gpu.py and test_precompile_gpu.py (compiled; beside the 20b
#      checkpoint's writing);
#   2. RECORD=1: gptoss.tools.record_specs on the 20b (and the 120b before its run) into this tree's
#      manifest (gptoss/kernels/specs/cuda-90.json), copied to $RES to be committed;
#   3. random 20b, bench/gptoss_gpu.py batch 1 + Offline 1000 x (1024 -> 1024), once a mode of WARM20
#      (default "pre nopre pre-warm nopre-warm"): pre the defaults (precompile and warm-up), nopre
#      --no-precompile, procs the precompile in processes (GPTOSS_PRECOMPILE_WORKERS=processes),
#      nowarm --no-warm-kernels --no-precompile (the rows name what compiled in each
#      timing); MODE-warm: MODE's start-up and batch 1 only, on the cache pre's run left (what a
#      kept cache starts in, with the precompile's cache hits against none);
#   4. random 120b (tmpfs), batch 1 + Offline 2000 x (1024 -> 1278), once a mode of WARM120 (default
#      "pre"; MODE-b1: a cold start-up and batch 1 only; RUN120=0 skips it);
#   VLLM=1, after the 20b modes: vLLM 0.26.0's batch 1 and Offline on the 20b, its start-up from an
#      empty Triton cache too (its own compile cache is empty on a fresh machine), once
#      $HOME/vllm_ready exists (`CKPT= bash bench/vllm_peer_install.sh && touch $HOME/vllm_ready` in
#      a later call, after .wc1 and .wc2): the start-up ratio in one run; our timed rows wait for it
#      too (VLLM_WAIT_S, 900), the tests and the checkpoint's writing do not;
#   5. AB: decode_ab_gpu.py argument lists, one process each, on the 20b (its cache warm by now),
#      separated by ';' (e.g. AB='--batch 3 --variant default= --variant sk3=...').
#   (setsid nohup bash bench/cold_start_gpu.sh > $HOME/cold.log 2>&1 &)   then poll $HOME/cold/done
# One table last: $HOME/cold/table.txt; then the steps that failed (each with its exit status; the
# script's then 1).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
RES=${RES:-$HOME/cold}
# shellcheck source-path=SCRIPTDIR/..
. bench/gpu_detached.sh
CK20=$CKPT CK120=${CK120:-/mnt/ck120/gptoss-120b-random}
SPECS=${SPECS:-gptoss/kernels/specs}  # where the engine reads its manifest (the tree's)
[ "${VLLM:-0}" = 1 ] && vllm_script

specs_back() {  # the manifest recorded here, into the tree again: a later device call's copy of the
  local kept=("$RES"/cuda-*.json)  # checkout puts back the committed one
  [ -e "${kept[0]}" ] || return 0  # nothing recorded in this run yet: the committed one is the one
  cp "${kept[@]}" "$SPECS"/ || say "specs_back: could not copy ${kept[*]} into $SPECS"
}

cold() {  # cold NAME CACHE ARGS...: one engine process, its rows into the table; its Triton cache
  local name=$1 cache=$2  # emptied first when CACHE is NAME, else another run's (warm) as it is
  shift 2
  [ "$cache" = "$name" ] && rm -rf "$HOME/tc_$cache"
  specs_back
  say "$name (cache tc_$cache): $*"
  env "${menv[@]}" TRITON_CACHE_DIR="$HOME/tc_$cache" timeout 900 python3 bench/gptoss_gpu.py --engine gptoss "$@" \
    --out "$RES/$name" > "$RES/$name.txt" 2>&1 || failed "$name (exit $?)"
  tail -20 "$RES/$name.txt"
  row "$name" "$(sed -n '/^workload/,$p' "$RES/$name.txt" | tr '\n' ' ')"
}

bash bench/harness_wheels.sh || failed "harness wheels (exit $?)"
if [ "${TESTS:-1}" = 1 ]; then
  say "compiled warm-up test (beside the 20b checkpoint)"
  (rm -rf "$HOME/tc_test"; TRITON_CACHE_DIR=$HOME/tc_test timeout 420 python3 -m pytest -q -n 0 \
    -p no:cacheprovider -rf tests/gptoss/kernels/test_warmup_gpu.py tests/gptoss/kernels/test_precompile_gpu.py \
    > "$RES/tests.txt" 2>&1) &
  tests_pid=$!
fi
gpu_prereqs
if [ "${TESTS:-1}" = 1 ]; then
  wait "$tests_pid" || failed "warm-up and precompile tests (exit $?)"
  tail -25 "$RES/tests.txt"
  row "warm-up and precompile tests" "$(grep -E "passed|failed|error" "$RES/tests.txt" | tail -1)"
fi
record() {  # record CKPT: the specializations its start-up and a short run meet, into the manifest
  say "record_specs $1"
  specs_back
  TRITON_CACHE_DIR=$HOME/tc_rec timeout 600 python3 -m gptoss.tools.record_specs --model-path "$1" \
    --max-num-seqs 1024 > "$RES/record.txt" 2>&1 || failed "record ${1##*/} (exit $?)"
  tail -3 "$RES/record.txt"
  row "record $(basename "$1")" "$(tail -1 "$RES/record.txt")"
  cp "$SPECS"/*.json "$RES/" || row "record $(basename "$1")" "no manifest in $SPECS to keep"
}
flags() {  # flags MODE: the bench's flags (and environment) for a mode of WARM20 / WARM120
  menv=()
  case $1 in
    pre) mode=() ;;
    procs) mode=(); menv=(GPTOSS_PRECOMPILE_WORKERS=processes) ;;
    nopre) mode=(--no-precompile) ;;
    nowarm) mode=(--no-warm-kernels --no-precompile) ;;
    *) say "unknown mode $1"; exit 1 ;;
  esac
}
# vLLM's install (a later device call) compiles and unpacks on the CPU, as our precompile does: with
# VLLM=1 the timed rows wait for it, so that it never runs inside our start-ups
if [ "${VLLM:-0}" = 1 ] && ! wait_vllm; then
  VLLM=0; row "vllm" "not installed within ${VLLM_WAIT_S:-900} s: no vLLM rows"
fi
[ "${RECORD:-1}" = 1 ] && record "$CK20"
for w in ${WARM20-pre nopre pre-warm nopre-warm}; do
  flags "${w%-warm}"
  if [[ $w == *-warm ]]; then
    cold "20b-$w" 20b-pre --model-path "$CK20" --decode 128x512 "${mode[@]}"
  else
    cold "20b-$w" "20b-$w" --model-path "$CK20" --decode 128x512 --throughput 1000x1024x1024 "${mode[@]}"
  fi
done
if [ "${VLLM:-0}" = 1 ]; then
  rm -rf "$HOME/tc_vllm"
  TRITON_CACHE_DIR=$HOME/tc_vllm vllm_engine
fi
if [ "${RUN120:-1}" = 1 ]; then
  CKPT=$CK120 checkpoint_120b
  [ "${RECORD:-1}" = 1 ] && record "$CK120"
  for w in ${WARM120-pre}; do
    flags "${w%-b1}"
    if [[ $w == *-b1 ]]; then  # a cold start-up and batch 1 only
      cold "120b-$w" "120b-$w" --model-path "$CK120" --decode 128x512 --max-model-len 4096 "${mode[@]}"
    else
      cold "120b-$w" "120b-$w" --model-path "$CK120" --decode 128x512 --throughput 2000x1024x1278 \
        --max-model-len 4096 "${mode[@]}"
    fi
  done
fi
IFS=';' read -ra abs <<< "${AB:-}"
i=0
for ab in "${abs[@]}"; do
  i=$((i + 1))
  say "decode A/B $i: $ab"
  # shellcheck disable=SC2086  # an argument list
  eval "timeout 600 python3 bench/decode_ab_gpu.py --model-path $CK20 --profile-tokens 0 $ab" \
    > "$RES/ab$i.txt" 2>&1 || failed "A/B $i (exit $?)"
  tail -14 "$RES/ab$i.txt"
  row "A/B $i" "$(tail -8 "$RES/ab$i.txt" | tr '\n' ' ')"
done
finish
