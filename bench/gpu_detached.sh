# shellcheck shell=bash
# Sourced (not run) by the detached GPU scripts (moe_flat_gpu.sh, moe_large_gpu.sh,
# vllm_plugin_gpu.sh, gptoss_120b_ab_gpu.sh, gptoss_120b_pair_gpu.sh), from the repository root,
# after RES (their results folder) is set: the results folder and its done marker, say() with
# seconds since the start, and the steps each of them needs first (the harness's wheels, the random
# 20b or 120b checkpoint, waiting for vLLM).
mkdir -p "$RES"; rm -f "$RES/done"
trap 'touch "$RES/done"' EXIT  # the caller polls for it, whatever way the script ends
CKPT=${CKPT:-/tmp/ck20}
export PYTHONUNBUFFERED=1 TRITON_INTERPRET=0
t0=$(date +%s)
say() { echo "[$(( $(date +%s) - t0 )) s] $*"; }

# vLLM's engine bench comes with the payload (.wc1), which a copy of the checkout made to run a
# script detached may leave out (2026-11-27: the batch-1 / Offline row then failed at once, exit 2).
vllm_script() {
  VLLM_SCRIPT=$(realpath -m "${VLLM_SCRIPT:-.wc1/bench_vllm.py}")
  [ -f "$VLLM_SCRIPT" ] || { say "no $VLLM_SCRIPT: set VLLM_SCRIPT to the payload's bench_vllm.py"; exit 1; }
}

gpu_prereqs() {  # the harness's wheels (.whl) unless installed; the 20b checkpoint unless at $CKPT
  nvidia-smi -L
  bash bench/harness_wheels.sh || failed "harness wheels (exit $?)"
  [ -f "$CKPT/config.json" ] || python3 -m gptoss.tools.make_checkpoint --preset 20b --device cuda --out "$CKPT" \
    > "$RES/checkpoint.log" 2>&1 || { tail "$RES/checkpoint.log"; exit 1; }
}

checkpoint_120b() {  # the random 120b at $CKPT (under /mnt/ck120: a tmpfs, as the disk has 64 GiB)
  if [[ $CKPT == /mnt/ck120/* ]]; then
    mkdir -p /mnt/ck120
    grep -q " /mnt/ck120 " /proc/mounts || mount -t tmpfs -o size=72g tmpfs /mnt/ck120 || exit 1
  fi
  [ -f "$CKPT/config.json" ] && return 0
  say "120b checkpoint"
  python3 -m gptoss.tools.make_checkpoint --preset 120b --device cuda --out "$CKPT" > "$RES/checkpoint.log" 2>&1 \
    || { tail "$RES/checkpoint.log"; exit 1; }
  tail -1 "$RES/checkpoint.log"
}

wait_vllm() {  # up to VLLM_WAIT_S (15 min) for bench/vllm_peer_install.sh (a later device call)
  say "waiting for vLLM (\$HOME/vllm_ready)"
  for _ in $(seq $(( ${VLLM_WAIT_S:-900} / 5 ))); do [ -f "$HOME/vllm_ready" ] && return 0; sleep 5; done
  [ -f "$HOME/vllm_ready" ] && return 0
  say "no vLLM"; return 1
}

: > "$RES/table.txt"
row() { echo "$1 | $2" | tee -a "$RES/table.txt"; }  # a line of the table printed last

vllm_engine() {  # vLLM's batch-1 and Offline rows (bench/gptoss_gpu.py --engine vllm), after vllm_script
  say "vLLM batch-1 and Offline"
  timeout 560 python3 bench/gptoss_gpu.py --model-path "$CKPT" --engine vllm --decode 128x512 \
    --throughput 1000x1024x1024 --vllm-script "$VLLM_SCRIPT" > "$RES/vllm.txt" 2>&1 \
    || failed "vllm b1 + offline (exit $?)"
  row "vllm b1 + offline" "$(sed -n '/^workload/,$p' "$RES/vllm.txt" | tr '\n' ' ')"
}

# A step whose exit status was not 0: said now, listed after the table, and finish's status (so a
# script that records its steps' failures with it exits 1 when one failed, 0 otherwise).
FAILED=()
failed() { FAILED+=("$1"); say "FAILED: $1"; }
finish() {
  say "done"; echo "== table"; cat "$RES/table.txt"
  [ ${#FAILED[@]} -eq 0 ] || { echo "${#FAILED[@]} step(s) failed: $(IFS=,; echo "${FAILED[*]}")"; return 1; }
}
