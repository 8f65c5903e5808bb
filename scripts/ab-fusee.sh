#!/usr/bin/env bash
# Same-run comparison of `dmkit bench fusee` between this tree and an earlier commit: builds
# both in release (the earlier one in a worktree with its own target directory), then runs the
# bench alternately, old then new, ROUNDS times, and prints each pair's ops/s, p50, p99 and
# round trips per operation, with the ratio new/old of ops/s and its median.
#
#   scripts/ab-fusee.sh <old-commit> [rounds] [-- bench args...]
#   scripts/ab-fusee.sh 23aed56 5 -- --backend tcp --quick --clients 1 --seconds 6
#
# (23aed56 is the last commit before the async core: "one operation in flight is no slower
# than before" of the [async] issue is checked against it.) Run it on a quiet machine: the
# two builds share its cores with nothing else.
set -euo pipefail
old=${1:?usage: scripts/ab-fusee.sh <old-commit> [rounds] [-- bench args...]}
shift
rounds=3
if [[ $# -gt 0 && $1 != -- ]]; then rounds=$1; shift; fi
[[ ${1:-} == -- ]] && shift
args=("$@")
[[ ${#args[@]} -eq 0 ]] && args=(--backend tcp --quick --clients 1 --seconds 6)

root=$(git rev-parse --show-toplevel)
sha=$(git -C "$root" rev-parse --verify "$old^{commit}")
work=${DMKIT_AB_DIR:-${TMPDIR:-/tmp}/dmkit-ab-${sha:0:12}}
if [[ ! -d $work/tree ]]; then
    mkdir -p "$work"
    git -C "$root" worktree add --detach "$work/tree" "$sha" >/dev/null
fi
echo "building $sha (old) and this tree (new) in release..." >&2
CARGO_TARGET_DIR=$work/target cargo build --release -q -p dmkit-tools --manifest-path "$work/tree/Cargo.toml"
cargo build --release -q -p dmkit-tools --manifest-path "$root/Cargo.toml"
new_bin=$(cargo metadata --format-version 1 --no-deps --manifest-path "$root/Cargo.toml" |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')/release/dmkit
old_bin=$work/target/release/dmkit

out=$work/reports
mkdir -p "$out"
for i in $(seq 1 "$rounds"); do
    for v in old new; do
        bin=$old_bin
        [[ $v == new ]] && bin=$new_bin
        "$bin" bench fusee "${args[@]}" --json "$out/$v-$i.json" >/dev/null 2>"$out/$v-$i.err" ||
            { echo "$v run $i failed:" >&2; cat "$out/$v-$i.err" >&2; exit 1; }
    done
done
python3 - "$out" "$rounds" <<'EOF'
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
ratios = {}
for i in range(1, rounds + 1):
    runs = {v: json.load(open(f"{out}/{v}-{i}.json")) for v in ("old", "new")}
    rows = {v: {r["name"]: r for r in d["results"] if not r["name"].startswith("dashmap")}
            for v, d in runs.items()}
    for name in sorted(set(rows["old"]) & set(rows["new"])):
        o, n = rows["old"][name], rows["new"][name]
        ratio = n["ops_per_sec"] / max(o["ops_per_sec"], 1e-9)
        ratios.setdefault(name, []).append(ratio)
        print(f"round {i} {name:<34} old {o['ops_per_sec']:8.0f} ops/s p50 {o['p50_us']:8.1f} "
              f"p99 {o['p99_us']:8.1f} rtts {o['rtts_per_op']:.2f} | new {n['ops_per_sec']:8.0f} "
              f"p50 {n['p50_us']:8.1f} p99 {n['p99_us']:8.1f} rtts {n['rtts_per_op']:.2f} | "
              f"new/old {ratio:.2f}")
for name, rs in ratios.items():
    print(f"{name}: new/old ops/s median {statistics.median(rs):.2f} "
          f"(rounds: {', '.join(f'{r:.2f}' for r in rs)})")
EOF
