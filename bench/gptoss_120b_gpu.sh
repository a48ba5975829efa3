#!/usr/bin/env bash
# GPU side, one H200 (nvidia-h200): random gpt-oss-120b, our engine and vLLM 0.26.0 on the same
# checkpoint, MLPerf-shaped Offline 2000 x (1024 -> 1278) and batch-1 decode 128 -> 512, through
# bench/gptoss_gpu.py (same prompts, greedy, ignore_eos). The checkpoint (60.8 GiB) lives in a tmpfs:
# the disk has 64 GiB. Each Offline run takes minutes, so the steps go in back-to-back device calls
# on one machine; the long ones run detached (setsid) and outlive the call that starts them.
#   bash bench/gptoss_120b_gpu.sh gen       writes the checkpoint (detached; `ours` waits for it)
#   bash bench/gptoss_120b_gpu.sh ours      our engine, in the foreground
#   bash bench/gptoss_120b_gpu.sh vllm      vLLM (after bench/vllm_peer_install.sh), detached
#   bash bench/gptoss_120b_gpu.sh wait [S]  waits up to S seconds for vLLM, then prints the table
# $HOME/b120/work keeps results.jsonl and the logs between calls ($OUT is emptied before each);
# each step copies them to $OUT.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
S=$HOME/b120; mkdir -p "$S"
CK=/mnt/ck120/gptoss-120b-random
WORK=$S/work; mkdir -p "$WORK"
SHAPES=(--decode 128x512 --throughput 2000x1024x1278 --max-model-len 4096 --trace)
export PYTHONUNBUFFERED=1 TRITON_INTERPRET=0 VLLM_NO_USAGE_STATS=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export VLLM_USE_FLASHINFER_SAMPLER=0

wait_for() {  # file, seconds
  local until=$((SECONDS + $2))
  until [ -f "$1" ] || [ $SECONDS -ge $until ]; do sleep 3; done
  [ -f "$1" ]
}

case ${1:?step: gen, ours, vllm or wait} in
gen)
  mkdir -p /mnt/ck120
  grep -q " /mnt/ck120 " /proc/mounts || mount -t tmpfs -o size=72g tmpfs /mnt/ck120 || exit 1
  df -h /mnt/ck120 / | tail -2; free -g | head -2
  rm -f "$S/gen.rc"
  setsid nohup bash -c "python3 -m gptoss.tools.make_checkpoint --preset 120b --device cuda --out $CK; \
    echo \$? > $S/gen.rc" > "$S/gen.log" 2>&1 < /dev/null &
  echo "checkpoint -> $CK (detached)" ;;
ours)
  wait_for "$S/gen.rc" 300 && [ "$(cat "$S/gen.rc")" = 0 ] || { echo "no checkpoint"; cat "$S/gen.log"; exit 1; }
  tail -1 "$S/gen.log"; du -sh "$CK"
  python3 bench/gptoss_gpu.py --model-path "$CK" --engine gptoss "${SHAPES[@]}" --out "$WORK" ;;
vllm)
  rm -f "$S/vllm.rc"
  cp -f .wc1/bench_vllm.py "$S/" 2>/dev/null
  setsid nohup bash -c "python3 bench/gptoss_gpu.py --model-path $CK --engine vllm ${SHAPES[*]} \
    --vllm-script $S/bench_vllm.py --out $WORK; echo \$? > $S/vllm.rc" > "$S/vllm.log" 2>&1 < /dev/null &
  echo "vLLM bench started (detached)" ;;
wait)
  wait_for "$S/vllm.rc" "${2:-560}" && echo "vllm rc $(cat "$S/vllm.rc")" || echo "vllm still running"
  grep -E "RESULT|Error|error" "$WORK/vllm.log" 2>/dev/null | cut -c1-300 | tail -12
  python3 - "$WORK/results.jsonl" <<'PY'
import json, sys
sys.path.insert(0, "bench")
from gpu_table import table
table([json.loads(line) for line in open(sys.argv[1])])
PY
  ;;
esac
rc=$?
[ -n "${OUT:-}" ] && cp -f "$WORK"/*.jsonl "$WORK"/*.log "$S"/*.log "$OUT"/ 2>/dev/null
exit $rc
