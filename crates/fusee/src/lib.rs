//! FUSEE: a fully memory-disaggregated key-value store (FAST 2023), composed from dmkit's
//! layers. Memory nodes are passive (they hand out coarse blocks by RPC, [`memnode`]); clients
//! do everything else with one-sided verbs:
//!
//! - **Index**: a RACE hash index replicated on `r` memory nodes by SNAPSHOT
//!   (`dmkit-kv-index`); no metadata server, no locks.
//! - **Data**: every KV object is written to `r` data replicas; objects embed an operation-log
//!   entry ([`object`]) whose commit record carries a real checksum, so a committed INSERT is
//!   told apart from an uncommitted one.
//! - **Memory**: two levels ([`alloc`]): blocks from the nodes (persistent owner table,
//!   fetched ahead in the background), objects by size class locally; anyone frees with one
//!   FAA on the block's bitmap, owners reclaim in batches.
//! - **Recovery**: a client restarted with its id walks its log and finishes or rolls back
//!   every unfinished operation of every task ([`Client::recover`]).
//!
//! Round trips per operation (r ≥ 2, no conflict): SEARCH 1 on an address-cache hit, 2
//! otherwise (buckets, then the object); INSERT 4 (object write + bucket read, backup CAS,
//! commit record, primary CAS); UPDATE and DELETE 5 (the same, plus reading the object whose
//! fingerprint matched to compare keys). A won write's cleanup — freeing the replaced object
//! and marking the log entry finished — takes 2 more, on the client's background thread.
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

pub mod alloc;
mod client;
pub mod cluster;
mod error;
pub mod failover;
pub mod local;
pub mod membership;
pub mod memnode;
mod mm;
pub mod object;
mod recovery;
mod verifier;

pub use client::{Client, ClientConfig, DeleteResult, InsertResult, UpdateResult, tags};
pub use error::{Error, Result};
pub use local::{LocalCluster, LocalConfig};
pub use recovery::RecoveryReport;
