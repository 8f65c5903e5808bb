use crate::addr::GlobalAddr;

/// What can go wrong in Gengar.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Verbs(#[from] dmkit_verbs::Error),
    /// The object was freed (or its slot re-allocated), or the address never named an
    /// object: it is stale or invalid.
    #[error("object {0} was freed (or never allocated)")]
    Freed(GlobalAddr),
    /// No server has room for an object of this size.
    #[error("no server has room for an object of {size} bytes")]
    OutOfSpace { size: usize },
    /// A write longer than the object, or a read past its end.
    #[error("{len} bytes at offset {at} do not fit object {addr} of {size} bytes")]
    OutOfObject {
        addr: GlobalAddr,
        at: usize,
        len: usize,
        size: usize,
    },
    /// Another client held the lock for longer than the lock timeout.
    #[error("timed out waiting for the lock on {0}")]
    LockTimeout(GlobalAddr),
    /// Unlock by a client that does not hold the lock.
    #[error("this client does not hold the lock on {0}")]
    NotLockHolder(GlobalAddr),
    /// The object's server is not one this client is connected to.
    #[error("no Gengar server {0} among this client's connections")]
    UnknownServer(u16),
    /// A server's region table does not look like a Gengar server's.
    #[error("memory node {node} is not a Gengar server: {reason}")]
    NotAServer { node: u16, reason: String },
    /// The object's server is unreachable (killed, restarting, its link down): operations on
    /// its objects fail with this until it is back (and the client reconnected, see
    /// [`crate::GengarClient::set_reconnect`]); other servers' objects are not affected.
    #[error("Gengar server {node} is down: {reason}")]
    ServerDown { node: u16, reason: String },
    /// The server refused a request (the message says why).
    #[error("server {node} refused: {reason}")]
    Server { node: u16, reason: String },
    /// A reply that could not be decoded.
    #[error("malformed reply from server {node}: {reason}")]
    Protocol { node: u16, reason: String },
    /// Setting up a server failed.
    #[error("server setup: {0}")]
    Setup(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
