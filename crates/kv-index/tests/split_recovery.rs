//! A split cut short — its client crashed, or its connection broke, at any verb — is finished
//! by whoever holds the split lock next: another client takes the lock over once it stood
//! still for the split timeout, and the same client, restarted in the same process, takes
//! its own stranded lock back at once. Nothing inserted before is lost, the index grows, the
//! replicas agree, and the lock and the split record end free.

mod common;

use std::time::{Duration, Instant};

use common::{TestCluster, key};
use dmkit_kv_index::{IndexConfig, InsertOutcome, RaceIndex, Slot};

const SPACE: usize = 2 << 20;

fn config() -> IndexConfig {
    IndexConfig {
        groups_per_subtable_log2: 3,
        max_global_depth: 10,
        seed: 5,
    }
}

/// Inserts keys from 0 with `idx` until one of them splits; returns that key's number and
/// the client's verbs posted before and after it.
fn first_split(tc: &TestCluster, id: u64, idx: &RaceIndex) -> (u64, u64, u64) {
    for i in 0.. {
        let s = tc.slot(idx, &key(i));
        let before = tc.cluster.verbs_posted(id);
        let out = idx.insert(&tc.keys, &key(i), s).unwrap();
        assert!(matches!(out, InsertOutcome::Inserted { .. }));
        if idx.subtables() > 1 {
            return (i, before, tc.cluster.verbs_posted(id));
        }
    }
    unreachable!()
}

fn header_words(tc: &TestCluster) -> (u64, u64) {
    let b = &tc.replica_bytes(0, 64)[0];
    let w = |i: usize| u64::from_le_bytes(b[i * 8..i * 8 + 8].try_into().unwrap());
    (w(5), w(7))
}

/// Runs one history: client A crashes `cut` verbs into the INSERT that splits; then `next`
/// (another client, or A restarted) inserts more keys. Every key acknowledged is found.
fn cut_split(r: usize, cut: u64, same_client: bool) -> bool {
    let tc = TestCluster::new(r, SPACE, 8 << 20);
    let _ = tc.format(&config());
    let (a, idx_a) = tc.open_client();
    let idx_a = idx_a.with_wait_timeout(Duration::from_millis(100));
    // The same history as the probe run: keys 0..j-1 fit, key j splits.
    let (j, _, _) = {
        let probe = TestCluster::new(r, SPACE, 8 << 20);
        let _ = probe.format(&config());
        let (pid, pidx) = probe.open_client();
        first_split(&probe, pid, &pidx)
    };
    let mut acked: Vec<(u64, Slot)> = Vec::new();
    for i in 0..j {
        let s = tc.slot(&idx_a, &key(i));
        idx_a.insert(&tc.keys, &key(i), s).unwrap();
        acked.push((i, s));
    }
    let s = tc.slot(&idx_a, &key(j));
    tc.cluster.crash_client_after(a, cut);
    let cut_short = idx_a.insert(&tc.keys, &key(j), s).is_err();
    let interrupted = header_words(&tc).1 != 0;
    let next = if same_client {
        tc.cluster.restart_client(a);
        // A long timeout: the client must take its own lock back, not wait it out.
        idx_a.with_wait_timeout(Duration::from_secs(30))
    } else {
        tc.open().with_wait_timeout(Duration::from_millis(100))
    };
    if !cut_short {
        acked.push((j, s));
    }
    // Until the index has split once more after the cut: that split holds the lock last, so
    // the lock and the record must end free (a cut after a split finished may leave the lock
    // held until the next split takes it over).
    let t0 = Instant::now();
    let grown = tc.open().subtables();
    let mut i = j + 1;
    while next.subtables() <= grown || i < j + 60 {
        assert!(i < j + 2000, "r={r} cut={cut}: no further split");
        let s = tc.slot(&next, &key(i));
        let out = next
            .insert(&tc.keys, &key(i), s)
            .unwrap_or_else(|e| panic!("r={r} cut={cut}: insert {i} after the cut: {e}"));
        assert!(matches!(out, InsertOutcome::Inserted { .. }));
        acked.push((i, s));
        i += 1;
    }
    if same_client {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "r={r} cut={cut}: the restarted client waited {:?} for its own lock",
            t0.elapsed()
        );
    }
    let check = tc.open();
    assert!(check.subtables() >= 2, "r={r} cut={cut}: never split");
    for (i, s) in &acked {
        assert_eq!(
            check.search(&tc.keys, &key(*i)).unwrap(),
            Some(*s),
            "r={r} cut={cut}: key {i} lost"
        );
    }
    let (lock, record) = header_words(&tc);
    assert_eq!((lock, record), (0, 0), "r={r} cut={cut}: lock/record left");
    let all = tc.replica_bytes(0, SPACE);
    for (k, rep) in all.iter().enumerate().skip(1) {
        assert!(
            rep[64..] == all[0][64..],
            "r={r} cut={cut}: replica {k} differs"
        );
    }
    interrupted
}

fn sweep(r: usize, same_client: bool) {
    let tc = TestCluster::new(r, SPACE, 8 << 20);
    let _ = tc.format(&config());
    let (id, idx) = tc.open_client();
    let (_, before, after) = first_split(&tc, id, &idx);
    let span = after - before;
    // About 40 cut points spread over the splitting INSERT (its split included).
    let step = (span / 40).max(1);
    let mut interrupted = 0;
    for cut in (1..span).step_by(step as usize) {
        interrupted += usize::from(cut_split(r, cut, same_client));
    }
    // Most cut points fall inside the split (its record written, not yet cleared).
    assert!(
        interrupted >= 20,
        "only {interrupted} cuts interrupted a split"
    );
}

#[test]
fn another_client_finishes_a_split_cut_short_r1() {
    sweep(1, false);
}

#[test]
fn another_client_finishes_a_split_cut_short_r3() {
    sweep(3, false);
}

#[test]
fn a_restarted_client_takes_its_own_split_lock_back_r3() {
    sweep(3, true);
}
