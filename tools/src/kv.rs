//! `dmkit kv`: one FUSEE operation from the command line.
//!
//! A GET prints the value on stdout and exits 0; a missing key prints nothing on stdout, says
//! so on stderr and exits 1; any other failure exits 2 (bad usage) or 3 (the cluster failed).

use std::io::Write;
use std::path::PathBuf;

use dmkit_fusee::{Client, ClientConfig, DeleteResult};

use crate::CliError;
use crate::cluster_file::ClusterFile;

#[derive(Debug, clap::Args)]
pub struct KvArgs {
    /// The cluster file.
    #[arg(long)]
    pub cluster: PathBuf,
    /// The FUSEE client id this command acts as (its blocks and log are recovered at start).
    #[arg(long, default_value_t = default_client_id())]
    pub client_id: u64,
    #[command(subcommand)]
    pub op: KvOp,
}

#[derive(Debug, clap::Subcommand)]
pub enum KvOp {
    /// Store VALUE under KEY (insert or overwrite).
    Put { key: String, value: String },
    /// Print the value of KEY.
    Get { key: String },
    /// Remove KEY.
    Del { key: String },
}

fn default_client_id() -> u64 {
    // SAFETY: getuid has no preconditions and cannot fail.
    let uid = unsafe { libc::getuid() };
    0xC1_0000 + u64::from(uid & 0xFFFF)
}

/// Holds an exclusive lock on the client id for this process's lifetime, so two commands
/// never act as the same client at once.
pub(crate) struct IdLock(#[allow(dead_code)] std::fs::File);

pub(crate) fn lock_id(id: u64, wait: bool) -> Result<IdLock, CliError> {
    let path = std::env::temp_dir().join(format!("dmkit-client-{id}.lock"));
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| CliError::usage(format!("cannot open lock file {}: {e}", path.display())))?;
    use std::os::fd::AsRawFd;
    let mode = if wait {
        libc::LOCK_EX
    } else {
        libc::LOCK_EX | libc::LOCK_NB
    };
    // SAFETY: flock on a file descriptor we own (it blocks only when `wait`).
    let r = unsafe { libc::flock(f.as_raw_fd(), mode) };
    if r != 0 && !wait {
        return Err(CliError::usage(format!(
            "FUSEE client id {id} is in use by another process (lock {})",
            path.display()
        )));
    }
    if r != 0 {
        return Err(CliError::usage(format!(
            "cannot lock {}: {}",
            path.display(),
            std::io::Error::last_os_error()
        )));
    }
    Ok(IdLock(f))
}

/// A FUSEE client for the cluster file, recovered under `id` (so a crashed earlier run with
/// the same id leaves nothing half done and no memory behind).
pub fn client(file: &ClusterFile, id: u64) -> Result<Client, CliError> {
    let nodes = crate::connect::node_ids(file);
    let f = file.clone();
    let mut cfg = ClientConfig::new(id);
    cfg.reconnect = Some(crate::connect::reconnect(file)?);
    // How long an operation waits for a new membership after hitting a failed node.
    if let Ok(ms) = std::env::var("DMKIT_FAILOVER_WAIT_MS") {
        let ms: u64 = ms.trim().parse().map_err(|_| {
            CliError::usage(format!(
                "DMKIT_FAILOVER_WAIT_MS={ms} is not a number of milliseconds"
            ))
        })?;
        cfg.failover_wait = std::time::Duration::from_millis(ms);
    }
    let (c, _) = Client::recover(
        move || crate::connect::endpoint(&f).map_err(|e| dmkit_fusee::Error::Config(e.message())),
        &nodes,
        cfg,
    )
    .map_err(|e| CliError::with_code(format!("cannot join the cluster: {e}"), 3))?;
    Ok(c)
}

pub fn run(args: KvArgs) -> Result<(), CliError> {
    let file = ClusterFile::load(&args.cluster).map_err(CliError::usage)?;
    let _lock = lock_id(args.client_id, true)?;
    let c = client(&file, args.client_id)?;
    let fail = |e: dmkit_fusee::Error| CliError::with_code(e.to_string(), 3);
    let r = match args.op {
        KvOp::Put { key, value } => c.upsert(key.as_bytes(), value.as_bytes()).map_err(fail),
        KvOp::Get { key } => match c.search(key.as_bytes()).map_err(fail)? {
            Some(v) => {
                let mut out = std::io::stdout().lock();
                out.write_all(&v)
                    .and_then(|()| out.write_all(b"\n"))
                    .map_err(|e| CliError::with_code(format!("cannot write the value: {e}"), 3))
            }
            None => Err(CliError::with_code(format!("key '{key}' not found"), 1)),
        },
        KvOp::Del { key } => match c.delete(key.as_bytes()).map_err(fail)? {
            DeleteResult::Deleted => Ok(()),
            DeleteResult::NotFound => Err(CliError::with_code(format!("key '{key}' not found"), 1)),
        },
    };
    // Finish background cleanups before exiting, so nothing is left for the next recovery.
    let _ = c.flush();
    r
}
