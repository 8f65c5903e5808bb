#!/usr/bin/env bash
# Tier: the RESP gateway driven by the real Redis tools (tests/tests/resp_redis.rs: redis-cli
# and redis-benchmark against `dmkit resp` in front of 3 memnodes and a master; a redis-py
# session at its defaults run against the gateway and a real redis-server, the same output;
# tests/scripts/compat.py: 186 everyday commands through redis-py and redis-cli against
# both, compared reply by reply, failing on a difference outside its documented allow-list or
# a match rate under 90%), and `dmkit bench resp --quick` (the gateway against a real
# redis-server in the same run).
# Installs Debian's redis-tools and redis-server, and redis-py from PyPI; fails (non-zero) if it cannot: never
# passes silently.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v redis-cli >/dev/null 2>&1 || ! command -v redis-benchmark >/dev/null 2>&1 \
   || ! command -v redis-server >/dev/null 2>&1; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq || { echo "tier-redis: apt-get update failed" >&2; exit 1; }
  apt-get install -y -qq --no-install-recommends redis-tools redis-server \
    || { echo "tier-redis: installing redis-tools and redis-server failed" >&2; exit 1; }
fi
for tool in redis-cli redis-benchmark redis-server; do
  command -v "$tool" >/dev/null 2>&1 \
    || { echo "tier-redis: $tool is still missing after apt-get" >&2; exit 1; }
done
redis-server --version
# redis-py at its defaults (HELLO 3) against the gateway and redis-server: the same script.
if ! python3 -c 'import redis' 2>/dev/null; then
  python3 -m pip install --quiet 'redis==8.1.0' \
    || { echo "tier-redis: installing redis-py (pip install redis) failed" >&2; exit 1; }
fi
python3 -c 'import redis; print("redis-py", redis.__version__)' \
  || { echo "tier-redis: redis-py is still missing after pip" >&2; exit 1; }

DMKIT_TIER_REDIS=1 cargo test -p dmkit-tests --test resp_redis -- --ignored --nocapture
cargo run -q -p dmkit-tools --bin dmkit -- bench resp --quick --requests 5000 \
  --json "${TMPDIR:-/tmp}/dmkit-bench-resp.json"
