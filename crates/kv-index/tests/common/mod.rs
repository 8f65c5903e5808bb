//! A simulated cluster with r index replicas and a key store, for the integration tests.
#![allow(dead_code)]

use std::sync::Arc;

use dmkit_kv_index::test_utils::KeyStore;
use dmkit_kv_index::{IndexConfig, IndexReplicaSpace, RaceIndex, Slot};
use dmkit_verbs::sim::{SimCluster, SimConfig};
use dmkit_verbs::{Access, DramBacking, Endpoint, MemoryNode, NodeId};

pub struct TestCluster {
    pub cluster: SimCluster,
    pub spaces: Vec<IndexReplicaSpace>,
    pub keys: KeyStore,
    /// The key store's object regions, one per node.
    pub objects: Vec<dmkit_verbs::RegionDesc>,
    next_client: std::sync::atomic::AtomicU64,
}

impl TestCluster {
    /// `r` memory nodes, each with an index space of `index_bytes` and an object region.
    pub fn new(r: usize, index_bytes: usize, object_bytes: usize) -> Self {
        let cluster = SimCluster::new(SimConfig::default());
        let (mut spaces, mut objects) = (Vec::new(), Vec::new());
        for id in 0..r as u16 {
            let node = Arc::new(MemoryNode::new(NodeId(id)));
            let index = node
                .register(Arc::new(DramBacking::new(index_bytes)), Access::ALL, None)
                .unwrap();
            objects.push(
                node.register(Arc::new(DramBacking::new(object_bytes)), Access::ALL, None)
                    .unwrap(),
            );
            spaces.push(IndexReplicaSpace {
                region: index,
                offset: 0,
                len: index.len,
            });
            cluster.add_node(node);
        }
        Self {
            cluster,
            spaces,
            keys: KeyStore::new(objects.clone()),
            objects,
            next_client: std::sync::atomic::AtomicU64::new(1),
        }
    }

    pub fn endpoint(&self) -> Endpoint {
        let id = self
            .next_client
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.cluster.endpoint(id).unwrap()
    }

    pub fn format(&self, config: &IndexConfig) -> RaceIndex {
        RaceIndex::format(&self.endpoint(), config, &self.spaces).unwrap()
    }

    /// A client with its own endpoint, and that endpoint's client id (for the sim's faults).
    pub fn open_client(&self) -> (u64, RaceIndex) {
        let id = self
            .next_client
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let ep = self.cluster.endpoint(id).unwrap();
        (id, RaceIndex::open(&ep, &self.spaces).unwrap())
    }

    /// A client with its own endpoint.
    pub fn open(&self) -> RaceIndex {
        RaceIndex::open(&self.endpoint(), &self.spaces).unwrap()
    }

    /// Stores `key` as an object and returns its slot.
    pub fn slot(&self, idx: &RaceIndex, key: &[u8]) -> Slot {
        let p = self.keys.put(idx.endpoint(), key).unwrap();
        idx.slot_for(key, p).unwrap()
    }

    /// Reads the raw words of `[off, off + len)` of every replica space (node-local view).
    pub fn replica_bytes(&self, off: u64, len: usize) -> Vec<Vec<u8>> {
        self.spaces
            .iter()
            .map(|s| {
                let node = self.cluster.node(s.region.node).unwrap();
                let mem = node.memory(s.region.rkey).unwrap();
                let mut out = vec![0u8; len];
                mem.read((s.offset + off) as usize, &mut out).unwrap();
                out
            })
            .collect()
    }
}

pub fn key(i: u64) -> Vec<u8> {
    format!("key-{i:010}").into_bytes()
}
