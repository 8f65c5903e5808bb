//! A server answering its memory node's RPCs: the server owns the node (and registers its
//! regions there), so the node's handler holds the server *weakly* — no reference cycle, and
//! once the server is dropped its requests fail with "… is shutting down" instead of reaching
//! a half-torn-down server. [`MemoryNode::serve_messages`] also decodes each request as the
//! server's request type ([`Wire`]) first.
//!
//! ```
//! use std::sync::Arc;
//! use dmkit_verbs::sim::{SimCluster, SimConfig};
//! use dmkit_verbs::wire::{Wire, WireError};
//! use dmkit_verbs::{MemoryNode, NodeId, Peer};
//!
//! struct Echo {
//!     node: Arc<MemoryNode>,
//! }
//!
//! let echo = Arc::new(Echo { node: Arc::new(MemoryNode::new(NodeId(0))) });
//! // Requests are a u64; the answer is the next one.
//! let next = |_: &Echo, _: &Peer, req: Result<u64, WireError>| match req {
//!     Ok(n) => (n + 1).to_bytes(),
//!     Err(WireError(what)) => what.as_bytes().to_vec(),
//! };
//! echo.node.serve_messages(&echo, "the echo server", next);
//! let cluster = SimCluster::new(SimConfig::default());
//! cluster.add_node(echo.node.clone());
//! let ep = cluster.endpoint(1)?;
//! assert_eq!(u64::from_bytes(&ep.rpc("echo", NodeId(0), &41u64.to_bytes())?), Ok(42));
//! assert_eq!(ep.rpc("echo", NodeId(0), &[1])?, b"truncated");
//! drop(echo); // the node lives on (the cluster holds it); its server is gone
//! assert!(ep.rpc("echo", NodeId(0), &[0; 8]).unwrap_err().to_string().contains("shutting down"));
//! # Ok::<(), dmkit_verbs::Error>(())
//! ```

use std::sync::Arc;

use crate::node::{MemoryNode, Peer};
use crate::wire::{Wire, WireError};

impl MemoryNode {
    /// Answers this node's RPCs with `handle(server, peer, request)` for as long as `server`
    /// lives (see the module docs); afterwards they fail with "`what` is shutting down".
    pub fn serve_while<T: Send + Sync + 'static>(
        &self,
        server: &Arc<T>,
        what: &str,
        handle: impl Fn(&T, &Peer, &[u8]) -> Vec<u8> + Send + Sync + 'static,
    ) {
        let (server, gone) = (Arc::downgrade(server), format!("{what} is shutting down"));
        self.set_rpc_handler(Arc::new(move |peer: &Peer, req: &[u8]| {
            match server.upgrade() {
                Some(s) => Ok(handle(&s, peer, req)),
                None => Err(gone.clone()),
            }
        }));
    }

    /// [`MemoryNode::serve_while`], each request decoded as an `M` first (exactly: trailing
    /// bytes are malformed too); `handle` answers malformed ones as well, with their error.
    pub fn serve_messages<T: Send + Sync + 'static, M: Wire>(
        &self,
        server: &Arc<T>,
        what: &str,
        handle: impl Fn(&T, &Peer, Result<M, WireError>) -> Vec<u8> + Send + Sync + 'static,
    ) {
        self.serve_while(server, what, move |s, peer, req| {
            handle(s, peer, M::from_bytes(req))
        });
    }
}
