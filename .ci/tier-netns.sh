#!/usr/bin/env bash
# Tier: FUSEE with a memory node partitioned away (tests/tests/fusee_partition.rs): three
# memnodes in their own network namespaces (ip netns + veth), one cut off mid-run under
# YCSB-A; it must fence itself, lose no acknowledged write, refuse writes from inside its
# partition, and be refilled when the link returns. Needs root and iproute2 (installed here
# with apt-get when missing); fails (non-zero) if either is missing: never passes silently.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" != 0 ]; then
  echo "tier-netns: needs root (network namespaces and veth links)" >&2
  exit 1
fi
if ! command -v ip >/dev/null 2>&1 || ! command -v sysctl >/dev/null 2>&1; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq || { echo "tier-netns: apt-get update failed" >&2; exit 1; }
  apt-get install -y -qq --no-install-recommends iproute2 procps \
    || { echo "tier-netns: installing iproute2 failed" >&2; exit 1; }
fi
ip netns add dmkit-tier-probe || { echo "tier-netns: cannot create a network namespace" >&2; exit 1; }
ip netns del dmkit-tier-probe

cargo test -p dmkit-tests --test fusee_partition -- --ignored --nocapture
