//! `dmkit demo`: a whole cluster in this process, two workloads, a summary.
//!
//! 1. FUSEE under YCSB-A (50% reads, 50% updates, scrambled zipfian keys) from several client
//!    threads over 3 memory nodes with 3 index and 3 data replicas;
//! 2. Gengar under a hot-read workload (zipfian reads, 10% proxied writes) over 2 servers,
//!    whose windows promote the hot objects into DRAM as it runs.
//!
//! Metrics are served while it runs (the address is printed); `--json` keeps the results.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use dmkit_fusee::{LocalCluster, LocalConfig};
use dmkit_gengar::{
    ClientConfig as GengarClientConfig, GengarClient, GengarServer, ServerConfig, tags as gtags,
};
use dmkit_lease::{Clock, SystemClock};
use dmkit_pmem_pool::{Pool, PoolOptions};
use dmkit_tools::ycsb::{Operation, ScrambledZipfian, Workload, WorkloadSpec};
use dmkit_verbs::sim::{SimCluster, SimConfig};
use dmkit_verbs::tcp::{TcpConnector, TcpServer, TcpServerConfig};
use dmkit_verbs::{Endpoint, NodeId};
use hdrhistogram::Histogram;
use rand::SeedableRng;
use serde_json::Value;

use crate::bench::{Measurement, Report, progress};
use crate::{Backend, CliError};

#[derive(Debug, clap::Args)]
pub struct DemoArgs {
    /// Backend of the in-process cluster.
    #[arg(long, value_enum, default_value_t = Backend::Sim)]
    pub backend: Backend,
    /// Write the results here as JSON.
    #[arg(long)]
    pub json: Option<std::path::PathBuf>,
    /// Total running time of the two workloads, in seconds.
    #[arg(long, default_value_t = 20)]
    pub seconds: u64,
    /// Client threads per workload.
    #[arg(long, default_value_t = 4)]
    pub clients: usize,
    /// Records loaded into FUSEE.
    #[arg(long, default_value_t = 10_000)]
    pub records: u64,
    /// Where to serve Prometheus metrics while the demo runs.
    #[arg(long, default_value = "127.0.0.1:9464")]
    pub metrics: String,
}

fn rt(e: impl std::fmt::Display) -> CliError {
    CliError::runtime(e.to_string())
}

struct Tally {
    hist: Histogram<u64>,
    ops: u64,
    round_trips: u64,
    hits: u64,
    lookups: u64,
}

impl Tally {
    fn new() -> Self {
        Self {
            hist: Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("bounds"),
            ops: 0,
            round_trips: 0,
            hits: 0,
            lookups: 0,
        }
    }

    fn merge(&mut self, o: &Tally) {
        let _ = self.hist.add(&o.hist);
        self.ops += o.ops;
        self.round_trips += o.round_trips;
        self.hits += o.hits;
        self.lookups += o.lookups;
    }

    fn measurement(&self, name: &str, secs: f64) -> Measurement {
        let mut m = Measurement {
            name: name.into(),
            ops_per_sec: self.ops as f64 / secs.max(1e-9),
            p50_us: self.hist.value_at_quantile(0.5) as f64 / 1000.0,
            p99_us: self.hist.value_at_quantile(0.99) as f64 / 1000.0,
            rtts_per_op: self.round_trips as f64 / self.ops.max(1) as f64,
            modeled: false,
            extra: serde_json::Map::new(),
        };
        let ratio = self.hits as f64 / self.lookups.max(1) as f64;
        m.extra.insert(
            "cache_hit_ratio".into(),
            Value::from((ratio * 1000.0).round() / 1000.0),
        );
        m.extra.insert("operations".into(), Value::from(self.ops));
        m
    }
}

pub fn run(args: DemoArgs) -> Result<(), CliError> {
    if args.backend == Backend::Rdma {
        return Err(CliError::usage(
            "the demo runs in one process on sim or tcp; for rdma run dmkit memnode --backend rdma",
        ));
    }
    if args.clients == 0 || args.seconds == 0 {
        return Err(CliError::usage(
            "--clients and --seconds must be at least 1",
        ));
    }
    match crate::metrics_http::serve(&args.metrics) {
        Ok(at) => eprintln!("dmkit demo: metrics at http://{at}/metrics while it runs"),
        Err(e) => eprintln!("dmkit demo: metrics not served ({e}); going on without them"),
    }
    let half = Duration::from_secs(args.seconds).div_f64(2.0);
    let mut report = Report::new("demo");
    report.config("backend", args.backend.to_string());
    report.config("clients", args.clients as u64);
    report.config("seconds", args.seconds);
    report.config("records", args.records);
    let (fusee, fsecs) = fusee_ycsb_a(&args, half)?;
    report
        .results
        .push(fusee.measurement("fusee_ycsb_a", fsecs));
    let (gengar, gsecs) = gengar_hot_reads(&args, half)?;
    report
        .results
        .push(gengar.measurement("gengar_hot_read", gsecs));
    println!();
    println!(
        "{:<20} {:>12} {:>10} {:>10} {:>9} {:>10}",
        "workload", "ops/s", "p50 us", "p99 us", "RTTs/op", "cache hit"
    );
    for m in &report.results {
        println!(
            "{:<20} {:>12.0} {:>10.2} {:>10.2} {:>9.2} {:>10.3}",
            m.name,
            m.ops_per_sec,
            m.p50_us,
            m.p99_us,
            m.rtts_per_op,
            m.extra
                .get("cache_hit_ratio")
                .and_then(Value::as_f64)
                .unwrap_or(0.0)
        );
    }
    println!(
        "(FUSEE cache hit = address-cache hits per lookup; Gengar cache hit = reads served from a server's DRAM copy)"
    );
    if let Some(p) = &args.json {
        report.write_json(p).map_err(CliError::runtime)?;
        eprintln!("wrote {}", p.display());
    }
    Ok(())
}

/// Shows progress until `run_for` has passed since `start`, tells the workers to stop and
/// collects what each counted.
fn finish_workers(
    start: Instant,
    run_for: Duration,
    pb: &indicatif::ProgressBar,
    stop: &AtomicBool,
    workers: Vec<std::thread::ScopedJoinHandle<'_, Result<Tally, CliError>>>,
) -> Result<Vec<Tally>, CliError> {
    while start.elapsed() < run_for {
        std::thread::sleep(Duration::from_millis(200));
        pb.set_position(start.elapsed().as_secs());
    }
    stop.store(true, Ordering::Relaxed);
    workers
        .into_iter()
        .map(|h| {
            h.join()
                .map_err(|_| CliError::runtime("a client thread panicked"))?
        })
        .collect()
}

fn fusee_ycsb_a(args: &DemoArgs, run_for: Duration) -> Result<(Tally, f64), CliError> {
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
    spec.record_count = args.records;
    spec.field_count = 1;
    spec.field_length = 256;
    let workload = Workload::new(spec, 2026).map_err(rt)?;
    let n = args.clients;
    let clients: Vec<_> = (0..n)
        .map(|i| cluster.client(1 + i as u64))
        .collect::<Result<_, _>>()
        .map_err(rt)?;
    // Load.
    let pb = progress(args.records, "FUSEE: loading");
    let keys = workload.load_keys().split(n);
    std::thread::scope(|s| -> Result<(), CliError> {
        let hs: Vec<_> = keys
            .into_iter()
            .zip(&clients)
            .map(|(keys, c)| {
                let pb = pb.clone();
                s.spawn(move || -> Result<(), CliError> {
                    let value = vec![b'x'; 256];
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
    eprintln!(
        "dmkit demo: FUSEE loaded {} records; running YCSB-A for {:?}",
        args.records, run_for
    );
    let pb = progress(run_for.as_secs(), "FUSEE: YCSB-A");
    let stop = AtomicBool::new(false);
    let start = Instant::now();
    let tallies = std::thread::scope(|s| {
        let hs: Vec<_> = workload
            .split(n)
            .into_iter()
            .zip(&clients)
            .map(|(mut w, c)| {
                let stop = &stop;
                s.spawn(move || -> Result<Tally, CliError> {
                    let mut t = Tally::new();
                    let before = c.endpoint().stats().total().round_trips;
                    let cache0 = c.cache_stats();
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
                        let _ = t.hist.record(s0.elapsed().as_nanos() as u64);
                        t.ops += 1;
                    }
                    t.round_trips = c.endpoint().stats().total().round_trips - before;
                    let cache = c.cache_stats();
                    t.hits = cache.hits - cache0.hits;
                    t.lookups = (cache.hits + cache.misses) - (cache0.hits + cache0.misses);
                    Ok(t)
                })
            })
            .collect();
        finish_workers(start, run_for, &pb, &stop, hs)
    })?;
    pb.finish_and_clear();
    let secs = start.elapsed().as_secs_f64();
    let mut total = Tally::new();
    for t in &tallies {
        total.merge(t);
    }
    for c in &clients {
        c.flush().map_err(rt)?;
    }
    Ok((total, secs))
}

fn gengar_hot_reads(args: &DemoArgs, run_for: Duration) -> Result<(Tally, f64), CliError> {
    let clock: Arc<dyn Clock> = Arc::new(SystemClock::new());
    let sim = SimCluster::new(SimConfig::default());
    let mut servers = Vec::new();
    let mut tcp = Vec::new();
    for id in 0..2u16 {
        let nvm =
            Pool::create_dram(64 << 20, PoolOptions::default().block_size(64 << 10)).map_err(rt)?;
        let s = GengarServer::new(
            NodeId(id),
            nvm,
            ServerConfig {
                dram_bytes: 4 << 20,
                ..ServerConfig::default()
            },
            clock.clone(),
        )
        .map_err(rt)?;
        if args.backend == Backend::Tcp {
            tcp.push(
                TcpServer::start("127.0.0.1:0", s.node().clone(), TcpServerConfig::default())
                    .map_err(rt)?,
            );
        } else {
            sim.add_node(s.node().clone());
        }
        servers.push(s);
    }
    let endpoint = |id: u64| -> Result<Endpoint, CliError> {
        if tcp.is_empty() {
            sim.endpoint(id).map_err(rt)
        } else {
            let nodes: Vec<_> = tcp
                .iter()
                .map(|t| (t.node().id(), t.local_addr().to_string()))
                .collect();
            Endpoint::connect(&TcpConnector::default(), &nodes).map_err(rt)
        }
    };
    let windows: Vec<_> = servers
        .iter()
        .map(|s| s.spawn_windows(Duration::from_millis(100)))
        .collect();
    let n = args.clients;
    let clients: Vec<_> = (0..n)
        .map(|i| {
            GengarClient::new(
                endpoint(100 + i as u64)?,
                100 + i as u64,
                GengarClientConfig {
                    report_every: 512,
                    ..GengarClientConfig::default()
                },
                clock.clone(),
            )
            .map_err(rt)
        })
        .collect::<Result<_, _>>()?;
    let objects: Vec<_> = (0..4096)
        .map(|i| {
            let a = clients[0].alloc(1024).map_err(rt)?;
            clients[0].write(a, 0, &[i as u8; 1024]).map_err(rt)?;
            Ok(a)
        })
        .collect::<Result<_, CliError>>()?;
    eprintln!(
        "dmkit demo: Gengar holds {} objects on 2 servers; running hot reads for {:?}",
        objects.len(),
        run_for
    );
    let pb = progress(run_for.as_secs(), "Gengar: hot reads");
    let stop = AtomicBool::new(false);
    let start = Instant::now();
    let objects = &objects;
    let tallies = std::thread::scope(|s| {
        let hs: Vec<_> = clients
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let stop = &stop;
                s.spawn(move || -> Result<Tally, CliError> {
                    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(i as u64);
                    let mut zipf = ScrambledZipfian::new(0, objects.len() as i64 - 1, 0.99);
                    let mut t = Tally::new();
                    let before = c.endpoint().stats().tag(gtags::READ).round_trips
                        + c.endpoint().stats().tag(gtags::WRITE).round_trips;
                    let mut k = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        let a = objects[zipf.next(&mut rng) as usize];
                        let s0 = Instant::now();
                        k += 1;
                        if k % 10 == 0 {
                            c.write_proxied(a, 0, &[k as u8; 64]).map_err(rt)?;
                        } else {
                            c.read(a).map_err(rt)?;
                            t.lookups += 1;
                            t.hits += u64::from(c.cached_in_dram(a));
                        }
                        let _ = t.hist.record(s0.elapsed().as_nanos() as u64);
                        t.ops += 1;
                    }
                    c.flush().map_err(rt)?;
                    t.round_trips = c.endpoint().stats().tag(gtags::READ).round_trips
                        + c.endpoint().stats().tag(gtags::WRITE).round_trips
                        - before;
                    Ok(t)
                })
            })
            .collect();
        finish_workers(start, run_for, &pb, &stop, hs)
    })?;
    pb.finish_and_clear();
    let secs = start.elapsed().as_secs_f64();
    drop(windows);
    let mut total = Tally::new();
    for t in &tallies {
        total.merge(t);
    }
    Ok((total, secs))
}
