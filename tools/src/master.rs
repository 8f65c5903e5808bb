//! `dmkit master`: initialises the cluster (formats it on first start, checks it on later
//! ones) and stays up as the cluster's membership service, off the data path.

use std::path::PathBuf;
use std::sync::Arc;

use dmkit_fusee::cluster::{self, ClusterConfig};
use dmkit_verbs::tcp::{TcpServer, TcpServerConfig};
use dmkit_verbs::wire::Writer;
use dmkit_verbs::{MemoryNode, NodeId, Peer};

use crate::CliError;
use crate::cluster_file::ClusterFile;

#[derive(Debug, clap::Args)]
pub struct MasterArgs {
    /// Address to listen on (host:port).
    #[arg(long)]
    pub listen: String,
    /// The cluster file.
    #[arg(long)]
    pub cluster: PathBuf,
    /// Serve Prometheus metrics on this address (host:port).
    #[arg(long)]
    pub metrics: Option<String>,
}

/// The master's node id on the wire (it serves no memory).
pub const MASTER_ID: NodeId = NodeId(u16::MAX);

pub fn run(args: MasterArgs) -> Result<(), CliError> {
    let file = ClusterFile::load(&args.cluster).map_err(CliError::usage)?;
    if let Some(named) = &file.master {
        if named != &args.listen {
            tracing::warn!(
                file = %named,
                listen = %args.listen,
                "the cluster file names another master address than this one listens on"
            );
        }
    }
    if let Some(m) = &args.metrics {
        let at = crate::metrics_http::serve(m).map_err(CliError::usage)?;
        eprintln!("dmkit master: metrics at http://{at}/metrics");
    }
    let ep = crate::connect::endpoint(&file)?;
    let nodes = crate::connect::node_ids(&file);
    let (view, formatted) = match cluster::open(&ep, &nodes) {
        Ok(v) => (v, false),
        Err(dmkit_fusee::Error::Cluster(m)) if m.contains("no FUSEE superblock") => {
            let mut cfg =
                ClusterConfig::new(nodes.clone(), file.index_replicas, file.data_replicas);
            cfg.index_bytes = file.index_mib << 20;
            let v = cluster::format(&ep, &cfg)
                .map_err(|e| CliError::runtime(format!("cannot format the cluster: {e}")))?;
            (v, true)
        }
        Err(e) => return Err(CliError::runtime(format!("cannot open the cluster: {e}"))),
    };
    if view.index_replicas != file.index_replicas || view.data_replicas != file.data_replicas {
        return Err(CliError::usage(format!(
            "the cluster was formatted with index_replicas = {}, data_replicas = {}; the file says {} and {}",
            view.index_replicas, view.data_replicas, file.index_replicas, file.data_replicas
        )));
    }
    // The membership service: clients ask who the memory nodes are and how data is placed.
    let node = Arc::new(MemoryNode::new(MASTER_ID));
    let status = Writer::new()
        .u16(view.nodes.len() as u16)
        .u8(view.index_replicas as u8)
        .u8(view.data_replicas as u8);
    let status = view.nodes.iter().fold(status, |w, n| w.u16(n.0)).finish();
    node.set_rpc_handler(Arc::new(move |_p: &Peer, _req: &[u8]| Ok(status.clone())));
    let secret = crate::connect::secret(Some(&file))?;
    let server = TcpServer::start(
        args.listen.as_str(),
        node,
        TcpServerConfig {
            secret,
            ..Default::default()
        },
    )
    .map_err(|e| CliError::usage(e.to_string()))?;
    eprintln!(
        "dmkit master: cluster of {} memory nodes {} (index replicas {}, data replicas {}); serving on {}",
        view.nodes.len(),
        if formatted { "formatted" } else { "opened" },
        view.index_replicas,
        view.data_replicas,
        server.local_addr()
    );
    loop {
        std::thread::park();
    }
}
