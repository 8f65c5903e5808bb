//! FUSEE: a fully memory-disaggregated key-value store (FAST 2023) — clients own a replicated
//! RACE index (SNAPSHOT), allocate memory in two levels, embed an operation log in every KV
//! object and recover crashed clients; a master only initialises the cluster and handles
//! memory-node failures.
//!
//! Filled by the `[fusee]` issue; nothing here is usable yet.
