#!/usr/bin/env bash
# Runs inside the SoftRoCE guest (called by tier-rdma.sh, one guest boot): Gengar on real
# verbs.
#  1. `dmkit gengar-server --backend rdma`: a memlock limit too low is one clear error; a
#     cluster secret is refused; two servers on pool files serve `dmkit gengar` clients that
#     connect from a cluster file; one is SIGKILLed: its object fails with a clear error
#     (exit 3), the other server's still reads; restarted on its pool, the confirmed write
#     reads back.
#  2. `dmkit bench gengar --backend rdma --quick`: the micro-benchmark and the kv, wordcount
#     and pagerank apps in their four configurations, with perftest on the same device
#     (reports under $OUT, checked by .ci/check-gengar-rdma.py on the host).
#  3. The Gengar process tests and linearizability histories over rdma: the test binaries
#     named by GENGAR_TESTS (built on the host), with DMKIT_TEST_BACKEND=rdma.
set -euo pipefail
NAME=softroce-gengar TAIL=8
. "$(dirname "$0")/softroce-lib.sh"
OUT=${OUT:?OUT names the directory for the bench reports}
mkdir -p "$OUT"
t0=$SECONDS
step() { echo "== [$((SECONDS - t0)) s] $*"; }

step "memlock too low: one clear error at start (as nobody: root ignores the limit)"
NB=$(mktemp -d)
chmod 777 "$NB"
if setpriv --reuid=65534 --regid=65534 --clear-groups --inh-caps=-all \
    bash -c "ulimit -l 64; exec '$D' gengar-server --backend rdma --listen $IP:7299 --id 0 \
      --pool $NB/nobody.pool --size 16MiB --dram 1MiB" 2>"$W/memlock.log"; then
  fail "gengar-server started with a 64 KiB memlock limit"
fi
grep -q "memlock limit is 65536 bytes" "$W/memlock.log" \
  || fail "no memlock advice: $(cat "$W/memlock.log")"
echo "   $(tail -1 "$W/memlock.log")"
if DMKIT_SECRET=0123456789abcdef0123 "$D" gengar-server --backend rdma --listen "$IP:7299" \
    --id 0 --pool "$W/s.pool" --size 16MiB --dram 1MiB 2>"$W/secret.log"; then
  fail "gengar-server --backend rdma started with a cluster secret set"
fi
grep -q "trust boundary" "$W/secret.log" || fail "no secret refusal: $(cat "$W/secret.log")"

step "two gengar-servers over rdma, dmkit gengar clients from a cluster file"
start_server() { # ID
  "$D" gengar-server --backend rdma --listen "$IP:$((7200 + $1))" --id "$1" \
    --pool "$W/g$1.pool" --size 32MiB --dram 1MiB --window 20 2>>"$W/gs$1.log" &
  pids+=($!)
  eval "gs$1=$!"
}
start_server 0
start_server 1
wait_for "$W/gs0.log" "serving"
wait_for "$W/gs1.log" "serving"
grep -q "(rdma" "$W/gs0.log" || fail "gengar-server did not serve over rdma: $(cat "$W/gs0.log")"
cat >"$W/gengar.toml" <<T
backend = "rdma"
index_replicas = 1
data_replicas = 1
[[memnode]]
id = 0
addr = "$IP:7200"
[[memnode]]
id = 1
addr = "$IP:7201"
T
G() { "$D" gengar --cluster "$W/gengar.toml" "$@"; }
declare -A obj
for i in 1 2 3 4; do
  a=$(G alloc 64) || fail "alloc"
  obj[${a%%:*}]=$a
done
[ -n "${obj[0]:-}" ] && [ -n "${obj[1]:-}" ] || fail "allocations did not use both servers: ${obj[*]}"
G write "${obj[0]}" "on server zero"
G write "${obj[1]}" "confirmed before the kill"
[ "$(G read "${obj[1]}" | tr -d '\0')" = "confirmed before the kill" ] || fail "read back"
kill -9 "$gs1"
wait "$gs1" 2>/dev/null || true
set +e
G read "${obj[1]}" >/dev/null 2>"$W/down.err"
rc=$?
set -e
[ "$rc" = 3 ] || fail "a read from the killed server exited $rc: $(cat "$W/down.err")"
grep -q "server 1 is down\|no Gengar server\|cannot connect" "$W/down.err" \
  || fail "unclear error for the killed server: $(cat "$W/down.err")"
echo "   killed server: $(cat "$W/down.err")"
[ "$(G read "${obj[0]}" | tr -d '\0')" = "on server zero" ] || fail "the live server's object"
start_server 1
wait_for "$W/gs1.log" "recovered"
[ "$(G read "${obj[1]}" | tr -d '\0')" = "confirmed before the kill" ] \
  || fail "the confirmed write was lost across the kill"
echo "   restarted on its pool: the confirmed write reads back"
kill "$gs0" "$gs1" 2>/dev/null || true

step "dmkit bench gengar --backend rdma --quick (micro, with perftest)"
"$D" bench gengar --backend rdma --quick --json "$OUT/gengar-micro-rdma.json" \
  || fail "bench gengar micro"
for app in kv wordcount pagerank; do
  step "dmkit bench gengar --backend rdma --quick --app $app"
  "$D" bench gengar --backend rdma --quick --app "$app" --json "$OUT/gengar-$app-rdma.json" \
    || fail "bench gengar --app $app"
done

for t in ${GENGAR_TESTS:-}; do
  step "$(basename "$t") over rdma"
  DMKIT_TEST_BACKEND=rdma DMKIT_TEST_BIN="$D" "$t" --test-threads=1 \
    || fail "$(basename "$t") failed over rdma"
done
step "softroce-gengar: ok"
