//! `dmkit bench gengar --app kv|wordcount|pagerank`: each app (from
//! `dmkit_tools::gengar_apps`) in four configurations in one run — the plain pool (no DRAM
//! cache, synchronous writes), + DRAM cache (GengarD), + proxied writes (GengarR) and both
//! (Gengar) — with each configuration's time and its ratio to the plain pool. On `sim` the time
//! is modeled (the latency model's virtual time: network and media, no CPU); on `tcp` it is
//! measured wall time over loopback. Every run checks its result against a single-process
//! computation and fails on a mismatch.

use std::time::Duration;

use dmkit_gengar::ServerConfig;
use dmkit_tools::gengar_apps::{
    Deployment, DeploymentConfig, Outcome, WriteMode, kv, pagerank, wordcount,
};
use serde_json::{Map, Value};

use super::{Measurement, Report, progress};
use crate::{Backend, CliError};

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum App {
    Kv,
    Wordcount,
    Pagerank,
}

#[derive(Debug, clap::Args)]
pub struct GengarArgs {
    /// The workload.
    #[arg(long, value_enum)]
    pub app: App,
    /// Backend: sim (modeled time) or tcp (measured wall time).
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

fn jobs(args: &GengarArgs) -> Vec<Job> {
    let quick = args.quick;
    let tcp = args.backend != Backend::Sim;
    let per_server = |bytes: usize| (bytes / SERVERS as usize + (32 << 20)).next_power_of_two();
    match args.app {
        App::Kv => {
            let (records, operations) = match (quick, tcp) {
                (true, false) => (20_000, 40_000),
                (true, true) => (10_000, 20_000),
                (false, false) => (100_000, 400_000),
                (false, true) => (50_000, 100_000),
            };
            ['a', 'b']
                .into_iter()
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
            let records = match (quick, tcp) {
                (true, false) => 100_000,
                (true, true) => 50_000,
                (false, false) => 500_000,
                (false, true) => 200_000,
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
                scale: if quick { 16 } else { 18 },
                iterations: 10,
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
    let modeled = match args.backend {
        Backend::Sim => true,
        Backend::Tcp => false,
        Backend::Rdma => {
            return Err(CliError::usage(
                "bench gengar runs in one process on sim or tcp",
            ));
        }
    };
    if args.workers == 0 {
        return Err(CliError::usage("--workers must be at least 1"));
    }
    let app = format!("{:?}", args.app).to_lowercase();
    let mut report = Report::new("gengar");
    report.config("app", app.clone());
    report.config("backend", args.backend.to_string());
    report.config("quick", args.quick);
    report.config("workers", args.workers as u64);
    report.config("servers", u64::from(SERVERS));
    report.config("dram_bytes_per_server", DRAM_BYTES as u64);
    report.config(
        "time",
        if modeled {
            "modeled (sim latency model, virtual time: network and media, no CPU)"
        } else {
            "measured (wall time, tcp over loopback, one process)"
        },
    );
    let jobs = jobs(&args);
    let pb = progress((jobs.len() * CONFIGS.len()) as u64, "Gengar apps");
    for job in &jobs {
        let mut plain: Option<(Duration, Duration)> = None;
        for (name, cache, mode) in CONFIGS {
            let cfg = DeploymentConfig {
                servers: SERVERS,
                nvm_bytes: job.nvm_bytes,
                server: ServerConfig {
                    dram_bytes: if cache { DRAM_BYTES } else { 0 },
                    min_hot_count: 1,
                    ..ServerConfig::default()
                },
                ..DeploymentConfig::default()
            };
            let d = if modeled {
                Deployment::sim(&cfg, true)
            } else {
                Deployment::tcp(&cfg)
            }
            .map_err(rt)?;
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
    print_table(&report, modeled);
    if let Some(p) = &args.json {
        report.write_json(p).map_err(CliError::runtime)?;
    }
    Ok(())
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

fn print_table(r: &Report, modeled: bool) {
    let kind = if modeled {
        "modeled (sim latency model)"
    } else {
        "measured (tcp, wall time)"
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
}
