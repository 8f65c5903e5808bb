#!/usr/bin/env bash
# Runs inside the SoftRoCE guest (called by tier-rdma.sh): the dmkit binary over rdma as an
# operator runs it. `dmkit memnode --backend rdma` serves; `dmkit bench verbs --backend rdma`
# measures against it with perftest beside it; a FUSEE cluster of three rdma memory nodes
# and a master stores a key, loses a node, and still answers.
set -euo pipefail
NAME=softroce-cli TAIL=5
. "$(dirname "$0")/softroce-lib.sh"

# Bad input: a memlock limit too low is one clear error at start (root ignores the limit, so
# as nobody).
if setpriv --reuid=65534 --regid=65534 --clear-groups --inh-caps=-all \
    bash -c "ulimit -l 64; exec '$D' memnode --backend rdma --listen $IP:7199 --dram 64MiB" \
    2>"$W/memlock.log"; then
  fail "memnode started with a 64 KiB memlock limit"
fi
grep -q "memlock limit is 65536 bytes" "$W/memlock.log" \
  || fail "no memlock advice: $(cat "$W/memlock.log")"
echo "== memlock too low: $(tail -1 "$W/memlock.log")"

for i in 0 1 2; do
  "$D" memnode --backend rdma --listen "$IP:$((7100 + i))" --id "$i" --dram 64MiB 2>"$W/mn$i.log" &
  pids+=($!)
done
for i in 0 1 2; do wait_for "$W/mn$i.log" "serving"; done
grep -q "(rdma" "$W/mn0.log" || fail "memnode --backend rdma did not serve over rdma: $(cat "$W/mn0.log")"

echo "== dmkit bench verbs --backend rdma --quick against memnode 0"
"$D" bench verbs --backend rdma --quick --addr "$IP:7100" >"$W/bench.out" 2>"$W/bench.log" \
  || fail "bench verbs failed"
cat "$W/bench.out"
grep -q "rdma_read64_latency_vs_perftest" "$W/bench.out" || fail "the bench printed no perftest ratio"

cat >"$W/cluster.toml" <<T
backend = "rdma"
master = "127.0.0.1:7000"
index_replicas = 3
data_replicas = 3
[[memnode]]
id = 0
addr = "$IP:7100"
[[memnode]]
id = 1
addr = "$IP:7101"
[[memnode]]
id = 2
addr = "$IP:7102"
T
"$D" master --listen 127.0.0.1:7000 --cluster "$W/cluster.toml" 2>"$W/master.log" &
pids+=($!)
wait_for "$W/master.log" "serving on"
echo "== FUSEE over rdma: put, get, lose memnode 2, get, put, get"
"$D" kv --cluster "$W/cluster.toml" put hello world
[ "$("$D" kv --cluster "$W/cluster.toml" get hello 2>/dev/null)" = world ] || fail "get after put"
kill -9 "${pids[2]}"
wait_for "$W/master.log" "failed over"
[ "$("$D" kv --cluster "$W/cluster.toml" get hello 2>/dev/null)" = world ] || fail "get after the failover"
"$D" kv --cluster "$W/cluster.toml" put hello again 2>/dev/null
[ "$("$D" kv --cluster "$W/cluster.toml" get hello 2>/dev/null)" = again ] || fail "get after a put after the failover"
echo "softroce-cli: ok"
