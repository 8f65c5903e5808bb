# Sourced by the scripts that run inside the SoftRoCE guest (softroce-cli.sh,
# softroce-growth.sh): the dmkit binary, the guest's address, a work directory, background
# processes killed on exit, `fail` (prints the logs' tails) and `wait_for FILE PATTERN`.
# NAME (the script's name, for messages) and TAIL (log lines shown) may be set before.
D=${DMKIT:?DMKIT names the dmkit binary built with --features rdma}
IP=${SOFTROCE_IP:?run inside the SoftRoCE guest}
W=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap cleanup EXIT
fail() { echo "${NAME:-softroce}: $*" >&2; for f in "$W"/*.log; do echo "== $f"; tail -"${TAIL:-5}" "$f"; done >&2; exit 1; }
wait_for() { # FILE PATTERN
  for _ in $(seq 1 150); do grep -q "$2" "$1" 2>/dev/null && return 0; sleep 0.2; done
  fail "no '$2' in $1"
}
