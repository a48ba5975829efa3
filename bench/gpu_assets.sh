#!/usr/bin/env bash
# GPU side: what the 20b LoRA benches need, each made once: the harness wheels (.whl), the random 20b
# checkpoint at $CKPT and a rank-16 adapter at $ADAPTER (logs in $RES).
#   CKPT=/tmp/ck20 ADAPTER=$RES/lora-r16 RES=$RES bash bench/gpu_assets.sh
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
python3 -c 'import mlperf_loadgen, orjson' 2>/dev/null || \
  python3 -m pip install -q --no-index --no-deps --no-compile --disable-pip-version-check .whl/*.whl
[ -f "$CKPT/config.json" ] || python3 -m gptoss.tools.make_checkpoint --preset 20b --device cuda --out "$CKPT" \
  > "$RES/checkpoint.log" 2>&1 || { tail "$RES/checkpoint.log"; exit 1; }
[ -f "$ADAPTER/adapter_config.json" ] || python3 -m gptoss.make_lora --model "$CKPT" --rank 16 --out "$ADAPTER" \
  > "$RES/adapter.log" 2>&1 || { tail "$RES/adapter.log"; exit 1; }
