//! `dmkit bench soak`: a cluster of real processes on a busy machine, watched for what a busy
//! host must not cause — false fences, master exits, a silent gateway, client errors, lost
//! writes — and for what an idle cluster costs.
//!
//! The cluster: three `dmkit memnode` processes (two on pool files, one on DRAM), a `dmkit
//! master` and a `dmkit resp` gateway, over tcp on loopback, r = 3. The run:
//!
//! 1. *idle*: nothing but the gateway connected; the CPU time of every dmkit process over the
//!    window is `idle_cpu_percent` (one core = 100);
//! 2. *calm*: the load without a hog — `--tasks` FUSEE client tasks in this process (upserts,
//!    reads and deletes of their own keys), prober connections to the gateway (SET, GET) and,
//!    when it is installed, `redis-benchmark` against the gateway;
//! 3. *hog*: the same load beside a CPU hog that keeps every core busy at the same priority
//!    (spinning threads in a child process of its own);
//! 4. the checks: every write a task had acknowledged is read back (`lost_acked_writes`), the
//!    memory nodes' fence counters and the master's epoch and step-downs are scraped from
//!    their metrics, and the gateway is restarted after SIGTERM and after SIGKILL (the time
//!    to its first served command).
//!
//! Nothing fails in this run, so every fence and every membership change counts as false.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use parking_lot::Mutex;
use serde_json::Map;

use super::{Measurement, Report};
use crate::CliError;
use crate::cluster_file::ClusterFile;

#[derive(Debug, clap::Args)]
pub struct SoakArgs {
    /// Seconds of load beside the hog (the calm phase runs a third of it, at least 10 s).
    #[arg(long, default_value_t = 600)]
    pub seconds: u64,
    /// A short run: 45 s beside the hog, 15 s calm, 5 s idle.
    #[arg(long)]
    pub quick: bool,
    /// Hog threads (default: one per core, so every core is busy).
    #[arg(long)]
    pub hog: Option<usize>,
    /// FUSEE client tasks in this process.
    #[arg(long, default_value_t = 64)]
    pub tasks: usize,
    /// Seconds of the idle window.
    #[arg(long)]
    pub idle_seconds: Option<u64>,
    /// Keep the cluster's files and logs here (default: a fresh temporary directory, removed
    /// at the end unless the run found something).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Write the JSON report here.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// The verbs backend of the cluster (tcp, or rdma in a build with the `rdma` feature,
    /// e.g. inside the SoftRoCE guest).
    #[arg(long, value_enum, default_value_t = crate::Backend::Tcp)]
    pub backend: crate::Backend,
    /// The address the memory nodes listen on (rdma: the RDMA interface's, e.g.
    /// `$SOFTROCE_IP`). Metrics, the master and the gateway stay on loopback.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Only the idle window: start the cluster, measure its CPU with nothing running
    /// (per process and in all), stop. No hog, no pool files (DRAM nodes), no redis-benchmark.
    #[arg(long)]
    pub idle_only: bool,
    /// The master's heartbeat (its `--heartbeat-ms`; the lease is 5 × it, as by default):
    /// with `--idle-only`, how much of an idle cluster's CPU its heartbeats are.
    #[arg(long, default_value_t = 100)]
    pub heartbeat_ms: u64,
}

fn rt(e: impl std::fmt::Display) -> CliError {
    CliError::runtime(e.to_string())
}

/// A free loopback port (the short race until the child binds it is reported if lost).
fn free_port() -> Result<u16, CliError> {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .map_err(|e| rt(format!("no free loopback port: {e}")))
}

/// A dmkit child process, killed when dropped (and by the kernel when this process dies).
struct Proc {
    name: String,
    args: Vec<String>,
    log: PathBuf,
    child: Child,
    metrics: Option<u16>,
}

impl Proc {
    fn start(
        dir: &Path,
        name: &str,
        args: &[String],
        metrics: Option<u16>,
    ) -> Result<Proc, CliError> {
        let log = dir.join(format!("{name}.log"));
        let child = spawn(&log, args)?;
        Ok(Proc {
            name: name.into(),
            args: args.to_vec(),
            log,
            child,
            metrics,
        })
    }

    fn restart(&mut self) -> Result<(), CliError> {
        let _ = self.child.wait();
        self.child = spawn(&self.log, &self.args)?;
        Ok(())
    }

    fn signal(&self, sig: libc::c_int) {
        // SAFETY: kill only sends a signal to our own child's pid.
        unsafe {
            libc::kill(self.child.id() as libc::pid_t, sig);
        }
    }

    /// CPU time so far of the process's live threads, in nanoseconds (each thread's
    /// `schedstat`; clock ticks are too coarse for an idle window), else its clock ticks.
    fn cpu(&self) -> Duration {
        let pid = self.child.id();
        let threads = std::fs::read_dir(format!("/proc/{pid}/task")).ok();
        let ns: Option<u64> = threads.map(|d| {
            d.filter_map(|t| {
                let t = t.ok()?;
                let s = std::fs::read_to_string(t.path().join("schedstat")).ok()?;
                s.split_whitespace().next()?.parse::<u64>().ok()
            })
            .sum()
        });
        match ns {
            Some(ns) if ns > 0 => Duration::from_nanos(ns),
            _ => super::resp::process_cpu(pid).unwrap_or_default(),
        }
    }

    fn scrape(&self) -> String {
        self.metrics.map(scrape).unwrap_or_default()
    }

    /// Context switches so far of the process's live threads (voluntary and not): each is a
    /// thread going to sleep or being put off the CPU, so about one per wake-up.
    fn switches(&self) -> u64 {
        let pid = self.child.id();
        let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
            return 0;
        };
        dir.flatten()
            .filter_map(|t| std::fs::read_to_string(t.path().join("status")).ok())
            .map(|st| {
                st.lines()
                    .filter(|l| l.contains("ctxt_switches:"))
                    .filter_map(|l| l.split_whitespace().last()?.parse::<u64>().ok())
                    .sum::<u64>()
            })
            .sum()
    }

    /// CPU time by thread name (numbered threads — `dmkit-rdma-cq-7` — grouped as
    /// `dmkit-rdma-cq-N`), from each thread's schedstat.
    fn threads(&self) -> std::collections::BTreeMap<String, Duration> {
        let mut out = std::collections::BTreeMap::new();
        let pid = self.child.id();
        let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
            return out;
        };
        for t in dir.flatten() {
            let name = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
            let ns = std::fs::read_to_string(t.path().join("schedstat"))
                .ok()
                .and_then(|s| s.split_whitespace().next()?.parse::<u64>().ok())
                .unwrap_or(0);
            let name = name.trim();
            let group = match name.rsplit_once('-') {
                Some((head, n)) if !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) => {
                    format!("{head}-N")
                }
                _ => name.to_string(),
            };
            *out.entry(group).or_insert(Duration::ZERO) += Duration::from_nanos(ns);
        }
        out
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The CPU one wake-up of an idle thread costs on this machine, in microseconds: two
/// threads pass a token back and forth with 10 ms of idleness before each pass (as a
/// heartbeat finds a cluster), the CPU of both per pass halved. On a host this is a few
/// microseconds; in an emulated guest leaving the idle CPU is most of it.
fn wake_cost_us() -> f64 {
    const PASSES: u32 = 100;
    let (to_b, b_rx) = std::sync::mpsc::channel::<()>();
    let (to_a, a_rx) = std::sync::mpsc::channel::<()>();
    let b = std::thread::spawn(move || {
        let t0 = thread_cpu();
        while b_rx.recv().is_ok() {
            if to_a.send(()).is_err() {
                break;
            }
        }
        thread_cpu() - t0
    });
    let mut a_cpu = Duration::ZERO;
    for _ in 0..PASSES {
        std::thread::sleep(Duration::from_millis(10));
        let t0 = thread_cpu();
        let _ = to_b.send(());
        let _ = a_rx.recv();
        a_cpu += thread_cpu() - t0;
    }
    drop(to_b);
    let b_cpu = b.join().unwrap_or_default();
    (a_cpu + b_cpu).as_secs_f64() * 1e6 / f64::from(2 * PASSES)
}

/// The calling thread's CPU time.
fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec we own.
    unsafe {
        libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts);
    }
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

fn spawn(log: &Path, args: &[String]) -> Result<Child, CliError> {
    let exe = std::env::current_exe().map_err(|e| rt(format!("cannot find dmkit itself: {e}")))?;
    let out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .map_err(|e| rt(format!("cannot open {}: {e}", log.display())))?;
    let err = out.try_clone().map_err(rt)?;
    let mut cmd = Command::new(exe);
    cmd.args(args)
        .env(
            "DMKIT_LOG",
            std::env::var("DMKIT_LOG").unwrap_or("info".into()),
        )
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err);
    pdeathsig(&mut cmd);
    cmd.spawn()
        .map_err(|e| rt(format!("cannot start dmkit {}: {e}", args.join(" "))))
}

/// The child dies with this process (a bench killed by a signal runs no destructor): the
/// kernel kills it when the thread that started it ends.
pub(crate) fn pdeathsig(cmd: &mut Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: the closure runs in the child between fork and exec and only calls prctl,
    // which is async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// `GET /metrics` of a process's metrics endpoint (empty when it does not answer).
fn scrape(port: u16) -> String {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
        return String::new();
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    let _ = s.write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n");
    let mut body = String::new();
    let _ = s.read_to_string(&mut body);
    body
}

/// The sum of a metric's samples (every label set) in a Prometheus text page.
fn metric_sum(page: &str, name: &str) -> f64 {
    page.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|r| r.starts_with('{') || r.starts_with(' '))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .fold(0.0, |a, b| a + b)
}

/// The cumulative bucket counts (`le` → count) of histogram `name` with label `label`,
/// summed over `pages`.
fn buckets(pages: &[String], name: &str, label: &str) -> Vec<(f64, f64)> {
    let mut out: Vec<(f64, f64)> = Vec::new();
    let prefix = format!("{name}_bucket{{");
    for page in pages {
        for l in page
            .lines()
            .filter(|l| l.starts_with(&prefix) && l.contains(label))
        {
            let Some(le) = l.split("le=\"").nth(1).and_then(|r| r.split('"').next()) else {
                continue;
            };
            let le = if le == "+Inf" {
                f64::INFINITY
            } else {
                match le.parse::<f64>() {
                    Ok(v) => v,
                    Err(_) => continue,
                }
            };
            let Some(n) = l.rsplit(' ').next().and_then(|n| n.parse::<f64>().ok()) else {
                continue;
            };
            match out.iter_mut().find(|(b, _)| *b == le) {
                Some(e) => e.1 += n,
                None => out.push((le, n)),
            }
        }
    }
    out.sort_by(|a, b| a.0.total_cmp(&b.0));
    out
}

/// What was recorded between two bucket readings `a` (earlier) and `b`.
fn bucket_diff(a: &[(f64, f64)], b: &[(f64, f64)]) -> Vec<(f64, f64)> {
    b.iter()
        .map(|(le, n)| {
            let before = a.iter().find(|(l, _)| l == le).map_or(0.0, |x| x.1);
            (*le, n - before)
        })
        .collect()
}

/// The upper bound of quantile `q` (the smallest bucket bound holding a share `q` of the
/// observations), and the count; `None` with no observations.
fn bucket_quantile(b: &[(f64, f64)], q: f64) -> Option<f64> {
    let total = b.last()?.1;
    if total <= 0.0 {
        return None;
    }
    b.iter().find(|(_, n)| *n >= q * total).map(|(le, _)| *le)
}

/// Observations above `bound` (a bucket bound).
fn bucket_above(b: &[(f64, f64)], bound: f64) -> f64 {
    let total = b.last().map_or(0.0, |x| x.1);
    total - b.iter().find(|(le, _)| *le >= bound).map_or(total, |x| x.1)
}

/// A RESP command as a client sends it.
fn resp_cmd(args: &[&[u8]]) -> Vec<u8> {
    let mut v = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        v.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        v.extend_from_slice(a);
        v.extend_from_slice(b"\r\n");
    }
    v
}

/// Reads one RESP reply (simple types and bulk strings: what SET, GET and PING answer);
/// whether it was an error.
fn read_reply(r: &mut BufReader<TcpStream>) -> std::io::Result<bool> {
    let mut line = String::new();
    if r.read_line(&mut line)? == 0 {
        return Err(std::io::ErrorKind::UnexpectedEof.into());
    }
    match line.as_bytes().first() {
        Some(b'-') => Ok(true),
        Some(b'$') => {
            let n: i64 = line[1..].trim().parse().unwrap_or(-1);
            if n >= 0 {
                let mut b = vec![0; n as usize + 2];
                r.read_exact(&mut b)?;
            }
            Ok(false)
        }
        _ => Ok(false),
    }
}

/// One connection to the gateway: `(reader, writer)`.
fn gateway_conn(port: u16) -> std::io::Result<(BufReader<TcpStream>, TcpStream)> {
    let s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_nodelay(true)?;
    s.set_read_timeout(Some(Duration::from_secs(60)))?;
    Ok((BufReader::new(s.try_clone()?), s))
}

/// The time from starting to try until the gateway on `port` answers a GET.
fn time_to_serve(port: u16, limit: Duration) -> Option<Duration> {
    let t = Instant::now();
    while t.elapsed() < limit {
        if let Ok((mut r, mut w)) = gateway_conn(port) {
            if w.write_all(&resp_cmd(&[b"GET", b"soak:probe"])).is_ok()
                && read_reply(&mut r).is_ok_and(|err| !err)
            {
                return Some(t.elapsed());
            }
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    None
}

/// What the load saw in one phase.
#[derive(Default)]
struct PhaseStats {
    /// Latency histograms (ns) by operation.
    ops: HashMap<&'static str, Histogram<u64>>,
    errors: u64,
    /// Longest a gateway prober waited for an answer.
    gateway_max_silence: Duration,
    gateway_ops: u64,
    gateway_errors: u64,
}

impl PhaseStats {
    fn record(&mut self, op: &'static str, took: Duration) {
        let h = self.ops.entry(op).or_insert_with(|| {
            Histogram::new_with_bounds(1, 600_000_000_000, 3).expect("histogram bounds")
        });
        let _ = h.record(took.as_nanos().max(1) as u64);
    }

    fn ops(&self) -> u64 {
        self.ops.values().map(|h| h.len()).sum()
    }
}

/// What a task knows of one of its keys: the value its last acknowledged write left (`None`:
/// deleted or never written) and the values of writes that failed since (they may or may not
/// have taken effect).
#[derive(Default, Clone)]
struct KeyState {
    acked: Option<Vec<u8>>,
    maybe: Vec<Option<Vec<u8>>>,
}

const KEYS_PER_TASK: usize = 16;

pub fn run(args: SoakArgs) -> Result<(), CliError> {
    let (hog_secs, calm_secs, idle_secs) = if args.quick {
        (45, 15, args.idle_seconds.unwrap_or(5))
    } else {
        let s = args.seconds.max(10);
        (s, (s / 3).max(10), args.idle_seconds.unwrap_or(20))
    };
    let hog_threads = args.hog.unwrap_or_else(|| {
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(2)
    });
    if args.tasks == 0 {
        return Err(CliError::usage("--tasks must be at least 1"));
    }
    args.backend.check_serves("a soak cluster")?;
    let backend = match args.backend {
        crate::Backend::Tcp => "tcp",
        crate::Backend::Rdma => "rdma",
        crate::Backend::Sim => {
            return Err(CliError::usage(
                "--backend sim has no processes to soak: use tcp or rdma",
            ));
        }
    };
    let host = args.host.as_str();
    let (dir, keep_dir) = match &args.dir {
        Some(d) => {
            std::fs::create_dir_all(d)
                .map_err(|e| CliError::usage(format!("cannot create {}: {e}", d.display())))?;
            (d.clone(), true)
        }
        None => {
            let d = std::env::temp_dir().join(format!("dmkit-soak-{}", std::process::id()));
            std::fs::create_dir_all(&d).map_err(rt)?;
            (d, false)
        }
    };
    let redis_benchmark = Command::new("redis-benchmark")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());

    // The cluster.
    let ports: Vec<u16> = (0..12).map(|_| free_port()).collect::<Result<_, _>>()?;
    let (mn, mn_metrics) = (&ports[0..3], &ports[3..6]);
    let (master_port, master_metrics, gw_port, gw_metrics) =
        (ports[6], ports[7], ports[8], ports[9]);
    if args.heartbeat_ms == 0 {
        return Err(CliError::usage("--heartbeat-ms must be at least 1"));
    }
    let (hb, lease) = (
        args.heartbeat_ms.to_string(),
        (args.heartbeat_ms * 5).to_string(),
    );
    let cluster = dir.join("cluster.toml");
    let mut toml = format!(
        "backend = \"{backend}\"\nmaster = \"127.0.0.1:{master_port}\"\nindex_replicas = 3\ndata_replicas = 3\n"
    );
    for (i, p) in mn.iter().enumerate() {
        toml += &format!("[[memnode]]\nid = {i}\naddr = \"{host}:{p}\"\n");
    }
    std::fs::write(&cluster, toml).map_err(rt)?;
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    let mut procs: Vec<Proc> = Vec::new();
    for i in 0..3 {
        let listen = format!("{host}:{}", mn[i]);
        let metrics = format!("127.0.0.1:{}", mn_metrics[i]);
        let id = i.to_string();
        let mut a = s(&[
            "memnode",
            "--listen",
            &listen,
            "--id",
            &id,
            "--metrics",
            &metrics,
            "--backend",
            backend,
        ]);
        if args.idle_only {
            a.extend(s(&["--dram", "64MiB"]));
        } else if i < 2 {
            let pool = dir.join(format!("node{i}.pool"));
            let _ = std::fs::remove_file(&pool);
            a.extend(s(&["--pool", &pool.to_string_lossy(), "--size", "512MiB"]));
        } else {
            a.extend(s(&["--dram", "512MiB"]));
        }
        procs.push(Proc::start(
            &dir,
            &format!("memnode{i}"),
            &a,
            Some(mn_metrics[i]),
        )?);
    }
    // (The metrics endpoint answers once the node serves, on either backend.)
    wait_for(Duration::from_secs(60), "the memory nodes to serve", || {
        procs
            .iter()
            .all(|p| p.scrape().contains("dmkit_memnode_fences_total"))
    })?;
    if backend == "tcp" {
        wait_port(mn, Duration::from_secs(60))?;
    }
    let cluster_s = cluster.to_string_lossy().into_owned();
    procs.push(Proc::start(
        &dir,
        "master",
        &s(&[
            "master",
            "--listen",
            &format!("127.0.0.1:{master_port}"),
            "--cluster",
            &cluster_s,
            "--metrics",
            &format!("127.0.0.1:{master_metrics}"),
            // A master restarted after an exit waits for the old claim to run out.
            "--standby",
            "--heartbeat-ms",
            &hb,
            "--lease-ms",
            &lease,
        ]),
        Some(master_metrics),
    )?);
    let master_ix = procs.len() - 1;
    wait_for(
        Duration::from_secs(60),
        "the master to format the cluster",
        || metric_sum(&procs[master_ix].scrape(), "dmkit_fusee_membership_epoch") >= 1.0,
    )?;
    procs.push(Proc::start(
        &dir,
        "gateway",
        &s(&[
            "resp",
            "--listen",
            &format!("127.0.0.1:{gw_port}"),
            "--cluster",
            &cluster_s,
            "--metrics",
            &format!("127.0.0.1:{gw_metrics}"),
        ]),
        Some(gw_metrics),
    )?);
    let gw_ix = procs.len() - 1;
    time_to_serve(gw_port, Duration::from_secs(60))
        .ok_or_else(|| rt("the gateway did not serve within 60 s"))?;
    eprintln!("soak: cluster up in {} (logs there)", dir.display());

    // 1. Idle: one gateway connection open, nothing else.
    let idle_conn = gateway_conn(gw_port).map_err(rt)?;
    std::thread::sleep(Duration::from_secs(2));
    let per0: Vec<Duration> = procs.iter().map(Proc::cpu).collect();
    let threads0: Vec<_> = procs.iter().map(Proc::threads).collect();
    let sys_of =
        |p: &Proc| super::resp::process_user_sys(p.child.id()).map_or(Duration::ZERO, |t| t.1);
    let sys0: Vec<Duration> = procs.iter().map(sys_of).collect();
    let switches0: Vec<u64> = procs.iter().map(Proc::switches).collect();
    let t0 = Instant::now();
    std::thread::sleep(Duration::from_secs(idle_secs));
    let per1: Vec<Duration> = procs.iter().map(Proc::cpu).collect();
    let threads1: Vec<_> = procs.iter().map(Proc::threads).collect();
    let sys1: Vec<Duration> = procs.iter().map(sys_of).collect();
    let switches1: Vec<u64> = procs.iter().map(Proc::switches).collect();
    let idle_wall = t0.elapsed().as_secs_f64();
    let (cpu0, cpu1): (Duration, Duration) = (per0.iter().sum(), per1.iter().sum());
    let idle_cpu_percent = 100.0 * (cpu1 - cpu0).as_secs_f64() / idle_wall.max(1e-9);
    drop(idle_conn);
    eprintln!("soak: idle cluster {idle_cpu_percent:.2} % of one core");
    if args.idle_only {
        let mut report = Report::new("soak");
        report.config("idle_seconds", idle_secs);
        report.config("backend", backend);
        report.config("memory_nodes", "3 (DRAM)");
        report.config("replicas", 3u64);
        report.config("heartbeat_ms", args.heartbeat_ms);
        for (p, (c0, c1)) in procs.iter().zip(per0.iter().zip(&per1)) {
            report.ratio(
                &format!("idle_cpu_percent_{}", p.name),
                100.0 * (*c1 - *c0).as_secs_f64() / idle_wall.max(1e-9),
                None,
            );
        }
        // Of which in the kernel (system calls and the interrupts charged to the process:
        // on rxe the emulated NIC's packet work); clock ticks, so coarse.
        for (p, (s0, s1)) in procs.iter().zip(sys0.iter().zip(&sys1)) {
            report.ratio(
                &format!("idle_sys_percent_{}", p.name),
                100.0 * s1.saturating_sub(*s0).as_secs_f64() / idle_wall.max(1e-9),
                None,
            );
        }
        // What it is made of: wake-ups, each costing what one costs here.
        let mut wakeups = 0.0;
        for (p, (w0, w1)) in procs.iter().zip(switches0.iter().zip(&switches1)) {
            let per_s = w1.saturating_sub(*w0) as f64 / idle_wall.max(1e-9);
            wakeups += per_s;
            report.ratio(&format!("idle_wakeups_per_s_{}", p.name), per_s, None);
        }
        let wake_us = wake_cost_us();
        report.ratio("idle_wakeups_per_s", wakeups, None);
        report.ratio("wake_from_idle_cpu_us", wake_us, None);
        report.ratio(
            "idle_cpu_percent_of_wakeups_alone",
            wakeups * wake_us / 1e4,
            None,
        );
        // Where it goes: each process's threads above 0.1 % of a core.
        for (i, p) in procs.iter().enumerate() {
            for (name, t1) in &threads1[i] {
                let t0 = threads0[i].get(name).copied().unwrap_or(Duration::ZERO);
                let pct = 100.0 * t1.saturating_sub(t0).as_secs_f64() / idle_wall.max(1e-9);
                if pct >= 0.1 {
                    report.ratio(&format!("idle_cpu_percent_{}_{name}", p.name), pct, None);
                }
            }
        }
        report.ratio("idle_cpu_percent", idle_cpu_percent, Some("<= 2"));
        report
            .finish(args.json.as_deref())
            .map_err(CliError::runtime)?;
        drop(procs);
        if !keep_dir {
            let _ = std::fs::remove_dir_all(&dir);
        }
        return Ok(());
    }

    // The load's client.
    let file = ClusterFile::load(&cluster).map_err(CliError::usage)?;
    let client = crate::kv::client(&file, 7_000 + u64::from(std::process::id() % 1000))?;
    let keys: Arc<Vec<Mutex<Vec<KeyState>>>> = Arc::new(
        (0..args.tasks)
            .map(|_| Mutex::new(vec![KeyState::default(); KEYS_PER_TASK]))
            .collect(),
    );
    const GAP: &str = "dmkit_memnode_lease_renewal_gap_seconds";
    let gaps = |procs: &[Proc]| {
        let pages: Vec<String> = procs[..3].iter().map(Proc::scrape).collect();
        buckets(&pages, GAP, "by=\"master\"")
    };
    let gaps0 = gaps(&procs);
    let epoch0 = metric_sum(&procs[master_ix].scrape(), "dmkit_fusee_membership_epoch");
    let fences0: f64 = (procs[..3].iter())
        .map(|p| metric_sum(&p.scrape(), "dmkit_memnode_fences_total"))
        .sum();

    // 2. Calm, 3. hog.
    let mut master_exits = 0u64;
    let calm = phase(
        &client,
        &keys,
        gw_port,
        redis_benchmark,
        calm_secs,
        &mut procs,
        master_ix,
        &mut master_exits,
        "calm",
    )?;
    let gaps1 = gaps(&procs);
    let hog = Hog::start(hog_threads)?;
    let busy = phase(
        &client,
        &keys,
        gw_port,
        redis_benchmark,
        hog_secs,
        &mut procs,
        master_ix,
        &mut master_exits,
        "hog",
    )?;
    drop(hog);
    let gaps2 = gaps(&procs);

    // 4. Checks.
    let epoch1 = metric_sum(&procs[master_ix].scrape(), "dmkit_fusee_membership_epoch");
    let fences1: f64 = (procs[..3].iter())
        .map(|p| metric_sum(&p.scrape(), "dmkit_memnode_fences_total"))
        .sum();
    let step_downs = metric_sum(
        &procs[master_ix].scrape(),
        "dmkit_fusee_master_step_downs_total",
    );
    let mut lost = 0u64;
    let mut checked = 0u64;
    for (t, ks) in keys.iter().enumerate() {
        for (k, st) in ks.lock().iter().enumerate() {
            let key = format!("soak:{t}:{k}");
            let got = read_back(&client, key.as_bytes());
            checked += 1;
            match got {
                Ok(v) if v == st.acked || st.maybe.contains(&v) => {}
                Ok(v) => {
                    lost += 1;
                    eprintln!(
                        "soak: {key}: read {:?}, acknowledged {:?}",
                        v.as_deref().map(String::from_utf8_lossy),
                        st.acked.as_deref().map(String::from_utf8_lossy)
                    );
                }
                Err(e) => {
                    lost += 1;
                    eprintln!("soak: {key}: cannot read it back: {e}");
                }
            }
        }
    }
    // Gateway restarts: after SIGTERM, then after SIGKILL.
    let mut restarts = Vec::new();
    for (what, sig) in [("sigterm", libc::SIGTERM), ("sigkill", libc::SIGKILL)] {
        let gw = &mut procs[gw_ix];
        gw.signal(sig);
        let _ = gw.child.wait();
        gw.restart()?;
        let took = time_to_serve(gw_port, Duration::from_secs(120));
        restarts.push((what, took));
    }

    // The report.
    let hog_hours = busy.secs / 3600.0;
    let false_fences = fences1 - fences0;
    let epoch_changes = epoch1 - epoch0;
    let total_ops =
        calm.stats.ops() + busy.stats.ops() + calm.stats.gateway_ops + busy.stats.gateway_ops;
    let total_errors = calm.stats.errors
        + busy.stats.errors
        + calm.stats.gateway_errors
        + busy.stats.gateway_errors;
    let mut report = Report::new("soak");
    report.config("hog_seconds", busy.secs);
    report.config("calm_seconds", calm.secs);
    report.config("idle_seconds", idle_secs);
    report.config("hog_threads", hog_threads as u64);
    report.config("tasks", args.tasks as u64);
    report.config("memory_nodes", "3 (two on pool files, one on DRAM)");
    report.config("replicas", 3u64);
    report.config("redis_benchmark", redis_benchmark);
    let mut ops: Vec<&'static str> = busy.stats.ops.keys().copied().collect();
    ops.sort_unstable();
    for op in &ops {
        for (phase, st) in [("calm", &calm), ("hog", &busy)] {
            if let Some(h) = st.stats.ops.get(op) {
                report.results.push(Measurement {
                    name: format!("{op}_{phase}"),
                    ops_per_sec: h.len() as f64 / st.secs.max(1e-9),
                    p50_us: h.value_at_quantile(0.5) as f64 / 1000.0,
                    p99_us: h.value_at_quantile(0.99) as f64 / 1000.0,
                    rtts_per_op: 0.0,
                    modeled: false,
                    extra: Map::new(),
                });
            }
        }
        if let (Some(c), Some(h)) = (calm.stats.ops.get(op), busy.stats.ops.get(op)) {
            let r = h.value_at_quantile(0.99) as f64 / (c.value_at_quantile(0.99) as f64).max(1.0);
            report.ratio(&format!("{op}_p99_hog_vs_calm"), r, Some("<= 3"));
        }
    }
    // The lease's margin: how late the master's heartbeats reached the memory nodes (the
    // gap between two renewals, upper bucket bounds), calm and beside the hog.
    for (phase, b) in [
        ("calm", bucket_diff(&gaps0, &gaps1)),
        ("hog", bucket_diff(&gaps1, &gaps2)),
    ] {
        for (q, label) in [(0.5, "p50"), (0.99, "p99"), (0.999, "p999")] {
            if let Some(v) = bucket_quantile(&b, q) {
                report.ratio(
                    &format!("renewal_gap_{phase}_{label}_ms_at_most"),
                    v * 1000.0,
                    None,
                );
            }
        }
        report.ratio(
            &format!("renewal_gaps_{phase}_over_250ms"),
            bucket_above(&b, 0.25),
            None,
        );
        report.ratio(
            &format!("renewal_gaps_{phase}"),
            b.last().map_or(0.0, |x| x.1),
            None,
        );
    }
    report.ratio("false_fences", false_fences, None);
    report.ratio(
        "false_fences_per_hour",
        false_fences / hog_hours.max(1e-9),
        Some("<= 1"),
    );
    report.ratio("membership_changes", epoch_changes, None);
    report.ratio("master_exits", master_exits as f64, Some("0"));
    report.ratio("master_step_downs", step_downs, None);
    report.ratio(
        "gateway_max_silence_s",
        (calm
            .stats
            .gateway_max_silence
            .max(busy.stats.gateway_max_silence))
        .as_secs_f64(),
        Some("<= 2"),
    );
    report.ratio(
        "client_error_rate",
        total_errors as f64 / (total_ops as f64).max(1.0),
        Some("<= 0.0001"),
    );
    report.ratio("client_errors", total_errors as f64, None);
    report.ratio("client_ops", total_ops as f64, None);
    report.ratio("lost_acked_writes", lost as f64, Some("0"));
    report.ratio("keys_checked", checked as f64, None);
    report.ratio("idle_cpu_percent", idle_cpu_percent, Some("<= 2"));
    for (what, took) in &restarts {
        report.ratio(
            &format!("gateway_restart_{what}_s"),
            took.map_or(f64::INFINITY, |d| d.as_secs_f64()),
            Some("<= 1"),
        );
    }
    report
        .finish(args.json.as_deref())
        .map_err(CliError::runtime)?;
    let clean = false_fences == 0.0 && master_exits == 0 && lost == 0 && total_errors == 0;
    drop(procs);
    if !keep_dir && clean {
        let _ = std::fs::remove_dir_all(&dir);
    } else {
        eprintln!("soak: logs kept in {}", dir.display());
    }
    Ok(())
}

/// Waits until every port in `ports` accepts a connection.
fn wait_port(ports: &[u16], limit: Duration) -> Result<(), CliError> {
    wait_for(limit, "the memory nodes to listen", || {
        ports
            .iter()
            .all(|p| TcpStream::connect(("127.0.0.1", *p)).is_ok())
    })
}

fn wait_for(limit: Duration, what: &str, mut ok: impl FnMut() -> bool) -> Result<(), CliError> {
    let t = Instant::now();
    while !ok() {
        if t.elapsed() > limit {
            return Err(rt(format!("gave up waiting for {what} after {limit:?}")));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(())
}

/// A key's value as the store holds it now (`None`: absent).
fn read_back(client: &dmkit_fusee::Client, key: &[u8]) -> Result<Option<Vec<u8>>, String> {
    let mut last = String::new();
    for _ in 0..3 {
        match dmkit_verbs::block_on(client.get_async(key)) {
            Ok(e) => return Ok(e.map(|e| e.value)),
            Err(e) => last = e.to_string(),
        }
    }
    Err(last)
}

/// A CPU hog: `n` spinning threads in a child process (`sh` loops), at this process's
/// priority.
struct Hog {
    children: Vec<Child>,
}

impl Hog {
    fn start(n: usize) -> Result<Hog, CliError> {
        let mut children = Vec::new();
        for _ in 0..n {
            let mut cmd = Command::new("sh");
            cmd.args(["-c", "while :; do :; done"])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null());
            pdeathsig(&mut cmd);
            children.push(
                cmd.spawn()
                    .map_err(|e| rt(format!("cannot start the hog: {e}")))?,
            );
        }
        eprintln!("soak: CPU hog started ({n} spinning processes)");
        Ok(Hog { children })
    }
}

impl Drop for Hog {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

struct Phase {
    stats: PhaseStats,
    secs: f64,
}

/// Runs the load for `secs`: the FUSEE tasks, the gateway probers and redis-benchmark;
/// watches the master (restarted if it exits, counted in `master_exits`).
#[allow(clippy::too_many_arguments)]
fn phase(
    client: &dmkit_fusee::Client,
    keys: &Arc<Vec<Mutex<Vec<KeyState>>>>,
    gw_port: u16,
    redis_benchmark: bool,
    secs: u64,
    procs: &mut [Proc],
    master_ix: usize,
    master_exits: &mut u64,
    name: &str,
) -> Result<Phase, CliError> {
    let stop = Arc::new(AtomicBool::new(false));
    let stats = Arc::new(Mutex::new(PhaseStats::default()));
    let seq = Arc::new(AtomicU64::new(0));
    let io = dmkit_verbs::runtime::io_runtime();
    let tasks: Vec<_> = (0..keys.len())
        .map(|t| {
            let (c, keys, stop, stats, seq) = (
                client.clone(),
                keys.clone(),
                stop.clone(),
                stats.clone(),
                seq.clone(),
            );
            io.spawn(async move {
                let mut local = PhaseStats::default();
                let mut n = t as u64;
                while !stop.load(Ordering::Relaxed) {
                    n = n
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    let k = (n >> 33) as usize % KEYS_PER_TASK;
                    let key = format!("soak:{t}:{k}");
                    let pick = (n >> 20) % 10;
                    let start = Instant::now();
                    let (op, ok) = if pick < 5 {
                        ("search", c.get_async(key.as_bytes()).await.is_ok())
                    } else if pick < 9 {
                        let v = format!("v{}", seq.fetch_add(1, Ordering::Relaxed)).into_bytes();
                        let r = c.put_async(key.as_bytes(), &v, None).await;
                        let mut ks = keys[t].lock();
                        let st = &mut ks[k];
                        if r.is_ok() {
                            st.acked = Some(v);
                            st.maybe.clear();
                        } else {
                            st.maybe.push(Some(v));
                        }
                        ("upsert", r.is_ok())
                    } else {
                        let r = c.delete_async(key.as_bytes()).await;
                        let mut ks = keys[t].lock();
                        let st = &mut ks[k];
                        if r.is_ok() {
                            st.acked = None;
                            st.maybe.clear();
                        } else {
                            st.maybe.push(None);
                        }
                        ("delete", r.is_ok())
                    };
                    if ok {
                        local.record(op, start.elapsed());
                    } else {
                        local.errors += 1;
                    }
                }
                let mut s = stats.lock();
                s.errors += local.errors;
                for (op, h) in local.ops {
                    let e = s.ops.entry(op).or_insert_with(|| {
                        Histogram::new_with_bounds(1, 600_000_000_000, 3).expect("histogram bounds")
                    });
                    let _ = e.add(&h);
                }
            })
        })
        .collect();
    // Gateway probers: SET then GET, one at a time, each answer timed.
    let probers: Vec<_> = (0..4)
        .map(|i| {
            let (stop, stats) = (stop.clone(), stats.clone());
            std::thread::spawn(move || {
                let mut conn = None;
                let (mut worst, mut ops, mut errors) = (Duration::ZERO, 0u64, 0u64);
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    if conn.is_none() {
                        conn = gateway_conn(gw_port).ok();
                        if conn.is_none() {
                            errors += 1;
                            std::thread::sleep(Duration::from_millis(50));
                            continue;
                        }
                    }
                    let Some((r, w)) = conn.as_mut() else {
                        continue;
                    };
                    n += 1;
                    let key = format!("soak:gw:{i}:{}", n % 64);
                    let cmd = if n % 2 == 0 {
                        resp_cmd(&[b"SET", key.as_bytes(), b"0123456789abcdef"])
                    } else {
                        resp_cmd(&[b"GET", key.as_bytes()])
                    };
                    let t = Instant::now();
                    let res = w.write_all(&cmd).and_then(|_| read_reply(r));
                    let waited = t.elapsed();
                    worst = worst.max(waited);
                    if waited >= Duration::from_secs(1) {
                        // (With the time of day, to find it in the gateway's log.)
                        let at = std::time::SystemTime::now()
                            .duration_since(std::time::UNIX_EPOCH)
                            .unwrap_or_default();
                        eprintln!(
                            "soak: gateway prober {i} waited {:.2} s for {} {key} (answered at unix {:.3})",
                            waited.as_secs_f64(),
                            if n % 2 == 0 { "SET" } else { "GET" },
                            at.as_secs_f64()
                        );
                    }
                    ops += 1;
                    match res {
                        Ok(false) => {}
                        Ok(true) => errors += 1,
                        Err(_) => {
                            errors += 1;
                            conn = None;
                        }
                    }
                }
                let mut s = stats.lock();
                s.gateway_max_silence = s.gateway_max_silence.max(worst);
                s.gateway_ops += ops;
                s.gateway_errors += errors;
            })
        })
        .collect();
    let bench = redis_benchmark.then(|| {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut failed = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let mut cmd = Command::new("redis-benchmark");
                cmd.args(["-h", "127.0.0.1", "-p", &gw_port.to_string()])
                    .args(["-t", "set,get", "-n", "20000", "-c", "20", "-r", "10000"])
                    .args(["-d", "64", "-q"])
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(Stdio::null());
                pdeathsig(&mut cmd);
                let Ok(mut child) = cmd.spawn() else {
                    failed += 1;
                    break;
                };
                loop {
                    if let Ok(Some(st)) = child.try_wait() {
                        if !st.success() {
                            failed += 1;
                        }
                        break;
                    }
                    if stop.load(Ordering::Relaxed) {
                        let _ = child.kill();
                        let _ = child.wait();
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
            failed
        })
    });
    let t0 = Instant::now();
    let end = t0 + Duration::from_secs(secs);
    let bar = super::progress(secs, &format!("soak: {name}"));
    while Instant::now() < end {
        std::thread::sleep(Duration::from_millis(500));
        if let Ok(Some(st)) = procs[master_ix].child.try_wait() {
            *master_exits += 1;
            eprintln!(
                "soak: the master exited ({st}); restarting it (see {})",
                procs[master_ix].log.display()
            );
            procs[master_ix].restart()?;
        }
        for p in procs.iter_mut() {
            if let Ok(Some(st)) = p.child.try_wait() {
                return Err(rt(format!(
                    "{} exited ({st}) during the {name} phase (see {})",
                    p.name,
                    p.log.display()
                )));
            }
        }
        bar.set_position(t0.elapsed().as_secs().min(secs));
    }
    stop.store(true, Ordering::Relaxed);
    let secs = t0.elapsed().as_secs_f64();
    for t in tasks {
        let _ = dmkit_verbs::block_on(t);
    }
    for p in probers {
        let _ = p.join();
    }
    if let Some(b) = bench {
        let failed = b.join().unwrap_or(0);
        if failed > 0 {
            eprintln!("soak: {failed} redis-benchmark runs failed in the {name} phase");
        }
    }
    bar.finish_and_clear();
    let stats = std::mem::take(&mut *stats.lock());
    Ok(Phase { stats, secs })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renewal_gap_quantiles_come_from_the_buckets_recorded_in_between() {
        let page = |a: u64, b: u64, c: u64| {
            format!(
                "# TYPE g histogram\n\
                 g_bucket{{by=\"master\",le=\"0.1\"}} {a}\n\
                 g_bucket{{by=\"master\",le=\"0.25\"}} {b}\n\
                 g_bucket{{by=\"master\",le=\"+Inf\"}} {c}\n\
                 g_bucket{{by=\"peers\",le=\"0.1\"}} 1000\n"
            )
        };
        let before = buckets(&[page(10, 10, 10)], "g", "by=\"master\"");
        // Two nodes' pages are summed: 990 + 9 + 1 new observations in all.
        let after = buckets(
            &[page(500, 505, 505), page(500, 504, 505)],
            "g",
            "by=\"master\"",
        );
        let d = bucket_diff(&before, &after);
        assert_eq!(
            d,
            vec![(0.1, 990.0), (0.25, 999.0), (f64::INFINITY, 1000.0)]
        );
        assert_eq!(bucket_quantile(&d, 0.5), Some(0.1));
        assert_eq!(bucket_quantile(&d, 0.999), Some(0.25));
        assert_eq!(bucket_quantile(&d, 1.0), Some(f64::INFINITY));
        assert_eq!(bucket_above(&d, 0.25), 1.0);
        assert_eq!(bucket_above(&d, 0.1), 10.0);
        assert_eq!(bucket_quantile(&[], 0.5), None);
    }
}
