//! `dmkit bench gengar [--app micro]`: the micro-benchmark (see [`micro`](self::run_micro)):
//! DRAM hit share against an oracle, modeled read latency and throughput with and without the
//! DRAM cache, and the writer's wait per proxied against synchronous write.
//!
//! `dmkit bench gengar --app kv|wordcount|pagerank`: each app (from
//! `dmkit_workloads::gengar_apps`) in four configurations in one run — the plain pool (no DRAM
//! cache, synchronous writes), + DRAM cache (GengarD), + proxied writes (GengarR) and both
//! (Gengar) — with each configuration's time and its ratio to the plain pool. On `sim` the time
//! is modeled (the latency model's virtual time: network and media, no CPU); on `tcp` it is
//! measured wall time over loopback; on `rdma` (a dmkit built with `--features rdma`) it is
//! measured wall time on the first active RDMA device, the servers in this process behind
//! `RdmaServer`s and every client connected through rdma-cm. Every run checks its result
//! against a single-process computation and fails on a mismatch.
//!
//! On rdma both benches also run perftest (`ib_read_lat`) on the same device in the same run:
//! its READ round trip is the floor each line is set beside (`..._vs_perftest`,
//! `..._vs_rtt_floor`), and the micro-benchmark measures its read side there too (wall time)
//! and checks, by the round-trip accounting, that hot reads (a valid lease on a DRAM copy)
//! take one round trip.

use std::time::Duration;

use dmkit_gengar::ServerConfig;
use dmkit_workloads::gengar_apps::{
    Deployment, DeploymentConfig, Outcome, WriteMode, kv, pagerank, scaled_leases, wordcount,
};
use serde_json::{Map, Value};

use super::{Measurement, Report, progress};
use crate::{Backend, CliError};

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum App {
    /// The micro-benchmark (the default): hot reads against an oracle, write wait.
    Micro,
    Kv,
    Wordcount,
    Pagerank,
}

#[derive(Debug, clap::Args)]
pub struct GengarArgs {
    /// The workload (default: the micro-benchmark).
    #[arg(long, value_enum)]
    pub app: Option<App>,
    /// Backend: sim (modeled time), tcp (measured wall time; the micro-benchmark models its
    /// read side on sim and measures its write side on tcp) or rdma (everything measured on
    /// the RDMA device, with perftest beside it).
    #[arg(long, value_enum, default_value_t = Backend::Sim)]
    pub backend: Backend,
    /// A short run (under a minute on two cores).
    #[arg(long)]
    pub quick: bool,
    /// Write the JSON report here.
    #[arg(long)]
    pub json: Option<std::path::PathBuf>,
    /// Worker clients (threads).
    #[arg(long, default_value_t = 4)]
    pub workers: usize,
}

/// The four configurations: (name, DRAM cache, write mode).
const CONFIGS: [(&str, bool, WriteMode); 4] = [
    ("plain", false, WriteMode::Sync),
    ("dram", true, WriteMode::Sync),
    ("proxied", false, WriteMode::Proxied),
    ("dram+proxied", true, WriteMode::Proxied),
];

/// On rdma, lease durations are this many times Gengar's defaults (see
/// [`scaled_leases`]): an emulated device's round trips are some hundred times a NIC's.
const RDMA_LEASE_SCALE: u32 = 20;

/// The servers' settings on `backend` (leases scaled on rdma).
fn server_cfg(backend: Backend, cfg: ServerConfig) -> ServerConfig {
    if backend == Backend::Rdma {
        scaled_leases(cfg, RDMA_LEASE_SCALE)
    } else {
        cfg
    }
}

/// DRAM buffer per server in the cache configurations.
const DRAM_BYTES: usize = 4 << 20;
const SERVERS: u16 = 2;

fn rt(e: impl std::fmt::Display) -> CliError {
    CliError::runtime(e.to_string())
}

/// Runs a job on a deployment with this many workers and this write mode.
type RunJob = Box<dyn Fn(&Deployment, usize, WriteMode) -> Result<Outcome, CliError>>;

/// One job of the app (a YCSB workload for kv).
struct Job {
    label: String,
    /// Phase-name prefix of the timed part, and of the setup part reported beside it.
    timed: &'static str,
    setup: &'static str,
    nvm_bytes: usize,
    run: RunJob,
}

/// How large the apps run on a backend: sim, tcp or rdma (an emulated RDMA device moves
/// some tens of MB/s: its runs are the smallest).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Scale {
    Sim,
    Tcp,
    Rdma,
}

fn jobs(args: &GengarArgs) -> Vec<Job> {
    let quick = args.quick;
    let scale = match args.backend {
        Backend::Sim => Scale::Sim,
        Backend::Tcp => Scale::Tcp,
        Backend::Rdma => Scale::Rdma,
    };
    let per_server = |bytes: usize| (bytes / SERVERS as usize + (32 << 20)).next_power_of_two();
    match args.app.unwrap_or(App::Micro) {
        App::Micro => Vec::new(),
        App::Kv => {
            let (records, operations) = match (quick, scale) {
                (true, Scale::Sim) => (20_000, 40_000),
                (true, Scale::Tcp) => (10_000, 20_000),
                (true, Scale::Rdma) => (100, 200),
                (false, Scale::Sim) => (100_000, 400_000),
                (false, Scale::Tcp) => (50_000, 100_000),
                (false, Scale::Rdma) => (10_000, 20_000),
            };
            // A quick run on rdma runs YCSB-A only (an emulated device's lock RPCs take
            // milliseconds: CI time).
            let workloads: &[char] = if quick && scale == Scale::Rdma {
                &['a']
            } else {
                &['a', 'b']
            };
            workloads
                .iter()
                .copied()
                .map(|workload| {
                    let cfg = kv::KvConfig {
                        workload,
                        records,
                        operations,
                        ..kv::KvConfig::default()
                    };
                    Job {
                        label: format!("kv-ycsb-{workload}"),
                        timed: "run",
                        setup: "load",
                        nvm_bytes: per_server(records as usize * 2048 * 3 / 2),
                        run: Box::new(move |d, w, m| kv::run(d, w, m, &cfg).map_err(rt)),
                    }
                })
                .collect()
        }
        App::Wordcount => {
            let records = match (quick, scale) {
                (true, Scale::Sim) => 100_000,
                (true, Scale::Tcp) => 50_000,
                (true, Scale::Rdma) => 1_500,
                (false, Scale::Sim) => 500_000,
                (false, Scale::Tcp) => 200_000,
                (false, Scale::Rdma) => 50_000,
            };
            let cfg = wordcount::WordCountConfig {
                records,
                ..wordcount::WordCountConfig::default()
            };
            vec![Job {
                label: "wordcount".into(),
                timed: "job",
                setup: "generate",
                nvm_bytes: per_server(records * wordcount::RECORD * 2),
                run: Box::new(move |d, w, m| wordcount::run(d, w, m, &cfg).map_err(rt)),
            }]
        }
        App::Pagerank => {
            let cfg = pagerank::PageRankConfig {
                scale: match (quick, scale) {
                    (true, Scale::Rdma) => 10,
                    (false, Scale::Rdma) => 14,
                    (true, _) => 16,
                    (false, _) => 18,
                },
                iterations: if scale == Scale::Rdma { 5 } else { 10 },
                ..pagerank::PageRankConfig::default()
            };
            let g = std::sync::Arc::new(pagerank::rmat(cfg.scale, cfg.edge_factor, cfg.seed));
            let bytes = g.edges() * 4 + g.vertices * 48;
            vec![Job {
                label: "pagerank".into(),
                timed: "iterate",
                setup: "load",
                nvm_bytes: per_server(bytes * 3 / 2),
                run: Box::new(move |d, w, m| pagerank::run_on(d, &g, w, m, &cfg).map_err(rt)),
            }]
        }
    }
}

pub fn run(args: GengarArgs) -> Result<(), CliError> {
    if args.app.is_none_or(|a| a == App::Micro) {
        return run_micro(&args);
    }
    let modeled = args.backend == Backend::Sim;
    if args.workers == 0 {
        return Err(CliError::usage("--workers must be at least 1"));
    }
    check_backend(args.backend)?;
    // On rdma: the device's READ round trip, from perftest in this run.
    let floor = perftest_floor(args.backend, &[64])?;
    let app = format!("{:?}", args.app.unwrap_or(App::Micro)).to_lowercase();
    let mut report = Report::new("gengar");
    report.config("app", app.clone());
    report.config("backend", args.backend.to_string());
    report.config("quick", args.quick);
    report.config("workers", args.workers as u64);
    report.config("servers", u64::from(SERVERS));
    report.config("dram_bytes_per_server", DRAM_BYTES as u64);
    report.config(
        "time",
        match args.backend {
            Backend::Sim => "modeled (sim latency model, virtual time: network and media, no CPU)",
            Backend::Tcp => "measured (wall time, tcp over loopback, one process)",
            Backend::Rdma => {
                "measured (wall time, rdma on the device, servers and clients in one process)"
            }
        },
    );
    if let Some(f) = &floor {
        f.configure(&mut report);
        report.config("lease_scale", u64::from(RDMA_LEASE_SCALE));
    }
    let jobs = jobs(&args);
    let pb = progress((jobs.len() * CONFIGS.len()) as u64, "Gengar apps");
    for job in &jobs {
        let mut plain: Option<(Duration, Duration)> = None;
        for (name, cache, mode) in CONFIGS {
            let cfg = DeploymentConfig {
                servers: SERVERS,
                nvm_bytes: job.nvm_bytes,
                server: server_cfg(
                    args.backend,
                    ServerConfig {
                        dram_bytes: if cache { DRAM_BYTES } else { 0 },
                        min_hot_count: 1,
                        ..ServerConfig::default()
                    },
                ),
                ..DeploymentConfig::default()
            };
            let d = deploy(args.backend, &cfg)?;
            let out = (job.run)(&d, args.workers, mode).map_err(|e| {
                CliError::runtime(format!("{} ({name}): {}", job.label, e.message()))
            })?;
            let pick = |(m, w): (Duration, Duration)| if modeled { m } else { w };
            let timed = pick(out.time(job.timed));
            let setup = pick(out.time(job.setup));
            let (base_t, base_s) = *plain.get_or_insert((timed, setup));
            let ratio = timed.as_secs_f64() / base_t.as_secs_f64().max(1e-12);
            let setup_ratio = setup.as_secs_f64() / base_s.as_secs_f64().max(1e-12);
            let mut extra = Map::new();
            extra.insert("dram_cache".into(), Value::from(cache));
            extra.insert(
                "writes".into(),
                Value::from(if mode == WriteMode::Proxied {
                    "proxied"
                } else {
                    "sync"
                }),
            );
            extra.insert("time_s".into(), Value::from(timed.as_secs_f64()));
            extra.insert("vs_plain".into(), Value::from(round3(ratio)));
            extra.insert(
                format!("{}_time_s", job.setup),
                Value::from(setup.as_secs_f64()),
            );
            extra.insert(
                format!("{}_vs_plain", job.setup),
                Value::from(round3(setup_ratio)),
            );
            let mut phases = Map::new();
            for p in &out.phases {
                phases.insert(
                    p.name.clone(),
                    serde_json::json!({
                        "modeled_s": p.modeled.as_secs_f64(),
                        "wall_s": p.wall.as_secs_f64(),
                    }),
                );
            }
            extra.insert("phases".into(), Value::Object(phases));
            extra.insert("promotions".into(), Value::from(d.promotions()));
            extra.insert("checked".into(), Value::from(true));
            if let Some(f) = &floor {
                // The round trips one worker made, each at perftest's READ round trip: what
                // the device alone would take for them.
                let per_worker = out.round_trips as f64 / args.workers as f64;
                let floor_s = per_worker * f.read_us(64) / 1e6;
                extra.insert("rtt_floor_s".into(), Value::from(floor_s));
                extra.insert(
                    "vs_rtt_floor".into(),
                    Value::from(round3(timed.as_secs_f64() / floor_s.max(1e-12))),
                );
            }
            for (k, v) in &out.notes {
                extra.insert(k.clone(), Value::from(v.clone()));
            }
            report.results.push(Measurement {
                name: format!("{}/{name}", job.label),
                ops_per_sec: out.ops as f64 / timed.as_secs_f64().max(1e-12),
                p50_us: 0.0,
                p99_us: 0.0,
                rtts_per_op: out.round_trips as f64 / out.ops.max(1) as f64,
                modeled,
                extra,
            });
            if name != "plain" {
                report.ratio(&format!("{}/{name}_time_vs_plain", job.label), ratio, None);
                report.ratio(
                    &format!("{}/{name}_{}_time_vs_plain", job.label, job.setup),
                    setup_ratio,
                    None,
                );
            }
            pb.inc(1);
        }
    }
    pb.finish_and_clear();
    print_table(&report, args.backend);
    if let Some(p) = &args.json {
        report.write_json(p).map_err(CliError::runtime)?;
    }
    Ok(())
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

fn print_table(r: &Report, backend: Backend) {
    let kind = match backend {
        Backend::Sim => "modeled (sim latency model)",
        Backend::Tcp => "measured (tcp, wall time)",
        Backend::Rdma => "measured (rdma on the device, wall time)",
    };
    println!("gengar bench — times {kind}; every configuration's result checked");
    println!(
        "{:<28} {:>12} {:>9} {:>12} {:>9} {:>9} {:>11}",
        "app/config", "time ms", "vs plain", "setup ms", "vs plain", "RTTs/op", "promotions"
    );
    for m in &r.results {
        let f = |k: &str| m.extra.get(k).and_then(Value::as_f64).unwrap_or(0.0);
        let setup_key = m
            .extra
            .keys()
            .find(|k| k.ends_with("_time_s") && k.as_str() != "time_s")
            .cloned()
            .unwrap_or_default();
        let setup_vs = setup_key.replace("_time_s", "_vs_plain");
        println!(
            "{:<28} {:>12.3} {:>9.3} {:>12.3} {:>9.3} {:>9.2} {:>11}",
            m.name,
            f("time_s") * 1e3,
            f("vs_plain"),
            f(&setup_key) * 1e3,
            f(&setup_vs),
            m.rtts_per_op,
            f("promotions") as u64,
        );
    }
    println!("(time = the timed part: kv run phase, wordcount map+reduce, pagerank iterations;");
    println!(" setup = kv load, wordcount TeraGen, pagerank graph load; vs plain < 1 is faster)");
    if backend == Backend::Rdma {
        let us = r
            .config
            .get("perftest_ib_read_lat_us")
            .and_then(Value::as_object)
            .and_then(|m| m.get("64"))
            .and_then(Value::as_f64)
            .unwrap_or(f64::NAN);
        println!("perftest on the same device, same run: ib_read_lat 64 B = {us:.1} us");
        for m in &r.results {
            if let Some(v) = m.extra.get("vs_rtt_floor").and_then(Value::as_f64) {
                println!(
                    "  {:<28} time vs its round trips at perftest's READ round trip: {v:.2}",
                    m.name
                );
            }
        }
    }
}

/// Refuses a backend this build cannot run.
fn check_backend(b: Backend) -> Result<(), CliError> {
    if b == Backend::Rdma && !cfg!(feature = "rdma") {
        return Err(CliError::usage(
            "this build has no rdma backend (build dmkit with --features rdma)",
        ));
    }
    Ok(())
}

/// Gengar servers in this process on `backend`.
fn deploy(backend: Backend, cfg: &DeploymentConfig) -> Result<Deployment, CliError> {
    match backend {
        Backend::Sim => Deployment::sim(cfg, true).map_err(rt),
        Backend::Tcp => Deployment::tcp(cfg).map_err(rt),
        #[cfg(feature = "rdma")]
        Backend::Rdma => Deployment::rdma(cfg).map_err(rt),
        #[cfg(not(feature = "rdma"))]
        Backend::Rdma => Err(CliError::usage(
            "this build has no rdma backend (build dmkit with --features rdma)",
        )),
    }
}

/// perftest's READ round trip on the device the rdma deployments use, per message size (µs,
/// `ib_read_lat`'s typical latency), measured in this run.
struct Floor {
    device: String,
    read_us: Vec<(usize, f64)>,
}

impl Floor {
    fn read_us(&self, size: usize) -> f64 {
        self.read_us
            .iter()
            .find(|(s, _)| *s == size)
            .map_or(f64::NAN, |(_, u)| *u)
    }

    fn configure(&self, report: &mut Report) {
        report.config("perftest_device", self.device.clone());
        let m: Map<String, Value> = self
            .read_us
            .iter()
            .map(|(s, u)| (s.to_string(), Value::from(round3(*u))))
            .collect();
        report.config("perftest_ib_read_lat_us", Value::Object(m));
    }
}

/// On rdma, runs `ib_read_lat` for each size on the first active device; `None` elsewhere.
fn perftest_floor(backend: Backend, sizes: &[usize]) -> Result<Option<Floor>, CliError> {
    if backend != Backend::Rdma {
        return Ok(None);
    }
    #[cfg(feature = "rdma")]
    {
        use super::perftest::{Target, run_pair, typical_latency_us};
        use dmkit_verbs::rdma::{RdmaConfig, first_active_device};
        let cfg = RdmaConfig::from_env().map_err(|e| CliError::usage(e.to_string()))?;
        let info = first_active_device().map_err(rt)?;
        let t = Target {
            device: cfg.device.clone().unwrap_or(info.device.clone()),
            port: cfg.port,
            gid_index: cfg.gid_index.unwrap_or(info.gid_index),
            ip: info.ipv4.to_string(),
        };
        let mut read_us = Vec::new();
        for &size in sizes {
            let a: Vec<String> = ["-s", &size.to_string(), "-n", "1000"]
                .iter()
                .map(|x| x.to_string())
                .collect();
            let out = run_pair("ib_read_lat", &t, &a, 18525)
                .map_err(|e| CliError::runtime(format!("perftest floor: {e}")))?;
            let us = typical_latency_us(&out, size).ok_or_else(|| {
                CliError::runtime(format!("unreadable ib_read_lat report: {out}"))
            })?;
            read_us.push((size, us));
        }
        Ok(Some(Floor {
            device: t.device,
            read_us,
        }))
    }
    #[cfg(not(feature = "rdma"))]
    {
        let _ = sizes;
        check_backend(backend).map(|()| None)
    }
}

/// DRAM buffer per server in the micro-benchmark (the servers' minimum).
const MICRO_DRAM: usize = 1 << 20;
/// Objects fill 1 KiB slots exactly (8-byte header).
const MICRO_OBJECT: usize = 1016;
/// Bytes per proxied/synchronous write of the write side.
const MICRO_WRITE: usize = 256;
/// Writes per back-to-back burst of the write side (75 KiB).
const MICRO_BURST: usize = 300;

fn hist_mean_us(h: &hdrhistogram::Histogram<u64>) -> f64 {
    h.mean() / 1000.0
}

/// Objects of the rdma micro-benchmark fill 8 KiB slots (fewer objects for the same DRAM
/// share: loading them over an emulated device stays short).
const MICRO_OBJECT_RDMA: usize = (8 << 10) - 8;
/// Accesses between two hot-object reports of a client on rdma (its traces are short).
const MICRO_REPORT_EVERY_RDMA: u64 = 64;
/// Hot-object windows on rdma are this many times the default (50 ms): an emulated device
/// serves some hundred accesses a second, and a window must see enough of them to rank the
/// objects (the leases are scaled likewise, [`RDMA_LEASE_SCALE`]).
const MICRO_WINDOW_SCALE_RDMA: u32 = 10;
/// Clients of the rdma micro-benchmark at most: an emulated guest has two vCPUs, and clients
/// polling for their completions starve the servers' threads.
const MICRO_CLIENTS_RDMA: usize = 2;

/// The micro-benchmark: the read mix with the plain pool (no DRAM cache, synchronous writes)
/// and Gengar (DRAM cache, proxied writes) in the same run, then the writer's wait per
/// proxied and synchronous write. On sim and tcp the read side is modeled on sim and the
/// write side measured on tcp; on rdma both are measured (wall time) on the device, with
/// perftest's READ round trip beside them.
fn run_micro(args: &GengarArgs) -> Result<(), CliError> {
    use dmkit_workloads::gengar_apps::micro::{self, MicroConfig};
    check_backend(args.backend)?;
    if args.workers == 0 {
        return Err(CliError::usage("--workers must be at least 1"));
    }
    let rdma = args.backend == Backend::Rdma;
    let object = if rdma {
        MICRO_OBJECT_RDMA
    } else {
        MICRO_OBJECT
    };
    let capacity = micro::dram_capacity_objects(MICRO_DRAM, object).map_err(rt)?;
    let defaults = MicroConfig::default();
    let cfg = MicroConfig {
        objects: 10 * usize::from(SERVERS) * MICRO_DRAM / object,
        object_size: object,
        clients: if rdma {
            args.workers.min(MICRO_CLIENTS_RDMA)
        } else {
            args.workers
        },
        window: if rdma {
            defaults.window * MICRO_WINDOW_SCALE_RDMA
        } else {
            defaults.window
        },
        accesses: match (rdma, args.quick) {
            (false, true) => 150_000,
            (false, false) => 500_000,
            (true, true) => 4_000,
            (true, false) => 12_000,
        },
        ..defaults
    };
    let writes = match (rdma, args.quick) {
        (false, true) => 6_000,
        (false, false) => 30_000,
        (true, true) => 600,
        (true, false) => 6_000,
    };
    // The floors: a hot read (header and object in one round trip) and a write's round trip.
    let floor = perftest_floor(args.backend, &[object + 8, MICRO_WRITE])?;
    let mut report = Report::new("gengar");
    report.config("app", "micro");
    report.config(
        "backend",
        if rdma {
            "rdma (read and write sides measured on the device)"
        } else {
            // The micro-benchmark models the read side on sim and measures the write side on
            // tcp; --backend sim|tcp selects nothing here.
            "sim (read side, modeled) + tcp (write side, measured)"
        },
    );
    report.config("quick", args.quick);
    report.config("servers", u64::from(SERVERS));
    report.config("clients", cfg.clients as u64);
    report.config("dram_bytes_per_server", MICRO_DRAM as u64);
    report.config("dram_capacity_objects_per_server", capacity as u64);
    report.config("objects", cfg.objects as u64);
    report.config("object_bytes", cfg.object_size as u64);
    report.config("accesses_per_client", cfg.accesses as u64);
    report.config(
        "read_mix",
        format!(
            "zipfian {} over the objects, {}% reads",
            cfg.theta,
            100.0 - cfg.write_fraction * 100.0
        ),
    );
    report.config("warmup_share", cfg.warmup);
    report.config("window_ms", cfg.window.as_millis() as u64);
    report.config(
        "hit_share",
        "reads served from a DRAM copy over the steady part (after the warm-up share of each client's trace), server windows running during the trace",
    );
    report.config(
        "oracle",
        "per server, the DRAM capacity in objects filled with that server's most-read objects by exact counts of the same measured trace part",
    );
    report.config(
        "read_side_time",
        if rdma {
            "measured (wall time of each read on the rdma device)"
        } else {
            "modeled (sim latency model, virtual time: network and media, no CPU)"
        },
    );
    report.config(
        "write_side_time",
        format!(
            "measured (wall time, {}, one writer appending records to a log object in bursts of 300 writes, flushed between bursts): the mean time until the call returns",
            if rdma {
                "rdma on the device"
            } else {
                "tcp over loopback"
            }
        ),
    );
    report.config("write_bytes", MICRO_WRITE as u64);
    report.config("writes_per_mode", writes as u64);
    if let Some(f) = &floor {
        f.configure(&mut report);
        report.config("lease_scale", u64::from(RDMA_LEASE_SCALE));
        report.config(
            "hot_reads",
            "reads of an object whose lease (valid when the read began) points at a DRAM copy; their round trips counted by the READ tag, lease RPCs included",
        );
    }

    let traces = micro::trace(&cfg);
    let pb = progress(3, "Gengar micro");
    let nvm_bytes =
        (cfg.objects * (object + 8) / usize::from(SERVERS) + (16 << 20)).next_power_of_two();
    let deployment = |cache: bool| DeploymentConfig {
        servers: SERVERS,
        nvm_bytes,
        server: server_cfg(
            args.backend,
            ServerConfig {
                dram_bytes: if cache { MICRO_DRAM } else { 0 },
                ..ServerConfig::default()
            },
        ),
        client: dmkit_gengar::ClientConfig {
            report_every: if rdma {
                MICRO_REPORT_EVERY_RDMA
            } else {
                dmkit_gengar::ClientConfig::default().report_every
            },
            ..dmkit_gengar::ClientConfig::default()
        },
    };
    let read_backend = if rdma { Backend::Rdma } else { Backend::Sim };
    let mut reads = Vec::new();
    // A quick run on rdma leaves the plain pool's read mix out (it only gives the informative
    // latency and throughput ratios against it; the targets need Gengar's run alone).
    let plain_too = !(rdma && args.quick);
    if !plain_too {
        report.config("plain_read_mix", "skipped (--quick on rdma)");
    }
    for (name, cache, mode) in [
        ("plain", false, WriteMode::Sync),
        ("gengar", true, WriteMode::Proxied),
    ] {
        if name == "plain" && !plain_too {
            continue;
        }
        let d = deploy(read_backend, &deployment(cache))?;
        let objs = micro::load(&d, &cfg).map_err(rt)?;
        let out = micro::run_read_mix(&d, &objs, &traces, mode, &cfg)
            .map_err(|e| CliError::runtime(format!("read mix ({name}): {e}")))?;
        let oracle = micro::oracle_share(&traces, cfg.warmup, &objs, capacity);
        pb.inc(1);
        reads.push((name, cache, out, oracle));
    }
    // The read latency: modeled on sim, wall time on rdma.
    let lat = |o: &micro::ReadMixOutcome| {
        if rdma {
            o.read_wall.clone()
        } else {
            o.read_latency.clone()
        }
    };
    let elapsed = |o: &micro::ReadMixOutcome| if rdma { o.wall } else { o.modeled };
    for (name, cache, out, oracle) in &reads {
        let mut extra = Map::new();
        extra.insert("dram_cache".into(), Value::from(*cache));
        extra.insert(
            "writes".into(),
            Value::from(if *cache { "proxied" } else { "sync" }),
        );
        extra.insert(
            "dram_read_share".into(),
            Value::from(round3(out.dram_share())),
        );
        extra.insert(
            "oracle_dram_read_share".into(),
            Value::from(round3(*oracle)),
        );
        let l = lat(out);
        extra.insert("read_mean_us".into(), Value::from(round3(hist_mean_us(&l))));
        extra.insert(
            "op_mean_us".into(),
            Value::from(round3(hist_mean_us(&out.op_latency))),
        );
        extra.insert("measured_reads".into(), Value::from(out.reads));
        extra.insert("measured_writes".into(), Value::from(out.writes));
        extra.insert("modeled_s".into(), Value::from(out.modeled.as_secs_f64()));
        extra.insert("wall_s".into(), Value::from(out.wall.as_secs_f64()));
        extra.insert("windows".into(), Value::from(out.windows));
        extra.insert("promotions".into(), Value::from(out.promotions));
        extra.insert("evictions".into(), Value::from(out.evictions));
        extra.insert("hot_reads".into(), Value::from(out.hot_reads));
        extra.insert(
            "hot_read_rtts_per_read".into(),
            Value::from(round3(
                out.hot_read_rtts as f64 / out.hot_reads.max(1) as f64,
            )),
        );
        if rdma {
            extra.insert(
                "hot_read_p50_us".into(),
                Value::from(round3(
                    out.hot_read_wall.value_at_quantile(0.5) as f64 / 1000.0,
                )),
            );
        }
        report.results.push(Measurement {
            name: format!("micro-read/{name}"),
            ops_per_sec: out.ops() as f64 / elapsed(out).as_secs_f64().max(1e-12),
            p50_us: l.value_at_quantile(0.5) as f64 / 1000.0,
            p99_us: l.value_at_quantile(0.99) as f64 / 1000.0,
            rtts_per_op: out.round_trips as f64 / out.ops().max(1) as f64,
            modeled: !rdma,
            extra,
        });
    }
    let (gengar, oracle) = {
        let g = reads.last().expect("Gengar's read mix ran");
        (&g.2, g.3)
    };
    report.ratio(
        "gengar_dram_hit_ratio_vs_oracle",
        gengar.dram_share() / oracle.max(1e-12),
        Some(">= 0.85"),
    );
    if let [(_, _, plain, _), _] = reads.as_slice() {
        let kind = if rdma { "rdma" } else { "modeled" };
        report.ratio(
            &format!("gengar_{kind}_read_latency_vs_plain"),
            lat(gengar).mean() / lat(plain).mean().max(1e-12),
            None,
        );
        let tput = |o: &micro::ReadMixOutcome| o.ops() as f64 / elapsed(o).as_secs_f64().max(1e-12);
        report.ratio(
            &format!("gengar_{kind}_throughput_vs_plain"),
            tput(gengar) / tput(plain).max(1e-12),
            None,
        );
    }
    if gengar.hot_reads > 0 {
        report.ratio(
            "gengar_hot_read_rtts_per_read",
            gengar.hot_read_rtts as f64 / gengar.hot_reads as f64,
            Some("== 1"),
        );
        report.ratio(
            "gengar_hot_reads_one_rtt_share",
            gengar.hot_reads_one_rtt as f64 / gengar.hot_reads as f64,
            None,
        );
    }
    if let Some(f) = &floor {
        report.ratio(
            "gengar_rdma_hot_read_p50_vs_perftest",
            gengar.hot_read_wall.value_at_quantile(0.5) as f64 / 1000.0 / f.read_us(object + 8),
            None,
        );
    }

    // The write side, measured (tcp over loopback, or rdma on the device).
    let write_backend = if rdma { Backend::Rdma } else { Backend::Tcp };
    let d = deploy(
        write_backend,
        &DeploymentConfig {
            servers: SERVERS,
            nvm_bytes: 16 << 20,
            server: server_cfg(
                args.backend,
                ServerConfig {
                    dram_bytes: MICRO_DRAM,
                    ..ServerConfig::default()
                },
            ),
            ..DeploymentConfig::default()
        },
    )?;
    let w = micro::write_wait(&d, writes, MICRO_WRITE, MICRO_BURST).map_err(rt)?;
    pb.inc(1);
    for (name, h, rtts, how) in [
        ("sync", &w.sync, w.sync_rtts, "write, back to back"),
        (
            "proxied",
            &w.proxied,
            w.proxied_rtts,
            "write_proxied, bursts of 300 back to back (flush after each, not counted)",
        ),
    ] {
        let mut extra = Map::new();
        extra.insert("wait_mean_us".into(), Value::from(round3(hist_mean_us(h))));
        extra.insert("writer".into(), Value::from(how));
        report.results.push(Measurement {
            name: format!("micro-write/{name}"),
            ops_per_sec: 1e9 / h.mean().max(1e-12),
            p50_us: h.value_at_quantile(0.5) as f64 / 1000.0,
            p99_us: h.value_at_quantile(0.99) as f64 / 1000.0,
            rtts_per_op: rtts,
            modeled: false,
            extra,
        });
    }
    report.ratio(
        "gengar_proxied_write_wait_vs_sync",
        w.proxied.mean() / w.sync.mean().max(1e-12),
        Some("<= 0.2"),
    );
    report.ratio(
        "gengar_proxied_write_wait_p50_vs_sync",
        w.proxied.value_at_quantile(0.5) as f64 / (w.sync.value_at_quantile(0.5) as f64).max(1.0),
        None,
    );
    if let Some(f) = &floor {
        report.ratio(
            "gengar_rdma_sync_write_p50_vs_perftest",
            w.sync.value_at_quantile(0.5) as f64 / 1000.0 / f.read_us(MICRO_WRITE),
            None,
        );
    }
    pb.finish_and_clear();
    print_micro(&report);
    if let Some(p) = &args.json {
        report.write_json(p).map_err(CliError::runtime)?;
    }
    Ok(())
}

fn print_micro(r: &Report) {
    let rdma = r
        .config
        .get("backend")
        .and_then(Value::as_str)
        .is_some_and(|b| b.starts_with("rdma"));
    if rdma {
        println!("gengar micro bench — read and write sides measured on the rdma device");
    } else {
        println!(
            "gengar micro bench — read side modeled (sim latency model), write side measured (tcp)"
        );
    }
    println!(
        "{:<22} {:>12} {:>10} {:>10} {:>10} {:>9} {:>9}",
        "name", "ops/s", "mean us", "p50 us", "p99 us", "DRAM", "oracle"
    );
    for m in &r.results {
        let f = |k: &str| m.extra.get(k).and_then(Value::as_f64);
        let share = |k: &str| {
            f(k).map(|v| format!("{:.3}", v))
                .unwrap_or_else(|| "-".into())
        };
        println!(
            "{:<22} {:>12.0} {:>10.3} {:>10.3} {:>10.3} {:>9} {:>9}{}",
            m.name,
            m.ops_per_sec,
            f("read_mean_us").or(f("wait_mean_us")).unwrap_or(0.0),
            m.p50_us,
            m.p99_us,
            share("dram_read_share"),
            share("oracle_dram_read_share"),
            if m.modeled {
                "  (modeled)"
            } else {
                "  (measured)"
            }
        );
    }
    if let Some(us) = r.config.get("perftest_ib_read_lat_us") {
        println!("perftest on the same device, same run: ib_read_lat typical us by size {us}");
    }
    println!("ratios (same run):");
    let targets = r.config.get("targets").and_then(Value::as_object);
    for (k, v) in &r.ratios {
        let t = targets
            .and_then(|t| t.get(k))
            .and_then(Value::as_str)
            .map(|t| format!("   target {t}"))
            .unwrap_or_default();
        println!("  {k:<44} {v}{t}");
    }
    println!(
        "(micro-read: mean/p50/p99 are read latency; ops/s all accesses over the modeled makespan;"
    );
    println!(
        " DRAM = share of the steady-part reads served from DRAM; micro-write: the writer's wait per call)"
    );
}
