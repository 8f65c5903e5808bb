#!/usr/bin/env bash
# Tier: a busy machine (`dmkit bench soak --quick`): three memory nodes (two on pool files), a
# master and the RESP gateway as processes, 64 FUSEE client tasks, gateway probers and
# redis-benchmark, without and then beside a CPU hog on every core. Fails on an acknowledged
# write lost, a master that exited, a memory node fenced although nothing failed, or client
# errors above 0.01 % (.ci/check-soak.py); prints the rest (idle CPU, gateway silence,
# p99 with and without the hog, gateway restart times). The debug build the tests made: a
# harsher load than a release build, and no second build.
# Installs redis-tools (redis-benchmark) if missing; fails loudly if it cannot.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v redis-benchmark >/dev/null 2>&1; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq || { echo "tier-soak: apt-get update failed" >&2; exit 1; }
  apt-get install -y -qq --no-install-recommends redis-tools \
    || { echo "tier-soak: installing redis-tools failed" >&2; exit 1; }
fi
command -v redis-benchmark >/dev/null 2>&1 \
  || { echo "tier-soak: redis-benchmark is still missing after apt-get" >&2; exit 1; }

out="${TMPDIR:-/tmp}/dmkit-soak-$$.json"
cargo run -q -p dmkit-tools --bin dmkit -- bench soak --quick --json "$out"
python3 .ci/check-soak.py "$out"
