//! `dmkit gengar-server`: one Gengar server over tcp — an NVM pool in a file (created with
//! `--size` when missing, opened with recovery otherwise; objects from the pool's object
//! allocator) and a DRAM buffer for hot objects, with the hot-object window running on a
//! background thread.

use std::sync::Arc;
use std::time::Duration;

use dmkit_gengar::{GengarServer, ServerConfig};
use dmkit_lease::{Clock, SystemClock};
use dmkit_pmem_pool::{Pool, PoolOptions};
use dmkit_verbs::NodeId;
use dmkit_verbs::tcp::{TcpServer, TcpServerConfig};

use crate::CliError;
use crate::size::format_size;

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
    /// The NVM pool file (created if missing, with --size; opened with recovery otherwise).
    #[arg(long)]
    pub pool: std::path::PathBuf,
    /// Size of a pool file to create (the file's size on disk), e.g. 256MiB.
    #[arg(long, value_parser = crate::size::parse_size)]
    pub size: Option<u64>,
    /// DRAM buffer for hot objects, e.g. 16MiB (0 turns the DRAM cache off).
    #[arg(long, value_parser = crate::size::parse_size)]
    pub dram: u64,
    /// Milliseconds between two hot-object windows (promotion and eviction).
    #[arg(long, default_value_t = 100)]
    pub window: u64,
    /// A file holding the cluster secret; peers must prove they know it.
    #[arg(long, env = "DMKIT_SECRET_FILE")]
    pub secret_file: Option<std::path::PathBuf>,
    /// Serve Prometheus metrics on this address (host:port).
    #[arg(long)]
    pub metrics: Option<String>,
}

pub fn run(args: GengarServerArgs) -> Result<(), CliError> {
    if args.window == 0 {
        return Err(CliError::usage(
            "--window must be at least 1 (milliseconds)",
        ));
    }
    let dram = usize::try_from(args.dram)
        .map_err(|_| CliError::usage(format!("--dram {} is too large", args.dram)))?;
    let secret = args
        .secret_file
        .as_deref()
        .map(crate::memnode::read_secret)
        .transpose()?;
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
        ServerConfig {
            dram_bytes: dram,
            ..ServerConfig::default()
        },
        clock,
    )
    .map_err(|e| CliError::usage(format!("cannot start the Gengar server: {e}")))?;
    let tcp = TcpServer::start(
        args.listen.as_str(),
        server.node().clone(),
        TcpServerConfig {
            secret,
            ..Default::default()
        },
    )
    .map_err(|e| CliError::usage(e.to_string()))?;
    let _windows = server.spawn_windows(Duration::from_millis(args.window));
    eprintln!(
        "dmkit gengar-server: node {} serving {} NVM pool {} ({}) and {} DRAM buffer, window {} ms on {} (tcp{})",
        args.id,
        format_size(nvm_len),
        args.pool.display(),
        if created {
            "created".to_string()
        } else {
            format!("opened, {live} objects recovered")
        },
        format_size(dram as u64),
        args.window,
        tcp.local_addr(),
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
