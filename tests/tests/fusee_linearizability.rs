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
use dmkit_tests::linearizability::{Call, Event, Ret, apply_fusee, apply_fusee_async, check};
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

/// A random operation with conditional writes: compare-and-set and delete-if over the value
/// this thread last saw for the key (so that many of them succeed), beside the others.
fn random_call_cas(
    rng: &mut ChaCha8Rng,
    val: String,
    seen: &HashMap<Vec<u8>, Vec<u8>>,
) -> (Vec<u8>, Call) {
    let key = format!("k{}", rng.random_range(0..KEYS)).into_bytes();
    let expected = seen.get(&key).cloned().unwrap_or_else(|| b"-".to_vec());
    let val = val.into_bytes();
    let call = match rng.random_range(0..7) {
        0 => Call::Get,
        1 => Call::Put(val),
        2 => Call::Insert(val),
        3 | 4 => Call::Cas { expected, new: val },
        5 => Call::DeleteIf(expected),
        _ => Call::Delete,
    };
    (key, call)
}

/// What a thread learns of a key's value from an operation's result (for its next
/// conditional write).
fn learn(seen: &mut HashMap<Vec<u8>, Vec<u8>>, key: &[u8], call: &Call, ret: &Ret) {
    let v = match (call, ret) {
        (_, Ret::Value(Some(v))) => Some(v.clone()),
        (Call::Put(v), _) | (Call::Insert(v), Ret::Flag(true)) => Some(v.clone()),
        (Call::Cas { new, .. }, Ret::Flag(true)) => Some(new.clone()),
        _ => None,
    };
    if let Some(v) = v {
        seen.insert(key.to_vec(), v);
    }
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

/// The master's side of resyncs while `stop` is unset, as `Master::run` serves them: a
/// client waiting on a round nobody finishes (its writer crashed and is not yet recovered, or
/// is descheduled) asks after `ClientConfig::resync_after`; the master fences and repairs.
fn spawn_resyncs<'s>(
    s: &'s std::thread::Scope<'s, '_>,
    master: &'s Option<Arc<dmkit_fusee::failover::Master>>,
    stop: &'s Stop,
) {
    if let Some(master) = master {
        s.spawn(move || {
            while !stop.wait(Duration::from_millis(20)) {
                let _ = master.resync_if_asked();
            }
        });
    }
}

/// A stop flag a thread can wait on (a history ends without waiting out a sleep).
#[derive(Default)]
struct Stop(std::sync::Mutex<bool>, std::sync::Condvar);

impl Stop {
    fn set(&self) {
        *self.0.lock().unwrap() = true;
        self.1.notify_all();
    }

    /// Waits up to `d` for the flag; whether it is set.
    fn wait(&self, d: Duration) -> bool {
        let g = self.0.lock().unwrap();
        let (g, _) = self.1.wait_timeout_while(g, d, |set| !*set).unwrap();
        *g
    }
}

fn run_seed(seed: u64, cas: bool) {
    let no_delay = std::env::var("DMKIT_LIN_NO_DELAY").is_ok();
    let no_crash = std::env::var("DMKIT_LIN_NO_CRASH").is_ok();
    run_seed_with(seed, cas, no_delay, no_crash);
}

fn run_seed_with(seed: u64, cas: bool, no_delay: bool, no_crash: bool) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let (c, r) = cluster_for(seed, &mut rng, no_delay);
    let crash_thread = rng.random_range(0..THREADS);
    let crash_after = rng.random_range(5..120u64);
    let no_node_failure = std::env::var("DMKIT_LIN_NO_NODE_FAILURE").is_ok();
    let node_failure = node_failure_for(r, &mut rng, no_node_failure);
    let master = Some(c.master().unwrap());
    let clock = AtomicU64::new(0);
    let events: Shared<Event> = Shared::default();
    let stop = Stop::default();
    std::thread::scope(|s| {
        spawn_node_failure(s, &c, node_failure, &master);
        spawn_resyncs(s, &master, &stop);
        let mut clients = Vec::new();
        for t in 0..THREADS {
            let c = c.clone();
            let (clock, events) = (&clock, &events);
            let mut trng = ChaCha8Rng::seed_from_u64(seed * 1000 + t);
            clients.push(s.spawn(move || {
                let id = 10 + t;
                let mut client = c.client(id).unwrap();
                if t == crash_thread && !no_crash {
                    c.sim.crash_client_after(id, crash_after);
                }
                let mut seen = HashMap::new();
                for i in 0..OPS {
                    let (key, call) = if cas {
                        random_call_cas(&mut trng, format!("t{t}-{i}"), &seen)
                    } else {
                        random_call(&mut trng, format!("t{t}-{i}"))
                    };
                    let start = clock.fetch_add(1, Ordering::SeqCst);
                    let r = apply_fusee(&client, &key, &call);
                    let end = clock.fetch_add(1, Ordering::SeqCst);
                    if let Ok(ret) = &r {
                        learn(&mut seen, &key, &call, ret);
                    }
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
            }));
        }
        let panicked = clients.into_iter().map(|h| h.join()).find(|r| r.is_err());
        stop.set();
        if let Some(Err(p)) = panicked {
            std::panic::resume_unwind(p);
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
        run_seed(seed, false);
    }
    eprintln!(
        "{seeds} FUSEE histories linearizable (seeds {first}..{})",
        first + seeds
    );
}

/// The same histories (crashes, delays, node failures) with conditional writes: compare-and-
/// set and delete-if over values the threads read, beside the other operations. Seeds are
/// drawn as above; `DMKIT_LIN_CAS_SEEDS` of them (default 40) from `DMKIT_LIN_FIRST_SEED`.
/// Seeds of the default histories that failed once under OS scheduling (docs/RELIABILITY.md,
/// issue #20's list): 22 (r = 2, the index primary's node lost, a client crash), 146 (the
/// A-B-A stall), 1828 (two DELETEs of one value both reported done), 2674 and 2732 (an INSERT
/// spanning a failover reported done, its key gone afterwards), 1898, 2411 and 3479; and
/// 51002 without crashes or delays (a stall). Each failed about one run in 10–30 when it was
/// open, so each runs five times here (about 15 ms a run in release).
const OS_REGRESSION_SEEDS: [u64; 8] = [22, 146, 1828, 1898, 2411, 2674, 2732, 3479];

#[test]
fn os_scheduled_seeds_that_once_failed_stay_linearizable() {
    for _ in 0..5 {
        for seed in OS_REGRESSION_SEEDS {
            run_seed_with(seed, false, false, false);
        }
        run_seed_with(51002, false, true, true);
    }
}

/// Conditional-write seeds that failed once (docs/RELIABILITY.md, session 9: a DELETE that
/// took effect reported "not found" while a crashed client's DELETE of the same word was
/// recovered — two DELETEs sharing one tombstone, which marked tombstones ended in session
/// 12), 910187 and 918995 of session 10, and of session 11's sweep: 1309831 (the same shape:
/// a client crashed in a delete-if beside a DELETE) and 1319968 (a round stalled with r = 2).
/// They failed about one run in 10 000 and did not replay at will; five runs each.
const CAS_REGRESSION_SEEDS: [u64; 7] = [854731, 874856, 882635, 910187, 918995, 1309831, 1319968];

#[test]
fn conditional_seeds_that_once_failed_stay_linearizable() {
    for _ in 0..5 {
        for seed in CAS_REGRESSION_SEEDS {
            run_seed_with(seed, true, false, false);
        }
    }
}

#[test]
fn histories_with_conditional_writes_are_linearizable() {
    let (_, first) = seeds();
    let seeds = std::env::var("DMKIT_LIN_CAS_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(40u64);
    for seed in first..first + seeds {
        run_seed(seed, true);
    }
    eprintln!(
        "{seeds} FUSEE histories with conditional writes linearizable (seeds {first}..{})",
        first + seeds
    );
}

/// Operations in flight per client in [`run_inflight_seed`].
const INFLIGHT: u64 = 4;

/// Two clients, each running [`INFLIGHT`] operation loops at once on one thread (async
/// operations on one shared `Client`, as FUSEE's coroutines), on a few keys, with delayed work
/// requests and (r >= 2) a memory node failed over, restarted and refilled mid-history.
fn run_inflight_seed(seed: u64) {
    // One client crashes with its operations in flight, in every history since session 11
    // (opt-in before, `DMKIT_LIN_INFLIGHT_CRASH=1`, while the anomaly of seed 1200334 was
    // open; 10 000 seeds passed after its fix). `DMKIT_LIN_NO_CRASH` turns it off.
    let crash = std::env::var("DMKIT_LIN_NO_CRASH").is_err();
    run_inflight_seed_with(seed, crash);
}

fn run_inflight_seed_with(seed: u64, crash: bool) {
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x1f1f);
    let (c, r) = cluster_for(seed, &mut rng, false);
    let node_failure = node_failure_for(r, &mut rng, false);
    let master = Some(c.master().unwrap());
    // One client crashes with its operations in flight (drawn apart, so the other draws
    // stay those of earlier sessions' seeds).
    let mut crng = ChaCha8Rng::seed_from_u64(seed ^ 0xc4a5);
    let crash_client = crash.then(|| crng.random_range(0..2u64));
    let crash_after = crng.random_range(5..200u64);
    let restarted = AtomicU64::new(0);
    let clock = AtomicU64::new(0);
    let events: Shared<Event> = Shared::default();
    let stop = Stop::default();
    std::thread::scope(|s| {
        spawn_node_failure(s, &c, node_failure, &master);
        spawn_resyncs(s, &master, &stop);
        let mut clients = Vec::new();
        for t in 0..2u64 {
            let c = c.clone();
            let (clock, events, restarted) = (&clock, &events, &restarted);
            clients.push(s.spawn(move || {
                let id = 20 + t;
                let crashes = crash_client == Some(t);
                let crew = Crew::new(c.client(id).unwrap());
                if crashes {
                    c.sim.crash_client_after(id, crash_after);
                }
                let loops = (0..INFLIGHT).map(|l| {
                    let (crew, clock, events, c) = (&crew, clock, events, &c);
                    let mut trng = ChaCha8Rng::seed_from_u64(seed * 1000 + t * 100 + l);
                    async move {
                        for i in 0..OPS / 2 {
                            let (key, call) = random_call(&mut trng, format!("t{t}.{l}-{i}"));
                            let client = crew.client();
                            let start = clock.fetch_add(1, Ordering::SeqCst);
                            let r = apply_fusee_async(&client, &key, &call).await;
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
                                        crashes && e.to_string().contains("crashed"),
                                        "seed {seed}: client {t} loop {l} op {i} failed without a crash: {e}"
                                    );
                                    events.push(Event {
                                        key,
                                        call,
                                        ret: None,
                                        start,
                                        end: u64::MAX,
                                    });
                                    drop(client);
                                    // Every operation in flight fails with the crash: once
                                    // they all have, the client restarts and recovers them
                                    // all at once from its log.
                                    crew.crashed(|| c.recover(id).unwrap().0).await;
                                }
                            }
                        }
                        crew.finished(|| c.recover(id).unwrap().0);
                    }
                });
                dmkit_verbs::block_on(dmkit_verbs::join_all(loops.collect()));
                let client = crew.client();
                client.flush().unwrap();
                assert_eq!(client.endpoint().in_flight(), 0);
                if crashes {
                    restarted.fetch_add(u64::from(crew.restarts.get()), Ordering::SeqCst);
                }
            }));
        }
        let panicked = clients.into_iter().map(|h| h.join()).find(|r| r.is_err());
        stop.set();
        if let Some(Err(p)) = panicked {
            std::panic::resume_unwind(p);
        }
    });
    if crash_client.is_some() {
        // The crash came with operations in flight, and the client restarted once.
        assert_eq!(restarted.load(Ordering::SeqCst), 1, "seed {seed}: restarts");
    }
    let history = events.take();
    if let Err(v) = check(&history, &HashMap::new()) {
        panic!(
            "seed {seed} (r = {r}, {INFLIGHT} in flight per client, client {crash_client:?} crashed after {crash_after} verbs, memory node failure {node_failure:?}): {v}"
        );
    }
}

/// The loops of one client (run on one thread): the client they share, and the restart
/// after a crash, which waits until every loop still running has seen the crash.
struct Crew {
    /// (`None` only while it restarts.)
    client: std::cell::RefCell<Option<dmkit_fusee::Client>>,
    active: std::cell::Cell<usize>,
    waiting: std::cell::Cell<usize>,
    restarts: std::cell::Cell<u32>,
}

impl Crew {
    fn new(client: dmkit_fusee::Client) -> Self {
        Self {
            client: std::cell::RefCell::new(Some(client)),
            active: std::cell::Cell::new(INFLIGHT as usize),
            waiting: std::cell::Cell::new(0),
            restarts: std::cell::Cell::new(0),
        }
    }

    fn client(&self) -> dmkit_fusee::Client {
        self.client
            .borrow()
            .clone()
            .expect("a client (restarts finish before loops go on)")
    }

    /// A loop's operation failed with the crash: the last loop to see it restarts the
    /// client, the others wait for that.
    async fn crashed(&self, recover: impl FnOnce() -> dmkit_fusee::Client) {
        let seen = self.restarts.get();
        self.waiting.set(self.waiting.get() + 1);
        if self.waiting.get() == self.active.get() {
            self.restart(recover);
            return;
        }
        while self.restarts.get() == seen {
            dmkit_verbs::sleep(Duration::from_millis(1)).await;
        }
    }

    /// A loop ran all its operations: if the others are all waiting on a crash, restart.
    fn finished(&self, recover: impl FnOnce() -> dmkit_fusee::Client) {
        self.active.set(self.active.get() - 1);
        if self.waiting.get() > 0 && self.waiting.get() == self.active.get() {
            self.restart(recover);
        }
    }

    fn restart(&self, recover: impl FnOnce() -> dmkit_fusee::Client) {
        // The crashed client is gone (its background work with it) before it restarts.
        if let Some(old) = self.client.borrow_mut().take() {
            let _ = old.flush();
        }
        let fresh = recover();
        *self.client.borrow_mut() = Some(fresh);
        self.waiting.set(0);
        self.restarts.set(self.restarts.get() + 1);
    }
}

/// In-flight seeds with a client crash that failed once: 1200334 (r = 2: two DELETEs of one
/// value in flight in one client, both cut short by a failover, both claimed the round as
/// "this client" and both reported Deleted — claims are per attempt now; it failed one run
/// in five), and the older rare ones (7, 700597, 714033, 742321, 50317, 606878, 507971).
#[test]
fn inflight_seeds_that_once_failed_stay_linearizable() {
    for _ in 0..20 {
        run_inflight_seed_with(1_200_334, true);
    }
    for seed in [7, 700_597, 714_033, 742_321, 50_317, 606_878, 507_971] {
        run_inflight_seed_with(seed, true);
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
