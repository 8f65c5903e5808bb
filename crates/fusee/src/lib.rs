//! FUSEE: a fully memory-disaggregated key-value store (FAST 2023), composed from dmkit's
//! layers. Memory nodes are passive (they hand out coarse blocks by RPC, [`memnode`]); clients
//! do everything else with one-sided verbs:
//!
//! - **Index**: a RACE hash index replicated on `r` memory nodes by SNAPSHOT
//!   (`dmkit-kv-index`); no metadata server, no locks.
//! - **Data**: every KV object is written to `r` data replicas; objects embed an operation-log
//!   entry (module `object`) whose commit record carries a real checksum, so a committed INSERT is
//!   told apart from an uncommitted one.
//! - **Memory**: two levels (pmem-pool's block service and slabs): blocks from the nodes (persistent owner table,
//!   fetched ahead in the background), objects by size class locally; anyone frees with one
//!   FAA on the block's bitmap, owners reclaim in batches.
//! - **Recovery**: a client restarted with its id walks its log and finishes or rolls back
//!   every unfinished operation of every task ([`Client::recover`]).
//! - **Decisions**: what the master keeps of a round a failover cut short, whether a write
//!   cut short took effect, how recovery starts on a log entry — pure functions in
//!   [`rules`], which the code calls and the protocol model (`tests/protocol_model.rs`,
//!   stateright, exhaustive over its bounded histories) checks.
//!
//! # Round trips
//!
//! Per operation, no conflicting writer, a warm client (its blocks fetched); *critical* is what
//! the caller waits for, *background* what the client's background task (on the I/O runtime, no thread of its own) does afterwards
//! (the replaced object's free, one FAA, and the log entry marked finished). Pinned by
//! `tests/rtt.rs` on sim and tcp, and printed by `dmkit bench fusee --workload micro` on every
//! backend (rdma included):
//!
//! | operation | r = 1 | r ≥ 2 | background | critical path |
//! |---|---|---|---|---|
//! | SEARCH, address cached | 1 | 1 | 0 | slot word and object, read together |
//! | SEARCH, not cached | 2 | 2 | 0 | buckets; the candidate object |
//! | INSERT | 2 | 4 | 1 | object write + bucket read; backup CAS (r ≥ 2); commit record; primary CAS (with r = 1 the commit record rides in the primary CAS's batch) |
//! | UPDATE / DELETE, cached | 2 | 4 | 2 | object write + bucket read + cached object read; backup CAS; commit record; primary CAS (as INSERT at r = 1) |
//! | UPDATE / DELETE, not cached | 3 | 5 | 2 | as cached, with the candidate object read in a round of its own |
//! | compare-and-set / delete-if | as UPDATE / DELETE | | 2 | the object the round replaces is the one whose value was compared |
//! | upsert (`put`), cached | as UPDATE, cached | | 2 | an UPDATE |
//! | upsert, not cached | as INSERT or UPDATE, not cached | | 2 | INSERT first while the client's recent uncached upserts found their keys absent, UPDATE first while they found them present; a wrong guess adds its rounds and one to take its object back |
//!
//! This is the FUSEE paper's write path (FAST 2023, extended version, Fig. 9 and §4.6: "four
//! RTTs are required in general cases" for INSERT, UPDATE and DELETE; the cached KV address
//! is read "in parallel with searching the hash index"). With r = 1 the paper skips the log
//! commit (§6.1) and takes two; we keep the commit record — recovery frees the object a
//! crashed write replaced using the old value in it — and still take two: when every write
//! of the record goes to the index primary's node (r = 1 with the object on that node, always
//! with one memory node) and is durable before the verbs after it in its batch run
//! ([`dmkit_verbs::Endpoint::durable_in_order`]: sim and tcp; rdma on DRAM regions), the
//! record and the primary CAS go in one batch ([`dmkit_kv_index::WriteHooks::with_primary`]):
//! the node executes it in order, so the swap never lands without its record. Otherwise (the
//! object on another node, or an rdma region on NVM, persisted only after the batch) the
//! record takes a round of its own: 3 at r = 1.
//! A key's cached address survives the index's splits: a split moves an entry to the new
//! subtable at the same bucket and slot, so a SEARCH reads it where the client's directory
//! now maps the key, in its one round (`RaceIndex::current_pos`; the slot word and the object
//! are checked as for any cached address). The cache holds 262 144 keys by default
//! (`ClientConfig::cache.capacity`; `DMKIT_ADDRESS_CACHE_ENTRIES` for the binary): with
//! 100 000 keys loaded, SEARCH takes 1.00 round trips (it took 2.00 while splits left cached
//! addresses behind and the miss ratio turned the cache off).
//! Rule-2/3 SNAPSHOT rounds add one or two, a directory refresh one, a split its own. An
//! uncached SEARCH that finds an object whose writer has not finished yet (a write in flight,
//! or its background `finished` mark not landed) reads the slot word once more before it
//! answers: the object may sit at an address the buckets' slot has since pointed away from,
//! freed and handed to a new write of the same key whose swap has not happened (found by the
//! deterministic seed 1000740). Writes need no such read: their swap expects the word.
//!
//! **Conditional writes** ([`Client::compare_and_set`], [`Client::delete_if`]) write only over
//! an expected value: the verifier that picks the key's slot also compares the value of the
//! object it points to, and SNAPSHOT's CAS replaces exactly that word. A conditional writer
//! that loses its round reads and compares again. An unconditional UPDATE that loses is
//! linearized just before the winner (FUSEE's rule) only when the winner is the unconditional
//! write that replaced the very word it replaced (its commit record says so); otherwise — a
//! conditional winner, a DELETE, or a primary that moved on — it writes again, after it. The
//! Redis gateway's INCR, APPEND, GETSET and GETDEL are built on these.
//!
//! ```
//! use dmkit_fusee::{InsertResult, LocalCluster, LocalConfig};
//!
//! // Three memory nodes in-process, 3 index and 3 data replicas.
//! let cluster = LocalCluster::start(LocalConfig::new(3, 3))?;
//! let kv = cluster.client(1)?;
//! assert_eq!(kv.insert(b"fruit", b"apple")?, InsertResult::Inserted);
//! assert_eq!(kv.insert(b"fruit", b"pear")?, InsertResult::AlreadyExists);
//! kv.update(b"fruit", b"cherry")?;
//! assert_eq!(kv.search(b"fruit")?.as_deref(), Some(&b"cherry"[..]));
//! kv.delete(b"fruit")?;
//! assert_eq!(kv.search(b"fruit")?, None);
//! # Ok::<(), dmkit_fusee::Error>(())
//! ```
//!
//! # Many operations in flight
//!
//! Every operation is written once, as async code (`search_async`, `insert_async`,
//! `update_async`, `delete_async`, `upsert_async`); the blocking calls above are
//! `dmkit_verbs::block_on` of them. One client (or its clones) serves many operations at once
//! from any executor — tokio, or one thread with `block_on` — as FUSEE's coroutines do; the
//! verbs that operations polled together post go to each memory node in one frame
//! (`dmkit_verbs::batched`). Splits, their waits and SNAPSHOT losers' waits are async too,
//! so no task blocks its thread on another task's round.
//!
//! ```
//! use dmkit_fusee::{LocalCluster, LocalConfig};
//!
//! let cluster = LocalCluster::start(LocalConfig::new(3, 3))?;
//! let kv = cluster.client(2)?;
//! // 64 upserts in flight from this one thread, then 64 searches.
//! let keys: Vec<String> = (0..64).map(|i| format!("key-{i}")).collect();
//! let puts = keys.iter().map(|k| kv.upsert_async(k.as_bytes(), b"v"));
//! for r in dmkit_verbs::block_on(dmkit_verbs::join_all(puts.collect())) {
//!     r?;
//! }
//! let gets = keys.iter().map(|k| kv.search_async(k.as_bytes()));
//! for v in dmkit_verbs::block_on(dmkit_verbs::join_all(gets.collect())) {
//!     assert_eq!(v?.as_deref(), Some(&b"v"[..]));
//! }
//! # Ok::<(), dmkit_fusee::Error>(())
//! ```

//! # Deadlines and large values
//!
//! A value may carry a deadline (Unix milliseconds, the writer's clock): past it the key
//! reads as absent, an INSERT takes it as absent, and it is deleted by whoever meets it and
//! by the background sweep ([`Client::reclaim_expired`], one index subtable a step). Clocks
//! skew: a key expires for everyone within the clients' largest clock skew of its deadline
//! ([`value`] says how). [`Client::get`] returns the value with its deadline and version;
//! [`Client::replace`] and [`Client::delete_entry`] write only over exactly that version.
//! Values larger than one object (up to [`ClientConfig::max_value`], 64 MiB by default) are
//! stored in chunks under reserved keys and named by one manifest, written by one SNAPSHOT
//! round: a reader sees the whole old value or the whole new one. [`Client::get_range`]
//! reads part of a value and its length — of a large value, the manifest and the chunks the
//! part spans only.
//!
//! ```
//! use dmkit_fusee::{CasResult, LocalCluster, LocalConfig, now_ms};
//!
//! let cluster = LocalCluster::start(LocalConfig::new(2, 2))?;
//! let kv = cluster.client(3)?;
//! kv.put(b"session", b"alice", Some(now_ms() + 60_000))?;
//! let e = kv.get(b"session")?.expect("present");
//! assert!(e.ttl_ms(now_ms()).unwrap() <= 60_000);
//! // PERSIST: the same value, no deadline, only over the version read.
//! assert_eq!(kv.replace(b"session", &e, &e.value, None)?, CasResult::Swapped);
//! kv.put(b"gone", b"x", Some(now_ms() - 1))?;
//! assert_eq!(kv.search(b"gone")?, None);
//! // A megabyte, in chunks, read back whole.
//! let big = vec![7u8; 1 << 20];
//! kv.upsert(b"blob", &big)?;
//! assert!(kv.search(b"blob")?.unwrap() == big);
//! // Its length and last byte: the manifest and one chunk.
//! let tail = kv.get_range(b"blob", |len| len - 1..len)?.expect("present");
//! assert_eq!((tail.len, tail.bytes), (1 << 20, vec![7]));
//! # Ok::<(), dmkit_fusee::Error>(())
//! ```

// The allocator's and the object format's internals are public for FUSEE's own tests (crash
// images, recovery), not an API: hidden from the docs.
#[doc(hidden)]
pub mod alloc;
mod client;
pub mod cluster;
mod entry;
mod error;
pub mod failover;
pub mod local;
pub mod membership;
pub mod memnode;
mod mm;
#[doc(hidden)]
pub mod object;
mod recovery;
pub mod rules;
pub mod value;
mod verifier;

pub use client::{CasResult, Client, ClientConfig, DeleteResult, InsertResult, UpdateResult, tags};
pub use entry::{Entry, SweepPacer, Swept, ValueRange};
pub use error::{Error, Result};
pub use local::{LocalCluster, LocalConfig};
pub use recovery::RecoveryReport;
pub use value::now_ms;
