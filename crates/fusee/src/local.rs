//! A whole FUSEE cluster in one process on the `sim` backend: memory nodes on DRAM pools,
//! formatted, ready for clients. What `dmkit demo`, the examples and the tests start from.

use std::sync::Arc;

use dmkit_pmem_pool::{Pool, PoolOptions};
use dmkit_verbs::sim::{SimCluster, SimConfig};
use dmkit_verbs::tcp::{TcpConnector, TcpServer, TcpServerConfig};
use dmkit_verbs::{Endpoint, NodeId};

use crate::client::{Client, ClientConfig};
use crate::cluster::{self, ClusterConfig, ClusterView};
use crate::error::{Error, Result};
use crate::failover::Master;
use crate::memnode::Memnode;
use crate::recovery::RecoveryReport;

/// Settings of an in-process cluster.
#[derive(Debug, Clone)]
pub struct LocalConfig {
    pub cluster: ClusterConfig,
    /// Pool bytes per memory node.
    pub pool_bytes: usize,
    /// Pool block size.
    pub block_size: usize,
    pub sim: SimConfig,
}

impl LocalConfig {
    /// `nodes` memory nodes with `replicas` index and data replicas each.
    pub fn new(nodes: u16, replicas: usize) -> Self {
        let mut cluster = ClusterConfig::new((0..nodes).map(NodeId).collect(), replicas, replicas);
        cluster.index_bytes = 4 << 20;
        Self {
            cluster,
            pool_bytes: 64 << 20,
            block_size: 256 << 10,
            sim: SimConfig::default(),
        }
    }
}

/// A running in-process cluster.
#[derive(Debug)]
pub struct LocalCluster {
    pub sim: SimCluster,
    pub memnodes: Vec<Arc<Memnode>>,
    pub view: ClusterView,
    /// With [`LocalCluster::start_tcp`]: the memory nodes' TCP servers on loopback.
    pub tcp: Vec<TcpServer>,
    cfg: LocalConfig,
}

impl LocalCluster {
    /// Starts the memory nodes and formats the cluster.
    pub fn start(cfg: LocalConfig) -> Result<LocalCluster> {
        let mut pools = Vec::new();
        for id in &cfg.cluster.nodes {
            let pool = Pool::create_dram(
                cfg.pool_bytes,
                PoolOptions::default().block_size(cfg.block_size),
            )
            .map_err(|e| Error::Config(format!("pool for memory node {id}: {e}")))?;
            pools.push(pool);
        }
        Self::start_on(cfg, pools)
    }

    /// Starts memory nodes on the given pools (one per node, in `cfg.cluster.nodes` order)
    /// and formats the cluster. `cfg.pool_bytes` and `cfg.block_size` are the pools' own.
    pub fn start_on(cfg: LocalConfig, pools: Vec<Pool>) -> Result<LocalCluster> {
        Self::serve(cfg, pools, true)
    }

    /// Starts memory nodes on pools of a formatted cluster (reopened after a crash, say),
    /// as their processes would restart on their pool files: nothing is formatted.
    pub fn reopen(cfg: LocalConfig, pools: Vec<Pool>) -> Result<LocalCluster> {
        Self::serve(cfg, pools, false)
    }

    fn serve(cfg: LocalConfig, pools: Vec<Pool>, format: bool) -> Result<LocalCluster> {
        cfg.cluster.validate()?;
        if pools.len() != cfg.cluster.nodes.len() {
            return Err(Error::Config(format!(
                "{} pools for {} memory nodes",
                pools.len(),
                cfg.cluster.nodes.len()
            )));
        }
        let sim = SimCluster::new(cfg.sim.clone());
        let mut memnodes = Vec::new();
        for (id, pool) in cfg.cluster.nodes.iter().zip(pools) {
            let m = Memnode::new(*id, pool)?;
            sim.add_node(m.node().clone());
            memnodes.push(m);
        }
        // The formatting client (the master's role) uses an id of its own.
        let ep = sim.endpoint(u64::MAX - 16)?;
        let view = if format {
            cluster::format(&ep, &cfg.cluster)?
        } else {
            cluster::open(&ep, &cfg.cluster.nodes)?
        };
        Ok(LocalCluster {
            sim,
            memnodes,
            view,
            tcp: Vec::new(),
            cfg,
        })
    }

    /// Like [`LocalCluster::start`], but clients reach the memory nodes over TCP on loopback.
    pub fn start_tcp(cfg: LocalConfig) -> Result<LocalCluster> {
        let mut c = Self::start(cfg)?;
        for m in &c.memnodes {
            c.tcp.push(TcpServer::start(
                "127.0.0.1:0",
                m.node().clone(),
                TcpServerConfig::default(),
            )?);
        }
        Ok(c)
    }

    /// An endpoint for client `id` over the cluster's transport.
    pub fn endpoint(&self, id: u64) -> Result<Endpoint> {
        if self.tcp.is_empty() {
            // Every node that is up (a failed one is reached again after it recovers).
            let conn = self.sim.connector(id);
            let ep = Endpoint::default();
            for n in &self.cfg.cluster.nodes {
                if let Ok(c) = dmkit_verbs::Connector::connect(&conn, &n.0.to_string()) {
                    ep.add_connection(c);
                }
            }
            if ep.nodes().is_empty() {
                return Err(Error::Cluster("no memory node is up".into()));
            }
            return Ok(ep);
        }
        let nodes: Vec<_> = self
            .tcp
            .iter()
            .map(|s| (s.node().id(), s.local_addr().to_string()))
            .collect();
        Ok(Endpoint::connect(&TcpConnector::default(), &nodes)?)
    }

    /// A client with id `id` (on sim, its crash faults are injected through
    /// [`LocalCluster::sim`]).
    pub fn client(&self, id: u64) -> Result<Client> {
        self.client_with(ClientConfig::new(id))
    }

    /// A client with explicit settings (and, unless it has one, a way to reconnect to
    /// memory nodes that restart).
    pub fn client_with(&self, mut cfg: ClientConfig) -> Result<Client> {
        if cfg.reconnect.is_none() {
            cfg.reconnect = Some(self.reconnect(cfg.id));
        }
        Client::connect(self.endpoint(cfg.id)?, &self.cfg.cluster.nodes, cfg)
    }

    /// Reconnects client `id` to a memory node (after it restarted).
    pub fn reconnect(&self, id: u64) -> crate::failover::Reconnect {
        match self.tcp.is_empty() {
            true => {
                let conn = self.sim.connector(id);
                Arc::new(move |n: NodeId| dmkit_verbs::Connector::connect(&conn, &n.0.to_string()))
            }
            false => {
                let addrs: Vec<_> = self
                    .tcp
                    .iter()
                    .map(|s| (s.node().id(), s.local_addr().to_string()))
                    .collect();
                Arc::new(move |n: NodeId| {
                    let addr = addrs
                        .iter()
                        .find(|(i, _)| *i == n)
                        .map(|(_, a)| a.clone())
                        .ok_or(dmkit_verbs::Error::NoSuchNode(n))?;
                    dmkit_verbs::Connector::connect(&TcpConnector::default(), &addr)
                })
            }
        }
    }

    /// Restarts crashed client `id` and recovers it.
    pub fn recover(&self, id: u64) -> Result<(Client, RecoveryReport)> {
        self.sim.restart_client(id);
        let mut cfg = ClientConfig::new(id);
        cfg.reconnect = Some(self.reconnect(id));
        Client::recover(move || self.endpoint(id), &self.cfg.cluster.nodes, cfg)
    }

    /// A master for this cluster (in-process; drive it with [`Master::fail_over`],
    /// [`Master::rejoin`] or [`Master::run`]).
    pub fn master(&self) -> Result<Arc<Master>> {
        Master::new(self.endpoint(u64::MAX - 17)?, &self.cfg.cluster.nodes)
    }

    /// Restarts failed memory node `id` on its memory, as its process would restart on its
    /// pool file: a fresh rkey, no membership (a master refills and readmits it).
    pub fn restart_node(&self, id: NodeId) -> Result<()> {
        let m = self
            .memnodes
            .iter()
            .find(|m| m.node().id() == id)
            .ok_or_else(|| Error::Config(format!("no memory node {id}")))?;
        m.simulate_restart();
        self.sim.recover_node(id);
        Ok(())
    }

    pub fn nodes(&self) -> &[NodeId] {
        &self.cfg.cluster.nodes
    }

    /// Data blocks allocated across the cluster (all owners).
    pub fn allocated_blocks(&self) -> usize {
        self.memnodes
            .iter()
            .map(|m| m.pool().block_count() - m.pool().free_blocks())
            .sum()
    }
}
