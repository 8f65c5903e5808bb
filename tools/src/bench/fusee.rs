//! `dmkit bench fusee`: FUSEE throughput against the number of clients under YCSB-A (50%
//! reads, 50% updates, scrambled zipfian keys, 256-byte values) on an in-process cluster of 3
//! memory nodes with 3 index and 3 data replicas (`dmkit_fusee::LocalCluster`), one client
//! thread each at 1, 2 and 4 clients.
//!
//! There is no external baseline in this bench: the ratios compare FUSEE with itself at one
//! client (how throughput scales), measured in the same run. On `sim` without a latency model
//! the figures are wall-clock time of the in-process code path (measured, not modeled).

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use dmkit_fusee::{Client, LocalCluster, LocalConfig};
use dmkit_tools::ycsb::{Operation, Workload, WorkloadSpec};
use hdrhistogram::Histogram;
use serde_json::Value;

use super::{Measurement, Report, Sample, progress};
use crate::{Backend, CliError};

#[derive(Debug, clap::Args)]
pub struct FuseeArgs {
    /// Backend of the in-process cluster.
    #[arg(long, value_enum, default_value_t = Backend::Sim)]
    pub backend: Backend,
    /// A short run (under a minute on two cores).
    #[arg(long)]
    pub quick: bool,
    /// Write the JSON report here.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Draw throughput against clients here (.svg or .png); the latency CDFs go beside it
    /// as `<name>-latency.<ext>`.
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// Client counts to measure, e.g. 1,2,4.
    #[arg(long, value_delimiter = ',', default_values_t = [1usize, 2, 4])]
    pub clients: Vec<usize>,
    /// Seconds of YCSB-A per client count (default: 3 with --quick, 10 otherwise).
    #[arg(long)]
    pub seconds: Option<f64>,
    /// Records loaded before the runs (default: 10000 with --quick, 50000 otherwise).
    #[arg(long)]
    pub records: Option<u64>,
}

fn rt(e: impl std::fmt::Display) -> CliError {
    CliError::runtime(e.to_string())
}

const VALUE_BYTES: usize = 256;

pub fn run(args: FuseeArgs) -> Result<(), CliError> {
    if args.backend == Backend::Rdma {
        return Err(CliError::usage(
            "bench fusee runs its cluster in one process on sim or tcp",
        ));
    }
    if args.clients.is_empty() || args.clients.contains(&0) || args.clients.iter().any(|&c| c > 64)
    {
        return Err(CliError::usage(
            "--clients takes client counts between 1 and 64, e.g. 1,2,4",
        ));
    }
    let seconds = args.seconds.unwrap_or(if args.quick { 3.0 } else { 10.0 });
    if !(seconds > 0.0 && seconds <= 3600.0) {
        return Err(CliError::usage("--seconds must lie in (0, 3600]"));
    }
    let records = args
        .records
        .unwrap_or(if args.quick { 10_000 } else { 50_000 });
    if records == 0 {
        return Err(CliError::usage("--records must be at least 1"));
    }
    let mut report = Report::new("fusee");
    report.config("backend", args.backend.to_string());
    report.config("quick", args.quick);
    report.config("workload", "ycsb-a");
    report.config("memory_nodes", 3u64);
    report.config("index_replicas", 3u64);
    report.config("data_replicas", 3u64);
    report.config("records", records);
    report.config("value_bytes", VALUE_BYTES as u64);
    report.config("seconds_per_point", seconds);
    report.config(
        "clients",
        Value::from(args.clients.iter().map(|&c| c as u64).collect::<Vec<_>>()),
    );
    report.config(
        "threads_available",
        std::thread::available_parallelism().map_or(1, |n| n.get() as u64),
    );

    let mut cfg = LocalConfig::new(3, 3);
    cfg.pool_bytes = 256 << 20;
    let cluster = Arc::new(
        match args.backend {
            Backend::Tcp => LocalCluster::start_tcp(cfg),
            _ => LocalCluster::start(cfg),
        }
        .map_err(rt)?,
    );
    let mut spec = WorkloadSpec::standard('a').map_err(rt)?;
    spec.record_count = records;
    spec.field_count = 1;
    spec.field_length = VALUE_BYTES as u32;

    let max = *args.clients.iter().max().expect("non-empty");
    load(&cluster, &spec, records, max)?;

    let mut next_id = 1000u64;
    for &n in &args.clients {
        let clients: Vec<Client> = (0..n)
            .map(|i| cluster.client(next_id + i as u64))
            .collect::<Result<_, _>>()
            .map_err(rt)?;
        next_id += n as u64;
        let workload = Workload::new(spec.clone(), 2026 + n as u64).map_err(rt)?;
        let s = ycsb_a(&clients, workload, Duration::from_secs_f64(seconds), n)?;
        report.push(s);
        for c in &clients {
            c.flush().map_err(rt)?;
        }
    }
    let tput = |r: &Report, n: usize| {
        r.result(&format!("ycsb_a_{n}_clients"))
            .map_or(f64::NAN, |m| m.ops_per_sec)
    };
    let first = args.clients[0];
    for &n in &args.clients[1..] {
        let r = tput(&report, n) / tput(&report, first);
        report.ratio(&format!("fusee_ycsb_a_{n}_vs_{first}_clients"), r, None);
    }
    report
        .finish(args.json.as_deref())
        .map_err(CliError::runtime)?;
    if let Some(p) = &args.plot {
        plot(&report, &args, p)?;
    }
    Ok(())
}

fn plot(report: &Report, args: &FuseeArgs, path: &std::path::Path) -> Result<(), CliError> {
    let pts: Vec<(u32, f64)> = args
        .clients
        .iter()
        .filter_map(|&n| {
            report
                .result(&format!("ycsb_a_{n}_clients"))
                .map(|m| (n as u32, m.ops_per_sec))
        })
        .collect();
    let label = format!("FUSEE ({}, 3 nodes, r=3)", args.backend);
    let title = format!(
        "dmkit bench fusee: YCSB-A throughput vs clients ({}{})",
        args.backend,
        if args.quick { ", quick" } else { "" }
    );
    dmkit_tools::plot::plot_throughput_vs_clients(path, &title, &[(label, pts)])
        .map_err(|e| CliError::runtime(format!("--plot: {e}")))?;
    eprintln!("wrote {}", path.display());
    let stem = path.file_stem().and_then(|s| s.to_str()).unwrap_or("fusee");
    let ext = path.extension().and_then(|s| s.to_str()).unwrap_or("svg");
    let cdf = path.with_file_name(format!("{stem}-latency.{ext}"));
    let title = format!(
        "dmkit bench fusee: YCSB-A operation latency ({})",
        args.backend
    );
    report
        .plot_latency_cdf(&cdf, &title, |_| true)
        .map_err(|e| CliError::runtime(format!("--plot: {e}")))?;
    eprintln!("wrote {}", cdf.display());
    Ok(())
}

/// Loads `records` keys with `threads` loader clients.
fn load(
    cluster: &LocalCluster,
    spec: &WorkloadSpec,
    records: u64,
    threads: usize,
) -> Result<(), CliError> {
    let workload = Workload::new(spec.clone(), 2026).map_err(rt)?;
    let loaders: Vec<Client> = (0..threads)
        .map(|i| cluster.client(1 + i as u64))
        .collect::<Result<_, _>>()
        .map_err(rt)?;
    let pb = progress(records, "FUSEE: loading");
    let keys = workload.load_keys().split(threads);
    std::thread::scope(|s| -> Result<(), CliError> {
        let hs: Vec<_> = keys
            .into_iter()
            .zip(&loaders)
            .map(|(keys, c)| {
                let pb = pb.clone();
                s.spawn(move || -> Result<(), CliError> {
                    let value = vec![b'x'; VALUE_BYTES];
                    for k in keys {
                        c.upsert(k.as_bytes(), &value).map_err(rt)?;
                        pb.inc(1);
                    }
                    Ok(())
                })
            })
            .collect();
        for h in hs {
            h.join()
                .map_err(|_| CliError::runtime("a loader thread panicked"))??;
        }
        Ok(())
    })?;
    pb.finish_and_clear();
    for c in &loaders {
        c.flush().map_err(rt)?;
    }
    Ok(())
}

struct Tally {
    hist: Histogram<u64>,
    ops: u64,
    round_trips: u64,
}

/// YCSB-A with one thread per client for `run_for`.
fn ycsb_a(
    clients: &[Client],
    workload: Workload,
    run_for: Duration,
    n: usize,
) -> Result<Sample, CliError> {
    let pb = progress(
        run_for.as_secs().max(1),
        &format!("FUSEE: YCSB-A, {n} clients"),
    );
    let stop = AtomicBool::new(false);
    let start = Instant::now();
    let tallies = std::thread::scope(|s| {
        let hs: Vec<_> = workload
            .split(n)
            .into_iter()
            .zip(clients)
            .map(|(mut w, c)| {
                let stop = &stop;
                s.spawn(move || -> Result<Tally, CliError> {
                    let mut t = Tally {
                        hist: Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("bounds"),
                        ops: 0,
                        round_trips: 0,
                    };
                    let before = c.endpoint().stats().total().round_trips;
                    while !stop.load(Ordering::Relaxed) {
                        let op = w.next_op();
                        let s0 = Instant::now();
                        match op {
                            Operation::Read { key } => {
                                c.search(key.as_bytes()).map_err(rt)?;
                            }
                            Operation::Update { key, value } | Operation::Insert { key, value } => {
                                c.upsert(key.as_bytes(), &value).map_err(rt)?;
                            }
                            Operation::ReadModifyWrite { key, value } => {
                                c.search(key.as_bytes()).map_err(rt)?;
                                c.upsert(key.as_bytes(), &value).map_err(rt)?;
                            }
                            Operation::Scan { .. } => {}
                        }
                        let _ = t.hist.record((s0.elapsed().as_nanos() as u64).max(1));
                        t.ops += 1;
                    }
                    t.round_trips = c.endpoint().stats().total().round_trips - before;
                    Ok(t)
                })
            })
            .collect();
        while start.elapsed() < run_for {
            std::thread::sleep(Duration::from_millis(100));
            pb.set_position(start.elapsed().as_secs());
        }
        stop.store(true, Ordering::Relaxed);
        hs.into_iter()
            .map(|h| {
                h.join()
                    .map_err(|_| CliError::runtime("a client thread panicked"))?
            })
            .collect::<Result<Vec<_>, _>>()
    })?;
    pb.finish_and_clear();
    let secs = start.elapsed().as_secs_f64().max(1e-9);
    let mut hist = Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("bounds");
    let (mut ops, mut rtts) = (0u64, 0u64);
    for t in &tallies {
        let _ = hist.add(&t.hist);
        ops += t.ops;
        rtts += t.round_trips;
    }
    let mut m = Measurement {
        name: format!("ycsb_a_{n}_clients"),
        ops_per_sec: ops as f64 / secs,
        p50_us: hist.value_at_quantile(0.5) as f64 / 1000.0,
        p99_us: hist.value_at_quantile(0.99) as f64 / 1000.0,
        rtts_per_op: rtts as f64 / ops.max(1) as f64,
        modeled: false,
        extra: serde_json::Map::new(),
    };
    m.extra.insert("clients".into(), Value::from(n as u64));
    m.extra.insert("operations".into(), Value::from(ops));
    Ok(Sample {
        measurement: m,
        hist,
    })
}
