#!/usr/bin/env bash
# GPU side, detached (issue 10's table in one run): the compiled tests named in TESTS first, then,
# once bench/vllm_peer_install.sh has run in a later call and touched $HOME/vllm_ready, the kernel
# table beside vLLM 0.26.0 (bench/kernels_gpu.py) and what a pure read of the decode MoE's bytes
# reaches (bench/kernels/read_ceiling_gpu.py): the ceiling the table's HBM column is judged against.
#   RES=$HOME/i10 TESTS="tests/..." setsid nohup bash bench/issue10_table_gpu.sh > $HOME/i10.log 2>&1 &
# READ_MB: the byte counts read (MB), default a 20b expert's gate_up (8.81 MB) and down (4.41 MB) at
# 4, 8, 16 and 28 distinct experts (one token to ~16: what the table's M <= 16 rows hit).
# ORDER=1 (default): then the attention rows again in the heads-first launch order
# (GPTOSS_ATTN_HEADS_FIRST=1, off in the engine until timed) and the decode attention sweep
# (bench/kernels/attn_sweep.py: settings in both orders beside FA3, issue 10's 8k full layers among
# its cases); ORDER=0 leaves them out.
# The table, then the steps that failed (each with its exit status; the script's then 1), then the
# kernel table, the heads-first rows and the sweep, and the read ceiling.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
RES=${RES:-$HOME/issue10}
# shellcheck source-path=SCRIPTDIR/..
. bench/gpu_detached.sh
nvidia-smi -L
bash bench/harness_wheels.sh || failed "harness wheels (exit $?)"
if [ -n "${TESTS:-}" ]; then
  say "compiled tests: $TESTS"
  # shellcheck disable=SC2086  # TESTS is a list of paths
  TRITON_INTERPRET=0 python3 -m pytest -q -p no:cacheprovider -n 0 -rfX $TESTS > "$RES/tests.log" 2>&1 \
    || failed "compiled tests (exit $?)"
  row "compiled tests" "$(tail -1 "$RES/tests.log")"
fi
wait_vllm || exit 1
say "kernel table"
python3 bench/kernels_gpu.py --only "${PARTS:-moe,attn,ops}" --out "$RES" > "$RES/table.log" 2>&1
rc=$?; row "kernels_gpu exit" "$rc"; [ "$rc" = 0 ] || failed "kernels_gpu (exit $rc)"
if [ "${ORDER:-1}" = 1 ]; then
  say "attention in the heads-first order"
  GPTOSS_ATTN_HEADS_FIRST=1 python3 bench/kernels_gpu.py --only attn --out "$RES/hf" > "$RES/table_hf.log" 2>&1
  rc=$?; row "kernels_gpu heads-first exit" "$rc"; [ "$rc" = 0 ] || failed "kernels_gpu heads-first (exit $rc)"
  say "decode attention sweep"
  python3 bench/kernels/attn_sweep.py > "$RES/sweep.log" 2>&1
  rc=$?; row "attn_sweep exit" "$rc"; [ "$rc" = 0 ] || failed "attn_sweep (exit $rc)"
fi
say "read ceiling"
python3 bench/kernels/read_ceiling_gpu.py --mbytes "${READ_MB:-17.6,35.2,70.5,141.0,123.4,246.7}" \
  > "$RES/ceiling.log" 2>&1
rc=$?; row "read_ceiling exit" "$rc"; [ "$rc" = 0 ] || failed "read_ceiling (exit $rc)"
finish; status=$?  # the script's exit status, after the two tables below
echo "== kernel table"; sed -n '/^kernel /,$p' "$RES/table.log"
if [ "${ORDER:-1}" = 1 ]; then
  echo "== attention, heads first"; sed -n '/^kernel /,$p' "$RES/table_hf.log"
  echo "== decode attention sweep"; cat "$RES/sweep.log"
fi
echo "== read ceiling"; sed -n '/ MB case/,$p' "$RES/ceiling.log"
exit $status
