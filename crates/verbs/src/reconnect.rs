//! Connections that come back: when a client's connection to a memory node is lost (the node
//! restarted, the link broke), the next operation on that node connects again with a
//! [`Reconnect`] function the application supplies (it knows the nodes' addresses). One
//! caller reconnects at a time per node, the others wait and find the new connection; a
//! connection that answers as another node, or that the caller does not accept (its regions
//! are not what it expects, say), is closed rather than used.
//!
//! ```
//! use std::sync::Arc;
//! use dmkit_verbs::sim::{SimCluster, SimConfig};
//! use dmkit_verbs::{Connector, MemoryNode, NodeId, Reconnector};
//!
//! let cluster = SimCluster::new(SimConfig::default());
//! cluster.add_node(Arc::new(MemoryNode::new(NodeId(0))));
//! let ep = cluster.endpoint(1)?;
//! let reconnector = Reconnector::default();
//! // Connection alive: nothing to do.
//! assert!(matches!(reconnector.ensure(&ep, NodeId(0), |_| Ok::<_, String>(())), Ok(None)));
//! // Lost, with no way to reconnect: an error that says so.
//! ep.remove_connection(NodeId(0));
//! assert!(reconnector.ensure(&ep, NodeId(0), |_| Ok::<_, String>(())).is_err());
//! // With one, the next call connects again (and the caller sees the new connection).
//! let c = cluster.connector(1);
//! reconnector.set(Arc::new(move |n: NodeId| c.connect(&n.0.to_string())));
//! assert!(matches!(reconnector.ensure(&ep, NodeId(0), |_| Ok::<_, String>(7)), Ok(Some(7))));
//! assert!(ep.connection(NodeId(0))?.is_alive());
//! # Ok::<(), dmkit_verbs::Error>(())
//! ```

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;

use crate::conn::Connection;
use crate::endpoint::Endpoint;
use crate::error::{Error, Result};
use crate::types::NodeId;

/// Opens a fresh connection to a memory node (one that restarted, or was unreachable).
pub type Reconnect = Arc<dyn Fn(NodeId) -> Result<Arc<dyn Connection>> + Send + Sync>;

/// Why a connection could not be made again.
#[derive(Debug, thiserror::Error)]
pub enum ReconnectError<E> {
    /// No [`Reconnect`] function was set.
    #[error("its connection is lost (this client has no way to reconnect)")]
    NoWay,
    /// The reconnect function failed.
    #[error("reconnecting failed: {0}")]
    Failed(Error),
    /// The address now answers as another node.
    #[error("its address now answers as server {0}")]
    WrongNode(NodeId),
    /// The caller did not accept the new connection.
    #[error("{0}")]
    Refused(E),
}

/// Reconnects a client's lost connections, one caller per node at a time (see the module
/// docs).
#[derive(Default)]
pub struct Reconnector {
    reconnect: Mutex<Option<Reconnect>>,
    /// Held while reconnecting a node, so that one caller reconnects and the others wait.
    one: Mutex<HashMap<NodeId, Arc<Mutex<()>>>>,
}

impl std::fmt::Debug for Reconnector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let set = self.reconnect.lock().is_some();
        f.write_str(if set {
            "Reconnector(set)"
        } else {
            "Reconnector(none)"
        })
    }
}

impl Reconnector {
    /// Sets (or replaces) the reconnect function.
    pub fn set(&self, reconnect: Reconnect) {
        *self.reconnect.lock() = Some(reconnect);
    }

    /// The reconnect function, if one is set.
    pub fn get(&self) -> Option<Reconnect> {
        self.reconnect.lock().clone()
    }

    /// Makes sure `ep` has a live connection to `node`: `Ok(None)` when it had one (or
    /// another caller just made it). Otherwise connects again, checks that the connection
    /// answers as `node` and that `accept` takes it, adds it to `ep` and returns what
    /// `accept` made of it. A connection that fails a check is closed.
    pub fn ensure<T, E>(
        &self,
        ep: &Endpoint,
        node: NodeId,
        accept: impl FnOnce(&Arc<dyn Connection>) -> std::result::Result<T, E>,
    ) -> std::result::Result<Option<T>, ReconnectError<E>> {
        let alive = || ep.connection(node).is_ok_and(|c| c.is_alive());
        if alive() {
            return Ok(None);
        }
        let one = self.one.lock().entry(node).or_default().clone();
        let _one = one.lock();
        if alive() {
            // Another caller reconnected meanwhile.
            return Ok(None);
        }
        let rc = self.get().ok_or(ReconnectError::NoWay)?;
        let conn = rc(node).map_err(ReconnectError::Failed)?;
        if conn.node() != node {
            conn.close();
            return Err(ReconnectError::WrongNode(conn.node()));
        }
        match accept(&conn) {
            Ok(t) => {
                ep.add_connection(conn);
                Ok(Some(t))
            }
            Err(e) => {
                conn.close();
                Err(ReconnectError::Refused(e))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::{SimCluster, SimConfig};
    use crate::{Connector, MemoryNode};

    #[test]
    fn wrong_nodes_and_refused_connections_are_closed_not_used() {
        let cluster = SimCluster::new(SimConfig::default());
        cluster.add_node(Arc::new(MemoryNode::new(NodeId(0))));
        cluster.add_node(Arc::new(MemoryNode::new(NodeId(1))));
        let ep = cluster.endpoint(9).unwrap();
        ep.remove_connection(NodeId(0));
        let r = Reconnector::default();
        let c = cluster.connector(9);
        r.set(Arc::new(move |_| c.connect("1")));
        let e = r.ensure(&ep, NodeId(0), |_| Ok::<_, String>(()));
        assert!(matches!(e, Err(ReconnectError::WrongNode(NodeId(1)))));
        let c = cluster.connector(9);
        r.set(Arc::new(move |n: NodeId| c.connect(&n.0.to_string())));
        let e = r.ensure(&ep, NodeId(0), |_| Err::<(), _>("not mine"));
        assert_eq!(e.unwrap_err().to_string(), "not mine");
        assert!(ep.connection(NodeId(0)).is_err());
        assert!(matches!(
            r.ensure(&ep, NodeId(0), |_| Ok::<_, String>(1)),
            Ok(Some(1))
        ));
    }
}
