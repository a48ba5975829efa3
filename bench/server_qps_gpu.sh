#!/usr/bin/env bash
# GPU side, one device call: the highest VALID Server QPS of one backend at MLPerf's gpt-oss limits
# (TTFT p99 3 s, TPOT p99 80 ms), through `run_mlperf.py --qps-sweep` (one started engine, a LoadGen
# run per QPS, ascending, stopping at the first INVALID one). N >= 459 queries per run: LoadGen's
# early stopping cannot call a p99 run VALID with fewer. Every row generates exactly OUT tokens
# (max_output_len), greedy, on the random 20b checkpoint. Needs .whl; vllm after vllm_peer_install.sh.
# WARMUP=N (default 0) sends N untimed queries first (run_mlperf.py --warmup); MAX_BATCHED, when set,
# is --max-num-batched-tokens, the most prompt tokens a step takes (a long prefill step stalls every
# running decode: TPOT); unset, each backend's Server default (gptoss 8192, vllm 2048).
#   bash bench/server_qps_gpu.sh BACKEND QPS_LIST [N] [IN] [OUT]     e.g. gptoss 6,8,10,12 500 1024 512
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
BACKEND=$1 QPS=$2 N=${3:-500} IN=${4:-1024} OUTLEN=${5:-512}
RES=${OUT:-$PWD/gptoss_gpu_out}/server_$BACKEND; mkdir -p "$RES"
CKPT=${CKPT:-/tmp/ck20}; DATA=/tmp/server_${N}x${IN}x${OUTLEN}.parquet
export PYTHONUNBUFFERED=1 TRITON_INTERPRET=0 VLLM_NO_USAGE_STATS=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export VLLM_USE_FLASHINFER_SAMPLER=0  # this machine has no flashinfer
bash bench/harness_wheels.sh
[ -f "$CKPT/config.json" ] || python3 -m gptoss.tools.make_checkpoint --preset 20b --device cuda --out "$CKPT" >/dev/null
python3 bench/rand_dataset.py "$DATA" "$N" "$IN" "$OUTLEN"
echo '{"temperature": 0, "top_p": 1.0, "top_k": -1, "max_new_tokens": 10240}' > /tmp/greedy.json
extra=(); [ "$BACKEND" = gptoss ] && extra=(--device cuda)
[ -n "${MAX_BATCHED:-}" ] && extra+=(--max-num-batched-tokens "$MAX_BATCHED")
start=$(date +%s)
python3 run_mlperf.py --backend "$BACKEND" "${extra[@]}" --model-path "$CKPT" --scenario server \
  --input-file "$DATA" --qps-sweep "$QPS" --min-duration 0 --min-query-count "$N" \
  --generation-config /tmp/greedy.json --max-num-seqs 1024 \
  --max-model-len 4096 --warmup "${WARMUP:-0}" --output-dir "$RES" > "$RES/sweep.log" 2>&1
rc=$?
sed -n '/QPS sweep/,$p' "$RES/sweep.log" | tail -14
python3 - "$RES" "$BACKEND" "$rc" "$start" "$N" "$IN" "$OUTLEN" <<'PY'
import json, os, sys, time
res, backend, rc, start, n, lin, lout = sys.argv[1:]
s = json.load(open(f"{res}/qps_sweep.json"))
row = {"backend": backend, "warmup": s.get("warmup"), "max_batched": os.environ.get("MAX_BATCHED") or "default", "exit": int(rc), "wall_s": round(time.time() - float(start)),
       "workload": f"{n} x ({lin} -> {lout})", "highest_valid_qps": s["highest_valid_qps"], "points": s["points"]}
print("RESULT " + json.dumps(row))
open(f"{res}/../server_results.jsonl", "a").write(json.dumps(row) + "\n")
PY
