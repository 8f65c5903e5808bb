#!/usr/bin/env bash
# Tier: dmkit-pmem-pool on libpmem (Debian's libpmem-dev, bindgen needs libclang).
set -euo pipefail
cd "$(dirname "$0")/.."
if ! pkg-config --exists libpmem 2>/dev/null || ! ls /usr/lib/llvm-*/lib/libclang*.so* >/dev/null 2>&1; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends libpmem-dev libclang-dev pkg-config
fi
pkg-config --exists libpmem || { echo "libpmem is still missing after apt-get" >&2; exit 1; }
cargo test -p dmkit-pmem-pool --features libpmem
