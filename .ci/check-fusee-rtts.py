#!/usr/bin/env python3
"""Checks a `dmkit bench fusee --workload micro` report (tcp or rdma) against FUSEE's
round-trip contract (crates/fusee/src/lib.rs, "Round trips"): the critical-path round trips
of each operation at r = 1 and r = 3. A few operations may pay a rare extra round (a rule-2
SNAPSHOT round, a directory refresh): the mean may exceed the contract by 0.25 at most."""
import json
import sys

EXPECTED = {  # operation: (r = 1, r = 3)
    "insert": (2, 4),
    "search": (1, 1),
    "update": (2, 4),
    "upsert": (2, 4),
    "search_uncached": (2, 2),
    "delete": (2, 4),
}

report = json.load(open(sys.argv[1]))
rows = {m["name"]: m for m in report["results"]}
bad = []
for op, (r1, r3) in EXPECTED.items():
    for r, want in ((1, r1), (3, r3)):
        name = f"{op}_r{r}"
        got = rows.get(name, {}).get("rtts_per_op")
        if got is None or not (want - 0.01 <= got <= want + 0.25):
            bad.append(f"{name}: {got} round trips, contract {want}")
        else:
            print(f"{name:<20} {got:.2f} round trips (contract {want}), "
                  f"p50 {rows[name]['p50_us']:.0f} us, p99 {rows[name]['p99_us']:.0f} us")
for k, v in sorted(report["ratios"].items()):
    print(f"{k:<42} {v}")
if bad:
    print("round-trip contract broken:\n  " + "\n  ".join(bad), file=sys.stderr)
    sys.exit(1)
print("fusee round trips: ok")
