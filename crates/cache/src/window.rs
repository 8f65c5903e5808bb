//! The heat window's clock: a background thread that ends a window every so often — merges
//! the reports, selects, promotes and evicts, whatever the owner's step does — for as long as
//! both the owner and the returned handle live.
//!
//! The thread holds the owner weakly: dropping the owner (a server shutting down) ends it
//! too. Dropping the [`WindowThread`] stops it at once (it does not sleep out the period) and
//! waits for a step that is running to finish.
//!
//! ```
//! use std::sync::Arc;
//! use std::sync::atomic::{AtomicU64, Ordering};
//! use std::time::Duration;
//! use dmkit_cache::WindowThread;
//!
//! let windows = Arc::new(AtomicU64::new(0));
//! let t = WindowThread::spawn("example-window", Duration::from_millis(1), &windows, |w| {
//!     w.fetch_add(1, Ordering::Relaxed);
//! })?;
//! while windows.load(Ordering::Relaxed) < 3 {
//!     std::thread::sleep(Duration::from_millis(1));
//! }
//! drop(t); // stopped: no window after this
//! let n = windows.load(Ordering::Relaxed);
//! std::thread::sleep(Duration::from_millis(5));
//! assert_eq!(windows.load(Ordering::Relaxed), n);
//! # Ok::<(), std::io::Error>(())
//! ```

use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

/// Runs a window step every period on a background thread until dropped (see the module
/// docs).
#[derive(Debug)]
pub struct WindowThread {
    /// Dropped to stop the thread (its receiver then sees the disconnect at once).
    stop: Option<mpsc::Sender<()>>,
    handle: Option<JoinHandle<()>>,
}

impl WindowThread {
    /// Starts a thread named `name` that calls `step(owner)` every `every` (the first one
    /// period after the start), while `owner` lives and the handle is not dropped.
    pub fn spawn<T: Send + Sync + 'static>(
        name: &str,
        every: Duration,
        owner: &Arc<T>,
        step: impl Fn(&T) + Send + 'static,
    ) -> std::io::Result<Self> {
        let owner: Weak<T> = Arc::downgrade(owner);
        let (stop, stopped) = mpsc::channel::<()>();
        let handle = std::thread::Builder::new()
            .name(name.to_string())
            .spawn(move || {
                while let Err(RecvTimeoutError::Timeout) = stopped.recv_timeout(every) {
                    match owner.upgrade() {
                        Some(o) => step(&o),
                        None => return,
                    }
                }
            })?;
        Ok(Self {
            stop: Some(stop),
            handle: Some(handle),
        })
    }
}

impl Drop for WindowThread {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::Instant;

    #[test]
    fn stops_at_once_when_dropped_and_when_the_owner_goes() {
        // A long period: dropping the handle does not wait it out.
        let owner = Arc::new(AtomicU64::new(0));
        let t = WindowThread::spawn("w", Duration::from_secs(60), &owner, |o| {
            o.fetch_add(1, Ordering::Relaxed);
        })
        .unwrap();
        let start = Instant::now();
        drop(t);
        assert!(start.elapsed() < Duration::from_secs(5));
        assert_eq!(owner.load(Ordering::Relaxed), 0);

        // The owner dropped: the thread ends by itself (the handle only joins it).
        let owner = Arc::new(AtomicU64::new(0));
        let t = WindowThread::spawn("w", Duration::from_millis(1), &owner, |o| {
            o.fetch_add(1, Ordering::Relaxed);
        })
        .unwrap();
        let weak = Arc::downgrade(&owner);
        drop(owner);
        while weak.strong_count() > 0 {
            std::thread::sleep(Duration::from_millis(1));
        }
        // It ends within a period or so once it runs; a loaded machine may schedule it late.
        let deadline = Instant::now() + Duration::from_secs(5);
        while !t.handle.as_ref().unwrap().is_finished() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(t.handle.as_ref().unwrap().is_finished());
    }
}
