//! Diagnostics: records the rounds of verbs the calling thread posts through an
//! [`Endpoint`](crate::Endpoint) (one entry per round trip: every batch of an
//! `execute_many`, or one posted batch), so a benchmark can replay an operation's own rounds
//! on scratch memory — through the verbs layer or straight on a queue pair — and set the
//! operation's time beside the bare cost of its round trips.
//!
//! It also adds up where the thread's time went ([`timed`] spans: the verbs layer's own
//! `verbs.post` and `verbs.wait`, and within the wait `verbs.wakeup` — from the moment
//! another thread delivered a completion to the moment the waiter had it — plus whatever
//! spans the layers above mark), for `dmkit bench fusee --breakdown`.
//!
//! Recording is per thread and off until [`start`]; while off it costs one thread-local read
//! per round.
//!
//! ```
//! use std::sync::Arc;
//! use dmkit_verbs::sim::{SimCluster, SimConfig};
//! use dmkit_verbs::{Access, DramBacking, MemoryNode, NodeId, record};
//!
//! let cluster = SimCluster::new(SimConfig::default());
//! let node = Arc::new(MemoryNode::new(NodeId(0)));
//! let region = node.register(Arc::new(DramBacking::new(4096)), Access::ALL, None)?;
//! cluster.add_node(node);
//! let ep = cluster.endpoint(1)?;
//! record::start();
//! ep.write("demo", region.at(0), b"hello")?;
//! ep.cas("demo", region.at(8), 0, 1)?;
//! let rec = record::take();
//! assert_eq!(rec.rounds.len(), 2);
//! assert_eq!(rec.rounds[0].batches[0].1[0].kind, record::VerbKind::Write { durable: false });
//! assert!(rec.time("verbs.wait") > std::time::Duration::ZERO);
//! # Ok::<(), dmkit_verbs::Error>(())
//! ```

use std::cell::{Cell, RefCell};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::batch::Batch;
use crate::node::OpKind;
use crate::stats::Tag;
use crate::types::NodeId;

/// What a recorded verb was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VerbKind {
    Read,
    Write { durable: bool },
    Cas,
    Faa,
}

/// One recorded verb: its kind and length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordedVerb {
    pub kind: VerbKind,
    pub len: u32,
}

/// One round trip: its tag and, per batch, the node and the verbs in posting order.
#[derive(Debug, Clone)]
pub struct RecordedRound {
    pub tag: Tag,
    pub batches: Vec<(NodeId, Vec<RecordedVerb>)>,
}

/// What [`take`] returns: the rounds, and the time spent in each named span.
#[derive(Debug, Clone, Default)]
pub struct Recording {
    pub rounds: Vec<RecordedRound>,
    pub times: Vec<(&'static str, Duration)>,
}

impl Recording {
    /// The time recorded under `name` (zero if none).
    pub fn time(&self, name: &str) -> Duration {
        self.times
            .iter()
            .filter(|(n, _)| *n == name)
            .map(|(_, d)| *d)
            .sum()
    }
}

thread_local! {
    static ON: Cell<bool> = const { Cell::new(false) };
    static TIMES: Cell<bool> = const { Cell::new(false) };
    static REC: RefCell<Recording> = RefCell::new(Recording::default());
    /// The rounds recorded since [`start`], flat: kept between recordings so that recording
    /// a round allocates nothing (a benchmark records inside the operation it times).
    static FLAT: RefCell<Flat> = RefCell::new(Flat::default());
    static DOORBELLS: Cell<(u64, u64)> = const { Cell::new((0, 0)) };
}

/// This thread's doorbells so far — `(doorbells, work requests)` it posted straight to a
/// queue pair (the rdma backend's `ibv_post_send` calls, raw replays included) — counted
/// always, recording or not: a benchmark takes the difference around an operation to set
/// its doorbells beside its replay's (on rxe each doorbell is a system call that runs the
/// verbs in the kernel).
pub fn doorbells() -> (u64, u64) {
    DOORBELLS.with(Cell::get)
}

/// Counts one doorbell of `wrs` work requests on this thread (see [`doorbells`]).
#[cfg_attr(not(feature = "rdma"), allow(dead_code))]
pub(crate) fn count_doorbell(wrs: usize) {
    DOORBELLS.with(|d| {
        let (n, w) = d.get();
        d.set((n + 1, w + wrs as u64));
    });
}

/// Completions are time-stamped (for `verbs.wakeup`) once any thread has recorded.
static STAMPS: AtomicBool = AtomicBool::new(false);
static EPOCH: OnceLock<Instant> = OnceLock::new();

/// Starts recording this thread's rounds and times (dropping any recorded before).
pub fn start() {
    start_with(true);
}

/// Starts recording this thread's rounds, and its time spans if `times` (each span reads the
/// clock twice, which costs a system call on some machines: leave them off to record only
/// what a round costs).
pub fn start_with(times: bool) {
    if times {
        STAMPS.store(true, Ordering::Relaxed);
        let _ = EPOCH.get_or_init(Instant::now);
    }
    REC.with(|r| *r.borrow_mut() = Recording::default());
    FLAT.with(|f| f.borrow_mut().clear());
    TIMES.with(|t| t.set(times));
    ON.with(|o| o.set(true));
}

/// Stops recording and returns what was recorded since [`start`].
pub fn take() -> Recording {
    ON.with(|o| o.set(false));
    TIMES.with(|t| t.set(false));
    let mut rec = REC.with(|r| std::mem::take(&mut *r.borrow_mut()));
    rec.rounds = FLAT.with(|f| f.borrow().rounds());
    rec
}

/// Recorded rounds, flat: each round's tag and first batch, each batch's node and first verb.
#[derive(Default)]
struct Flat {
    rounds: Vec<(Tag, usize)>,
    batches: Vec<(NodeId, usize)>,
    verbs: Vec<RecordedVerb>,
}

impl Flat {
    fn clear(&mut self) {
        self.rounds.clear();
        self.batches.clear();
        self.verbs.clear();
    }

    fn rounds(&self) -> Vec<RecordedRound> {
        let batch_end = |b: usize| self.batches.get(b).map_or(self.verbs.len(), |x| x.1);
        let round_end = |r: usize| self.rounds.get(r).map_or(self.batches.len(), |x| x.1);
        (self.rounds.iter().enumerate())
            .map(|(r, &(tag, first))| RecordedRound {
                tag,
                batches: (first..round_end(r + 1))
                    .map(|b| {
                        (
                            self.batches[b].0,
                            self.verbs[self.batches[b].1..batch_end(b + 1)].to_vec(),
                        )
                    })
                    .collect(),
            })
            .collect()
    }
}

fn timing() -> bool {
    TIMES.with(Cell::get)
}

/// Whether this thread records.
pub fn enabled() -> bool {
    ON.with(Cell::get)
}

/// Adds `d` to the span `name` of this thread's recording (if it records).
pub fn add_time(name: &'static str, d: Duration) {
    if !timing() {
        return;
    }
    REC.with(|r| {
        let mut r = r.borrow_mut();
        match r.times.iter_mut().find(|(n, _)| *n == name) {
            Some((_, t)) => *t += d,
            None => r.times.push((name, d)),
        }
    });
}

/// Runs `f`, adding its time to the span `name` when this thread records.
pub fn timed<T>(name: &'static str, f: impl FnOnce() -> T) -> T {
    if !timing() {
        return f();
    }
    let t = Instant::now();
    let out = f();
    add_time(name, t.elapsed());
    out
}

/// [`timed`] for a future: the span covers its whole await (recorded on the thread that
/// finishes it). A plain future rather than an `async fn`: an `async fn` would hold `f`
/// twice in its state (the argument and the awaited copy), doubling every operation's
/// future that passes through it.
pub fn timed_async<F: std::future::Future>(name: &'static str, f: F) -> Timed<F> {
    Timed {
        f,
        name,
        start: None,
    }
}

pin_project_lite::pin_project! {
    /// The future of [`timed_async`].
    #[must_use = "futures do nothing unless awaited"]
    pub struct Timed<F> {
        #[pin]
        f: F,
        name: &'static str,
        start: Option<Instant>,
    }
}

impl<F: std::future::Future> std::future::Future for Timed<F> {
    type Output = F::Output;

    fn poll(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<F::Output> {
        let this = self.project();
        if this.start.is_none() && timing() {
            *this.start = Some(Instant::now());
        }
        let out = std::task::ready!(this.f.poll(cx));
        if let Some(t) = this.start.take() {
            add_time(this.name, t.elapsed());
        }
        std::task::Poll::Ready(out)
    }
}

/// A completion's time stamp (nanoseconds since the first recording; 0 when not stamping).
pub(crate) fn stamp() -> u64 {
    if !STAMPS.load(Ordering::Relaxed) {
        return 0;
    }
    EPOCH
        .get()
        .map_or(0, |e| (e.elapsed().as_nanos() as u64).max(1))
}

/// The waiter took a completion stamped `at`: the hand-over counts as `verbs.wakeup`.
pub(crate) fn woke(at: u64) {
    if at == 0 || !timing() {
        return;
    }
    let now = stamp();
    add_time("verbs.wakeup", Duration::from_nanos(now.saturating_sub(at)));
}

pub(crate) fn round<'a>(tag: Tag, batches: impl IntoIterator<Item = &'a Batch>) {
    FLAT.with(|f| {
        let f = &mut *f.borrow_mut();
        f.rounds.push((tag, f.batches.len()));
        for b in batches {
            f.batches.push((b.node, f.verbs.len()));
            f.verbs.extend(b.ops.iter().map(|o| RecordedVerb {
                kind: match o.kind {
                    OpKind::Read => VerbKind::Read,
                    OpKind::Write { durable } => VerbKind::Write { durable },
                    OpKind::Cas { .. } => VerbKind::Cas,
                    OpKind::Faa { .. } => VerbKind::Faa,
                },
                len: o.len,
            }));
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{RKey, RemoteAddr};

    fn at(node: u16) -> RemoteAddr {
        RemoteAddr {
            node: NodeId(node),
            rkey: RKey(1),
            addr: 64,
        }
    }

    /// Rounds of several batches come back as posted, and a new recording starts empty.
    #[test]
    fn rounds_come_back_as_posted() {
        start_with(false);
        let (mut a, mut b, mut c) = (
            Batch::new(NodeId(0)),
            Batch::new(NodeId(1)),
            Batch::new(NodeId(2)),
        );
        a.write(at(0), b"0123456789");
        a.read(at(0), 16);
        b.cas(at(1), 0, 1);
        round("first", [&a, &b]);
        c.faa(at(2), 1);
        round("second", [&c]);
        round("empty", std::iter::empty());
        let rec = take();
        assert_eq!(rec.rounds.len(), 3);
        let r0 = &rec.rounds[0];
        assert_eq!(r0.tag, "first");
        let kinds: Vec<Vec<(VerbKind, u32)>> = r0
            .batches
            .iter()
            .map(|(_, v)| v.iter().map(|x| (x.kind, x.len)).collect())
            .collect();
        assert_eq!(
            kinds,
            vec![
                vec![
                    (VerbKind::Write { durable: false }, 10),
                    (VerbKind::Read, 16)
                ],
                vec![(VerbKind::Cas, 8)],
            ]
        );
        assert_eq!(r0.batches[1].0, NodeId(1));
        assert_eq!(rec.rounds[1].batches.len(), 1);
        assert_eq!(rec.rounds[1].batches[0].1[0].kind, VerbKind::Faa);
        assert!(rec.rounds[2].batches.is_empty());
        start_with(false);
        assert!(take().rounds.is_empty());
    }
}
