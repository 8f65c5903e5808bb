//! The process's I/O runtime: one multi-threaded tokio runtime that runs every tcp connection
//! of this process — the clients' receive tasks and the memory nodes' connection tasks — so a
//! connection costs a task and a socket, not a thread. Applications may run their own tasks on
//! it too (the RESP gateway does): completions are then delivered to a task on the same few
//! threads that read them, without a wake-up across threads.
//!
//! Its size is, in order: what [`set_io_threads`] asked before it started, else
//! `DMKIT_IO_THREADS` worker threads, else the cores available, at most 4. On a machine
//! shared with the load (a client and a benchmark on two cores, say) fewer workers cost less
//! CPU per operation: a second worker that wakes to steal every other task pays a futex and
//! a context switch each time.
//! Blocking on a completion from one of its workers is allowed — the wait moves off the
//! worker ([`blocking`]) — but costs a thread hand-off; async callers should await.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};

static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();

/// Workers asked for by [`set_io_threads`] (0: none asked).
static REQUESTED: AtomicUsize = AtomicUsize::new(0);

/// Worker threads of the I/O runtime (the ones it has, once started).
pub fn io_threads() -> usize {
    if RUNTIME.get().is_some() {
        return RUNTIME.get().map_or(1, |rt| rt.metrics().num_workers());
    }
    let asked = REQUESTED.load(Ordering::SeqCst);
    if asked > 0 {
        return asked;
    }
    std::env::var("DMKIT_IO_THREADS")
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok())
        .filter(|&n| (1..=256).contains(&n))
        .unwrap_or_else(|| {
            std::thread::available_parallelism()
                .map_or(2, |n| n.get())
                .clamp(1, 4)
        })
}

/// Sizes the I/O runtime before it starts (over `DMKIT_IO_THREADS`): `n` workers, 1 to 256.
/// Once the runtime runs its size is fixed: the error then says how many workers it has.
pub fn set_io_threads(n: usize) -> Result<(), String> {
    if !(1..=256).contains(&n) {
        return Err(format!("I/O threads must be 1 to 256, not {n}"));
    }
    match RUNTIME.get() {
        Some(rt) if rt.metrics().num_workers() != n => Err(format!(
            "the I/O runtime already runs with {} worker threads",
            rt.metrics().num_workers()
        )),
        Some(_) => Ok(()),
        None => {
            REQUESTED.store(n, Ordering::SeqCst);
            Ok(())
        }
    }
}

/// The process's I/O runtime (built on first use; it lives as long as the process).
pub fn io_runtime() -> &'static tokio::runtime::Runtime {
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(io_threads())
            .thread_name("dmkit-io")
            .enable_io()
            .enable_time()
            .build()
            // Without a runtime no tcp connection can run: nothing to fall back on.
            .unwrap_or_else(|e| panic!("cannot start the dmkit I/O runtime: {e}"))
    })
}

/// A handle to [`io_runtime`], to spawn tasks on it.
pub fn io_handle() -> tokio::runtime::Handle {
    io_runtime().handle().clone()
}

/// Whether this thread is a worker of a multi-threaded tokio runtime (where a blocking wait
/// must move off the worker, see [`blocking`]).
pub(crate) fn on_worker() -> bool {
    tokio::runtime::Handle::try_current()
        .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread)
}

/// Runs `f`, which blocks, without stalling the tasks of the runtime whose worker calls it: on
/// a worker of a multi-threaded tokio runtime the worker's other tasks move to another thread
/// while `f` runs (`tokio::task::block_in_place`). Elsewhere it just runs `f`.
pub fn blocking<R>(f: impl FnOnce() -> R) -> R {
    if on_worker() {
        tokio::task::block_in_place(f)
    } else {
        f()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocking_on_a_worker_lets_its_other_tasks_run() {
        let rt = io_runtime();
        let (tx, rx) = std::sync::mpsc::channel();
        let done = rt.spawn(async move {
            // This worker blocks until another task of the runtime has run.
            let (t2, r2) = std::sync::mpsc::channel();
            tokio::spawn(async move {
                let _ = t2.send(());
            });
            blocking(|| r2.recv_timeout(std::time::Duration::from_secs(5)))
                .expect("the other task ran while this one blocked");
            let _ = tx.send(());
        });
        rx.recv_timeout(std::time::Duration::from_secs(10))
            .expect("blocked task finished");
        drop(done);
        // Off any runtime it just runs.
        assert_eq!(blocking(|| 7), 7);
    }

    #[test]
    fn the_runtime_size_is_fixed_once_it_runs() {
        let n = io_runtime().metrics().num_workers();
        assert_eq!(io_threads(), n);
        assert!(set_io_threads(n).is_ok());
        let other = if n == 1 { 2 } else { 1 };
        let e = set_io_threads(other).unwrap_err();
        assert!(e.contains("already runs"), "{e}");
        assert!(set_io_threads(0).unwrap_err().contains("1 to 256"));
        assert_eq!(io_threads(), n);
    }
}
