//! The process's I/O runtime: one multi-threaded tokio runtime that runs every tcp connection
//! of this process — the clients' receive tasks and the memory nodes' connection tasks — so a
//! connection costs a task and a socket, not a thread. Applications may run their own tasks on
//! it too (the RESP gateway does): completions are then delivered to a task on the same few
//! threads that read them, without a wake-up across threads.
//!
//! Its size is `DMKIT_IO_THREADS` worker threads (default: the cores available, at most 4).
//! Blocking on a completion from one of its workers is allowed — the wait moves off the
//! worker ([`blocking`]) — but costs a thread hand-off; async callers should await.

use std::sync::OnceLock;

static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();

/// Worker threads of the I/O runtime.
pub fn io_threads() -> usize {
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

/// Runs `f`, which blocks, without stalling the tasks of the runtime whose worker calls it: on
/// a worker of a multi-threaded tokio runtime the worker's other tasks move to another thread
/// while `f` runs (`tokio::task::block_in_place`). Elsewhere it just runs `f`.
pub fn blocking<R>(f: impl FnOnce() -> R) -> R {
    match tokio::runtime::Handle::try_current() {
        Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
            tokio::task::block_in_place(f)
        }
        _ => f(),
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
}
