//! `dmkit memnode`: a memory node serving registered memory to clients.

use std::sync::Arc;

use dmkit_verbs::tcp::{TcpServer, TcpServerConfig};
use dmkit_verbs::{Access, DramBacking, MemoryNode, NodeId};

use crate::size::format_size;
use crate::{Backend, CliError};

/// Where the DRAM region of a memory node starts in its remote address space: fixed, so
/// addresses are the same on every start.
pub const DRAM_BASE: u64 = 1 << 40;

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
    if args.backend != Backend::Tcp {
        return Err(CliError::usage(format!(
            "backend '{}' cannot serve a memory node from this build (use --backend tcp)",
            args.backend
        )));
    }
    if args.pool.is_some() || args.size.is_some() {
        return Err(CliError::usage(
            "--pool/--size: persistent pools are not available in this build yet; use --dram SIZE",
        ));
    }
    let Some(dram) = args.dram else {
        return Err(CliError::usage("nothing to serve: give --dram SIZE (e.g. --dram 64MiB)"));
    };
    let dram = usize::try_from(dram)
        .map_err(|_| CliError::usage(format!("--dram {dram} is too large for this machine")))?;
    let secret = args.secret_file.as_deref().map(read_secret).transpose()?;
    if let Some(m) = &args.metrics {
        let at = crate::metrics_http::serve(m).map_err(CliError::usage)?;
        eprintln!("dmkit memnode: metrics at http://{at}/metrics");
    }
    let node = Arc::new(MemoryNode::new(NodeId(args.id)));
    let backing = DramBacking::try_new(dram).map_err(|e| {
        CliError::runtime(format!("cannot allocate {} of DRAM: {e}", format_size(dram as u64)))
    })?;
    node.register(Arc::new(backing), Access::ALL, Some(DRAM_BASE))
        .map_err(|e| CliError::runtime(e.to_string()))?;
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
        "dmkit memnode: node {} serving {} of DRAM on {} (tcp{})",
        args.id,
        format_size(dram as u64),
        server.local_addr(),
        if server_has_secret(&args.secret_file) { ", cluster secret required" } else { "" }
    );
    loop {
        std::thread::park();
    }
}

fn server_has_secret(p: &Option<std::path::PathBuf>) -> bool {
    p.is_some()
}
