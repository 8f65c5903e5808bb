#!/usr/bin/env bash
# Tier: the FUSEE load test (release build): 64 client tasks, zipf-0.99 keys, over a million
# operations, four memory nodes failed over and refilled along the way; no deadlock, no lost
# acknowledged write, bounded memory (tests/tests/fusee_load.rs).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo test --release -p dmkit-tests --test fusee_load -- --ignored --nocapture
