//! `dmkit`: run memory nodes, benchmarks and (as the project grows) the demo cluster, the
//! FUSEE master, the KV CLI and the Redis-protocol gateway.

mod bench;
mod cluster_file;
mod connect;
mod demo;
mod gengar_cmd;
mod gengar_server;
mod kv;
mod master;
mod memnode;
mod metrics_http;
mod resp_cmd;
mod size;
mod ycsb_cmd;

use std::fmt;
use std::process::ExitCode;

/// mimalloc: the gateway, memory nodes and clients allocate small buffers and futures on many
/// threads at once, where glibc's allocator spent about a sixth of the gateway's CPU.
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

use clap::{Parser, Subcommand, ValueEnum};

/// Disaggregated-memory toolkit: memory nodes, benchmarks and tools.
#[derive(Debug, Parser)]
#[command(name = "dmkit", version, about, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// The main job: a whole in-process cluster, a FUSEE and a Gengar workload, a summary.
    Demo(demo::DemoArgs),
    /// Serve memory to clients (a memory node).
    Memnode(memnode::MemnodeArgs),
    /// Serve a Gengar server: an NVM pool file and a DRAM buffer for hot objects, over tcp or rdma.
    GengarServer(gengar_server::GengarServerArgs),
    /// Initialise the cluster (format on first start) and serve its membership.
    Master(master::MasterArgs),
    /// One FUSEE operation: put KEY VALUE, get KEY, del KEY.
    Kv(kv::KvArgs),
    /// One Gengar operation on the servers of a cluster file: alloc, write, read, free, stat.
    Gengar(gengar_cmd::GengarArgs),
    /// A Redis-protocol (RESP2) gateway to FUSEE.
    Resp(resp_cmd::RespArgs),
    /// One FUSEE client process running a YCSB workload (load, run, summary, ack log).
    Ycsb(ycsb_cmd::YcsbArgs),
    /// Run a benchmark; each prints a table and, with --json, writes a report.
    #[command(subcommand)]
    Bench(BenchCmd),
}

#[derive(Debug, Subcommand)]
enum BenchCmd {
    /// One-sided verbs: READ/WRITE/CAS latency and batched throughput vs. a baseline.
    Verbs(bench::verbs::VerbsArgs),
    /// pmem-pool's object allocator: allocations/s beside single 64-byte persists and malloc.
    Pool(bench::pool::PoolArgs),
    /// The RACE index alone: SEARCH/UPDATE/INSERT with 1-8 tasks in flight vs. a DashMap.
    Index(bench::index::IndexArgs),
    /// FUSEE under YCSB-A: throughput against the number of clients (1, 2, 4).
    Fusee(bench::fusee::FuseeArgs),
    /// The RESP gateway against a real redis-server, both under redis-benchmark.
    Resp(bench::resp::RespBenchArgs),
    /// A cluster of processes beside a CPU hog: false fences, master exits, gateway silence,
    /// client errors, lost writes, idle CPU and restart times.
    Soak(bench::soak::SoakArgs),
    /// Gengar on real workloads (kv, wordcount, pagerank): plain pool vs DRAM cache vs proxied writes.
    Gengar(bench::gengar::GengarArgs),
    /// Every quick bench; writes the reports, plots and BENCHMARKS.md under --docs DIR.
    All(bench::all::AllArgs),
}

/// A verbs backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Backend {
    Sim,
    Tcp,
    Rdma,
}

impl Backend {
    /// Whether this build can serve `what` (e.g. "a memory node") over this backend: tcp,
    /// and rdma when built with the `rdma` feature; a usage error naming the way out if not.
    pub fn check_serves(self, what: &str) -> Result<(), CliError> {
        match self {
            Backend::Tcp => Ok(()),
            #[cfg(feature = "rdma")]
            Backend::Rdma => Ok(()),
            b => Err(CliError::usage(format!(
                "backend '{b}' cannot serve {what} from this build (use --backend tcp{})",
                if b == Backend::Rdma {
                    ", or build dmkit with --features rdma"
                } else {
                    ""
                }
            ))),
        }
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Backend::Sim => "sim",
            Backend::Tcp => "tcp",
            Backend::Rdma => "rdma",
        })
    }
}

/// A failure the command reports in one line. Usage errors (bad flags, bad files, a busy
/// address) exit 2; failures while running exit 1.
#[derive(Debug)]
pub struct CliError {
    msg: String,
    code: u8,
}

impl CliError {
    pub fn usage(msg: impl Into<String>) -> Self {
        Self {
            msg: msg.into(),
            code: 2,
        }
    }

    pub fn runtime(msg: impl Into<String>) -> Self {
        Self {
            msg: msg.into(),
            code: 1,
        }
    }

    /// A failure with a specific exit status.
    pub fn with_code(msg: impl Into<String>, code: u8) -> Self {
        Self {
            msg: msg.into(),
            code,
        }
    }

    pub fn message(&self) -> String {
        self.msg.clone()
    }
}

/// Says `msg` on stderr if the step it describes is still running after a second (so quick
/// steps stay quiet and slow ones never look hung); dropping the guard ends the step and,
/// if the line was printed, reports how long it took.
#[derive(Debug)]
pub struct Progress {
    done: Option<std::sync::mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Progress {
    pub fn start(msg: impl Into<String>) -> Progress {
        let msg = msg.into();
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("progress".into())
            .spawn(move || {
                let t0 = std::time::Instant::now();
                if rx.recv_timeout(std::time::Duration::from_secs(1)).is_ok() {
                    return;
                }
                eprintln!("dmkit: {msg} ...");
                while let Err(std::sync::mpsc::RecvTimeoutError::Timeout) =
                    rx.recv_timeout(std::time::Duration::from_secs(5))
                {
                    eprintln!("dmkit: {msg}: still running ({} s)", t0.elapsed().as_secs());
                }
                eprintln!("dmkit: {msg}: done in {:.1} s", t0.elapsed().as_secs_f64());
            })
            .ok();
        Progress {
            done: Some(tx),
            thread,
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        if let Some(tx) = self.done.take() {
            let _ = tx.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn main() -> ExitCode {
    // Daemons say what they do (a failover, a refill and its progress, a claim) at INFO; a
    // command says only what needs a look.
    let daemon = matches!(
        std::env::args().nth(1).as_deref(),
        Some("master" | "memnode" | "gengar-server")
    );
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("DMKIT_LOG").unwrap_or_else(|_| {
                tracing_subscriber::EnvFilter::new(if daemon { "info" } else { "warn" })
            }),
        )
        .with_writer(std::io::stderr)
        // Colour only for a person at a terminal: a log file or journal gets plain text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            use clap::error::ErrorKind;
            if matches!(
                e.kind(),
                ErrorKind::DisplayHelp
                    | ErrorKind::DisplayVersion
                    | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
            ) {
                e.exit();
            }
            // One line, as scripts expect; `--help` has the rest.
            let text = e.to_string();
            let mut lines = text.lines().map(str::trim).filter(|l| !l.is_empty());
            let mut first = lines.next().unwrap_or("invalid arguments").to_string();
            // "the following required arguments were not provided:" names them below.
            if first.ends_with(':') {
                if let Some(next) = lines.next() {
                    first = format!("{first} {next}");
                }
            }
            eprintln!("dmkit: {first} (see --help)");
            return ExitCode::from(2);
        }
    };
    let r = match cli.cmd {
        Cmd::Demo(a) => demo::run(a),
        Cmd::Memnode(a) => memnode::run(a),
        Cmd::GengarServer(a) => gengar_server::run(a),
        Cmd::Master(a) => master::run(a),
        Cmd::Kv(a) => kv::run(a),
        Cmd::Gengar(a) => gengar_cmd::run(a),
        Cmd::Resp(a) => resp_cmd::run(a),
        Cmd::Ycsb(a) => ycsb_cmd::run(a),
        Cmd::Bench(BenchCmd::Verbs(a)) => bench::verbs::run(a),
        Cmd::Bench(BenchCmd::Pool(a)) => bench::pool::run(a),
        Cmd::Bench(BenchCmd::Index(a)) => bench::index::run(a),
        Cmd::Bench(BenchCmd::Fusee(a)) => bench::fusee::run(a),
        Cmd::Bench(BenchCmd::Resp(a)) => bench::resp::run(a),
        Cmd::Bench(BenchCmd::Gengar(a)) => bench::gengar::run(a),
        Cmd::Bench(BenchCmd::Soak(a)) => bench::soak::run(a),
        Cmd::Bench(BenchCmd::All(a)) => bench::all::run(a),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("dmkit: error: {}", e.msg.replace('\n', " "));
            ExitCode::from(e.code)
        }
    }
}
