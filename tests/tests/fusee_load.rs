//! The load test: 64 client tasks on zipf-0.99 keys, over a million operations, with memory
//! nodes failing and coming back (failed over and refilled by the master's detector) along the
//! way. No deadlock (a watchdog), no lost acknowledged write (every key checked at the end),
//! memory bounded (allocated blocks do not grow past the warm-up level by more than the
//! failovers' leaks allow).
//!
//! Release-mode tier (run by `.ci/tier-rdma.sh`, on its release build):
//! `cargo test --release -p dmkit-tests --test fusee_load -- --ignored --nocapture`.
//! `DMKIT_LOAD_OPS` sets the total operations (default 1 050 000).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use dmkit_fusee::failover::MasterConfig;
use dmkit_fusee::{LocalCluster, LocalConfig};
use dmkit_verbs::NodeId;
use dmkit_workloads::ycsb::ScrambledZipfian;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const TASKS: u64 = 64;
const KEYS_PER_TASK: i64 = 300;

fn key(task: u64, i: i64) -> Vec<u8> {
    format!("user{task:02}-{i:05}").into_bytes()
}

#[test]
#[ignore = "a release-mode tier: .ci/tier-rdma.sh runs it"]
fn sixty_four_tasks_a_million_ops_with_memnode_restarts() {
    let total: u64 = std::env::var("DMKIT_LOAD_OPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1_050_000);
    let per_task = total.div_ceil(TASKS);
    let mut cfg = LocalConfig::new(3, 3);
    cfg.pool_bytes = 256 << 20;
    cfg.block_size = 64 << 10;
    cfg.cluster.index_bytes = 8 << 20;
    let c = Arc::new(LocalCluster::start(cfg).unwrap());
    let master = c.master().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let detector = {
        let (m, s) = (master.clone(), stop.clone());
        std::thread::spawn(move || {
            m.run(
                // Failed over after 500 ms of silence, as with the default settings (100 ms
                // x 5): 20 ms x 5 failed over members that were only starved of CPU by the 64
                // tasks — some 34 times a run with no restart at all (epoch 69), each one
                // leaving the cleanups it cut short to recovery, so memory grew with them.
                MasterConfig {
                    heartbeat: Duration::from_millis(20),
                    miss_limit: 25,
                    auto_rejoin: true,
                },
                s,
            )
        })
    };
    let done = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let tasks: Vec<_> = (0..TASKS)
        .map(|t| {
            let (c, done) = (c.clone(), done.clone());
            std::thread::spawn(move || {
                let kv = c.client(1 + t).unwrap();
                let mut rng = ChaCha8Rng::seed_from_u64(0x10AD ^ t);
                let mut zipf = ScrambledZipfian::new(0, KEYS_PER_TASK - 1, 0.99);
                let mut acked: HashMap<Vec<u8>, Vec<u8>> = HashMap::new();
                for i in 0..KEYS_PER_TASK {
                    let v = format!("load-{t}-{i}").into_bytes();
                    kv.upsert(&key(t, i), &v).unwrap();
                    acked.insert(key(t, i), v);
                }
                for n in 0..per_task {
                    let i = zipf.next(&mut rng);
                    // Reads anywhere, writes only to this task's keys: every key's last
                    // acknowledged write is well defined.
                    if rng.random_bool(0.5) {
                        let other = rng.random_range(0..TASKS);
                        kv.search(&key(other, i))
                            .unwrap_or_else(|e| panic!("task {t} op {n}: search: {e}"));
                    } else {
                        let v = format!("t{t}-{n}").into_bytes();
                        kv.upsert(&key(t, i), &v)
                            .unwrap_or_else(|e| panic!("task {t} op {n}: upsert: {e}"));
                        acked.insert(key(t, i), v);
                    }
                    done.fetch_add(1, Ordering::Relaxed);
                }
                kv.flush().unwrap();
                acked
            })
        })
        .collect();

    // Restarts along the way, with a watchdog on progress.
    let mut restarts = 0;
    let mut blocks_mid = None;
    let mut last = (0, Instant::now());
    let marks: &[f64] = if std::env::var("DMKIT_LOAD_NO_RESTARTS").is_ok() {
        &[]
    } else {
        &[0.15, 0.35, 0.55, 0.75]
    };
    let mut next_mark = 0;
    while done.load(Ordering::Relaxed) < per_task * TASKS {
        std::thread::sleep(Duration::from_millis(50));
        let d = done.load(Ordering::Relaxed);
        if d != last.0 {
            last = (d, Instant::now());
        }
        assert!(
            last.1.elapsed() < Duration::from_secs(60),
            "no progress for 60 s at {d} operations: deadlock? membership {:?}",
            master.membership()
        );
        if tasks.iter().all(|h| h.is_finished()) {
            break;
        }
        let frac = d as f64 / (per_task * TASKS) as f64;
        if blocks_mid.is_none() && frac >= 0.1 {
            blocks_mid = Some(c.allocated_blocks());
        }
        if next_mark < marks.len() && frac >= marks[next_mark] {
            let node = NodeId((next_mark % 3) as u16);
            c.sim.fail_node(node);
            let t = Instant::now();
            while master.membership().is_member(node) {
                assert!(
                    t.elapsed() < Duration::from_secs(30),
                    "{node} never failed over"
                );
                std::thread::sleep(Duration::from_millis(5));
            }
            std::thread::sleep(Duration::from_millis(100));
            c.restart_node(node).unwrap();
            while !master.membership().is_member(node) || master.membership().repairing {
                assert!(
                    t.elapsed() < Duration::from_secs(60),
                    "{node} never rejoined"
                );
                std::thread::sleep(Duration::from_millis(5));
            }
            eprintln!(
                "restart {}: memnode {node} failed over and refilled in {:?} (at {d} ops)",
                restarts + 1,
                t.elapsed()
            );
            restarts += 1;
            next_mark += 1;
        }
    }
    let results: Vec<_> = tasks.into_iter().map(|h| h.join().unwrap()).collect();
    let elapsed = started.elapsed();
    stop.store(true, Ordering::Relaxed);
    detector.join().unwrap();
    let ops = done.load(Ordering::Relaxed);
    assert!(
        ops >= 1_000_000 || total < 1_000_000,
        "only {ops} operations"
    );
    assert_eq!(restarts, marks.len(), "not every restart happened");

    let reader = c.client(999).unwrap();
    let mut lost = Vec::new();
    let mut keys = 0;
    for acked in &results {
        for (k, v) in acked {
            keys += 1;
            if reader.search(k).unwrap().as_deref() != Some(v.as_slice()) {
                lost.push(String::from_utf8_lossy(k).into_owned());
            }
        }
    }
    assert!(
        lost.is_empty(),
        "{} acknowledged writes lost: {:?}",
        lost.len(),
        &lost[..lost.len().min(10)]
    );
    let blocks_end = c.allocated_blocks();
    let mid = blocks_mid.unwrap_or(blocks_end);
    eprintln!(
        "{ops} operations by {TASKS} tasks in {elapsed:?} ({:.0} ops/s), {restarts} memnode restarts, \
         {keys} keys checked, allocated blocks {mid} at 10% -> {blocks_end} at the end, \
         membership epoch {} (4 per restart)",
        ops as f64 / elapsed.as_secs_f64(),
        master.membership().epoch
    );
    assert!(
        blocks_end <= mid * 2 + 64,
        "memory grew from {mid} to {blocks_end} blocks"
    );
}
