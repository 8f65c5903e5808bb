//! `dmkit master`: initialises the cluster (formats it on first start, checks it on later
//! ones) and stays up as the cluster's membership service, off the data path.

use std::path::PathBuf;
use std::sync::Arc;

use dmkit_fusee::cluster::{self, ClusterConfig};
use dmkit_fusee::failover::{LeaseConfig, Master, MasterConfig, MasterOptions};
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
    /// The master's own claim on the cluster (milliseconds): it acts only while a majority of
    /// the memory nodes grant it, and exits when it cannot renew the claim in time. A
    /// standby takes over at most this long (plus a quarter) after the master is gone.
    #[arg(long, default_value_t = 3000)]
    pub claim_ms: u64,
    /// If another master holds the cluster, wait and take over when it is gone (instead of
    /// exiting with status 1).
    #[arg(long)]
    pub standby: bool,
}

/// The master's node id on the wire (it serves no memory).
pub const MASTER_ID: NodeId = NodeId(u16::MAX);

pub fn run(args: MasterArgs) -> Result<(), CliError> {
    let file = ClusterFile::load(&args.cluster).map_err(CliError::usage)?;
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
    if args.claim_ms < 400 {
        return Err(CliError::usage(format!(
            "--claim-ms {} is too short: use at least 400 (the default is 3000)",
            args.claim_ms
        )));
    }
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
    // Listen first: a busy address fails at once, and the claim names where this master is.
    let node = Arc::new(MemoryNode::new(MASTER_ID));
    let secret = crate::connect::secret(Some(&file))?;
    let server = crate::connect::serve_tcp(&args.listen, node.clone(), secret)?;
    let who = format!(
        "dmkit master pid {} on {}",
        std::process::id(),
        server.local_addr()
    );
    // A file that names the wrong nodes is a mistake to report as such, before the claim
    // (whose refusal would name another cluster's master).
    let ep = crate::connect::endpoint(&file)?;
    let nodes = crate::connect::node_ids(&file);
    match cluster::open_tolerant(&ep, &nodes) {
        Ok(_) => {}
        Err(dmkit_fusee::Error::Cluster(m)) if m.contains("no FUSEE superblock") => {}
        Err(e) => return Err(CliError::runtime(format!("cannot open the cluster: {e}"))),
    }
    drop(ep);
    // One master per cluster: nothing below runs before a majority of the memory nodes
    // granted this one the cluster.
    let claim = Arc::new(Claim::new(
        &file,
        who,
        std::time::Duration::from_millis(args.claim_ms),
    )?);
    let mut standby = args.standby;
    loop {
        let Some(held_until) = claim.acquire(standby)? else {
            eprintln!("dmkit master: stopped (a standby: it held no claim)");
            return Ok(());
        };
        // From here SIGTERM and SIGINT stop the master cleanly, giving the claim up (until
        // here they just end the process: it holds nothing).
        let _ = stop_requested();
        let term = claim.clone().keep(held_until)?;
        match serve_term(&args, &file, &nodes, &node, &server, &claim, &term) {
            Ok(Ended::Stopped) => {
                claim.release();
                eprintln!("dmkit master: stopped; the cluster's claim is released");
                return Ok(());
            }
            Ok(Ended::SteppedDown) => {}
            Err(e) if term.lost() => {
                // What failed failed because the claim ran out under it.
                tracing::warn!(error = %e.message(), "stopped acting when the claim ran out");
            }
            Err(e) => {
                term.end();
                claim.release();
                return Err(e);
            }
        }
        term.end();
        metrics::counter!("dmkit_fusee_master_step_downs_total").increment(1);
        eprintln!(
            "dmkit master: stepped down: the claim on the cluster could not be renewed by a \
             majority of the memory nodes in time; acting no more, competing for it again"
        );
        // After a step-down this master is a standby: another one may have taken over.
        standby = true;
    }
}

/// How one term of a master (from its claim to its end) ended.
enum Ended {
    /// SIGTERM or SIGINT: give the claim up and exit.
    Stopped,
    /// The claim ran out: compete again.
    SteppedDown,
}

/// One term of this master: it holds the claim (`term`) and acts — opens (or, the first
/// time, formats) the cluster, runs the failure detector and answers status requests on
/// `node` — until a stop signal or until the claim runs out.
fn serve_term(
    args: &MasterArgs,
    file: &ClusterFile,
    nodes: &[NodeId],
    node: &Arc<MemoryNode>,
    server: &dmkit_verbs::tcp::TcpServer,
    claim: &Arc<Claim>,
    term: &Term,
) -> Result<Ended, CliError> {
    let ep = crate::connect::endpoint_again(file)?;
    let (view, formatted) = match cluster::open_tolerant(&ep, nodes) {
        Ok(v) => (v, false),
        Err(dmkit_fusee::Error::Cluster(m)) if m.contains("no FUSEE superblock") => {
            let mut cfg =
                ClusterConfig::new(nodes.to_vec(), file.index_replicas, file.data_replicas);
            cfg.index_bytes = file.index_mib << 20;
            let _p = crate::Progress::start(format!(
                "formatting the cluster ({} memory nodes, {} MiB of index per replica)",
                nodes.len(),
                file.index_mib
            ));
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
    // The failure detector: heartbeats, fencing, repair, membership, refill of nodes that
    // come back. Clients read the membership from the memory nodes, so the master stays off
    // the data path.
    // The failure detector's own connections, bounded by the lease: a node cut off must
    // not hold up the heartbeats of the others.
    let bound = Some(std::time::Duration::from_millis(args.lease_ms.max(1000)));
    let hb_ep = crate::connect::endpoint_with(file, bound, false)?;
    drop(ep);
    // Leases and the claim are in force from the master's first action: a repair redone at
    // start waits out the leases, and every change carries the claim (a node that granted the
    // cluster to another master since refuses it) and is made only while the claim holds.
    let master = Master::open(
        hb_ep,
        nodes,
        MasterOptions {
            reconnect: Some(crate::connect::reconnect_bounded(file, bound)?),
            leases: Some(LeaseConfig {
                length: std::time::Duration::from_millis(args.lease_ms),
                peers: file
                    .memnodes
                    .iter()
                    .map(|m| (NodeId(m.id), m.addr.clone()))
                    .collect(),
            }),
            claim_token: Some(claim.token),
            acting: Some(term.acting.clone()),
        },
    )
    .map_err(|e| CliError::runtime(format!("cannot take over the membership: {e}")))?;
    // Exported from the start (the failure detector updates them on every change).
    {
        let ms = master.membership();
        metrics::gauge!("dmkit_fusee_membership_epoch").set(ms.epoch as f64);
        metrics::gauge!("dmkit_fusee_members").set(ms.members.len() as f64);
        metrics::gauge!("dmkit_fusee_cluster_nodes").set(view.nodes.len() as f64);
    }
    let m = master.clone();
    let cfg = MasterConfig {
        heartbeat: std::time::Duration::from_millis(args.heartbeat_ms),
        miss_limit: args.miss_limit,
        auto_rejoin: !args.no_rejoin,
    };
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stop2 = stop.clone();
    let detector = std::thread::Builder::new()
        .name("fusee-master".into())
        .spawn(move || m.run(cfg, stop2))
        .map_err(|e| CliError::runtime(format!("cannot start the failure detector: {e}")))?;
    // Status over RPC: the shape and the current membership.
    let shape = (view.nodes.clone(), view.index_replicas, view.data_replicas);
    node.set_rpc_handler(Arc::new(move |_p: &Peer, _req: &[u8]| {
        let w = Writer::new()
            .u16(shape.0.len() as u16)
            .u8(shape.1 as u8)
            .u8(shape.2 as u8);
        let w = shape.0.iter().fold(w, |w, n| w.u16(n.0));
        Ok(w.bytes(&master.membership().encode()).finish())
    }));
    eprintln!(
        "dmkit master: cluster of {} memory nodes {} (index replicas {}, data replicas {}); serving on {}",
        view.nodes.len(),
        if formatted { "formatted" } else { "opened" },
        view.index_replicas,
        view.data_replicas,
        server.local_addr()
    );
    // Until SIGTERM or SIGINT: then stop acting (the detector finishes what it is doing),
    // give the claim up, and exit 0, so that the next master starts at once. Until the claim
    // runs out: then the detector is stopped (it could change nothing anyway) and the master
    // competes again.
    let ended = loop {
        if stop_requested() {
            break Ended::Stopped;
        }
        if term.lost() {
            break Ended::SteppedDown;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let _ = detector.join();
    Ok(ended)
}

static STOP: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

extern "C" fn on_stop_signal(_: libc::c_int) {
    STOP.store(true, std::sync::atomic::Ordering::Relaxed);
}

/// Whether SIGTERM or SIGINT arrived (the handlers are installed on the first call).
fn stop_requested() -> bool {
    static INSTALLED: std::sync::Once = std::sync::Once::new();
    INSTALLED.call_once(|| {
        for sig in [libc::SIGTERM, libc::SIGINT] {
            // SAFETY: the handler only stores to an atomic, which is async-signal-safe; the
            // function pointer has the signature `signal` expects.
            unsafe {
                libc::signal(sig, on_stop_signal as *const () as libc::sighandler_t);
            }
        }
    });
    STOP.load(std::sync::atomic::Ordering::Relaxed)
}

/// One term of holding the claim: `acting` reads true until the claim may run out unrenewed
/// (the master then stops acting at once), `over` ends the term's keeper threads.
#[derive(Debug)]
struct Term {
    acting: Arc<std::sync::atomic::AtomicBool>,
    over: Arc<std::sync::atomic::AtomicBool>,
}

impl Default for Term {
    fn default() -> Self {
        Term {
            acting: Arc::new(std::sync::atomic::AtomicBool::new(true)),
            over: Arc::new(std::sync::atomic::AtomicBool::new(false)),
        }
    }
}

impl Term {
    /// Whether the claim ran out in this term (the master no longer acts).
    fn lost(&self) -> bool {
        !self.acting.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Ends the term: its keeper threads stop, and the master acts no more.
    fn end(&self) {
        self.acting
            .store(false, std::sync::atomic::Ordering::Release);
        self.over.store(true, std::sync::atomic::Ordering::SeqCst);
    }
}

/// This master's claim on the cluster (see `dmkit_fusee::memnode::claim_master`): granted by
/// a majority of the memory nodes, renewed every quarter of its lease; before the lease can
/// run out unrenewed the master stops acting and steps down (it competes again as a
/// standby), so that a master taking over never acts beside it.
struct Claim {
    token: u64,
    who: String,
    lease: std::time::Duration,
    nodes: Vec<(NodeId, String)>,
    connector: Arc<dyn dmkit_verbs::Connector>,
    conns: parking_lot::Mutex<std::collections::HashMap<NodeId, Arc<dyn dmkit_verbs::Connection>>>,
    /// Set when the claim is given up: the keeper stops renewing.
    released: std::sync::atomic::AtomicBool,
    /// Held for a renewal round, so that giving the claim up never races one in flight.
    renewing: parking_lot::Mutex<()>,
}

/// A connection to a memory node, or why there is none.
type Dialled = Result<Arc<dyn dmkit_verbs::Connection>, String>;

/// What one round of claim requests found.
#[derive(Debug, Default)]
struct ClaimRound {
    granted: usize,
    /// Another master's claim, as a node that refused described it, and its time left there.
    holder: Option<(String, std::time::Duration)>,
    /// Nodes that did not answer, with why.
    silent: Vec<String>,
}

impl Claim {
    fn new(file: &ClusterFile, who: String, lease: std::time::Duration) -> Result<Claim, CliError> {
        // Each request is bounded well within the lease: a dead node costs a round little.
        let bound = (lease / 8).clamp(
            std::time::Duration::from_millis(50),
            std::time::Duration::from_millis(1000),
        );
        Ok(Claim {
            token: rand::random::<u64>() | 1,
            who,
            lease,
            nodes: file
                .memnodes
                .iter()
                .map(|m| (NodeId(m.id), m.addr.clone()))
                .collect(),
            connector: crate::connect::connector_bounded(file, Some(bound))?,
            conns: Default::default(),
            released: Default::default(),
            renewing: Default::default(),
        })
    }

    fn majority(&self) -> usize {
        self.nodes.len() / 2 + 1
    }

    /// The connection to `node`: the cached one, else a new one (a blocking connect, bounded).
    fn conn(&self, node: NodeId, addr: &str) -> Dialled {
        if let Some(c) = self.conns.lock().get(&node).cloned() {
            return Ok(c);
        }
        let c = self.connector.connect(addr).map_err(|e| e.to_string())?;
        if c.node() != node {
            let found = c.node();
            c.close();
            return Err(format!(
                "{addr} answers as node {found}, not {node} (check the cluster file)"
            ));
        }
        self.conns.lock().insert(node, c.clone());
        Ok(c)
    }

    /// Asks every node at once. The requests go out together from this thread (a round
    /// every quarter claim is most of an idle master's wake-ups: no thread per node); only a
    /// node without a connection is dialled, each on its own thread, so that a dead one
    /// costs the round its connect bound once, not once per node.
    fn round(&self, lease: std::time::Duration) -> ClaimRound {
        let cached: Vec<bool> = {
            let conns = self.conns.lock();
            self.nodes
                .iter()
                .map(|(n, _)| conns.contains_key(n))
                .collect()
        };
        let dialled: Vec<(NodeId, Dialled)> = if cached.iter().all(|c| *c) {
            Vec::new()
        } else {
            std::thread::scope(|s| {
                let hs: Vec<_> = (self.nodes.iter().zip(&cached))
                    .filter(|(_, c)| !**c)
                    .map(|((n, a), _)| s.spawn(move || (*n, self.conn(*n, a))))
                    .collect();
                hs.into_iter().filter_map(|h| h.join().ok()).collect()
            })
        };
        let ep = dmkit_verbs::Endpoint::default();
        let mut r = ClaimRound::default();
        let mut asked = Vec::new();
        for (n, a) in &self.nodes {
            let conn = match dialled.iter().find(|(d, _)| d == n) {
                Some((_, Ok(c))) => Ok(c.clone()),
                Some((_, Err(e))) => Err(e.clone()),
                None => self.conn(*n, a),
            };
            match conn {
                Ok(c) => {
                    ep.add_connection(c);
                    asked.push((*n, a.as_str()));
                }
                Err(e) => r.silent.push(format!("node {} at {a}: {e}", n.0)),
            }
        }
        let replies = dmkit_verbs::block_on(dmkit_verbs::join_all(
            asked
                .iter()
                .map(|&(n, _)| {
                    dmkit_fusee::memnode::claim_master(&ep, n, self.token, lease, &self.who)
                })
                .collect(),
        ));
        for ((n, a), rep) in asked.into_iter().zip(replies) {
            match rep {
                Ok(rep) if rep.granted => r.granted += 1,
                Ok(rep) => r.holder = Some((rep.holder, rep.remaining)),
                Err(e) => {
                    self.conns.lock().remove(&n);
                    r.silent.push(format!("node {} at {a}: {e}", n.0));
                }
            }
        }
        r
    }

    /// Waits until a majority grants this master the cluster; the instant its claim is good
    /// until. Another master holding it is an error (exit 1) unless `standby`. `None` when a
    /// stop signal came while it waited (once the handlers are installed: after a first term).
    fn acquire(&self, standby: bool) -> Result<Option<std::time::Instant>, CliError> {
        let mut said = String::new();
        loop {
            let t0 = std::time::Instant::now();
            let r = self.round(self.lease);
            if r.granted >= self.majority() {
                if !said.is_empty() {
                    eprintln!(
                        "dmkit master: the cluster is this master's now ({})",
                        self.who
                    );
                }
                return Ok(Some(t0 + self.lease));
            }
            if r.granted > 0 {
                // Partly granted: give it back, not to stand in the holder's way.
                self.round(std::time::Duration::ZERO);
            }
            let line = match &r.holder {
                Some((h, left)) if !standby => {
                    return Err(CliError::runtime(format!(
                        "another master holds this cluster: {h} (its claim has {} ms left); \
                         one master per cluster: stop that one, or start this one with --standby \
                         to take over when it is gone",
                        left.as_millis()
                    )));
                }
                Some((h, _)) => {
                    format!("standby: the cluster's master is {h}; taking over when it is gone")
                }
                None => format!(
                    "waiting for a majority of the memory nodes ({} of {} granted, {} needed); \
                     not answering: {}",
                    r.granted,
                    self.nodes.len(),
                    self.majority(),
                    r.silent.join("; ")
                ),
            };
            if line != said {
                eprintln!("dmkit master: {line}");
                said = line;
            }
            let wake = std::time::Instant::now() + self.lease / 4;
            while std::time::Instant::now() < wake {
                if STOP.load(std::sync::atomic::Ordering::Relaxed) {
                    return Ok(None);
                }
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
        }
    }

    /// Gives the claim up (the process stops acting first): the next master need not wait
    /// for it to run out.
    fn release(&self) {
        let _g = self.renewing.lock();
        self.released
            .store(true, std::sync::atomic::Ordering::SeqCst);
        self.round(std::time::Duration::ZERO);
    }

    /// Renews the claim in the background for one term. When it could not be renewed by a
    /// majority for long enough that it may run out, the term is lost: the master stops acting
    /// at once ([`Term::acting`] reads false, so the failure detector can change nothing) and
    /// steps down, a little before the lease can run out on the memory nodes.
    fn keep(self: Arc<Self>, until: std::time::Instant) -> Result<Term, CliError> {
        use std::sync::atomic::{AtomicU64, Ordering};
        let base = std::time::Instant::now();
        let nanos =
            move |t: std::time::Instant| t.saturating_duration_since(base).as_nanos() as u64;
        let valid = Arc::new(AtomicU64::new(nanos(until)));
        let term = Term::default();
        // Stop a little before the lease runs out on the memory nodes (their count starts
        // later than ours, when each received the request).
        let margin = self.lease / 8;
        let v = valid.clone();
        let me = self.clone();
        let over = term.over.clone();
        std::thread::Builder::new()
            .name("master-claim".into())
            .spawn(move || {
                let mut short = false;
                loop {
                    std::thread::sleep(me.lease / 4);
                    let _g = me.renewing.lock();
                    if me.released.load(Ordering::SeqCst) || over.load(Ordering::SeqCst) {
                        return;
                    }
                    let t0 = std::time::Instant::now();
                    let r = me.round(me.lease);
                    let ok = r.granted >= me.majority();
                    metrics::counter!(
                        "dmkit_fusee_master_claim_renewals_total",
                        "result" => if ok { "granted" } else { "short" }
                    )
                    .increment(1);
                    if ok {
                        v.store(nanos(t0 + me.lease), Ordering::Release);
                        if short {
                            tracing::info!("the master's claim is renewed by a majority again");
                            short = false;
                        }
                    } else if !short {
                        short = true;
                        tracing::warn!(
                            granted = r.granted,
                            needed = me.majority(),
                            holder = ?r.holder.as_ref().map(|h| &h.0),
                            silent = %r.silent.join("; "),
                            "the master's claim on the cluster was not renewed by a majority"
                        );
                    }
                }
            })
            .map_err(|e| CliError::runtime(format!("cannot start the claim keeper: {e}")))?;
        let (acting, over) = (term.acting.clone(), term.over.clone());
        std::thread::Builder::new()
            .name("master-claim-watchdog".into())
            .spawn(move || {
                loop {
                    // Wake when the claim would need stepping down if not renewed by then
                    // (a renewal moves that later; waking at the old time only finds it
                    // renewed), at least every second (to end with its term).
                    let at = nanos(std::time::Instant::now() + margin);
                    let left = valid.load(Ordering::Acquire);
                    let wait = std::time::Duration::from_nanos(left.saturating_sub(at)).clamp(
                        std::time::Duration::from_millis(5),
                        std::time::Duration::from_secs(1),
                    );
                    std::thread::sleep(wait);
                    if over.load(Ordering::SeqCst) {
                        return;
                    }
                    let left = valid.load(Ordering::Acquire);
                    if nanos(std::time::Instant::now() + margin) >= left {
                        acting.store(false, Ordering::Release);
                        tracing::warn!(
                            master = %self.who,
                            "the claim on the cluster was not renewed by a majority in time: \
                             stepping down (two masters never act at once)"
                        );
                        return;
                    }
                }
            })
            .map_err(|e| CliError::runtime(format!("cannot start the claim watchdog: {e}")))?;
        Ok(term)
    }
}
