use dmkit_pmem_pool::remote::{RequestError, status};
use dmkit_verbs::NodeId;

/// What can go wrong in FUSEE.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Verbs(#[from] dmkit_verbs::Error),
    #[error(transparent)]
    Index(#[from] dmkit_kv_index::Error),
    #[error("key of {0} bytes is too long")]
    KeyTooLong(usize),
    #[error("value of {0} bytes is too long")]
    ValueTooLong(usize),
    /// The KV pair does not fit the largest size class.
    #[error("a KV pair of {0} bytes exceeds the largest object of {1} bytes")]
    ObjectTooLarge(usize, usize),
    /// No memory node could hand out a block.
    #[error("out of memory: {0}")]
    OutOfMemory(String),
    /// A memory node answered something this client cannot use.
    #[error("memory node {node}: {reason}")]
    Node { node: NodeId, reason: String },
    /// The cluster is not formatted (or formatted by an incompatible version).
    #[error("cluster: {0}")]
    Cluster(String),
    /// Remote data that is not what it should be (a corrupt object or header).
    #[error("corrupt remote data: {0}")]
    Corrupt(String),
    /// Every replica of some data is on failed memory nodes.
    #[error("no serving replica of data on memory node {0} (it failed and so did its replicas)")]
    Unavailable(NodeId),
    /// A memory node refuses block requests while the membership changes (retry in the next
    /// epoch).
    #[error("memory node {0} is not serving block requests (membership changing)")]
    Refused(NodeId),
    /// The operation could not finish across membership changes (see [`crate::membership`]).
    #[error("membership: {0}")]
    Membership(String),
    /// A value larger than the client's `max_value`: nothing was written.
    #[error("value of {len} bytes is larger than the maximum of {max} bytes")]
    ValueTooLarge { len: usize, max: usize },
    /// A key in the reserved key space (the chunks of large values) given to the API.
    #[error("keys starting with {prefix:?} are reserved (the chunks of large values)")]
    ReservedKey { prefix: String },
    /// A large value's chunks kept changing under a read (or are damaged).
    #[error("value of key {key:?}: {reason}")]
    LargeValue { key: String, reason: String },
    /// Bad settings.
    #[error("invalid configuration: {0}")]
    Config(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// A block request to `node` that failed: refused while the membership changes is
    /// [`Error::Refused`] (retry in the next epoch), any other status or a malformed reply
    /// is [`Error::Node`].
    pub(crate) fn block(node: NodeId, e: RequestError) -> Error {
        match e {
            RequestError::Verbs(e) => Error::Verbs(e),
            e if e.refusal().is_some_and(|r| r.status == status::REFUSED) => Error::Refused(node),
            e => Error::Node {
                node,
                reason: e.to_string(),
            },
        }
    }
}
