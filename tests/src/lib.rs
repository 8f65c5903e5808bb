//! Cross-crate and multi-process tests for dmkit. The suites live in `tests/tests/`; this
//! library holds what they share: starting `dmkit` processes on loopback and waiting for them.

pub mod linearizability;
pub mod procs;
pub mod proxy;
pub mod registers;
