//! The conformance suite: one set of tests, generic over the backend, that every backend must
//! pass (the TiKV `engine_traits` pattern). A backend provides a [`Harness`]; its test file
//! instantiates every case with [`conformance_tests!`](crate::conformance_tests).
//!
//! ```ignore
//! dmkit_verbs::conformance_tests!(dmkit_verbs::conformance::SimHarness::new());
//! ```

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::Endpoint;
use crate::error::{AccessFault, Error, Result};
use crate::memory::{Backing, DramBacking};
use crate::node::{MemoryNode, Peer};
use crate::types::{Access, Media, NodeId, RegionDesc};

/// What the suite needs from a backend.
pub trait Harness: Send + Sync {
    /// Starts serving `node` (its regions are registered already).
    fn start_node(&self, node: Arc<MemoryNode>) -> Result<()>;
    /// A new client connected to every started node.
    fn endpoint(&self) -> Result<Endpoint>;
    /// Kills the node abruptly (its connections break).
    fn kill_node(&self, id: NodeId);
    /// Makes the node hang (`true`) or answer again (`false`).
    fn pause_node(&self, id: NodeId, paused: bool);
    /// The operation timeout clients use (the suite bounds failure detection by it).
    fn op_timeout(&self) -> Duration;
}

/// A node with one DRAM region of `len` bytes and full access, started on `h`.
pub fn simple_node(h: &dyn Harness, id: u16, len: usize) -> RegionDesc {
    let node = Arc::new(MemoryNode::new(NodeId(id)));
    let r = node
        .register(Arc::new(DramBacking::new(len)), Access::ALL, None)
        .expect("register");
    h.start_node(node).expect("start node");
    r
}

/// Work requests on one connection execute in order: a READ after a WRITE in the same batch
/// (and in a later batch) sees it, and the last of several writes to a word wins.
pub fn in_order_execution(h: &dyn Harness) {
    let r = simple_node(h, 0, 4096);
    let ep = h.endpoint().unwrap();
    let mut b = ep.batch(NodeId(0));
    for i in 0..20u64 {
        b.write(r.at(0), &i.to_le_bytes());
    }
    let rd = b.read(r.at(0), 8);
    b.write(r.at(8), b"abcdefgh");
    let rd2 = b.read(r.at(8), 8);
    let res = ep.execute("t", b).unwrap();
    assert_eq!(res.read(rd), 19u64.to_le_bytes());
    assert_eq!(res.read(rd2), b"abcdefgh");
    // Across batches posted back to back without waiting in between.
    let ps: Vec<_> = (0..50u64)
        .map(|i| {
            let mut b = ep.batch(NodeId(0));
            b.write(r.at(16), &i.to_le_bytes());
            ep.post("t", b)
        })
        .collect();
    for p in ps {
        ep.wait(p).unwrap();
    }
    assert_eq!(ep.read("t", r.at(16), 8).unwrap(), 49u64.to_le_bytes());
}

/// 8 connections × 10,000 FAA on one word: the sum is exact and every old value is distinct.
pub fn concurrent_faa_sums_exactly(h: &dyn Harness) {
    let r = simple_node(h, 0, 4096);
    let olds = Arc::new(Mutex::new(Vec::with_capacity(80_000)));
    std::thread::scope(|s| {
        for _ in 0..8 {
            let ep = h.endpoint().unwrap();
            let olds = olds.clone();
            s.spawn(move || {
                let mut mine = Vec::with_capacity(10_000);
                for _ in 0..10_000 / 50 {
                    let mut b = ep.batch(NodeId(0));
                    let idx: Vec<_> = (0..50).map(|_| b.faa(r.at(64), 1)).collect();
                    let res = ep.execute("faa", b).unwrap();
                    mine.extend(idx.into_iter().map(|i| res.old(i)));
                }
                olds.lock().extend(mine);
            });
        }
    });
    let ep = h.endpoint().unwrap();
    let v = u64::from_le_bytes(ep.read("t", r.at(64), 8).unwrap().try_into().unwrap());
    assert_eq!(v, 80_000);
    let mut olds = olds.lock().clone();
    olds.sort_unstable();
    olds.dedup();
    assert_eq!(olds.len(), 80_000, "two FAAs returned the same old value");
}

/// Concurrent CAS on one word: in every round exactly one of the contenders wins.
pub fn concurrent_cas_has_one_winner_per_round(h: &dyn Harness) {
    const CLIENTS: usize = 6;
    const ROUNDS: u64 = 150;
    let r = simple_node(h, 0, 4096);
    let barrier = Arc::new(Barrier::new(CLIENTS));
    let winners = Arc::new((0..ROUNDS).map(|_| AtomicU64::new(0)).collect::<Vec<_>>());
    std::thread::scope(|s| {
        for _ in 0..CLIENTS {
            let ep = h.endpoint().unwrap();
            let (barrier, winners) = (barrier.clone(), winners.clone());
            s.spawn(move || {
                for round in 0..ROUNDS {
                    barrier.wait();
                    // Everyone expects the value the previous round's winner left.
                    let expect = round * 100;
                    let old = ep.cas("cas", r.at(0), expect, (round + 1) * 100).unwrap();
                    if old == expect {
                        winners[round as usize].fetch_add(1, Ordering::SeqCst);
                    }
                    barrier.wait();
                }
            });
        }
    });
    for (round, w) in winners.iter().enumerate() {
        assert_eq!(w.load(Ordering::SeqCst), 1, "round {round}");
    }
}

/// Concurrent writers of whole words and readers: every aligned word read is one that some
/// writer wrote entirely (8 equal bytes), never a mix.
pub fn aligned_words_are_never_torn(h: &dyn Harness) {
    let r = simple_node(h, 0, 4096);
    let stop = Arc::new(AtomicBool::new(false));
    let torn = Arc::new(AtomicU64::new(0));
    let reads = Arc::new(AtomicU64::new(0));
    std::thread::scope(|s| {
        for w in 1..=2u8 {
            let ep = h.endpoint().unwrap();
            let stop = stop.clone();
            s.spawn(move || {
                let mut i = 0u8;
                while !stop.load(Ordering::Relaxed) {
                    i = i.wrapping_add(1);
                    let v = [w.wrapping_mul(31).wrapping_add(i); 512];
                    ep.write("w", r.at(0), &v).unwrap();
                }
            });
        }
        for _ in 0..2 {
            let ep = h.endpoint().unwrap();
            let (stop, torn, reads) = (stop.clone(), torn.clone(), reads.clone());
            s.spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let d = ep.read("r", r.at(0), 512).unwrap();
                    for w in d.chunks(8) {
                        if w.iter().any(|b| *b != w[0]) {
                            torn.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    reads.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
        let t = Instant::now();
        while reads.load(Ordering::Relaxed) < 300 && t.elapsed() < Duration::from_secs(20) {
            std::thread::sleep(Duration::from_millis(5));
        }
        stop.store(true, Ordering::Relaxed);
    });
    assert!(reads.load(Ordering::Relaxed) >= 300);
    assert_eq!(torn.load(Ordering::Relaxed), 0, "torn words observed");
}

fn expect_fault(r: Result<impl std::fmt::Debug>, want: AccessFault, index: usize) {
    match r {
        Err(Error::RemoteAccess {
            fault, index: i, ..
        }) => {
            assert_eq!(fault, want);
            assert_eq!(i, index);
        }
        other => panic!("expected {want:?} at {index}, got {other:?}"),
    }
}

/// Out-of-bounds, wrong-rkey, no-access and misaligned-atomic requests fail with a remote
/// access error, leave memory untouched, stop their batch there, and the connection goes on.
pub fn bad_requests_fail_and_leave_memory_untouched(h: &dyn Harness) {
    let node = Arc::new(MemoryNode::new(NodeId(0)));
    let rw = node
        .register(Arc::new(DramBacking::new(4096)), Access::ALL, None)
        .unwrap();
    let ro = node
        .register(Arc::new(DramBacking::new(4096)), Access::REMOTE_READ, None)
        .unwrap();
    let no_atomic = node
        .register(
            Arc::new(DramBacking::new(4096)),
            Access::REMOTE_READ | Access::REMOTE_WRITE,
            None,
        )
        .unwrap();
    h.start_node(node).unwrap();
    let ep = h.endpoint().unwrap();
    let before = ep.read("t", rw.at(0), 4096).unwrap();
    assert!(before.iter().all(|b| *b == 0));

    // Out of bounds: past the end, straddling the end, before the start.
    expect_fault(
        ep.write("t", rw.at(4090), &[1; 8]),
        AccessFault::OutOfBounds,
        0,
    );
    expect_fault(ep.read("t", rw.at(4096), 1), AccessFault::OutOfBounds, 0);
    expect_fault(
        ep.write(
            "t",
            crate::RemoteAddr::new(NodeId(0), rw.rkey, rw.base - 8),
            &[1; 8],
        ),
        AccessFault::OutOfBounds,
        0,
    );
    expect_fault(ep.faa("t", rw.at(4096), 1), AccessFault::OutOfBounds, 0);
    // Wrong rkey.
    let bogus = crate::RemoteAddr::new(NodeId(0), crate::RKey(rw.rkey.0 ^ 0x5a5a_5a5a), rw.base);
    expect_fault(ep.write("t", bogus, &[1; 8]), AccessFault::UnknownRkey, 0);
    // No access.
    expect_fault(
        ep.write("t", ro.at(0), &[1; 8]),
        AccessFault::NoAccess("write"),
        0,
    );
    expect_fault(
        ep.cas("t", ro.at(0), 0, 1),
        AccessFault::NoAccess("atomic"),
        0,
    );
    expect_fault(
        ep.faa("t", no_atomic.at(0), 1),
        AccessFault::NoAccess("atomic"),
        0,
    );
    // Misaligned atomics.
    expect_fault(ep.cas("t", rw.at(4), 0, 1), AccessFault::Misaligned, 0);
    expect_fault(ep.faa("t", rw.at(1), 1), AccessFault::Misaligned, 0);

    // A batch stops at its bad request: the one before ran, the ones after did not.
    let mut b = ep.batch(NodeId(0));
    b.write(rw.at(0), &[7; 8]);
    b.write(ro.at(0), &[7; 8]);
    b.write(rw.at(8), &[7; 8]);
    expect_fault(ep.execute("t", b), AccessFault::NoAccess("write"), 1);

    let after = ep.read("t", rw.at(0), 4096).unwrap();
    assert_eq!(&after[..8], &[7; 8]);
    assert!(after[8..].iter().all(|b| *b == 0), "memory touched");
    assert!(
        ep.read("t", ro.at(0), 4096)
            .unwrap()
            .iter()
            .all(|b| *b == 0)
    );
    assert!(
        ep.read("t", no_atomic.at(0), 8)
            .unwrap()
            .iter()
            .all(|b| *b == 0)
    );
    // The connection is still usable.
    assert_eq!(ep.faa("t", rw.at(16), 2).unwrap(), 0);
    assert_eq!(ep.faa("t", rw.at(16), 2).unwrap(), 2);
}

/// One batch = one round trip however many verbs it has; batches to several nodes posted
/// together = one round trip; an RPC = one round trip; bytes are counted.
pub fn batches_and_round_trips_are_accounted(h: &dyn Harness) {
    let r0 = simple_node(h, 0, 4096);
    let r1 = simple_node(h, 1, 4096);
    let ep = h.endpoint().unwrap();
    let mut b = ep.batch(NodeId(0));
    b.write(r0.at(0), &[1; 100]);
    b.read(r0.at(0), 64);
    b.cas(r0.at(128), 0, 1);
    b.faa(r0.at(136), 1);
    ep.execute("one", b).unwrap();
    let s = ep.stats().tag("one");
    assert_eq!(s.round_trips, 1);
    assert_eq!((s.reads, s.writes, s.cas, s.faa), (1, 1, 1, 1));
    assert_eq!(s.verbs(), 4);
    assert_eq!(s.bytes_out, 100 + 16 + 8);
    assert_eq!(s.bytes_in, 64 + 8 + 8);

    let mut b0 = ep.batch(NodeId(0));
    b0.read(r0.at(0), 8);
    let mut b1 = ep.batch(NodeId(1));
    b1.read(r1.at(0), 8);
    b1.read(r1.at(8), 8);
    for r in ep.execute_many("parallel", vec![b0, b1]) {
        r.unwrap();
    }
    let s = ep.stats().tag("parallel");
    assert_eq!(s.round_trips, 1);
    assert_eq!(s.reads, 3);
    assert_eq!(ep.stats().tag("never").round_trips, 0);
    let total = ep.stats().total();
    assert_eq!(total.round_trips, 2);
}

/// Two-sided RPC reaches the node's handler; handler errors and missing handlers are errors.
pub fn rpc_reaches_the_handler(h: &dyn Harness) {
    let node = Arc::new(MemoryNode::new(NodeId(0)));
    node.register(Arc::new(DramBacking::new(64)), Access::ALL, None)
        .unwrap();
    let calls = Arc::new(AtomicU64::new(0));
    let c = calls.clone();
    node.set_rpc_handler(Arc::new(move |_p: &Peer, req: &[u8]| {
        c.fetch_add(1, Ordering::SeqCst);
        if req == b"fail" {
            return Err("asked to fail".to_string());
        }
        let mut v = req.to_vec();
        v.reverse();
        Ok(v)
    }));
    h.start_node(node).unwrap();
    let bare = Arc::new(MemoryNode::new(NodeId(1)));
    h.start_node(bare).unwrap();
    let ep = h.endpoint().unwrap();
    assert_eq!(ep.rpc("rpc", NodeId(0), b"abc").unwrap(), b"cba");
    let big: Vec<u8> = (0..100_000u32).map(|i| i as u8).collect();
    let mut rev = big.clone();
    rev.reverse();
    assert_eq!(ep.rpc("rpc", NodeId(0), &big).unwrap(), rev);
    match ep.rpc("rpc", NodeId(0), b"fail") {
        Err(Error::Rpc { reason, .. }) => assert!(reason.contains("asked to fail")),
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        ep.rpc("rpc", NodeId(1), b"x"),
        Err(Error::Rpc { .. })
    ));
    assert_eq!(calls.load(Ordering::SeqCst), 3);
    assert_eq!(ep.stats().tag("rpc").round_trips, 4);
    assert_eq!(ep.stats().tag("rpc").rpcs, 4);
}

/// A proxied write returns before the node executes it; its confirm fires only once the data
/// is readable by another connection.
pub fn write_confirm_fires_after_data_is_visible(h: &dyn Harness) {
    let r = simple_node(h, 0, 1 << 16);
    let writer = h.endpoint().unwrap();
    let observer = h.endpoint().unwrap();
    h.pause_node(NodeId(0), true);
    let t = Instant::now();
    let confirm = writer
        .proxied_write("pw", r.at(128), &[0xAB; 256], false)
        .unwrap();
    assert!(t.elapsed() < h.op_timeout() / 2, "proxied write blocked");
    std::thread::sleep(Duration::from_millis(50));
    assert!(
        !confirm.is_confirmed(),
        "confirmed before the node executed it"
    );
    h.pause_node(NodeId(0), false);
    confirm.wait().unwrap();
    assert_eq!(observer.read("o", r.at(128), 256).unwrap(), vec![0xAB; 256]);
    // Many in flight: each confirm implies its data is visible.
    let confirms: Vec<_> = (0..64u64)
        .map(|i| {
            let c = writer
                .proxied_write("pw", r.at(1024 + i * 8), &(i + 1).to_le_bytes(), false)
                .unwrap();
            (i, c)
        })
        .collect();
    for (i, c) in confirms {
        c.wait().unwrap();
        let v = observer.read("o", r.at(1024 + i * 8), 8).unwrap();
        assert_eq!(v, (i + 1).to_le_bytes());
    }
    writer.flush().unwrap();
}

/// With staging full the writer waits (back-pressure), staged memory never exceeds the
/// capacity, and every write lands once the node answers again.
pub fn full_staging_makes_the_writer_wait(h: &dyn Harness) {
    let r = simple_node(h, 0, 1 << 20);
    let ep = h.endpoint().unwrap();
    let cap = ep.staging_capacity();
    let chunk = 64 << 10;
    let total = cap / chunk * 3;
    h.pause_node(NodeId(0), true);
    let issued = Arc::new(AtomicU64::new(0));
    std::thread::scope(|s| {
        let w = ep.clone();
        let iss = issued.clone();
        let writer = s.spawn(move || {
            let mut confirms = Vec::new();
            for i in 0..total {
                let data = vec![(i % 251) as u8 + 1; chunk];
                let off = (i * chunk) as u64 % (1 << 20);
                confirms.push(w.proxied_write("pw", r.at(off), &data, false).unwrap());
                iss.fetch_add(1, Ordering::SeqCst);
            }
            for c in confirms {
                c.wait().unwrap();
            }
        });
        std::thread::sleep(Duration::from_millis(200));
        let n = issued.load(Ordering::SeqCst) as usize;
        assert!(
            n <= cap / chunk,
            "{n} writes staged past the capacity of {cap}"
        );
        assert!(ep.staging_in_use() <= cap);
        h.pause_node(NodeId(0), false);
        writer.join().unwrap();
    });
    assert_eq!(issued.load(Ordering::SeqCst) as usize, total);
    assert!(ep.staging_high_water() <= cap);
    assert_eq!(ep.staging_in_use(), 0);
    ep.flush().unwrap();
}

/// A killed node surfaces as an error (in flight and afterwards) within the timeout.
pub fn killed_node_is_an_error_not_a_hang(h: &dyn Harness) {
    let r = simple_node(h, 0, 4096);
    let ep = h.endpoint().unwrap();
    ep.write("t", r.at(0), &[1; 8]).unwrap();
    h.pause_node(NodeId(0), true);
    let mut b = ep.batch(NodeId(0));
    b.read(r.at(0), 8);
    let inflight = ep.post("t", b);
    h.kill_node(NodeId(0));
    let bound = h.op_timeout() + Duration::from_secs(2);
    let t = Instant::now();
    let e = ep.wait(inflight).unwrap_err();
    assert!(e.is_node_failure(), "{e}");
    let e = ep.read("t", r.at(0), 8).unwrap_err();
    assert!(e.is_node_failure(), "{e}");
    assert!(t.elapsed() < bound, "took {:?}", t.elapsed());
}

/// A hung node surfaces as a timeout within the bound.
pub fn hung_node_times_out(h: &dyn Harness) {
    let r = simple_node(h, 0, 4096);
    let ep = h.endpoint().unwrap();
    h.pause_node(NodeId(0), true);
    let t = Instant::now();
    let e = ep.read("t", r.at(0), 8).unwrap_err();
    assert!(matches!(e, Error::Timeout { .. }), "{e}");
    assert!(t.elapsed() >= h.op_timeout() / 2);
    assert!(t.elapsed() < h.op_timeout() + Duration::from_secs(2));
    h.pause_node(NodeId(0), false);
}

/// Runs every future to completion on this thread with [`crate::block_on`] and
/// [`crate::join_all`] (std alone): the suite drives futures with it to show that completions
/// wake any executor.
pub fn run_all<F: std::future::Future>(futs: Vec<F>) -> Vec<F::Output> {
    crate::block_on(crate::join_all(futs))
}

/// Waits (bounded) until the endpoint's in-flight tables are empty, then asserts it.
fn assert_drained(ep: &Endpoint, what: &str) {
    let t = Instant::now();
    while ep.in_flight() > 0 && t.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(
        ep.in_flight(),
        0,
        "{what}: work left in the in-flight tables"
    );
}

/// One thread keeps hundreds of verbs in flight on one endpoint, awaiting them as futures:
/// the FAA sum is exact, every CAS round has one winner, and the in-flight tables empty.
pub fn many_awaited_verbs_on_one_thread(h: &dyn Harness) {
    let r = simple_node(h, 0, 1 << 16);
    let ep = h.endpoint().unwrap();
    const N: usize = 512;
    let futs: Vec<_> = (0..N)
        .map(|i| {
            let ep = &ep;
            async move {
                let old = ep.faa_async("faa", r.at(0), 1).await?;
                let slot = 64 + (i as u64 % 128) * 8;
                ep.write_async("w", r.at(slot), &(i as u64).to_le_bytes())
                    .await?;
                let won = ep.cas_async("cas", r.at(8), 0, i as u64 + 1).await? == 0;
                let back = ep.read_async("r", r.at(slot), 8).await?;
                assert_eq!(back.len(), 8);
                Ok::<_, Error>((old, won))
            }
        })
        .collect();
    let mut olds = Vec::new();
    let mut winners = 0;
    for r in run_all(futs) {
        let (old, won) = r.unwrap();
        olds.push(old);
        winners += usize::from(won);
    }
    olds.sort_unstable();
    olds.dedup();
    assert_eq!(olds.len(), N, "two FAAs returned the same old value");
    assert_eq!(winners, 1, "one CAS from 0 wins");
    assert_eq!(
        u64::from_le_bytes(ep.read("t", r.at(0), 8).unwrap().try_into().unwrap()),
        N as u64
    );
    // RPCs and batches to several nodes, awaited.
    let many: Vec<_> = (0..64)
        .map(|i| {
            let ep = &ep;
            async move {
                let mut b = ep.batch(NodeId(0));
                let x = b.read(r.at(0), 8);
                let mut b2 = ep.batch(NodeId(0));
                b2.write(r.at(2048 + i * 8), &[1; 8]);
                let res = ep.execute_many_async("many", vec![b, b2]).await;
                assert_eq!(res.len(), 2);
                let first = res.into_iter().next().unwrap()?;
                Ok::<_, Error>(first.read(x).to_vec())
            }
        })
        .collect();
    for r in run_all(many) {
        assert_eq!(r.unwrap().len(), 8);
    }
    assert_eq!(ep.stats().tag("many").round_trips, 64);
    assert_drained(&ep, "awaited verbs");
}

/// Futures dropped while their verbs are in flight (a cancelled task) leave nothing behind:
/// the verbs still execute, the in-flight tables and staging return to empty, their
/// timeouts are disarmed, and the connection goes on serving.
pub fn cancelled_futures_leak_nothing(h: &dyn Harness) {
    let r = simple_node(h, 0, 1 << 20);
    let ep = h.endpoint().unwrap();
    // Hold the node so everything is still in flight when the futures are dropped.
    h.pause_node(NodeId(0), true);
    let mut pending = Vec::new();
    for i in 0..200u64 {
        let mut b = ep.batch(NodeId(0));
        b.faa(r.at(0), 1);
        b.write(r.at(8 + (i % 64) * 8), &i.to_le_bytes());
        pending.push(ep.post("cancel", b));
    }
    // Poll each once (arming its timeout), then drop half of them.
    {
        use std::task::{Context, Poll, Waker};
        let mut cx = Context::from_waker(Waker::noop());
        for p in &mut pending {
            // (sim answers at once when it does not hold work: then the result is dropped.)
            let _: Poll<_> = std::pin::Pin::new(p).poll(&mut cx);
        }
    }
    let kept: Vec<_> = pending.drain(..).skip(100).collect();
    let confirms: Vec<_> = (0..20u64)
        .map(|i| {
            ep.proxied_write("pw", r.at(4096 + i * 64), &[7; 64], false)
                .unwrap()
        })
        .collect();
    drop(confirms);
    h.pause_node(NodeId(0), false);
    for r in run_all(kept.into_iter().map(|p| ep.wait_async(p)).collect()) {
        r.unwrap();
    }
    ep.flush().unwrap();
    assert_drained(&ep, "cancelled futures");
    assert_eq!(ep.staging_in_use(), 0, "staging left charged");
    // Every verb executed, awaited or not.
    assert_eq!(
        u64::from_le_bytes(ep.read("t", r.at(0), 8).unwrap().try_into().unwrap()),
        200
    );
    assert_eq!(ep.read("t", r.at(4096), 64).unwrap(), vec![7; 64]);
}

/// An awaited verb on a hung node fails with a timeout (bounded by the connection's), while
/// the other tasks on the same thread, on a healthy node, finish.
pub fn awaited_verbs_time_out_on_a_hung_node(h: &dyn Harness) {
    let r0 = simple_node(h, 0, 4096);
    let r1 = simple_node(h, 1, 4096);
    let ep = h.endpoint().unwrap();
    h.pause_node(NodeId(0), true);
    let t = Instant::now();
    let hung = Box::pin(async { ep.read_async("t", r0.at(0), 8).await.map(drop) })
        as std::pin::Pin<Box<dyn std::future::Future<Output = Result<()>> + '_>>;
    let mut futs = vec![hung];
    for i in 0..50u64 {
        let ep = &ep;
        futs.push(Box::pin(async move {
            ep.faa_async("t", r1.at(i % 8 * 8), 1).await.map(drop)
        }));
    }
    let out = run_all(futs);
    let e = out[0].as_ref().unwrap_err();
    assert!(matches!(e, Error::Timeout { .. }), "{e}");
    assert!(t.elapsed() >= h.op_timeout() / 2);
    assert!(t.elapsed() < h.op_timeout() + Duration::from_secs(2));
    for r in &out[1..] {
        r.as_ref().unwrap();
    }
    h.pause_node(NodeId(0), false);
}

/// Async proxied writes under back-pressure: staging never exceeds its capacity, the
/// writer's task waits instead of its thread, and every confirm fires.
pub fn async_proxied_writes_respect_staging(h: &dyn Harness) {
    let r = simple_node(h, 0, 1 << 20);
    let ep = h.endpoint().unwrap();
    let cap = ep.staging_capacity();
    let chunk = 64 << 10;
    let total = cap / chunk * 3;
    let writer = async {
        let mut confirms = Vec::new();
        for i in 0..total {
            let data = vec![(i % 251) as u8 + 1; chunk];
            let off = (i * chunk) as u64 % (1 << 20);
            confirms.push(
                ep.proxied_write_async("pw", r.at(off), &data, false)
                    .await?,
            );
            assert!(ep.staging_in_use() <= cap);
        }
        for c in &confirms {
            c.confirmed().await?;
        }
        ep.flush_async().await
    };
    for r in run_all(vec![writer]) {
        r.unwrap();
    }
    assert!(ep.staging_high_water() <= cap);
    assert_eq!(ep.staging_in_use(), 0);
    let last = total - 1;
    let off = (last * chunk) as u64 % (1 << 20);
    assert_eq!(
        ep.read("t", r.at(off), 16).unwrap(),
        vec![(last % 251) as u8 + 1; 16]
    );
    assert_drained(&ep, "async proxied writes");
}

/// A memory whose persists are recorded, to check durable writes.
#[derive(Debug)]
pub struct RecordingNvm {
    dram: DramBacking,
    /// `(offset, len)` of every persist, in order.
    pub persisted: Mutex<Vec<(usize, usize)>>,
}

impl RecordingNvm {
    pub fn new(len: usize) -> Self {
        Self {
            dram: DramBacking::new(len),
            persisted: Mutex::new(Vec::new()),
        }
    }
}

impl Backing for RecordingNvm {
    fn as_ptr(&self) -> *mut u8 {
        self.dram.as_ptr()
    }
    fn len(&self) -> usize {
        self.dram.len()
    }
    fn media(&self) -> Media {
        Media::Nvm
    }
    fn persist(&self, offset: usize, len: usize) -> std::io::Result<()> {
        self.persisted.lock().push((offset, len));
        Ok(())
    }
}

/// A durable write completes only after the node persisted its range; a plain one does not
/// persist; regions report their medium.
pub fn durable_writes_persist_before_completing(h: &dyn Harness) {
    let node = Arc::new(MemoryNode::new(NodeId(0)));
    let nvm = Arc::new(RecordingNvm::new(8192));
    let r = node.register(nvm.clone(), Access::ALL, None).unwrap();
    h.start_node(node).unwrap();
    let ep = h.endpoint().unwrap();
    assert_eq!(ep.regions(NodeId(0)).unwrap()[0].media, Media::Nvm);
    ep.write("t", r.at(0), &[1; 64]).unwrap();
    assert!(nvm.persisted.lock().is_empty());
    ep.write_durable("t", r.at(100), &[2; 300]).unwrap();
    assert_eq!(nvm.persisted.lock().as_slice(), &[(100, 300)]);
    let c = ep.proxied_write("t", r.at(1000), &[3; 10], true).unwrap();
    c.wait().unwrap();
    assert_eq!(nvm.persisted.lock().last(), Some(&(1000, 10)));
}

/// An NVM medium that notes, at every persist, the word at `watch` (what a later verb of the
/// batch may have swapped already).
#[derive(Debug)]
struct WatchingNvm {
    nvm: RecordingNvm,
    watch: usize,
    /// `(offset, len, word at watch)` of every persist, in order.
    seen: Mutex<Vec<(usize, usize, u64)>>,
}

impl Backing for WatchingNvm {
    fn as_ptr(&self) -> *mut u8 {
        self.nvm.as_ptr()
    }
    fn len(&self) -> usize {
        self.nvm.len()
    }
    fn media(&self) -> Media {
        Media::Nvm
    }
    fn persist(&self, offset: usize, len: usize) -> std::io::Result<()> {
        let mut w = [0u8; 8];
        // SAFETY: `watch + 8 <= len()` (checked at construction); the read races only with
        // the node's own verbs, which write whole aligned words.
        unsafe {
            std::ptr::copy_nonoverlapping(self.nvm.as_ptr().add(self.watch), w.as_mut_ptr(), 8)
        };
        self.seen.lock().push((offset, len, u64::from_le_bytes(w)));
        Ok(())
    }
}

/// [`Endpoint::durable_in_order`] is never wrong: where it says so, a durable WRITE is
/// persisted before the next verb of its batch (a CAS) runs; a DRAM region says so on every
/// backend (its writes are placed in order, and there is nothing to persist).
pub fn durable_in_order_is_kept(h: &dyn Harness) {
    let node = Arc::new(MemoryNode::new(NodeId(0)));
    let nvm = Arc::new(WatchingNvm {
        nvm: RecordingNvm::new(8192),
        watch: 512,
        seen: Mutex::new(Vec::new()),
    });
    assert!(nvm.watch + 8 <= nvm.len());
    let r = node.register(nvm.clone(), Access::ALL, None).unwrap();
    let dram = node
        .register(Arc::new(DramBacking::new(4096)), Access::ALL, None)
        .unwrap();
    h.start_node(node).unwrap();
    let ep = h.endpoint().unwrap();
    assert!(ep.durable_in_order(dram.at(0)), "a DRAM region is ordered");
    let mut b = ep.batch(NodeId(0));
    b.write_durable(r.at(0), &[7; 64]);
    let c = b.cas(r.at(512), 0, 1);
    assert_eq!(ep.execute("t", b).unwrap().old(c), 0);
    let seen = nvm.seen.lock().clone();
    // (A backend may persist it in one flush with its neighbours: any range covering it.)
    let record = seen
        .iter()
        .find(|(off, len, _)| *off == 0 && *len >= 64)
        .unwrap_or_else(|| panic!("the durable write was never persisted: {seen:?}"));
    if ep.durable_in_order(r.at(0)) {
        assert_eq!(
            record.2, 0,
            "durable_in_order said the write would be durable before the CAS ran; it was not"
        );
    }
}

/// Clients learn the node's regions at connect, and new ones on refresh.
pub fn regions_are_learned_at_connect(h: &dyn Harness) {
    let node = Arc::new(MemoryNode::new(NodeId(0)));
    let a = node
        .register(Arc::new(DramBacking::new(4096)), Access::ALL, None)
        .unwrap();
    let b = node
        .register(
            Arc::new(DramBacking::new(8192)),
            Access::REMOTE_READ,
            Some(1 << 50),
        )
        .unwrap();
    h.start_node(node.clone()).unwrap();
    let ep = h.endpoint().unwrap();
    assert_eq!(ep.regions(NodeId(0)).unwrap(), vec![a, b]);
    assert_ne!(a.rkey, b.rkey);
    let c = node
        .register(Arc::new(DramBacking::new(64)), Access::ALL, None)
        .unwrap();
    let conn = ep.connection(NodeId(0)).unwrap();
    let now = conn.refresh_regions().unwrap();
    assert!(now.contains(&c));
    ep.write("t", c.at(0), b"new").unwrap();
}

/// A rekey cuts off peers that still use the old rkey, and a fence cuts off everyone, with
/// the memory untouched; the refused verbs fail their own batches only, and peers that learn
/// the new descriptor carry on over the same connections. (On rdma a verb that reaches the
/// NIC with a dropped rkey breaks the RC connection, which is then made again.)
pub fn rekeys_and_fences_cut_peers_off(h: &dyn Harness) {
    let node = Arc::new(MemoryNode::new(NodeId(0)));
    let r = node
        .register(Arc::new(DramBacking::new(4096)), Access::ALL, None)
        .unwrap();
    h.start_node(node.clone()).unwrap();
    let mem = node.memory(r.rkey).unwrap();
    let ep = h.endpoint().unwrap();
    let stale = h.endpoint().unwrap();
    ep.write("t", r.at(0), &[1; 8]).unwrap();
    stale.write("t", r.at(8), &[1; 8]).unwrap();

    let fresh = node.rekey(r.rkey).unwrap();
    assert_eq!((fresh.base, fresh.len), (r.base, r.len));
    // A peer told the new descriptor uses it on its connection...
    ep.write("t", fresh.at(0), &[2; 8]).unwrap();
    assert_eq!(ep.read("t", fresh.at(0), 8).unwrap(), [2; 8]);
    // ...and neither it nor a peer that was not told gets anywhere with the old one.
    for e in [&ep, &stale] {
        let err = e.write("t", r.at(16), &[9; 8]).unwrap_err();
        assert!(
            matches!(
                err,
                Error::RemoteAccess {
                    fault: AccessFault::UnknownRkey,
                    ..
                }
            ),
            "{err}"
        );
    }
    assert_eq!(
        mem.load_u64(16).unwrap(),
        0,
        "a write with the old rkey landed"
    );

    node.set_fenced(true);
    let err = ep.write("t", fresh.at(24), &[9; 8]).unwrap_err();
    assert!(
        matches!(
            err,
            Error::RemoteAccess {
                fault: AccessFault::Fenced | AccessFault::UnknownRkey,
                ..
            }
        ),
        "{err}"
    );
    // A peer connecting while the node is fenced is told so.
    let late = h.endpoint().unwrap();
    let err = late.read("t", fresh.at(0), 8).unwrap_err();
    assert!(
        matches!(
            err,
            Error::RemoteAccess {
                fault: AccessFault::Fenced,
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(
        mem.load_u64(24).unwrap(),
        0,
        "a write to a fenced node landed"
    );

    node.set_fenced(false);
    // Every peer works again with the current rkey, on its connection.
    late.write("t", fresh.at(32), &[3; 8]).unwrap();
    for e in [&ep, &stale] {
        assert_eq!(e.read("t", fresh.at(32), 8).unwrap(), [3; 8]);
    }
    let after = h.endpoint().unwrap();
    assert_eq!(after.read("t", fresh.at(32), 8).unwrap(), [3; 8]);
    assert_eq!(after.read("t", fresh.at(0), 8).unwrap(), [2; 8]);
}

/// Regions registered under a name are found by it, over the backend's region table; names
/// are unique per node and checked.
pub fn named_regions_are_found_by_name(h: &dyn Harness) {
    let node = Arc::new(MemoryNode::new(NodeId(0)));
    let plain = node
        .register(Arc::new(DramBacking::new(4096)), Access::ALL, None)
        .unwrap();
    let named = node
        .register_named(
            "data.v1",
            Arc::new(DramBacking::new(8192)),
            Access::ALL,
            None,
        )
        .unwrap();
    assert!(
        node.register_named("data.v1", Arc::new(DramBacking::new(64)), Access::ALL, None)
            .is_err(),
        "two regions of one name"
    );
    for bad in ["", "a name", "sixteen-bytes-xx"] {
        assert!(
            node.register_named(bad, Arc::new(DramBacking::new(64)), Access::ALL, None)
                .is_err(),
            "{bad:?} accepted"
        );
    }
    h.start_node(node).unwrap();
    let ep = h.endpoint().unwrap();
    let found = ep.region_named(NodeId(0), "data.v1").unwrap();
    assert_eq!(found, named);
    assert_eq!(found.name.as_str(), "data.v1");
    assert!(ep.region_named(NodeId(0), "nope").is_err());
    assert!(ep.region_named(NodeId(0), "").is_err());
    let unnamed = ep.regions(NodeId(0)).unwrap();
    assert!(unnamed.iter().any(|r| *r == plain && r.name.is_empty()));
    ep.write("t", found.at(8000), b"named").unwrap();
    assert_eq!(ep.read("t", found.at(8000), 5).unwrap(), b"named");
}

/// Blocking and awaited verbs on one connection at once (threads blocking on single verbs,
/// a thread with many awaited ones): whoever polls the completions delivers the others' (on
/// rdma a blocking caller polls the queue itself, and falls back to the general path while
/// another thread does), every verb completes exactly once, and nothing stays in flight.
pub fn blocking_and_awaited_verbs_share_a_connection(h: &dyn Harness) {
    const BLOCKING: u64 = 300;
    const AWAITED: u64 = 256;
    let r = simple_node(h, 0, 4096);
    let ep = h.endpoint().unwrap();
    std::thread::scope(|s| {
        for t in 0..2u64 {
            let ep = &ep;
            s.spawn(move || {
                for i in 0..BLOCKING {
                    ep.faa("b", r.at(0), 1).unwrap();
                    let slot = 64 + ((t * BLOCKING + i) % 64) * 8;
                    ep.write("b", r.at(slot), &i.to_le_bytes()).unwrap();
                    assert_eq!(ep.read("b", r.at(slot), 8).unwrap().len(), 8);
                }
            });
        }
        let ep = &ep;
        s.spawn(move || {
            let futs: Vec<_> = (0..AWAITED)
                .map(|_| async move { ep.faa_async("a", r.at(8), 1).await })
                .collect();
            let mut olds: Vec<u64> = run_all(futs).into_iter().map(|o| o.unwrap()).collect();
            olds.sort_unstable();
            olds.dedup();
            assert_eq!(
                olds.len() as u64,
                AWAITED,
                "two awaited FAAs saw the same value"
            );
        });
    });
    let word = |at: u64| u64::from_le_bytes(ep.read("t", r.at(at), 8).unwrap().try_into().unwrap());
    assert_eq!(word(0), 2 * BLOCKING);
    assert_eq!(word(8), AWAITED);
    assert_eq!(ep.in_flight(), 0, "verbs left in flight");
}

/// Instantiates every conformance case as a `#[test]` for the harness `$make` builds.
#[macro_export]
macro_rules! conformance_tests {
    ($make:expr) => {
        $crate::conformance_tests!(@cases $make;
            in_order_execution,
            concurrent_faa_sums_exactly,
            concurrent_cas_has_one_winner_per_round,
            aligned_words_are_never_torn,
            bad_requests_fail_and_leave_memory_untouched,
            batches_and_round_trips_are_accounted,
            rpc_reaches_the_handler,
            write_confirm_fires_after_data_is_visible,
            full_staging_makes_the_writer_wait,
            killed_node_is_an_error_not_a_hang,
            hung_node_times_out,
            durable_writes_persist_before_completing,
            durable_in_order_is_kept,
            regions_are_learned_at_connect,
            named_regions_are_found_by_name,
            rekeys_and_fences_cut_peers_off,
            many_awaited_verbs_on_one_thread,
            cancelled_futures_leak_nothing,
            awaited_verbs_time_out_on_a_hung_node,
            async_proxied_writes_respect_staging,
            blocking_and_awaited_verbs_share_a_connection,
        );
    };
    (@cases $make:expr; $($case:ident),* $(,)?) => {
        $(
            #[test]
            fn $case() {
                let h = $make;
                $crate::conformance::$case(&h);
            }
        )*
    };
}

/// The `sim` backend under the suite.
#[derive(Debug)]
pub struct SimHarness {
    pub cluster: crate::sim::SimCluster,
    next_client: AtomicU64,
}

impl SimHarness {
    pub fn new() -> Self {
        Self {
            cluster: crate::sim::SimCluster::new(crate::sim::SimConfig {
                timeout: Duration::from_secs(1),
                ..Default::default()
            }),
            next_client: AtomicU64::new(1),
        }
    }
}

impl Default for SimHarness {
    fn default() -> Self {
        Self::new()
    }
}

impl Harness for SimHarness {
    fn start_node(&self, node: Arc<MemoryNode>) -> Result<()> {
        self.cluster.add_node(node);
        Ok(())
    }
    fn endpoint(&self) -> Result<Endpoint> {
        self.cluster
            .endpoint(self.next_client.fetch_add(1, Ordering::Relaxed))
    }
    fn kill_node(&self, id: NodeId) {
        self.cluster.fail_node(id);
        // Held work fails as the node is gone.
        self.cluster.resume_node(id);
    }
    fn pause_node(&self, id: NodeId, paused: bool) {
        if paused {
            self.cluster.pause_node(id)
        } else {
            self.cluster.resume_node(id)
        }
    }
    fn op_timeout(&self) -> Duration {
        Duration::from_secs(1)
    }
}

/// The `tcp` backend under the suite: nodes are in-process servers on loopback.
#[derive(Debug)]
pub struct TcpHarness {
    servers: Mutex<Vec<crate::tcp::TcpServer>>,
    connector: crate::tcp::TcpConnector,
}

impl TcpHarness {
    pub fn new() -> Self {
        Self::with_secret(None)
    }

    /// Nodes and clients that share `secret`.
    pub fn with_secret(secret: Option<&[u8]>) -> Self {
        Self {
            servers: Mutex::new(Vec::new()),
            connector: crate::tcp::TcpConnector {
                secret: secret.map(<[u8]>::to_vec),
                op_timeout: Duration::from_secs(1),
                ..Default::default()
            },
        }
    }
}

impl Default for TcpHarness {
    fn default() -> Self {
        Self::new()
    }
}

impl Harness for TcpHarness {
    fn start_node(&self, node: Arc<MemoryNode>) -> Result<()> {
        let s = crate::tcp::TcpServer::start(
            "127.0.0.1:0",
            node,
            crate::tcp::TcpServerConfig {
                secret: self.connector.secret.clone(),
                ..Default::default()
            },
        )?;
        self.servers.lock().push(s);
        Ok(())
    }
    fn endpoint(&self) -> Result<Endpoint> {
        let nodes: Vec<_> = self
            .servers
            .lock()
            .iter()
            .map(|s| (s.node().id(), s.local_addr().to_string()))
            .collect();
        Endpoint::connect(&self.connector, &nodes)
    }
    fn kill_node(&self, id: NodeId) {
        let mut servers = self.servers.lock();
        if let Some(i) = servers.iter().position(|s| s.node().id() == id) {
            let mut s = servers.remove(i);
            s.shutdown();
        }
    }
    fn pause_node(&self, id: NodeId, paused: bool) {
        for s in self.servers.lock().iter() {
            if s.node().id() == id {
                s.pause(paused);
            }
        }
    }
    fn op_timeout(&self) -> Duration {
        self.connector.op_timeout
    }
}
