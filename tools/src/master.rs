//! `dmkit master`: initialises the cluster (formats it on first start, checks it on later
//! ones) and stays up as the cluster's membership service, off the data path.

use std::path::PathBuf;
use std::sync::Arc;

use dmkit_fusee::cluster::{self, ClusterConfig};
use dmkit_fusee::failover::{LeaseConfig, Master, MasterConfig};
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
    /// Probe every memory node this often (milliseconds).
    #[arg(long, default_value_t = 100)]
    pub heartbeat_ms: u64,
    /// Fail a memory node over after this many missed probes in a row.
    #[arg(long, default_value_t = 10)]
    pub miss_limit: u32,
    /// Do not refill and readmit memory nodes that come back (do it by restarting the master).
    #[arg(long)]
    pub no_rejoin: bool,
    /// The memory nodes' lease (milliseconds): a node that hears neither from the master nor
    /// from a majority of the members this long fences itself. Keep it well above the
    /// heartbeat; a failover waits it out before writes resume.
    #[arg(long, default_value_t = 500)]
    pub lease_ms: u64,
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
    if args.heartbeat_ms == 0 || args.miss_limit == 0 {
        return Err(CliError::usage(
            "--heartbeat-ms and --miss-limit must be at least 1",
        ));
    }
    if args.lease_ms < 2 * args.heartbeat_ms {
        return Err(CliError::usage(format!(
            "--lease-ms {} must be at least twice --heartbeat-ms {}",
            args.lease_ms, args.heartbeat_ms
        )));
    }
    // The failure detector: heartbeats, fencing, repair, membership, refill of nodes that
    // come back. Clients read the membership from the memory nodes, so the master stays off
    // the data path.
    // The failure detector's own connections, bounded by the lease: a node cut off must
    // not hold up the heartbeats of the others.
    let bound = Some(std::time::Duration::from_millis(args.lease_ms.max(1000)));
    let hb_ep = crate::connect::endpoint_bounded(&file, bound)?;
    drop(ep);
    let master = Master::with_reconnect(
        hb_ep,
        &nodes,
        crate::connect::reconnect_bounded(&file, bound)?,
    )
    .map_err(|e| CliError::runtime(format!("cannot take over the membership: {e}")))?
    .with_leases(LeaseConfig {
        length: std::time::Duration::from_millis(args.lease_ms),
        peers: file
            .memnodes
            .iter()
            .map(|m| (NodeId(m.id), m.addr.clone()))
            .collect(),
    });
    let m = master.clone();
    let cfg = MasterConfig {
        heartbeat: std::time::Duration::from_millis(args.heartbeat_ms),
        miss_limit: args.miss_limit,
        auto_rejoin: !args.no_rejoin,
    };
    std::thread::Builder::new()
        .name("fusee-master".into())
        .spawn(move || m.run(cfg, Arc::new(std::sync::atomic::AtomicBool::new(false))))
        .map_err(|e| CliError::runtime(format!("cannot start the failure detector: {e}")))?;
    // Status over RPC: the shape and the current membership.
    let node = Arc::new(MemoryNode::new(MASTER_ID));
    let shape = (view.nodes.clone(), view.index_replicas, view.data_replicas);
    node.set_rpc_handler(Arc::new(move |_p: &Peer, _req: &[u8]| {
        let w = Writer::new()
            .u16(shape.0.len() as u16)
            .u8(shape.1 as u8)
            .u8(shape.2 as u8);
        let w = shape.0.iter().fold(w, |w, n| w.u16(n.0));
        Ok(w.bytes(&master.membership().encode()).finish())
    }));
    let secret = crate::connect::secret(Some(&file))?;
    let server = crate::connect::serve_tcp(&args.listen, node, secret)?;
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
