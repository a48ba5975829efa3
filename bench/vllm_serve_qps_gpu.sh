#!/usr/bin/env bash
# GPU side, one device call after bench/vllm_peer_install.sh: the highest VALID Server QPS of vLLM's own
# server (`vllm serve`, over HTTP through `run_mlperf.py --backend openai`, --warmup 256), then of ours
# (bench/server_qps_gpu.sh gptoss). The machine's vLLM has no `vllm` command on PATH: the module runs, 500 x (1024 -> 512) each. VQPS, GQPS: the QPS lists (GQPS= skips ours).
#   bash bench/vllm_serve_qps_gpu.sh
set -uo pipefail
export PYTHONUNBUFFERED=1 TRITON_INTERPRET=0 VLLM_NO_USAGE_STATS=1 HF_HUB_OFFLINE=1 VLLM_USE_FLASHINFER_SAMPLER=0
R=${OUT:-$PWD/gptoss_gpu_out}; mkdir -p "$R"; DATA=/tmp/server_500x1024x512.parquet
python3 bench/rand_dataset.py "$DATA" 500 1024 512 >/dev/null
echo '{"temperature": 0, "top_p": 1.0, "top_k": -1, "max_new_tokens": 10240}' > /tmp/greedy.json
python3 -m vllm.entrypoints.openai.api_server --model /tmp/ck20 --skip-tokenizer-init --port 8000 \
  --max-num-seqs 1024 --max-num-batched-tokens 2048 --max-model-len 4096 > "$R/vllm_serve.log" 2>&1 &
pid=$!
for i in $(seq 1 300); do
  curl -sf http://127.0.0.1:8000/health >/dev/null && break
  kill -0 "$pid" 2>/dev/null || { tail -5 "$R/vllm_serve.log"; exit 1; }
  sleep 1
done
echo "vllm serve up after ${i} s"
timeout 300 python3 run_mlperf.py --backend openai --server-url http://127.0.0.1:8000 --scenario server \
  --input-file "$DATA" --qps-sweep "${VQPS:-8,16,24}" --min-duration 0 --min-query-count 500 \
  --generation-config /tmp/greedy.json --warmup 256 --output-dir "$R/serve" > "$R/serve_sweep.log" 2>&1
sed -n '/QPS sweep/,$p' "$R/serve_sweep.log" | tail -10
kill "$pid"; wait "$pid" 2>/dev/null; sleep 3
[ "${GQPS-56,64,80}" = "" ] && exit 0  # GQPS= : vLLM only
WARMUP=64 timeout 150 bash bench/server_qps_gpu.sh gptoss "${GQPS:-56,64,80}" 500 1024 512 2>&1 | tail -9
