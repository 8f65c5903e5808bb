#!/usr/bin/env bash
# Tier: the RACE index grows online from one subtable to 10 million keys (release build).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo test --release -p dmkit-kv-index --test growth -- --ignored
