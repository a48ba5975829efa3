#!/usr/bin/env bash
# GPU side, one device call, no vLLM needed: our engine's batch-1 decode under switch variants (the
# defaults; the split router GPTOSS_ROUTER=split, the fused QKV + RoPE GPTOSS_QKV, gate_up's register
# cap GPTOSS_GATE_UP_MAXNREG, attention's in-kernel split merge GPTOSS_ATTN_REDUCE, the last three
# together; default2/all2 repeat two of them for the run-to-run spread), the
# compiled kernel tests of the decode path, greedy agreement and batch invariance, batch-1 kernel
# profiles of PROFILE_VARIANTS, then Offline throughput. One table last.
#   bash bench/decode_variants_gpu.sh [THROUGHPUT ...]     e.g. 1000x1024x1024 1000x128x1024
# Variants: name=ENV assignments (space separated) in VARIANTS, default below. TESTS=none skips
# the tests, AGREEMENT=0 the agreement run, PROFILE_VARIANTS=none the profiles.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
RES=${OUT:-$PWD/gptoss_gpu_out}; mkdir -p "$RES"
CKPT=${CKPT:-/tmp/ck20}
export PYTHONUNBUFFERED=1 TRITON_INTERPRET=0
t0=$(date +%s); say() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
nvidia-smi -L
[ -f "$CKPT/config.json" ] || python3 -m gptoss.tools.make_checkpoint --preset 20b --device cuda --out "$CKPT" \
  > "$RES/checkpoint.log" 2>&1 || { tail "$RES/checkpoint.log"; exit 1; }
say "compiled kernel tests of the decode path"
read -ra tests <<< "${TESTS:-tests/gptoss/kernels/test_norm_route.py tests/gptoss/kernels/test_small_ops.py \
tests/gptoss/kernels/test_moe_decode.py tests/gptoss/kernels/test_qkv_rope.py \
tests/gptoss/kernels/test_attention_splits.py::test_gpu_decode_merge_in_kernel}"
[ "${tests[0]}" = none ] || python3 -m pytest -q -n 0 -p no:cacheprovider "${tests[@]}" 2>&1 | tail -8 | tee "$RES/kernel_tests.txt"
# A variant's assignments are comma separated; a comma before anything but NAME= stays in the value
# (GPTOSS_V3_DEC_DOWN_TILES=16,32,128,2,2,4).
assignments() { sed -E 's/,([A-Z][A-Z0-9_]*=)/ \1/g' <<< "$1"; }
ALL=GPTOSS_ROUTER=fused,GPTOSS_QKV=fused,GPTOSS_GATE_UP_MAXNREG=80,GPTOSS_ATTN_REDUCE=fused
VARIANTS=${VARIANTS:-"default= split=GPTOSS_ROUTER=split qkv=GPTOSS_QKV=fused cap=GPTOSS_GATE_UP_MAXNREG=80 \
merge=GPTOSS_ATTN_REDUCE=fused all=$ALL default2= all2=$ALL"}
for v in $VARIANTS; do
  name=${v%%=*}; envs=${v#*=}
  say "decode 128x512: $name ($envs)"
  read -ra assigns <<< "$(assignments "$envs")"
  env "${assigns[@]}" python3 bench/gptoss_gpu.py --model-path "$CKPT" --engine gptoss --decode 128x512 \
    > "$RES/decode_$name.txt" 2>&1
  # the parent prints the table; its batch-1 row: "batch-1 decode 128->512  <ours> - tok/s host X ms/step"
  row=$(grep '^batch-1 decode' "$RES/decode_$name.txt" | tail -1)
  echo "$name: ${row:-FAILED (see decode_$name.txt)}" | tee -a "$RES/decode_table.txt"
done
if [ "${AGREEMENT:-1}" = 1 ]; then  # AGREEMENT=0: skip (measured elsewhere)
  say "agreement and batch invariance (default switches)"
  python3 bench/gptoss_gpu.py --model-path "$CKPT" --engine agreement --decode 128x512 > "$RES/agreement.txt" 2>&1
  grep -E "greedy_agreement|batch_invariance" "$RES/agreement.txt" | tail -2
fi
# Batch-1 kernel tables of chosen variants (names from VARIANTS), for each GPTOSS_PDL value in
# PROFILE_PDL (default "0 1"). Without PDL a kernel's time is its own; with it, its own time includes
# its wait for the one before, and the "added" column is its cost in the step.
for v in ${PROFILE_VARIANTS:-default all}; do
  [ "$v" = none ] && continue
  envs=$(tr ' ' '\n' <<< "$VARIANTS" | sed -n "s/^$v=//p" | head -1)
  read -ra assigns <<< "$(assignments "$envs")"
  for pdl in ${PROFILE_PDL:-0 1}; do
    say "profile batch 1: $v ($envs), GPTOSS_PDL=$pdl"
    env GPTOSS_PDL="$pdl" "${assigns[@]}" python3 bench/profile_gpu.py --model-path "$CKPT" --batch 1 \
      --steps 10 > "$RES/profile_b1_${v}_pdl$pdl.txt" 2>&1
    head -32 "$RES/profile_b1_${v}_pdl$pdl.txt"
  done
done
if [ $# -gt 0 ]; then
  say "offline $*"
  flags=(); for w in "$@"; do flags+=(--throughput "$w"); done
  python3 bench/gptoss_gpu.py --model-path "$CKPT" --engine gptoss "${flags[@]}" \
    --out "$RES" > "$RES/offline.txt" 2>&1
  sed -n '/^workload/,$p' "$RES/offline.txt"
fi
say "done"
echo "== decode 128x512, batch 1 (tok/s incl. prefill)"
cat "$RES/decode_table.txt"
