//! A queue of work for one background task, whose wake-ups the callers choose when to pay.
//!
//! A client's work that nobody waits for (frees, commit marks, prefetches) runs on a task of
//! its own. Waking that task from inside an operation costs the operation: on a machine with
//! few cores the woken worker thread preempts the caller, and a parked runtime worker is
//! woken with a system call. [`Background::push_deferred`] queues a job without waking the
//! task; the caller [`kick`](Background::kick)s once its operation is over (its reply is
//! ready), and the jobs of several operations that ran meanwhile are taken together.
//! [`Background::push`] queues and wakes at once, for callers that wait for the job.
//! [`Background::kick_lazily`] goes further: it wakes the task only once a batch of jobs
//! waits, and otherwise leaves a wake-up to the verbs timer thread a little later — so a
//! caller running operation after operation pays one wake-up per batch, not one per
//! operation, and the task takes the batch's jobs together; a job queued with
//! [`Background::push_soon`] (something will wait on it) makes that kick wake the task at
//! once. [`Background::wait_below`] is the backpressure: a caller that could outrun the task
//! waits while too many jobs are pending.
//!
//! ```
//! use dmkit_verbs::background::Background;
//! use std::sync::Arc;
//!
//! let q = Arc::new(Background::new());
//! let worker = {
//!     let q = q.clone();
//!     std::thread::spawn(move || {
//!         dmkit_verbs::block_on(async {
//!             let mut seen = 0;
//!             while let Some(jobs) = q.take(16).await {
//!                 seen += jobs.iter().sum::<u32>();
//!                 q.done(jobs.len());
//!             }
//!             seen
//!         })
//!     })
//! };
//! q.push_deferred(1); // inside an operation: no wake-up yet
//! q.push_deferred(2);
//! q.kick(); // the operation is over: the task takes both
//! q.close(); // the task drains what is queued, then ends
//! assert_eq!(worker.join().unwrap(), 3);
//! assert_eq!(q.pending(), 0);
//! ```

use parking_lot::Mutex;
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;

use crate::pending::timer;

/// Jobs for one background task; see the [module docs](self).
pub struct Background<T> {
    state: Mutex<State<T>>,
    wake: Notify,
    /// Callers of [`Background::wait_below`], woken when jobs are done.
    caught_up: Notify,
}

struct State<T> {
    jobs: VecDeque<T>,
    /// Taken by the task and not [`Background::done`] yet.
    running: usize,
    closed: bool,
    /// A job queued with [`Background::push_soon`] waits: the next kick wakes the task at
    /// once, lazily or not.
    urgent: bool,
    /// The wake-up [`Background::kick_lazily`] left to the timer, until it fires or the
    /// task takes the jobs (dropping it disarms it).
    lazy: Option<timer::Armed>,
}

impl<T> Default for Background<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> std::fmt::Debug for Background<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = self.state.lock();
        f.debug_struct("Background")
            .field("queued", &s.jobs.len())
            .field("running", &s.running)
            .field("closed", &s.closed)
            .finish()
    }
}

impl<T> Background<T> {
    pub fn new() -> Self {
        Self {
            state: Mutex::new(State {
                jobs: VecDeque::new(),
                running: 0,
                closed: false,
                urgent: false,
                lazy: None,
            }),
            wake: Notify::new(),
            caught_up: Notify::new(),
        }
    }

    /// Queues `job` and wakes the task. `Err(job)` once the queue is closed.
    pub fn push(&self, job: T) -> Result<(), T> {
        self.push_deferred(job)?;
        self.wake.notify_one();
        Ok(())
    }

    /// Queues `job` without waking the task: the caller [`kick`](Self::kick)s when its
    /// operation is over. `Err(job)` once the queue is closed.
    pub fn push_deferred(&self, job: T) -> Result<(), T> {
        let mut s = self.state.lock();
        if s.closed {
            return Err(job);
        }
        s.jobs.push_back(job);
        Ok(())
    }

    /// Queues `job` without waking the task, like [`push_deferred`](Self::push_deferred),
    /// but the caller's next kick wakes the task at once even if it is a
    /// [`kick_lazily`](Self::kick_lazily): for jobs something waits on soon (a prefetch of
    /// memory running low). `Err(job)` once the queue is closed.
    pub fn push_soon(&self, job: T) -> Result<(), T> {
        let mut s = self.state.lock();
        if s.closed {
            return Err(job);
        }
        s.jobs.push_back(job);
        s.urgent = true;
        Ok(())
    }

    /// Wakes the task if jobs wait for it (cheap when none do, or when it is awake).
    pub fn kick(&self) {
        let mut s = self.state.lock();
        s.urgent = false;
        if !s.jobs.is_empty() {
            drop(s);
            self.wake.notify_one();
        }
    }

    /// Backpressure for callers that can outrun the task: when more than `high` jobs are
    /// pending (queued or running), wakes the task and waits until at most `high / 2` are
    /// (or the queue is closed). Returns whether it waited. Jobs queued before the call are
    /// never lost by cancelling it.
    pub async fn wait_below(&self, high: usize) -> bool {
        if self.pending() <= high {
            return false;
        }
        loop {
            let caught_up = self.caught_up.notified();
            tokio::pin!(caught_up);
            caught_up.as_mut().enable();
            if self.pending() <= high / 2 || self.is_closed() {
                return true;
            }
            self.wake.notify_one();
            caught_up.await;
        }
    }

    /// Jobs queued or being run.
    pub fn pending(&self) -> usize {
        let s = self.state.lock();
        s.jobs.len() + s.running
    }

    /// Whether [`close`](Self::close) was called.
    pub fn is_closed(&self) -> bool {
        self.state.lock().closed
    }

    /// Takes no more jobs. The task still gets those queued, then [`take`](Self::take)
    /// answers `None`.
    pub fn close(&self) {
        self.state.lock().closed = true;
        self.wake.notify_one();
    }

    /// The task's side: waits until jobs are queued and takes up to `max` of them, oldest
    /// first (at least one). `None` once the queue is closed and empty. The task reports
    /// them [`done`](Self::done) when it has run them.
    pub async fn take(&self, max: usize) -> Option<Vec<T>> {
        loop {
            let woken = self.wake.notified();
            tokio::pin!(woken);
            woken.as_mut().enable();
            {
                let mut s = self.state.lock();
                if !s.jobs.is_empty() {
                    let n = s.jobs.len().min(max.max(1));
                    s.running += n;
                    let jobs = s.jobs.drain(..n).collect();
                    // The jobs a lazy wake-up was for are taken: disarm it (outside the lock).
                    let lazy = if s.jobs.is_empty() {
                        s.urgent = false;
                        s.lazy.take()
                    } else {
                        None
                    };
                    drop(s);
                    drop(lazy);
                    return Some(jobs);
                }
                if s.closed {
                    return None;
                }
            }
            woken.await;
        }
    }

    /// The task's side: `n` jobs it took are finished (callers of
    /// [`wait_below`](Self::wait_below) look again).
    pub fn done(&self, n: usize) {
        let mut s = self.state.lock();
        s.running = s.running.saturating_sub(n);
        drop(s);
        self.caught_up.notify_waiters();
    }
}

impl<T: Send + 'static> Background<T> {
    /// Wakes the task now if at least `batch` jobs wait for it; if fewer do, makes sure it
    /// is woken within about `delay` (by the verbs timer thread, not by this thread), unless
    /// a kick or more jobs come first. The wake-up of a parked runtime worker is a system
    /// call, and on a machine with few cores the woken thread preempts the caller: an
    /// operation that ends with this pays it once per `batch` operations. A `delay` of at
    /// least 40 ms never makes this thread wake the timer thread either (it wakes every
    /// 20 ms on its own).
    pub fn kick_lazily(self: &Arc<Self>, batch: usize, delay: Duration) {
        let mut s = self.state.lock();
        if s.jobs.is_empty() {
            return;
        }
        if s.jobs.len() >= batch.max(1) || std::mem::take(&mut s.urgent) {
            drop(s);
            self.wake.notify_one();
            return;
        }
        if s.lazy.is_some() {
            return;
        }
        let me = Arc::downgrade(self);
        s.lazy = Some(timer::arm(
            timer::coarse_now() + delay,
            Box::new(move || {
                if let Some(q) = me.upgrade() {
                    // (Fired: the handle has nothing left to disarm.)
                    let fired = q.state.lock().lazy.take();
                    drop(fired);
                    q.wake.notify_one();
                }
            }),
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;

    #[test]
    fn deferred_jobs_wait_for_a_kick_and_are_taken_together() {
        let q = Arc::new(Background::new());
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        rt.block_on(async {
            q.push_deferred(1).unwrap();
            q.push_deferred(2).unwrap();
            // Queued jobs are taken even without a kick when the task looks (it is awake).
            assert_eq!(q.take(8).await, Some(vec![1, 2]));
            assert_eq!(q.pending(), 2);
            q.done(2);
            assert_eq!(q.pending(), 0);
            // A task waiting for jobs is not woken by a deferred push...
            let q2 = q.clone();
            let t = tokio::spawn(async move { q2.take(8).await });
            tokio::task::yield_now().await;
            q.push_deferred(3).unwrap();
            tokio::time::sleep(Duration::from_millis(20)).await;
            assert!(!t.is_finished());
            // ...but by the kick.
            q.kick();
            assert_eq!(t.await.unwrap(), Some(vec![3]));
            q.done(1);
        });
    }

    #[test]
    fn push_wakes_and_close_drains_then_ends() {
        let q = Arc::new(Background::new());
        let q2 = q.clone();
        let worker = std::thread::spawn(move || {
            crate::block_on(async {
                let mut got = Vec::new();
                while let Some(jobs) = q2.take(2).await {
                    q2.done(jobs.len());
                    got.extend(jobs);
                }
                got
            })
        });
        for i in 0..5 {
            q.push(i).unwrap();
        }
        q.close();
        assert_eq!(q.push(9), Err(9));
        assert_eq!(q.push_deferred(9), Err(9));
        assert_eq!(worker.join().unwrap(), vec![0, 1, 2, 3, 4]);
        assert_eq!(q.pending(), 0);
        assert!(q.is_closed());
    }

    // (Never arms the lazy timer: the timer is process-wide, and pending's test counts it.)
    #[test]
    fn a_job_pushed_soon_makes_a_lazy_kick_wake_the_task_at_once() {
        let q = Arc::new(Background::new());
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        rt.block_on(async {
            let q2 = q.clone();
            let t = tokio::spawn(async move { q2.take(8).await });
            tokio::task::yield_now().await;
            q.push_deferred(1).unwrap();
            assert!(!q.state.lock().urgent);
            // A job pushed soon: a lazy kick (batch 16, an hour) wakes the task now.
            q.push_soon(2).unwrap();
            q.kick_lazily(16, Duration::from_secs(3600));
            let got = tokio::time::timeout(Duration::from_secs(10), t).await;
            assert_eq!(got.unwrap().unwrap(), Some(vec![1, 2]));
            q.done(2);
            // Taken: the urgency went with the jobs.
            assert!(!q.state.lock().urgent);
            assert!(q.state.lock().lazy.is_none());
            // And a kick spends it too.
            q.push_soon(3).unwrap();
            q.kick();
            assert!(!q.state.lock().urgent);
            assert_eq!(q.take(8).await, Some(vec![3]));
        });
    }

    #[test]
    fn wait_below_holds_callers_until_the_task_caught_up_half_way() {
        let q = Arc::new(Background::new());
        for i in 0..6 {
            q.push_deferred(i).unwrap();
        }
        crate::block_on(async {
            // At or under the bound: no wait.
            assert!(!q.wait_below(6).await);
        });
        let q2 = q.clone();
        // The task runs one job at a time, slowly, and records how many were pending after
        // each.
        let worker = std::thread::spawn(move || {
            crate::block_on(async {
                let mut left = Vec::new();
                while let Some(jobs) = q2.take(1).await {
                    std::thread::sleep(Duration::from_millis(5));
                    q2.done(jobs.len());
                    left.push(q2.pending());
                }
                left
            })
        });
        // Over the bound (4): the caller returns once at most 2 are pending.
        crate::block_on(async {
            assert!(q.wait_below(4).await);
        });
        assert!(q.pending() <= 2, "{}", q.pending());
        q.close();
        assert_eq!(worker.join().unwrap(), vec![5, 4, 3, 2, 1, 0]);
    }
}
