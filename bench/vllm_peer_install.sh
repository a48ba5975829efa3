#!/usr/bin/env bash
# GPU side, after .wc1 and .wc2 were sent and with .wc3 (+ .whl) carried in this call: install
# vLLM 0.26.0 (the peer) and the harness wheels; writes the random 20b checkpoint to $CKPT too
# (CKPT= : none, when another call writes its own checkpoint).
#   bash bench/vllm_peer_install.sh
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
CKPT=${CKPT-/tmp/ck20}
[ -z "$CKPT" ] || [ -f "$CKPT/config.json" ] || python3 -m gptoss.tools.make_checkpoint --preset 20b --device cuda --out "$CKPT" \
  > /tmp/checkpoint.log 2>&1 &
bash bench/vllm_install.sh python3 /tmp/install.log || exit 1
bash bench/harness_wheels.sh
wait
python3 -c 'import vllm; print("vllm", vllm.__version__)' 2>&1 | tail -1
