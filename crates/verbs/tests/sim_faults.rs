//! Promises of the `sim` backend beyond the shared conformance suite: its fault injection
//! (client crash after N verbs, drops before/after execution, seeded random drops, delays that
//! keep per-connection order, node failure and recovery) and its virtual-time latency model.
//! Also the per-operation accounting helper `TagStats::since`.

use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use dmkit_verbs::conformance::RecordingNvm;
use dmkit_verbs::sim::{DropPoint, LatencyModel, SimCluster, SimConfig};
use dmkit_verbs::{
    Access, Backing, DramBacking, Endpoint, Error, Media, MemoryNode, NodeId, Peer, RegionDesc,
    TagStats,
};

const N0: NodeId = NodeId(0);

fn cluster(cfg: SimConfig) -> (SimCluster, RegionDesc) {
    let c = SimCluster::new(cfg);
    let node = Arc::new(MemoryNode::new(N0));
    let r = node
        .register(Arc::new(DramBacking::new(1 << 16)), Access::ALL, None)
        .unwrap();
    c.add_node(node);
    (c, r)
}

fn sim() -> (SimCluster, RegionDesc) {
    cluster(SimConfig {
        timeout: Duration::from_secs(2),
        ..SimConfig::default()
    })
}

fn word(ep: &Endpoint, r: &RegionDesc, off: u64) -> u64 {
    u64::from_le_bytes(ep.read("peek", r.at(off), 8).unwrap().try_into().unwrap())
}

// ---------------------------------------------------------------------------------------------
// Client crash.

#[test]
fn crash_after_n_cuts_a_batch_after_exactly_n_verbs_for_every_n() {
    const LEN: u64 = 6;
    for n in 0..=LEN {
        let (c, r) = sim();
        let ep = c.endpoint(1).unwrap();
        let other = c.endpoint(2).unwrap();
        c.crash_client_after(1, n);
        // Writes and FAAs alternate; verb i leaves i + 1 in word i.
        let mut b = ep.batch(N0);
        for i in 0..LEN {
            if i % 2 == 0 {
                b.write(r.at(i * 8), &(i + 1).to_le_bytes());
            } else {
                b.faa(r.at(i * 8), i + 1);
            }
        }
        let res = ep.execute("t", b);
        if n < LEN {
            assert!(
                matches!(res, Err(Error::ClientCrashed { client: 1 })),
                "n={n}: {res:?}"
            );
            assert!(c.client_crashed(1), "n={n}");
        } else {
            // The budget covers the whole batch: the crash hits the next verb.
            assert!(res.is_ok(), "n={n}: {res:?}");
        }
        for i in 0..LEN {
            let want = if i < n { i + 1 } else { 0 };
            assert_eq!(word(&other, &r, i * 8), want, "n={n}, verb {i}");
        }
        assert_eq!(c.verbs_posted(1), n, "n={n}");
        // Everything later fails and executes nothing, on any verb or RPC.
        assert!(matches!(
            ep.write("t", r.at(512), &[9; 8]),
            Err(Error::ClientCrashed { client: 1 })
        ));
        assert!(matches!(
            ep.faa("t", r.at(512), 1),
            Err(Error::ClientCrashed { .. })
        ));
        assert!(matches!(
            ep.read("t", r.at(0), 8),
            Err(Error::ClientCrashed { .. })
        ));
        assert!(matches!(
            ep.rpc("t", N0, b"x"),
            Err(Error::ClientCrashed { .. })
        ));
        assert!(c.client_crashed(1));
        assert_eq!(word(&other, &r, 512), 0, "n={n}: a crashed client wrote");
        assert_eq!(c.verbs_posted(1), n, "n={n}");
        // Other clients are unaffected.
        assert_eq!(other.faa("t", r.at(1024), 1).unwrap(), 0);
        assert!(!c.client_crashed(2));
        // A restart lets the client run again, with its connections.
        c.restart_client(1);
        assert!(!c.client_crashed(1));
        ep.write("t", r.at(512), &[9; 8]).unwrap();
        assert_eq!(ep.read("t", r.at(512), 8).unwrap(), vec![9; 8]);
    }
}

#[test]
fn a_crash_budget_spans_batches_and_nodes() {
    let (c, regions) = SimCluster::with_dram_nodes(2, 4096).unwrap();
    let ep = c.endpoint(1).unwrap();
    let observer = c.endpoint(2).unwrap();
    c.crash_client_after(1, 3);
    ep.faa("t", regions[0].at(0), 1).unwrap();
    ep.faa("t", regions[1].at(0), 1).unwrap();
    let mut b = ep.batch(NodeId(0));
    b.faa(regions[0].at(0), 1);
    b.faa(regions[0].at(0), 1);
    assert!(matches!(
        ep.execute("t", b),
        Err(Error::ClientCrashed { .. })
    ));
    assert_eq!(word(&observer, &regions[0], 0), 2);
    assert_eq!(word(&observer, &regions[1], 0), 1);
    assert!(matches!(
        ep.faa("t", regions[1].at(0), 1),
        Err(Error::ClientCrashed { .. })
    ));
}

#[test]
fn an_empty_batch_completes_and_is_not_a_crash() {
    let (c, _) = sim();
    let ep = c.endpoint(1).unwrap();
    let r = ep.execute("t", ep.batch(N0));
    assert!(r.is_ok(), "{r:?}");
    assert!(!c.client_crashed(1));
    // With a crash planned but not reached, an empty batch does not spend or trip it.
    c.crash_client_after(1, 1);
    assert!(ep.execute("t", ep.batch(N0)).is_ok());
    assert!(!c.client_crashed(1));
}

// ---------------------------------------------------------------------------------------------
// Drops.

#[test]
fn a_drop_before_execute_leaves_memory_unchanged() {
    let (c, r) = sim();
    let ep = c.endpoint(1).unwrap();
    c.drop_next(Some(N0), 2, DropPoint::BeforeExecute);
    for _ in 0..2 {
        let e = ep.write("t", r.at(0), &[7; 8]).unwrap_err();
        assert!(matches!(e, Error::Dropped { node: N0 }), "{e}");
        assert!(!e.is_node_failure());
    }
    // The rule is used up: the next one goes through.
    assert_eq!(ep.read("t", r.at(0), 8).unwrap(), vec![0; 8]);
    ep.write("t", r.at(8), &[1; 8]).unwrap();
    assert_eq!(ep.read("t", r.at(8), 8).unwrap(), vec![1; 8]);
}

#[test]
fn a_drop_after_execute_changes_memory_but_loses_the_completion() {
    let (c, r) = sim();
    let ep = c.endpoint(1).unwrap();
    c.drop_next(Some(N0), 1, DropPoint::AfterExecute);
    let e = ep.write("t", r.at(0), &[7; 8]).unwrap_err();
    assert!(matches!(e, Error::Dropped { node: N0 }), "{e}");
    assert_eq!(ep.read("t", r.at(0), 8).unwrap(), vec![7; 8]);
    // An atomic likewise: executed once, its old value lost.
    c.drop_next(Some(N0), 1, DropPoint::AfterExecute);
    assert!(matches!(
        ep.faa("t", r.at(8), 5),
        Err(Error::Dropped { .. })
    ));
    assert_eq!(word(&ep, &r, 8), 5);
}

#[test]
fn a_drop_rule_for_another_node_does_not_touch_this_one() {
    let (c, r) = sim();
    let ep = c.endpoint(1).unwrap();
    c.drop_next(Some(NodeId(9)), 1, DropPoint::BeforeExecute);
    ep.write("t", r.at(0), &[3; 8]).unwrap();
    assert_eq!(ep.read("t", r.at(0), 8).unwrap(), vec![3; 8]);
}

/// The outcome of each of 64 FAAs under random drops with `seed`, and the final counter.
fn random_drop_run(seed: u64, point: DropPoint) -> (Vec<bool>, u64) {
    let (c, r) = cluster(SimConfig {
        seed,
        ..SimConfig::default()
    });
    let ep = c.endpoint(1).unwrap();
    c.drop_randomly(Some(N0), 0.5, point);
    let outcomes: Vec<bool> = (0..64)
        .map(|_| match ep.faa("t", r.at(0), 1) {
            Ok(_) => true,
            Err(Error::Dropped { .. }) => false,
            Err(e) => panic!("{e}"),
        })
        .collect();
    c.clear_faults();
    (outcomes, word(&ep, &r, 0))
}

#[test]
fn random_drops_with_the_same_seed_repeat_exactly() {
    let (a, count_a) = random_drop_run(42, DropPoint::BeforeExecute);
    let (b, count_b) = random_drop_run(42, DropPoint::BeforeExecute);
    assert_eq!(a, b, "same seed, different drops");
    assert_eq!(count_a, count_b);
    let delivered = a.iter().filter(|ok| **ok).count() as u64;
    assert!(
        delivered > 0 && delivered < 64,
        "p=0.5 dropped {} of 64",
        64 - delivered
    );
    // Dropped before execution: only delivered ones counted.
    assert_eq!(count_a, delivered);
    // A different seed gives a different sequence.
    let (c, _) = random_drop_run(43, DropPoint::BeforeExecute);
    assert_ne!(a, c);
    // After execution: every FAA counted, delivered or not.
    let (d, count_d) = random_drop_run(42, DropPoint::AfterExecute);
    assert_eq!(d, a, "the drop decisions do not depend on the drop point");
    assert_eq!(count_d, 64);
}

// ---------------------------------------------------------------------------------------------
// Delays.

#[test]
fn a_delayed_batch_completes_after_the_delay_and_later_work_waits_behind_it() {
    let (c, r) = sim();
    let ep = c.endpoint(1).unwrap();
    let delay = Duration::from_millis(100);
    c.delay(Some(N0), delay, Some(1));
    let t = Instant::now();
    let mut first = ep.batch(N0);
    first.write(r.at(0), &1u64.to_le_bytes());
    let first = ep.post("t", first);
    assert!(t.elapsed() < delay / 2, "posting blocked");
    // The second batch is not delayed itself but must execute after the first.
    let mut second = ep.batch(N0);
    let seen = second.read(r.at(0), 8);
    second.write(r.at(0), &2u64.to_le_bytes());
    let second = ep.post("t", second);
    let done = ep.wait(second).unwrap();
    assert!(
        t.elapsed() >= delay,
        "second completed after {:?}",
        t.elapsed()
    );
    assert_eq!(
        done.read(seen),
        1u64.to_le_bytes(),
        "second ran before first"
    );
    ep.wait(first).unwrap();
    assert!(t.elapsed() >= delay);
    assert_eq!(word(&ep, &r, 0), 2);
}

#[test]
fn a_delay_on_one_connection_does_not_reorder_another() {
    let (c, r) = sim();
    let slow = c.endpoint(1).unwrap();
    let fast = c.endpoint(2).unwrap();
    c.delay(Some(N0), Duration::from_millis(200), Some(1));
    let t = Instant::now();
    let mut b = slow.batch(N0);
    b.write(r.at(0), &[1; 8]);
    let p = slow.post("t", b);
    // Another client's connection is not queued behind it.
    fast.write("t", r.at(8), &[2; 8]).unwrap();
    assert!(t.elapsed() < Duration::from_millis(100));
    slow.wait(p).unwrap();
    assert!(t.elapsed() >= Duration::from_millis(200));
}

/// NVM whose persist takes `stall`: a durable write executed on the sim timer holds it up.
#[derive(Debug)]
struct SlowPersist {
    mem: RecordingNvm,
    stall: Duration,
}

impl Backing for SlowPersist {
    fn as_ptr(&self) -> *mut u8 {
        self.mem.as_ptr()
    }
    fn len(&self) -> usize {
        self.mem.len()
    }
    fn media(&self) -> Media {
        Media::Nvm
    }
    fn persist(&self, offset: usize, len: usize) -> std::io::Result<()> {
        std::thread::sleep(self.stall);
        self.mem.persist(offset, len)
    }
}

#[test]
fn order_holds_even_when_delayed_work_runs_late() {
    let c = SimCluster::new(SimConfig::default());
    let node = Arc::new(MemoryNode::new(N0));
    let r = node
        .register(Arc::new(DramBacking::new(4096)), Access::ALL, None)
        .unwrap();
    let slow = node
        .register(
            Arc::new(SlowPersist {
                mem: RecordingNvm::new(4096),
                stall: Duration::from_millis(300),
            }),
            Access::ALL,
            None,
        )
        .unwrap();
    c.add_node(node);
    let a = c.endpoint(1).unwrap();
    let b = c.endpoint(2).unwrap();
    // Client A's delayed durable write keeps the sim's delay machinery busy for 300 ms...
    c.delay(Some(N0), Duration::from_millis(10), Some(1));
    let mut stall = a.batch(N0);
    stall.write_durable(slow.at(0), &[1; 8]);
    let stall = a.post("t", stall);
    // ...so B's delayed batch runs well after its due time. B's next batch must still wait.
    c.delay(Some(N0), Duration::from_millis(20), Some(1));
    let mut first = b.batch(N0);
    first.write(r.at(0), &1u64.to_le_bytes());
    let first = b.post("t", first);
    std::thread::sleep(Duration::from_millis(80));
    let mut second = b.batch(N0);
    let seen = second.read(r.at(0), 8);
    second.write(r.at(0), &2u64.to_le_bytes());
    let done = b.execute("t", second).unwrap();
    assert_eq!(
        done.read(seen),
        1u64.to_le_bytes(),
        "a later batch overtook a delayed one"
    );
    b.wait(first).unwrap();
    a.wait(stall).unwrap();
    assert_eq!(word(&b, &r, 0), 2);
}

// ---------------------------------------------------------------------------------------------
// Node failure.

#[test]
fn a_failed_node_reports_node_failed_and_recovers_with_its_memory() {
    let (c, r) = sim();
    c.node(N0)
        .unwrap()
        .set_rpc_handler(Arc::new(|_: &Peer, req: &[u8]| Ok(req.to_vec())));
    let ep = c.endpoint(1).unwrap();
    ep.write("t", r.at(0), b"durable?").unwrap();
    ep.faa("t", r.at(8), 41).unwrap();
    c.fail_node(N0);
    let conn = ep.connection(N0).unwrap();
    assert!(!conn.is_alive());
    for e in [
        ep.read("t", r.at(0), 8).unwrap_err(),
        ep.write("t", r.at(0), b"lost....").unwrap_err(),
        ep.faa("t", r.at(8), 1).unwrap_err(),
        ep.rpc("t", N0, b"ping").unwrap_err(),
        conn.refresh_regions().unwrap_err(),
    ] {
        assert!(matches!(e, Error::NodeFailed { node: N0 }), "{e}");
        assert!(e.is_node_failure());
        assert_eq!(e.node(), Some(N0));
    }
    // New clients cannot connect to it either.
    assert!(matches!(c.endpoint(2), Err(Error::Connect { .. })));
    c.recover_node(N0);
    assert!(conn.is_alive());
    assert_eq!(ep.read("t", r.at(0), 8).unwrap(), b"durable?");
    assert_eq!(word(&ep, &r, 8), 41);
    assert_eq!(ep.rpc("t", N0, b"ping").unwrap(), b"ping");
    let fresh = c.endpoint(2).unwrap();
    assert_eq!(fresh.read("t", r.at(0), 8).unwrap(), b"durable?");
}

#[test]
fn delayed_work_to_a_node_that_fails_meanwhile_fails_as_node_failure() {
    let (c, r) = sim();
    let ep = c.endpoint(1).unwrap();
    c.delay(Some(N0), Duration::from_millis(50), Some(1));
    let mut b = ep.batch(N0);
    b.write(r.at(0), &[5; 8]);
    let p = ep.post("t", b);
    c.fail_node(N0);
    let e = ep.wait(p).unwrap_err();
    assert!(e.is_node_failure(), "{e}");
    c.recover_node(N0);
    assert_eq!(ep.read("t", r.at(0), 8).unwrap(), vec![0; 8]);
}

// ---------------------------------------------------------------------------------------------
// The latency model.

fn modeled() -> SimConfig {
    SimConfig {
        latency: Some(LatencyModel::default()),
        ..SimConfig::default()
    }
}

/// A cluster with the latency model and one node holding a DRAM and an NVM region.
fn modeled_cluster() -> (SimCluster, RegionDesc, RegionDesc) {
    let c = SimCluster::new(modeled());
    let node = Arc::new(MemoryNode::new(N0));
    let dram = node
        .register(Arc::new(DramBacking::new(1 << 20)), Access::ALL, None)
        .unwrap();
    let nvm = node
        .register(Arc::new(RecordingNvm::new(1 << 20)), Access::ALL, None)
        .unwrap();
    c.add_node(node);
    (c, dram, nvm)
}

fn ns(d: Duration) -> f64 {
    d.as_nanos() as f64
}

/// Wire time of `bytes` on the model's link, in ns.
fn wire(m: &LatencyModel, bytes: u64) -> f64 {
    bytes as f64 * 8.0 / m.link_gbps
}

/// Time `bytes` occupy a medium with `share` of DRAM bandwidth, in ns.
fn occupancy(m: &LatencyModel, share: f64, bytes: u64) -> f64 {
    bytes as f64 / (m.dram_gbytes_per_sec * share)
}

/// What one verb moving `bytes` costs in the model: a round trip, the wire, the medium.
fn one_verb(m: &LatencyModel, media_latency: Duration, share: f64, bytes: u64) -> f64 {
    ns(m.rtt) + wire(m, bytes) + ns(media_latency) + occupancy(m, share, bytes)
}

fn assert_close(got: Duration, want_ns: f64, what: &str) {
    let got = ns(got);
    let tol = 5.0 + want_ns * 0.01;
    assert!(
        (got - want_ns).abs() <= tol,
        "{what}: modeled {got} ns, expected {want_ns:.1} ns (± {tol:.1})"
    );
}

/// Virtual time one call of `f` advances `ep`'s clock by.
fn cost(ep: &Endpoint, f: impl FnOnce(&Endpoint)) -> Duration {
    let t0 = ep.virtual_now();
    f(ep);
    ep.virtual_now() - t0
}

#[test]
fn without_a_model_virtual_time_stands_still() {
    let (c, r) = sim();
    let ep = c.endpoint(1).unwrap();
    ep.read("t", r.at(0), 64).unwrap();
    assert_eq!(ep.virtual_now(), Duration::ZERO);
}

#[test]
fn a_small_dram_read_costs_a_round_trip_plus_dram_latency_plus_the_wire() {
    let m = LatencyModel::default();
    let (c, dram, _) = modeled_cluster();
    let ep = c.endpoint(1).unwrap();
    let d = cost(&ep, |ep| {
        ep.read("t", dram.at(0), 64).unwrap();
    });
    assert_close(d, one_verb(&m, m.dram_read, 1.0, 64), "64 B DRAM read");
    // The figures are the model's settings: about 2.2 µs by default.
    assert!(
        d > Duration::from_micros(2) && d < Duration::from_micros(3),
        "{d:?}"
    );
}

#[test]
fn an_nvm_read_costs_more_than_a_dram_read_and_an_nvm_write_costs_nvm_write() {
    let m = LatencyModel::default();
    let (c, dram, nvm) = modeled_cluster();
    let ep = c.endpoint(1).unwrap();
    let dram_read = cost(&ep, |ep| {
        ep.read("t", dram.at(0), 64).unwrap();
    });
    let nvm_read = cost(&ep, |ep| {
        ep.read("t", nvm.at(0), 64).unwrap();
    });
    assert_close(
        nvm_read,
        one_verb(&m, m.nvm_read, m.nvm_read_share, 64),
        "NVM read",
    );
    assert!(nvm_read > dram_read, "{nvm_read:?} <= {dram_read:?}");
    let nvm_write = cost(&ep, |ep| {
        ep.write("t", nvm.at(4096), &[1; 64]).unwrap();
    });
    assert_close(
        nvm_write,
        one_verb(&m, m.nvm_write, m.nvm_write_share, 64),
        "NVM write",
    );
    let dram_write = cost(&ep, |ep| {
        ep.write("t", dram.at(4096), &[1; 64]).unwrap();
    });
    assert_close(
        dram_write,
        one_verb(&m, m.dram_write, 1.0, 64),
        "DRAM write",
    );
    assert!(nvm_write > dram_write && nvm_write > nvm_read);
}

#[test]
fn a_batch_costs_one_round_trip_not_one_per_verb() {
    let m = LatencyModel::default();
    let (c, dram, _) = modeled_cluster();
    let ep = c.endpoint(1).unwrap();
    let d = cost(&ep, |ep| {
        let mut b = ep.batch(N0);
        for i in 0..8 {
            b.read(dram.at(i * 64), 64);
        }
        ep.execute("t", b).unwrap();
    });
    let single = one_verb(&m, m.dram_read, 1.0, 64);
    assert!(
        ns(d) < 2.0 * single,
        "8 pipelined reads cost {d:?}, one costs {single} ns"
    );
    assert!(ns(d) > single);
}

#[test]
fn a_fork_has_its_own_clock() {
    let m = LatencyModel::default();
    let (c, dram, _) = modeled_cluster();
    let ep = c.endpoint(1).unwrap();
    ep.read("t", dram.at(0), 64).unwrap();
    let base = ep.virtual_now();
    let busy = ep.fork();
    let idle = ep.fork();
    assert_eq!(
        busy.virtual_now(),
        base,
        "a fork starts at its parent's time"
    );
    for i in 0..100 {
        busy.read("t", dram.at(i * 64), 64).unwrap();
    }
    assert!(busy.virtual_now() >= base + Duration::from_micros(200));
    // Neither the parent nor a sibling moved.
    assert_eq!(ep.virtual_now(), base);
    assert_eq!(idle.virtual_now(), base);
    // The sibling's next verb costs what a lone one costs: the node was not loaded at its
    // time (the busy fork's reads were spread over 200 µs, each occupying DRAM for 3 ns).
    let d = cost(&idle, |ep| {
        ep.read("t", dram.at(0), 64).unwrap();
    });
    assert_close(
        d,
        one_verb(&m, m.dram_read, 1.0, 64),
        "read on an idle fork",
    );
    assert_eq!(ep.virtual_now(), base);
    // Clones share the clock.
    let clone = ep.clone();
    clone.read("t", dram.at(0), 64).unwrap();
    assert!(ep.virtual_now() > base);
}

#[test]
fn concurrent_large_nvm_writes_from_many_clients_queue_at_the_node() {
    const N: usize = 8;
    const SIZE: usize = 4096;
    let m = LatencyModel::default();
    let lone = {
        let (c, _, nvm) = modeled_cluster();
        let ep = c.endpoint(1).unwrap();
        cost(&ep, |ep| ep.write("t", nvm.at(0), &[1; SIZE]).unwrap())
    };
    assert_close(
        lone,
        one_verb(&m, m.nvm_write, m.nvm_write_share, SIZE as u64),
        "lone 4 KiB NVM write",
    );
    let (c, _, nvm) = modeled_cluster();
    let eps: Vec<_> = (0..N as u64).map(|i| c.endpoint(i + 1).unwrap()).collect();
    let go = Barrier::new(N);
    let finished: Vec<Duration> = std::thread::scope(|s| {
        let hs: Vec<_> = eps
            .iter()
            .enumerate()
            .map(|(i, ep)| {
                let go = &go;
                s.spawn(move || {
                    go.wait();
                    ep.write("t", nvm.at((i * SIZE) as u64), &[i as u8; SIZE])
                        .unwrap();
                    ep.virtual_now()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let last = *finished.iter().max().unwrap();
    let first = *finished.iter().min().unwrap();
    assert_close(first, ns(lone), "the first write is not queued");
    // Every write arrives at the same modeled instant; the medium serialises their bytes.
    let queued = ns(lone) + (N - 1) as f64 * occupancy(&m, m.nvm_write_share, SIZE as u64);
    assert!(last > lone, "no queueing: {last:?} vs {lone:?}");
    assert_close(last, queued, "the last of the queued writes");
}

// ---------------------------------------------------------------------------------------------
// TagStats::since.

mod tag_stats_since {
    use super::*;

    #[test]
    fn since_is_the_field_by_field_difference() {
        let earlier = TagStats {
            round_trips: 1,
            reads: 2,
            writes: 3,
            cas: 4,
            faa: 5,
            rpcs: 6,
            bytes_out: 7,
            bytes_in: 8,
        };
        let later = TagStats {
            round_trips: 11,
            reads: 22,
            writes: 33,
            cas: 44,
            faa: 55,
            rpcs: 66,
            bytes_out: 77,
            bytes_in: 88,
        };
        let d = later.since(&earlier);
        assert_eq!(
            d,
            TagStats {
                round_trips: 10,
                reads: 20,
                writes: 30,
                cas: 40,
                faa: 50,
                rpcs: 60,
                bytes_out: 70,
                bytes_in: 80,
            }
        );
        assert_eq!(d.verbs(), 20 + 30 + 40 + 50);
        assert_eq!(later.since(&later), TagStats::default());
        assert_eq!(later.since(&TagStats::default()), later);
    }

    #[test]
    fn since_measures_exactly_the_operations_in_between() {
        let (c, r) = sim();
        c.node(N0)
            .unwrap()
            .set_rpc_handler(Arc::new(|_: &Peer, _: &[u8]| Ok(vec![0; 5])));
        let ep = c.endpoint(1).unwrap();
        // Earlier work under the same tag and another tag.
        ep.write("op", r.at(0), &[1; 32]).unwrap();
        ep.read("other", r.at(0), 32).unwrap();
        let before = ep.stats().tag("op");
        let other_before = ep.stats().tag("other");
        // One operation: a batch of four verbs (one round trip) and an RPC (one more).
        let mut b = ep.batch(N0);
        b.write(r.at(0), &[2; 100]);
        b.read(r.at(200), 50);
        b.cas(r.at(256), 0, 1);
        b.faa(r.at(264), 1);
        ep.execute("op", b).unwrap();
        ep.rpc("op", N0, b"abc").unwrap();
        let d = ep.stats().tag("op").since(&before);
        assert_eq!(
            d,
            TagStats {
                round_trips: 2,
                reads: 1,
                writes: 1,
                cas: 1,
                faa: 1,
                rpcs: 1,
                bytes_out: 100 + 16 + 8 + 3,
                bytes_in: 50 + 8 + 8 + 5,
            }
        );
        assert_eq!(d.verbs(), 4);
        assert_eq!(
            ep.stats().tag("other").since(&other_before),
            TagStats::default()
        );
        // A tag never used measures zero.
        assert_eq!(
            ep.stats().tag("never").since(&TagStats::default()),
            TagStats::default()
        );
    }
}
