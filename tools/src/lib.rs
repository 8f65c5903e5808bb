//! The library side of the `dmkit` tools: workload generators and result plotting that the
//! benchmarks, the demo and the examples share.

#![cfg_attr(docsrs, feature(doc_cfg))]

// (The workloads moved to `dmkit-workloads`; re-exported under their old paths.)
pub use dmkit_workloads::{gengar_apps, ycsb};
pub mod plot;
pub mod resp;
