//! SNAPSHOT under conflicts, and splits under concurrent inserts and searches.

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};

use common::{TestCluster, key};
use dmkit_kv_index::{IndexConfig, InsertOutcome, Rule, Slot, SnapshotOutcome};
use parking_lot::Mutex;

const SPACE: usize = 4 << 20;

fn config(groups_log2: u8) -> IndexConfig {
    IndexConfig {
        groups_per_subtable_log2: groups_log2,
        max_global_depth: 12,
        seed: 11,
    }
}

fn assert_replicas_identical(tc: &TestCluster) {
    let all = tc.replica_bytes(0, SPACE);
    for (k, r) in all.iter().enumerate().skip(1) {
        assert_eq!(&r[..32], &all[0][..32], "replica {k}: header differs");
        assert!(
            r[64..] == all[0][64..],
            "replica {k}: directory or buckets differ"
        );
    }
}

fn conflicting_updates_have_one_winner_per_round(r: usize) {
    const CLIENTS: usize = 6;
    const ROUNDS: usize = 60;
    let tc = TestCluster::new(r, SPACE, 8 << 20);
    let idx = tc.format(&config(6));
    let k = b"contended".to_vec();
    let first = tc.slot(&idx, &k);
    idx.insert(&tc.keys, &k, first).unwrap();
    let barrier = Barrier::new(CLIENTS);
    // Per round: (client, new slot, outcome).
    let results = Mutex::new(vec![Vec::new(); ROUNDS]);
    std::thread::scope(|s| {
        for c in 0..CLIENTS {
            let (tc, k, barrier, results) = (&tc, &k, &barrier, &results);
            s.spawn(move || {
                let idx = tc.open();
                let mut x = 0x9E37_79B9u64;
                for round in 0..ROUNDS {
                    let mine = tc.slot(&idx, k);
                    if c == 0 {
                        // Random delays on the backups reorder the clients' CASes per node,
                        // so votes split and rules 2 and 3 decide some rounds.
                        tc.cluster.clear_faults();
                        for node in 1..r as u16 {
                            for _ in 0..CLIENTS * 2 {
                                x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
                                let us = (x >> 33) % 400;
                                tc.cluster.delay(
                                    Some(dmkit_verbs::NodeId(node)),
                                    std::time::Duration::from_micros(us),
                                    Some(1),
                                );
                            }
                        }
                    }
                    barrier.wait();
                    let m = idx.update(&tc.keys, k, mine).unwrap().expect("present");
                    results.lock()[round].push((c, mine, m));
                    // Everyone's round finishes before the next begins.
                    barrier.wait();
                }
            });
        }
    });
    // A SNAPSHOT round is every update that expected the same primary value (clients that
    // arrive late read the previous winner's value and start the next round).
    let mut rounds: HashMap<Slot, Vec<(Slot, dmkit_kv_index::Modified)>> = HashMap::new();
    for rs in results.into_inner() {
        for (_, s, m) in rs {
            rounds.entry(m.old).or_default().push((s, m));
        }
    }
    let mut rules: HashMap<Rule, usize> = HashMap::new();
    let mut next: HashMap<Slot, Slot> = HashMap::new();
    let mut contended = 0;
    for (old, rs) in &rounds {
        let winners: Vec<_> = rs
            .iter()
            .filter_map(|(s, m)| match m.outcome {
                SnapshotOutcome::Won(rule) => Some((*s, rule)),
                SnapshotOutcome::Lost { .. } => None,
            })
            .collect();
        assert_eq!(winners.len(), 1, "r={r}: round after {old:?}: {rs:?}");
        let (w, rule) = winners[0];
        *rules.entry(rule).or_default() += 1;
        contended += usize::from(rs.len() > 1);
        next.insert(*old, w);
    }
    // A loser reports the primary once it changed: the round's winner, or a later winner
    // if further rounds completed before its poll — never a value off the chain.
    for (old, rs) in &rounds {
        for (_, m) in rs {
            if let SnapshotOutcome::Lost { now } = m.outcome {
                let now = now.expect("updates never empty the slot");
                let mut at = next[old];
                while at != now {
                    at = *next.get(&at).unwrap_or_else(|| {
                        panic!("r={r}: a loser saw {now:?}, not a later winner of {old:?}")
                    });
                }
            }
        }
    }
    // The winners form one chain from the first value: no round forked.
    let mut prev = first;
    let mut steps = 0;
    while let Some(w) = next.get(&prev) {
        prev = *w;
        steps += 1;
    }
    assert_eq!(
        steps,
        rounds.len(),
        "r={r}: every round follows the previous winner"
    );
    assert!(
        contended > ROUNDS / 2,
        "r={r}: most rounds had several writers"
    );
    assert!(
        rules.len() > 1,
        "r={r}: more than rule 1 decided some round: {rules:?}"
    );
    assert_eq!(idx.search(&tc.keys, &k).unwrap(), Some(prev));
    assert_replicas_identical(&tc);
    eprintln!(
        "r={r}: {} rounds, {contended} contended, winning rules {rules:?}",
        rounds.len()
    );
}

#[test]
fn conflicting_updates_r3_have_one_winner_per_round() {
    conflicting_updates_have_one_winner_per_round(3);
}

#[test]
fn conflicting_updates_r5_have_one_winner_per_round() {
    conflicting_updates_have_one_winner_per_round(5);
}

fn concurrent_inserts_of_one_key_yield_one_inserted(r: usize) {
    const CLIENTS: usize = 6;
    const ROUNDS: u64 = 60;
    let tc = TestCluster::new(r, SPACE, 8 << 20);
    // Small subtables: rounds also race with splits.
    let _ = tc.format(&config(2));
    let barrier = Barrier::new(CLIENTS);
    let results: Mutex<Vec<Vec<(Slot, InsertOutcome)>>> =
        Mutex::new(vec![Vec::new(); ROUNDS as usize]);
    std::thread::scope(|s| {
        for _ in 0..CLIENTS {
            let (tc, barrier, results) = (&tc, &barrier, &results);
            s.spawn(move || {
                let idx = tc.open();
                for round in 0..ROUNDS {
                    let k = key(round);
                    let mine = tc.slot(&idx, &k);
                    barrier.wait();
                    let out = idx.insert(&tc.keys, &k, mine).unwrap();
                    results.lock()[round as usize].push((mine, out));
                }
            });
        }
    });
    let idx = tc.open();
    for (round, rs) in results.into_inner().into_iter().enumerate() {
        let inserted: Vec<Slot> = rs
            .iter()
            .filter(|(_, o)| matches!(o, InsertOutcome::Inserted { .. }))
            .map(|(s, _)| *s)
            .collect();
        assert_eq!(inserted.len(), 1, "r={r} round {round}: {rs:?}");
        for (_, o) in &rs {
            if let InsertOutcome::AlreadyExists { slot } = o {
                assert_eq!(*slot, inserted[0], "r={r} round {round}");
            }
        }
        assert_eq!(
            idx.search(&tc.keys, &key(round as u64)).unwrap(),
            Some(inserted[0])
        );
    }
    assert_replicas_identical(&tc);
}

#[test]
fn concurrent_inserts_of_one_key_yield_one_inserted_r1() {
    concurrent_inserts_of_one_key_yield_one_inserted(1);
}

#[test]
fn concurrent_inserts_of_one_key_yield_one_inserted_r3() {
    concurrent_inserts_of_one_key_yield_one_inserted(3);
}

/// Writers insert disjoint keys into tiny subtables (so splits run all the time) while
/// searchers, on endpoints of their own, look up keys whose INSERT has returned: no search
/// may miss one, and at the end every key is there, on every replica.
#[test]
fn splits_under_concurrent_inserts_and_searches_lose_nothing() {
    const WRITERS: u64 = 3;
    const PER_WRITER: u64 = 1500;
    let tc = TestCluster::new(3, SPACE, 16 << 20);
    let _ = tc.format(&config(3));
    let done: Vec<AtomicU64> = (0..WRITERS).map(|_| AtomicU64::new(0)).collect();
    let slots: Vec<Mutex<Vec<Slot>>> = (0..WRITERS).map(|_| Mutex::new(Vec::new())).collect();
    let stop = AtomicBool::new(false);
    let searches = AtomicU64::new(0);
    std::thread::scope(|s| {
        let mut writers = Vec::new();
        for w in 0..WRITERS {
            let (tc, done, slots) = (&tc, &done, &slots);
            writers.push(s.spawn(move || {
                let idx = tc.open();
                for i in 0..PER_WRITER {
                    let k = key(w * PER_WRITER + i);
                    let slot = tc.slot(&idx, &k);
                    let out = idx.insert(&tc.keys, &k, slot).unwrap();
                    assert!(matches!(out, InsertOutcome::Inserted { .. }), "{out:?}");
                    slots[w as usize].lock().push(slot);
                    done[w as usize].store(i + 1, Ordering::Release);
                }
            }));
        }
        for seed in 0..2u64 {
            let (tc, done, slots, stop, searches) = (&tc, &done, &slots, &stop, &searches);
            s.spawn(move || {
                let idx = tc.open();
                let mut x = seed * 7919 + 1;
                while !stop.load(Ordering::Acquire) {
                    x = x
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    let w = (x >> 33) % WRITERS;
                    let n = done[w as usize].load(Ordering::Acquire);
                    if n == 0 {
                        continue;
                    }
                    let i = (x >> 13) % n;
                    let want = slots[w as usize].lock()[i as usize];
                    let got = idx.search(&tc.keys, &key(w * PER_WRITER + i)).unwrap();
                    assert_eq!(got, Some(want), "search missed key {w}/{i}");
                    searches.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
        // Stop the searchers once the writers are done (or one failed).
        let mut failed = false;
        for h in writers {
            failed |= h.join().is_err();
        }
        stop.store(true, Ordering::Release);
        assert!(!failed, "a writer failed");
    });
    let idx = tc.open();
    assert!(
        idx.subtables() >= 16,
        "grew to {} subtables",
        idx.subtables()
    );
    for w in 0..WRITERS {
        let slots = slots[w as usize].lock();
        for i in 0..PER_WRITER {
            assert_eq!(
                idx.search(&tc.keys, &key(w * PER_WRITER + i)).unwrap(),
                Some(slots[i as usize]),
                "key {w}/{i}"
            );
        }
    }
    assert!(searches.load(Ordering::Relaxed) > 100);
    assert_replicas_identical(&tc);
}

/// Updates and deletes of existing keys while other clients' inserts split the subtables:
/// no update is lost to a split (the final value is the last one each writer wrote).
#[test]
fn updates_racing_splits_are_not_lost() {
    const KEYS: u64 = 300;
    let tc = TestCluster::new(3, SPACE, 16 << 20);
    let idx = tc.format(&config(3));
    for i in 0..KEYS {
        let s = tc.slot(&idx, &key(i));
        idx.insert(&tc.keys, &key(i), s).unwrap();
    }
    let last: Vec<Mutex<Option<Slot>>> = (0..KEYS).map(|_| Mutex::new(None)).collect();
    let stop = Arc::new(AtomicBool::new(false));
    std::thread::scope(|s| {
        {
            let (tc, stop) = (&tc, stop.clone());
            s.spawn(move || {
                let idx = tc.open();
                for i in 0..2500u64 {
                    let k = key(1_000_000 + i);
                    let slot = tc.slot(&idx, &k);
                    idx.insert(&tc.keys, &k, slot).unwrap();
                }
                stop.store(true, Ordering::Release);
            });
        }
        {
            let (tc, last, stop) = (&tc, &last, stop.clone());
            s.spawn(move || {
                let idx = tc.open();
                let mut round = 0u64;
                while !stop.load(Ordering::Acquire) {
                    let i = round % KEYS;
                    let s = tc.slot(&idx, &key(i));
                    let m = idx.update(&tc.keys, &key(i), s).unwrap().expect("present");
                    assert!(matches!(m.outcome, SnapshotOutcome::Won(_)), "{m:?}");
                    *last[i as usize].lock() = Some(s);
                    round += 1;
                }
            });
        }
    });
    let idx = tc.open();
    for i in 0..KEYS {
        if let Some(s) = *last[i as usize].lock() {
            assert_eq!(idx.search(&tc.keys, &key(i)).unwrap(), Some(s), "key {i}");
        }
    }
    assert_replicas_identical(&tc);
}
