//! The library side of the `dmkit` tools: workload generators and result plotting that the
//! benchmarks, the demo and the examples share.

// (The workloads moved to `dmkit-workloads`; re-exported under their old paths.)
pub use dmkit_workloads::{gengar_apps, ycsb};
pub mod plot;
pub mod resp;
