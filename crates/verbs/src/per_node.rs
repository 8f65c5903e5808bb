//! One batch per node: work requests for several nodes gathered into one [`Batch`] each, so
//! that posting them all with [`Endpoint::execute_many`] costs one round trip (batches to
//! different nodes proceed in parallel).
//!
//! ```
//! use dmkit_verbs::{Endpoint, NodeId};
//!
//! let ep = Endpoint::default();
//! let mut batches = Vec::new();
//! let a = ep.batch_for(&mut batches, NodeId(1));
//! let b = ep.batch_for(&mut batches, NodeId(2));
//! assert_eq!(ep.batch_for(&mut batches, NodeId(1)), a, "node 1's batch, again");
//! assert_ne!(a, b);
//! assert_eq!(batches.len(), 2);
//! assert_eq!(batches[b].node(), NodeId(2));
//! ```

use crate::batch::Batch;
use crate::endpoint::Endpoint;
use crate::types::NodeId;

impl Endpoint {
    /// The index of `node`'s batch in `batches`, a new (empty) one appended when there is
    /// none yet: for gathering one batch per node (see the module docs).
    pub fn batch_for(&self, batches: &mut Vec<Batch>, node: NodeId) -> usize {
        match batches.iter().position(|b| b.node() == node) {
            Some(i) => i,
            None => {
                batches.push(self.batch(node));
                batches.len() - 1
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::NodeId;
    use crate::sim::SimCluster;

    #[test]
    fn gathered_batches_hold_each_nodes_requests_and_run_in_one_round_trip() {
        let (cluster, regions) = SimCluster::with_dram_nodes(3, 4096).unwrap();
        let ep = cluster.endpoint(9).unwrap();
        let mut batches = Vec::new();
        // Writes to nodes 2, 0, 2, 0, 2: two batches, in the order first asked for.
        for (k, n) in [2usize, 0, 2, 0, 2].into_iter().enumerate() {
            let i = ep.batch_for(&mut batches, NodeId(n as u16));
            batches[i].write(regions[n].at(8 * k as u64), &[k as u8 + 1]);
        }
        let nodes: Vec<_> = batches.iter().map(|b| (b.node(), b.len())).collect();
        assert_eq!(nodes, vec![(NodeId(2), 3), (NodeId(0), 2)]);
        let before = ep.stats().tag("t").round_trips;
        for r in ep.execute_many("t", batches) {
            r.unwrap();
        }
        assert_eq!(ep.stats().tag("t").round_trips - before, 1);
        let got = ep.read("t", regions[2].at(16), 1).unwrap();
        assert_eq!(got, vec![3]);
        let got = ep.read("t", regions[0].at(24), 1).unwrap();
        assert_eq!(got, vec![4]);
    }
}
