#!/usr/bin/env bash
# GPU side, one H100 or H200, no vLLM: the sampling filters compiled and timed. While the random 20b is
# written, the compiled sampling tests run beside it; then bench/kernels_gpu.py --only ops (the
# top-p search against the sort, the sort in blocks against one call, a batch's filtered rows alone
# against all of them); with TILES (a --tiles list) bench/kernels/top_p_gpu.py (the search's pass
# tiles); then bench/decode_ab_gpu.py on the 20b, RUNS of: top_p (the sort, the search with a masked
# copy, the search drawn through the cut: the default), top_k_p (top_k 50 + top_p with the masked
# copy, and with the cut: the default), screen (temperature 1 unfiltered, as MLPerf samples: the
# draw unscreened, screened within a chunk (the default from 64 rows), and across a row's chunks:
# sampling_draw.SCREEN 0 / 1 / 2), shape (the screened draw's launch, sampling_draw.SCREEN_*: steps of
# 256 on one warp in chunks of up to 8,192, the default since v70; v69's 1,024 on 4 warps in chunks of
# up to 16,384; 512 on 2 warps),
# greedy (the peer); RUNS=none, no decode. SWEEP (a batch list) runs bench/kernels/draw_sweep_gpu.py
# (the draw's SCREEN x chunk x block and warps against its default) after the ops. OPS=0 skips the
# ops, TESTS=none the tests; RECORD=1 records the precompile manifest last. Everything under RES
# ($OUT by default); the table last, then the steps that failed (each with its exit status; the
# script's then 1).
#   bash bench/sampling_gpu.sh          (BATCH=1,64,256 DECODE=128x256 MAX_NUM_SEQS=256 by default)
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
RES=${RES:-${OUT:-$HOME/sampling_gpu}}
# shellcheck source-path=SCRIPTDIR/..
. bench/gpu_detached.sh
BATCH=${BATCH:-1,64,256}
DECODE=${DECODE:-128x256}
MAX_NUM_SEQS=${MAX_NUM_SEQS:-256}
TESTS=${TESTS:-tests/gptoss/kernels/test_sampling_kernel.py tests/gptoss/kernels/test_sampling_top_p.py
  tests/gptoss/kernels/test_kernel_engine_sampling.py tests/gptoss/kernels/test_sampling_screen.py}
nvidia-smi -L
if [ "$TESTS" != none ]; then
  say "compiled sampling tests (beside the checkpoint)"
  # shellcheck disable=SC2086  # TESTS is a list of paths
  (timeout "${TESTS_LIMIT:-420}" python3 -m pytest -q -n 0 -p no:cacheprovider -rf $TESTS \
    > "$RES/tests.txt" 2>&1) &
  tests_pid=$!
fi
gpu_prereqs
if [ "$TESTS" != none ]; then
  wait "$tests_pid" || failed "compiled tests (exit $?)"
  tail -8 "$RES/tests.txt"; row "compiled tests" "$(tail -1 "$RES/tests.txt")"
fi
if [ "${OPS:-1}" = 1 ]; then
  say "ops"
  timeout 300 python3 bench/kernels_gpu.py --only ops > "$RES/ops.txt" 2>&1 || failed "ops (exit $?)"
  grep -E "^(kernel|sample)" "$RES/ops.txt" | tee -a "$RES/table.txt"
fi
decode() {  # NAME SAMPLING VARIANT...
  local name=$1 sampling=$2; shift 2
  say "decode $name ($sampling)"
  local flags=(); for v in "$@"; do flags+=(--variant "$v"); done
  timeout "${DECODE_LIMIT:-420}" python3 bench/decode_ab_gpu.py --model-path "$CKPT" --batch "$BATCH" \
    --max-num-seqs "$MAX_NUM_SEQS" --decode "$DECODE" --profile-tokens "${PROFILE_TOKENS:-16}" \
    --sampling "$sampling" \
    "${flags[@]}" > "$RES/decode_$name.txt" 2>&1 || failed "decode $name (exit $?)"
  echo "== decode $name ($sampling)" >> "$RES/table.txt"
  sed -n '/^batch [0-9]*, /,$p' "$RES/decode_$name.txt" | grep -v '^$' >> "$RES/table.txt"
  tail -30 "$RES/decode_$name.txt"
}
if [ -n "${SWEEP:-}" ]; then
  say "draw launch shapes (B $SWEEP)"
  timeout "${SWEEP_LIMIT:-300}" python3 bench/kernels/draw_sweep_gpu.py --batch "$SWEEP" > "$RES/draw_sweep.txt" 2>&1 \
    || failed "draw sweep (exit $?)"
  sed -n '/^case /,$p' "$RES/draw_sweep.txt" | tee -a "$RES/table.txt"
fi
if [ -n "${TILES:-}" ]; then
  say "top-p search tiles ($TILES)"
  timeout 300 python3 bench/kernels/top_p_gpu.py --tiles "$TILES" > "$RES/top_p_tiles.txt" 2>&1 \
    || failed "tiles (exit $?)"
  sed -n '/^top-p 0.9 over/,$p' "$RES/top_p_tiles.txt" | tee -a "$RES/table.txt"
fi
for run in ${RUNS:-top_p top_k_p greedy}; do
  case $run in
    top_p) decode top_p temperature=1,top_p=0.9,seed=7 "sort=sampling_filter.TOP_P_SEARCH=False" \
      "search=sampling.USE_CUT=False" search_cut= ;;
    top_k_p) decode top_k_p temperature=1,top_k=50,top_p=0.9,seed=7 "mask=sampling.USE_CUT=False" cut= ;;
    screen) decode screen temperature=1,seed=7 "off=sampling_draw.SCREEN=0" local= \
      "shared=sampling_draw.SCREEN=2" ;;
    shape) decode shape temperature=1,seed=7 default= \
      "v69=sampling_draw.SCREEN_BLOCK=1024+sampling_draw.SCREEN_WARPS=4+sampling_draw.SCREEN_CHUNK_MAX=16384" \
      "b512=sampling_draw.SCREEN_BLOCK=512+sampling_draw.SCREEN_WARPS=2+sampling_draw.SCREEN_CHUNK_MAX=16384" ;;
    greedy) decode greedy greedy default= ;;
    none) ;;
    *) say "unknown run $run (top_p, top_k_p, screen, shape, greedy, none)"; exit 2 ;;
  esac
done
if [ "${RECORD:-0}" = 1 ]; then  # the precompile manifest: what the 20b meets at 4,096 keys, added to
  say "record_specs"              # the committed one, which comes back as $RES/cuda-90.json
  timeout 300 python3 -m gptoss.tools.record_specs --model-path "$CKPT" --max-model-len 4096 \
    > "$RES/record_specs.txt" 2>&1 || failed "record_specs (exit $?)"
  tail -3 "$RES/record_specs.txt"; row "record_specs" "$(tail -1 "$RES/record_specs.txt")"
  cp gptoss/kernels/specs/cuda-90.json "$RES/"
fi
finish
