//! What a client knows of each memory node from its connection — the regions it found there,
//! say — and which connection that was. [`NodeViews`] keeps one [`View`] per node with an
//! `epoch` that grows by one each time the node is connected again ([`Reconnector`]): state a
//! client derived from a connection (a lease a server granted, an address in its regions)
//! carries the epoch it came from and is never used in another, since the node behind the new
//! connection may have restarted with other memory.
//!
//! ```
//! use std::sync::Arc;
//! use dmkit_verbs::sim::{SimCluster, SimConfig};
//! use dmkit_verbs::{Connector, MemoryNode, NodeId, NodeViews};
//!
//! let cluster = SimCluster::new(SimConfig::default());
//! cluster.add_node(Arc::new(MemoryNode::new(NodeId(0))));
//! let ep = cluster.endpoint(1)?;
//! // The view: how many regions the node has (a real client keeps the ones it needs).
//! let views = NodeViews::new(&ep, |_, regions| Ok::<_, dmkit_verbs::Error>(regions.len()))?;
//! let (view, fresh) = views.ensure(&ep, NodeId(0), |c| Ok::<_, String>(c.regions().len()))?;
//! assert_eq!((view.epoch, fresh), (0, false));
//!
//! // The connection is lost; the next ensure connects again: a new epoch.
//! ep.remove_connection(NodeId(0));
//! let c = cluster.connector(1);
//! views.set_reconnect(Arc::new(move |n: NodeId| c.connect(&n.0.to_string())));
//! let (view, fresh) = views.ensure(&ep, NodeId(0), |c| Ok::<_, String>(c.regions().len()))?;
//! assert_eq!((view.epoch, fresh), (1, true));
//! assert_eq!(views.epoch(NodeId(0)), Some(1));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::collections::BTreeMap;
use std::sync::Arc;

use parking_lot::RwLock;

use crate::conn::Connection;
use crate::endpoint::Endpoint;
use crate::reconnect::{Reconnect, ReconnectError, Reconnector};
use crate::types::{NodeId, RegionDesc};

/// A node as one connection showed it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct View<T> {
    /// Which connection: 0 for the first, one more per reconnection.
    pub epoch: u64,
    /// What the client made of the connection.
    pub value: T,
}

/// Why [`NodeViews::ensure`] has no view to give.
#[derive(Debug, thiserror::Error)]
pub enum ViewError<E> {
    /// The node is not one of the client's.
    #[error("node {0} is not one of this client's")]
    UnknownNode(NodeId),
    /// Its connection is lost and could not be made again.
    #[error(transparent)]
    Lost(ReconnectError<E>),
}

/// A client's view of each of its nodes, by connection epoch (see the module docs).
pub struct NodeViews<T> {
    views: BTreeMap<NodeId, RwLock<View<T>>>,
    reconnector: Reconnector,
}

impl<T> std::fmt::Debug for NodeViews<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeViews")
            .field("nodes", &self.views.keys().collect::<Vec<_>>())
            .field("reconnect", &self.reconnector)
            .finish()
    }
}

impl<T: Clone> NodeViews<T> {
    /// Views (epoch 0) of every node `ep` is connected to, made by `accept` from the node's
    /// regions; the first node it refuses fails the whole.
    pub fn new<E: From<crate::Error>>(
        ep: &Endpoint,
        accept: impl Fn(NodeId, &[RegionDesc]) -> Result<T, E>,
    ) -> Result<Self, E> {
        let mut views = BTreeMap::new();
        for node in ep.nodes() {
            let value = accept(node, &ep.regions(node)?)?;
            views.insert(node, RwLock::new(View { epoch: 0, value }));
        }
        Ok(Self {
            views,
            reconnector: Reconnector::default(),
        })
    }

    /// The nodes, in order.
    pub fn nodes(&self) -> impl Iterator<Item = NodeId> + '_ {
        self.views.keys().copied()
    }

    /// Whether there is no node.
    pub fn is_empty(&self) -> bool {
        self.views.is_empty()
    }

    /// Sets how lost connections are made again (see [`Reconnector::set`]).
    pub fn set_reconnect(&self, reconnect: Reconnect) {
        self.reconnector.set(reconnect);
    }

    /// `node`'s view as of its latest connection, without checking that connection.
    pub fn get(&self, node: NodeId) -> Option<View<T>> {
        self.views.get(&node).map(|v| v.read().clone())
    }

    /// `node`'s current epoch.
    pub fn epoch(&self, node: NodeId) -> Option<u64> {
        self.views.get(&node).map(|v| v.read().epoch)
    }

    /// `node`'s view, its connection made sure of first: when it is lost, connects again
    /// ([`Reconnector::ensure`]: `accept` makes the new view, or refuses the connection) and
    /// starts a new epoch. Also says whether the view is new (the node was reconnected).
    pub fn ensure<E>(
        &self,
        ep: &Endpoint,
        node: NodeId,
        accept: impl FnOnce(&Arc<dyn Connection>) -> Result<T, E>,
    ) -> Result<(View<T>, bool), ViewError<E>> {
        let view = self.views.get(&node).ok_or(ViewError::UnknownNode(node))?;
        match self.reconnector.ensure(ep, node, accept) {
            Ok(None) => Ok((view.read().clone(), false)),
            Ok(Some(value)) => {
                let mut v = view.write();
                *v = View {
                    epoch: v.epoch + 1,
                    value,
                };
                Ok((v.clone(), true))
            }
            Err(e) => Err(ViewError::Lost(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::{SimCluster, SimConfig};
    use crate::{Connector, MemoryNode};

    #[test]
    fn a_new_epoch_per_reconnection_and_refusals_keep_the_old_view() {
        let cluster = SimCluster::new(SimConfig::default());
        for n in 0..2 {
            cluster.add_node(Arc::new(MemoryNode::new(NodeId(n))));
        }
        let ep = cluster.endpoint(9).unwrap();
        let views = NodeViews::new(&ep, |n, _| Ok::<_, crate::Error>(n.0 * 10)).unwrap();
        assert_eq!(views.nodes().collect::<Vec<_>>(), [NodeId(0), NodeId(1)]);
        assert!(matches!(
            views.ensure(&ep, NodeId(7), |_| Ok::<_, String>(0)),
            Err(ViewError::UnknownNode(NodeId(7)))
        ));
        // Lost with no way back.
        ep.remove_connection(NodeId(1));
        assert!(matches!(
            views.ensure(&ep, NodeId(1), |_| Ok::<_, String>(0)),
            Err(ViewError::Lost(ReconnectError::NoWay))
        ));
        let c = cluster.connector(9);
        views.set_reconnect(Arc::new(move |n: NodeId| c.connect(&n.0.to_string())));
        // Refused: still the old view, and the connection is not kept.
        let refused = views.ensure(&ep, NodeId(1), |_| Err::<u16, _>("not mine"));
        assert_eq!(refused.unwrap_err().to_string(), "not mine");
        assert_eq!(
            views.get(NodeId(1)),
            Some(View {
                epoch: 0,
                value: 10
            })
        );
        let (v, fresh) = views
            .ensure(&ep, NodeId(1), |_| Ok::<_, String>(11))
            .unwrap();
        assert_eq!(
            (v, fresh),
            (
                View {
                    epoch: 1,
                    value: 11
                },
                true
            )
        );
        // Alive: the same view, not new.
        let (v, fresh) = views
            .ensure(&ep, NodeId(1), |_| Ok::<_, String>(12))
            .unwrap();
        assert_eq!((v.value, fresh), (11, false));
        assert_eq!(views.epoch(NodeId(0)), Some(0));
    }
}
