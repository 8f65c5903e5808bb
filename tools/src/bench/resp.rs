//! `dmkit bench resp`: the RESP gateway against a real Redis, both driven by the real
//! `redis-benchmark` (`-t set,get`) in the same run.
//!
//! - baseline: `redis-server` started on a free loopback port with `--save '' --appendonly no`
//!   (no persistence, so it is the fastest Redis can be on this machine);
//! - ours: `dmkit resp`'s server in this process over a FUSEE client of an in-process cluster
//!   of 3 memory nodes with 3 index and 3 data replicas. The memory nodes serve over loopback
//!   TCP by default (`LocalCluster::start_tcp`, the path a multi-process deployment takes);
//!   `--backend sim` keeps them in-process;
//! - also: the same gateway over an in-memory hash map, to separate the protocol path from
//!   FUSEE.
//!
//! Ratios are requests/s of ours over Redis's, from redis-benchmark's `--csv` output. Each
//! pair runs in `--rounds` rounds (default 5), Redis and ours one after the other in each, and
//! a ratio is the median of its rounds' ratios: on a shared machine the load moves between
//! minutes, and a round's two runs see the same load.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dmkit_fusee::{LocalCluster, LocalConfig};
use dmkit_tools::resp::{KvBackend, MemoryBackend, RespConfig, RespServer};
use serde_json::{Map, Value};

use super::{Measurement, Report};
use crate::resp_cmd::FuseeBackend;
use crate::{Backend, CliError};

#[derive(Debug, clap::Args)]
pub struct RespBenchArgs {
    /// Backend of the FUSEE cluster behind the gateway.
    #[arg(long, value_enum, default_value_t = Backend::Tcp)]
    pub backend: Backend,
    /// A short run (under a minute on two cores).
    #[arg(long)]
    pub quick: bool,
    /// Write the JSON report here.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Draw latency CDFs (from redis-benchmark's percentiles) here (.svg or .png).
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// Requests per test and target, over all rounds (default: 50000 with --quick, 100000
    /// otherwise).
    #[arg(long)]
    pub requests: Option<u64>,
    /// Rounds each pair runs in, Redis and ours one after the other in each (their requests
    /// split evenly); a ratio is the median of its rounds' ratios.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..))]
    pub rounds: u64,
    /// Parallel redis-benchmark connections.
    #[arg(long, default_value_t = 50)]
    pub connections: u32,
    /// Worker threads of this process's I/O runtime, which runs the gateway's connections,
    /// its FUSEE client's completions and the memory nodes: 1 by default, as redis-server
    /// serves from one thread (over `DMKIT_IO_THREADS`; the runtime must not have started).
    #[arg(long, default_value_t = 1)]
    pub io_threads: usize,
}

fn rt(e: impl std::fmt::Display) -> CliError {
    CliError::runtime(e.to_string())
}

/// Keyspace of the random keys (`-r`) and value size (`-d`).
const KEYSPACE: u64 = 10_000;
const VALUE_BYTES: u64 = 64;

pub fn run(args: RespBenchArgs) -> Result<(), CliError> {
    if args.backend == Backend::Rdma {
        return Err(CliError::usage(
            "bench resp runs its FUSEE cluster in one process on sim or tcp",
        ));
    }
    if args.connections == 0 {
        return Err(CliError::usage("--connections must be at least 1"));
    }
    let requests = args
        .requests
        .unwrap_or(if args.quick { 50_000 } else { 100_000 });
    if requests == 0 {
        return Err(CliError::usage("--requests must be at least 1"));
    }
    dmkit_verbs::runtime::set_io_threads(args.io_threads)
        .map_err(|e| CliError::usage(format!("--io-threads: {e}")))?;
    let version = tool_version("redis-benchmark", "redis-tools")?;
    let server_version = tool_version("redis-server", "redis-server")?;

    let mut report = Report::new("resp");
    report.config("backend", args.backend.to_string());
    report.config("quick", args.quick);
    report.config("requests_per_test", requests);
    report.config("connections", u64::from(args.connections));
    report.config("io_threads", args.io_threads as u64);
    report.config("keyspace", KEYSPACE);
    report.config("value_bytes", VALUE_BYTES);
    report.config("memory_nodes", 3u64);
    report.config("replicas", 3u64);
    report.config("redis_benchmark", version);
    report.config("redis_server", server_version);

    let redis = RedisServer::start()?;
    let start_cluster = |replicas: usize| {
        let mut cfg = LocalConfig::new(3, replicas);
        cfg.pool_bytes = 256 << 20;
        match args.backend {
            Backend::Tcp => LocalCluster::start_tcp(cfg),
            _ => LocalCluster::start(cfg),
        }
        .map_err(rt)
    };
    let start_gateway = |b: Arc<dyn KvBackend>| {
        RespServer::start("127.0.0.1:0", b, RespConfig::default())
            .map_err(|e| rt(format!("cannot start the gateway: {e}")))
    };
    let cluster = start_cluster(3)?;
    let client = cluster.client(0xD0_0001).map_err(rt)?;
    let gateway = start_gateway(Arc::new(FuseeBackend(client.clone())))?;
    let cluster_r1 = start_cluster(1)?;
    let client_r1 = cluster_r1.client(0xD0_0002).map_err(rt)?;
    let gateway_r1 = start_gateway(Arc::new(FuseeBackend(client_r1.clone())))?;
    let memory = start_gateway(Arc::new(MemoryBackend::default()))?;

    // (name, variant, port, pipeline depth, the FUSEE client behind it)
    let (g, g1) = (gateway.local_addr().port(), gateway_r1.local_addr().port());
    let targets = [
        ("redis", "", redis.port, 1, None),
        ("gateway_fusee", "", g, 1, Some(&client)),
        ("gateway_memory", "", memory.local_addr().port(), 1, None),
        ("redis", "_p16", redis.port, 16, None),
        ("gateway_fusee", "_p16", g, 16, Some(&client)),
        ("redis", "_r1", redis.port, 1, None),
        ("gateway_fusee", "_r1", g1, 1, Some(&client_r1)),
    ];
    // Each pair (a variant's targets, one test) runs in `rounds` rounds of requests/rounds
    // each, its targets one after the other within a round: what else the machine runs then
    // falls on Redis and on us alike, and each ratio is the median of its rounds' ratios.
    let per_round = (requests / args.rounds).max(1);
    let mut runs: std::collections::HashMap<String, Vec<Run>> = Default::default();
    let mut order = Vec::new();
    for variant in ["", "_p16", "_r1"] {
        for test in ["set", "get"] {
            for round in 1..=args.rounds {
                for (name, _, port, pipeline, fusee) in targets.iter().filter(|t| t.1 == variant) {
                    eprintln!(
                        "dmkit bench resp: redis-benchmark -t {test} -n {per_round} -P {pipeline} \
                         against {name}{variant} (round {round}/{})",
                        args.rounds
                    );
                    let rtts = || fusee.map_or(0, |c| c.endpoint().stats().total().round_trips);
                    let before = rtts();
                    // The serving side's CPU time: redis-server's process, or ours (the
                    // gateway and the memory nodes it runs in this process).
                    let cpu = || {
                        if *name == "redis" {
                            process_cpu(redis.child.id())
                        } else {
                            process_cpu(std::process::id())
                        }
                    };
                    let cpu_before = cpu();
                    let out = redis_benchmark(*port, test, per_round, args.connections, *pipeline)?;
                    let cpu = cpu().zip(cpu_before).map(|(a, b)| a.saturating_sub(b));
                    let rtts = rtts() - before;
                    let rows = parse_benchmark_output(&out)
                        .map_err(|e| rt(format!("redis-benchmark against {name}: {e}")))?;
                    let upper = test.to_ascii_uppercase();
                    let row = rows.iter().find(|r| r.test == upper).ok_or_else(|| {
                        rt(format!(
                            "redis-benchmark against {name} reported no {upper} line: {out}"
                        ))
                    })?;
                    let key = format!("{name}_{test}{variant}");
                    if !runs.contains_key(&key) {
                        order.push(key.clone());
                    }
                    runs.entry(key).or_default().push(Run {
                        row: row.clone(),
                        requests: per_round,
                        cpu,
                        rtts: fusee.map(|_| rtts),
                    });
                }
            }
        }
    }
    client_r1.flush().map_err(rt)?;
    client.flush().map_err(rt)?;
    drop(redis);
    report.config("rounds", args.rounds);
    for name in &order {
        report.results.push(combine(name, &runs[name]));
    }

    // Per round: ours over Redis's (requests/s, and CPU time per request).
    let per_round_ratio = |ours: &str, base: &str, f: fn(&Run) -> f64| -> Vec<f64> {
        let (Some(a), Some(b)) = (runs.get(ours), runs.get(base)) else {
            return Vec::new();
        };
        a.iter().zip(b).map(|(a, b)| f(a) / f(b)).collect()
    };
    let rps = |r: &Run| r.row.rps;
    let cpu = |r: &Run| {
        r.cpu
            .map_or(f64::NAN, |c| c.as_secs_f64() / r.requests as f64)
    };
    for op in ["get", "set"] {
        let rounds = per_round_ratio(&format!("gateway_fusee_{op}"), &format!("redis_{op}"), rps);
        report.config(
            &format!("resp_gateway_{op}_rounds_vs_redis"),
            rounds.clone(),
        );
        let target = if op == "get" { ">= 0.7" } else { ">= 0.25" };
        report.ratio(
            &format!("resp_gateway_{op}_vs_redis"),
            super::median(rounds),
            Some(target),
        );
        let proto = per_round_ratio(&format!("gateway_memory_{op}"), &format!("redis_{op}"), rps);
        report.ratio(
            &format!("resp_protocol_only_{op}_vs_redis"),
            super::median(proto),
            None,
        );
        // CPU time per request, the serving side's (ours: gateway and memory nodes), over
        // Redis's: unlike requests/s it does not swing with what else the machine runs.
        let c = per_round_ratio(&format!("gateway_fusee_{op}"), &format!("redis_{op}"), cpu);
        report.ratio(
            &format!("resp_gateway_{op}_cpu_per_op_vs_redis"),
            super::median(c),
            None,
        );
        for variant in ["p16", "r1"] {
            let r = per_round_ratio(
                &format!("gateway_fusee_{op}_{variant}"),
                &format!("redis_{op}_{variant}"),
                rps,
            );
            report.ratio(
                &format!("resp_gateway_{op}_{variant}_vs_redis"),
                super::median(r),
                None,
            );
        }
    }
    report
        .finish(args.json.as_deref())
        .map_err(CliError::runtime)?;
    if let Some(p) = &args.plot {
        plot(&report, p, &args)?;
    }
    Ok(())
}

/// One round of redis-benchmark against one target.
struct Run {
    row: BenchRow,
    requests: u64,
    /// The serving process's CPU time over the round.
    cpu: Option<Duration>,
    /// FUSEE's round trips to the memory nodes over the round (all verbs, every replica).
    rtts: Option<u64>,
}

/// A target's measurement over its rounds: requests/s over their whole time, latencies the
/// median of the rounds' own, CPU time and round trips per request over all of them.
fn combine(name: &str, runs: &[Run]) -> Measurement {
    let requests: u64 = runs.iter().map(|r| r.requests).sum();
    let secs: f64 = runs.iter().map(|r| r.requests as f64 / r.row.rps).sum();
    let median_of = |f: fn(&BenchRow) -> Option<f64>| {
        let v: Vec<f64> = runs.iter().filter_map(|r| f(&r.row)).collect();
        (!v.is_empty()).then(|| super::median(v))
    };
    let row = BenchRow {
        test: runs
            .first()
            .map_or_else(String::new, |r| r.row.test.clone()),
        rps: requests as f64 / secs,
        avg_ms: median_of(|r| r.avg_ms),
        min_ms: median_of(|r| r.min_ms),
        p50_ms: median_of(|r| r.p50_ms),
        p95_ms: median_of(|r| r.p95_ms),
        p99_ms: median_of(|r| r.p99_ms),
        max_ms: median_of(|r| r.max_ms),
    };
    let mut m = row.measurement(name);
    if let Some(cpu) = runs.iter().map(|r| r.cpu).sum::<Option<Duration>>() {
        m.extra.insert(
            "server_cpu_us_per_op".into(),
            Value::from((cpu.as_secs_f64() * 1e6 / requests as f64 * 100.0).round() / 100.0),
        );
    }
    if let Some(used) = runs.iter().map(|r| r.rtts).sum::<Option<u64>>() {
        m.extra.insert(
            "fusee_rtts_per_op".into(),
            Value::from((used as f64 / requests as f64 * 1000.0).round() / 1000.0),
        );
    }
    m
}

/// Latency CDFs through the percentiles redis-benchmark reports (min, p50, p95, p99, max).
fn plot(report: &Report, path: &std::path::Path, args: &RespBenchArgs) -> Result<(), CliError> {
    let series: Vec<(String, Vec<(f64, f64)>)> = report
        .results
        .iter()
        .filter_map(|m| {
            let g = |k: &str| m.extra.get(k).and_then(Value::as_f64);
            Some((
                m.name.clone(),
                vec![
                    (g("min_us")?, 0.0),
                    (m.p50_us, 0.5),
                    (g("p95_us")?, 0.95),
                    (m.p99_us, 0.99),
                    (g("max_us")?, 1.0),
                ],
            ))
        })
        .collect();
    let title = format!(
        "dmkit bench resp: redis-benchmark latency, {} connections (FUSEE on {})",
        args.connections, args.backend
    );
    dmkit_tools::plot::plot_latency_cdf(path, &title, &series)
        .map_err(|e| CliError::runtime(format!("--plot: {e}")))?;
    eprintln!("wrote {}", path.display());
    Ok(())
}

/// `TOOL --version`, or a clear error naming the Debian package that provides it.
fn tool_version(tool: &str, package: &str) -> Result<String, CliError> {
    match Command::new(tool).arg("--version").output() {
        Ok(o) if o.status.success() => Ok(String::from_utf8_lossy(&o.stdout).trim().to_string()),
        Ok(o) => Err(CliError::runtime(format!(
            "{tool} --version failed: {}",
            String::from_utf8_lossy(&o.stderr).trim()
        ))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(CliError::runtime(format!(
            "{tool} not found: bench resp needs it (Debian/Ubuntu: apt-get install {package})"
        ))),
        Err(e) => Err(CliError::runtime(format!("cannot run {tool}: {e}"))),
    }
}

/// A `redis-server` child on a free loopback port; killed when dropped.
/// CPU time (user + system) a process has used so far, from `/proc/PID/stat` (clock ticks);
/// `None` where there is no procfs.
pub(crate) fn process_cpu(pid: u32) -> Option<Duration> {
    let (user, sys) = process_user_sys(pid)?;
    Some(user + sys)
}

/// A process's CPU time so far in user mode and in the kernel (clock ticks of
/// `/proc/PID/stat`).
pub(crate) fn process_user_sys(pid: u32) -> Option<(Duration, Duration)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may hold spaces, inside parentheses).
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let (user, sys): (u64, u64) = (f.get(11)?.parse().ok()?, f.get(12)?.parse().ok()?);
    // SAFETY: sysconf only reads a configuration value.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    let hz = u64::try_from(hz).ok().filter(|&h| h > 0)?;
    let t = |ticks: u64| Duration::from_micros(ticks * 1_000_000 / hz);
    Some((t(user), t(sys)))
}

struct RedisServer {
    child: Child,
    port: u16,
}

impl RedisServer {
    fn start() -> Result<RedisServer, CliError> {
        // Ask the kernel for a free port; the short race until redis binds it is harmless
        // (a failure to bind is reported below).
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| rt(format!("no free loopback port: {e}")))?
            .port();
        let mut cmd = Command::new("redis-server");
        cmd.args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
            .args(["--protected-mode", "no", "--logfile", ""])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        // A bench killed by a signal runs no destructor: the kernel ends redis-server with
        // it (it is started from the thread that runs the whole bench).
        super::soak::pdeathsig(&mut cmd);
        let child = cmd
            .spawn()
            .map_err(|e| rt(format!("cannot start redis-server: {e}")))?;
        let mut s = RedisServer { child, port };
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if ping(port) {
                return Ok(s);
            }
            if let Ok(Some(st)) = s.child.try_wait() {
                return Err(rt(format!(
                    "redis-server exited ({st}) before serving on 127.0.0.1:{port}"
                )));
            }
            if Instant::now() > deadline {
                return Err(rt(format!(
                    "redis-server did not answer PING on 127.0.0.1:{port} within 10 s"
                )));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn ping(port: u16) -> bool {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(1)));
    if s.write_all(b"PING\r\n").is_err() {
        return false;
    }
    let mut buf = [0u8; 7];
    s.read_exact(&mut buf).is_ok() && &buf == b"+PONG\r\n"
}

/// Runs redis-benchmark's `test` (set or get) against 127.0.0.1:`port`; its stdout (CSV). Fails on a non-zero exit
/// or on an error reply from the server.
fn redis_benchmark(
    port: u16,
    test: &str,
    requests: u64,
    connections: u32,
    pipeline: u32,
) -> Result<String, CliError> {
    let out = Command::new("redis-benchmark")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(["-t", test, "-n", &requests.to_string()])
        .args(["-c", &connections.to_string()])
        .args(["-P", &pipeline.max(1).to_string()])
        .args(["-r", &KEYSPACE.to_string(), "-d", &VALUE_BYTES.to_string()])
        .arg("--csv")
        .stdin(Stdio::null())
        .output()
        .map_err(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                rt("redis-benchmark not found (Debian/Ubuntu: apt-get install redis-tools)")
            } else {
                rt(format!("cannot run redis-benchmark: {e}"))
            }
        })?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    if !out.status.success() || stderr.contains("Error") || stdout.contains("Error from server") {
        return Err(rt(format!(
            "redis-benchmark on port {port} failed ({}): {} {}",
            out.status,
            stderr.trim(),
            stdout.trim()
        )));
    }
    Ok(stdout)
}

/// One test line of redis-benchmark's output.
#[derive(Debug, Clone, PartialEq)]
pub struct BenchRow {
    pub test: String,
    pub rps: f64,
    /// Latencies in milliseconds, where the output has them.
    pub avg_ms: Option<f64>,
    pub min_ms: Option<f64>,
    pub p50_ms: Option<f64>,
    pub p95_ms: Option<f64>,
    pub p99_ms: Option<f64>,
    pub max_ms: Option<f64>,
}

impl BenchRow {
    fn measurement(&self, name: &str) -> Measurement {
        let us = |v: Option<f64>| v.map_or(f64::NAN, |ms| ms * 1000.0);
        let mut extra = Map::new();
        for (k, v) in [
            ("avg_us", self.avg_ms),
            ("min_us", self.min_ms),
            ("p95_us", self.p95_ms),
            ("max_us", self.max_ms),
        ] {
            if let Some(v) = v {
                extra.insert(k.into(), Value::from(v * 1000.0));
            }
        }
        Measurement {
            name: name.to_string(),
            ops_per_sec: self.rps,
            p50_us: us(self.p50_ms),
            p99_us: us(self.p99_ms),
            // One client-to-server request-response per operation (no pipelining).
            rtts_per_op: 1.0,
            modeled: false,
            extra,
        }
    }
}

/// Parses redis-benchmark's `--csv` output (a header row naming the columns, then one
/// quoted row per test) or, failing that, its `-q` output (`SET: 81234.57 requests per
/// second, p50=0.311 msec`). Errors when no test line can be read.
pub fn parse_benchmark_output(out: &str) -> Result<Vec<BenchRow>, String> {
    let rows = parse_csv(out);
    if !rows.is_empty() {
        return Ok(rows);
    }
    let rows = parse_quiet(out);
    if rows.is_empty() {
        return Err(format!(
            "no test results in its output: {:?}",
            out.chars().take(400).collect::<String>()
        ));
    }
    Ok(rows)
}

fn csv_fields(line: &str) -> Vec<String> {
    line.trim()
        .split(',')
        .map(|f| f.trim().trim_matches('"').to_string())
        .collect()
}

fn parse_csv(out: &str) -> Vec<BenchRow> {
    let mut header: Option<Vec<String>> = None;
    let mut rows = Vec::new();
    for line in out.lines().map(str::trim).filter(|l| l.starts_with('"')) {
        let f = csv_fields(line);
        if f.first().is_some_and(|t| t == "test") {
            header = Some(f);
            continue;
        }
        let col = |name: &str, fallback: usize| -> Option<f64> {
            let i = match &header {
                Some(h) => h.iter().position(|c| c == name)?,
                None => fallback,
            };
            f.get(i)?.parse::<f64>().ok()
        };
        let Some(rps) = col("rps", 1) else { continue };
        if header.is_none() && f.len() > 2 {
            // Without a header only the old two-column format is unambiguous.
            continue;
        }
        rows.push(BenchRow {
            test: f[0].clone(),
            rps,
            avg_ms: col("avg_latency_ms", usize::MAX),
            min_ms: col("min_latency_ms", usize::MAX),
            p50_ms: col("p50_latency_ms", usize::MAX),
            p95_ms: col("p95_latency_ms", usize::MAX),
            p99_ms: col("p99_latency_ms", usize::MAX),
            max_ms: col("max_latency_ms", usize::MAX),
        });
    }
    rows
}

fn parse_quiet(out: &str) -> Vec<BenchRow> {
    // Progress updates end in '\r'; the final figure of a test is the last one on its line.
    let mut rows: Vec<BenchRow> = Vec::new();
    for seg in out.split(['\n', '\r']) {
        let Some((test, rest)) = seg.split_once(": ") else {
            continue;
        };
        let Some(num) = rest.split_whitespace().next() else {
            continue;
        };
        if !rest.contains("requests per second") {
            continue;
        }
        let Ok(rps) = num.parse::<f64>() else {
            continue;
        };
        let p50_ms = rest
            .split("p50=")
            .nth(1)
            .and_then(|r| r.split_whitespace().next())
            .and_then(|v| v.parse().ok());
        let row = BenchRow {
            test: test.trim().to_string(),
            rps,
            avg_ms: None,
            min_ms: None,
            p50_ms,
            p95_ms: None,
            p99_ms: None,
            max_ms: None,
        };
        match rows.iter_mut().find(|r| r.test == row.test) {
            Some(r) => *r = row,
            None => rows.push(row),
        }
    }
    rows
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_with_header_is_read_by_column_name() {
        let out = "\"test\",\"rps\",\"avg_latency_ms\",\"min_latency_ms\",\"p50_latency_ms\",\"p95_latency_ms\",\"p99_latency_ms\",\"max_latency_ms\"\n\"SET\",\"81300.81\",\"0.337\",\"0.088\",\"0.311\",\"0.567\",\"0.911\",\"2.127\"\n\"GET\",\"90909.09\",\"0.300\",\"0.080\",\"0.279\",\"0.487\",\"0.703\",\"1.319\"\n";
        let rows = parse_benchmark_output(out).unwrap();
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].test, "SET");
        assert_eq!(rows[0].rps, 81300.81);
        assert_eq!(rows[0].p99_ms, Some(0.911));
        assert_eq!(rows[1].test, "GET");
        assert_eq!(rows[1].p50_ms, Some(0.279));
        let m = rows[1].measurement("redis_get");
        assert!((m.p50_us - 279.0).abs() < 1e-6);
        assert!(m.extra.contains_key("max_us"));
    }

    #[test]
    fn old_two_column_csv_and_quiet_output_are_read() {
        let rows = parse_benchmark_output("\"SET\",\"1234.50\"\n\"GET\",\"2000\"\n").unwrap();
        assert_eq!((rows[1].test.as_str(), rows[1].rps), ("GET", 2000.0));
        let q = "SET: rps=0.0 (overall: nan) avg_msec=nan (overall: nan)\rSET: 81234.57 requests per second, p50=0.311 msec\nGET: 90000.00 requests per second, p50=0.279 msec\n\n";
        let rows = parse_benchmark_output(q).unwrap();
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].rps, 81234.57);
        assert_eq!(rows[0].p50_ms, Some(0.311));
    }

    #[test]
    fn unreadable_output_is_an_error() {
        assert!(parse_benchmark_output("").is_err());
        assert!(parse_benchmark_output("Could not connect to Redis at 127.0.0.1:1").is_err());
    }
}
