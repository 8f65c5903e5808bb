//! The blocking facade over async operations: a client written once as async methods
//! (`read_async`, `write_async`, ...) serves the CLI and simple callers with blocking methods
//! that run their async twin to completion on the calling thread ([`crate::block_on`]: no
//! runtime needed, and on a tokio worker the worker's other tasks move away while it blocks).
//!
//! [`blocking_facade!`](crate::blocking_facade) declares them, one line each, next to their
//! docs: `pub fn read(&self, key: u64) -> Result<Vec<u8>> = read_async;` is a method `read`
//! that blocks on `self.read_async(key)`.

/// Declares blocking methods that run their async twins to completion with
/// [`block_on`](crate::block_on) — the blocking facade of a client written once as async
/// code. Use it inside an `impl` block; each line is
/// `[attrs] [vis] fn name(&self, args...) -> Ret = async_name;`, a method `name` that blocks
/// on `self.async_name(args...)`.
///
/// ```
/// struct Store;
///
/// impl Store {
///     async fn get_async(&self, key: u64, add: u64) -> Result<u64, String> {
///         Ok(key + add)
///     }
///     async fn ping_async(&self) {}
///
///     dmkit_verbs::blocking_facade! {
///         /// [`Store::get_async`], blocking.
///         pub fn get(&self, key: u64, add: u64) -> Result<u64, String> = get_async;
///         fn ping(&self) -> () = ping_async;
///     }
/// }
///
/// assert_eq!(Store.get(40, 2), Ok(42));
/// Store.ping();
/// ```
#[macro_export]
macro_rules! blocking_facade {
    ($(
        $(#[$meta:meta])*
        $vis:vis fn $name:ident(&self $(, $arg:ident : $ty:ty)* $(,)?) -> $ret:ty = $async:ident;
    )*) => {$(
        $(#[$meta])*
        $vis fn $name(&self $(, $arg: $ty)*) -> $ret {
            $crate::block_on(self.$async($($arg),*))
        }
    )*};
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::Duration;

    struct Counter(AtomicU64);

    impl Counter {
        async fn add_async(&self, n: u64, pause: Duration) -> u64 {
            // Awaits something that really waits (the verbs timer), not a ready future.
            crate::sleep(pause).await;
            self.0.fetch_add(n, Ordering::Relaxed) + n
        }

        crate::blocking_facade! {
            fn add(&self, n: u64, pause: Duration) -> u64 = add_async;
        }
    }

    #[test]
    fn a_facade_method_blocks_until_its_async_twin_is_done() {
        let c = Counter(AtomicU64::new(1));
        assert_eq!(c.add(2, Duration::from_millis(2)), 3);
        assert_eq!(c.add(4, Duration::ZERO), 7);
    }
}
