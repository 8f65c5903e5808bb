//! Completions: a [`Pending`] is the handle of posted work; it is fulfilled by the backend and
//! waited on, with a bounded timeout, by the caller — blocking ([`Pending::wait`]) or as a
//! [`Future`] (`.await`), which any executor can drive: the backend's delivering thread wakes
//! the task (sim: inline or its timer; tcp: the connection's reader; rdma: the CQ poller,
//! which sleeps on the completion channel). A future's timeout is kept by [`timer`], one
//! process-wide thread, so no runtime is needed.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use crate::error::{Error, Result};
use crate::types::NodeId;

type Callback<T> = Box<dyn FnOnce(&Result<T>) + Send>;

struct SlotState<T> {
    result: Option<Result<T>>,
    callback: Option<Callback<T>>,
    /// The task awaiting the completion.
    waker: Option<Waker>,
}

/// Where a backend delivers one completion.
pub(crate) struct Slot<T> {
    state: Mutex<SlotState<T>>,
    cv: Condvar,
    /// Set once a result has been delivered: a spinning waiter checks it without the lock.
    delivered: AtomicBool,
    /// When the completion was delivered ([`crate::record`]'s wake-up figures; 0 unless
    /// some thread records).
    done_at: std::sync::atomic::AtomicU64,
}

impl<T> Slot<T> {
    pub fn new() -> Arc<Self> {
        Arc::new(Self {
            state: Mutex::new(SlotState {
                result: None,
                callback: None,
                waker: None,
            }),
            cv: Condvar::new(),
            delivered: AtomicBool::new(false),
            done_at: std::sync::atomic::AtomicU64::new(0),
        })
    }

    /// Delivers the completion; later deliveries (a response after a timeout) are ignored.
    pub fn complete(&self, r: Result<T>) {
        let mut s = self.state.lock();
        if s.result.is_some() {
            return;
        }
        if let Some(cb) = s.callback.take() {
            cb(&r);
        }
        s.result = Some(r);
        self.done_at
            .store(crate::record::stamp(), Ordering::Relaxed);
        self.delivered.store(true, Ordering::Release);
        self.cv.notify_all();
        let waker = s.waker.take();
        drop(s);
        if let Some(w) = waker {
            w.wake();
        }
    }

    /// The result if it has arrived; otherwise `waker` is woken when it does.
    fn poll_take(&self, waker: &Waker) -> Option<Result<T>> {
        let mut s = self.state.lock();
        if let Some(r) = s.result.take() {
            s.waker = None;
            return Some(r);
        }
        match &mut s.waker {
            Some(w) if w.will_wake(waker) => {}
            w => *w = Some(waker.clone()),
        }
        None
    }

    pub fn is_complete(&self) -> bool {
        self.state.lock().result.is_some()
    }

    fn on_complete(&self, cb: Callback<T>) {
        let mut s = self.state.lock();
        match &s.result {
            Some(r) => cb(r),
            None => s.callback = Some(cb),
        }
    }

    fn take(&self) -> Option<Result<T>> {
        if !self.delivered.load(Ordering::Acquire) {
            return None;
        }
        self.state.lock().result.take()
    }

    fn wait_until(&self, deadline: Instant) -> Option<Result<T>> {
        let mut s = self.state.lock();
        loop {
            if let Some(r) = s.result.take() {
                return Some(r);
            }
            if self.cv.wait_until(&mut s, deadline).timed_out() {
                return s.result.take();
            }
        }
    }
}

/// Called when a wait times out, so the backend can treat the path as broken (like an RC QP
/// whose retry count is exceeded).
pub(crate) type TimeoutHook = Arc<dyn Fn() + Send + Sync>;

/// Drives the backend's completion queue from the waiting thread (true if it found
/// something). Backends whose completions need polling (rdma) give one, so a waiter polls
/// instead of sleeping until another thread wakes it: one thread handoff less per verb.
pub(crate) type Progress = Arc<dyn Fn() -> bool + Send + Sync>;

/// How long a waiter with a progress hook polls before it also sleeps between polls:
/// `DMKIT_VERBS_SPIN_US` (default 200 µs — many round trips on hardware; an emulated NIC's
/// round trip is longer), read once.
fn spin() -> Duration {
    static SPIN: std::sync::OnceLock<Duration> = std::sync::OnceLock::new();
    *SPIN.get_or_init(|| env_us("DMKIT_VERBS_SPIN_US", 200))
}

/// How long a waiter sleeps between polls once it has spun for [`spin`]:
/// `DMKIT_VERBS_NAP_US` (default 500 µs), read once.
fn nap() -> Duration {
    static NAP: std::sync::OnceLock<Duration> = std::sync::OnceLock::new();
    *NAP.get_or_init(|| env_us("DMKIT_VERBS_NAP_US", 500))
}

/// Microseconds from the environment variable `name` (a bad value is reported once and the
/// default kept).
fn env_us(name: &str, default: u64) -> Duration {
    let us = match std::env::var(name) {
        Ok(v) => v.trim().parse::<u64>().unwrap_or_else(|_| {
            tracing::warn!("{name}={v:?} is not a number of microseconds; using {default}");
            default
        }),
        Err(_) => default,
    };
    Duration::from_micros(us)
}

/// While spinning, a waiter reads the clock (for its timeout and for [`spin`]) once per this
/// many polls.
const CLOCK_EVERY: u32 = 64;

enum State<T> {
    Ready(Result<T>),
    Waiting(Arc<Slot<T>>),
    Done,
}

/// Posted work that has not been waited for yet.
pub struct Pending<T> {
    state: State<T>,
    node: NodeId,
    timeout: Duration,
    on_timeout: Option<TimeoutHook>,
    progress: Option<Progress>,
    /// The completion is delivered by another thread soon (tcp: the connection's reader): a
    /// waiter with nothing to poll watches for it for [`spin`] before it sleeps.
    spin: bool,
    /// Modeled completion time in virtual nanoseconds (sim with a latency model).
    pub(crate) modeled_done: Option<u64>,
    /// The timeout armed on [`timer`] while the future is awaited (disarmed when dropped).
    armed: Option<timer::Armed>,
    /// Polled before and found waiting (the completion, when it comes, is handed over).
    waited: bool,
}

impl<T> std::fmt::Debug for Pending<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pending")
            .field("node", &self.node)
            .field("waiting", &matches!(self.state, State::Waiting(_)))
            .finish()
    }
}

/// The delivering half of [`Pending::channel`]: a backend completes the posted work through it,
/// from any thread, once. Dropped without completing (a backend that lost the work), it fails
/// the work with [`Error::Disconnected`] rather than leaving its waiter to time out.
pub struct Completer<T> {
    slot: Option<Arc<Slot<T>>>,
    node: NodeId,
}

impl<T> std::fmt::Debug for Completer<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Completer")
            .field("node", &self.node)
            .finish()
    }
}

impl<T> Completer<T> {
    /// Delivers the completion: wakes the task or thread waiting on the [`Pending`]. (A
    /// completion after the waiter timed out is ignored.)
    pub fn complete(mut self, r: Result<T>) {
        if let Some(s) = self.slot.take() {
            s.complete(r);
        }
    }
}

impl<T> Drop for Completer<T> {
    fn drop(&mut self) {
        if let Some(s) = self.slot.take() {
            s.complete(Err(Error::Disconnected {
                node: self.node,
                reason: "the backend dropped the work without completing it".into(),
            }));
        }
    }
}

impl<T: Send + 'static> Pending<T> {
    /// Work that completed as it was posted (or failed to post): a backend returns this when
    /// it has the result at once.
    pub fn ready(node: NodeId, r: Result<T>) -> Self {
        Self {
            state: State::Ready(r),
            node,
            timeout: Duration::MAX,
            on_timeout: None,
            progress: None,
            spin: false,
            modeled_done: None,
            armed: None,
            waited: false,
        }
    }

    /// Work in flight, and the [`Completer`] through which a backend delivers its result:
    /// waiting on the `Pending` (blocking or `.await`) fails with [`Error::Timeout`] after
    /// `timeout`. What a backend outside this crate returns from
    /// [`crate::Connection::post`] and [`crate::Connection::rpc`].
    pub fn channel(node: NodeId, timeout: Duration) -> (Self, Completer<T>) {
        let slot = Slot::new();
        (
            Self::waiting(node, slot.clone(), timeout, None),
            Completer {
                slot: Some(slot),
                node,
            },
        )
    }

    pub(crate) fn waiting(
        node: NodeId,
        slot: Arc<Slot<T>>,
        timeout: Duration,
        on_timeout: Option<TimeoutHook>,
    ) -> Self {
        Self {
            state: State::Waiting(slot),
            node,
            timeout,
            on_timeout,
            progress: None,
            spin: false,
            modeled_done: None,
            armed: None,
            waited: false,
        }
    }

    /// The node the work went to.
    pub fn node(&self) -> NodeId {
        self.node
    }

    /// Whether the completion has arrived (waiting will not block).
    pub fn is_ready(&self) -> bool {
        match &self.state {
            State::Ready(_) | State::Done => true,
            State::Waiting(s) => s.is_complete(),
        }
    }

    /// Blocks until the completion arrives, or fails with [`Error::Timeout`] after the
    /// connection's timeout.
    pub fn wait(self) -> Result<T> {
        let t = self.timeout;
        self.wait_timeout(t)
    }

    /// Like [`Pending::wait`] with an explicit bound.
    pub fn wait_timeout(self, timeout: Duration) -> Result<T> {
        if let State::Ready(_) = self.state {
            return self.wait_inner(timeout);
        }
        // (On a runtime's worker, the wait moves off it: see `runtime::blocking`.)
        crate::runtime::blocking(move || self.wait_inner(timeout))
    }

    fn wait_inner(mut self, timeout: Duration) -> Result<T> {
        // Nothing may wait on verbs this thread still holds back.
        crate::doorbell::ring_deferred();
        match std::mem::replace(&mut self.state, State::Done) {
            State::Ready(r) => r,
            State::Done => Err(Error::InvalidArgument("completion already taken".into())),
            State::Waiting(slot) => {
                // (Only a completion that arrived while we waited is a wake-up.)
                let arrived_before = slot.delivered.load(Ordering::Acquire);
                let far = |t: Instant| {
                    t.checked_add(timeout)
                        .unwrap_or_else(|| t + Duration::from_secs(86400 * 365))
                };
                let got = match &self.progress {
                    None => {
                        if self.spin {
                            spin_until(spin(), || slot.delivered.load(Ordering::Acquire));
                        }
                        slot.wait_until(far(Instant::now()))
                    }
                    // The clock is read only every `CLOCK_EVERY` polls while spinning (and
                    // before each nap): on emulated machines a clock read is a system call,
                    // dearer than the poll itself.
                    Some(p) => {
                        let mut start = None;
                        let (mut polls, mut napping) = (0u32, false);
                        loop {
                            if let Some(r) = slot.take() {
                                break Some(r);
                            }
                            let busy = p();
                            if busy {
                                if let Some(r) = slot.take() {
                                    break Some(r);
                                }
                            }
                            polls = polls.wrapping_add(1);
                            if !napping && polls % CLOCK_EVERY != 0 {
                                std::hint::spin_loop();
                                continue;
                            }
                            let now = Instant::now();
                            let start = *start.get_or_insert(now);
                            let deadline = far(start);
                            if now >= deadline {
                                break slot.take();
                            }
                            napping = !busy && now - start > spin();
                            if napping {
                                let nap = (now + nap()).min(deadline);
                                if let Some(r) = slot.wait_until(nap) {
                                    break Some(r);
                                }
                            } else {
                                std::hint::spin_loop();
                            }
                        }
                    }
                };
                match got {
                    Some(r) => {
                        if !arrived_before {
                            crate::record::woke(slot.done_at.load(Ordering::Relaxed));
                        }
                        r
                    }
                    None => {
                        // Deliver the timeout through the slot: callbacks (staging release)
                        // run, and a late completion is ignored. Then let the backend give
                        // up on the path.
                        slot.complete(Err(Error::Timeout {
                            node: self.node,
                            after: timeout,
                        }));
                        if let Some(h) = &self.on_timeout {
                            h();
                        }
                        slot.take().unwrap_or(Err(Error::Timeout {
                            node: self.node,
                            after: timeout,
                        }))
                    }
                }
            }
        }
    }

    /// Lets the waiter drive completions itself (see [`Progress`]).
    #[cfg_attr(not(feature = "rdma"), allow(dead_code))]
    pub(crate) fn with_progress(mut self, p: Progress) -> Self {
        self.progress = Some(p);
        self
    }

    /// The completion comes from another thread soon (tcp: the connection's reader thread):
    /// a waiter with nothing to poll watches for it for [`spin`] (`DMKIT_VERBS_SPIN_US`)
    /// before it sleeps, sparing the round trip the wake-up of a sleeping thread.
    pub(crate) fn spinning(mut self) -> Self {
        self.spin = true;
        self
    }

    /// Runs `cb` when the completion arrives (at once if it already has), on whichever thread
    /// delivers it. The result itself stays available to `wait`.
    pub(crate) fn on_complete(&self, cb: impl FnOnce(&Result<T>) + Send + 'static) {
        match &self.state {
            State::Ready(r) => cb(r),
            State::Waiting(s) => s.on_complete(Box::new(cb)),
            State::Done => {}
        }
    }

    /// Maps the value of a successful completion, once waited.
    pub(crate) fn modeled(mut self, at: Option<u64>) -> Self {
        self.modeled_done = at;
        self
    }
}

/// The most completion queues one [`block_on`] drives itself (one per connection an
/// operation in flight waits on; more wait for their poll threads).
const PROGRESS_MAX: usize = 8;

thread_local! {
    /// The progress hooks of the completions polled on this thread since the last wait that
    /// were not ready (rdma), one per connection: [`block_on`] drives them all while it
    /// waits, as [`Pending::wait`] drives its own. (Driving only the last one left the other
    /// connections' completions to their poll threads: a thread handoff per completion, and
    /// on a busy or emulated host a spinning waiter starving the threads it waited for.)
    static PROGRESS: std::cell::RefCell<Vec<Progress>> = const { std::cell::RefCell::new(Vec::new()) };
}

thread_local! {
    /// A completion polled on this thread since the last wait was not ready and comes from
    /// another thread soon ([`Pending::spinning`]): [`block_on`] watches for it before parking.
    static SPIN: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

thread_local! {
    /// A [`Pending`] left its timeout unarmed in the current [`block_on`] poll.
    static UNARMED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

thread_local! {
    /// The waker of the [`block_on`] polling on this thread (by its data pointer; null when
    /// none), while that poll leaves timeouts unarmed: it polls once more, arming them, when
    /// its spin ends. A [`Pending`] with a progress hook polled with that very waker need not
    /// arm its timeout yet; one polled by any other executor nested in the poll (another
    /// waker) arms it at once. (Futures polled with that waker poll again what they still
    /// wait on, as async fns, [`join_all`] and `select!` do.)
    static LAZY_TIMEOUTS: std::cell::Cell<*const ()> = const { std::cell::Cell::new(std::ptr::null()) };
}

/// Watches `done` for up to `limit`, yielding the CPU between looks (the thread that
/// delivers may need it), reading the clock only every `CLOCK_EVERY` looks; true if `done`.
fn spin_until(limit: Duration, done: impl Fn() -> bool) -> bool {
    if limit.is_zero() {
        return done();
    }
    let (mut looks, mut start) = (0u32, None);
    loop {
        if done() {
            return true;
        }
        looks = looks.wrapping_add(1);
        if looks % CLOCK_EVERY == 0 {
            let now = Instant::now();
            if now - *start.get_or_insert(now) > limit {
                return false;
            }
        }
        std::thread::yield_now();
    }
}

/// Notes `p` as a hook the current [`block_on`] wait drives (once per connection).
fn note_progress(p: &Progress) {
    PROGRESS.with(|cell| {
        let mut v = cell.borrow_mut();
        if v.len() < PROGRESS_MAX && !v.iter().any(|q| Arc::ptr_eq(q, p)) {
            v.push(p.clone());
        }
    });
}

/// Runs `f` to completion on this thread: the blocking facade over async code, and an
/// executor for simple callers. Needs no runtime. While `f` waits on completions whose backend
/// is polled (rdma), this thread polls the completion queue itself for a while, as a blocking
/// [`Pending::wait`] does, instead of sleeping until another thread wakes it; otherwise it
/// parks until woken. Called on a worker of a multi-threaded tokio runtime, the worker's other
/// tasks move to another thread while it blocks (see [`crate::runtime::blocking`]).
pub fn block_on<F: Future>(f: F) -> F::Output {
    crate::runtime::blocking(move || block_on_here(f))
}

fn block_on_here<F: Future>(f: F) -> F::Output {
    struct Unpark {
        woken: AtomicBool,
        thread: std::thread::Thread,
    }
    impl std::task::Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.wake_by_ref();
        }
        fn wake_by_ref(self: &Arc<Self>) {
            self.woken.store(true, Ordering::Release);
            self.thread.unpark();
        }
    }
    let unpark = Arc::new(Unpark {
        woken: AtomicBool::new(false),
        thread: std::thread::current(),
    });
    let waker = Waker::from(unpark.clone());
    let mut cx = Context::from_waker(&waker);
    // The verbs of one poll (every operation it advances) share doorbells.
    let mut f = std::pin::pin!(crate::doorbell::batched(f));
    let mut hooks: Vec<Progress> = Vec::new();
    // Completions come within microseconds, timeouts after seconds: a poll leaves the
    // timeouts of the completions this thread polls for itself (rdma) unarmed, and the wait
    // polls once more, arming them, once they have been waited for [`spin`] (or before it
    // parks) — the timer's lock and map are not on the fast path.
    let (mut arm, mut unarmed, mut unarmed_since) = (false, false, None);
    loop {
        PROGRESS.with(|p| p.borrow_mut().clear());
        SPIN.with(|s| s.set(false));
        let lazy = !std::mem::take(&mut arm);
        let me = if lazy { waker.data() } else { std::ptr::null() };
        let outer = LAZY_TIMEOUTS.with(|l| l.replace(me));
        let outer_unarmed = UNARMED.with(|u| u.replace(false));
        let polled = f.as_mut().poll(&mut cx);
        LAZY_TIMEOUTS.with(|l| l.set(outer));
        let left = UNARMED.with(|u| u.replace(outer_unarmed));
        if let Poll::Ready(v) = polled {
            return v;
        }
        if lazy {
            unarmed |= left;
        } else {
            (unarmed, unarmed_since) = (false, None);
        }
        let woken = || unpark.woken.swap(false, Ordering::Acquire);
        // (Nested in a batched poll, this thread's deferred verbs must go out before it
        // blocks: the outer poll would send them only after this wait.)
        crate::doorbell::ring_deferred();
        PROGRESS.with(|p| std::mem::swap(&mut *p.borrow_mut(), &mut hooks));
        match hooks.len() {
            0 => {
                if SPIN.with(std::cell::Cell::get) {
                    spin_until(spin(), || unpark.woken.load(Ordering::Acquire));
                }
                if unarmed && !unpark.woken.load(Ordering::Acquire) {
                    arm = true;
                    continue;
                }
                while !woken() {
                    std::thread::park();
                }
            }
            _ => {
                // Poll every connection waited on for [`spin`], reading the clock every
                // `CLOCK_EVERY` polls; then nap between polls.
                let (mut polls, mut start) = (0u32, None);
                loop {
                    if woken() {
                        break;
                    }
                    let mut busy = false;
                    for p in &hooks {
                        busy |= p();
                    }
                    polls = polls.wrapping_add(1);
                    if polls % CLOCK_EVERY != 0 {
                        std::hint::spin_loop();
                        continue;
                    }
                    let now = Instant::now();
                    // (Counted across wake-ups: armed even while other completions keep
                    // waking this wait.)
                    if unarmed && now - *unarmed_since.get_or_insert(now) > spin() {
                        arm = true;
                        break;
                    }
                    if now - *start.get_or_insert(now) > spin() && !busy {
                        std::thread::park_timeout(nap());
                    }
                }
            }
        }
    }
}

/// Runs every future concurrently (each is polled whenever the joined future is); their
/// outputs in order. Executor-neutral: what `block_on` or any runtime drives.
pub async fn join_all<F: Future>(futs: Vec<F>) -> Vec<F::Output> {
    let mut futs: Vec<Option<Pin<Box<F>>>> = futs.into_iter().map(|f| Some(Box::pin(f))).collect();
    let mut out: Vec<Option<F::Output>> = futs.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (f, o) in futs.iter_mut().zip(out.iter_mut()) {
            if let Some(fut) = f {
                match fut.as_mut().poll(cx) {
                    Poll::Ready(v) => {
                        *o = Some(v);
                        *f = None;
                    }
                    Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    })
    .await;
    out.into_iter().flatten().collect()
}

// The future never pins its output in place: it is moved out when ready.
impl<T> Unpin for Pending<T> {}

impl<T: Send + 'static> Future for Pending<T> {
    type Output = Result<T>;

    /// Ready when the backend delivers the completion, or with [`Error::Timeout`] once the
    /// connection's timeout has passed since the first poll (the backend then gives up on the
    /// path, as [`Pending::wait`] does). Dropping the future before that cancels only the
    /// wait: the verbs still execute, and their completion is discarded.
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<T>> {
        let this = &mut *self;
        // (The slot is cloned only to arm the timeout, once: not on every poll.)
        let got = match &this.state {
            State::Waiting(slot) => slot.poll_take(cx.waker()),
            State::Ready(_) => {
                let State::Ready(r) = std::mem::replace(&mut this.state, State::Done) else {
                    unreachable!("matched Ready above")
                };
                return Poll::Ready(r);
            }
            State::Done => {
                return Poll::Ready(Err(Error::InvalidArgument(
                    "completion already taken".into(),
                )));
            }
        };
        if let Some(r) = got {
            // Polled before (and found waiting): the completion was handed over to this
            // task — the hand-over counts as `verbs.wakeup`, as for a blocking wait.
            if let (true, State::Waiting(slot)) = (this.waited, &this.state) {
                crate::record::woke(slot.done_at.load(Ordering::Relaxed));
            }
            this.state = State::Done;
            this.armed = None;
            return Poll::Ready(r);
        }
        if let Some(p) = &this.progress {
            note_progress(p);
        } else if this.spin {
            SPIN.with(|s| s.set(true));
        }
        this.waited = true;
        // Polled for by its waiter (rdma) under a `block_on` that polls again, arming it,
        // before the wait gets long: most completions come first and never cost the timer's
        // lock. (The others come from another thread: their waiter may park at once.)
        let lazy = this.progress.is_some() && {
            let l = LAZY_TIMEOUTS.with(std::cell::Cell::get);
            !l.is_null() && l == cx.waker().data()
        };
        if lazy && this.armed.is_none() {
            UNARMED.with(|u| u.set(true));
        } else if this.armed.is_none() {
            // Long timeouts (the connections') start from the timer's coarse clock.
            let now = if this.timeout >= Duration::from_secs(1) {
                timer::coarse_now()
            } else {
                Instant::now()
            };
            if let (Some(deadline), State::Waiting(slot)) =
                (now.checked_add(this.timeout), &this.state)
            {
                let (node, after, hook) = (this.node, this.timeout, this.on_timeout.clone());
                let s = slot.clone();
                this.armed = Some(timer::arm(
                    deadline,
                    Box::new(move || {
                        // (`delivered` stays set after the future took the result.)
                        if s.delivered.load(Ordering::Acquire) {
                            return;
                        }
                        s.complete(Err(Error::Timeout { node, after }));
                        if let Some(h) = hook {
                            h();
                        }
                    }),
                ));
            }
        }
        Poll::Pending
    }
}

/// Deadlines of awaited completions: one process-wide thread fires each at its instant
/// unless the future holding it was dropped (or finished) first. Executor-neutral: no
/// runtime's timer is needed.
pub(crate) mod timer {
    use std::collections::BTreeMap;
    use std::sync::{Arc, OnceLock};
    use std::task::{Poll, Waker};
    use std::time::Instant;

    use parking_lot::{Condvar, Mutex};

    type Fire = Box<dyn FnOnce() + Send>;

    /// Armed deadlines by (instant, sequence number), the last sequence number, and when the
    /// timer thread wakes next on its own.
    struct Due {
        armed: BTreeMap<(Instant, u64), Fire>,
        seq: u64,
        wakes_at: Instant,
        /// Armings since the thread began to doze.
        dozing_arms: u64,
    }

    struct Timer {
        due: Mutex<Due>,
        cv: Condvar,
        /// When the thread started, and nanoseconds since then as it last read the clock
        /// (at most `TICK` ago): a clock read that costs no system call.
        base: Instant,
        now_ns: std::sync::atomic::AtomicU64,
        /// Set while the thread sleeps past the next `TICK` because deadlines are armed
        /// rarely: `now_ns` is then old, and [`coarse_now`] reads the clock instead.
        dozing: std::sync::atomic::AtomicBool,
    }

    /// Armings per tick from which the timer thread ticks (below it dozes until the next
    /// deadline); a dozing thread is woken after this many armings, to tick again.
    const BUSY_ARMS: u64 = 4;

    /// The longest a dozing timer thread sleeps.
    const DOZE_MAX: std::time::Duration = std::time::Duration::from_secs(3600);

    /// The timer thread wakes at least this often, so arming a deadline later than its next
    /// wake-up (the common case: operations finish long before their timeout) never has to
    /// wake it — no thread hand-off per awaited verb.
    const TICK: std::time::Duration = std::time::Duration::from_millis(20);

    fn timer() -> &'static Timer {
        static T: OnceLock<&'static Timer> = OnceLock::new();
        T.get_or_init(|| {
            let t: &'static Timer = Box::leak(Box::new(Timer {
                due: Mutex::new(Due {
                    armed: BTreeMap::new(),
                    seq: 0,
                    wakes_at: Instant::now(),
                    dozing_arms: 0,
                }),
                cv: Condvar::new(),
                base: Instant::now(),
                now_ns: std::sync::atomic::AtomicU64::new(0),
                dozing: std::sync::atomic::AtomicBool::new(false),
            }));
            // A failure to start the thread leaves futures without a timeout; say so.
            if let Err(e) = std::thread::Builder::new()
                .name("dmkit-verbs-timer".into())
                .spawn(move || run(t))
            {
                tracing::error!(error = %e, "cannot start the verbs timer thread: awaited verbs have no timeout");
            }
            t
        })
    }

    fn run(t: &'static Timer) {
        use std::sync::atomic::Ordering;
        let mut g = t.due.lock();
        let mut last_seq = g.seq;
        loop {
            let now = Instant::now();
            t.now_ns.store(
                now.saturating_duration_since(t.base).as_nanos() as u64,
                Ordering::SeqCst,
            );
            t.dozing.store(false, Ordering::SeqCst);
            let first = g.armed.keys().next().copied();
            if let Some(k) = first.filter(|k| k.0 <= now) {
                let fire = g.armed.remove(&k);
                drop(g);
                if let Some(f) = fire {
                    f();
                }
                g = t.due.lock();
                continue;
            }
            // Busy (deadlines armed often): tick, so that `coarse_now` stays fresh without a
            // clock read per verb. Quiet: sleep until the next deadline, and let `coarse_now`
            // read the clock meanwhile — an idle process wakes nobody every tick.
            let busy = g.seq.wrapping_sub(last_seq) >= BUSY_ARMS;
            last_seq = g.seq;
            let until = if busy {
                first.map_or(now + TICK, |k| k.0.min(now + TICK))
            } else {
                t.dozing.store(true, Ordering::SeqCst);
                g.dozing_arms = 0;
                first.map_or(now + DOZE_MAX, |k| k.0.min(now + DOZE_MAX))
            };
            g.wakes_at = until;
            t.cv.wait_until(&mut g, until);
        }
    }

    /// A deadline armed on the timer; dropping it disarms it.
    pub(crate) struct Armed(Option<(Instant, u64)>);

    impl Drop for Armed {
        fn drop(&mut self) {
            if let Some(k) = self.0.take() {
                // (The closure is dropped after the lock is released.)
                let fire = timer().due.lock().armed.remove(&k);
                drop(fire);
            }
        }
    }

    /// Runs `fire` at `deadline` unless the returned handle is dropped first.
    pub(crate) fn arm(deadline: Instant, fire: Fire) -> Armed {
        let t = timer();
        let mut g = t.due.lock();
        g.seq += 1;
        let key = (deadline, g.seq);
        g.armed.insert(key, fire);
        if deadline < g.wakes_at {
            // Due before the thread's next wake-up: wake it to sleep less.
            g.wakes_at = deadline;
            t.cv.notify_one();
        } else if t.dozing.load(std::sync::atomic::Ordering::Relaxed) {
            // Deadlines come often again: wake the dozing thread to tick (until then
            // `coarse_now` reads the clock).
            g.dozing_arms += 1;
            if g.dozing_arms == BUSY_ARMS {
                t.cv.notify_one();
            }
        }
        Armed(Some(key))
    }

    /// The time as the timer thread last read it (at most `TICK` old): for deadlines far
    /// enough away that `TICK` does not matter, without a clock read per verb (a system call
    /// on emulated machines).
    pub(crate) fn coarse_now() -> Instant {
        let t = timer();
        if t.dozing.load(std::sync::atomic::Ordering::SeqCst) {
            return Instant::now();
        }
        t.base + std::time::Duration::from_nanos(t.now_ns.load(std::sync::atomic::Ordering::SeqCst))
    }

    /// Deadlines armed now (tests assert it returns to zero).
    pub fn armed() -> usize {
        timer().due.lock().armed.len()
    }

    /// Completes after `d` (on the timer thread's clock), whatever executor drives it.
    pub async fn sleep(d: std::time::Duration) {
        let state = Arc::new(Mutex::new((false, None::<Waker>)));
        let mut armed = None;
        std::future::poll_fn(|cx| {
            let mut g = state.lock();
            if g.0 {
                return Poll::Ready(());
            }
            g.1 = Some(cx.waker().clone());
            drop(g);
            if armed.is_none() {
                let s = state.clone();
                armed = Some(arm(
                    Instant::now() + d,
                    Box::new(move || {
                        let w = {
                            let mut g = s.lock();
                            g.0 = true;
                            g.1.take()
                        };
                        if let Some(w) = w {
                            w.wake();
                        }
                    }),
                ));
            }
            Poll::Pending
        })
        .await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waiting_on_a_slot_nobody_completes_times_out() {
        let slot = Slot::<u32>::new();
        let p = Pending::waiting(NodeId(3), slot, Duration::from_millis(20), None);
        let t = Instant::now();
        let e = p.wait().unwrap_err();
        assert!(matches!(
            e,
            Error::Timeout {
                node: NodeId(3),
                ..
            }
        ));
        assert!(t.elapsed() < Duration::from_secs(2));
    }

    /// Drives one future on this thread with a waker that counts its wake-ups.
    fn poll_once<F: Future + Unpin>(
        f: &mut F,
        woken: &Arc<std::sync::atomic::AtomicUsize>,
    ) -> Poll<F::Output> {
        struct Count(Arc<std::sync::atomic::AtomicUsize>);
        impl std::task::Wake for Count {
            fn wake(self: Arc<Self>) {
                self.0.fetch_add(1, Ordering::SeqCst);
            }
        }
        let w = Waker::from(Arc::new(Count(woken.clone())));
        Pin::new(f).poll(&mut Context::from_waker(&w))
    }

    // One test, so no other test of this binary arms the process-wide timer meanwhile.
    #[test]
    fn awaited_completions_wake_time_out_and_disarm() {
        let woken = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        // A completion delivered later wakes the task, once.
        let slot = Slot::<u32>::new();
        let mut p = Pending::waiting(NodeId(0), slot.clone(), Duration::from_secs(10), None);
        assert!(poll_once(&mut p, &woken).is_pending());
        assert_eq!(timer::armed(), 1);
        slot.complete(Ok(5));
        assert_eq!(woken.load(Ordering::SeqCst), 1);
        assert!(matches!(poll_once(&mut p, &woken), Poll::Ready(Ok(5))));
        assert_eq!(timer::armed(), 0, "a finished future disarms its timeout");
        // Dropped before completion: disarmed, and a late completion is harmless.
        let slot = Slot::<u32>::new();
        let mut p = Pending::waiting(NodeId(0), slot.clone(), Duration::from_secs(10), None);
        assert!(poll_once(&mut p, &woken).is_pending());
        drop(p);
        assert_eq!(timer::armed(), 0, "a dropped future disarms its timeout");
        slot.complete(Ok(1));
        // Nobody answers: the timeout fires, wakes the task and runs the backend's hook.
        let hooked = Arc::new(AtomicBool::new(false));
        let h = hooked.clone();
        let hook: TimeoutHook = Arc::new(move || h.store(true, Ordering::SeqCst));
        let slot = Slot::<u32>::new();
        let mut p = Pending::waiting(NodeId(4), slot, Duration::from_millis(30), Some(hook));
        let before = woken.load(Ordering::SeqCst);
        let t = Instant::now();
        assert!(poll_once(&mut p, &woken).is_pending());
        while woken.load(Ordering::SeqCst) == before && t.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(2));
        }
        match poll_once(&mut p, &woken) {
            Poll::Ready(Err(Error::Timeout { node, .. })) => assert_eq!(node, NodeId(4)),
            other => panic!("expected a timeout, got {other:?}"),
        }
        assert!(t.elapsed() >= Duration::from_millis(30));
        assert!(
            hooked.load(Ordering::SeqCst),
            "the backend's timeout hook ran"
        );
        assert_eq!(timer::armed(), 0);
        // A second poll after the result was taken is an error, not a hang.
        assert!(matches!(
            poll_once(&mut p, &woken),
            Poll::Ready(Err(Error::InvalidArgument(_)))
        ));
        // Under `block_on` a poll leaves the timeout of a completion the waiter polls for
        // unarmed and the wait arms it by polling once more when its spin ends: one nobody
        // delivers still times out, as do those the waiter parks or watches for.
        let polls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        for shape in ["park", "spin", "poll"] {
            let slot = Slot::<u32>::new();
            let mut p = Pending::waiting(NodeId(5), slot, Duration::from_millis(30), None);
            match shape {
                "spin" => p = p.spinning(),
                "poll" => {
                    let n = polls.clone();
                    p = p.with_progress(Arc::new(move || {
                        n.fetch_add(1, Ordering::Relaxed);
                        false
                    }));
                }
                _ => {}
            }
            let t = Instant::now();
            match block_on(p) {
                Err(Error::Timeout { node, .. }) => assert_eq!(node, NodeId(5), "{shape}"),
                other => panic!("{shape}: expected a timeout, got {other:?}"),
            }
            assert!(t.elapsed() >= Duration::from_millis(30), "{shape}");
            assert_eq!(timer::armed(), 0, "{shape}");
        }
        assert!(polls.load(Ordering::Relaxed) > 0, "the queue was polled");
        // A polled-for completion that comes before the spin ends never touches the timer...
        let idle: Progress = Arc::new(|| false);
        let slot = Slot::<u32>::new();
        let mut p = Pending::waiting(NodeId(6), slot.clone(), Duration::from_secs(10), None)
            .with_progress(idle.clone());
        let got = block_on(std::future::poll_fn(|cx| {
            let r = Pin::new(&mut p).poll(cx);
            if r.is_pending() {
                assert_eq!(timer::armed(), 0, "armed by block_on's first poll");
                slot.complete(Ok(7));
            }
            r
        }));
        assert!(matches!(got, Ok(7)));
        // ...but one polled by another executor nested in a block_on poll (another waker)
        // arms its timeout at once: that executor will not poll again before it sleeps.
        let slot = Slot::<u32>::new();
        let mut p =
            Pending::waiting(NodeId(6), slot, Duration::from_secs(10), None).with_progress(idle);
        block_on(std::future::poll_fn(|_| {
            assert!(poll_once(&mut p, &woken).is_pending());
            Poll::Ready(())
        }));
        assert_eq!(timer::armed(), 1, "armed under a nested executor's waker");
        drop(p);
        assert_eq!(timer::armed(), 0);
    }

    #[test]
    fn completion_from_another_thread_wakes_the_waiter() {
        let slot = Slot::<u32>::new();
        let p = Pending::waiting(NodeId(0), slot.clone(), Duration::from_secs(10), None);
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(5));
            slot.complete(Ok(7));
        });
        assert_eq!(p.wait().unwrap(), 7);
    }
}
