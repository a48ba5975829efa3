#!/usr/bin/env bash
# A device call's poll of a detached chain: waits up to SECONDS (default 540) for PATTERN (grep -E)
# in LOG, then prints LOG's last LINES (default 40) lines.
#   bash bench/poll_gpu.sh ~/chain.log 'done|FAILED' 540
# Exit 0: the pattern is there; 2: still not there after SECONDS; 3: LOG does not exist. 3 comes at
# once: the chain was started on another machine. A machine idle for the device's release time (30 s
# in session 67) is handed back, and the next call starts a fresh one. A plain loop then waited
# 550 s of device time for a log that was gone (bench/results v71).
set -uo pipefail
LOG=${1:?usage: poll_gpu.sh LOG PATTERN [SECONDS]}
PATTERN=${2:?usage: poll_gpu.sh LOG PATTERN [SECONDS]}
SECONDS_MAX=${3:-540}
[ -e "$LOG" ] || {
  echo "poll_gpu.sh: no $LOG: this machine did not start the chain (a fresh one after an idle release?)" >&2
  exit 3
}
end=$(( $(date +%s) + SECONDS_MAX ))
until grep -qE -- "$PATTERN" "$LOG"; do
  if [ "$(date +%s)" -ge "$end" ]; then
    tail -n "${LINES:-40}" "$LOG"
    echo "poll_gpu.sh: no '$PATTERN' in $LOG after $SECONDS_MAX s" >&2
    exit 2
  fi
  sleep 1
done
tail -n "${LINES:-40}" "$LOG"
