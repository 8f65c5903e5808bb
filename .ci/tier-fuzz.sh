#!/usr/bin/env bash
# Tier: a short smoke run (5 s each) of every cargo-fuzz target (nightly toolchain; cargo-fuzz from
# crates.io). Long runs: `cargo +nightly fuzz run -O TARGET -- -max_total_time=600` in fuzz/.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
rustup toolchain list | grep -q '^nightly' \
  || { echo "tier-fuzz: the nightly toolchain is missing (rustup toolchain install nightly)" >&2; exit 1; }
command -v cargo-fuzz >/dev/null 2>&1 || cargo install cargo-fuzz --locked
# Every target built in one cargo run (in parallel, unoptimized: a smoke run needs no speed
# and the optimized build took most of this tier), then each run for a short while.
cargo +nightly fuzz build --dev
for t in tcp_frame slot_codec log_entry pool_superblock resp_parser; do
  echo "tier-fuzz: $t"
  cargo +nightly fuzz run --dev "$t" -- -max_total_time=5 -rss_limit_mb=2048
done
