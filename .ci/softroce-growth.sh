#!/usr/bin/env bash
# Runs inside the SoftRoCE guest (called by tier-rdma.sh): FUSEE's index grows past many
# splits over rdma. One client loads 50 000 keys into a one-node cluster (r = 1, the case
# that once hung at the first split: a split's batches were larger than the send queue), then
# two clients load 50 000 more at once into a fresh one-node cluster (two splitters racing on
# one index; r = 2, where splits copy every replica, doubles the emulated verbs and took 269 s
# of CI: `GROWTH_R=2` runs it so); every loaded key is read back (`ycsb --verify`).
# `GROWTH_INFLIGHT=N` keeps N operations in flight per client (FUSEE's coroutines), so that
# inserts race the client's own splits too (not CI's default yet: tried only on a loaded
# host, where the 600 s bound did not hold).
set -euo pipefail
NAME=softroce-growth TAIL=8
. "$(dirname "$0")/softroce-lib.sh"

cluster() { # NAME MASTER_PORT R NODES...
  local name=$1 mport=$2 r=$3; shift 3
  {
    echo "backend = \"rdma\""
    echo "master = \"127.0.0.1:$mport\""
    echo "index_replicas = $r"
    echo "data_replicas = $r"
    local id=0
    for port in "$@"; do
      echo "[[memnode]]"; echo "id = $id"; echo "addr = \"$IP:$port\""; id=$((id + 1))
    done
  } >"$W/$name.toml"
  local id=0
  for port in "$@"; do
    "$D" memnode --backend rdma --listen "$IP:$port" --id "$id" --dram 384MiB \
      2>"$W/mn$port.log" &
    pids+=($!)
    id=$((id + 1))
  done
  for port in "$@"; do wait_for "$W/mn$port.log" "serving"; done
  "$D" master --listen "127.0.0.1:$mport" --cluster "$W/$name.toml" 2>"$W/master-$name.log" &
  pids+=($!)
  wait_for "$W/master-$name.log" "serving on"
}


echo "== one client, 1 memory node, r = 1: 50 000 keys"
cluster one 7000 1 7100
t0=$(date +%s)
timeout 600 "$D" ycsb --cluster "$W/one.toml" --client-id 1 --load --verify --seconds 0 \
  --records 50000 --value-bytes 32 --inflight ${GROWTH_INFLIGHT:-1} 2>"$W/ycsb-one.log" >/dev/null \
  || fail "one client: the load or its verification failed"
grep "verified" "$W/ycsb-one.log"
echo "   ($(( $(date +%s) - t0 )) s)"

R2=${GROWTH_R:-1}
echo "== two clients at once, r = $R2: 2 x 25 000 keys"
if [ "$R2" = 1 ]; then cluster three 7001 1 7110; else cluster three 7001 "$R2" 7110 7111 7112; fi
t0=$(date +%s)
timeout 900 "$D" ycsb --cluster "$W/three.toml" --client-id 1 --load --verify --seconds 0 \
  --records 50000 --value-bytes 32 --inflight ${GROWTH_INFLIGHT:-1} --partition 0/2 2>"$W/ycsb-a.log" >/dev/null &
a=$!
timeout 900 "$D" ycsb --cluster "$W/three.toml" --client-id 2 --load --verify --seconds 0 \
  --records 50000 --value-bytes 32 --inflight ${GROWTH_INFLIGHT:-1} --partition 1/2 2>"$W/ycsb-b.log" >/dev/null &
b=$!
wait $a || fail "client 1 of two: the load or its verification failed"
wait $b || fail "client 2 of two: the load or its verification failed"
grep -h "verified" "$W/ycsb-a.log" "$W/ycsb-b.log"
echo "   ($(( $(date +%s) - t0 )) s)"
echo "softroce-growth: ok"
