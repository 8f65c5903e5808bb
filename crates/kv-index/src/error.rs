//! The crate's one error type.

use std::time::Duration;

use dmkit_verbs::NodeId;

/// Everything that can go wrong in the index. Remote data is never trusted: a bucket, header
/// or directory entry that does not decode is [`Error::Corrupt`], never a panic.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A verb failed (node failure, timeout, remote access error, ...).
    #[error(transparent)]
    Verbs(#[from] dmkit_verbs::Error),
    /// Something read from remote memory does not decode.
    #[error("corrupt index data on node {node}: {what}")]
    Corrupt { node: NodeId, what: String },
    /// The replica space holds no formatted index (bad magic) or one of another version.
    #[error("no index formatted in the space on node {node}: {reason}")]
    NotFormatted { node: NodeId, reason: String },
    /// The configuration or the replica spaces cannot work (the message says why).
    #[error("invalid index configuration: {0}")]
    InvalidConfig(String),
    /// A slot value or object pointer that cannot be encoded.
    #[error("invalid slot: {0}")]
    InvalidSlot(String),
    /// The index cannot grow further: no space for another subtable, or the directory is at
    /// its maximum depth.
    #[error("the index is full: {0}")]
    Full(String),
    /// A SNAPSHOT loser waited this long and the primary slot never changed (the winner may
    /// have crashed between repairing the backups and swapping the primary).
    #[error("SNAPSHOT round stalled: the primary slot did not change within {waited:?} ({state})")]
    SnapshotStalled { waited: Duration, state: String },
    /// Waited this long for another client's split (or for the split lock) to finish.
    #[error("split did not finish within {waited:?} (its owner may have crashed)")]
    SplitStalled { waited: Duration },
    /// This client's split lock was taken over by another client (this one stopped renewing
    /// it for the split timeout); the other client finishes the split.
    #[error("the split lock was taken over by another client (this split stood still too long)")]
    SplitTakenOver,
    /// The verifier found a candidate's object gone (freed, reclaimed, reused) since the
    /// buckets were read: the slot moved on. The index reads the buckets again; a verifier
    /// returns this from [`crate::KeyVerifier::find`] rather than "no match".
    #[error("a candidate slot's object was replaced since the buckets were read")]
    StaleCandidate,
    /// The key verifier failed (reading the KV objects).
    #[error("key verifier failed: {0}")]
    Verifier(String),
}

/// The index's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
