//! FUSEE histories under the `sim` backend's deterministic scheduler
//! (`dmkit_verbs::sim::sched`): three client threads on a few keys, random
//! INSERT/UPDATE/upsert/DELETE/SEARCH, r = 1..3, work requests deferred and one client
//! crashed at a verb and recovered, a memory node failed over and refilled — everything
//! drawn from the seed, including the
//! interleaving of the threads, verb by verb. A history is therefore a pure function of its
//! seed: it is checked for linearizability, and a seed run twice must give the identical
//! history and the identical verb trace.
//!
//! - `DMKIT_DET_SEEDS=N` (default 200) and `DMKIT_DET_FIRST_SEED=F` (default 1) pick the
//!   seeds; `DMKIT_DET_SEED=S` runs seed S alone.
//! - Every failure names its seed and the command that replays it exactly:
//!   `DMKIT_DET_SEED=S cargo test -p dmkit-tests --test fusee_deterministic`;
//!   with `DMKIT_DET_TRACE=1` it also prints every thread's operations and the whole trace.
//! - `DMKIT_DET_KEEP_GOING=1` runs every seed and lists all failing ones at the end (long
//!   runs).
//!
//! - Memory-node failures: in a third of the r >= 2 seeds a fourth, registered thread — the
//!   master — makes a seeded number of membership queries, fails a memory node, fails it
//!   over, restarts it on its memory and refills it (`Master::fail_over`, `Master::rejoin`),
//!   while the clients go on (their membership polls run on their own threads in this mode,
//!   `ClientConfig::inline_jobs`). `DMKIT_DET_NO_NODE_FAILURE=1` leaves them out. Those seeds
//!   take the same steps every run, but their membership records carry the cluster's random
//!   uuid and first rkeys, so the exact-replay test uses seeds without them.
//! - Stragglers: a quarter of the seeds make deferrals rare and long instead (probability
//!   0.5–3 %, 100–600 steps): one work request — one backup CAS of a SNAPSHOT round, say —
//!   then stays behind while another client runs several whole operations on the same key,
//!   the shape of the SNAPSHOT A-B-A stall in RELIABILITY.md. `DMKIT_DET_STRAGGLERS=1` gives
//!   every seed stragglers (a seed then replays with the variable set).

use std::collections::HashMap;
use std::sync::Arc;

use dmkit_fusee::{Client, ClientConfig, LocalCluster, LocalConfig};
use dmkit_tests::linearizability::{Call, Event, Ret, apply_fusee, check};
use dmkit_verbs::sim::{DetConfig, DetScheduler, Trace};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const KEYS: usize = 3;
const THREADS: usize = 3;
const OPS: usize = 20;

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|s| s.parse().ok())
}

/// The seeds to run: `DMKIT_DET_SEED`, or `DMKIT_DET_SEEDS` from `DMKIT_DET_FIRST_SEED`.
fn seeds(default_count: u64) -> Vec<u64> {
    if let Some(s) = env_u64("DMKIT_DET_SEED") {
        return vec![s];
    }
    let first = env_u64("DMKIT_DET_FIRST_SEED").unwrap_or(1);
    let n = env_u64("DMKIT_DET_SEEDS").unwrap_or(default_count);
    (first..first + n).collect()
}

fn replay(seed: u64) -> String {
    let stragglers = if stragglers() {
        "DMKIT_DET_STRAGGLERS=1 "
    } else {
        ""
    };
    format!(
        "{stragglers}DMKIT_DET_SEED={seed} cargo test -p dmkit-tests --test fusee_deterministic"
    )
}

/// Whether deferrals are rare and long (`DMKIT_DET_STRAGGLERS`).
fn stragglers() -> bool {
    std::env::var("DMKIT_DET_STRAGGLERS").is_ok()
}

/// What a seed fixes besides the interleaving.
#[derive(Debug, Clone, Copy)]
struct Plan {
    r: usize,
    /// (thread, verbs before the crash).
    crash: Option<(usize, u64)>,
    /// Probability and bound of deferred work requests.
    defer: Option<(f64, u64)>,
    /// (memory node, membership queries the master's thread makes before it fails): the
    /// node fails there, the master fails it over, restarts it on its memory and refills it
    /// — all from a scheduled thread of its own (r >= 2, a third of the seeds).
    node_failure: Option<(u16, u64)>,
}

impl Plan {
    fn of(seed: u64) -> Plan {
        Self::with(seed, stragglers())
    }

    /// The plan of `seed`, every deferral a straggler's if `all_stragglers`.
    fn with(seed: u64, all_stragglers: bool) -> Plan {
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0xF05E);
        Plan {
            r: rng.random_range(1..=3),
            crash: rng
                .random_bool(0.75)
                .then(|| (rng.random_range(0..THREADS), rng.random_range(5..150))),
            defer: rng
                .random_bool(0.5)
                .then(|| (rng.random_range(0.05..0.3), rng.random_range(2..40))),
            node_failure: None,
        }
        .with_node_failure(&mut rng)
        .with_stragglers(seed, all_stragglers)
    }

    /// A quarter of the seeds (every seed with `DMKIT_DET_STRAGGLERS`) defer rarely and long
    /// instead: drawn from a stream of their own, so the rest of the plan is the seed's usual
    /// one.
    fn with_stragglers(mut self, seed: u64, all: bool) -> Plan {
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x57A6);
        let defer = (rng.random_range(0.005..0.03), rng.random_range(100..600));
        if all || rng.random_bool(0.25) {
            self.defer = Some(defer);
        }
        self
    }

    fn with_node_failure(mut self, rng: &mut ChaCha8Rng) -> Plan {
        let fail = rng.random_bool(1.0 / 3.0);
        let (node, queries) = (rng.random_range(0..3u16), rng.random_range(1..200u64));
        if fail && self.r >= 2 && std::env::var("DMKIT_DET_NO_NODE_FAILURE").is_err() {
            self.node_failure = Some((node, queries));
        }
        self
    }
}

struct Run {
    plan: Plan,
    history: Vec<Event>,
    /// Per thread, its operations in order.
    logs: Vec<ThreadLog>,
    trace: Trace,
    /// Operations that completed, and that never returned (crashed).
    acked: usize,
    crashed: usize,
    recoveries: usize,
}

fn client_cfg(id: u64) -> ClientConfig {
    ClientConfig {
        // Background work (cleanup, prefetch, reclaim) on the caller's thread, so every
        // verb comes from a scheduled thread; reclaim often, so it is in the histories.
        inline_jobs: true,
        reclaim_every: 16,
        ..ClientConfig::new(id)
    }
}

/// What thread `t` recorded: its events and how many times it recovered.
type ThreadLog = (Vec<Event>, usize);

fn run_seed(seed: u64) -> Run {
    run_plan(seed, Plan::of(seed))
}

fn run_plan(seed: u64, plan: Plan) -> Run {
    let mut cfg = LocalConfig::new(3, plan.r);
    cfg.pool_bytes = 8 << 20;
    cfg.block_size = 64 << 10;
    cfg.cluster.index_bytes = 256 << 10;
    let c = Arc::new(LocalCluster::start(cfg).unwrap());
    let master = plan.node_failure.map(|_| c.master().unwrap());
    let threads = THREADS + usize::from(master.is_some());
    let mut det = DetConfig::new(seed, threads);
    det.replay = replay(seed);
    if let Some((p, steps)) = plan.defer {
        det.faults.defer_probability = p;
        det.faults.max_defer_steps = steps;
    }
    let sched = DetScheduler::new(det);
    c.sim.set_scheduler(Some(sched.clone()));
    let logs: Vec<ThreadLog> = std::thread::scope(|s| {
        if let (Some((node, queries)), Some(master)) = (plan.node_failure, &master) {
            let (c, sched) = (c.clone(), &sched);
            s.spawn(move || {
                let _me = sched.register(THREADS);
                let node = dmkit_verbs::NodeId(node);
                // Scheduled verbs until the failure point: it lands at a seeded place.
                for _ in 0..queries {
                    let _ = dmkit_fusee::membership::query(master.endpoint(), node);
                }
                c.sim.fail_node(node);
                let fail = |what: &str, e: dmkit_fusee::Error| -> ! {
                    panic!(
                        "seed {seed}: {what} of memory node {node} failed: {e}\nreplay: {}",
                        replay(seed)
                    )
                };
                master
                    .fail_over(&[node])
                    .unwrap_or_else(|e| fail("failover", e));
                c.restart_node(node).unwrap_or_else(|e| fail("restart", e));
                master.rejoin(node).unwrap_or_else(|e| fail("rejoin", e));
            });
        }
        let hs: Vec<_> = (0..THREADS)
            .map(|t| {
                let (c, sched) = (c.clone(), &sched);
                s.spawn(move || {
                    let _me = sched.register(t);
                    let id = 10 + t as u64;
                    let mut trng = ChaCha8Rng::seed_from_u64(seed * 1000 + t as u64);
                    let mut client = c.client_with(client_cfg(id)).unwrap();
                    if let Some((ct, after)) = plan.crash {
                        if ct == t {
                            c.sim.crash_client_after(id, after);
                        }
                    }
                    let mut events = Vec::new();
                    let mut recoveries = 0;
                    for i in 0..OPS {
                        let key = format!("k{}", trng.random_range(0..KEYS)).into_bytes();
                        let val = format!("t{t}-{i}").into_bytes();
                        let call = match trng.random_range(0..5) {
                            0 => Call::Get,
                            1 => Call::Put(val),
                            2 => Call::Insert(val),
                            3 => Call::Update(val),
                            _ => Call::Delete,
                        };
                        // The clock is the scheduler's: the same in every run of the seed.
                        let start = sched.tick();
                        let r = apply_fusee(&client, &key, &call);
                        let end = sched.tick();
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
                                    c.sim.client_crashed(id),
                                    "seed {seed} ({plan:?}): thread {t} op {i} failed without \
                                     a crash: {e}\nreplay: {}{}",
                                    replay(seed),
                                    if std::env::var("DMKIT_DET_TRACE").is_ok() {
                                        format!("\nall grants:\n{}", sched.trace().tail(usize::MAX))
                                    } else {
                                        String::new()
                                    }
                                );
                                events.push(Event {
                                    key,
                                    call,
                                    ret: None,
                                    start,
                                    end: u64::MAX,
                                });
                                drop(client);
                                c.sim.restart_client(id);
                                let cc = c.clone();
                                let mut cfg = client_cfg(id);
                                cfg.reconnect = Some(c.reconnect(id));
                                client = Client::recover(move || cc.endpoint(id), c.nodes(), cfg)
                                    .unwrap_or_else(|e| {
                                        panic!(
                                            "seed {seed}: recovery of client {id} failed: {e}\n\
                                         replay: {}",
                                            replay(seed)
                                        )
                                    })
                                    .0;
                                recoveries += 1;
                            }
                        }
                    }
                    client.flush().unwrap();
                    (events, recoveries)
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect()
    });
    c.sim.set_scheduler(None);
    let mut history: Vec<Event> = logs.iter().flat_map(|(e, _)| e.clone()).collect();
    history.sort_by_key(|e| e.start);
    let crashed = history.iter().filter(|e| e.ret.is_none()).count();
    Run {
        plan,
        acked: history.len() - crashed,
        crashed,
        recoveries: logs.iter().map(|(_, r)| r).sum(),
        history,
        logs,
        trace: sched.trace(),
    }
}

/// One line per event, for comparing two runs' histories and for failure messages.
fn render(history: &[Event]) -> Vec<String> {
    let s = |v: &[u8]| String::from_utf8_lossy(v).into_owned();
    history
        .iter()
        .map(|e| {
            let call = e.call.to_string();
            let ret = match &e.ret {
                None => "(crashed)".to_string(),
                Some(Ret::Value(v)) => format!("{:?}", v.as_deref().map(s)),
                Some(r) => format!("{r:?}"),
            };
            format!("[{}, {}] {} {call} -> {ret}", e.start, e.end, s(&e.key))
        })
        .collect()
}

fn check_run(seed: u64, run: &Run) {
    if let Err(v) = check(&run.history, &HashMap::new()) {
        let full = std::env::var("DMKIT_DET_TRACE").is_ok();
        let mut threads = String::new();
        if full {
            for (t, (events, _)) in run.logs.iter().enumerate() {
                for l in render(events) {
                    threads += &format!("  t{t}: {l}\n");
                }
            }
        }
        panic!(
            "seed {seed} ({:?}) is not linearizable: {v}\n{threads}{} grants of the \
             scheduler:\n{}replay exactly with: {}{}",
            run.plan,
            if full { "all" } else { "last" },
            run.trace.tail(if full { usize::MAX } else { 30 }),
            replay(seed),
            if full {
                ""
            } else {
                " (add DMKIT_DET_TRACE=1 for the whole trace)"
            }
        );
    }
}

#[test]
fn fusee_histories_under_the_deterministic_scheduler_are_linearizable() {
    let t0 = std::time::Instant::now();
    let (mut ops, mut crashed, mut recoveries, mut verbs) = (0, 0, 0, 0);
    let seeds = seeds(200);
    let keep_going = std::env::var("DMKIT_DET_KEEP_GOING").is_ok();
    let mut failed = Vec::new();
    for &seed in &seeds {
        let one = || {
            let run = run_seed(seed);
            check_run(seed, &run);
            run
        };
        let run = if keep_going {
            match std::panic::catch_unwind(one) {
                Ok(run) => run,
                Err(_) => {
                    failed.push(seed);
                    continue;
                }
            }
        } else {
            one()
        };
        ops += run.acked;
        crashed += run.crashed;
        recoveries += run.recoveries;
        verbs += run.trace.verbs();
    }
    assert!(
        failed.is_empty(),
        "{} of {} seeds failed: {failed:?} (replay one with DMKIT_DET_SEED=<seed> cargo test \
         -p dmkit-tests --test fusee_deterministic)",
        failed.len(),
        seeds.len()
    );
    eprintln!(
        "{} deterministic FUSEE histories linearizable (seeds {:?}..={:?}): {ops} operations \
         acknowledged, {crashed} cut by a crash, {recoveries} recoveries, {verbs} verbs \
         scheduled, in {:.1?}",
        seeds.len(),
        seeds.first(),
        seeds.last(),
        t0.elapsed()
    );
    assert!(
        seeds.len() == 1 || recoveries > 0,
        "no seed crashed and recovered a client"
    );
}

/// Seeds (default plans) that once failed, each kept after its fix: 822 — a DELETE that lost
/// the primary swap to another DELETE of the same value, then had its take-back cut short by
/// a node failure, was settled as done (both DELETEs reported the deletion); 4017 — a
/// DELETE's take-back (reclaimed flag) was written to one data replica only, a failover lost
/// it, and the client's recovery resumed the DELETE long after it had answered NotFound
/// (an acknowledged put lost); 1922 — two DELETEs of one insert both reported, around a
/// failover (found in the same sweep, gone with the two fixes); 6540 — a block mirror
/// request reached a node just failed over and restarted on its memory, whose block table
/// still held the block for another owner, and the operation failed with "cannot mirror
/// block" instead of retrying in the next membership; 1000740 — a SEARCH's object READ was
/// held back while the key was deleted, its writer crashed and recovered, and the freed
/// address was handed to the same key's next INSERT: the READ returned that INSERT's object
/// before its swap, and the SEARCH answered a value that was not yet (and might never be)
/// the key's (an object whose writer has not finished is now trusted only once its slot
/// word is read again unchanged: `KeyVerifier::unsettled`).
const REGRESSION_SEEDS: [u64; 5] = [822, 1922, 4017, 6540, 1000740];

#[test]
fn seeds_that_once_failed_stay_linearizable() {
    if stragglers() || env_u64("DMKIT_DET_SEED").is_some() {
        return; // (their plans are the default ones; a single seed runs in the test above)
    }
    for seed in REGRESSION_SEEDS {
        let run = run_seed(seed);
        check_run(seed, &run);
    }
}

/// Seeds that failed with every deferral a straggler's (`DMKIT_DET_STRAGGLERS=1`): stalls
/// (858, 1363, 1580, 1624), a live object reclaimed by recovery past a failover (6194), and a
/// history not linearizable on k2 around a failover of node 0 (5103: open since session 4,
/// found passing in session 11 without having been traced — one of the later recovery and
/// failover fixes covers it, or its interleaving moved).
const STRAGGLER_REGRESSION_SEEDS: [u64; 6] = [858, 1363, 1580, 1624, 5103, 6194];

#[test]
fn straggler_seeds_that_once_failed_stay_linearizable() {
    if env_u64("DMKIT_DET_SEED").is_some() {
        return;
    }
    for seed in STRAGGLER_REGRESSION_SEEDS {
        let run = run_plan(seed, Plan::with(seed, true));
        check_run(seed, &run);
    }
}

#[test]
fn a_seed_replays_the_identical_history_and_verb_trace() {
    // With and without a crash, with and without deferrals (see `Plan::of`), unless a
    // single seed is asked for. Seeds that fail a memory node are left out: their runs take
    // the same steps, but the membership records carry the cluster's uuid and the rkeys of
    // the first registration, which are random per run, so the traced RPC bytes differ.
    let single = env_u64("DMKIT_DET_SEED");
    let seeds = match single {
        Some(s) if Plan::of(s).node_failure.is_some() => {
            eprintln!(
                "seed {s} fails a memory node: its runs take the same steps, but their traced \
                 RPC bytes carry a random cluster uuid and rkeys, so the exact-replay check \
                 leaves it out (the linearizability test replays it step by step)"
            );
            return;
        }
        Some(s) => vec![s],
        None => (1..)
            .filter(|s| Plan::of(*s).node_failure.is_none())
            .take(5)
            .collect(),
    };
    let mut crashes = 0;
    for seed in seeds {
        let a = run_seed(seed);
        let b = run_seed(seed);
        crashes += a.crashed;
        let (ha, hb) = (render(&a.history), render(&b.history));
        if let Some(i) = (0..ha.len().max(hb.len())).find(|&i| ha.get(i) != hb.get(i)) {
            panic!(
                "seed {seed} ({:?}): the histories differ at event {i}: {:?} vs {:?}\n\
                 replay with: {}",
                a.plan,
                ha.get(i),
                hb.get(i),
                replay(seed)
            );
        }
        if a.trace != b.trace {
            let (ea, eb) = (&a.trace.entries, &b.trace.entries);
            let i = (0..ea.len().max(eb.len()))
                .find(|&i| ea.get(i) != eb.get(i))
                .unwrap_or(0);
            panic!(
                "seed {seed} ({:?}): the verb traces differ (hashes {:#x} and {:#x}) at grant \
                 {i}:\n  {}\n  {}\nreplay with: {}",
                a.plan,
                a.trace.hash(),
                b.trace.hash(),
                ea.get(i).map(|e| e.to_string()).unwrap_or_default(),
                eb.get(i).map(|e| e.to_string()).unwrap_or_default(),
                replay(seed)
            );
        }
        assert!(
            a.trace.verbs() > OPS * THREADS,
            "seed {seed}: too few verbs"
        );
    }
    assert!(
        single.is_some() || crashes > 0,
        "none of the replayed seeds crashed a client"
    );
}
