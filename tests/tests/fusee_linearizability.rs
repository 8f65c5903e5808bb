//! FUSEE histories checked for linearizability: several clients on a few keys, random
//! operations, one client crashed at a random verb and recovered while the others go on, r = 1
//! to 3, work requests delayed at random. Each seed is a different history; CI runs a bounded
//! number (`DMKIT_LIN_SEEDS`, default 60), the documented long run thousands.
//!
//! The seed fixes the operations, the crash point and the delays; thread interleaving is the
//! OS's, so a failure prints its seed and history for inspection.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use dmkit_fusee::{LocalCluster, LocalConfig};
use dmkit_tests::linearizability::{Call, Event, apply_fusee, apply_fusee_async, check};
use dmkit_verbs::NodeId;
use parking_lot_free::Shared;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

mod parking_lot_free {
    use std::sync::Mutex;

    #[derive(Debug)]
    pub struct Shared<T>(Mutex<Vec<T>>);

    impl<T> Default for Shared<T> {
        fn default() -> Self {
            Self(Mutex::new(Vec::new()))
        }
    }

    impl<T> Shared<T> {
        pub fn push(&self, t: T) {
            self.0.lock().unwrap().push(t);
        }
        pub fn take(&self) -> Vec<T> {
            std::mem::take(&mut *self.0.lock().unwrap())
        }
    }
}

const KEYS: usize = 3;
const THREADS: u64 = 3;
const OPS: usize = 25;

/// A random operation on one of the `KEYS` keys; a written value is `val`.
fn random_call(rng: &mut ChaCha8Rng, val: String) -> (Vec<u8>, Call) {
    let key = format!("k{}", rng.random_range(0..KEYS)).into_bytes();
    let val = val.into_bytes();
    let call = match rng.random_range(0..5) {
        0 => Call::Get,
        1 => Call::Put(val),
        2 => Call::Insert(val),
        3 => Call::Update(val),
        _ => Call::Delete,
    };
    (key, call)
}

/// A seed's cluster: 3 memory nodes with `r` = 1..3 replicas, and (half the seeds, unless
/// `no_delay`) one node's work requests delayed at random.
fn cluster_for(seed: u64, rng: &mut ChaCha8Rng, no_delay: bool) -> (Arc<LocalCluster>, usize) {
    let r = 1 + (seed % 3) as usize;
    let mut cfg = LocalConfig::new(3, r);
    cfg.pool_bytes = 8 << 20;
    cfg.block_size = 64 << 10;
    cfg.cluster.index_bytes = 256 << 10;
    let c = Arc::new(LocalCluster::start(cfg).unwrap());
    if rng.random_bool(0.5) && !no_delay {
        let node = NodeId(rng.random_range(0..3));
        c.sim.delay(
            Some(node),
            Duration::from_micros(rng.random_range(50..500)),
            Some(rng.random_range(1..20)),
        );
    }
    (c, r)
}

/// A third of the seeds with r >= 2 (unless `none`) lose a memory node mid-history: which,
/// and when.
fn node_failure_for(r: usize, rng: &mut ChaCha8Rng, none: bool) -> Option<(NodeId, Duration)> {
    (r >= 2 && rng.random_bool(1.0 / 3.0) && !none).then(|| {
        (
            NodeId(rng.random_range(0..3)),
            Duration::from_micros(rng.random_range(0..3000)),
        )
    })
}

/// Fails the node over after its delay, then restarts it and refills it (the master's work).
fn spawn_node_failure<'s>(
    s: &'s std::thread::Scope<'s, '_>,
    c: &Arc<LocalCluster>,
    failure: Option<(NodeId, Duration)>,
    master: &'s Option<Arc<dmkit_fusee::failover::Master>>,
) {
    if let (Some((node, after)), Some(master)) = (failure, master) {
        let c = c.clone();
        s.spawn(move || {
            std::thread::sleep(after);
            c.sim.fail_node(node);
            master.fail_over(&[node]).unwrap();
            c.restart_node(node).unwrap();
            master.rejoin(node).unwrap();
        });
    }
}

fn run_seed(seed: u64) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let no_delay = std::env::var("DMKIT_LIN_NO_DELAY").is_ok();
    let no_crash = std::env::var("DMKIT_LIN_NO_CRASH").is_ok();
    let (c, r) = cluster_for(seed, &mut rng, no_delay);
    let crash_thread = rng.random_range(0..THREADS);
    let crash_after = rng.random_range(5..120u64);
    let no_node_failure = std::env::var("DMKIT_LIN_NO_NODE_FAILURE").is_ok();
    let node_failure = node_failure_for(r, &mut rng, no_node_failure);
    let master = node_failure.map(|_| c.master().unwrap());
    let clock = AtomicU64::new(0);
    let events: Shared<Event> = Shared::default();
    std::thread::scope(|s| {
        spawn_node_failure(s, &c, node_failure, &master);
        for t in 0..THREADS {
            let c = c.clone();
            let (clock, events) = (&clock, &events);
            let mut trng = ChaCha8Rng::seed_from_u64(seed * 1000 + t);
            s.spawn(move || {
                let id = 10 + t;
                let mut client = c.client(id).unwrap();
                if t == crash_thread && !no_crash {
                    c.sim.crash_client_after(id, crash_after);
                }
                for i in 0..OPS {
                    let (key, call) = random_call(&mut trng, format!("t{t}-{i}"));
                    let start = clock.fetch_add(1, Ordering::SeqCst);
                    let r = apply_fusee(&client, &key, &call);
                    let end = clock.fetch_add(1, Ordering::SeqCst);
                    match r {
                        Ok(ret) => events.push(Event {
                            key,
                            call,
                            ret: Some(ret),
                            start,
                            end,
                        }),
                        Err(e) => {
                            assert!(
                                e.to_string().contains("crashed"),
                                "seed {seed}: thread {t} op {i} failed without a crash: {e}"
                            );
                            events.push(Event {
                                key,
                                call,
                                ret: None,
                                start,
                                end: u64::MAX,
                            });
                            let _ = client.flush();
                            drop(client);
                            client = c.recover(id).unwrap().0;
                        }
                    }
                }
                client.flush().unwrap();
            });
        }
    });
    let history = events.take();
    if let Err(v) = check(&history, &HashMap::new()) {
        panic!(
            "seed {seed} (r = {r}, thread {crash_thread} crashed after {crash_after} verbs, \
             memory node failure {node_failure:?}): {v}"
        );
    }
}

/// The seeds to run: `DMKIT_LIN_SEEDS` of them (default 60) from `DMKIT_LIN_FIRST_SEED`
/// (default 1).
fn seeds() -> (u64, u64) {
    let var = |name: &str, default: u64| {
        std::env::var(name)
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(default)
    };
    (var("DMKIT_LIN_SEEDS", 60), var("DMKIT_LIN_FIRST_SEED", 1))
}

#[test]
fn fusee_histories_with_crashes_are_linearizable() {
    let (seeds, first) = seeds();
    for seed in first..first + seeds {
        run_seed(seed);
    }
    eprintln!(
        "{seeds} FUSEE histories linearizable (seeds {first}..{})",
        first + seeds
    );
}

/// Operations in flight per client in [`run_inflight_seed`].
const INFLIGHT: u64 = 4;

/// Two clients, each running [`INFLIGHT`] operation loops at once on one thread (async
/// operations on one shared `Client`, as FUSEE's coroutines), on a few keys, with delayed work
/// requests and (r >= 2) a memory node failed over, restarted and refilled mid-history.
fn run_inflight_seed(seed: u64) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x1f1f);
    let (c, r) = cluster_for(seed, &mut rng, false);
    let node_failure = node_failure_for(r, &mut rng, false);
    let master = node_failure.map(|_| c.master().unwrap());
    let clock = AtomicU64::new(0);
    let events: Shared<Event> = Shared::default();
    std::thread::scope(|s| {
        spawn_node_failure(s, &c, node_failure, &master);
        for t in 0..2u64 {
            let c = c.clone();
            let (clock, events) = (&clock, &events);
            s.spawn(move || {
                let client = c.client(20 + t).unwrap();
                let loops = (0..INFLIGHT).map(|l| {
                    let (client, clock, events) = (&client, clock, events);
                    let mut trng = ChaCha8Rng::seed_from_u64(seed * 1000 + t * 100 + l);
                    async move {
                        for i in 0..OPS / 2 {
                            let (key, call) = random_call(&mut trng, format!("t{t}.{l}-{i}"));
                            let start = clock.fetch_add(1, Ordering::SeqCst);
                            let r = apply_fusee_async(client, &key, &call).await;
                            let end = clock.fetch_add(1, Ordering::SeqCst);
                            let ret = r.unwrap_or_else(|e| {
                                panic!("seed {seed}: client {t} loop {l} op {i} failed: {e}")
                            });
                            events.push(Event {
                                key,
                                call,
                                ret: Some(ret),
                                start,
                                end,
                            });
                        }
                    }
                });
                dmkit_verbs::block_on(dmkit_verbs::join_all(loops.collect()));
                client.flush().unwrap();
                assert_eq!(client.endpoint().in_flight(), 0);
            });
        }
    });
    let history = events.take();
    if let Err(v) = check(&history, &HashMap::new()) {
        panic!(
            "seed {seed} (r = {r}, {INFLIGHT} in flight per client, memory node failure {node_failure:?}): {v}"
        );
    }
}

#[test]
fn histories_with_operations_in_flight_are_linearizable() {
    let (seeds, first) = seeds();
    for seed in first..first + seeds {
        run_inflight_seed(seed);
    }
    eprintln!(
        "{seeds} FUSEE histories with {INFLIGHT} operations in flight per client linearizable (seeds {first}..{})",
        first + seeds
    );
}
