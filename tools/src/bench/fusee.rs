//! `dmkit bench fusee`: FUSEE under YCSB on an in-process cluster of 3 memory nodes with 3
//! index and 3 data replicas (`dmkit_fusee::LocalCluster`), one client thread each at 1, 2
//! and 4 clients, scrambled zipfian keys (θ = 0.99) and 1000-byte values (with YCSB's
//! 23-byte keys, about 1 KiB KV pairs), and an in-process `DashMap<Vec<u8>, Vec<u8>>` as the
//! same-run baseline.
//!
//! - `--workload a|b|c|d` (default a): throughput, p50/p99 latency and round trips per
//!   operation against the number of clients; the scaling ratios compare FUSEE with itself at
//!   the first client count. The baseline replays **the same operation stream** (same seed,
//!   same split, the same number of operations per thread as FUSEE completed, pre-generated so
//!   that only the map operations are timed) against a dashmap with the same records loaded:
//!   `fusee_ycsb_<w>_vs_dashmap` is FUSEE's ops/s over the dashmap's at the first client
//!   count (one client thread against one map thread), `fusee_ycsb_<w>_<n>_clients_vs_dashmap`
//!   the same at n. When the workload is not c, YCSB-C also runs at the first client count
//!   for `fusee_ycsb_c_vs_dashmap` (the headline ratio: read-only, where FUSEE pays its
//!   round trips and the map pays a hash lookup).
//! - `--workload micro` on sim: the **modeled** one-client latency of each operation in the sim
//!   backend's latency model (virtual time: 2 µs round trip, 56 Gbit/s, DRAM media), beside
//!   the FUSEE paper's figures (SEARCH ≈ 5 µs, INSERT ≈ 10 µs, UPDATE ≈ 11 µs, DELETE ≈ 11 µs).
//!   Rows `modeled_<op>` have `"modeled": true` and `paper_us`. The client's background
//!   thread (cleanup, block prefetch) shares the endpoint's virtual clock with the client, so
//!   each operation is measured alone: the bench waits for the background work of the previous
//!   one (`Client::flush`), reads the clock and the round-trip counter, runs the operation and
//!   reads them again. A block prefetch the operation itself triggers can still overlap it and
//!   push the clock (rare; visible in p99, not p50).
//!
//! - `--workload micro` on tcp or rdma: the **measured** one-client latency of each operation
//!   beside a replay of its own rounds of verbs (see [`super::fusee_micro`]).
//!
//! On `sim` without a latency model the YCSB figures are wall-clock time of the in-process
//! code path (measured, not modeled).

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use dashmap::DashMap;
use dmkit_fusee::{Client, LocalCluster, LocalConfig};
use dmkit_tools::ycsb::{Operation, Workload, WorkloadSpec};
use dmkit_verbs::sim::LatencyModel;
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
    /// The workload: YCSB a, b, c or d, or `micro` (modeled one-client latency per operation).
    #[arg(long, value_enum, default_value_t = BenchWorkload::A)]
    pub workload: BenchWorkload,
    /// Value bytes of every record (default 1000: about 1 KiB KV pairs with YCSB's keys).
    #[arg(long)]
    pub value_bytes: Option<usize>,
    /// Seconds of the workload per client count (default: 3 with --quick, 10 otherwise).
    #[arg(long)]
    pub seconds: Option<f64>,
    /// Records loaded before the runs (default: 10000 with --quick, 50000 otherwise).
    #[arg(long)]
    pub records: Option<u64>,
    /// With `--workload micro` on tcp or rdma: print where each operation's time goes
    /// (posting verbs, waiting, wake-ups, allocator, encoding, index).
    #[arg(long)]
    pub breakdown: bool,
    /// Operations in flight per client, e.g. 1,32: one client thread runs that many async
    /// operation loops at once (FUSEE's coroutines). With more than one count, the YCSB
    /// workload also runs at each on one client; ratios `fusee_ycsb_<w>_inflight<n>_vs_<first>`.
    #[arg(long, value_delimiter = ',', default_values_t = [1usize])]
    pub inflight: Vec<usize>,
}

/// What `--workload` runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum BenchWorkload {
    A,
    B,
    C,
    D,
    Micro,
}

impl BenchWorkload {
    fn letter(self) -> Option<char> {
        match self {
            BenchWorkload::A => Some('a'),
            BenchWorkload::B => Some('b'),
            BenchWorkload::C => Some('c'),
            BenchWorkload::D => Some('d'),
            BenchWorkload::Micro => None,
        }
    }
}

fn rt(e: impl std::fmt::Display) -> CliError {
    CliError::runtime(e.to_string())
}

const DEFAULT_VALUE_BYTES: usize = 1000;

/// The FUSEE paper's one-client latencies (FAST 2023), in µs.
const PAPER_US: [(&str, f64); 4] = [
    ("search", 5.0),
    ("insert", 10.0),
    ("update", 11.0),
    ("delete", 11.0),
];

pub fn run(args: FuseeArgs) -> Result<(), CliError> {
    if args.backend == Backend::Rdma && args.workload != BenchWorkload::Micro {
        return Err(CliError::usage(
            "bench fusee runs YCSB on sim or tcp; on rdma it runs --workload micro",
        ));
    }
    if args.clients.is_empty() || args.clients.contains(&0) || args.clients.iter().any(|&c| c > 64)
    {
        return Err(CliError::usage(
            "--clients takes client counts between 1 and 64, e.g. 1,2,4",
        ));
    }
    if args.inflight.is_empty()
        || args.inflight.contains(&0)
        || args.inflight.iter().any(|&k| k > 1024)
    {
        return Err(CliError::usage(
            "--inflight takes operation counts between 1 and 1024, e.g. 1,32",
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
    let value_bytes = args.value_bytes.unwrap_or(DEFAULT_VALUE_BYTES);
    if !(1..=16_000).contains(&value_bytes) {
        return Err(CliError::usage(
            "--value-bytes must lie in 1..=16000 (the largest FUSEE object is 16 KiB)",
        ));
    }
    let Some(letter) = args.workload.letter() else {
        return micro(&args, records, value_bytes);
    };
    let mut report = Report::new("fusee");
    report.config("backend", args.backend.to_string());
    report.config("quick", args.quick);
    report.config("workload", format!("ycsb-{letter}"));
    report.config("memory_nodes", 3u64);
    report.config("index_replicas", 3u64);
    report.config("data_replicas", 3u64);
    report.config("records", records);
    report.config("value_bytes", value_bytes as u64);
    report.config("zipfian_constant", 0.99);
    report.config("seconds_per_point", seconds);
    report.config(
        "baseline",
        "DashMap<Vec<u8>, Vec<u8>> (dashmap crate), same operation stream",
    );
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
    if value_bytes > 512 {
        // Objects of 1 KiB and more: room for the loaded records, three replicas each, and
        // the run's updates until they are reclaimed.
        cfg.pool_bytes = (records as usize * 3 * 2 * (value_bytes + 128)).clamp(256 << 20, 1 << 30);
    }
    let cluster = Arc::new(
        match args.backend {
            Backend::Tcp => LocalCluster::start_tcp(cfg),
            _ => LocalCluster::start(cfg),
        }
        .map_err(rt)?,
    );
    let spec_of = |w: char| -> Result<WorkloadSpec, CliError> {
        let mut spec = WorkloadSpec::standard(w).map_err(rt)?;
        spec.record_count = records;
        spec.field_count = 1;
        spec.field_length = value_bytes as u32;
        spec.zipfian_constant = 0.99;
        Ok(spec)
    };
    let spec = spec_of(letter)?;

    let max = *args.clients.iter().max().expect("non-empty");
    load(&cluster, &spec, records, max)?;

    let mut next_id = 1000u64;
    let first = args.clients[0];
    for &n in &args.clients {
        let clients: Vec<Client> = (0..n)
            .map(|i| cluster.client(next_id + i as u64))
            .collect::<Result<_, _>>()
            .map_err(rt)?;
        next_id += n as u64;
        let seed = 2026 + n as u64;
        let workload = Workload::new(spec.clone(), seed).map_err(rt)?;
        let (s, per_thread) = ycsb(&clients, workload, Duration::from_secs_f64(seconds), letter)?;
        report.push(s);
        for c in &clients {
            c.flush().map_err(rt)?;
        }
        let base = dashmap_replay(&spec, seed, &per_thread, letter)?;
        report.push(base);
        let ratio = fusee_vs_dashmap(&report, letter, n);
        if n == first {
            report.ratio(&format!("fusee_ycsb_{letter}_vs_dashmap"), ratio, None);
        } else {
            report.ratio(
                &format!("fusee_ycsb_{letter}_{n}_clients_vs_dashmap"),
                ratio,
                None,
            );
        }
    }
    if args.clients.len() > 1 {
        // The scaling ratios from the client counts run again in interleaved rounds (each
        // count for a fifth of the time, one after the other in each round): what else this
        // machine runs meanwhile falls on every count alike, and a ratio is the median of its
        // rounds' ratios. (The long runs above, one count after the other, moved 1.2-1.9 for
        // one binary on a shared 2-core machine.)
        const ROUNDS: u64 = 5;
        let per = Duration::from_secs_f64((seconds / ROUNDS as f64).max(0.3));
        let sets: Vec<Vec<Client>> = args
            .clients
            .iter()
            .map(|&n| {
                let set = (0..n)
                    .map(|i| cluster.client(next_id + i as u64))
                    .collect::<Result<Vec<_>, _>>();
                next_id += n as u64;
                set
            })
            .collect::<Result<_, _>>()
            .map_err(rt)?;
        let mut tputs = vec![Vec::new(); sets.len()];
        for round in 0..ROUNDS {
            for (i, clients) in sets.iter().enumerate() {
                let seed = 9100 + 100 * round + clients.len() as u64;
                let workload = Workload::new(spec.clone(), seed).map_err(rt)?;
                let (s, _) = ycsb(clients, workload, per, letter)?;
                tputs[i].push(s.measurement.ops_per_sec);
                for c in clients {
                    c.flush().map_err(rt)?;
                }
            }
        }
        for (i, &n) in args.clients.iter().enumerate().skip(1) {
            let rounds: Vec<f64> = tputs[i].iter().zip(&tputs[0]).map(|(a, b)| a / b).collect();
            let name = format!("fusee_ycsb_{letter}_{n}_vs_{first}_clients");
            report.config(&format!("{name}_rounds"), rounds.clone());
            report.ratio(&name, super::median(rounds), None);
        }
    }
    if args.inflight.len() > 1 {
        report.config(
            "inflight",
            Value::from(args.inflight.iter().map(|&k| k as u64).collect::<Vec<_>>()),
        );
        let k0 = args.inflight[0];
        for &k in &args.inflight {
            let client = cluster.client(next_id).map_err(rt)?;
            next_id += 1;
            let seed = 6078 + k as u64;
            let workload = Workload::new(spec.clone(), seed).map_err(rt)?;
            let s = ycsb_inflight(
                &client,
                workload,
                Duration::from_secs_f64(seconds),
                letter,
                k,
            )?;
            report.push(s);
            client.flush().map_err(rt)?;
        }
        let at = |r: &Report, k: usize| {
            r.result(&format!("ycsb_{letter}_1_client_inflight{k}"))
                .map_or(f64::NAN, |m| m.ops_per_sec)
        };
        for &k in &args.inflight[1..] {
            let r = at(&report, k) / at(&report, k0);
            report.ratio(&format!("fusee_ycsb_{letter}_inflight{k}_vs_{k0}"), r, None);
        }
    }
    if letter != 'c' {
        // The headline ratio is on YCSB-C: run it too, at the first client count.
        let spec_c = spec_of('c')?;
        let clients: Vec<Client> = (0..first)
            .map(|i| cluster.client(next_id + i as u64))
            .collect::<Result<_, _>>()
            .map_err(rt)?;
        let seed = 4052 + first as u64;
        let workload = Workload::new(spec_c.clone(), seed).map_err(rt)?;
        let run_for = Duration::from_secs_f64(seconds.min(3.0));
        let (s, per_thread) = ycsb(&clients, workload, run_for, 'c')?;
        report.push(s);
        let base = dashmap_replay(&spec_c, seed, &per_thread, 'c')?;
        report.push(base);
        let ratio = fusee_vs_dashmap(&report, 'c', first);
        report.ratio("fusee_ycsb_c_vs_dashmap", ratio, None);
    }
    report
        .finish(args.json.as_deref())
        .map_err(CliError::runtime)?;
    if let Some(p) = &args.plot {
        plot(&report, &args, letter, p)?;
    }
    Ok(())
}

fn fusee_vs_dashmap(report: &Report, w: char, n: usize) -> f64 {
    let f = report
        .result(&format!("ycsb_{w}_{n}_clients"))
        .map_or(f64::NAN, |m| m.ops_per_sec);
    let d = report
        .result(&format!("dashmap_ycsb_{w}_{n}_threads"))
        .map_or(f64::NAN, |m| m.ops_per_sec);
    f / d
}

fn plot(
    report: &Report,
    args: &FuseeArgs,
    letter: char,
    path: &std::path::Path,
) -> Result<(), CliError> {
    let up = letter.to_ascii_uppercase();
    let pts: Vec<(u32, f64)> = args
        .clients
        .iter()
        .filter_map(|&n| {
            report
                .result(&format!("ycsb_{letter}_{n}_clients"))
                .map(|m| (n as u32, m.ops_per_sec))
        })
        .collect();
    let label = format!("FUSEE ({}, 3 nodes, r=3)", args.backend);
    let title = format!(
        "dmkit bench fusee: YCSB-{up} throughput vs clients ({}{})",
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
        "dmkit bench fusee: YCSB-{up} operation latency ({})",
        args.backend
    );
    let prefix = format!("ycsb_{letter}_");
    report
        .plot_latency_cdf(&cdf, &title, |n| n.starts_with(&prefix))
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
    let value_bytes = spec.field_length as usize;
    std::thread::scope(|s| -> Result<(), CliError> {
        let hs: Vec<_> = keys
            .into_iter()
            .zip(&loaders)
            .map(|(keys, c)| {
                let pb = pb.clone();
                s.spawn(move || -> Result<(), CliError> {
                    let value = vec![b'x'; value_bytes];
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

fn new_hist() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("bounds")
}

struct Tally {
    hist: Histogram<u64>,
    ops: u64,
    round_trips: u64,
}

/// The workload with one thread per client for `run_for`; also returns how many operations
/// each thread completed (the baseline replays exactly those).
fn ycsb(
    clients: &[Client],
    workload: Workload,
    run_for: Duration,
    letter: char,
) -> Result<(Sample, Vec<u64>), CliError> {
    let n = clients.len();
    let up = letter.to_ascii_uppercase();
    let pb = progress(
        run_for.as_secs().max(1),
        &format!("FUSEE: YCSB-{up}, {n} clients"),
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
                        hist: new_hist(),
                        ops: 0,
                        round_trips: 0,
                    };
                    let before = c.endpoint().stats().total().round_trips;
                    while !stop.load(Ordering::Relaxed) {
                        let op = w.next_op();
                        let s0 = Instant::now();
                        // (The blocking API: `block_on` of the same operation.)
                        dmkit_verbs::block_on(run_op(c, op))?;
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
    let mut hist = new_hist();
    let (mut ops, mut rtts) = (0u64, 0u64);
    for t in &tallies {
        let _ = hist.add(&t.hist);
        ops += t.ops;
        rtts += t.round_trips;
    }
    let mut m = measurement(format!("ycsb_{letter}_{n}_clients"), &hist, ops, secs, rtts);
    m.extra.insert("clients".into(), Value::from(n as u64));
    m.extra.insert("operations".into(), Value::from(ops));
    let per_thread = tallies.iter().map(|t| t.ops).collect();
    Ok((
        Sample {
            measurement: m,
            hist,
        },
        per_thread,
    ))
}

/// A measured run: `ops` operations in `secs`, their latencies and round trips.
fn measurement(name: String, hist: &Histogram<u64>, ops: u64, secs: f64, rtts: u64) -> Measurement {
    Measurement {
        name,
        ops_per_sec: ops as f64 / secs,
        p50_us: hist.value_at_quantile(0.5) as f64 / 1000.0,
        p99_us: hist.value_at_quantile(0.99) as f64 / 1000.0,
        rtts_per_op: rtts as f64 / ops.max(1) as f64,
        modeled: false,
        extra: serde_json::Map::new(),
    }
}

/// One YCSB operation on FUSEE (updates and inserts are upserts; scans are skipped).
async fn run_op(c: &Client, op: Operation) -> Result<(), CliError> {
    match op {
        Operation::Read { key } => {
            c.search_async(key.as_bytes()).await.map_err(rt)?;
        }
        Operation::Update { key, value } | Operation::Insert { key, value } => {
            c.upsert_async(key.as_bytes(), &value).await.map_err(rt)?;
        }
        Operation::ReadModifyWrite { key, value } => {
            c.search_async(key.as_bytes()).await.map_err(rt)?;
            c.upsert_async(key.as_bytes(), &value).await.map_err(rt)?;
        }
        Operation::Scan { .. } => {}
    }
    Ok(())
}

/// The workload on one client with `k` operations in flight: one thread drives `k` async
/// loops (each its own share of the stream) with `dmkit_verbs::block_on`.
fn ycsb_inflight(
    client: &Client,
    workload: Workload,
    run_for: Duration,
    letter: char,
    k: usize,
) -> Result<Sample, CliError> {
    let up = letter.to_ascii_uppercase();
    let pb = progress(
        run_for.as_secs().max(1),
        &format!("FUSEE: YCSB-{up}, 1 client, {k} in flight"),
    );
    let stop = AtomicBool::new(false);
    let before = client.endpoint().stats().total().round_trips;
    let start = Instant::now();
    let tallies = std::thread::scope(|s| {
        let stop = &stop;
        let h = s.spawn(move || {
            let loops = workload.split(k).into_iter().map(|mut w| async move {
                let mut t = Tally {
                    hist: new_hist(),
                    ops: 0,
                    round_trips: 0,
                };
                while !stop.load(Ordering::Relaxed) {
                    let op = w.next_op();
                    let s0 = Instant::now();
                    run_op(client, op).await?;
                    let _ = t.hist.record((s0.elapsed().as_nanos() as u64).max(1));
                    t.ops += 1;
                }
                Ok::<_, CliError>(t)
            });
            dmkit_verbs::block_on(dmkit_verbs::join_all(loops.collect()))
        });
        while start.elapsed() < run_for {
            std::thread::sleep(Duration::from_millis(100));
            pb.set_position(start.elapsed().as_secs());
        }
        stop.store(true, Ordering::Relaxed);
        h.join()
            .map_err(|_| CliError::runtime("the client thread panicked"))
    })?;
    pb.finish_and_clear();
    let secs = start.elapsed().as_secs_f64().max(1e-9);
    let rtts = client.endpoint().stats().total().round_trips - before;
    let mut hist = new_hist();
    let mut ops = 0u64;
    for t in tallies {
        let t = t?;
        let _ = hist.add(&t.hist);
        ops += t.ops;
    }
    let mut m = measurement(
        format!("ycsb_{letter}_1_client_inflight{k}"),
        &hist,
        ops,
        secs,
        rtts,
    );
    m.extra.insert("clients".into(), Value::from(1u64));
    m.extra.insert("inflight".into(), Value::from(k as u64));
    m.extra.insert("operations".into(), Value::from(ops));
    Ok(Sample {
        measurement: m,
        hist,
    })
}

/// The baseline: the same records and the same operation stream (same seed and split, the
/// same number of operations per thread) against a `DashMap`, one thread per FUSEE client.
/// The operations are generated before the clock starts, so only the map is timed.
fn dashmap_replay(
    spec: &WorkloadSpec,
    seed: u64,
    per_thread: &[u64],
    letter: char,
) -> Result<Sample, CliError> {
    let n = per_thread.len();
    let map: DashMap<Vec<u8>, Vec<u8>> = DashMap::new();
    let workload = Workload::new(spec.clone(), seed).map_err(rt)?;
    let value = vec![b'x'; spec.field_length as usize];
    for k in workload.load_keys() {
        map.insert(k.into_bytes(), value.clone());
    }
    let streams: Vec<Vec<Operation>> = workload
        .split(n)
        .into_iter()
        .zip(per_thread)
        .map(|(mut w, &count)| (0..count).map(|_| w.next_op()).collect())
        .collect();
    let ops: u64 = per_thread.iter().sum();
    let start = Instant::now();
    let hists = std::thread::scope(|s| {
        let hs: Vec<_> = streams
            .into_iter()
            .map(|stream| {
                let map = &map;
                s.spawn(move || {
                    let mut hist = new_hist();
                    let mut sink = 0usize;
                    for op in stream {
                        let s0 = Instant::now();
                        match op {
                            Operation::Read { key } => {
                                sink += map.get(key.as_bytes()).map_or(0, |v| v.len());
                            }
                            Operation::Update { key, value } | Operation::Insert { key, value } => {
                                map.insert(key.into_bytes(), value);
                            }
                            Operation::ReadModifyWrite { key, value } => {
                                sink += map.get(key.as_bytes()).map_or(0, |v| v.len());
                                map.insert(key.into_bytes(), value);
                            }
                            Operation::Scan { .. } => {}
                        }
                        let _ = hist.record((s0.elapsed().as_nanos() as u64).max(1));
                    }
                    std::hint::black_box(sink);
                    hist
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| {
                h.join()
                    .map_err(|_| CliError::runtime("a dashmap thread panicked"))
            })
            .collect::<Result<Vec<_>, _>>()
    })?;
    let secs = start.elapsed().as_secs_f64().max(1e-9);
    let mut hist = new_hist();
    for h in &hists {
        let _ = hist.add(h);
    }
    let mut m = Measurement {
        name: format!("dashmap_ycsb_{letter}_{n}_threads"),
        ops_per_sec: ops as f64 / secs,
        p50_us: hist.value_at_quantile(0.5) as f64 / 1000.0,
        p99_us: hist.value_at_quantile(0.99) as f64 / 1000.0,
        rtts_per_op: 0.0,
        modeled: false,
        extra: serde_json::Map::new(),
    };
    m.extra.insert("threads".into(), Value::from(n as u64));
    m.extra.insert("operations".into(), Value::from(ops));
    Ok(Sample {
        measurement: m,
        hist,
    })
}

/// Virtual-time latencies and round trips of one operation kind.
struct Modeled {
    hist: Histogram<u64>,
    sum_ns: u64,
    ops: u64,
    rtts: u64,
}

impl Modeled {
    fn new() -> Self {
        Self {
            hist: new_hist(),
            sum_ns: 0,
            ops: 0,
            rtts: 0,
        }
    }

    /// Runs `op` alone on `c` (its background work from before finished) and records its
    /// modeled time and round trips.
    fn measure<T>(
        &mut self,
        c: &Client,
        op: impl FnOnce() -> dmkit_fusee::Result<T>,
    ) -> Result<T, CliError> {
        c.flush().map_err(rt)?;
        let ep = c.endpoint();
        let (t0, r0) = (ep.virtual_now(), ep.stats().total().round_trips);
        let out = op().map_err(rt)?;
        let (t1, r1) = (ep.virtual_now(), ep.stats().total().round_trips);
        let ns = (t1.saturating_sub(t0).as_nanos() as u64).max(1);
        let _ = self.hist.record(ns);
        self.sum_ns += ns;
        self.ops += 1;
        self.rtts += r1 - r0;
        Ok(out)
    }

    fn sample(self, name: &str, paper_us: Option<f64>, what: &str) -> Sample {
        let mean_us = self.sum_ns as f64 / self.ops.max(1) as f64 / 1000.0;
        let mut m = Measurement {
            name: name.to_string(),
            ops_per_sec: if mean_us > 0.0 { 1e6 / mean_us } else { 0.0 },
            p50_us: self.hist.value_at_quantile(0.5) as f64 / 1000.0,
            p99_us: self.hist.value_at_quantile(0.99) as f64 / 1000.0,
            rtts_per_op: self.rtts as f64 / self.ops.max(1) as f64,
            modeled: true,
            extra: serde_json::Map::new(),
        };
        m.extra
            .insert("mean_us".into(), Value::from(round3(mean_us)));
        m.extra.insert("operations".into(), Value::from(self.ops));
        m.extra.insert("what".into(), Value::from(what));
        if let Some(p) = paper_us {
            m.extra.insert("paper_us".into(), Value::from(p));
            m.extra
                .insert("p50_vs_paper".into(), Value::from(round3(m.p50_us / p)));
        }
        Sample {
            measurement: m,
            hist: self.hist,
        }
    }
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// The micro-benchmarks' value of key `i` in write round `round`: `len` bytes, the key's
/// number first, so every key's every round is told apart.
pub(super) fn micro_value(i: u64, round: u8, len: usize) -> Vec<u8> {
    let mut v = vec![b'a' + round; len];
    let tag = i.to_le_bytes();
    let n = tag.len().min(v.len());
    v[..n].copy_from_slice(&tag[..n]);
    v
}

/// `--workload micro`: one client, each operation alone, in the sim latency model's virtual
/// time.
fn micro(args: &FuseeArgs, records: u64, value_bytes: usize) -> Result<(), CliError> {
    if args.backend != Backend::Sim {
        // (Keys per operation kind: 300 quick, 4 000 by default, `--records` when given.)
        let keys = args.records.unwrap_or(if args.quick { 300 } else { 4_000 });
        return super::fusee_micro::run(
            args.backend,
            args.quick,
            args.breakdown,
            args.json.as_deref(),
            keys,
            value_bytes,
        );
    }
    let keys = records.min(if args.quick { 2_000 } else { 10_000 });
    let model = LatencyModel::default();
    let mut report = Report::new("fusee");
    report.config("backend", "sim+latency-model");
    report.config("quick", args.quick);
    report.config("workload", "micro");
    report.config("memory_nodes", 3u64);
    report.config("index_replicas", 3u64);
    report.config("data_replicas", 3u64);
    report.config("keys", keys);
    report.config("value_bytes", value_bytes as u64);
    report.config("model_rtt_us", model.rtt.as_secs_f64() * 1e6);
    report.config("model_link_gbps", model.link_gbps);
    report.config("media", "DRAM pools");
    report.config(
        "paper",
        "FUSEE (FAST 2023) one-client latency: SEARCH 5 us, INSERT 10 us, UPDATE 11 us, DELETE 11 us",
    );
    let mut cfg = LocalConfig::new(3, 3);
    cfg.pool_bytes = (keys as usize * 3 * 4 * (value_bytes + 128)).clamp(64 << 20, 1 << 30);
    cfg.sim.latency = Some(model);
    let cluster = LocalCluster::start(cfg).map_err(rt)?;
    let c = cluster.client(1).map_err(rt)?;
    let key = |i: u64| format!("micro-key-{i:012}");
    let value = |i: u64, round: u8| micro_value(i, round, value_bytes);
    let (mut ins, mut hit, mut cold, mut upd, mut del) = (
        Modeled::new(),
        Modeled::new(),
        Modeled::new(),
        Modeled::new(),
        Modeled::new(),
    );
    let pb = progress(keys * 5, "FUSEE: modeled micro");
    for i in 0..keys {
        ins.measure(&c, || c.insert(key(i).as_bytes(), &value(i, 0)))?;
        pb.inc(1);
    }
    for i in 0..keys {
        let v = hit.measure(&c, || c.search(key(i).as_bytes()))?;
        if v.as_deref() != Some(&value(i, 0)[..]) {
            return Err(CliError::runtime(format!(
                "micro: SEARCH of {} lost its value",
                key(i)
            )));
        }
        pb.inc(1);
    }
    for i in 0..keys {
        upd.measure(&c, || c.update(key(i).as_bytes(), &value(i, 1)))?;
        pb.inc(1);
    }
    // A second client with an empty address cache: SEARCH without a cache hit.
    let c2 = cluster.client(2).map_err(rt)?;
    for i in 0..keys {
        cold.measure(&c2, || c2.search(key(i).as_bytes()))?;
        pb.inc(1);
    }
    for i in 0..keys {
        del.measure(&c, || c.delete(key(i).as_bytes()))?;
        pb.inc(1);
    }
    pb.finish_and_clear();
    c.flush().map_err(rt)?;
    let paper = |op: &str| PAPER_US.iter().find(|(n, _)| *n == op).map(|(_, v)| *v);
    report.push(hit.sample(
        "modeled_search",
        paper("search"),
        "SEARCH, address-cache hit (slot and object read together)",
    ));
    report.push(cold.sample(
        "modeled_search_uncached",
        None,
        "SEARCH from a client with an empty address cache (buckets, then object)",
    ));
    report.push(ins.sample("modeled_insert", paper("insert"), "INSERT of a new key"));
    report.push(upd.sample("modeled_update", paper("update"), "UPDATE of a present key"));
    report.push(del.sample("modeled_delete", paper("delete"), "DELETE of a present key"));
    report
        .finish(args.json.as_deref())
        .map_err(CliError::runtime)?;
    println!(
        "(modeled: virtual time of the sim latency model, one client, one operation at a time)"
    );
    for m in &report.results {
        if let Some(p) = m.extra.get("paper_us").and_then(Value::as_f64) {
            println!(
                "  {:<24} modeled p50 {:>7.2} us   paper {:>5.1} us",
                m.name, m.p50_us, p
            );
        }
    }
    Ok(())
}
