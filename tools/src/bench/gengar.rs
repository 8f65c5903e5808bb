//! `dmkit bench gengar [--app micro]`: the micro-benchmark (see [`micro`](self::run_micro)):
//! DRAM hit share against an oracle, modeled read latency and throughput with and without the
//! DRAM cache, and the writer's wait per proxied against synchronous write.
//!
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
    /// Backend of the apps: sim (modeled time) or tcp (measured wall time). The micro-benchmark
    /// always models its read side on sim and measures its write side on tcp.
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
    match args.app.unwrap_or(App::Micro) {
        App::Micro => Vec::new(),
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
    if args.app.is_none_or(|a| a == App::Micro) {
        return run_micro(&args);
    }
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

/// The micro-benchmark: the read mix on sim (modeled time) with the plain pool (no DRAM cache,
/// synchronous writes) and Gengar (DRAM cache, proxied writes) in the same run, then the write
/// wait on tcp (measured).
fn run_micro(args: &GengarArgs) -> Result<(), CliError> {
    use dmkit_tools::gengar_apps::micro::{self, MicroConfig};
    if args.backend == Backend::Rdma {
        return Err(CliError::usage(
            "bench gengar runs in one process on sim or tcp",
        ));
    }
    if args.workers == 0 {
        return Err(CliError::usage("--workers must be at least 1"));
    }
    let capacity = micro::dram_capacity_objects(MICRO_DRAM, MICRO_OBJECT).map_err(rt)?;
    let cfg = MicroConfig {
        objects: 10 * usize::from(SERVERS) * MICRO_DRAM / MICRO_OBJECT,
        object_size: MICRO_OBJECT,
        clients: args.workers,
        accesses: if args.quick { 150_000 } else { 500_000 },
        ..MicroConfig::default()
    };
    let writes = if args.quick { 6_000 } else { 30_000 };
    let mut report = Report::new("gengar");
    report.config("app", "micro");
    // The micro-benchmark always models the read side on sim and measures the write side
    // on tcp; --backend selects nothing here.
    report.config(
        "backend",
        "sim (read side, modeled) + tcp (write side, measured)",
    );
    report.config("quick", args.quick);
    report.config("servers", u64::from(SERVERS));
    report.config("clients", args.workers as u64);
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
        "modeled (sim latency model, virtual time: network and media, no CPU)",
    );
    report.config(
        "write_side_time",
        "measured (wall time, tcp over loopback, one writer appending records to a log object in bursts of 300 writes, flushed between bursts): the mean time until the call returns",
    );
    report.config("write_bytes", MICRO_WRITE as u64);
    report.config("writes_per_mode", writes as u64);

    let traces = micro::trace(&cfg);
    let pb = progress(3, "Gengar micro");
    let nvm_bytes = (cfg.objects * 1024 / usize::from(SERVERS) + (16 << 20)).next_power_of_two();
    let deployment = |cache: bool| DeploymentConfig {
        servers: SERVERS,
        nvm_bytes,
        server: ServerConfig {
            dram_bytes: if cache { MICRO_DRAM } else { 0 },
            ..ServerConfig::default()
        },
        ..DeploymentConfig::default()
    };
    let mut reads = Vec::new();
    for (name, cache, mode) in [
        ("plain", false, WriteMode::Sync),
        ("gengar", true, WriteMode::Proxied),
    ] {
        let d = Deployment::sim(&deployment(cache), true).map_err(rt)?;
        let objs = micro::load(&d, &cfg).map_err(rt)?;
        let out = micro::run_read_mix(&d, &objs, &traces, mode, &cfg)
            .map_err(|e| CliError::runtime(format!("read mix ({name}): {e}")))?;
        let oracle = micro::oracle_share(&traces, cfg.warmup, &objs, capacity);
        pb.inc(1);
        reads.push((name, cache, out, oracle));
    }
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
        extra.insert(
            "read_mean_us".into(),
            Value::from(round3(hist_mean_us(&out.read_latency))),
        );
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
        report.results.push(Measurement {
            name: format!("micro-read/{name}"),
            ops_per_sec: out.ops() as f64 / out.modeled.as_secs_f64().max(1e-12),
            p50_us: out.read_latency.value_at_quantile(0.5) as f64 / 1000.0,
            p99_us: out.read_latency.value_at_quantile(0.99) as f64 / 1000.0,
            rtts_per_op: out.round_trips as f64 / out.ops().max(1) as f64,
            modeled: true,
            extra,
        });
    }
    let (plain, gengar) = (&reads[0].2, &reads[1].2);
    report.ratio(
        "gengar_dram_hit_ratio_vs_oracle",
        gengar.dram_share() / reads[1].3.max(1e-12),
        Some(">= 0.85"),
    );
    report.ratio(
        "gengar_modeled_read_latency_vs_plain",
        gengar.read_latency.mean() / plain.read_latency.mean().max(1e-12),
        None,
    );
    let tput = |o: &micro::ReadMixOutcome| o.ops() as f64 / o.modeled.as_secs_f64().max(1e-12);
    report.ratio(
        "gengar_modeled_throughput_vs_plain",
        tput(gengar) / tput(plain).max(1e-12),
        None,
    );

    // The write side, measured over tcp.
    let d = Deployment::tcp(&DeploymentConfig {
        servers: SERVERS,
        nvm_bytes: 16 << 20,
        server: ServerConfig {
            dram_bytes: MICRO_DRAM,
            ..ServerConfig::default()
        },
        ..DeploymentConfig::default()
    })
    .map_err(rt)?;
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
    pb.finish_and_clear();
    print_micro(&report);
    if let Some(p) = &args.json {
        report.write_json(p).map_err(CliError::runtime)?;
    }
    Ok(())
}

fn print_micro(r: &Report) {
    println!(
        "gengar micro bench — read side modeled (sim latency model), write side measured (tcp)"
    );
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
