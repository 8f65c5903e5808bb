//! Asking again over a fresh connection: an operation on a node that fails runs once more
//! after a reconnect to the node (the new connection replaces the old one) — for callers that
//! meet a restarted or briefly unreachable node now and then (a master's heartbeats, a
//! client's membership reads), where a [`Reconnector`](crate::Reconnector) is more than they
//! need.
//!
//! ```
//! use std::sync::Arc;
//! use dmkit_verbs::sim::{SimCluster, SimConfig};
//! use dmkit_verbs::{Connector, MemoryNode, NodeId, Peer, Reconnect};
//!
//! let cluster = SimCluster::new(SimConfig::default());
//! let node = Arc::new(MemoryNode::new(NodeId(0)));
//! node.set_rpc_handler(Arc::new(|_: &Peer, req: &[u8]| Ok(req.to_vec())));
//! cluster.add_node(node);
//! let ep = cluster.endpoint(1)?;
//! ep.remove_connection(NodeId(0)); // lost
//! let connector = cluster.connector(1);
//! let reconnect: Reconnect = Arc::new(move |n: NodeId| connector.connect(&n.0.to_string()));
//! let echo = ep.reconnecting(NodeId(0), Some(&reconnect), || ep.rpc("t", NodeId(0), b"hi"))?;
//! assert_eq!(echo, b"hi");
//! # Ok::<(), dmkit_verbs::Error>(())
//! ```

use std::future::Future;

use crate::endpoint::Endpoint;
use crate::error::Error;
use crate::reconnect::Reconnect;
use crate::types::NodeId;

impl Endpoint {
    /// Runs `op`; when it fails and `reconnect` is given, connects to `node` again and runs
    /// `op` once more (a failed reconnect is the error). Without `reconnect`, `op`'s error.
    pub fn reconnecting<T, E: From<Error>>(
        &self,
        node: NodeId,
        reconnect: Option<&Reconnect>,
        op: impl Fn() -> Result<T, E>,
    ) -> Result<T, E> {
        match (op(), reconnect) {
            (Ok(v), _) => Ok(v),
            (Err(e), None) => Err(e),
            (Err(_), Some(rc)) => {
                self.add_connection(rc(node)?);
                op()
            }
        }
    }

    /// [`Endpoint::reconnecting`] for async operations: the connect, a blocking call, runs
    /// without stalling the runtime's other tasks ([`crate::runtime::blocking`]).
    pub async fn reconnecting_async<T, E: From<Error>, F: Future<Output = Result<T, E>>>(
        &self,
        node: NodeId,
        reconnect: Option<&Reconnect>,
        op: impl Fn() -> F,
    ) -> Result<T, E> {
        match (op().await, reconnect) {
            (Ok(v), _) => Ok(v),
            (Err(e), None) => Err(e),
            (Err(_), Some(rc)) => {
                let conn = crate::runtime::blocking(|| rc(node))?;
                self.add_connection(conn);
                op().await
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use crate::sim::{SimCluster, SimConfig};
    use crate::{Connector, Error, MemoryNode, NodeId, Peer, Reconnect, block_on};

    fn cluster() -> (SimCluster, crate::Endpoint, Reconnect, Arc<AtomicUsize>) {
        let cluster = SimCluster::new(SimConfig::default());
        let node = Arc::new(MemoryNode::new(NodeId(0)));
        node.set_rpc_handler(Arc::new(|_: &Peer, req: &[u8]| Ok(req.to_vec())));
        cluster.add_node(node);
        let ep = cluster.endpoint(1).unwrap();
        let connects = Arc::new(AtomicUsize::new(0));
        let (connector, n) = (cluster.connector(1), connects.clone());
        let rc: Reconnect = Arc::new(move |node: NodeId| {
            n.fetch_add(1, Ordering::Relaxed);
            connector.connect(&node.0.to_string())
        });
        (cluster, ep, rc, connects)
    }

    #[test]
    fn a_failed_operation_runs_once_more_over_a_fresh_connection() {
        let (_c, ep, rc, connects) = cluster();
        let ask = || ep.rpc("t", NodeId(0), b"x");
        // Connected: no reconnect.
        assert_eq!(ep.reconnecting(NodeId(0), Some(&rc), ask).unwrap(), b"x");
        assert_eq!(connects.load(Ordering::Relaxed), 0);
        // Lost, and no way to reconnect: the operation's error.
        ep.remove_connection(NodeId(0));
        assert!(ep.reconnecting(NodeId(0), None, ask).is_err());
        // Lost: one reconnect, then it answers.
        assert_eq!(ep.reconnecting(NodeId(0), Some(&rc), ask).unwrap(), b"x");
        assert_eq!(connects.load(Ordering::Relaxed), 1);
        ep.remove_connection(NodeId(0));
        let got = block_on(
            ep.reconnecting_async(NodeId(0), Some(&rc), || ep.rpc_async("t", NodeId(0), b"y")),
        );
        assert_eq!(got.unwrap(), b"y");
        assert_eq!(connects.load(Ordering::Relaxed), 2);
    }

    #[test]
    fn a_failed_reconnect_is_the_error_and_a_second_failure_is_not_retried() {
        let (_c, ep, _rc, _) = cluster();
        let refuse: Reconnect = Arc::new(|node| Err(Error::NodeFailed { node }));
        ep.remove_connection(NodeId(0));
        let e = ep.reconnecting(NodeId(0), Some(&refuse), || ep.rpc("t", NodeId(0), b"x"));
        assert!(
            matches!(e, Err(Error::NodeFailed { node: NodeId(0) })),
            "{e:?}"
        );
        let runs = AtomicUsize::new(0);
        let (_c, ep, rc, connects) = cluster();
        let e = ep.reconnecting(NodeId(0), Some(&rc), || {
            runs.fetch_add(1, Ordering::Relaxed);
            Err::<(), _>(Error::NodeFailed { node: NodeId(0) })
        });
        assert!(e.is_err());
        assert_eq!(runs.into_inner(), 2);
        assert_eq!(connects.load(Ordering::Relaxed), 1);
    }
}
