#!/usr/bin/env bash
# GPU side, one device call: `run_mlperf.py --backend gptoss` Offline through LoadGen against the raw
# engine (bench/gptoss_gpu.py) on the same workload shape, N x (IN -> OUT), greedy, every row
# generating exactly OUT tokens (max_output_len column). Needs .whl (bench/vllm_gpu_prepare.sh).
#   bash bench/gptoss_gpu_harness.sh [N] [IN] [OUT]
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
N=${1:-1000} IN=${2:-128} OUTLEN=${3:-1024}
RES=${OUT:-$PWD/gptoss_gpu_out}; mkdir -p "$RES"
CKPT=${CKPT:-/tmp/ck20}; DATA=/tmp/harness_${N}x${IN}x${OUTLEN}.parquet
export PYTHONUNBUFFERED=1 TRITON_INTERPRET=0
bash bench/harness_wheels.sh
[ -f "$CKPT/config.json" ] || python3 -m gptoss.tools.make_checkpoint --preset 20b --device cuda --out "$CKPT" >/dev/null
python3 bench/rand_dataset.py "$DATA" "$N" "$IN" "$OUTLEN"
echo '{"temperature": 0, "top_p": 1.0, "top_k": -1, "max_new_tokens": 10240}' > /tmp/greedy.json
# HARNESS_RUNS: a run per word, "inproc" (--no-engine-process: the engine thread in run_mlperf's process)
# and/or "process" (the engine in its own process, sharing no GIL with LoadGen: the default on CUDA)
for run in ${HARNESS_RUNS:-inproc process}; do
  extra=(--no-engine-process); [ "$run" = process ] && extra=(--engine-process)
  echo "== harness $run"
  python3 run_mlperf.py --backend gptoss --device cuda --model-path "$CKPT" --scenario offline --input-file "$DATA" \
    --min-duration 0 --min-query-count "$N" --generation-config /tmp/greedy.json --max-num-seqs 1024 \
    --max-num-batched-tokens 16384 --max-model-len 8192 "${extra[@]}" --output-dir "$RES/harness_$run" 2>&1 | tail -12
done
python3 bench/gptoss_gpu.py --model-path "$CKPT" --engine gptoss --decode 128x512 --throughput "${N}x${IN}x${OUTLEN}" \
  --out "$RES" 2>&1 | grep -v Warn | tail -6
for run in ${HARNESS_RUNS:-inproc process}; do
  echo "$run: $(grep -h "tokens per second\|Result is" "$RES/harness_$run"/offline/performance/mlperf_log_summary.txt | tr '\n' ' ')"
done
