//! The library side of the `dmkit` tools: workload generators and result plotting that the
//! benchmarks, the demo and the examples share.

pub mod gengar_apps;
pub mod plot;
pub mod resp;
pub mod ycsb;
