#!/usr/bin/env bash
# Regenerates docs/BENCHMARKS.md and its figures under docs/results/ (JSON reports and SVG
# plots): verbs on sim and tcp, the pool's object allocator, the RACE index on sim and tcp,
# FUSEE throughput against clients, the RESP gateway against a real redis-server. Quick runs;
# about two and a half minutes on two cores. The RESP part needs
# redis-server and redis-benchmark (Debian: redis-server, redis-tools). The RDMA figures
# (docs/results/verbs-rdma-quick.json) are recorded by the SoftRoCE tier, see docs/RDMA.md.
#
# Usage: scripts/bench-docs.sh [extra `dmkit bench all` flags, e.g. --skip-resp]
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -q -p dmkit-tools --bin dmkit
exec ./target/release/dmkit bench all --docs docs "$@"
