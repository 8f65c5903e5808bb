//! `dmkit gengar-server`: one Gengar server over tcp or rdma — an NVM pool in a file (created
//! with `--size` when missing, opened with recovery otherwise; objects from the pool's object
//! allocator) and a DRAM buffer for hot objects, with the hot-object window running on a
//! background thread. On rdma both regions are registered with the NIC once, at start (a
//! registration the memlock limit refuses stops the start with the limit and the fix).

use std::sync::Arc;
use std::time::Duration;

use dmkit_gengar::{GengarServer, ServerConfig};
use dmkit_lease::{Clock, SystemClock};
use dmkit_pmem_pool::{Pool, PoolOptions};
use dmkit_verbs::NodeId;

use crate::size::format_size;
use crate::{Backend, CliError};

/// Block size of a new Gengar pool (the object allocator's size classes go up to one block).
const BLOCK: usize = 64 << 10;

#[derive(Debug, clap::Args)]
pub struct GengarServerArgs {
    /// Address to listen on (host:port).
    #[arg(long)]
    pub listen: String,
    /// This server's id (its part of every global address; unique in the cluster).
    #[arg(long)]
    pub id: u16,
    /// Verbs backend to serve with (rdma needs a dmkit built with --features rdma and an
    /// RDMA interface address to listen on).
    #[arg(long, value_enum, default_value_t = Backend::Tcp)]
    pub backend: Backend,
    /// The NVM pool file (created if missing, with --size; opened with recovery otherwise).
    #[arg(long)]
    pub pool: std::path::PathBuf,
    /// Size of a pool file to create (the file's size on disk), e.g. 256MiB.
    #[arg(long, value_parser = crate::size::parse_size)]
    pub size: Option<u64>,
    /// DRAM buffer for hot objects, e.g. 16MiB (0 turns the DRAM cache off).
    #[arg(long, value_parser = crate::size::parse_size_or_zero)]
    pub dram: u64,
    /// Milliseconds between two hot-object windows (promotion and eviction).
    #[arg(long, default_value_t = 100)]
    pub window: u64,
    /// Multiply every lease duration by this (the defaults suit round trips of microseconds;
    /// on a fabric whose lease RPCs take milliseconds, e.g. SoftRoCE under emulation, leases
    /// that short lapse between two accesses).
    #[arg(long, default_value_t = 1)]
    pub lease_scale: u32,
    /// A file holding the cluster secret; peers must prove they know it.
    #[arg(long, env = "DMKIT_SECRET_FILE")]
    pub secret_file: Option<std::path::PathBuf>,
    /// Serve Prometheus metrics on this address (host:port).
    #[arg(long)]
    pub metrics: Option<String>,
}

pub fn run(args: GengarServerArgs) -> Result<(), CliError> {
    args.backend.check_serves("a Gengar server")?;
    if args.window == 0 {
        return Err(CliError::usage(
            "--window must be at least 1 (milliseconds)",
        ));
    }
    if !(1..=1000).contains(&args.lease_scale) {
        return Err(CliError::usage("--lease-scale must be 1 to 1000"));
    }
    let dram = usize::try_from(args.dram)
        .map_err(|_| CliError::usage(format!("--dram {} is too large", args.dram)))?;
    let secret = match args.secret_file.as_deref() {
        Some(p) => Some(crate::memnode::read_secret(p)?),
        None if args.backend == Backend::Rdma => crate::connect::secret(None)?,
        None => None,
    };
    if args.backend == Backend::Rdma && secret.is_some() {
        return Err(CliError::usage(
            "a cluster secret is set (DMKIT_SECRET, DMKIT_SECRET_FILE or --secret-file), but \
             the rdma backend has none: on RDMA fabrics the network is the trust boundary \
             (docs/RDMA.md); unset it, or serve over --backend tcp",
        ));
    }
    if let Some(m) = &args.metrics {
        let at = crate::metrics_http::serve(m).map_err(CliError::usage)?;
        eprintln!("dmkit gengar-server: metrics at http://{at}/metrics");
    }
    let (pool, created) = open_or_create(&args.pool, args.size)?;
    let (nvm_len, live) = (pool.data_len() as u64, pool.stats().live_objects);
    let clock: Arc<dyn Clock> = Arc::new(SystemClock::new());
    let server = GengarServer::new(
        NodeId(args.id),
        pool,
        dmkit_workloads::gengar_apps::scaled_leases(
            ServerConfig {
                dram_bytes: dram,
                ..ServerConfig::default()
            },
            args.lease_scale,
        ),
        clock,
    )
    .map_err(|e| CliError::usage(format!("cannot start the Gengar server: {e}")))?;
    let has_secret = secret.is_some();
    let (_serving, addr, how) = serve(&args, server.node().clone(), secret)?;
    let _windows = server.spawn_windows(Duration::from_millis(args.window));
    eprintln!(
        "dmkit gengar-server: node {} serving {} NVM pool {} ({}) and {}, window {} ms on {} ({}{})",
        args.id,
        format_size(nvm_len),
        args.pool.display(),
        if created {
            "created".to_string()
        } else {
            format!("opened, {live} objects recovered")
        },
        if dram == 0 {
            "no DRAM buffer (hot-object caching off)".to_string()
        } else {
            format!("{} DRAM buffer", format_size(dram as u64))
        },
        args.window,
        addr,
        how,
        if has_secret {
            ", cluster secret required"
        } else {
            ""
        }
    );
    loop {
        std::thread::park();
    }
}

/// Serves `node` on `--listen` over `--backend`: the server (kept alive by the caller), its
/// address and how it serves.
fn serve(
    args: &GengarServerArgs,
    node: Arc<dmkit_verbs::MemoryNode>,
    secret: Option<Vec<u8>>,
) -> Result<(Box<dyn std::any::Any>, std::net::SocketAddr, String), CliError> {
    match args.backend {
        #[cfg(feature = "rdma")]
        Backend::Rdma => {
            use dmkit_verbs::rdma::{RdmaConfig, RdmaServer};
            let _ = secret;
            let cfg = RdmaConfig::from_env().map_err(|e| CliError::usage(e.to_string()))?;
            let how = match &cfg.device {
                Some(d) => format!("rdma on {d}"),
                None => "rdma".to_string(),
            };
            // Registers the NVM pool and the DRAM buffer with the NIC now.
            let server = RdmaServer::start(args.listen.as_str(), node, cfg)
                .map_err(|e| CliError::usage(e.to_string()))?;
            let addr = server.local_addr();
            Ok((Box::new(server), addr, how))
        }
        _ => {
            let server = crate::connect::serve_tcp(&args.listen, node, secret)?;
            let addr = server.local_addr();
            Ok((Box::new(server), addr, "tcp".to_string()))
        }
    }
}

/// Opens the pool at `path` (running its recovery), or creates it when missing and `size` is
/// given; whether it was created.
fn open_or_create(path: &std::path::Path, size: Option<u64>) -> Result<(Pool, bool), CliError> {
    let shown = path.display();
    match std::fs::metadata(path) {
        Ok(meta) => {
            if let Some(s) = size.filter(|s| *s != meta.len()) {
                return Err(CliError::usage(format!(
                    "pool {shown} exists with size {}; --size {} differs (omit --size to open it)",
                    format_size(meta.len()),
                    format_size(s)
                )));
            }
            let pool = Pool::open(path).map_err(|e| match e {
                dmkit_pmem_pool::Error::Locked { holder, .. } => {
                    crate::memnode::pool_in_use(path, holder)
                }
                e => CliError::usage(format!("cannot open pool {shown}: {e}")),
            })?;
            Ok((pool, false))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let Some(s) = size else {
                return Err(CliError::usage(format!(
                    "pool {shown} does not exist; give --size SIZE to create it"
                )));
            };
            let s = usize::try_from(s)
                .map_err(|_| CliError::usage(format!("--size {s} is too large")))?;
            let pool = Pool::create(path, s, PoolOptions::default().block_size(BLOCK))
                .map_err(|e| CliError::usage(format!("cannot create pool {shown}: {e}")))?;
            Ok((pool, true))
        }
        Err(e) => Err(CliError::usage(format!("cannot use pool {shown}: {e}"))),
    }
}
