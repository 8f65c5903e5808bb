//! Every SNAPSHOT round finishes, even when its writer stops midway and never comes back.
//!
//! The interleaving, injected deterministically: writer A (a client that stops after its
//! `k`-th verb, as a paused or cut-off process does, and is never recovered) updates a key;
//! writer B then updates the same key. For every `k` A stops at — before its object write,
//! between its backup CASes (the backups split between A's value and B's, with A's the
//! smaller: B loses by rule 3 and waits for A), after all of them, before its primary swap —
//! B must finish: after `resync_after` it asks the master, which fences the cluster and
//! repairs the round (rolling it back, or finishing it when every backup holds A's value);
//! B settles in the new epoch and writes. Before the resync existed B waited out the index's
//! 10 s and failed with "SNAPSHOT round stalled" (on the OS-scheduled in-flight sweep, about
//! one seed in 20 000: two clients stalled on a slot whose backups held two other values).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use dmkit_fusee::{ClientConfig, LocalCluster, LocalConfig};

/// Verbs of A's UPDATE covered (its whole operation fits well within).
const MAX_VERBS: u64 = 40;

fn stuck_round_at(k: u64, r: usize) -> (bool, Duration) {
    let mut cfg = LocalConfig::new(3, r);
    cfg.pool_bytes = 8 << 20;
    cfg.block_size = 64 << 10;
    cfg.cluster.index_bytes = 256 << 10;
    let c = Arc::new(LocalCluster::start(cfg).unwrap());
    let seed = c.client(30).unwrap();
    seed.insert(b"key", b"v0").unwrap();
    let master = c.master().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    // The master's side of a resync, as `Master::run` does it on its heartbeats.
    let serving = {
        let (master, stop) = (master.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut resyncs = 0;
            while !stop.load(Ordering::Relaxed) {
                if let Ok(Some(_)) = master.resync_if_asked() {
                    resyncs += 1;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            resyncs
        })
    };
    let a = c.client(20).unwrap();
    c.sim.crash_client_after(20, k);
    let a_done = a.update(b"key", b"from-a").is_ok();
    let mut bcfg = ClientConfig::new(21);
    bcfg.resync_after = Duration::from_millis(100);
    let b = c.client_with(bcfg).unwrap();
    let t = Instant::now();
    let r_b = b.update(b"key", b"from-b");
    let took = t.elapsed();
    stop.store(true, Ordering::Relaxed);
    let resyncs = serving.join().unwrap();
    assert!(
        r_b.is_ok(),
        "r = {r}, A stopped after {k} verbs: B's UPDATE failed after {took:?}: {:?}",
        r_b.err()
    );
    assert_eq!(
        b.search(b"key").unwrap().as_deref(),
        Some(&b"from-b"[..]),
        "r = {r}, A stopped after {k} verbs"
    );
    // A fresh client agrees (the replicas were repaired, not only B's view).
    let fresh = c.client(22).unwrap();
    assert_eq!(
        fresh.search(b"key").unwrap().as_deref(),
        Some(&b"from-b"[..])
    );
    (resyncs > 0 && !a_done, took)
}

#[test]
fn a_round_whose_writer_stops_midway_is_finished_for_the_next_writer() {
    for r in [2, 3] {
        let mut stuck = Vec::new();
        let mut slowest = Duration::ZERO;
        for k in 0..MAX_VERBS {
            let (resynced, took) = stuck_round_at(k, r);
            slowest = slowest.max(took);
            if resynced {
                stuck.push(k);
            }
        }
        eprintln!(
            "r = {r}: B finished for every stop of A in 0..{MAX_VERBS} verbs; resyncs at {stuck:?}; slowest {slowest:?}"
        );
        // The split (and the all-backups-but-no-swap) interleavings were met: the test
        // covers what it claims.
        assert!(
            !stuck.is_empty(),
            "r = {r}: no stop of A left a round for B to wait on"
        );
        assert!(slowest < Duration::from_secs(5), "r = {r}: {slowest:?}");
    }
}
