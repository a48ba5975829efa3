#!/usr/bin/env bash
# GPU side, ONE device command after .wc1 .wc2 (.wc3 + .whl with it) were sent; about 8-9 min on an H100:
#   bash bench/vllm_gpu.sh
# installs vLLM 0.26.0 (+ the harness wheels from .whl), writes a random gpt-oss-20b checkpoint on
# the GPU (in parallel with the install), then runs bench/vllm_gpu.py: vLLM's LLM.generate and
# run_mlperf --backend vllm Offline through LoadGen on the same 1000 x 1024 -> 512 workload.
# BENCH_ARGS overrides the workload, e.g. BENCH_ARGS="--requests 500 --output-len 256".
# Results: $OUT (the device tool's return folder) or ./vllm_gpu_out: results.jsonl, the logs, the
# two LoadGen summaries.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
RES=${OUT:-$PWD/vllm_gpu_out}; mkdir -p "$RES"
PY=${PYTHON:-python3}; WORK=${WORK:-/tmp/vllm_gpu}; CKPT=${CKPT:-/tmp/gptoss20b-random}
mkdir -p "$WORK"
export PYTHONUNBUFFERED=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
# flashinfer is not carried; vLLM 0.26.0 otherwise imports it for its sampler (see vllm_device/README).
export VLLM_USE_FLASHINFER_SAMPLER=0
t0=$(date +%s)
say() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
nvidia-smi -L; "$PY" -V

if [ ! -f "$CKPT/config.json" ]; then
  say "checkpoint: gpt-oss-20b, random weights, on the GPU (background)"
  "$PY" -m gptoss.tools.make_checkpoint --preset 20b --device cuda --out "$CKPT" > "$WORK/checkpoint.log" 2>&1 &
  ckpt_pid=$!
fi

say "vLLM 0.26.0 (installed unless it is)"
bash bench/vllm_install.sh "$PY" "$WORK/install.log" || { cp "$WORK/install.log" "$RES"/; exit 1; }
bash bench/harness_wheels.sh "$PY" || exit 1

if [ -n "${ckpt_pid:-}" ]; then
  wait "$ckpt_pid" || { tail -20 "$WORK/checkpoint.log"; cp "$WORK/checkpoint.log" "$RES"/; exit 1; }
  tail -1 "$WORK/checkpoint.log"
fi
say "benchmark"
# ${BENCH_ARGS} unquoted on purpose: it holds several flags.
# shellcheck disable=SC2086
timeout $(( 570 - ($(date +%s) - t0) )) "$PY" bench/vllm_gpu.py all --model-path "$CKPT" --out "$WORK" ${BENCH_ARGS:-}
rc=$?
say "done (rc $rc)"
for f in results.jsonl llm.log harness.log; do [ -f "$WORK/$f" ] && cp "$WORK/$f" "$RES"/; done
for k in final delta; do
  s="$WORK/harness_$k/offline/performance/mlperf_log_summary.txt"
  [ -f "$s" ] && cp "$s" "$RES/summary_$k.txt"
done
cat "$WORK"/checkpoint.log "$WORK"/install.log > "$RES/setup.log" 2>/dev/null
exit $rc
