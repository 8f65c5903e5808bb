//! Deterministic simulation: a seeded scheduler that decides, verb by verb, which client
//! thread goes next, and injects faults from the same seed — so a run's interleaving, its
//! faults and therefore its history are a pure function of the seed, and a failing seed
//! replays exactly.
//!
//! Threads take part by [`DetScheduler::register`]ing with a fixed index; the scheduler is
//! attached to a cluster with [`super::SimCluster::set_scheduler`]. From then on every batch
//! and RPC a registered thread posts through that cluster first waits for its *turn*:
//!
//! - A thread is either *running* (its own code, between two verbs), *waiting* for a turn,
//!   *holding* one (its verb executes, synchronously, on its own thread) or *finished*.
//! - A turn is granted only when no thread holds one and every registered thread is waiting
//!   or finished: what a running thread does next can therefore never race with a grant. The
//!   next thread is drawn with a ChaCha8 generator seeded from the seed, among the waiting
//!   threads whose request is due.
//! - The turn is held only while one verb is posted and completed, never across the code
//!   between verbs: a thread that blocks on a mutex or a channel (anything but a verb) is
//!   simply still running, and the scheduler waits for it to reach its next verb or finish.
//!   If a thread *never* gets there — it waits for something a thread waiting for its turn
//!   holds, such as a lock held across a verb — the watchdog panics with the seed.
//! - Time is the step counter. A delayed work request (a [`DetFaults`] deferral, or a
//!   [`super::SimCluster::delay`] rule, converted at [`DetConfig::step_duration`] per step) is
//!   deferred by k steps: its thread waits while other threads' verbs run; nothing sleeps.
//!   Work requests on one connection still execute in posting order.
//! - Faults from the seed: deferrals and drops with set probabilities, and memory-node
//!   failures at chosen steps ([`DetFaults::node_failures`]). Client crashes keep using
//!   [`super::SimCluster::crash_client_after`], which counts verbs and is deterministic here.
//!
//! Threads that did not register (a test's main thread, background threads) are not
//! scheduled: their verbs run at once, as without a scheduler. Whatever they do while the
//! registered threads run is outside the replay, so a deterministic test keeps them idle.
//!
//! Every grant is recorded in a [`Trace`] (thread, verb kinds, nodes, addresses, lengths,
//! atomic operands and results, outcome); two runs of one seed must have equal traces.
//!
//! What the code under test must not do for a seed to replay: decide what to post from a
//! clock (a wall-clock deadline that expires, a lease), from randomness not drawn from the
//! seed, or from the iteration order of a randomly seeded hash map; or post from threads it
//! spawns (they are not registered). Blocking or sleeping is fine: a running thread freezes
//! the schedule until it reaches its next verb. Running the same seed twice and comparing
//! the traces catches all of these.
//!
//! ```
//! use std::sync::Arc;
//! use dmkit_verbs::sim::{DetConfig, DetScheduler, SimCluster, SimConfig};
//! use dmkit_verbs::{Access, DramBacking, MemoryNode, NodeId};
//!
//! fn run(seed: u64) -> (u64, Vec<u64>) {
//!     let cluster = SimCluster::new(SimConfig::default());
//!     let node = Arc::new(MemoryNode::new(NodeId(0)));
//!     let r = node.register(Arc::new(DramBacking::new(4096)), Access::ALL, None).unwrap();
//!     cluster.add_node(node);
//!     let sched = DetScheduler::new(DetConfig::new(seed, 3));
//!     cluster.set_scheduler(Some(sched.clone()));
//!     // Each thread adds its id and records the old values it saw.
//!     let olds: Vec<Vec<u64>> = std::thread::scope(|s| {
//!         let hs: Vec<_> = (0..3u64)
//!             .map(|t| {
//!                 let (cluster, sched) = (&cluster, &sched);
//!                 s.spawn(move || {
//!                     let _me = sched.register(t as usize);
//!                     let ep = cluster.endpoint(t).unwrap();
//!                     (0..4).map(|_| ep.faa("demo", r.at(0), t + 1).unwrap()).collect()
//!                 })
//!             })
//!             .collect();
//!         hs.into_iter().map(|h| h.join().unwrap()).collect()
//!     });
//!     (sched.trace().hash(), olds.concat())
//! }
//! assert_eq!(run(7), run(7)); // the same interleaving, verb for verb
//! ```

use std::cell::RefCell;
use std::collections::hash_map::DefaultHasher;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::DropPoint;
use crate::batch::{Batch, BatchResult};
use crate::error::{Error, Result};
use crate::node::OpKind;
use crate::types::NodeId;

/// Faults the scheduler injects, every decision drawn from the seed.
#[derive(Debug, Clone, Default)]
pub struct DetFaults {
    /// Probability that a batch or RPC is deferred when its turn first comes.
    pub defer_probability: f64,
    /// A deferred request waits 1 to this many steps (at least 1).
    pub max_defer_steps: u64,
    /// Probability that a batch or RPC is dropped (before or after the node executed it,
    /// half and half): the caller gets [`Error::Dropped`].
    pub drop_probability: f64,
    /// Memory nodes that fail (as [`super::SimCluster::fail_node`]) when the step counter
    /// reaches the given step, before that step's verb executes.
    pub node_failures: Vec<(u64, NodeId)>,
}

/// Settings of a [`DetScheduler`].
#[derive(Debug, Clone)]
pub struct DetConfig {
    /// Fixes the interleaving and every injected fault.
    pub seed: u64,
    /// How many threads will register (indices `0..threads`). No turn is granted before all
    /// of them registered (or finished), so the participants never depend on OS timing.
    pub threads: usize,
    pub faults: DetFaults,
    /// How long waiting threads tolerate no progress at all (every registered thread neither
    /// waiting nor finishing) before they panic: a thread that never reaches its next verb is
    /// blocked on something a waiting thread holds. Wall-clock, and only a safety net: it
    /// never influences a run that completes.
    pub watchdog: Duration,
    /// The virtual length of one step: a [`super::SimCluster::delay`] of `d` defers a work
    /// request by `ceil(d / step_duration)` steps.
    pub step_duration: Duration,
    /// How to replay this run (a command line); every panic of the scheduler prints it with
    /// the seed.
    pub replay: String,
}

impl DetConfig {
    /// `threads` threads, no injected faults, a 60 s watchdog, 10 µs steps.
    pub fn new(seed: u64, threads: usize) -> Self {
        Self {
            seed,
            threads,
            faults: DetFaults::default(),
            watchdog: Duration::from_secs(60),
            step_duration: Duration::from_micros(10),
            replay: String::new(),
        }
    }
}

/// The kind of one work request of a traced batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TracedVerb {
    Read,
    Write,
    Cas { expect: u64, new: u64 },
    Faa { add: u64 },
}

/// One work request of a traced batch (rkeys are left out: they are random per
/// registration).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TracedOp {
    pub verb: TracedVerb,
    pub addr: u64,
    pub len: u32,
}

/// What a turn was granted for.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Work {
    /// [`DetScheduler::tick`]: a scheduling point that executes nothing.
    Tick,
    /// A batch of one-sided verbs from client `client` to `node`.
    Batch {
        client: u64,
        node: NodeId,
        ops: Vec<TracedOp>,
    },
    /// An RPC; the request is traced by length and hash.
    Rpc {
        client: u64,
        node: NodeId,
        len: usize,
        hash: u64,
    },
    /// Not a turn: the scheduler failed this memory node at this step.
    NodeFailure(NodeId),
}

impl Work {
    pub(crate) fn batch(client: u64, batch: &Batch) -> Work {
        Work::Batch {
            client,
            node: batch.node,
            ops: batch
                .ops
                .iter()
                .map(|o| TracedOp {
                    verb: match o.kind {
                        OpKind::Read => TracedVerb::Read,
                        OpKind::Write { .. } => TracedVerb::Write,
                        OpKind::Cas { expect, new } => TracedVerb::Cas { expect, new },
                        OpKind::Faa { add } => TracedVerb::Faa { add },
                    },
                    addr: o.addr,
                    len: o.len,
                })
                .collect(),
        }
    }

    pub(crate) fn rpc(client: u64, node: NodeId, req: &[u8]) -> Work {
        let mut h = DefaultHasher::new();
        req.hash(&mut h);
        Work::Rpc {
            client,
            node,
            len: req.len(),
            hash: h.finish(),
        }
    }
}

/// How a traced turn ended.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// Executed; the old values of the batch's atomics (0 for other verbs), or the RPC
    /// reply's length.
    Done(Vec<u64>),
    /// Failed with this error (its kind and node: messages may hold random rkeys).
    Failed(String),
    /// Released to wait this many more steps (a deferral or the connection's order).
    Deferred(u64),
    /// Posted, but its completion is not in yet (a paused node holds it).
    Held,
    /// A tick, or a node failure.
    Marked,
    /// The thread panicked while holding the turn.
    Abandoned,
}

impl Outcome {
    pub(crate) fn of_batch(r: &Result<BatchResult>) -> Outcome {
        match r {
            Ok(b) => Outcome::Done(b.olds.clone()),
            Err(e) => Outcome::failed(e),
        }
    }

    pub(crate) fn of_rpc(r: &Result<Vec<u8>>) -> Outcome {
        match r {
            Ok(v) => Outcome::Done(vec![v.len() as u64]),
            Err(e) => Outcome::failed(e),
        }
    }

    fn failed(e: &Error) -> Outcome {
        let node = e.node().map(|n| n.0 as i32).unwrap_or(-1);
        Outcome::Failed(match e {
            Error::RemoteAccess { index, fault, .. } => {
                format!("remote access (request {index}: {fault}) on node {node}")
            }
            Error::Timeout { .. } => format!("timeout on node {node}"),
            Error::NodeFailed { .. } => format!("node {node} failed"),
            Error::ClientCrashed { client } => format!("client {client} crashed"),
            Error::Dropped { .. } => format!("dropped on node {node}"),
            Error::Disconnected { .. } => format!("disconnected from node {node}"),
            Error::Rpc { .. } => format!("rpc failed on node {node}"),
            other => format!("{other}"),
        })
    }
}

/// One granted turn (or an injected node failure).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TraceEntry {
    /// The scheduler step of the grant.
    pub step: u64,
    /// The registered thread's index (`None` for a node failure).
    pub thread: Option<usize>,
    /// The step at which this work request was first granted (differs from `step` after a
    /// deferral).
    pub posted: u64,
    pub work: Work,
    pub outcome: Outcome,
}

impl fmt::Display for TraceEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "step {:>6} ", self.step)?;
        match self.thread {
            Some(t) => write!(f, "t{t:<2} ")?,
            None => write!(f, "--  ")?,
        }
        match &self.work {
            Work::Tick => write!(f, "tick")?,
            Work::NodeFailure(n) => write!(f, "FAIL node {n}")?,
            Work::Rpc {
                client, node, len, ..
            } => write!(f, "c{client} rpc node {node} ({len} bytes)")?,
            Work::Batch { client, node, ops } => {
                write!(f, "c{client} node {node} [")?;
                for (i, o) in ops.iter().enumerate() {
                    if i > 0 {
                        write!(f, ", ")?;
                    }
                    match o.verb {
                        TracedVerb::Read => write!(f, "READ")?,
                        TracedVerb::Write => write!(f, "WRITE")?,
                        TracedVerb::Cas { expect, new } => write!(f, "CAS {expect:#x}->{new:#x}")?,
                        TracedVerb::Faa { add } => write!(f, "FAA +{add}")?,
                    }
                    write!(f, " @{:#x}/{}", o.addr, o.len)?;
                }
                write!(f, "]")?;
            }
        }
        if self.posted != self.step {
            write!(f, " (posted at step {})", self.posted)?;
        }
        write!(f, " -> {:?}", self.outcome)
    }
}

/// The record of a deterministic run: one entry per granted turn, in step order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Trace {
    pub entries: Vec<TraceEntry>,
}

impl Trace {
    /// A digest of the whole trace: equal for two runs of one seed.
    pub fn hash(&self) -> u64 {
        let mut h = DefaultHasher::new();
        self.entries.hash(&mut h);
        h.finish()
    }

    /// The last `n` entries, one per line (for failure messages).
    pub fn tail(&self, n: usize) -> String {
        let from = self.entries.len().saturating_sub(n);
        self.entries[from..]
            .iter()
            .map(|e| format!("  {e}\n"))
            .collect()
    }

    /// Grants that ran work (batches and RPCs executed, not deferred).
    pub fn verbs(&self) -> usize {
        self.entries
            .iter()
            .filter(|e| {
                matches!(e.work, Work::Batch { .. } | Work::Rpc { .. })
                    && !matches!(e.outcome, Outcome::Deferred(_))
            })
            .count()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Unregistered,
    Running,
    Waiting,
    Holding,
    Finished,
}

#[derive(Debug)]
struct ThreadState {
    phase: Phase,
    /// What it waits for (or holds a turn for).
    work: Option<Work>,
    /// The earliest step its request may be granted at.
    not_before: u64,
    /// The step of its request's first grant (0: not granted yet).
    posted: u64,
    /// The request's trace entry while the turn is held.
    entry: usize,
}

/// Fails a memory node of the attached cluster.
pub(crate) type FailHook = Arc<dyn Fn(NodeId) + Send + Sync>;

struct State {
    threads: Vec<ThreadState>,
    step: u64,
    holder: Option<usize>,
    schedule: ChaCha8Rng,
    faults: ChaCha8Rng,
    /// Node failures not applied yet, by step.
    failures: Vec<(u64, NodeId)>,
    fail_hook: Option<FailHook>,
    trace: Vec<TraceEntry>,
    last_progress: Instant,
    /// Set when the watchdog fired: every scheduled thread panics with it.
    poisoned: Option<String>,
}

struct Shared {
    cfg: DetConfig,
    state: Mutex<State>,
    cv: Condvar,
}

/// The seeded scheduler of the `sim` backend's deterministic mode (see the module docs).
/// Clones share the scheduler.
#[derive(Clone)]
pub struct DetScheduler {
    shared: Arc<Shared>,
}

impl fmt::Debug for DetScheduler {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DetScheduler")
            .field("seed", &self.shared.cfg.seed)
            .field("threads", &self.shared.cfg.threads)
            .finish()
    }
}

thread_local! {
    /// The scheduler this thread registered with, and its index.
    static CURRENT: RefCell<Option<(Arc<Shared>, usize)>> = const { RefCell::new(None) };
}

/// A thread's registration; dropping it (also by unwinding) marks the thread finished.
#[derive(Debug)]
#[must_use = "the thread is finished as soon as this is dropped"]
pub struct DetThread {
    sched: DetScheduler,
    index: usize,
    /// Registration is per thread.
    _not_send: PhantomData<std::rc::Rc<()>>,
}

impl DetThread {
    /// This thread's index.
    pub fn index(&self) -> usize {
        self.index
    }
}

impl Drop for DetThread {
    fn drop(&mut self) {
        CURRENT.with(|c| c.borrow_mut().take());
        let sh = &self.sched.shared;
        let mut st = sh.state.lock();
        if st.holder == Some(self.index) {
            st.holder = None;
        }
        let t = &mut st.threads[self.index];
        t.phase = Phase::Finished;
        t.work = None;
        st.last_progress = Instant::now();
        sh.try_grant(&mut st);
        sh.cv.notify_all();
    }
}

impl DetScheduler {
    /// A scheduler for `cfg.threads` threads.
    pub fn new(cfg: DetConfig) -> Self {
        let mut failures = cfg.faults.node_failures.clone();
        failures.sort_by_key(|(s, n)| (*s, *n));
        let state = State {
            threads: (0..cfg.threads)
                .map(|_| ThreadState {
                    phase: Phase::Unregistered,
                    work: None,
                    not_before: 0,
                    posted: 0,
                    entry: 0,
                })
                .collect(),
            step: 0,
            holder: None,
            schedule: ChaCha8Rng::seed_from_u64(cfg.seed),
            faults: ChaCha8Rng::seed_from_u64(cfg.seed ^ 0xFA17_5EED_D15C_0DE5),
            failures,
            fail_hook: None,
            trace: Vec::new(),
            last_progress: Instant::now(),
            poisoned: None,
        };
        Self {
            shared: Arc::new(Shared {
                cfg,
                state: Mutex::new(state),
                cv: Condvar::new(),
            }),
        }
    }

    /// The seed.
    pub fn seed(&self) -> u64 {
        self.shared.cfg.seed
    }

    /// The settings.
    pub fn config(&self) -> &DetConfig {
        &self.shared.cfg
    }

    /// Registers the calling thread as participant `index`. Panics if the index is out of
    /// range or taken, or the thread is already registered.
    pub fn register(&self, index: usize) -> DetThread {
        assert!(
            index < self.shared.cfg.threads,
            "thread index {index} out of range: the scheduler was made for {} threads",
            self.shared.cfg.threads
        );
        CURRENT.with(|c| {
            let mut c = c.borrow_mut();
            assert!(c.is_none(), "this thread is already registered");
            *c = Some((self.shared.clone(), index));
        });
        let sh = &self.shared;
        let mut st = sh.state.lock();
        assert_eq!(
            st.threads[index].phase,
            Phase::Unregistered,
            "thread index {index} is already taken"
        );
        st.threads[index].phase = Phase::Running;
        st.last_progress = Instant::now();
        DetThread {
            sched: self.clone(),
            index,
            _not_send: PhantomData,
        }
    }

    /// A scheduling point that executes nothing; returns the step it was granted at. Use it
    /// as the clock of a history: one tick when an operation is called and one when it
    /// returns give a total order that is the same in every run of the seed. On a thread
    /// that did not register, returns the current step at once.
    pub fn tick(&self) -> u64 {
        match self.turn(|| Work::Tick) {
            Some(t) => {
                let step = t.step;
                t.finish(Outcome::Marked);
                step
            }
            None => self.step(),
        }
    }

    /// The step counter (the number of the last grant, skipped steps included).
    pub fn step(&self) -> u64 {
        self.shared.state.lock().step
    }

    /// The trace so far.
    pub fn trace(&self) -> Trace {
        Trace {
            entries: self.shared.state.lock().trace.clone(),
        }
    }

    /// Steps a delay of `d` stands for (at least 1).
    pub(crate) fn steps_for(&self, d: Duration) -> u64 {
        let per = self.shared.cfg.step_duration.as_nanos().max(1);
        (d.as_nanos().div_ceil(per) as u64).max(1)
    }

    pub(crate) fn set_fail_hook(&self, hook: Option<FailHook>) {
        self.shared.state.lock().fail_hook = hook;
    }

    /// Whether the calling thread is registered here and not inside a turn already.
    fn current_index(&self) -> Option<usize> {
        CURRENT.with(|c| {
            c.borrow()
                .as_ref()
                .filter(|(s, _)| Arc::ptr_eq(s, &self.shared))
                .map(|(_, i)| *i)
        })
    }

    /// Waits for the calling thread's turn to do `work`. `None` if the thread is not
    /// registered with this scheduler, or already holds a turn (nested work, such as an RPC
    /// handler posting, runs inside the outer turn).
    pub(crate) fn turn(&self, work: impl FnOnce() -> Work) -> Option<Turn> {
        let me = self.current_index()?;
        let sh = &self.shared;
        let mut st = sh.state.lock();
        if st.threads[me].phase != Phase::Running {
            return None;
        }
        let t = &mut st.threads[me];
        t.phase = Phase::Waiting;
        t.work = Some(work());
        t.not_before = 0;
        t.posted = 0;
        st.last_progress = Instant::now();
        sh.try_grant(&mut st);
        Some(sh.wait_turn(st, me, self.clone()))
    }
}

impl Shared {
    fn panic_message(&self, what: &str) -> String {
        let replay = if self.cfg.replay.is_empty() {
            String::new()
        } else {
            format!("; replay with: {}", self.cfg.replay)
        };
        format!(
            "deterministic scheduler (seed {}): {what}{replay}",
            self.cfg.seed
        )
    }

    /// Grants the next turn if the state is quiescent. Called, under the lock, after every
    /// change; whichever thread calls it, the decision depends only on the state.
    fn try_grant(&self, st: &mut State) {
        if st.holder.is_some() || st.poisoned.is_some() {
            return;
        }
        if st
            .threads
            .iter()
            .any(|t| matches!(t.phase, Phase::Unregistered | Phase::Running))
        {
            return;
        }
        let waiting: Vec<usize> = (0..st.threads.len())
            .filter(|&i| st.threads[i].phase == Phase::Waiting)
            .collect();
        let Some(due) = waiting.iter().map(|&i| st.threads[i].not_before).min() else {
            return;
        };
        // Nothing due yet: time passes idle up to the earliest deferred request.
        if due > st.step + 1 {
            st.step = due - 1;
        }
        let eligible: Vec<usize> = waiting
            .into_iter()
            .filter(|&i| st.threads[i].not_before <= st.step + 1)
            .collect();
        let pick = eligible[st.schedule.random_range(0..eligible.len())];
        st.step += 1;
        let step = st.step;
        while st.failures.first().is_some_and(|(s, _)| *s <= step) {
            let (_, node) = st.failures.remove(0);
            if let Some(h) = &st.fail_hook {
                h(node);
            }
            st.trace.push(TraceEntry {
                step,
                thread: None,
                posted: step,
                work: Work::NodeFailure(node),
                outcome: Outcome::Marked,
            });
        }
        let entry = st.trace.len();
        let t = &mut st.threads[pick];
        t.phase = Phase::Holding;
        if t.posted == 0 {
            t.posted = step;
        }
        t.entry = entry;
        let (posted, work) = (t.posted, t.work.clone().expect("a waiting thread has work"));
        st.trace.push(TraceEntry {
            step,
            thread: Some(pick),
            posted,
            work,
            outcome: Outcome::Held,
        });
        st.holder = Some(pick);
        st.last_progress = Instant::now();
        self.cv.notify_all();
    }

    /// Blocks until `me` holds the turn, or panics when the watchdog fires.
    fn wait_turn(
        &self,
        mut st: parking_lot::MutexGuard<'_, State>,
        me: usize,
        sched: DetScheduler,
    ) -> Turn {
        loop {
            if let Some(msg) = &st.poisoned {
                let msg = msg.clone();
                st.threads[me].phase = Phase::Running;
                drop(st);
                panic!("{msg}");
            }
            if st.threads[me].phase == Phase::Holding {
                let t = &st.threads[me];
                let fresh = t.posted == st.step;
                let mut turn = Turn {
                    sched,
                    me,
                    step: st.step,
                    posted: t.posted,
                    defer: 0,
                    drop: None,
                    released: false,
                };
                let batch_or_rpc = matches!(t.work, Some(Work::Batch { .. } | Work::Rpc { .. }));
                if fresh && batch_or_rpc {
                    let f = &self.cfg.faults;
                    if f.defer_probability > 0.0 && st.faults.random_bool(f.defer_probability) {
                        turn.defer = st.faults.random_range(1..=f.max_defer_steps.max(1));
                    }
                    if f.drop_probability > 0.0 && st.faults.random_bool(f.drop_probability) {
                        turn.drop = Some(if st.faults.random_bool(0.5) {
                            DropPoint::BeforeExecute
                        } else {
                            DropPoint::AfterExecute
                        });
                    }
                }
                return turn;
            }
            let timeout = self.cfg.watchdog;
            let stalled = st.last_progress.elapsed();
            if stalled >= timeout {
                let states: Vec<String> = st
                    .threads
                    .iter()
                    .enumerate()
                    .map(|(i, t)| match t.phase {
                        Phase::Waiting => format!("t{i} waits for a turn"),
                        Phase::Running => format!("t{i} runs and has not reached a verb"),
                        Phase::Holding => format!("t{i} holds the turn"),
                        Phase::Finished => format!("t{i} finished"),
                        Phase::Unregistered => format!("t{i} never registered"),
                    })
                    .collect();
                let trace = Trace {
                    entries: st.trace.clone(),
                };
                let msg = self.panic_message(&format!(
                    "no progress for {timeout:?} at step {} ({}): a thread blocked outside a \
                     verb waits for something a waiting thread holds (a lock held across a \
                     verb?) or never registered; last grants:\n{}",
                    st.step,
                    states.join(", "),
                    trace.tail(12)
                ));
                st.poisoned = Some(msg);
                self.cv.notify_all();
                continue;
            }
            let left = timeout - stalled;
            self.cv
                .wait_for(&mut st, left.min(Duration::from_millis(200)));
        }
    }
}

/// A granted turn: the holder's verb executes while it lives.
pub(crate) struct Turn {
    sched: DetScheduler,
    me: usize,
    /// The step of this grant.
    pub step: u64,
    /// The step of the request's first grant: unique per request, its place in line.
    pub posted: u64,
    /// Steps the scheduler defers this request by (decided at its first grant).
    pub defer: u64,
    /// Whether the scheduler drops it (decided at its first grant).
    pub drop: Option<DropPoint>,
    released: bool,
}

impl fmt::Debug for Turn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Turn")
            .field("thread", &self.me)
            .field("step", &self.step)
            .finish()
    }
}

impl Turn {
    /// Records how the work ended and gives the turn back.
    pub fn finish(mut self, outcome: Outcome) {
        self.release(outcome, None);
    }

    /// Gives the turn back and waits `steps` more steps (at least one) for the next one.
    pub fn defer(mut self, steps: u64) -> Turn {
        let steps = steps.max(1);
        self.release(Outcome::Deferred(steps), Some(steps));
        let sh = &self.sched.shared;
        let st = sh.state.lock();
        sh.wait_turn(st, self.me, self.sched.clone())
    }

    fn release(&mut self, outcome: Outcome, wait: Option<u64>) {
        if self.released {
            return;
        }
        self.released = true;
        let sh = &self.sched.shared;
        let mut st = sh.state.lock();
        let step = st.step;
        let t = &mut st.threads[self.me];
        let entry = t.entry;
        match wait {
            Some(k) => {
                t.phase = Phase::Waiting;
                t.not_before = step + k + 1;
            }
            None => {
                t.phase = Phase::Running;
                t.work = None;
            }
        }
        if let Some(e) = st.trace.get_mut(entry) {
            e.outcome = outcome;
        }
        if st.holder == Some(self.me) {
            st.holder = None;
        }
        st.last_progress = Instant::now();
        sh.try_grant(&mut st);
        sh.cv.notify_all();
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        self.release(Outcome::Abandoned, None);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::{SimCluster, SimConfig};
    use crate::{Access, DramBacking, Endpoint, MemoryNode, RegionDesc};

    const N0: NodeId = NodeId(0);

    fn cluster() -> (SimCluster, RegionDesc) {
        let c = SimCluster::new(SimConfig::default());
        let node = Arc::new(MemoryNode::new(N0));
        let r = node
            .register(Arc::new(DramBacking::new(1 << 16)), Access::ALL, None)
            .unwrap();
        c.add_node(node);
        (c, r)
    }

    fn word(ep: &Endpoint, r: &RegionDesc, off: u64) -> u64 {
        u64::from_le_bytes(ep.read("peek", r.at(off), 8).unwrap().try_into().unwrap())
    }

    /// Three threads race: each appends its id to a shared log through a FAA-claimed index
    /// and CASes a "last writer" word. Returns the trace and the log's order.
    fn race(cfg: DetConfig) -> (Trace, Vec<u64>) {
        let (c, r) = cluster();
        let sched = DetScheduler::new(cfg);
        c.set_scheduler(Some(sched.clone()));
        std::thread::scope(|s| {
            for t in 0..3u64 {
                let (c, sched) = (&c, &sched);
                s.spawn(move || {
                    let _me = sched.register(t as usize);
                    let ep = c.endpoint(t + 1).unwrap();
                    for _ in 0..5 {
                        let i = ep.faa("t", r.at(0), 1).unwrap();
                        ep.write("t", r.at(64 + 8 * i), &(t + 1).to_le_bytes())
                            .unwrap();
                        let last = word(&ep, &r, 8);
                        ep.cas("t", r.at(8), last, t + 1).unwrap();
                    }
                });
            }
        });
        c.set_scheduler(None);
        let ep = c.endpoint(99).unwrap();
        let log = (0..15).map(|i| word(&ep, &r, 64 + 8 * i)).collect();
        (sched.trace(), log)
    }

    #[test]
    fn one_seed_gives_one_interleaving() {
        for seed in [1, 2, 3] {
            let (t1, log1) = race(DetConfig::new(seed, 3));
            let (t2, log2) = race(DetConfig::new(seed, 3));
            assert_eq!(t1, t2, "seed {seed}: traces differ");
            assert_eq!(t1.hash(), t2.hash());
            assert_eq!(log1, log2, "seed {seed}");
            // 3 threads x 5 rounds x 4 verbs.
            assert_eq!(t1.verbs(), 60);
        }
    }

    #[test]
    fn different_seeds_interleave_differently() {
        let logs: std::collections::HashSet<Vec<u64>> =
            (0..8).map(|seed| race(DetConfig::new(seed, 3)).1).collect();
        assert!(logs.len() > 4, "only {} distinct interleavings", logs.len());
    }

    #[test]
    fn a_thread_that_finishes_early_or_panics_does_not_stall_the_others() {
        let (c, r) = cluster();
        let sched = DetScheduler::new(DetConfig::new(5, 4));
        c.set_scheduler(Some(sched.clone()));
        let panicked = std::thread::scope(|s| {
            let mut hs = Vec::new();
            for t in 0..4u64 {
                let (c, sched) = (&c, &sched);
                hs.push(s.spawn(move || {
                    let _me = sched.register(t as usize);
                    let ep = c.endpoint(t + 1).unwrap();
                    // Thread 0 does no verb at all, thread 1 panics after two.
                    for i in 0..t * 5 {
                        ep.faa("t", r.at(0), 1).unwrap();
                        assert!(!(t == 1 && i == 1), "thread 1 crashes");
                    }
                }));
            }
            hs.into_iter().filter_map(|h| h.join().err()).count()
        });
        assert_eq!(panicked, 1);
        let ep = c.endpoint(99).unwrap();
        assert_eq!(word(&ep, &r, 0), 2 + 10 + 15);
    }

    #[test]
    fn a_thread_blocked_outside_a_verb_is_waited_for_and_the_run_stays_deterministic() {
        let run = || {
            let (c, r) = cluster();
            let sched = DetScheduler::new(DetConfig::new(11, 2));
            c.set_scheduler(Some(sched.clone()));
            let gate = std::sync::Mutex::new(());
            let (tx, rx) = std::sync::mpsc::channel::<u64>();
            std::thread::scope(|s| {
                let (c1, s1, g1) = (&c, &sched, &gate);
                s.spawn(move || {
                    let _me = s1.register(0);
                    let ep = c1.endpoint(1).unwrap();
                    for i in 0..6 {
                        // Holds a lock (not across a verb) while it takes its time, and
                        // hands the other thread a value before its own verb.
                        let g = g1.lock().unwrap();
                        std::thread::sleep(Duration::from_millis(2));
                        drop(g);
                        tx.send(i).unwrap();
                        ep.faa("t", r.at(0), 1).unwrap();
                    }
                });
                let (c2, s2, g2) = (&c, &sched, &gate);
                s.spawn(move || {
                    let _me = s2.register(1);
                    let ep = c2.endpoint(2).unwrap();
                    for _ in 0..6 {
                        // Blocks on the other thread's lock and on its channel: still
                        // running, so no turn is granted meanwhile.
                        drop(g2.lock().unwrap());
                        let got = rx.recv().unwrap();
                        let seen = ep.faa("t", r.at(0), 100).unwrap();
                        ep.write("t", r.at(8), &(seen + got).to_le_bytes()).unwrap();
                    }
                });
            });
            sched.trace()
        };
        let a = run();
        assert_eq!(a.verbs(), 18);
        assert_eq!(a, run());
    }

    #[test]
    fn a_slow_running_thread_is_waited_for_before_the_next_grant() {
        // Thread 1 dawdles before its first verb; thread 0 posts at once. A scheduler that
        // granted the only waiting thread would always pick thread 0 first.
        let firsts: std::collections::HashSet<usize> = (0..8)
            .map(|seed| {
                let (c, r) = cluster();
                let sched = DetScheduler::new(DetConfig::new(seed, 2));
                c.set_scheduler(Some(sched.clone()));
                std::thread::scope(|s| {
                    for t in 0..2 {
                        let (c, sched) = (&c, &sched);
                        s.spawn(move || {
                            let _me = sched.register(t);
                            let ep = c.endpoint(t as u64 + 1).unwrap();
                            if t == 1 {
                                std::thread::sleep(Duration::from_millis(20));
                            }
                            ep.faa("t", r.at(0), 1).unwrap();
                        });
                    }
                });
                sched.trace().entries[0].thread.unwrap()
            })
            .collect();
        assert_eq!(firsts.len(), 2, "the first grant always went to {firsts:?}");
    }

    #[test]
    fn a_lock_held_across_a_verb_trips_the_watchdog_with_the_seed() {
        let (c, r) = cluster();
        let mut cfg = DetConfig::new(4242, 2);
        cfg.watchdog = Duration::from_millis(300);
        cfg.replay = "DMKIT_DET_SEED=4242 cargo test".into();
        let sched = DetScheduler::new(cfg);
        c.set_scheduler(Some(sched.clone()));
        let lock = std::sync::Mutex::new(());
        let (held_tx, held_rx) = std::sync::mpsc::channel::<()>();
        let msgs: Vec<String> = std::thread::scope(|s| {
            let (c1, s1, l1) = (&c, &sched, &lock);
            let a = s.spawn(move || {
                let _me = s1.register(0);
                let ep = c1.endpoint(1).unwrap();
                let _g = l1.lock().unwrap();
                held_tx.send(()).unwrap();
                // Waits for its turn while thread 1 waits for this lock: a deadlock.
                ep.faa("t", r.at(0), 1).unwrap();
            });
            let (c2, s2, l2) = (&c, &sched, &lock);
            let b = s.spawn(move || {
                let _me = s2.register(1);
                let ep = c2.endpoint(2).unwrap();
                held_rx.recv().unwrap();
                let g = l2.lock();
                ep.faa("t", r.at(0), 1).unwrap();
                drop(g);
            });
            [a.join(), b.join()]
                .into_iter()
                .filter_map(|r| r.err())
                .map(|p| {
                    p.downcast_ref::<String>()
                        .cloned()
                        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                        .unwrap_or_default()
                })
                .collect()
        });
        assert!(!msgs.is_empty(), "the deadlock went unnoticed");
        assert!(
            msgs[0].contains("seed 4242") && msgs[0].contains("DMKIT_DET_SEED=4242"),
            "{msgs:?}"
        );
    }

    #[test]
    fn delays_are_steps_not_time_and_keep_each_connections_order() {
        let run = || {
            let (c, r) = cluster();
            let mut cfg = DetConfig::new(8, 2);
            cfg.faults.defer_probability = 0.5;
            cfg.faults.max_defer_steps = 6;
            let sched = DetScheduler::new(cfg);
            c.set_scheduler(Some(sched.clone()));
            // A rule of one hour: in deterministic mode it costs steps, not time.
            c.delay(Some(N0), Duration::from_secs(3600), Some(3));
            // Both threads share one endpoint (one connection to the node).
            let ep = c.endpoint(1).unwrap();
            let t0 = Instant::now();
            std::thread::scope(|s| {
                for t in 0..2u64 {
                    let (ep, sched) = (&ep, &sched);
                    s.spawn(move || {
                        let _me = sched.register(t as usize);
                        for _ in 0..10 {
                            ep.faa("t", r.at(8 * t), 1).unwrap();
                        }
                    });
                }
            });
            assert!(t0.elapsed() < Duration::from_secs(60));
            assert_eq!(word(&ep, &r, 0), 10);
            sched.trace()
        };
        let trace = run();
        assert_eq!(trace, run());
        let deferred = trace
            .entries
            .iter()
            .filter(|e| matches!(e.outcome, Outcome::Deferred(_)))
            .count();
        assert!(deferred >= 3, "{deferred} deferrals");
        // Executions on the shared connection happen in the order the requests were posted.
        let posted: Vec<u64> = trace
            .entries
            .iter()
            .filter(|e| matches!(e.outcome, Outcome::Done(_)))
            .map(|e| e.posted)
            .collect();
        assert_eq!(posted.len(), 20);
        assert!(posted.windows(2).all(|w| w[0] < w[1]), "{posted:?}");
    }

    #[test]
    fn ticks_are_a_clock_and_unregistered_threads_are_not_scheduled() {
        let (c, r) = cluster();
        let sched = DetScheduler::new(DetConfig::new(3, 2));
        c.set_scheduler(Some(sched.clone()));
        // The main thread is not registered: its verbs run at once, its tick does not wait.
        let main = c.endpoint(9).unwrap();
        main.faa("t", r.at(0), 1).unwrap();
        assert_eq!(sched.tick(), 0);
        let ticks: Vec<Vec<u64>> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..2)
                .map(|t| {
                    let (c, sched) = (&c, &sched);
                    s.spawn(move || {
                        let _me = sched.register(t);
                        let ep = c.endpoint(t as u64 + 1).unwrap();
                        let mut v = vec![sched.tick()];
                        ep.faa("t", r.at(0), 1).unwrap();
                        v.push(sched.tick());
                        v
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let mut all: Vec<u64> = ticks.concat();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), 4, "ticks are unique steps: {ticks:?}");
        assert!(ticks.iter().all(|v| v[0] < v[1]));
        assert_eq!(sched.trace().verbs(), 2);
    }
}
