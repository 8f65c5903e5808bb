//! Workloads for dmkit's stores, shared by the `dmkit` command's benchmarks and by examples:
//!
//! - [`ycsb`]: YCSB's core workloads (A–F and property files), its key choosers and an
//!   acknowledged-insert counter shared between client threads;
//! - [`gengar_apps`]: real applications on Gengar written against `GengarClient`'s public API
//!   only (a YCSB key-value store, WordCount, PageRank, a hot-read microbenchmark), each
//!   checked against a single-process computation of the same job.
//!
//! This crate depends on the layer crates and on `dmkit-gengar` only, so Gengar's examples
//! (in this crate's `examples/`) need nothing from the `dmkit` command.

#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod gengar_apps;
pub mod ycsb;
