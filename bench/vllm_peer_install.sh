#!/usr/bin/env bash
# GPU side, after .wc1 and .wc2 were sent and with .wc3 (+ .whl) carried in this call: install
# vLLM 0.26.0 (the peer) and the harness wheels; writes the random 20b checkpoint to $CKPT too
# (CKPT= : none, when another call writes its own checkpoint).
#   bash bench/vllm_peer_install.sh
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
CKPT=${CKPT-/tmp/ck20}; PARTS=$HOME/wheelparts; mkdir -p "$PARTS"
[ -z "$CKPT" ] || [ -f "$CKPT/config.json" ] || python3 -m gptoss.tools.make_checkpoint --preset 20b --device cuda --out "$CKPT" \
  > /tmp/checkpoint.log 2>&1 &
if ! python3 -c 'import vllm' 2>/dev/null; then
  cp .wc*/*part* .wc1/SHA256SUMS* "$PARTS"/ 2>/dev/null
  bash .wc1/device_install.sh "$PARTS" > /tmp/install.log 2>&1 || { tail -20 /tmp/install.log; exit 1; }
fi
bash bench/harness_wheels.sh
wait
python3 -c 'import vllm; print("vllm", vllm.__version__)' 2>&1 | tail -1
