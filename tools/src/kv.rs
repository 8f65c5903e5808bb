//! `dmkit kv`: one FUSEE operation from the command line.
//!
//! Exit codes (docs/OPERATOR.md lists them too):
//!
//! | code | meaning |
//! |---|---|
//! | 0 | done (`get` wrote the value on stdout) |
//! | 1 | the key was not found (`get`, `del`); nothing on stdout |
//! | 2 | usage: a bad flag or argument, an unreadable or invalid cluster file, an unreadable `--value-file`, no value given (and stdin a terminal), a key too long or a value over the maximum (64 MiB; nothing is written), a client id in use |
//!
//! Values are bytes: `put KEY VALUE` takes the argument's bytes, `put KEY --value-file PATH`
//! a file's, `put KEY` alone stdin's (any bytes, `\0` included). `get` writes the value's
//! bytes to stdout as they are, adding a newline only when stdout is a terminal (so
//! `dmkit kv get KEY > file` is the value exactly). Keys may be empty, as in Redis.
//! | 3 | the cluster failed: no memory node answers, a member stays unreachable, the cluster is not formatted, an operation failed |

use std::io::{IsTerminal, Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use dmkit_fusee::{Client, ClientConfig, DeleteResult};

use crate::CliError;
use crate::cluster_file::ClusterFile;

#[derive(Debug, clap::Args)]
pub struct KvArgs {
    /// The cluster file.
    #[arg(long)]
    pub cluster: PathBuf,
    /// The FUSEE client id this command acts as (its blocks and log are recovered at start).
    /// Ids are per cluster: two processes on one host may use the same id for two clusters,
    /// not for one.
    #[arg(long, default_value_t = default_client_id())]
    pub client_id: u64,
    /// How long an operation waits for the master to fail an unreachable member over
    /// before giving up (exit 3); also DMKIT_FAILOVER_WAIT_MS.
    #[arg(long, value_parser = parse_ms)]
    pub wait: Option<Duration>,
    #[command(subcommand)]
    pub op: KvOp,
}

fn parse_ms(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    let (n, mult) = if let Some(n) = t.strip_suffix("ms") {
        (n, 1)
    } else if let Some(n) = t.strip_suffix('s') {
        (n, 1000)
    } else {
        (t, 1)
    };
    n.trim()
        .parse::<u64>()
        .map(|n| Duration::from_millis(n * mult))
        .map_err(|_| {
            format!("invalid duration '{s}': use milliseconds (500, 500ms) or seconds (5s)")
        })
}

#[derive(Debug, clap::Subcommand)]
pub enum KvOp {
    /// Store a value under KEY (insert or overwrite): VALUE, the bytes of --value-file, or
    /// (with neither) the bytes of stdin.
    Put {
        key: String,
        value: Option<String>,
        /// Read the value from this file (any bytes).
        #[arg(long, conflicts_with = "value")]
        value_file: Option<PathBuf>,
    },
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

/// Holds this process's claim on its client id (see [`lock_id`]); dropping it (after the
/// client it guards: declare it first) lets the id go and removes its lock file.
#[derive(Debug)]
pub(crate) struct IdLock(());

impl Drop for IdLock {
    fn drop(&mut self) {
        // Removed while still locked, then unlocked: a process that opened the file before
        // and waits on it finds it gone once it has the lock, and opens the path again (see
        // `take_id_lock`), so at most one holds the lock of the file at the path.
        for (path, file) in LOCKS.lock().drain(..) {
            let _ = std::fs::remove_file(&path);
            drop(file);
        }
    }
}

/// How the next [`client`] locks its id: whether to wait for another process using it.
static LOCK_WAIT: parking_lot::Mutex<Option<bool>> = parking_lot::Mutex::new(None);
/// The id locks taken, held for the process's lifetime.
static LOCKS: parking_lot::Mutex<Vec<(PathBuf, std::fs::File)>> =
    parking_lot::Mutex::new(Vec::new());

/// Declares that this process acts as a FUSEE client id: [`client`] then locks the id within
/// the cluster it joins (client ids are scoped to the cluster's uuid, so two clusters on one
/// host can use the same id), waiting for another holder when `wait`, failing at once (exit
/// 2, naming `--client-id`) otherwise.
pub(crate) fn lock_id(_id: u64, wait: bool) -> Result<IdLock, CliError> {
    *LOCK_WAIT.lock() = Some(wait);
    Ok(IdLock(()))
}

/// The lock of client `id` in cluster `uuid`: `$TMPDIR/dmkit-client-<uuid>-<id>.lock`,
/// holding the holder's pid; removed by its holder when it lets go ([`IdLock`]).
fn take_id_lock(uuid: u128, id: u64, wait: bool) -> Result<(PathBuf, std::fs::File), CliError> {
    use std::os::unix::fs::MetadataExt;
    let path = std::env::temp_dir().join(format!("dmkit-client-{uuid:032x}-{id}.lock"));
    loop {
        let f = lock_file(&path, uuid, id, wait)?;
        // The holder before us may have removed the file between our open and our lock:
        // ours is the lock only if the path still names the file we locked.
        let same = match (f.metadata(), std::fs::metadata(&path)) {
            (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
            _ => false,
        };
        if same {
            return Ok((path, f));
        }
    }
}

/// Opens (creating) and locks the lock file at `path` (see [`take_id_lock`]).
fn lock_file(
    path: &std::path::Path,
    uuid: u128,
    id: u64,
    wait: bool,
) -> Result<std::fs::File, CliError> {
    use std::io::{Read, Seek};
    use std::os::fd::AsRawFd;
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(path)
        .map_err(|e| CliError::usage(format!("cannot open lock file {}: {e}", path.display())))?;
    // SAFETY: flock on a descriptor we own; it does not block with LOCK_NB.
    let r = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if r != 0 {
        let mut holder = String::new();
        let _ = f.read_to_string(&mut holder);
        let holder = holder.trim();
        let who = if holder.is_empty() {
            "another process".to_string()
        } else {
            format!("process {holder}")
        };
        if !wait {
            return Err(CliError::usage(format!(
                "FUSEE client id {id} is in use by {who} in this cluster ({uuid:032x}): \
                 give this one another --client-id"
            )));
        }
        eprintln!(
            "dmkit: FUSEE client id {id} is in use by {who}; waiting for it (or give another --client-id)"
        );
        // SAFETY: as above; blocks until the holder lets go.
        let r = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX) };
        if r != 0 {
            return Err(CliError::usage(format!(
                "cannot lock {}: {}",
                path.display(),
                std::io::Error::last_os_error()
            )));
        }
    }
    let _ = f.set_len(0);
    let _ = f.rewind();
    let _ = writeln!(f, "{}", std::process::id());
    Ok(f)
}

/// Says what a failure to join or to serve means, naming the node's address from the file.
fn explain(e: &dmkit_fusee::Error, file: &ClusterFile) -> String {
    let node = match e {
        dmkit_fusee::Error::Verbs(dmkit_verbs::Error::NoSuchNode(n)) => Some(*n),
        dmkit_fusee::Error::Node { node, .. }
        | dmkit_fusee::Error::Unavailable(node)
        | dmkit_fusee::Error::Refused(node) => Some(*node),
        _ => None,
    };
    let Some(n) = node else {
        return e.to_string();
    };
    match file.memnodes.iter().find(|m| m.id == n.0) {
        Some(m) if matches!(e, dmkit_fusee::Error::Verbs(_)) => format!(
            "memory node {} at {} does not answer this client and is still a member of the \
             cluster: it is down and not yet failed over (is the master running?), or the \
             cluster file's address for it is wrong ({e})",
            m.id, m.addr
        ),
        Some(m) => format!(
            "{e} (memory node {} is {} in the cluster file)",
            m.id, m.addr
        ),
        None => e.to_string(),
    }
}

/// A memory node that does not answer (or refuses while the membership changes).
fn node_failure(e: &dmkit_fusee::Error) -> bool {
    match e {
        dmkit_fusee::Error::Verbs(v) => {
            v.is_node_failure() || matches!(v, dmkit_verbs::Error::NoSuchNode(_))
        }
        dmkit_fusee::Error::Unavailable(_) | dmkit_fusee::Error::Refused(_) => true,
        _ => false,
    }
}

/// A verb refused because the node's region was rekeyed or fenced: a membership change in
/// progress, not a failure.
fn membership_changing(e: &dmkit_fusee::Error) -> bool {
    matches!(
        e,
        dmkit_fusee::Error::Verbs(dmkit_verbs::Error::RemoteAccess {
            fault: dmkit_verbs::AccessFault::UnknownRkey | dmkit_verbs::AccessFault::Fenced,
            ..
        })
    )
}

/// Usage errors among FUSEE's: input this command was given, not a failure of the cluster.
fn is_usage(e: &dmkit_fusee::Error) -> bool {
    matches!(
        e,
        dmkit_fusee::Error::KeyTooLong(_)
            | dmkit_fusee::Error::ValueTooLong(_)
            | dmkit_fusee::Error::ObjectTooLarge(..)
            | dmkit_fusee::Error::ValueTooLarge { .. }
            | dmkit_fusee::Error::ReservedKey { .. }
    )
}

fn too_large(max: usize) -> CliError {
    CliError::usage(format!(
        "the value is larger than the maximum of {max} bytes ({} MiB): nothing was written",
        max >> 20
    ))
}

/// At most `max` bytes from `r`; more is [`too_large`].
fn read_at_most(r: impl Read, max: usize, what: &str) -> Result<Vec<u8>, CliError> {
    let mut v = Vec::new();
    r.take(max as u64 + 1)
        .read_to_end(&mut v)
        .map_err(|e| CliError::usage(format!("cannot read {what}: {e}")))?;
    if v.len() > max {
        return Err(too_large(max));
    }
    Ok(v)
}

/// The value `put` stores: the argument, the file, or stdin; at most `max` bytes, checked
/// before anything is connected or written.
fn value_of(arg: Option<&str>, file: Option<&Path>, max: usize) -> Result<Vec<u8>, CliError> {
    match (arg, file) {
        (Some(v), _) if v.len() > max => Err(too_large(max)),
        (Some(v), _) => Ok(v.as_bytes().to_vec()),
        (None, Some(p)) => {
            let what = format!("--value-file {}", p.display());
            let f = std::fs::File::open(p)
                .map_err(|e| CliError::usage(format!("cannot read {what}: {e}")))?;
            if f.metadata()
                .is_ok_and(|m| m.is_file() && m.len() > max as u64)
            {
                return Err(too_large(max));
            }
            read_at_most(f, max, &what)
        }
        (None, None) => {
            let stdin = std::io::stdin();
            if stdin.is_terminal() {
                return Err(CliError::usage(
                    "no value: give it as VALUE, with --value-file PATH, or on stdin \
                     (e.g. `dmkit kv put KEY < file`)",
                ));
            }
            read_at_most(stdin.lock(), max, "the value from stdin")
        }
    }
}

/// A FUSEE client for the cluster file, recovered under `id` (so a crashed earlier run with
/// the same id leaves nothing half done and no memory behind).
pub fn client(file: &ClusterFile, id: u64) -> Result<Client, CliError> {
    client_with(file, id, None, true)
}

/// [`client`], waiting at most `wait` (default 30 s, or DMKIT_FAILOVER_WAIT_MS) for the
/// master to fail over a member this client cannot reach. Without `recover` the client only
/// reads: it joins without finishing what an earlier run with its id left (that needs every
/// member's block list; the next writer with the id does it), so it reads while a member
/// it cannot reach is still a member.
pub fn client_with(
    file: &ClusterFile,
    id: u64,
    wait: Option<Duration>,
    recover: bool,
) -> Result<Client, CliError> {
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
        cfg.failover_wait = Duration::from_millis(ms);
    } else if let Some(w) = wait {
        cfg.failover_wait = w;
    }
    // How many keys' addresses the client remembers (one round per SEARCH for those).
    if let Ok(n) = std::env::var("DMKIT_ADDRESS_CACHE_ENTRIES") {
        cfg.cache.capacity = n.trim().parse().ok().filter(|&n| n > 0).ok_or_else(|| {
            CliError::usage(format!(
                "DMKIT_ADDRESS_CACHE_ENTRIES={n} is not a positive number of entries"
            ))
        })?;
    }
    let join = |m: String| CliError::with_code(format!("cannot join the cluster: {m}"), 3);
    // Connect (each unreachable node is reported at once), learn the cluster's uuid, and
    // hold the client id within that cluster.
    let ep = crate::connect::endpoint(file).map_err(|e| join(e.message()))?;
    let deadline = std::time::Instant::now() + cfg.failover_wait;
    let mut said = false;
    let view = loop {
        let open = if recover {
            dmkit_fusee::cluster::open
        } else {
            dmkit_fusee::cluster::open_tolerant
        };
        match open(&ep, &nodes) {
            Ok(v) => break v,
            Err(dmkit_fusee::Error::Cluster(m)) if m.contains("no FUSEE superblock") => {
                return Err(join(format!(
                    "it is not formatted ({m}): start `dmkit master --cluster FILE` first"
                )));
            }
            // The membership changed under the open (a failover fenced the members with fresh
            // rkeys and has not published them yet): read it again.
            Err(e) if membership_changing(&e) && std::time::Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) if node_failure(&e) && std::time::Instant::now() < deadline => {
                // A member this client cannot reach: the master fails it over within
                // seconds if it is down (then the next membership leaves it out).
                if !said {
                    said = true;
                    eprintln!(
                        "dmkit: {}; waiting up to {:.1} s for the master to fail it over",
                        explain(&e, file)
                            .split(": it is down")
                            .next()
                            .unwrap_or_default(),
                        cfg.failover_wait.as_secs_f64()
                    );
                }
                if let Some(rc) = &cfg.reconnect {
                    for n in &nodes {
                        if ep.connection(*n).is_err() {
                            if let Ok(c) = rc(*n) {
                                ep.add_connection(c);
                            }
                        }
                    }
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            Err(e) => return Err(join(explain(&e, file))),
        }
    };
    let wait_lock = LOCK_WAIT.lock().unwrap_or(false);
    LOCKS.lock().push(take_id_lock(view.uuid, id, wait_lock)?);
    if !recover {
        cfg.join_without_silent_members = true;
        return Client::connect(ep, &nodes, cfg).map_err(|e| join(explain(&e, file)));
    }
    let first = parking_lot::Mutex::new(Some(ep));
    let _p = crate::Progress::start(format!(
        "recovering FUSEE client id {id} (finishing what an earlier run left)"
    ));
    let (c, _) = Client::recover(
        move || match first.lock().take() {
            Some(ep) => Ok(ep),
            None => crate::connect::endpoint_again(&f)
                .map_err(|e| dmkit_fusee::Error::Config(e.message())),
        },
        &nodes,
        cfg,
    )
    .map_err(|e| join(explain(&e, file)))?;
    Ok(c)
}

pub fn run(args: KvArgs) -> Result<(), CliError> {
    let file = ClusterFile::load(&args.cluster).map_err(CliError::usage)?;
    // Bad input is a usage error before anything is connected (the value is read whole
    // first: nothing is written when it is too large or unreadable).
    let max = ClientConfig::new(args.client_id).max_value;
    let value = match &args.op {
        KvOp::Put {
            value, value_file, ..
        } => Some(value_of(value.as_deref(), value_file.as_deref(), max)?),
        KvOp::Get { .. } | KvOp::Del { .. } => None,
    };
    let _lock = lock_id(args.client_id, true)?;
    // A CLI call waits a few seconds, not half a minute, for a member to be failed over.
    let c = client_with(
        &file,
        args.client_id,
        Some(args.wait.unwrap_or(Duration::from_secs(5))),
        !matches!(args.op, KvOp::Get { .. }),
    )?;
    let fail = |e: dmkit_fusee::Error| {
        if is_usage(&e) {
            CliError::usage(e.to_string())
        } else {
            CliError::with_code(explain(&e, &file), 3)
        }
    };
    let r = match args.op {
        KvOp::Put { key, .. } => c
            .upsert(key.as_bytes(), &value.unwrap_or_default())
            .map_err(fail),
        KvOp::Get { key } => match c.search(key.as_bytes()).map_err(fail)? {
            Some(v) => {
                let stdout = std::io::stdout();
                let newline = stdout.is_terminal();
                let mut out = stdout.lock();
                out.write_all(&v)
                    .and_then(|()| {
                        if newline {
                            out.write_all(b"\n")
                        } else {
                            Ok(())
                        }
                    })
                    .and_then(|()| out.flush())
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_parse_as_milliseconds_or_seconds() {
        assert_eq!(parse_ms("500"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_ms("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_ms("5s"), Ok(Duration::from_secs(5)));
        assert_eq!(parse_ms(" 20s "), Ok(Duration::from_secs(20)));
        for bad in ["", "s", "5m", "-1", "1.5s"] {
            assert!(
                parse_ms(bad).unwrap_err().contains("invalid duration"),
                "{bad}"
            );
        }
    }
}
