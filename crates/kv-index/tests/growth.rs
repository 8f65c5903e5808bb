//! Online growth from one subtable to ten million keys (sim backend).
//!
//! Long: run it in release, as CI does:
//!
//! ```text
//! cargo test --release -p dmkit-kv-index --test growth -- --ignored --nocapture
//! ```
//!
//! `DMKIT_GROWTH_KEYS` overrides the key count (e.g. 1000000 for a quicker local run).

mod common;

use std::time::Instant;

use common::TestCluster;
use dmkit_kv_index::{IndexConfig, InsertOutcome};

#[test]
#[ignore = "long: cargo test --release -p dmkit-kv-index --test growth -- --ignored"]
fn grows_from_one_subtable_to_ten_million_keys() {
    const THREADS: u64 = 2;
    const CHUNK: u64 = 4096;
    let total: u64 = std::env::var("DMKIT_GROWTH_KEYS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000_000);
    let tc = TestCluster::new(1, 1 << 30, (total as usize + 1024) * 64);
    let idx = tc.format(&IndexConfig {
        groups_per_subtable_log2: 12,
        max_global_depth: 12,
        seed: 3,
    });
    assert_eq!(idx.subtables(), 1);
    let t0 = Instant::now();
    let key = |i: u64| i.to_le_bytes();
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let tc = &tc;
            s.spawn(move || {
                let idx = tc.open();
                let mut next = t * CHUNK;
                while next < total {
                    let end = (next + CHUNK).min(total);
                    let keys: Vec<[u8; 8]> = (next..end).map(key).collect();
                    let refs: Vec<&[u8]> = keys.iter().map(|k| k.as_slice()).collect();
                    let ptrs = tc.keys.put_many(idx.endpoint(), &refs).unwrap();
                    for (k, p) in keys.iter().zip(ptrs) {
                        let slot = idx.slot_for(k, p).unwrap();
                        let out = idx.insert(&tc.keys, k, slot).unwrap();
                        assert!(matches!(out, InsertOutcome::Inserted { .. }), "{out:?}");
                    }
                    next += THREADS * CHUNK;
                }
            });
        }
    });
    let inserted = t0.elapsed();
    let idx = tc.open();
    let subtables = idx.subtables();
    let t1 = Instant::now();
    // Every key is found (in parallel, as inserted).
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let tc = &tc;
            s.spawn(move || {
                let idx = tc.open();
                let mut i = t;
                while i < total {
                    assert!(
                        idx.search(&tc.keys, &key(i)).unwrap().is_some(),
                        "key {i} missing"
                    );
                    i += THREADS;
                }
            });
        }
    });
    eprintln!(
        "{total} keys: inserted in {inserted:?}, searched in {:?}; {subtables} subtables, global depth {}",
        t1.elapsed(),
        idx.global_depth()
    );
    // A subtable holds 4096 * 3 * 7 = 86,016 slots: growth kept the load below 100%.
    assert!(
        subtables as u64 * 86_016 > total,
        "grew to {subtables} subtables"
    );
    assert!(
        subtables as u64 >= total / 86_016,
        "grew to {subtables} subtables"
    );
}
