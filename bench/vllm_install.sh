#!/usr/bin/env bash
# The GPU scripts' one install of vLLM 0.26.0 into PY (default python3) from the payload the device
# calls carried (.wc1 .. .wc3, shared/tools/vllm_device), unless PY has vLLM already; run from the
# repository root. device_install.sh's output goes to LOG (default /tmp/vllm_install.log). The probe
# asks importlib, so no error output needs hiding; parts missing from the checkout or a failed install
# are said on stderr and are this script's exit status.
PY=${1:-python3}; LOG=${2:-/tmp/vllm_install.log}; PARTS=${VLLM_PARTS:-$HOME/wheelparts}
"$PY" -c 'import importlib.util as u, sys; sys.exit(u.find_spec("vllm") is None)' && exit 0
mkdir -p "$PARTS"
cp .wc*/*part* .wc1/SHA256SUMS* "$PARTS"/ \
  || { echo "vllm_install.sh: the payload's parts (.wc1 .. .wc3) are not all in this checkout" >&2; exit 1; }
bash .wc1/device_install.sh "$PARTS" > "$LOG" 2>&1 \
  || { tail -20 "$LOG" >&2; echo "vllm_install.sh: device_install.sh failed (its log: $LOG)" >&2; exit 1; }
tail -2 "$LOG"
