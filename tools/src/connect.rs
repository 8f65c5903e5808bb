//! Connecting to the memory nodes a cluster file names, over its backend.

use std::sync::Arc;

use dmkit_verbs::tcp::TcpConnector;
use dmkit_verbs::{Connector, Endpoint, NodeId};

use crate::cluster_file::ClusterFile;
use crate::{Backend, CliError};

/// The cluster secret: `DMKIT_SECRET` (the secret itself), else the file named by
/// `DMKIT_SECRET_FILE`, else the cluster file's `secret_file`; `None` when none is set.
pub fn secret(file: Option<&ClusterFile>) -> Result<Option<Vec<u8>>, CliError> {
    if let Ok(s) = std::env::var("DMKIT_SECRET") {
        let s = s.trim().as_bytes().to_vec();
        if s.len() < 16 {
            return Err(CliError::usage(format!(
                "DMKIT_SECRET holds {} bytes; use at least 16",
                s.len()
            )));
        }
        return Ok(Some(s));
    }
    if let Ok(p) = std::env::var("DMKIT_SECRET_FILE") {
        return crate::memnode::read_secret(std::path::Path::new(&p)).map(Some);
    }
    file.and_then(|f| f.secret_file.as_deref())
        .map(crate::memnode::read_secret)
        .transpose()
}

/// Serves `node` over tcp on `listen`, requiring `secret` of peers when given.
pub fn serve_tcp(
    listen: &str,
    node: Arc<dmkit_verbs::MemoryNode>,
    secret: Option<Vec<u8>>,
) -> Result<dmkit_verbs::tcp::TcpServer, CliError> {
    dmkit_verbs::tcp::TcpServer::start(
        listen,
        node,
        dmkit_verbs::tcp::TcpServerConfig {
            secret,
            ..Default::default()
        },
    )
    .map_err(|e| CliError::usage(e.to_string()))
}

/// The connector for the file's backend (with the cluster secret, if any), with `bound` on connecting and on waiting for a completion (tcp) — the
/// master's, so that a node cut off is noticed within a heartbeat or two.
pub fn connector_bounded(
    file: &ClusterFile,
    bound: Option<std::time::Duration>,
) -> Result<Arc<dyn Connector>, CliError> {
    match file.backend {
        Backend::Tcp => {
            let secret = secret(Some(file))?;
            let d = TcpConnector::default();
            Ok(Arc::new(TcpConnector {
                secret,
                connect_timeout: bound.unwrap_or(d.connect_timeout),
                op_timeout: bound.unwrap_or(d.op_timeout),
                ..d
            }))
        }
        #[cfg(feature = "rdma")]
        Backend::Rdma => {
            let cfg = dmkit_verbs::rdma::RdmaConfig::from_env()
                .map_err(|e| CliError::usage(e.to_string()))?;
            Ok(Arc::new(dmkit_verbs::rdma::RdmaConnector::new(cfg)))
        }
        #[cfg(not(feature = "rdma"))]
        Backend::Rdma => Err(CliError::usage(
            "the cluster file says backend = \"rdma\" but this dmkit was built without the rdma feature",
        )),
        Backend::Sim => Err(CliError::usage(
            "a sim cluster lives inside one process: use `dmkit demo`, or backend = \"tcp\"",
        )),
    }
}

/// An endpoint connected to every memory node of the file that answers (a failed one is
/// reached again through [`reconnect`]); an error only when none answers, or one answers
/// as another node id.
pub fn endpoint(file: &ClusterFile) -> Result<Endpoint, CliError> {
    endpoint_bounded(file, None)
}

/// [`endpoint`] over [`connector_bounded`].
pub fn endpoint_bounded(
    file: &ClusterFile,
    bound: Option<std::time::Duration>,
) -> Result<Endpoint, CliError> {
    endpoint_with(file, bound, true)
}

/// [`endpoint`] for a retry: the nodes that do not answer were named already, so they are
/// logged at debug level only.
pub fn endpoint_again(file: &ClusterFile) -> Result<Endpoint, CliError> {
    endpoint_with(file, None, false)
}

pub fn endpoint_with(
    file: &ClusterFile,
    bound: Option<std::time::Duration>,
    warn: bool,
) -> Result<Endpoint, CliError> {
    endpoint_of(file, bound, warn, "memory node")
}

/// [`endpoint`] for a cluster file of Gengar servers (the messages name them so).
pub fn gengar_endpoint(file: &ClusterFile) -> Result<Endpoint, CliError> {
    endpoint_of(file, None, true, "Gengar server")
}

/// Connects to every member of `file` that answers; `noun` names a member in messages.
fn endpoint_of(
    file: &ClusterFile,
    bound: Option<std::time::Duration>,
    warn: bool,
    noun: &str,
) -> Result<Endpoint, CliError> {
    let c = connector_bounded(file, bound)?;
    let ep = match c
        .buf_allocator()
        .map_err(|e| CliError::runtime(e.to_string()))?
    {
        Some(a) => Endpoint::with_allocator(Default::default(), a),
        None => Endpoint::default(),
    };
    let mut failed = Vec::new();
    for m in &file.memnodes {
        match c.connect(&m.addr) {
            Ok(conn) if conn.node() == NodeId(m.id) => ep.add_connection(conn),
            Ok(conn) => {
                let found = conn.node();
                conn.close();
                return Err(CliError::runtime(wrong_node(&m.addr, m.id, found)));
            }
            Err(e) => failed.push((m, e)),
        }
    }
    if ep.nodes().is_empty() {
        return Err(CliError::runtime(match failed.pop() {
            Some((_, e)) => format!("no {noun} answers: {e}"),
            None => format!("the cluster file names no {noun}"),
        }));
    }
    // Some answered: go on without the others (the master fails them over).
    for (m, e) in failed {
        if warn {
            tracing::warn!(
                "{noun} {} at {} does not answer ({e}); going on with the others",
                m.id,
                m.addr
            );
        } else {
            tracing::debug!(node = m.id, addr = %m.addr, error = %e, "still does not answer");
        }
    }
    Ok(ep)
}

/// Reconnects to a memory node of the file (one that restarted or was unreachable).
pub fn reconnect(file: &ClusterFile) -> Result<dmkit_fusee::failover::Reconnect, CliError> {
    reconnect_bounded(file, None)
}

/// [`reconnect`] over [`connector_bounded`].
pub fn reconnect_bounded(
    file: &ClusterFile,
    bound: Option<std::time::Duration>,
) -> Result<dmkit_fusee::failover::Reconnect, CliError> {
    let c = connector_bounded(file, bound)?;
    let addrs: std::collections::HashMap<NodeId, String> = file
        .memnodes
        .iter()
        .map(|m| (NodeId(m.id), m.addr.clone()))
        .collect();
    Ok(Arc::new(move |node: NodeId| {
        let addr = addrs
            .get(&node)
            .ok_or(dmkit_verbs::Error::NoSuchNode(node))?;
        let conn = c.connect(addr)?;
        if conn.node() != node {
            conn.close();
            return Err(dmkit_verbs::Error::Connect {
                addr: addr.clone(),
                reason: wrong_node(addr, node.0, conn.node()),
            });
        }
        Ok(conn)
    }))
}

/// The memory node ids in ring order (the file's order).
pub fn node_ids(file: &ClusterFile) -> Vec<NodeId> {
    file.memnodes.iter().map(|m| NodeId(m.id)).collect()
}

/// What to say when the address the file gives memory node `id` answers as another node.
fn wrong_node(addr: &str, id: u16, found: NodeId) -> String {
    if found == crate::master::MASTER_ID {
        format!(
            "{addr}, memory node {id} in the cluster file, is a dmkit master, not a memory \
             node: fix that [[memnode]] entry's addr (the master's address goes in `master`)"
        )
    } else {
        format!(
            "{addr} answers as memory node {found}, but the cluster file says it is node {id}: \
             fix that [[memnode]] entry (or start the memnode there with --id {id})"
        )
    }
}
