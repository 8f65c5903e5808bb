//! `dmkit memnode`: a memory node serving registered memory to clients.

use std::sync::Arc;

use dmkit_verbs::tcp::{TcpServer, TcpServerConfig};
use dmkit_verbs::{Access, DramBacking, MemoryNode, NodeId};

use crate::size::format_size;
use crate::{Backend, CliError};

/// Where the DRAM region of a memory node starts in its remote address space: fixed, so
/// addresses are the same on every start.
pub const DRAM_BASE: u64 = 1 << 40;
/// Where the pool's data area starts: fixed, so pointers stored in the pool stay valid across
/// restarts of the node.
pub const POOL_BASE: u64 = 1 << 44;

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
    /// Size of a pool file to create.
    #[arg(long, value_parser = crate::size::parse_size)]
    pub size: Option<u64>,
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
    match args.backend {
        Backend::Tcp => {}
        #[cfg(feature = "rdma")]
        Backend::Rdma => {}
        b => {
            return Err(CliError::usage(format!(
                "backend '{b}' cannot serve a memory node from this build (use --backend tcp{})",
                if b == Backend::Rdma {
                    ", or build dmkit with --features rdma"
                } else {
                    ""
                }
            )));
        }
    }
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
    let secret = args.secret_file.as_deref().map(read_secret).transpose()?;
    let node = Arc::new(MemoryNode::new(NodeId(args.id)));
    let mut served = Vec::new();
    if let Some(dram) = args.dram {
        let dram = usize::try_from(dram)
            .map_err(|_| CliError::usage(format!("--dram {dram} is too large for this machine")))?;
        let backing = DramBacking::try_new(dram).map_err(|e| {
            CliError::runtime(format!(
                "cannot allocate {} of DRAM: {e}",
                format_size(dram as u64)
            ))
        })?;
        node.register(Arc::new(backing), Access::ALL, Some(DRAM_BASE))
            .map_err(|e| CliError::runtime(e.to_string()))?;
        served.push(format!("{} of DRAM", format_size(dram as u64)));
    }
    if let Some(path) = &args.pool {
        let pool = open_or_create_pool(path, args.size)?;
        let len = pool.data_len() as u64;
        let kind = if pool.is_persistent() {
            "persistent"
        } else {
            "volatile"
        };
        node.register(
            Arc::new(crate::pool_backing::PoolBacking(Arc::new(pool))),
            Access::ALL,
            Some(POOL_BASE),
        )
        .map_err(|e| CliError::runtime(e.to_string()))?;
        served.push(format!(
            "{} {kind} pool {}",
            format_size(len),
            path.display()
        ));
    }
    if let Some(m) = &args.metrics {
        let at = crate::metrics_http::serve(m).map_err(CliError::usage)?;
        eprintln!("dmkit memnode: metrics at http://{at}/metrics");
    }
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
        "dmkit memnode: node {} serving {} on {} (tcp{})",
        args.id,
        served.join(" and "),
        server.local_addr(),
        if args.secret_file.is_some() {
            ", cluster secret required"
        } else {
            ""
        }
    );
    loop {
        std::thread::park();
    }
}

/// Opens the pool at `path` (running its recovery), or creates it when missing and `size` is
/// given.
fn open_or_create_pool(
    path: &std::path::Path,
    size: Option<u64>,
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
            Pool::open(path)
                .map_err(|e| CliError::runtime(format!("cannot open pool {shown}: {e}")))
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
            Pool::create(path, s, PoolOptions::default())
                .map_err(|e| CliError::usage(format!("cannot create pool {shown}: {e}")))
        }
        Err(e) => Err(CliError::usage(format!("cannot use pool {shown}: {e}"))),
    }
}
