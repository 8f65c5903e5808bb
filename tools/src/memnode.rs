//! `dmkit memnode`: a memory node serving registered memory to clients.

use crate::size::format_size;
use crate::{Backend, CliError};
use dmkit_verbs::NodeId;

#[derive(Debug, clap::Args)]
pub struct MemnodeArgs {
    /// Address to listen on (host:port).
    #[arg(long)]
    pub listen: String,
    /// This node's id in the cluster.
    #[arg(long, default_value_t = 0)]
    pub id: u16,
    /// Verbs backend to serve with.
    #[arg(long, value_enum, default_value_t = Backend::Tcp)]
    pub backend: Backend,
    /// Volatile memory to serve, e.g. 64MiB.
    #[arg(long, value_parser = crate::size::parse_size)]
    pub dram: Option<u64>,
    /// A persistent pool file to serve (created if missing, with --size).
    #[arg(long)]
    pub pool: Option<std::path::PathBuf>,
    /// Size of a pool file to create: the file's size on disk (metadata and the data area
    /// inside it). Reopening with the same --size is accepted.
    #[arg(long, value_parser = crate::size::parse_size)]
    pub size: Option<u64>,
    /// Block size of a new pool (all memory nodes of a FUSEE cluster must agree).
    #[arg(long, value_parser = crate::size::parse_size, default_value = "256KiB")]
    pub block_size: u64,
    /// A file holding the cluster secret; peers must prove they know it.
    #[arg(long, env = "DMKIT_SECRET_FILE")]
    pub secret_file: Option<std::path::PathBuf>,
    /// Serve Prometheus metrics on this address (host:port).
    #[arg(long)]
    pub metrics: Option<String>,
}

pub fn read_secret(path: &std::path::Path) -> Result<Vec<u8>, CliError> {
    let s = std::fs::read(path)
        .map_err(|e| CliError::usage(format!("cannot read secret file {}: {e}", path.display())))?;
    let trimmed = s.trim_ascii().to_vec();
    if trimmed.len() < 16 {
        return Err(CliError::usage(format!(
            "secret file {} holds {} bytes; use at least 16",
            path.display(),
            trimmed.len()
        )));
    }
    Ok(trimmed)
}

pub fn run(args: MemnodeArgs) -> Result<(), CliError> {
    args.backend.check_serves("a memory node")?;
    if args.size.is_some() && args.pool.is_none() {
        return Err(CliError::usage(
            "--size needs --pool PATH (the size of the pool file to create)",
        ));
    }
    if args.dram.is_none() && args.pool.is_none() {
        return Err(CliError::usage(
            "nothing to serve: give --dram SIZE (e.g. --dram 64MiB) and/or --pool PATH --size SIZE",
        ));
    }
    let secret = match args.secret_file.as_deref() {
        Some(p) => Some(read_secret(p)?),
        None => crate::connect::secret(None)?,
    };
    if args.dram.is_some() && args.pool.is_some() {
        return Err(CliError::usage(
            "give either --dram SIZE (volatile) or --pool PATH (persistent), not both",
        ));
    }
    // The recorder first: what registering memory records must not be lost.
    if let Some(m) = &args.metrics {
        let at = crate::metrics_http::serve(m).map_err(CliError::usage)?;
        eprintln!("dmkit memnode: metrics at http://{at}/metrics");
    }
    let block = usize::try_from(args.block_size)
        .map_err(|_| CliError::usage("--block-size is too large"))?;
    let (pool, what) = match (&args.pool, args.dram) {
        (Some(path), _) => {
            let pool = open_or_create_pool(path, args.size, block)?;
            let kind = if pool.is_persistent() {
                "persistent"
            } else {
                "volatile"
            };
            let file_len = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
            let w = format!(
                "{} {kind} pool {} (file {}, data area {})",
                format_size(pool.data_len() as u64),
                path.display(),
                format_size(file_len),
                format_size(pool.data_len() as u64),
            );
            (pool, w)
        }
        (None, Some(dram)) => {
            let dram = usize::try_from(dram).map_err(|_| {
                CliError::usage(format!("--dram {dram} is too large for this machine"))
            })?;
            let pool = dmkit_pmem_pool::Pool::create_dram(
                dram,
                dmkit_pmem_pool::PoolOptions::default().block_size(block),
            )
            .map_err(|e| {
                CliError::usage(format!(
                    "cannot set up {} of DRAM: {e}",
                    format_size(dram as u64)
                ))
            })?;
            (pool, format!("{} of DRAM", format_size(dram as u64)))
        }
        (None, None) => unreachable!("checked above"),
    };
    let memnode = dmkit_fusee::memnode::Memnode::new(NodeId(args.id), pool)
        .map_err(|e| CliError::runtime(e.to_string()))?;
    publish_memory(
        &memnode,
        args.id,
        if args.pool.is_some() { "pool" } else { "dram" },
    )?;
    let node = memnode.node().clone();
    let has_secret = secret.is_some();
    let (_server, addr, how) = match args.backend {
        #[cfg(feature = "rdma")]
        Backend::Rdma => {
            use dmkit_verbs::rdma::{RdmaConfig, RdmaServer};
            if has_secret {
                return Err(CliError::usage(
                    "a cluster secret is set (DMKIT_SECRET, DMKIT_SECRET_FILE or --secret-file), \
                     but the rdma backend has none: on RDMA fabrics the network is the trust \
                     boundary (docs/RDMA.md); unset it, or serve over --backend tcp",
                ));
            }
            let cfg = RdmaConfig::from_env().map_err(|e| CliError::usage(e.to_string()))?;
            keep_lease(memnode.clone(), lease_connector(args.backend, None)?)?;
            let device = cfg.device.clone();
            let server = RdmaServer::start(args.listen.as_str(), node, cfg)
                .map_err(|e| CliError::usage(e.to_string()))?;
            let addr = server.local_addr();
            let how = match device {
                Some(d) => format!("rdma on {d}"),
                None => "rdma".to_string(),
            };
            (Box::new(server) as Box<dyn std::any::Any>, addr, how)
        }
        _ => {
            keep_lease(
                memnode.clone(),
                lease_connector(args.backend, secret.clone())?,
            )?;
            let server = crate::connect::serve_tcp(&args.listen, node, secret)?;
            let addr = server.local_addr();
            let how = if has_secret {
                "tcp, cluster secret required".to_string()
            } else {
                "tcp".to_string()
            };
            (Box::new(server) as Box<dyn std::any::Any>, addr, how)
        }
    };
    if let Some(path) = &args.pool {
        // Who holds the pool: a second memnode pointed at it names this one.
        let owner = owner_path(path);
        let text = format!(
            "pid = {}\naddr = \"{addr}\"\nid = {}\n",
            std::process::id(),
            args.id
        );
        if let Err(e) = std::fs::write(&owner, text) {
            tracing::warn!(file = %owner.display(), error = %e, "cannot record this memnode as the pool's owner");
        }
    }
    eprintln!(
        "dmkit memnode: node {} serving {what} on {addr} ({how})",
        args.id
    );
    loop {
        std::thread::park();
    }
}

/// `dmkit_memnode_memory_bytes{node, medium, state}` (used and free bytes of the served
/// memory) and `dmkit_memnode_up`, refreshed every second.
fn publish_memory(
    memnode: &std::sync::Arc<dmkit_fusee::memnode::Memnode>,
    id: u16,
    medium: &'static str,
) -> Result<(), CliError> {
    let node = id.to_string();
    metrics::gauge!("dmkit_memnode_up", "node" => node.clone()).set(1.0);
    let used = metrics::gauge!("dmkit_memnode_memory_bytes", "node" => node.clone(), "medium" => medium, "state" => "used");
    let free = metrics::gauge!("dmkit_memnode_memory_bytes", "node" => node, "medium" => medium, "state" => "free");
    let pool = std::sync::Arc::downgrade(memnode.pool());
    let update = move || -> bool {
        let Some(p) = pool.upgrade() else {
            return false;
        };
        let total = p.data_len() as u64;
        let f = p.free_bytes().min(total);
        used.set((total - f) as f64);
        free.set(f as f64);
        true
    };
    update();
    std::thread::Builder::new()
        .name("memnode-metrics".into())
        .spawn(move || {
            while update() {
                std::thread::sleep(std::time::Duration::from_secs(1));
            }
        })
        .map_err(|e| CliError::runtime(format!("cannot start the metrics thread: {e}")))?;
    Ok(())
}

/// How the lease keeper reaches its peers: over the node's own backend, with short bounds
/// (a peer that does not answer within a fraction of the lease is as good as gone for
/// vouching).
fn lease_connector(
    backend: Backend,
    secret: Option<Vec<u8>>,
) -> Result<std::sync::Arc<dyn dmkit_verbs::Connector>, CliError> {
    use std::time::Duration;
    let bound = Duration::from_millis(300);
    match backend {
        #[cfg(feature = "rdma")]
        Backend::Rdma => {
            let mut cfg = dmkit_verbs::rdma::RdmaConfig::from_env()
                .map_err(|e| CliError::usage(e.to_string()))?;
            cfg.connect_timeout = bound;
            cfg.op_timeout = bound;
            // Vouching is a few small RPCs: no need for deep queues of pinned buffers.
            cfg.send_depth = 16;
            cfg.msg_depth = 8;
            let _ = secret;
            Ok(std::sync::Arc::new(dmkit_verbs::rdma::RdmaConnector::new(
                cfg,
            )))
        }
        _ => Ok(std::sync::Arc::new(dmkit_verbs::tcp::TcpConnector {
            secret,
            connect_timeout: bound,
            op_timeout: bound,
            ..dmkit_verbs::tcp::TcpConnector::default()
        })),
    }
}

/// The lease keeper: once a master has given this node a lease, keeps it alive through the
/// peers while the master is silent, and fences the node when neither answers (see
/// `Memnode::keep_lease`).
fn keep_lease(
    memnode: std::sync::Arc<dmkit_fusee::memnode::Memnode>,
    conn: std::sync::Arc<dyn dmkit_verbs::Connector>,
) -> Result<(), CliError> {
    use std::collections::HashMap;
    use std::sync::Arc;

    use dmkit_verbs::{Connection, Endpoint};

    let cache: parking_lot::Mutex<HashMap<NodeId, Arc<dyn Connection>>> = Default::default();
    let ask: dmkit_fusee::memnode::VouchAsk =
        Arc::new(move |peer: NodeId, addr: &str, req: &[u8]| -> bool {
            let cached = cache.lock().get(&peer).cloned();
            let c = match cached {
                Some(c) => c,
                None => match conn.connect(addr) {
                    Ok(c) if c.node() == peer => {
                        cache.lock().insert(peer, c.clone());
                        c
                    }
                    _ => return false,
                },
            };
            let ep = Endpoint::default();
            ep.add_connection(c);
            match ep.rpc("fusee_lease", peer, req) {
                Ok(r) => r.first() == Some(&0) && r.get(1) == Some(&1),
                Err(_) => {
                    cache.lock().remove(&peer);
                    false
                }
            }
        });
    std::thread::Builder::new()
        .name("memnode-lease".into())
        .spawn(move || {
            loop {
                memnode.keep_lease(ask.clone());
                // Asleep while heartbeats keep the lease fresh (they push its half-way
                // point back): a few wake-ups a second, not twenty. Past half the lease it
                // vouches every 50 ms; the verbs refuse past its end on their own path
                // whenever this thread runs late.
                let ms = std::time::Duration::from_millis;
                std::thread::sleep(memnode.lease_check_in(ms(50), ms(500)));
            }
        })
        .map_err(|e| CliError::runtime(format!("cannot start the lease keeper: {e}")))?;
    Ok(())
}

/// `PATH.owner`: the pid, address and id of the memnode serving the pool at `PATH` (written
/// once it serves; read to name the holder when the pool file is locked).
pub fn owner_path(path: &std::path::Path) -> std::path::PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(".owner");
    std::path::PathBuf::from(s)
}

/// The refusal when another process holds the pool file: names the holder (pid, address and
/// node id from `PATH.owner`, if that is the holder's record).
pub fn pool_in_use(path: &std::path::Path, holder: Option<u32>) -> CliError {
    let rec = std::fs::read_to_string(owner_path(path)).unwrap_or_default();
    let field = |k: &str| {
        rec.lines().find_map(|l| {
            let (key, v) = l.split_once('=')?;
            (key.trim() == k).then(|| v.trim().trim_matches('"').to_string())
        })
    };
    let rec_pid: Option<u32> = field("pid").and_then(|p| p.parse().ok());
    let who = match (holder, rec_pid) {
        (Some(h), Some(p)) if h == p => format!(
            "dmkit memnode pid {h} serving on {} (node {})",
            field("addr").unwrap_or_else(|| "?".into()),
            field("id").unwrap_or_else(|| "?".into())
        ),
        (None, Some(p)) => format!(
            "another process (last recorded owner: pid {p} on {})",
            field("addr").unwrap_or_else(|| "?".into())
        ),
        (Some(h), _) => format!("process {h}"),
        (None, None) => "another process".into(),
    };
    CliError::usage(format!(
        "pool {} is in use by {who}: a pool file is served by one memnode at a time; stop that \
         one first, or serve another file",
        path.display()
    ))
}

/// Opens the pool at `path` (running its recovery), or creates it when missing and `size` is
/// given.
fn open_or_create_pool(
    path: &std::path::Path,
    size: Option<u64>,
    block: usize,
) -> Result<dmkit_pmem_pool::Pool, CliError> {
    use dmkit_pmem_pool::{Pool, PoolOptions};
    let shown = path.display();
    match std::fs::metadata(path) {
        Ok(meta) => {
            if let Some(s) = size {
                if s != meta.len() {
                    return Err(CliError::usage(format!(
                        "pool {shown} exists with size {}; --size {} differs (omit --size to open it)",
                        format_size(meta.len()),
                        format_size(s)
                    )));
                }
            }
            let _p = crate::Progress::start(format!(
                "opening pool {shown} (recovery if it was not closed cleanly)"
            ));
            Pool::open(path).map_err(|e| match e {
                dmkit_pmem_pool::Error::Locked { holder, .. } => pool_in_use(path, holder),
                e => CliError::runtime(format!("cannot open pool {shown}: {e}")),
            })
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let Some(s) = size else {
                return Err(CliError::usage(format!(
                    "pool {shown} does not exist; give --size SIZE to create it"
                )));
            };
            let s = usize::try_from(s).map_err(|_| {
                CliError::usage(format!("--size {s} is too large for this machine"))
            })?;
            let _p = crate::Progress::start(format!(
                "creating pool {shown} ({}, block size {})",
                format_size(s as u64),
                format_size(block as u64)
            ));
            Pool::create(path, s, PoolOptions::default().block_size(block)).map_err(|e| match e {
                dmkit_pmem_pool::Error::Locked { holder, .. } => pool_in_use(path, holder),
                e => CliError::usage(format!("cannot create pool {shown}: {e}")),
            })
        }
        Err(e) => Err(CliError::usage(format!("cannot use pool {shown}: {e}"))),
    }
}
