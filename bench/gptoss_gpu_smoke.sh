#!/usr/bin/env bash
# GPU side, one device call: does `run_mlperf.py --backend gptoss` run on CUDA with the real
# gpt-oss-20b shapes? Writes a random 20b checkpoint on the GPU, then an Offline accuracy run and an
# Offline performance run through LoadGen on random prompts. Needs .whl/ (bench/vllm_gpu_prepare.sh).
#   bash bench/gptoss_gpu_smoke.sh [ROWS] [PROMPT_LEN] [OUTPUT_LEN]
set -euo pipefail
cd "$(dirname "$0")/.."
ROWS=${1:-64} PROMPT_LEN=${2:-256} OUTPUT_LEN=${3:-64}
RES=${OUT:-$PWD/gptoss_gpu_out}; mkdir -p "$RES"
CKPT=${CKPT:-/tmp/gptoss20b-random}; DATA=/tmp/gptoss_gpu_smoke.parquet
export PYTHONUNBUFFERED=1
bash bench/harness_wheels.sh
[ -f "$CKPT/config.json" ] || python3 -m gptoss.tools.make_checkpoint --preset 20b --device cuda --out "$CKPT"
python3 - "$DATA" "$ROWS" "$PROMPT_LEN" "$OUTPUT_LEN" <<'PY'
import sys
import numpy as np
import pandas as pd
path, rows, plen, olen = sys.argv[1], *map(int, sys.argv[2:])
ids = np.random.default_rng(0).integers(0, 199_998, size=(rows, plen))
pd.DataFrame({"tok_input": list(ids), "tok_input_len": plen, "dataset": "gpqa_diamond",
              "max_output_len": olen}).to_parquet(path)
PY
common=(--backend gptoss --model-path "$CKPT" --device cuda --input-file "$DATA" --output-dir "$RES/run")
python3 run_mlperf.py "${common[@]}" --scenario offline --accuracy --max-new-tokens "$OUTPUT_LEN" 2>&1 | tail -14
python3 run_mlperf.py "${common[@]}" --scenario offline --min-duration 0 --min-query-count "$ROWS" 2>&1 | tail -14
