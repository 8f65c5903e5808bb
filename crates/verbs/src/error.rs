use std::time::Duration;

use crate::types::{NodeId, RKey};

/// Why a memory node refused one work request. The request did not touch memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum AccessFault {
    /// No region with this rkey is registered on the node (or it was deregistered).
    #[error("unknown rkey")]
    UnknownRkey,
    /// The range is not inside the region.
    #[error("out of the region's bounds")]
    OutOfBounds,
    /// The region was registered without the access this verb needs.
    #[error("region lacks {0} access")]
    NoAccess(&'static str),
    /// An atomic verb on an address that is not 8-byte aligned.
    #[error("atomic on an address that is not 8-aligned")]
    Misaligned,
    /// A durable write whose persist failed on the node.
    #[error("persist failed on the memory node")]
    PersistFailed,
    /// The memory node is fenced: it was cut out of its cluster (a master decided it failed,
    /// or it lost its lease) and refuses one-sided verbs until it rejoins.
    #[error("the memory node is fenced out of its cluster")]
    Fenced,
}

impl AccessFault {
    pub(crate) fn code(self) -> u8 {
        match self {
            AccessFault::UnknownRkey => 1,
            AccessFault::OutOfBounds => 2,
            AccessFault::NoAccess(_) => 3,
            AccessFault::Misaligned => 4,
            AccessFault::PersistFailed => 5,
            AccessFault::Fenced => 6,
        }
    }

    pub(crate) fn from_code(code: u8, detail: u8) -> Option<Self> {
        Some(match code {
            1 => AccessFault::UnknownRkey,
            2 => AccessFault::OutOfBounds,
            3 => AccessFault::NoAccess(match detail {
                0 => "read",
                1 => "write",
                _ => "atomic",
            }),
            4 => AccessFault::Misaligned,
            5 => AccessFault::PersistFailed,
            6 => AccessFault::Fenced,
            _ => return None,
        })
    }

    pub(crate) fn detail(self) -> u8 {
        match self {
            AccessFault::NoAccess("read") => 0,
            AccessFault::NoAccess("write") => 1,
            AccessFault::NoAccess(_) => 2,
            _ => 0,
        }
    }
}

/// Everything that can go wrong in the verbs layer. Errors are values: nothing in this crate
/// panics or exits on a failure of the network, of a peer or of the caller's input.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A work request was refused by the memory node: bad rkey, out of bounds, missing access,
    /// misaligned atomic. Requests before it in its batch were executed, the rest were not.
    #[error(
        "remote access error on node {node}: work request {index} (rkey {rkey}, addr {addr:#x}, len {len}): {fault}"
    )]
    RemoteAccess {
        node: NodeId,
        index: usize,
        rkey: RKey,
        addr: u64,
        len: u32,
        fault: AccessFault,
    },
    /// No completion arrived in time; the node may be hung or the network partitioned.
    #[error("timed out after {after:?} waiting for node {node}")]
    Timeout { node: NodeId, after: Duration },
    /// The connection to the node broke (the node crashed, closed it, or the stream failed).
    #[error("connection to node {node} lost: {reason}")]
    Disconnected { node: NodeId, reason: String },
    /// The node is known to have failed (fault injection, or a fenced node).
    #[error("memory node {node} has failed")]
    NodeFailed { node: NodeId },
    /// This client was crashed by fault injection; nothing further it posts is executed.
    #[error("client {client} crashed (fault injection)")]
    ClientCrashed { client: u64 },
    /// The work request was lost (fault injection); whether it executed is unknown to the caller.
    #[error("work request to node {node} was dropped")]
    Dropped { node: NodeId },
    /// Could not establish a connection.
    #[error("cannot connect to {addr}: {reason}")]
    Connect { addr: String, reason: String },
    /// A memory node could not listen on its address.
    #[error("cannot listen on {addr}: {reason}")]
    Listen { addr: String, reason: String },
    /// The peer could not prove it knows the cluster secret, or we could not.
    #[error("authentication with {peer} failed: {reason}")]
    Auth { peer: String, reason: String },
    /// The peer sent something this version cannot understand.
    #[error("protocol error with {peer}: {reason}")]
    Protocol { peer: String, reason: String },
    /// The endpoint has no connection to this node.
    #[error("no connection to node {0}")]
    NoSuchNode(NodeId),
    /// The node has no RPC handler, or the handler reported a failure.
    #[error("RPC to node {node} failed: {reason}")]
    Rpc { node: NodeId, reason: String },
    /// The caller asked for something that cannot be done (the message says what).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// Registering or creating memory failed.
    #[error("memory registration failed: {0}")]
    Registration(String),
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),
}

impl Error {
    /// Verb `index` of a batch sent to `node`, `op`, was refused with `fault`.
    pub(crate) fn refused(
        node: NodeId,
        index: usize,
        op: &crate::batch::Op,
        fault: AccessFault,
    ) -> Error {
        Error::RemoteAccess {
            node,
            index,
            rkey: op.rkey,
            addr: op.addr,
            len: op.len,
            fault,
        }
    }

    /// True for errors that mean the node (or the path to it) is gone, so an upper layer should
    /// fail over rather than retry on the same node.
    pub fn is_node_failure(&self) -> bool {
        matches!(
            self,
            Error::Timeout { .. } | Error::Disconnected { .. } | Error::NodeFailed { .. }
        )
    }

    /// The node this error concerns, when there is one.
    pub fn node(&self) -> Option<NodeId> {
        match self {
            Error::RemoteAccess { node, .. }
            | Error::Timeout { node, .. }
            | Error::Disconnected { node, .. }
            | Error::NodeFailed { node }
            | Error::Dropped { node }
            | Error::Rpc { node, .. }
            | Error::NoSuchNode(node) => Some(*node),
            _ => None,
        }
    }

    pub(crate) fn clone_shallow(&self) -> Error {
        match self {
            Error::RemoteAccess {
                node,
                index,
                rkey,
                addr,
                len,
                fault,
            } => Error::RemoteAccess {
                node: *node,
                index: *index,
                rkey: *rkey,
                addr: *addr,
                len: *len,
                fault: *fault,
            },
            Error::Timeout { node, after } => Error::Timeout {
                node: *node,
                after: *after,
            },
            Error::Disconnected { node, reason } => Error::Disconnected {
                node: *node,
                reason: reason.clone(),
            },
            Error::NodeFailed { node } => Error::NodeFailed { node: *node },
            Error::ClientCrashed { client } => Error::ClientCrashed { client: *client },
            Error::Dropped { node } => Error::Dropped { node: *node },
            Error::Connect { addr, reason } => Error::Connect {
                addr: addr.clone(),
                reason: reason.clone(),
            },
            Error::Listen { addr, reason } => Error::Listen {
                addr: addr.clone(),
                reason: reason.clone(),
            },
            Error::Auth { peer, reason } => Error::Auth {
                peer: peer.clone(),
                reason: reason.clone(),
            },
            Error::Protocol { peer, reason } => Error::Protocol {
                peer: peer.clone(),
                reason: reason.clone(),
            },
            Error::NoSuchNode(n) => Error::NoSuchNode(*n),
            Error::Rpc { node, reason } => Error::Rpc {
                node: *node,
                reason: reason.clone(),
            },
            Error::InvalidArgument(s) => Error::InvalidArgument(s.clone()),
            Error::Registration(s) => Error::Registration(s.clone()),
            Error::Io(e) => Error::Io(std::io::Error::new(e.kind(), e.to_string())),
        }
    }
}

/// The verbs layer's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
