#!/usr/bin/env bash
# GPU side, one H200, detached over several device calls: what a fresh machine's first runs compile
# inside their timing, now that the engine warms its kernels at start-up (gptoss.warmup). Each engine
# process starts on an empty Triton cache (TRITON_CACHE_DIR), as on a new machine or container.
#   1. tests/gptoss/kernels/test_warmup_gpu.py (compiled; beside the 20b checkpoint's writing);
#   2. random 20b, bench/gptoss_gpu.py batch 1 + Offline 1000 x (1024 -> 1024), with the warm-up and
#      then with --no-warm-kernels (WARM20="warm nowarm"; the rows name what compiled in each timing);
#   3. random 120b (tmpfs), batch 1 + Offline 2000 x (1024 -> 1278), with the warm-up (RUN120=1);
#   4. AB: decode_ab_gpu.py argument lists, one process each, on the 20b (its cache warm by now),
#      separated by ';' (e.g. AB='--batch 3 --variant default= --variant sk3=...').
#   (setsid nohup bash bench/cold_start_gpu.sh > $HOME/cold.log 2>&1 &)   then poll $HOME/cold/done
# One table last: $HOME/cold/table.txt.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
RES=${RES:-$HOME/cold}
# shellcheck source-path=SCRIPTDIR/..
. bench/gpu_detached.sh
CK20=$CKPT CK120=${CK120:-/mnt/ck120/gptoss-120b-random}

cold() {  # cold NAME ARGS...: one engine process on an empty Triton cache, its rows into the table
  local name=$1
  shift
  rm -rf "$HOME/tc_$name"
  say "cold $name: $*"
  TRITON_CACHE_DIR=$HOME/tc_$name timeout 900 python3 bench/gptoss_gpu.py --engine gptoss "$@" \
    --out "$RES/$name" > "$RES/$name.txt" 2>&1
  tail -20 "$RES/$name.txt"
  row "$name" "$(sed -n '/^workload/,$p' "$RES/$name.txt" | tr '\n' ' ')"
}

python3 -c 'import mlperf_loadgen, orjson' 2>/dev/null || \
  python3 -m pip install -q --no-index --no-deps --no-compile --disable-pip-version-check .whl/*.whl
if [ "${TESTS:-1}" = 1 ]; then
  say "compiled warm-up test (beside the 20b checkpoint)"
  (rm -rf "$HOME/tc_test"; TRITON_CACHE_DIR=$HOME/tc_test timeout 420 python3 -m pytest -q -n 0 \
    -p no:cacheprovider -rf tests/gptoss/kernels/test_warmup_gpu.py > "$RES/tests.txt" 2>&1) &
fi
gpu_prereqs
wait
if [ "${TESTS:-1}" = 1 ]; then
  tail -25 "$RES/tests.txt"
  row "warm-up test" "$(grep -E "passed|failed|error" "$RES/tests.txt" | tail -1)"
fi
for w in ${WARM20-warm nowarm}; do
  flag=(); [ "$w" = nowarm ] && flag=(--no-warm-kernels)
  cold "20b-$w" --model-path "$CK20" --decode 128x512 --throughput 1000x1024x1024 "${flag[@]}"
done
if [ "${RUN120:-1}" = 1 ]; then
  CKPT=$CK120 checkpoint_120b
  cold 120b-warm --model-path "$CK120" --decode 128x512 --throughput 2000x1024x1278 --max-model-len 4096
fi
IFS=';' read -ra abs <<< "${AB:-}"
i=0
for ab in "${abs[@]}"; do
  i=$((i + 1))
  say "decode A/B $i: $ab"
  # shellcheck disable=SC2086  # an argument list
  eval "timeout 600 python3 bench/decode_ab_gpu.py --model-path $CK20 --profile-tokens 0 $ab" \
    > "$RES/ab$i.txt" 2>&1
  tail -14 "$RES/ab$i.txt"
  row "A/B $i" "$(tail -8 "$RES/ab$i.txt" | tr '\n' ' ')"
done
finish
