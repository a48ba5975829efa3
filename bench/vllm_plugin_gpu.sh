#!/usr/bin/env bash
# GPU side, one H100, detached: compiled tests of the decode kernels, then vLLM 0.26.0 with our MoE
# (the gptoss plugin) against vLLM's own, one engine a process (bench/vllm_plugin_gpu.py), after
# $HOME/vllm_ready exists (bench/vllm_peer_install.sh, the payload's third call).
#   nohup bash bench/vllm_plugin_gpu.sh > $HOME/plug.log 2>&1 &     (then poll $HOME/plug/done)
# ENGINES (default "gptoss vllm"): gptoss runs ours at every size on one v3 copy of the experts
# (vLLM's memory; v24: Offline 1.13x, batch 1 1.15x vLLM's own on an H100); gptoss:N ours for steps
# of up to N tokens and vLLM's own MoE above (GPTOSS_VLLM_MOE_MAX_TOKENS; both layouts loaded);
# gptoss-v3 ours with GPTOSS_MOE_KERNELS=v3 (as gptoss since v24).
# One table last, then the steps that failed (each with its exit status; the script's then 1).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
RES=${RES:-$HOME/plug}
# shellcheck source-path=SCRIPTDIR/..
. bench/gpu_detached.sh
R=$RES
gpu_prereqs
if [ -z "${NO_TESTS:-}" ]; then
  say "compiled tests"
  timeout 300 python3 -m pytest -q -n 0 -p no:cacheprovider tests/gptoss/kernels/test_moe_decode.py \
    tests/gptoss/kernels/test_moe_decode_flat.py tests/gptoss/kernels/test_attention_kernel.py \
    tests/gptoss/kernels/test_attention_splits.py \
    tests/gptoss/kernels/test_kernel_engine.py 2>&1 | tail -8 | tee "$R/tests.txt" \
    || failed "compiled tests (exit $?)"  # pipefail: pytest's status, not tee's
fi
wait_vllm || exit 1
dirs=()
for eng in ${ENGINES:-gptoss vllm}; do
  d="$R/${eng/:/_}"; dirs+=("$d")
  say "plugin bench: $eng"
  timeout 480 python3 bench/vllm_plugin_gpu.py --model-path "$CKPT" --engines "$eng" --out "$d" > "$d.txt" 2>&1 \
    || failed "plugin bench $eng (exit $?)"
  tail -4 "$d.txt"
done
python3 bench/vllm_plugin_gpu.py --table "${dirs[@]}" 2>&1 | tail -12 | tee "$R/table.txt" \
  || failed "table (exit $?)"
finish
