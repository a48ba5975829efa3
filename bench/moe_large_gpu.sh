#!/usr/bin/env bash
# GPU side, one H100, detached over several device calls: the large-M MoE tiles (Offline's decode
# steps run the v3 MoE at M ~1000, its mixed steps at M ~16k), then the engine and vLLM 0.26.0.
#   nohup bash bench/moe_large_gpu.sh > $HOME/large.log 2>&1 &     (then poll $HOME/large/done)
# Parts (PARTS, default all): tests (compiled v3 GEMM tests, the candidate tiles among them);
# kernels (bench/kernels/moe_gpu.py at KMS over KVARIANTS, whole MoE and each GEMM in CUDA graphs,
# KROUNDS rounds, default 3, interleaved; KEXPERTS experts, default 32 (20b), 128 for 120b's shapes);
# then bench/kernels/moe_pick.py turns the fastest tiles of each GEMM and bucket into a
# GPTOSS_MOE_V3_TILES value; ogs (vLLM's matmul_ogs MoE at the same M, once $HOME/vllm_ready exists:
# bench/vllm_peer_install.sh in the payload's third call); offline (1000 x (1024 -> 1024), ROUNDS
# rounds of the modes in ORDER, interleaved: default (the engine's: GPTOSS_MOE_V3_WTMA=auto, weights
# by TMA on tiles of <= 128 rows), picked (the picked tiles), tma, tma-all (GPTOSS_MOE_V3_TMA=down /
# all), wtma (GPTOSS_MOE_V3_WTMA=1: every tile's weights by TMA), wtma-all (both), ptr (=0: none),
# unmasked (GPTOSS_MOE_UNMASKED_ROWS=1: the GEMMs' rows without a mask, bench/results v74));
# vllm (vLLM's batch-1 and Offline rows). Without offline or vllm no 20b checkpoint is made (the
# kernel parts make their own random weights).
# One table last: $HOME/large/table.txt; then the steps that failed (each with its exit status; the
# script's then 1).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
RES=${RES:-$HOME/large}
# shellcheck source-path=SCRIPTDIR/..
. bench/gpu_detached.sh
KMS=${KMS:-1024,2048,4096,16384} KEXPERTS=${KEXPERTS:-32}
KVARIANTS=${KVARIANTS:-v3,v3-tma,v3-tma-all}  # v19 timed the L-* tile shapes; v20 left the TMA ones
PARTS=" ${PARTS:-tests kernels ogs offline vllm} "; has() { [[ $PARTS == *" $1 "* ]]; }
if has vllm; then vllm_script; fi
if has offline || has vllm; then gpu_prereqs; else nvidia-smi -L; fi
if has tests; then
  say "compiled tests"
  timeout 300 python3 -m pytest -q -n 0 -p no:cacheprovider tests/gptoss/kernels/test_moe_v3.py tests/gptoss/kernels/test_moe_v3_tiles.py tests/gptoss/kernels/test_moe_v3_tma.py tests/gptoss/kernels/test_moe_v3_wtma.py tests/gptoss/kernels/test_moe_tile_rows.py -k "gpu and not v3ds" \
    2>&1 | tee "$RES/tests_full.txt" | tail -4 | tee "$RES/tests.txt" \
    || failed "compiled tests (exit $?)"  # the whole log too: which assertion failed; pipefail: pytest's status
fi
TILES=""
if has kernels; then
  say "large-M MoE tiles"
  python3 bench/kernels/moe_gpu.py --no-vllm --ms "$KMS" --variants "$KVARIANTS" --rounds "${KROUNDS:-3}" \
    --experts "$KEXPERTS" > "$RES/kernels.txt" 2>&1 || failed "kernels (exit $?)"
  sed -n '/^ *M variant/,$p' "$RES/kernels.txt"
  TILES=$(python3 bench/kernels/moe_pick.py "$RES/kernels.txt" --experts "$KEXPERTS" 2> "$RES/pick.txt") \
    || failed "pick (exit $?)"
  cat "$RES/pick.txt"
  row "picked GPTOSS_MOE_V3_TILES" "${TILES:-(the defaults)}"
fi
if has ogs && wait_vllm; then
  say "vLLM's matmul_ogs MoE"
  python3 bench/kernels/moe_gpu.py --ms "$KMS" --variants vllm --experts "$KEXPERTS" > "$RES/ogs.txt" 2>&1 \
    || failed "ogs (exit $?)"
  sed -n '/^ *M variant/,$p' "$RES/ogs.txt" | tee -a "$RES/table.txt"
fi
offline() {  # offline NAME [TILES [TMA [WTMA [UNMASKED]]]]
  # unset switches at the engine's defaults (until 2026-12-02 WTMA was 0 here, the default before v29)
  GPTOSS_MOE_V3_TILES=${2:-} GPTOSS_MOE_V3_TMA=${3:-0} GPTOSS_MOE_V3_WTMA=${4:-auto} GPTOSS_MOE_UNMASKED_ROWS=${5:-0} \
    timeout 400 python3 bench/gptoss_gpu.py --model-path "$CKPT" --engine gptoss \
    --throughput 1000x1024x1024 > "$RES/offline_$1_$round.txt" 2>&1 || failed "offline $1 r$round (exit $?)"
  row "gptoss offline 1000x1024x1024 $1 r$round" "$(grep '^offline 1000x' "$RES/offline_$1_$round.txt" | tail -1)"
}
if has offline; then
  for round in $(seq "${ROUNDS:-2}"); do
    say "Offline round $round"
    for mode in ${ORDER:-default tma tma-all picked}; do  # the first engine run is cold: ORDER says who pays
      case $mode in
        default) offline default ;;
        picked) if [ -n "$TILES" ]; then offline picked "$TILES"; fi ;;
        tma) offline tma "" down ;;  # GPTOSS_MOE_V3_TMA=down
        tma-all) offline tma-all "" all ;;
        wtma) offline wtma "" 0 1 ;;  # GPTOSS_MOE_V3_WTMA=1
        wtma-all) offline wtma-all "" all 1 ;;
        ptr) offline ptr "" 0 0 ;;  # every weight by cp.async
        unmasked) offline unmasked "" 0 auto 1 ;;  # GPTOSS_MOE_UNMASKED_ROWS=1
        *) say "unknown ORDER mode $mode (default, picked, tma, tma-all, wtma, wtma-all, ptr, unmasked)" ;;
      esac
    done
  done
fi
if has vllm && wait_vllm; then
  vllm_engine
fi
finish
