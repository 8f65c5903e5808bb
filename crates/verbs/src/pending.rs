//! Completions: a [`Pending`] is the handle of posted work; it is fulfilled by the backend and
//! waited on, with a bounded timeout, by the caller.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use crate::error::{Error, Result};
use crate::types::NodeId;

type Callback<T> = Box<dyn FnOnce(&Result<T>) + Send>;

struct SlotState<T> {
    result: Option<Result<T>>,
    callback: Option<Callback<T>>,
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

/// How long a waiter with a progress hook polls before it also sleeps between polls.
const SPIN: Duration = Duration::from_micros(200);

/// While spinning, a waiter reads the clock (for its timeout and for [`SPIN`]) once per this
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
    /// Modeled completion time in virtual nanoseconds (sim with a latency model).
    pub(crate) modeled_done: Option<u64>,
}

impl<T> std::fmt::Debug for Pending<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pending")
            .field("node", &self.node)
            .field("waiting", &matches!(self.state, State::Waiting(_)))
            .finish()
    }
}

impl<T: Send + 'static> Pending<T> {
    pub(crate) fn ready(node: NodeId, r: Result<T>) -> Self {
        Self {
            state: State::Ready(r),
            node,
            timeout: Duration::MAX,
            on_timeout: None,
            progress: None,
            modeled_done: None,
        }
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
            modeled_done: None,
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
    pub fn wait_timeout(mut self, timeout: Duration) -> Result<T> {
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
                    None => slot.wait_until(far(Instant::now())),
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
                            napping = !busy && now - start > SPIN;
                            if napping {
                                let nap = (now + Duration::from_micros(500)).min(deadline);
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
