#!/usr/bin/env bash
# GPU side, on 2 GPUs (nvidia-h200-x2): `run_mlperf.py --backend gptoss` Offline through LoadGen on a
# random gpt-oss-120b, data parallel over both GPUs (--data-parallel-size 2) against one GPU
# (--devices cuda:0), on MLPerf-shaped synthetic data: N x (IN -> OUT), every row generating exactly
# OUT tokens (max_output_len column, so ignore_eos), greedy. Prints one table. Needs .whl
# (bench/vllm_gpu_prepare.sh) unless mlperf_loadgen is installed.
#   bash bench/gptoss_dp_gpu.sh [N] [IN] [OUT] [RUNS]     defaults: 2000 1024 1278 "dp1 dp2"
# RUNS picks the runs of this call: dp1, dp2 (ours), vllm-tp2, vllm-dp2, vllm-tp2ep (vLLM 0.26 through
# run_mlperf --backend vllm, after bench/vllm_peer_install.sh; the leftover-process check covers them),
# each also as NAME-fp8 (--kv-cache-dtype fp8). Two calls may run at once, one GPU each.
# Results accumulate in $RES/results.jsonl and the table shows every run there, so the two can go in two device calls when one is too short
# (each Offline run of 2000 x 1278 tokens takes minutes). The checkpoint (CKPT, default
# /tmp/ck120) is written once, on the GPU, and kept for the next call on the same machine.
# Detached over several calls (the machine stays warm between them): VLLM_READY=FILE makes the vLLM
# runs wait (up to 15 min) for that file, which the call that installs vLLM writes; RUN_LIMIT (s,
# default 900) ends a run that hangs, and the leftover check then shows what it left.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
N=${1:-2000} IN=${2:-1024} OUTLEN=${3:-1278} RUNS=${4:-"dp1 dp2"}
RES=${OUT:-$PWD/gptoss_dp_gpu_out}; mkdir -p "$RES"
CKPT=${CKPT:-/tmp/ck120}; DATA=/tmp/dp_${N}x${IN}x${OUTLEN}.parquet; PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1 TRITON_INTERPRET=0
# NVLink multicast stays off on these shared hosts (KINDS.md), also in the processes vLLM starts
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
RUN_LIMIT=${RUN_LIMIT:-900}
# vLLM runs: the payload carries no flashinfer (its sampler would import it), and nothing phones home
export VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_NO_USAGE_STATS=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
t0=$(date +%s)
say() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
nvidia-smi -L
[[ $RUNS != *2* ]] || [ "$(nvidia-smi -L | wc -l)" -ge 2 ] || { echo "needs 2 GPUs"; exit 1; }
bash bench/harness_wheels.sh "$PY" || exit 1
if [ ! -f "$CKPT/config.json" ]; then
  say "checkpoint: gpt-oss-120b, random weights, written on the GPU"
  "$PY" -m gptoss.tools.make_checkpoint --preset 120b --device cuda --out "$CKPT" | tail -1 || exit 1
fi
[ -f "$DATA" ] || "$PY" bench/rand_dataset.py "$DATA" "$N" "$IN" "$OUTLEN"  # (written whole, then renamed)
echo '{"temperature": 0, "top_p": 1.0, "top_k": -1, "max_new_tokens": 10240}' > /tmp/greedy.json

failed=0
for run in $RUNS; do
  case ${run%-fp8} in  # NAME-fp8: NAME on an fp8 KV cache (twice the sequences a replica)
    dp1) devices=(--backend gptoss --devices cuda:0) ;;
    dp2) devices=(--backend gptoss --data-parallel-size 2 --device cuda) ;;
    # vLLM on both GPUs (installed first: bench/vllm_peer_install.sh); its own engine flags
    vllm-tp2) devices=(--backend vllm --tensor-parallel-size 2) ;;
    vllm-dp2) devices=(--backend vllm --data-parallel-size 2) ;;
    vllm-tp2ep) devices=(--backend vllm --tensor-parallel-size 2 --enable-expert-parallel) ;;
    *) echo "unknown run $run (dp1, dp2, vllm-tp2, vllm-dp2, vllm-tp2ep, each with or without -fp8)"; exit 2 ;;
  esac
  [[ $run != *-fp8 ]] || devices+=(--kv-cache-dtype fp8)
  if [[ $run == vllm-* && -n ${VLLM_READY:-} ]]; then
    until [ -f "$VLLM_READY" ] || [ $(( $(date +%s) - t0 )) -ge 900 ]; do sleep 5; done
    [ -f "$VLLM_READY" ] || { say "$run: vLLM never installed ($VLLM_READY)"; failed=1; continue; }
  fi
  say "$run: ${devices[*]}"
  start=$(date +%s.%N)
  # timeout leads its own process group, which the run's spawned processes join: the leftover check
  # below counts that group, so a run on the other GPU at the same time is not counted as this one's
  timeout --kill-after=30 "$RUN_LIMIT" "$PY" run_mlperf.py "${devices[@]}" --model-path "$CKPT" --scenario offline \
    --input-file "$DATA" --min-duration 0 --min-query-count "$N" --generation-config /tmp/greedy.json \
    --max-num-seqs 1024 --max-num-batched-tokens 16384 --max-model-len 4096 \
    --output-dir "$RES/$run" > "$RES/$run.log" 2>&1 &
  group=$!
  wait $group
  rc=$?
  end=$(date +%s.%N)
  grep -E "^gptoss: replica|Result is|error" "$RES/$run.log" | head -8
  # Shutdown leaves nothing behind: no replica process, no GPU memory held.
  sleep 3  # a process still there 3 s after the harness exited is a leftover
  left=$(pgrep -c -g "$group" || true)
  # only this run's GPUs (CUDA_VISIBLE_DEVICES, as nvidia-smi -i takes them): another GPU may be busy
  held=$(nvidia-smi ${CUDA_VISIBLE_DEVICES:+-i "$CUDA_VISIBLE_DEVICES"} --query-compute-apps=pid --format=csv,noheader | wc -l)
  "$PY" - "$RES" "$run" "$rc" "$start" "$end" "$N" "$IN" "$OUTLEN" "$left" "$held" <<'PY'
import json, os, sys
res, run, rc, start, end, n, lin, out, left, held = sys.argv[1:]
path = f"{res}/{run}/offline/performance/run.json"
r = json.load(open(path)) if os.path.exists(path) else {}
result = r.get("result") or {}
backend = r.get("backend") or {}
devices = backend.get("device")
if (v := backend.get("resolved")) is not None:  # vLLM: what it made of the parallel flags
    devices = f"tp{v['tensor_parallel_size']} dp{v['data_parallel_size']}" + (" ep" if v["enable_expert_parallel"] else "")
row = {"run": run, "exit": int(rc), "wall_s": round(float(end) - float(start), 1), "devices": devices, "validity": result.get("validity", "error"),
       "tok_s": result.get("tokens_per_s") or 0.0, "samples_s": result.get("samples_per_s"),
       "failed": (r.get("failures") or {}).get("count"), "workload": f"{n} x ({lin} -> {out})",
       "procs_left": int(left), "gpu_procs_left": int(held)}
print("RESULT " + json.dumps(row))
open(f"{res}/results.jsonl", "a").write(json.dumps(row) + "\n")
PY
  [ "$rc" -eq 0 ] || failed=1
done

"$PY" - "$RES/results.jsonl" <<'PY'
import json, sys
rows = {}
for line in open(sys.argv[1]):
    r = json.loads(line)
    rows[r["run"]] = r  # the latest of each
vllm = [r for name, r in rows.items() if name.startswith("vllm-") and r["validity"] == "VALID"]
best = max(vllm, key=lambda r: r["tok_s"], default=None)
print(f"\n{'run':10} {'devices':16} {'workload':22} {'validity':9} {'out tok/s':>11} {'vs dp1':>7} "
      f"{'vs best vLLM':>12} {'wall s':>7} {'exit':>4} {'failed':>6} {'left':>5}")
for name in ("dp1", "dp1-fp8", "dp2", "dp2-fp8", "vllm-tp2", "vllm-dp2", "vllm-tp2ep"):
    if (r := rows.get(name)) is None:
        continue
    # ours against DP=1 on the same cache dtype
    base = rows.get("dp1-fp8" if name == "dp2-fp8" else "dp1", {}).get("tok_s")
    ratio = f"{r['tok_s'] / base:.2f}x" if base and r["tok_s"] else "-"
    vs = f"{r['tok_s'] / best['tok_s']:.2f}x" if best and r["tok_s"] else "-"
    print(f"{name:10} {str(r['devices']):16} {r['workload']:22} {r['validity']:9} {r['tok_s']:11,.0f} "
          f"{ratio:>7} {vs:>12} {r['wall_s']:7.1f} {r['exit']:4} {str(r['failed']):>6} "
          f"{r['procs_left'] + r['gpu_procs_left']:5}")
if best:
    print(f"best vLLM: {best['run']}")
PY
say "done"
exit $failed
