//! Gengar: a distributed NVM/DRAM hybrid memory pool (ICDCS 2021) — a thin composition of
//! dmkit's verbs, pmem-pool, lease and cache layers: a global address space over many servers'
//! NVM, hot objects cached in server DRAM with write-through, proxied writes with write
//! confirms, leases and application locks.
//!
//! Filled by the `[gengar]` issue; nothing here is usable yet.
