//! The `sim` backend's deterministic mode on raw verbs: threads racing with CAS and FAA on
//! two memory nodes, under a seeded scheduler with seeded deferrals, drops and a node
//! failure at a seeded step. The same seed replays the same interleaving — the same trace,
//! the same results in every thread — and the failed node is reported as `NodeFailed` from
//! exactly its failure step on.
//!
//! A failure prints its seed; `DMKIT_DET_SEED=N cargo test -p dmkit-verbs --test
//! sim_deterministic` replays that one seed.

use std::sync::Arc;

use dmkit_verbs::sim::{
    DetConfig, DetScheduler, Outcome, SimCluster, SimConfig, Trace, TracedVerb, Work,
};
use dmkit_verbs::{Access, DramBacking, Error, MemoryNode, NodeId, RegionDesc};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const THREADS: usize = 4;
const ROUNDS: usize = 12;

/// What one thread saw: per verb, its result (old value) or the error's kind.
type Seen = Vec<Result<u64, String>>;

fn seeds() -> Vec<u64> {
    match std::env::var("DMKIT_DET_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
    {
        Some(s) => vec![s],
        None => (1..=12).collect(),
    }
}

fn replay(seed: u64) -> String {
    format!("DMKIT_DET_SEED={seed} cargo test -p dmkit-verbs --test sim_deterministic")
}

struct Run {
    trace: Trace,
    seen: Vec<Seen>,
    /// The counters' final values on node 0 and node 1 (read from the nodes' memory).
    counters: [u64; 2],
    /// The step node 1 failed at, if the run got that far.
    failed_at: Option<u64>,
}

fn cluster() -> (SimCluster, Vec<(Arc<MemoryNode>, RegionDesc)>) {
    let c = SimCluster::new(SimConfig::default());
    let nodes = (0..2)
        .map(|i| {
            let n = Arc::new(MemoryNode::new(NodeId(i)));
            let r = n
                .register(Arc::new(DramBacking::new(1 << 12)), Access::ALL, None)
                .unwrap();
            c.add_node(n.clone());
            (n, r)
        })
        .collect();
    (c, nodes)
}

/// Each thread, per round: FAA node 0's counter, take a CAS spin lock on node 0, FAA node
/// 1's counter under it, release. Faults: 30% deferrals of up to 8 steps, 5% drops, and
/// node 1 fails at a step drawn from the seed.
fn run(seed: u64) -> Run {
    let (c, nodes) = cluster();
    let (r0, r1) = (nodes[0].1, nodes[1].1);
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut cfg = DetConfig::new(seed, THREADS);
    cfg.replay = replay(seed);
    cfg.faults.defer_probability = 0.3;
    cfg.faults.max_defer_steps = 8;
    cfg.faults.drop_probability = 0.05;
    cfg.faults.node_failures = vec![(rng.random_range(20..200u64), NodeId(1))];
    let sched = DetScheduler::new(cfg);
    c.set_scheduler(Some(sched.clone()));
    let seen: Vec<Seen> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..THREADS)
            .map(|t| {
                let (c, sched) = (&c, &sched);
                s.spawn(move || {
                    let _me = sched.register(t);
                    let ep = c.endpoint(t as u64 + 1).unwrap();
                    let mut seen = Seen::new();
                    let mut note = |r: dmkit_verbs::Result<u64>| {
                        let out = r.map_err(|e| match e {
                            Error::NodeFailed { node } => format!("node {node} failed"),
                            Error::Dropped { node } => format!("dropped on {node}"),
                            e => panic!("seed {seed}: unexpected {e}; replay: {}", replay(seed)),
                        });
                        seen.push(out.clone());
                        out
                    };
                    let me = t as u64 + 1;
                    for _ in 0..ROUNDS {
                        let _ = note(ep.faa("t", r0.at(0), 1));
                        // A spin lock on node 0. A dropped CAS may have executed: finding
                        // ourselves as the owner means we hold it; a release that finds
                        // another owner was done by an earlier, dropped attempt.
                        loop {
                            match note(ep.cas("t", r0.at(8), 0, me)) {
                                Ok(0) => break,
                                Ok(o) if o == me => break,
                                _ => {}
                            }
                        }
                        let _ = note(ep.faa("t", r1.at(0), 1));
                        while note(ep.cas("t", r0.at(8), me, 0)).is_err() {}
                    }
                    seen
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let word = |i: usize| {
        let (n, r) = &nodes[i];
        n.memory(r.rkey).unwrap().load_u64(0).unwrap()
    };
    let trace = sched.trace();
    let failed_at = trace
        .entries
        .iter()
        .find(|e| e.work == Work::NodeFailure(NodeId(1)))
        .map(|e| e.step);
    Run {
        counters: [word(0), word(1)],
        trace,
        seen,
        failed_at,
    }
}

fn is_drop(o: &Outcome) -> bool {
    matches!(o, Outcome::Failed(m) if m.starts_with("dropped"))
}

#[test]
fn a_seed_replays_exactly_with_deferrals_drops_and_a_node_failure() {
    let (mut deferred, mut dropped, mut failures) = (0, 0, 0);
    for seed in seeds() {
        let a = run(seed);
        let b = run(seed);
        let ctx = format!("seed {seed} (replay: {})", replay(seed));
        assert_eq!(a.trace.hash(), b.trace.hash(), "{ctx}: traces differ");
        assert_eq!(a.trace, b.trace, "{ctx}");
        assert_eq!(a.seen, b.seen, "{ctx}: threads saw different results");
        assert_eq!(a.counters, b.counters, "{ctx}");
        let e = &a.trace.entries;
        deferred += e
            .iter()
            .filter(|e| matches!(e.outcome, Outcome::Deferred(_)))
            .count();
        dropped += e.iter().filter(|e| is_drop(&e.outcome)).count();
        failures += usize::from(a.failed_at.is_some());
    }
    // Every kind of fault was injected somewhere.
    assert!(
        deferred > 0 && dropped > 0 && failures > 0,
        "deferred {deferred}, dropped {dropped}, node failures {failures}"
    );
}

#[test]
fn a_node_failed_at_a_seeded_step_is_reported_as_node_failed_from_that_step_on() {
    let mut checked = 0;
    for seed in seeds() {
        let ctx = format!("seed {seed} (replay: {})", replay(seed));
        let r = run(seed);
        let Some(at) = r.failed_at else {
            // The run ended before the failure step.
            continue;
        };
        checked += 1;
        for e in &r.trace.entries {
            let Work::Batch {
                node: NodeId(1), ..
            } = e.work
            else {
                continue;
            };
            match &e.outcome {
                Outcome::Done(_) => {
                    assert!(
                        e.step < at,
                        "{ctx}: node 1 answered at step {} >= {at}",
                        e.step
                    );
                }
                o if is_drop(o) => {}
                Outcome::Failed(m) => {
                    assert!(e.step >= at, "{ctx}: step {}: {m}", e.step);
                    assert_eq!(m, "node 1 failed", "{ctx}");
                }
                Outcome::Deferred(_) => {}
                o => panic!("{ctx}: {o:?}"),
            }
        }
        // The threads saw it too, as `NodeFailed`.
        let failed_seen = r
            .seen
            .iter()
            .flatten()
            .filter(|x| x.as_ref().err().is_some_and(|m| m == "node 1 failed"))
            .count();
        assert!(failed_seen > 0, "{ctx}: nobody saw node 1 fail");
        // Each counter holds every FAA that was answered, and at most the dropped ones more
        // (a drop after execution): nothing executed on node 1 after it failed.
        for (i, counter) in r.counters.iter().enumerate() {
            let faas = |want: fn(&Outcome) -> bool| {
                r.trace
                    .entries
                    .iter()
                    .filter(|e| match &e.work {
                        Work::Batch { node, ops, .. } => {
                            node.0 as usize == i && matches!(ops[0].verb, TracedVerb::Faa { .. })
                        }
                        _ => false,
                    })
                    .filter(|e| want(&e.outcome))
                    .count() as u64
            };
            let done = faas(|o| matches!(o, Outcome::Done(_)));
            let dropped = faas(is_drop);
            assert!(
                (done..=done + dropped).contains(counter),
                "{ctx}: node {i}'s counter is {counter}, {done} FAAs answered, {dropped} dropped"
            );
        }
    }
    assert!(checked > 0, "no run reached its node failure");
}
