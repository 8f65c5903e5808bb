#!/usr/bin/env bash
# Tier: a real Prometheus server scrapes `dmkit memnode --metrics` and `dmkit resp --metrics`
# (tests/tests/prometheus.rs). Installs Debian's `prometheus`; fails (non-zero) if it cannot:
# never passes silently.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v prometheus >/dev/null 2>&1; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq || { echo "tier-prometheus: apt-get update failed" >&2; exit 1; }
  apt-get install -y -qq --no-install-recommends prometheus \
    || { echo "tier-prometheus: installing the prometheus package failed" >&2; exit 1; }
fi
command -v prometheus >/dev/null 2>&1 \
  || { echo "tier-prometheus: prometheus is still missing after apt-get" >&2; exit 1; }
prometheus --version 2>&1 | head -1

DMKIT_TIER_PROMETHEUS=1 cargo test -p dmkit-tests --test prometheus -- --ignored --nocapture
