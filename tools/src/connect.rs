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

/// The connector for the file's backend (with the cluster secret, if any).
pub fn connector(file: &ClusterFile) -> Result<Arc<dyn Connector>, CliError> {
    match file.backend {
        Backend::Tcp => {
            let secret = secret(Some(file))?;
            Ok(Arc::new(TcpConnector {
                secret,
                ..TcpConnector::default()
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

/// An endpoint connected to every memory node of the file.
pub fn endpoint(file: &ClusterFile) -> Result<Endpoint, CliError> {
    let c = connector(file)?;
    let nodes: Vec<_> = file
        .memnodes
        .iter()
        .map(|m| (NodeId(m.id), m.addr.clone()))
        .collect();
    Endpoint::connect(c.as_ref(), &nodes).map_err(|e| CliError::runtime(e.to_string()))
}

/// The memory node ids in ring order (the file's order).
pub fn node_ids(file: &ClusterFile) -> Vec<NodeId> {
    file.memnodes.iter().map(|m| NodeId(m.id)).collect()
}
