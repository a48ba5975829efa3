#!/usr/bin/env bash
# GPU side, one H100 or H200 (Firecracker machines: ncu reads the counters there, KINDS.md): Nsight
# Compute's counters of the MoE kernels at MS (default 1024,16384), ours (the engine's kernels) beside
# vLLM's matmul_ogs once vLLM is installed (bench/vllm_peer_install.sh; NO_VLLM=1: ours alone), then
# one table (bench/kernels/moe_ncu.py --digest): duration, SM / memory / L2 / DRAM throughput, issue
# slots, L2 hit rate, occupancy, registers and each launch's three largest stall reasons. EXPERTS=128:
# 120b's shapes (default 32, 20b's).
#   bash bench/moe_ncu_gpu.sh        (results in $RES, default $HOME/ncu: ncu.csv, ncu.log, table.txt)
# TARGET=step: the engine's own decode step instead, every kernel of it as it runs in the step (the
# CUDA graph's nodes one by one; bench/profile_gpu.py --ncu at batch BATCH, default 1, on CKPT, e.g.
# the random 120b at /mnt/ck120/ck, made first if missing), one line a kernel name (--by-kernel):
#   TARGET=step CKPT=/mnt/ck120/ck bash bench/moe_ncu_gpu.sh
# and the source page of SRC_KERNELS (default there: the batch-1 MoE GEMMs).
# Last the table again, then the steps that failed (each with its exit status; the script's then 1).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
RES=${RES:-$HOME/ncu}
# shellcheck source-path=SCRIPTDIR/..
. bench/gpu_detached.sh
if [ -z "${NCU:-}" ]; then  # on the PATH, else the image's Nsight Compute install
  NCU=$(command -v ncu)
  for f in /opt/nvidia/nsight-compute/*/ncu; do [ -n "$NCU" ] || NCU=$f; done
fi
[ -x "$NCU" ] || { say "no ncu found (set NCU)"; exit 1; }
if [ "${TARGET:-moe}" = step ]; then
  if [[ $CKPT == /mnt/ck120/* ]]; then checkpoint_120b; fi
  gpu_prereqs
  PROG=(python3 bench/profile_gpu.py --model-path "$CKPT" --batch "${BATCH:-1}" --steps 1 --ncu)
  SRC_PROG=("${PROG[@]}")
  BY=(--by-kernel)
  SRC_KERNELS=${SRC_KERNELS:-gate_up|down}
  WHAT="a decode step at batch ${BATCH:-1} of $CKPT"
else
  nvidia-smi -L
  VLLM=(--vllm)
  if [ -n "${NO_VLLM:-}" ] || ! wait_vllm; then VLLM=(); fi
  PROG=(python3 bench/kernels/moe_ncu.py --ms "${MS:-1024,16384}" --variant "${VARIANT:-engine}" --experts "${EXPERTS:-32}" "${VLLM[@]}")
  SRC_PROG=(python3 bench/kernels/moe_ncu.py --ms "${SRC_M:-1024}" --variant "${VARIANT:-engine}" --experts "${EXPERTS:-32}" "${VLLM[@]}")
  BY=()
  WHAT="M ${MS:-1024,16384}"
fi
# The stall reasons are asked for by name; a version that lacks one refuses the whole list, so the
# list is tried on a trivial kernel first and left out (sections only) if refused.
STALLS=$(printf 'smsp__average_warps_issue_stalled_%s_per_issue_active.ratio,' barrier long_scoreboard \
  short_scoreboard wait math_pipe_throttle mio_throttle lg_throttle not_selected dispatch_stall \
  no_instruction branch_resolving membar sleeping drain misc tex_throttle imc_miss selected)
STALLS=${STALLS%,}
EXTRA=(--metrics "$STALLS")
if ! "$NCU" --clock-control none --csv "${EXTRA[@]}" python3 -c \
  'import torch; torch.ones(8, device="cuda").add_(1); torch.cuda.synchronize()' > "$RES/probe.txt" 2>&1; then
  say "ncu refused the stall metrics (see $RES/probe.txt): sections only"; EXTRA=()
fi
say "profiling $WHAT"
"$NCU" --profile-from-start off --clock-control none --csv --page details \
  --section SpeedOfLight --section WarpStateStats --section ComputeWorkloadAnalysis \
  --section MemoryWorkloadAnalysis --section LaunchStats --section Occupancy "${EXTRA[@]}" \
  "${PROG[@]}" > "$RES/ncu.csv" 2> "$RES/ncu.log" \
  || { failed "ncu (exit $?)"; say "ncu failed"; tail -20 "$RES/ncu.log"; }
python3 bench/kernels/moe_ncu.py --digest "$RES/ncu.csv" "${BY[@]}" | tee "$RES/table.txt" \
  || failed "digest (exit $?)"  # pipefail: the digest's status, not tee's
# Where in the K loop the warps wait: per-instruction stall samples (source page, SASS) of the first
# SRC_K launches matching SRC_KERNELS (default: our gate_up, then matmul_ogs' first GEMM).
say "instruction-level stall samples of ${SRC_KERNELS:=gate_up_v3|matmul_ogs}"
"$NCU" --profile-from-start off --clock-control none --csv --page source --print-source sass \
  --section SourceCounters --section WarpStateStats -k "regex:$SRC_KERNELS" -c "${SRC_K:-2}" \
  "${SRC_PROG[@]}" > "$RES/sass.csv" 2> "$RES/sass.log" \
  || { failed "ncu source page (exit $?)"; say "ncu's source page failed"; tail -20 "$RES/sass.log"; }
python3 bench/kernels/moe_ncu.py --sass-digest "$RES/sass.csv" | tee -a "$RES/table.txt" \
  || failed "sass digest (exit $?)"
finish
