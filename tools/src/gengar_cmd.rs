//! `dmkit gengar`: one Gengar operation from the command line, as a client of the Gengar
//! servers a cluster file names (`backend` tcp or rdma; each `[[memnode]]` entry is a
//! `dmkit gengar-server`; the FUSEE keys — master, replicas — are not used).
//!
//! An object's address is printed and taken as `SERVER:0xOFFSET/gGENERATION/SIZE`.
//!
//! | code | meaning |
//! |---|---|
//! | 0 | done (`read` printed the object's bytes on stdout) |
//! | 1 | the object was freed (or never allocated) |
//! | 2 | usage: a bad flag, address or cluster file |
//! | 3 | the cluster failed: no server answers, the object's server is down, out of space |

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;

use dmkit_gengar::{ClientConfig, Error, GengarClient, GlobalAddr};
use dmkit_lease::{Clock, SystemClock};
use dmkit_verbs::NodeId;

use crate::CliError;
use crate::cluster_file::ClusterFile;

#[derive(Debug, clap::Args)]
pub struct GengarArgs {
    /// The cluster file (its `[[memnode]]` entries are the Gengar servers).
    #[arg(long)]
    pub cluster: PathBuf,
    /// The Gengar client id this command acts as (it holds leases and locks under it);
    /// default: one derived from the process id.
    #[arg(long)]
    pub client_id: Option<u64>,
    #[command(subcommand)]
    pub op: GengarOp,
}

#[derive(Debug, clap::Subcommand)]
pub enum GengarOp {
    /// Allocate an object of SIZE bytes (zero-filled) and print its address.
    Alloc { size: String },
    /// Write TEXT at the start of the object (durably; returns once NVM has it).
    Write { addr: String, text: String },
    /// Print the object's bytes.
    Read { addr: String },
    /// Free the object.
    Free { addr: String },
    /// Print every server's free NVM and DRAM bytes.
    Stat,
}

/// `SERVER:0xOFFSET/gGENERATION/SIZE`.
pub fn format_addr(a: &GlobalAddr) -> String {
    format!("{a}/{}", a.size)
}

/// Parses [`format_addr`]'s form.
pub fn parse_addr(s: &str) -> Result<GlobalAddr, String> {
    let bad = || format!("invalid object address '{s}': use SERVER:0xOFFSET/gGENERATION/SIZE");
    let (server, rest) = s.split_once(':').ok_or_else(bad)?;
    let mut parts = rest.split('/');
    let (Some(off), Some(generation), Some(size), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(bad());
    };
    let offset = off
        .strip_prefix("0x")
        .and_then(|h| u64::from_str_radix(h, 16).ok())
        .ok_or_else(bad)?;
    Ok(GlobalAddr {
        server: NodeId(server.parse().map_err(|_| bad())?),
        offset,
        generation: generation
            .strip_prefix('g')
            .and_then(|g| g.parse().ok())
            .ok_or_else(bad)?,
        size: size.parse().map_err(|_| bad())?,
    })
}

/// A Gengar client of the file's servers over its backend, reconnecting to a server that
/// restarts.
pub fn client(file: &ClusterFile, id: u64) -> Result<GengarClient, CliError> {
    let ep = crate::connect::gengar_endpoint(file).map_err(|e| CliError::with_code(e.msg, 3))?;
    let clock: Arc<dyn Clock> = Arc::new(SystemClock::new());
    let c = GengarClient::new(ep, id, ClientConfig::default(), clock).map_err(failed)?;
    c.set_reconnect(crate::connect::reconnect(file)?);
    Ok(c)
}

fn failed(e: Error) -> CliError {
    match e {
        Error::Freed(_) => CliError::with_code(e.to_string(), 1),
        Error::OutOfObject { .. } | Error::UnknownServer(_) => CliError::usage(e.to_string()),
        e => CliError::with_code(e.to_string(), 3),
    }
}

pub fn run(args: GengarArgs) -> Result<(), CliError> {
    let file = ClusterFile::load(&args.cluster).map_err(CliError::usage)?;
    let addr = |s: &str| parse_addr(s).map_err(CliError::usage);
    // Parse before connecting: bad input is a usage error whatever the cluster's state.
    let op = match &args.op {
        GengarOp::Alloc { size } => {
            let n = crate::size::parse_size(size).map_err(CliError::usage)?;
            if n == 0 {
                return Err(CliError::usage("an object has at least one byte"));
            }
            Op::Alloc(usize::try_from(n).map_err(|_| CliError::usage("SIZE is too large"))?)
        }
        GengarOp::Write { addr: a, text } => Op::Write(addr(a)?, text.clone()),
        GengarOp::Read { addr: a } => Op::Read(addr(a)?),
        GengarOp::Free { addr: a } => Op::Free(addr(a)?),
        GengarOp::Stat => Op::Stat,
    };
    let id = args
        .client_id
        .unwrap_or(0x6E_0000_0000 | u64::from(std::process::id()));
    let c = client(&file, id)?;
    if let Op::Write(a, _) | Op::Read(a) | Op::Free(a) = &op {
        // The object's server must be in the file, and have answered.
        let Some(m) = file.memnodes.iter().find(|m| m.id == a.server.0) else {
            return Err(CliError::usage(format!(
                "object {} is on server {}, which the cluster file does not name",
                format_addr(a),
                a.server
            )));
        };
        if !c.free_nvm().iter().any(|(n, _)| *n == a.server) {
            return Err(CliError::with_code(
                format!(
                    "Gengar server {} is down: it does not answer at {}",
                    a.server, m.addr
                ),
                3,
            ));
        }
    }
    let mut out = std::io::stdout().lock();
    let w = |r: std::io::Result<()>| r.map_err(|e| CliError::runtime(format!("stdout: {e}")));
    match op {
        Op::Alloc(size) => {
            let a = c.alloc(size).map_err(failed)?;
            w(writeln!(out, "{}", format_addr(&a)))?;
        }
        Op::Write(a, text) => c.write(a, 0, text.as_bytes()).map_err(failed)?,
        Op::Read(a) => {
            let b = c.read(a).map_err(failed)?;
            w(out.write_all(&b).and_then(|()| out.flush()))?;
        }
        Op::Free(a) => c.free(a).map_err(failed)?,
        Op::Stat => {
            for (node, free) in c.free_nvm() {
                w(writeln!(out, "server {node}: {free} bytes of NVM free"))?;
            }
        }
    }
    Ok(())
}

enum Op {
    Alloc(usize),
    Write(GlobalAddr, String),
    Read(GlobalAddr),
    Free(GlobalAddr),
    Stat,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_round_trip_and_bad_ones_are_refused() {
        let a = GlobalAddr {
            server: NodeId(3),
            offset: 0x1_0040,
            generation: 7,
            size: 300,
        };
        assert_eq!(format_addr(&a), "3:0x10040/g7/300");
        assert_eq!(parse_addr(&format_addr(&a)).unwrap(), a);
        for bad in [
            "",
            "3",
            "3:0x10/g7",
            "3:10/g7/3",
            "x:0x1/g1/1",
            "3:0x1/7/1",
            "3:0x1/g1/1/2",
        ] {
            assert!(parse_addr(bad).is_err(), "{bad}");
        }
    }
}
