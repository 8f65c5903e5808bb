//! The RACE hash index over remote memory: subtables of bucket groups reached with one-sided
//! verbs, replicated over several memory nodes by the SNAPSHOT protocol, and grown online by
//! extendible hashing.
//!
//! Filled by the `[kv-index]` issue; nothing here is usable yet.
