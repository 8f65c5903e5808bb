//! `dmkit bench all --docs DIR`: runs every quick bench that needs no special hardware
//! (verbs on sim and tcp, the pool's object allocator, the RACE index on sim and tcp, FUSEE
//! throughput against clients, the RESP gateway against Redis),
//! writes their JSON reports and SVG plots under `DIR/results/` and renders
//! `DIR/BENCHMARKS.md` from them, with the RDMA figures recorded in `DIR/results/` (by the
//! SoftRoCE tier, see docs/RDMA.md) when present.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::{Backend, CliError};

#[derive(Debug, clap::Args)]
pub struct AllArgs {
    /// The docs directory: writes BENCHMARKS.md there and the reports and plots under
    /// results/.
    #[arg(long)]
    pub docs: PathBuf,
    /// Leave out the RESP bench (it needs redis-server and redis-benchmark).
    #[arg(long)]
    pub skip_resp: bool,
    /// Run nothing: render BENCHMARKS.md again from the reports already under results/.
    #[arg(long)]
    pub render_only: bool,
}

/// The command that regenerates the page (named in it).
const REGENERATE: &str = "scripts/bench-docs.sh";

pub fn run(args: AllArgs) -> Result<(), CliError> {
    let results = args.docs.join("results");
    std::fs::create_dir_all(&results)
        .map_err(|e| CliError::usage(format!("cannot create {}: {e}", results.display())))?;
    let out = |name: &str| results.join(name);
    if args.render_only {
        // The reports were measured where the page says, not necessarily here.
        let measured_on = recorded_machine(&args.docs).unwrap_or_else(machine);
        return write_page(&args.docs, &measured_on);
    }
    // Each bench runs in a process of its own, as `dmkit bench <name>` run alone would: a
    // bench inherits nothing from the ones before it (the I/O runtime and its size, threads
    // and tasks left by earlier clusters, the allocator's state).
    let p = |name: &str| out(name).display().to_string();
    for backend in [Backend::Sim, Backend::Tcp] {
        eprintln!("dmkit bench all: verbs on {backend}");
        let b = backend.to_string();
        let json = p(&format!("verbs-{b}-quick.json"));
        let plot = p(&format!("verbs-{b}-quick-latency.svg"));
        bench(&[
            "verbs",
            "--backend",
            &b,
            "--quick",
            "--json",
            &json,
            "--plot",
            &plot,
        ])?;
    }
    eprintln!("dmkit bench all: pool (a pool file in the temporary directory)");
    let json = p("pool-quick.json");
    bench(&["pool", "--medium", "file", "--quick", "--json", &json])?;
    for backend in [Backend::Sim, Backend::Tcp] {
        eprintln!("dmkit bench all: index on {backend}");
        let b = backend.to_string();
        let json = p(&format!("index-{b}-quick.json"));
        bench(&[
            "index",
            "--backend",
            &b,
            "--quick",
            "--json",
            &json,
            "--tasks",
            "1,2,4,8",
            "--replicas",
            "3",
        ])?;
    }
    // `dmkit bench fusee --quick --json FILE [--plot FILE] ARGS…`
    let fusee = |json: &str, plot: Option<&str>, rest: &str| {
        let (json, plot) = (p(json), plot.map(p));
        let mut a = vec!["fusee", "--quick", "--json", &json];
        if let Some(plot) = &plot {
            a.extend(["--plot", plot]);
        }
        a.extend(rest.split_whitespace());
        bench(&a)
    };
    eprintln!("dmkit bench all: fusee on sim");
    let plot = Some("fusee-sim-quick.svg");
    fusee(
        "fusee-sim-quick.json",
        plot,
        "--backend sim --clients 1,2,4 --workload a",
    )?;
    eprintln!("dmkit bench all: fusee on tcp, one client with 1 and 32 operations in flight");
    let inflight = "--backend tcp --clients 1 --workload c --inflight 1,32";
    fusee("fusee-tcp-inflight-quick.json", None, inflight)?;
    eprintln!("dmkit bench all: fusee modeled latencies (sim latency model)");
    let micro = "--clients 1 --workload micro";
    fusee(
        "fusee-micro-quick.json",
        None,
        &format!("--backend sim {micro}"),
    )?;
    eprintln!("dmkit bench all: fusee measured latencies on tcp, beside their rounds replayed");
    let tcp = format!("--backend tcp {micro} --breakdown");
    fusee("fusee-micro-tcp-quick.json", None, &tcp)?;
    if !args.skip_resp {
        eprintln!("dmkit bench all: resp gateway vs redis-server");
        let (json, plot) = (p("resp-quick.json"), p("resp-quick-latency.svg"));
        bench(&[
            "resp",
            "--backend",
            "tcp",
            "--quick",
            "--json",
            &json,
            "--plot",
            &plot,
            "--connections",
            "50",
        ])?;
    }
    write_page(&args.docs, &machine())
}

/// Runs `dmkit bench ARGS…` (this executable) in a child process; its output goes where
/// ours goes.
fn bench(args: &[&str]) -> Result<(), CliError> {
    let exe = std::env::current_exe()
        .map_err(|e| CliError::runtime(format!("cannot find the dmkit executable: {e}")))?;
    let status = std::process::Command::new(&exe)
        .arg("bench")
        .args(args)
        .status()
        .map_err(|e| CliError::runtime(format!("cannot run {}: {e}", exe.display())))?;
    if status.success() {
        Ok(())
    } else {
        Err(CliError::runtime(format!(
            "dmkit bench {} failed ({status})",
            args.join(" ")
        )))
    }
}

fn write_page(docs: &Path, measured_on: &str) -> Result<(), CliError> {
    let page = render(docs, measured_on)?;
    let md = docs.join("BENCHMARKS.md");
    std::fs::write(&md, page)
        .map_err(|e| CliError::runtime(format!("cannot write {}: {e}", md.display())))?;
    eprintln!("wrote {}", md.display());
    Ok(())
}

fn load(path: &Path) -> Option<Value> {
    let s = std::fs::read_to_string(path).ok()?;
    serde_json::from_str(&s).ok()
}

fn num(v: Option<&Value>, digits: usize) -> String {
    match v.and_then(Value::as_f64) {
        Some(x) if x.is_finite() => format!("{x:.digits$}"),
        _ => "–".to_string(),
    }
}

/// A ratio as the report rounded it: three decimals, more for a small one (trailing zeros
/// beyond the third dropped, so a ratio stored as 0.02 does not claim to be 0.0200).
fn ratio_cell(v: &Value) -> String {
    let Some(x) = v.as_f64().filter(|x| x.is_finite()) else {
        return "–".to_string();
    };
    let digits = super::ratio_decimals(x);
    let mut s = format!("{x:.digits$}");
    while digits > 3 && s.ends_with('0') && s.len() > s.find('.').map_or(0, |d| d + 4) {
        s.pop();
    }
    s
}

/// A Markdown table of a report's results and its ratios.
fn table(report: &Value) -> String {
    let mut s = String::new();
    s.push_str("| measurement | ops/s | p50 µs | p99 µs | RTTs/op |\n");
    s.push_str("|---|---:|---:|---:|---:|\n");
    for m in report["results"].as_array().into_iter().flatten() {
        let modeled = if m["modeled"].as_bool() == Some(true) {
            " (modeled)"
        } else {
            ""
        };
        let _ = writeln!(
            s,
            "| `{}`{} | {} | {} | {} | {} |",
            m["name"].as_str().unwrap_or("?"),
            modeled,
            num(m.get("ops_per_sec"), 0),
            num(m.get("p50_us"), 2),
            num(m.get("p99_us"), 2),
            num(m.get("rtts_per_op"), 3),
        );
    }
    if let Some(r) = report["ratios"].as_object().filter(|r| !r.is_empty()) {
        let targets = report["config"]["targets"].as_object();
        s.push_str("\n| ratio (same run) | value | target |\n|---|---:|---|\n");
        for (k, v) in r {
            let t = targets
                .and_then(|t| t.get(k))
                .and_then(Value::as_str)
                .unwrap_or("");
            let _ = writeln!(s, "| `{k}` | {} | {t} |", ratio_cell(v));
        }
    }
    s
}

fn config_line(report: &Value, keys: &[&str]) -> String {
    let c = &report["config"];
    keys.iter()
        .filter_map(|k| {
            let v = c.get(*k)?;
            let v = match v {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            Some(format!("{k} = {v}"))
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// The "Measured on" of the page already in `docs`, if there is one.
fn recorded_machine(docs: &Path) -> Option<String> {
    let page = std::fs::read_to_string(docs.join("BENCHMARKS.md")).ok()?;
    let line = page.lines().find_map(|l| l.strip_prefix("Measured on: "))?;
    let (m, _) = line.split_once(". These are quick runs")?;
    Some(m.to_string())
}

/// This machine and today, for a report or the page: date, CPU, hardware threads, version.
pub fn machine() -> String {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, m)| m.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let date = std::process::Command::new("date")
        .args(["-u", "+%Y-%m-%d"])
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .filter(|d| !d.is_empty())
        .unwrap_or_else(|| "unknown date".into());
    format!(
        "{date}, {cpu}, {threads} hardware threads, `dmkit` {}",
        env!("CARGO_PKG_VERSION")
    )
}

fn section(
    md: &mut String,
    docs: &Path,
    json: &str,
    text: &str,
    plots: &[(&str, &str)],
    keys: &[&str],
) {
    md.push_str(text);
    md.push('\n');
    match load(&docs.join("results").join(json)) {
        Some(r) => {
            let _ = writeln!(
                md,
                "Report: [`results/{json}`](results/{json}) ({}).\n",
                config_line(&r, keys)
            );
            md.push_str(&table(&r));
            md.push('\n');
        }
        None => {
            let _ = writeln!(
                md,
                "_Not measured in this run (`results/{json}` is missing)._\n"
            );
        }
    }
    for (file, alt) in plots {
        if docs.join("results").join(file).exists() {
            let _ = writeln!(md, "![{alt}](results/{file})\n");
        }
    }
}

/// BENCHMARKS.md from the reports under `docs/results/`.
pub fn render(docs: &Path, measured_on: &str) -> Result<String, CliError> {
    let mut md = String::new();
    let _ = write!(
        md,
        "# Benchmarks\n\n\
         Current figures of the `dmkit bench` suite. **Generated** by `{REGENERATE}` (which runs \
         `dmkit bench all --docs docs`): do not edit by hand, run it again.\n\n\
         ```sh\n{REGENERATE}            # about 2.5 minutes on 2 cores; needs redis-server and redis-tools for the RESP part\n```\n\n\
         Measured on: {}. These are quick runs (`--quick`) on a small shared machine: read the \
         **ratios**, which compare ours with a baseline measured in the same run, rather than \
         the absolute numbers. Every bench writes its JSON report with `--json PATH` (format in \
         DESIGN.md) and draws its plots with `--plot PATH` (`.svg` or `.png`).\n\n\
         Latency figures are wall-clock time of each operation (one outstanding) on this machine; \
         the only modeled figures are in \"FUSEE: modeled one-client latency\" (the `sim` backend's \
         latency model, virtual time), each labelled modeled; everywhere else `sim` runs without \
         its latency model.\n\n",
        measured_on
    );

    md.push_str("## Verbs\n\n");
    section(
        &mut md,
        docs,
        "verbs-sim-quick.json",
        "### sim\n\n`dmkit bench verbs --backend sim --quick`: the in-process backend against a direct \
         `memcpy`/atomic of the same size (the cost of the verbs layer's bookkeeping).\n",
        &[("verbs-sim-quick-latency.svg", "verbs latency CDF on sim")],
        &["backend", "latency_ops", "batches", "batch"],
    );
    section(
        &mut md,
        docs,
        "verbs-tcp-quick.json",
        "### tcp\n\n`dmkit bench verbs --backend tcp --quick`: the soft NIC over loopback TCP against \
         a plain TCP echo of the same payload (the floor of any request-response protocol over TCP).\n",
        &[("verbs-tcp-quick-latency.svg", "verbs latency CDF on tcp")],
        &["backend", "latency_ops", "batches", "batch"],
    );
    md.push_str(
        "### rdma\n\nThe RDMA backend against `perftest` on the same device, recorded on SoftRoCE \
         (emulated RDMA in a QEMU guest; see [RDMA.md](RDMA.md) for how, and for what these figures \
         do and do not say). Not regenerated by the command above: it needs the SoftRoCE tier.\n\n",
    );
    match load(&docs.join("results/verbs-rdma-quick.json")) {
        Some(r) => {
            let _ = writeln!(
                md,
                "Report: [`results/verbs-rdma-quick.json`](results/verbs-rdma-quick.json) ({}).\n",
                config_line(&r, &["device", "latency_ops", "batches", "batch"])
            );
            md.push_str(&table(&r));
            md.push('\n');
        }
        None => md.push_str("_No recorded RDMA report._\n\n"),
    }

    md.push_str("## pmem-pool: the object allocator against a persist and malloc\n\n");
    section(
        &mut md,
        docs,
        "pool-quick.json",
        "`dmkit bench pool --quick`: one thread on a pool file (`--medium file`, what `dmkit \
         memnode --pool` serves: mapped, persisted with `msync`) in the temporary directory. \
         `alloc_free_<n>` is `Pool::alloc_object` of n payload bytes and `Pool::free_object` of \
         it, one operation per pair; each half stores the slot's header word and persists it \
         before returning, so a pair costs **two** persists. `persist64` is one 64-byte write \
         to the pool's data area and `Pool::persist` of it (the pool's own persist path; every \
         one writes back a freshly dirtied page). `malloc_free_<n>` is `Vec::with_capacity(n)` \
         and its drop through `dmkit`'s global allocator (mimalloc). `persist64` and the \
         allocations take turns one operation at a time, each timed on its own, so that a \
         persist waiting behind other disk traffic weighs on both sides alike; each rate is \
         operations over their own time. `object_alloc_vs_persist` is `alloc_free_64` over \
         `persist64` (ceiling about 0.5: two persists against one), `object_alloc_vs_malloc` \
         the same over `malloc_free_64`. On a file system without a write-back cost (tmpfs, \
         `--medium dram`) persist costs next to nothing and the first ratio says little; \
         `--dir DIR` puts the pool file on the file system to measure.\n",
        &[],
        &[
            "medium",
            "medium_kind",
            "file_system",
            "seconds_per_measurement",
            "rounds",
            "machine",
        ],
    );

    md.push_str("## kv-index: the RACE index on its own, against a DashMap\n\n");
    for (file, label) in [
        ("index-sim-quick.json", "sim"),
        ("index-tcp-quick.json", "tcp"),
    ] {
        let text = format!(
            "### {label}\n\n`dmkit bench index --backend {label} --quick`: the RACE index with 3 \
             replicas (SNAPSHOT), each on its own in-process memory node ({}), and one client: \
             one endpoint, one `RaceIndex` handle, n = 1, 2, 4, 8 async operation loops on one \
             thread (FUSEE's coroutines, sharing doorbells). Each key is a 64-byte object in \
             remote memory that the verifier reads when a fingerprint matches. `search_*` reads \
             loaded keys at random, `update_*` swaps each of a task's own keys between two \
             objects that hold it, `insert_*` files new keys (the index grows by splits). \
             `RTTs/op` counts every round trip: the JSON splits it into the index's own \
             (`index_rtts_per_op`: 1 per SEARCH, 3 per UPDATE and INSERT at r = 3, the crate's \
             contract), the key reads (`verifier_rtts_per_op`) and splits. `dashmap_get` is \
             `DashMap<Vec<u8>, u64>::get` of the first SEARCH row's key sequence on one thread; \
             `index_search_vs_dashmap` is one SEARCH loop's ops/s over it, \
             `index_<op>_8_vs_1_tasks` the gain from operations in flight{}.\n",
            if label == "sim" {
                "the `sim` backend without its latency model: the code path's wall-clock time"
            } else {
                "serving over loopback TCP"
            },
            if label == "sim" {
                " (none on sim, whose verbs complete as they are posted: more loops only add \
                 polling)"
            } else {
                ""
            }
        );
        section(
            &mut md,
            docs,
            file,
            &text,
            &[],
            &[
                "backend",
                "index_replicas",
                "keys_loaded",
                "ops_per_point",
                "subtables_at_end",
                "machine",
            ],
        );
    }

    md.push_str("## FUSEE: YCSB against clients, and against a DashMap\n\n");
    section(
        &mut md,
        docs,
        "fusee-sim-quick.json",
        "`dmkit bench fusee --backend sim --quick --plot ...` (`--workload a`, the default): YCSB-A \
         (50% reads, 50% updates, scrambled zipfian keys with θ = 0.99, 1000-byte values, so about \
         1 KiB KV pairs) on an in-process cluster of 3 memory nodes with 3 index and 3 data \
         replicas, one thread per client. The baseline `dashmap_*` rows replay the same operation \
         stream (same seed, same split, the same number of operations per thread as FUSEE \
         completed, generated before the clock starts) against an in-process \
         `DashMap<Vec<u8>, Vec<u8>>` holding the same records. Ratios: \
         `fusee_ycsb_c_vs_dashmap` is FUSEE's ops/s over the dashmap's on YCSB-C (read-only) with \
         one client against one map thread — the cost of disaggregation (round trips through the \
         verbs layer, 3 replicas) against a local hash map; `fusee_ycsb_a_vs_dashmap` the same on \
         YCSB-A; `fusee_ycsb_a_<n>_vs_1_clients` is FUSEE's own scaling (the client counts run again in 5 \
         interleaved rounds; the median of the rounds' ratios, listed in the report's config). On a 2-core machine the \
         client threads share two cores, so scaling flattens beyond 2 clients. `--workload b|c|d` \
         runs the other YCSB mixes the same way.\n",
        &[
            ("fusee-sim-quick.svg", "FUSEE YCSB-A throughput vs clients"),
            ("fusee-sim-quick-latency.svg", "FUSEE YCSB-A latency CDF"),
        ],
        &[
            "backend",
            "records",
            "value_bytes",
            "seconds_per_point",
            "threads_available",
        ],
    );

    md.push_str("## FUSEE: operations in flight on one client\n\n");
    section(
        &mut md,
        docs,
        "fusee-tcp-inflight-quick.json",
        "`dmkit bench fusee --backend tcp --workload c --clients 1 --inflight 1,32 --quick`: \
         YCSB-C on 3 memory nodes serving over loopback TCP (3 index and 3 data replicas), first \
         with one blocking client thread (`ycsb_c_1_clients`), then with **one client and one \
         thread running 1 and 32 async operation loops at once** (`..._inflight<n>`: FUSEE's \
         coroutines; `dmkit_verbs::block_on` over `join_all`, whose polls share doorbells: the \
         verbs the loops post in one poll go to each memory node in one frame). \
         `fusee_ycsb_c_inflight32_vs_1` is the in-flight scaling of one client.\n",
        &[],
        &[
            "backend",
            "records",
            "value_bytes",
            "seconds_per_point",
            "inflight",
        ],
    );

    md.push_str("## FUSEE: modeled one-client latency against the paper\n\n");
    md.push_str(
        "`dmkit bench fusee --workload micro --quick`: **modeled, not measured.** One client on an \
         in-process cluster (3 memory nodes, 3 index and 3 data replicas, DRAM pools, 1000-byte \
         values) whose `sim` backend has its latency model on (2 µs round trip, 56 Gbit/s link, \
         DRAM media: FUSEE's testbed). Each operation runs alone and is timed in virtual time \
         (`Endpoint::virtual_now()` before and after); the client's background task shares that \
         clock, so the bench first waits for the previous operation's background work \
         (`Client::flush`). `ops/s` of these rows is one client's modeled rate (1 / mean \
         latency). The FUSEE paper's one-client figures (FAST 2023, on real RDMA NICs) beside \
         them:\n\n",
    );
    match load(&docs.join("results/fusee-micro-quick.json")) {
        Some(r) => {
            md.push_str(
                "Report: [`results/fusee-micro-quick.json`](results/fusee-micro-quick.json).\n\n",
            );
            md.push_str("| operation (modeled) | p50 µs | p99 µs | mean µs | RTTs/op | paper µs | p50 / paper |\n");
            md.push_str("|---|---:|---:|---:|---:|---:|---:|\n");
            for m in r["results"].as_array().into_iter().flatten() {
                let _ = writeln!(
                    md,
                    "| `{}` — {} | {} | {} | {} | {} | {} | {} |",
                    m["name"].as_str().unwrap_or("?"),
                    m["what"].as_str().unwrap_or(""),
                    num(m.get("p50_us"), 2),
                    num(m.get("p99_us"), 2),
                    num(m.get("mean_us"), 2),
                    num(m.get("rtts_per_op"), 2),
                    num(m.get("paper_us"), 0),
                    num(m.get("p50_vs_paper"), 2),
                );
            }
            md.push('\n');
        }
        None => md.push_str(
            "_Not measured in this run (`results/fusee-micro-quick.json` is missing)._\n\n",
        ),
    }

    md.push_str("## FUSEE: measured one-client latency beside its own round trips\n\n");
    md.push_str(
        "`dmkit bench fusee --workload micro --backend tcp|rdma --quick`: **measured**, wall-clock \
         time. One client, one operation at a time, on memory nodes in the same process behind \
         real connections (tcp on loopback; rdma on the SoftRoCE device, inside the guest), with \
         r = 1 (one memory node) and r = 3 (three). Right after each operation its own rounds of \
         verbs (recorded by `dmkit_verbs::record`: the same nodes, verbs and lengths) are replayed \
         on scratch memory — on rdma straight on queue pairs, on tcp through the verbs layer — and \
         `vs rounds` is the operation's p50 over that replay's p50: what the software above the \
         round trips costs. `RTTs` are the critical-path round trips (the contract in \
         `dmkit-fusee`'s crate docs), `bg` the background ones (cleanup). The replays have a tail \
         of their own (the fabric's and the host's; an emulated NIC on a TCG guest stretches it \
         most): `replayed p99/p50` is it, and `p99 vs replayed p99` what our software adds to \
         the tail.\n\n",
    );
    for (file, label) in [
        ("fusee-micro-tcp-quick.json", "tcp, loopback"),
        (
            "fusee-micro-rdma-quick.json",
            "rdma, SoftRoCE (QEMU TCG guest: emulated time)",
        ),
    ] {
        let Some(r) = load(&docs.join("results").join(file)) else {
            let _ = writeln!(
                md,
                "_{label}: not measured in this run (`results/{file}` is missing)._\n"
            );
            continue;
        };
        let _ = writeln!(md, "{label} — report [`results/{file}`](results/{file}):\n");
        md.push_str(
            "| operation | p50 µs | p99 µs | p99/p50 | RTTs | bg | rounds replayed p50 µs \
             | vs rounds | replayed p99/p50 | p99 vs replayed p99 |\n",
        );
        md.push_str("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
        for m in r["results"].as_array().into_iter().flatten() {
            let p50 = m
                .get("p50_us")
                .and_then(serde_json::Value::as_f64)
                .unwrap_or(0.0);
            let raw = m
                .get("raw_rounds_p50_us")
                .and_then(serde_json::Value::as_f64)
                .unwrap_or(0.0);
            let f = |k: &str| m.get(k).and_then(serde_json::Value::as_f64).unwrap_or(0.0);
            let over = |a: f64, b: f64| {
                if b > 0.0 {
                    format!("{:.2}", a / b)
                } else {
                    "–".into()
                }
            };
            let _ = writeln!(
                md,
                "| `{}` | {} | {} | {} | {} | {} | {} | {:.2} | {} | {} |",
                m["name"].as_str().unwrap_or("?"),
                num(m.get("p50_us"), 1),
                num(m.get("p99_us"), 1),
                num(m.get("p99_vs_p50"), 2),
                num(m.get("rtts_per_op"), 2),
                num(m.get("background_rtts_per_op"), 2),
                num(m.get("raw_rounds_p50_us"), 1),
                if raw > 0.0 { p50 / raw } else { 0.0 },
                over(f("raw_rounds_p99_us"), raw),
                over(f("p99_us"), f("raw_rounds_p99_us")),
            );
        }
        md.push('\n');
    }

    md.push_str("## RESP gateway against Redis\n\n");
    section(
        &mut md,
        docs,
        "resp-quick.json",
        "`dmkit bench resp --quick`: the real `redis-benchmark -t set,get` against a real \
         `redis-server` (no persistence: `--save '' --appendonly no`) and against the gateway in \
         the same run. `gateway_fusee_*`: the gateway over FUSEE on 3 memory nodes with 3 replicas \
         serving over loopback TCP (`LocalCluster::start_tcp`; every SET writes 3 replicas of \
         the object and the index); `gateway_memory_*`: the same gateway over an in-memory map, \
         which isolates the protocol path. `*_p16`: the same with `-P 16` (16 pipelined \
         commands per connection; the gateway runs a pipeline's commands on distinct keys \
         concurrently). `*_r1`: FUSEE with 1 index and 1 data replica. Ratios are requests/s \
         over Redis's in the same run: each pair runs in 5 rounds, Redis and the gateway one \
         after the other in each, and a ratio is the median of the rounds' ratios (the \
         report's config lists the GET and SET rounds), so a change of load on this shared \
         machine falls on both sides. The gateway's connections are tasks on the process's I/O \
         runtime — one worker thread (`--io-threads 1`, the default), as redis-server serves \
         from one; it also runs the memory nodes here — and their commands on keys run as \
         FUSEE's async operations in one dispatcher task, which lets the tasks ready with it run \
         first and then polls them together, sharing doorbells (the verbs of concurrent commands \
         go to each memory node in one frame). `resp_gateway_<op>_cpu_per_op_vs_redis` is the \
         serving side's CPU time per request (ours: the whole process, memory nodes included) \
         over redis-server's: it swings less than requests/s with what else the machine runs. The index starts empty, so the SET runs include its splits. `RTTs/op` counts \
         the client's request-response exchanges; the JSON's `fusee_rtts_per_op` counts the \
         gateway's round trips to the memory nodes per request. The latency curves go through \
         redis-benchmark's reported percentiles (min, p50, p95, p99, max).\n",
        &[(
            "resp-quick-latency.svg",
            "RESP latency CDF: gateway vs redis-server",
        )],
        &[
            "requests_per_test",
            "connections",
            "io_threads",
            "keyspace",
            "value_bytes",
            "redis_server",
        ],
    );
    Ok(md)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ratios_show_what_the_report_kept_and_no_more() {
        let cell = |x: f64| ratio_cell(&Value::from(x));
        assert_eq!(cell(0.502), "0.502");
        assert_eq!(cell(1.12), "1.120");
        assert_eq!(cell(0.02), "0.020");
        assert_eq!(cell(0.001), "0.001");
        assert_eq!(cell(0.0445), "0.0445");
        assert_eq!(cell(0.0000358), "0.0000358");
        assert_eq!(ratio_cell(&Value::Null), "–");
    }

    #[test]
    fn render_only_keeps_the_machine_the_reports_were_measured_on() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(recorded_machine(dir.path()), None);
        let page = render(dir.path(), "2026-12-01, Some CPU, 2 hardware threads").unwrap();
        std::fs::write(dir.path().join("BENCHMARKS.md"), page).unwrap();
        assert_eq!(
            recorded_machine(dir.path()).as_deref(),
            Some("2026-12-01, Some CPU, 2 hardware threads")
        );
    }
}
