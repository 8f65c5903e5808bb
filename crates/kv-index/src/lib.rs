//! The RACE hash index over remote memory (USENIX ATC 2021), replicated over several memory
//! nodes by FUSEE's SNAPSHOT protocol (FAST 2023), and grown online by extendible hashing —
//! the index of a fully memory-disaggregated key-value store. Clients own the index: every
//! operation is one-sided verbs on an [`Endpoint`](dmkit_verbs::Endpoint), so it runs
//! unchanged over the `sim`, `tcp` and `rdma` backends.
//!
//! # Structure
//!
//! Each replica lives in a [`IndexReplicaSpace`] (part of a region registered on its own
//! memory node): a space header (directory, global depth, a bump pointer for new subtables,
//! a split lock) and subtables. A subtable is bucket groups `[main 0][overflow][main 1]` of
//! 64-byte buckets, each seven 8-byte slots and a header word (local depth, prefix). A key
//! hashes (xxh64, two seeds) to two *combined buckets* (a main bucket and its group's shared
//! overflow bucket, 128 contiguous bytes) in the subtable its directory bits select; one
//! round trip reads both. Keys are not stored in the index: a slot holds an 8-bit
//! fingerprint and a pointer to the KV object, and a [`KeyVerifier`] supplied by the KV layer
//! says which candidate holds the key.
//!
//! # The slot
//!
//! | bits  | field        | |
//! |-------|--------------|-|
//! | 63    | frozen       | set only while a split moves the subtable (never in a [`Slot`]) |
//! | 55-62 | fingerprint  | 8 bits of the key's hash |
//! | 47-54 | length class | the object's length in 64-byte units, 1..=255; 0: empty |
//! | 39-46 | memory node  | where the object lives: objects can be on any node |
//! | 0-38  | pointer      | offset in the node's object area, in 64-byte units (32 TiB) |
//!
//! An empty slot is a word of length class 0: 0 (never used) or the *tombstone* a DELETE
//! leaves ([`tombstone`]: the deleted word with its length class cleared, and with the
//! deleting writer's mark folded in when it gives one, [`tombstone_by`]), so that a slot
//! does not come back to a word it held before and a delayed CAS cannot mistake a later
//! incarnation of the slot for the one it saw (A-B-A). The bucket header is the *last* word
//! of its bucket (tag `0xA5`, a splitting flag, 32-bit prefix, 8-bit local depth). See
//! [`slot`](crate::Slot) for the codec.
//!
//! # Replication: SNAPSHOT
//!
//! Writes CAS the r − 1 backups with the primary's value as expected, then judge: (1) won all
//! backups, (2) won a majority, (3) nobody has a majority and its value is the smallest voted
//! — the winner repairs the backups it lost and CASes the primary; losers wait for the primary
//! to change and report [`SnapshotOutcome::Lost`]. Reads use the primary. INSERT never files
//! a present key ([`InsertOutcome::AlreadyExists`]), also under concurrent inserts of one key.
//!
//! # Growth
//!
//! A full pair of combined buckets splits its subtable (local depth l → l + 1; the directory
//! doubles when l + 1 exceeds the global depth). New subtables come from a bump pointer
//! advanced by FAA, so growth needs no RPC. Clients cache the directory and notice staleness
//! from bucket headers (a header whose prefix does not cover the key). Slots are frozen by
//! SNAPSHOT rounds during the copy, so no concurrent write is lost, and a search never misses a
//! present key (see the `split` module docs). The reference FUSEE code cannot grow.
//!
//! A split never strands the index: its holder renews the split lock between steps and
//! writes a *split record* (space header word 7) naming the split before it starts, so a
//! holder that crashes or loses its connection leaves work that the next holder finishes
//! from the frozen primary; a lock that stands still for the split timeout is taken over by
//! a waiting writer, and a process whose lock release failed takes its own lock back at once
//! instead of waiting for itself.
//!
//! # Round trips
//!
//! Counted per operation tag ([`tags`]) in the endpoint's [`Stats`](dmkit_verbs::Stats); a
//! *fresh* cached directory (the common case) and no conflicting writer:
//!
//! | operation | r = 1 | r ≥ 2 | what |
//! |-----------|-------|-------|------|
//! | SEARCH    | 1     | 1     | read both combined buckets of the primary |
//! | INSERT    | 2     | 3     | read buckets; CAS backups; CAS primary (+ duplicate re-read in the same batch) |
//! | UPDATE    | 2     | 3     | read buckets; CAS backups; CAS primary |
//! | DELETE    | 2     | 3     | as UPDATE |
//!
//! Not included: the verifier's object reads (its own tag; one round trip when a fingerprint
//! matches — always for SEARCH/UPDATE/DELETE of a present key) and FUSEE's KV-object write,
//! which it overlaps with the bucket read. Extra round trips: +1 per directory refresh (tag
//! [`tags::DIRECTORY`]); rule 2 and 3 winners +1 to repair backups, rule 3 +1 to re-check the
//! primary; losers +1 per poll of the primary; a split is counted under [`tags::SPLIT`].
//!
//! # Example
//!
//! ```
//! use std::sync::Arc;
//! use dmkit_verbs::sim::{SimCluster, SimConfig};
//! use dmkit_verbs::{Access, DramBacking, MemoryNode, NodeId};
//! use dmkit_kv_index::{IndexConfig, IndexReplicaSpace, InsertOutcome, RaceIndex, tags};
//! use dmkit_kv_index::test_utils::KeyStore;
//!
//! // Three memory nodes, each holding one index replica and some KV objects.
//! let cluster = SimCluster::new(SimConfig::default());
//! let (mut spaces, mut objects) = (Vec::new(), Vec::new());
//! for id in 0..3 {
//!     let node = Arc::new(MemoryNode::new(NodeId(id)));
//!     let index = node.register(Arc::new(DramBacking::new(8 << 20)), Access::ALL, None)?;
//!     objects.push(node.register(Arc::new(DramBacking::new(1 << 20)), Access::ALL, None)?);
//!     spaces.push(IndexReplicaSpace { region: index, offset: 0, len: index.len });
//!     cluster.add_node(node);
//! }
//! let ep = cluster.endpoint(1)?;
//! let config = IndexConfig { groups_per_subtable_log2: 6, ..IndexConfig::default() };
//! let index = RaceIndex::format(&ep, &config, &spaces)?;
//! let keys = KeyStore::new(objects); // the KV layer's objects; here they hold just the key
//!
//! let slot = index.slot_for(b"apple", keys.put(&ep, b"apple")?)?;
//! assert!(matches!(index.insert(&keys, b"apple", slot)?, InsertOutcome::Inserted { .. }));
//! assert!(matches!(index.insert(&keys, b"apple", slot)?, InsertOutcome::AlreadyExists { .. }));
//!
//! let before = ep.stats().tag(tags::SEARCH);
//! assert_eq!(index.search(&keys, b"apple")?, Some(slot));
//! assert_eq!(ep.stats().tag(tags::SEARCH).since(&before).round_trips, 1);
//!
//! let gone = index.delete(&keys, b"apple")?.expect("present");
//! assert_eq!(gone.old, slot);
//! assert_eq!(index.search(&keys, b"apple")?, None);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! `examples/grow.rs` grows an index online from one subtable while several clients insert.

#![cfg_attr(docsrs, feature(doc_cfg))]

mod error;
mod hooks;
mod index;
mod layout;
pub mod objects;
pub mod repair;
mod slot;
mod snapshot;
mod split;
mod verifier;

#[cfg(any(test, feature = "test_utils"))]
#[cfg_attr(docsrs, doc(cfg(feature = "test_utils")))]
pub mod test_utils;

pub use error::{Error, Result};
pub use hooks::{NoHooks, ResumeOutcome, WriteHooks};
pub use index::{IndexConfig, InsertOutcome, Modified, RaceIndex, SnapshotOutcome, tags};
pub use layout::{IndexReplicaSpace, SlotPos};
pub use slot::{OBJECT_ALIGN, ObjPtr, Slot, delete_mark, is_empty_word, tombstone, tombstone_by};
pub use snapshot::{Rule, decide};
pub use verifier::{BoxFuture, KeyVerifier};
