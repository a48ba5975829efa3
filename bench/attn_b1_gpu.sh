#!/usr/bin/env bash
# GPU side, one H200, one device call (~8 min): batch-1 decode variants (attention, GEMVs, MoE), alone
# and in the engine. While the random 120b is written to a tmpfs, the compiled attention tests (TESTS_FILES, -k
# TESTS) run beside it; then, with LINEAR (a --variants list), bench/kernels/linear_gpu.py (the decode
# GEMVs alone), bench/kernels/attn_chain_gpu.py (attention's layers in a CUDA graph,
# alone and between the projections, MICRO_ARGS), then bench/decode_ab_gpu.py on the 120b
# (V120: its --variant list) and, while the call has time (LIMIT20 s since the start), on a random
# 20b (V20), each table with the kernels named in SHOW. Everything under RES ($OUT by default); the
# tables last, and the steps that failed (each with its exit status; the script's then 1).
#   bash bench/attn_b1_gpu.sh
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
RES=${RES:-${OUT:-$HOME/attn_b1}}
CKPT=${CKPT:-/mnt/ck120/gptoss-120b-random}
# shellcheck source-path=SCRIPTDIR/..
. bench/gpu_detached.sh
V120=${V120-"default= old=attention.LIVE_SPLITS=False"}  # empty: no 120b (its checkpoint neither)
V20=${V20-$V120}
TESTS_FILES=${TESTS_FILES:-tests/gptoss/kernels/test_attention_splits.py tests/gptoss/kernels/test_attention_rope.py
  tests/gptoss/kernels/test_attention_kernel.py tests/gptoss/kernels/test_kernel_engine.py}
TESTS=${TESTS:-"not kernel_engine or small_launch or merge_in_kernel or multi_step"}
variants() { local v; for v in $1; do printf -- '--variant %s ' "$v"; done; }
nvidia-smi -L
if [ "$TESTS" != none ]; then
  say "compiled tests (beside the checkpoint)"
  # shellcheck disable=SC2086  # TESTS_FILES is a list of paths
  (timeout "${TESTS_LIMIT:-240}" python3 -m pytest -q -n 0 -p no:cacheprovider -rf $TESTS_FILES -k "$TESTS" \
    > "$RES/tests.txt" 2>&1) &
  tests_pid=$!
fi
[ -n "$V120" ] && checkpoint_120b
if [ "$TESTS" != none ]; then
  wait "$tests_pid" || failed "compiled tests (exit $?)"
  tail -8 "$RES/tests.txt"; row "compiled tests" "$(tail -1 "$RES/tests.txt")"
fi
if [ -n "${LINEAR:-}" ]; then  # the decode GEMVs alone (bench/kernels/linear_gpu.py --variants LINEAR)
  say "decode GEMVs alone"
  timeout 240 python3 bench/kernels/linear_gpu.py --ts 1,2 --variants "$LINEAR" > "$RES/linear.txt" 2>&1 \
    || failed "decode GEMVs (exit $?)"
  tail -20 "$RES/linear.txt"
fi
if [ "${MICRO:-1}" = 1 ]; then
  say "attention chains"
  # shellcheck disable=SC2086  # MICRO_ARGS is a list of flags
  timeout 180 python3 bench/kernels/attn_chain_gpu.py ${MICRO_ARGS:-} > "$RES/chain.txt" 2>&1 \
    || failed "attention chains (exit $?)"
  sed -n '/^  ctx/,$p' "$RES/chain.txt"
fi
ab() {  # ab NAME CKPT VARIANTS LIMIT
  say "decode A/B $1"
  # shellcheck disable=SC2046  # one --variant a word
  timeout "$4" python3 bench/decode_ab_gpu.py --model-path "$2" --rounds "${ROUNDS:-2}" $(variants "$3") \
    $(for k in ${SHOW:-_attn_kernel _rmsnorm}; do printf -- '--show %s ' "$k"; done) > "$RES/ab_$1.txt" 2>&1 \
    || failed "decode A/B $1 (exit $?)"
  sed -n '/^batch /,$p' "$RES/ab_$1.txt"
}
[ -n "$V120" ] && ab 120b "$CKPT" "$V120" "${LIMIT120:-260}"
if [ -n "$V20" ] && [ $(( $(date +%s) - t0 )) -lt "${LIMIT20:-430}" ]; then
  rm -rf /mnt/ck120  # the 20b goes to the disk; the tmpfs's 61 GiB back to the host
  umount /mnt/ck120 2>/dev/null
  python3 -m gptoss.tools.make_checkpoint --preset 20b --device cuda --out /tmp/ck20 > "$RES/ck20.txt" 2>&1 \
    || failed "20b checkpoint (exit $?)"
  ab 20b /tmp/ck20 "$V20" "${LIMIT20AB:-150}"
fi
finish; status=$?  # the script's exit status, after the benches' own tables below
echo "== chains"; sed -n '/^  ctx/,$p' "$RES/chain.txt" 2>/dev/null
[ -n "${LINEAR:-}" ] && { echo "== decode GEMVs alone"; tail -20 "$RES/linear.txt"; }
for f in "$RES"/ab_*.txt; do echo "== $f"; sed -n '/^batch /,$p' "$f"; done
exit $status
