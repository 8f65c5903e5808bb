//! Helpers for the crate's unit tests.

use std::task::{Context, Poll, Waker};

/// The output of a future that is ready at its first poll (the lease drivers over
/// sources whose answers are ready futures); panics otherwise.
pub(crate) fn now_or_never<F: Future>(f: F) -> F::Output {
    let mut f = std::pin::pin!(f);
    match f.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(v) => v,
        Poll::Pending => panic!("ready futures only"),
    }
}
