//! Doorbells shared by concurrent operations: while a future runs under [`batched`] (and
//! under [`crate::block_on`], which batches), the verbs its poll posts on a connection that
//! can defer them (tcp) are queued, and every such connection sends what it queued in one
//! write when the poll returns — so the verbs of many operations in flight on one thread share
//! frames and system calls. Any blocking wait on a completion sends the thread's deferred
//! verbs first, so nothing waits on work that was never sent.

use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

/// A connection that can hold posted verbs back until the end of the current poll.
pub(crate) trait Doorbell: Send + Sync {
    /// Sends everything held back.
    fn ring(&self);
}

struct Batch {
    /// Nesting depth of batched polls on this thread.
    depth: u32,
    /// Connections holding verbs back, each once.
    dirty: Vec<Arc<dyn Doorbell>>,
}

thread_local! {
    static BATCH: RefCell<Batch> = const { RefCell::new(Batch { depth: 0, dirty: Vec::new() }) };
}

/// Whether posts on this thread may be held back until the end of the current poll.
pub(crate) fn deferring() -> bool {
    BATCH.with(|b| b.borrow().depth > 0)
}

/// Rings `d` at the end of the current batched poll (once, however many posts it holds).
pub(crate) fn defer(d: Arc<dyn Doorbell>) {
    BATCH.with(|b| {
        let mut b = b.borrow_mut();
        if !b
            .dirty
            .iter()
            .any(|x| std::ptr::addr_eq(Arc::as_ptr(x), Arc::as_ptr(&d)))
        {
            b.dirty.push(d);
        }
    });
}

/// Sends every verb this thread holds back (before it blocks, or when its poll ends).
pub(crate) fn ring_deferred() {
    loop {
        let dirty = BATCH.with(|b| std::mem::take(&mut b.borrow_mut().dirty));
        if dirty.is_empty() {
            return;
        }
        for d in dirty {
            d.ring();
        }
    }
}

/// Polls `f` with doorbell batching (see the module docs). Executor-neutral: wrap a task's
/// future in it to let the operations it runs concurrently share frames.
pub fn batched<F: Future>(f: F) -> Batched<F> {
    Batched { inner: Box::pin(f) }
}

/// The future returned by [`batched`].
pub struct Batched<F> {
    inner: Pin<Box<F>>,
}

impl<F> std::fmt::Debug for Batched<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batched").finish_non_exhaustive()
    }
}

impl<F: Future> Future for Batched<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        /// Leaves the batch (and rings, at the outermost level) even if the poll panics.
        struct Leave;
        impl Drop for Leave {
            fn drop(&mut self) {
                let outermost = BATCH.with(|b| {
                    let mut b = b.borrow_mut();
                    b.depth -= 1;
                    b.depth == 0
                });
                if outermost {
                    ring_deferred();
                }
            }
        }
        BATCH.with(|b| b.borrow_mut().depth += 1);
        let _leave = Leave;
        self.inner.as_mut().poll(cx)
    }
}
