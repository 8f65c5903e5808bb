//! `dmkit bench pool`: pmem-pool's object allocator on one medium, beside the two things it
//! should be compared with, measured in the same run on one thread:
//!
//! - `alloc_free_<n>`: [`Pool::alloc_object`] of `n` payload bytes then [`Pool::free_object`]
//!   of it (one operation = the pair). Each half is one failure-atomic header store made
//!   durable before it returns, so a pair costs two persists of one word;
//! - `persist64`: one 64-byte write into the pool's data area (through the word-atomic view a
//!   memory node's NIC writes through) and [`Pool::persist`] of it: the pool's own persist path
//!   for one small write, what a durable verbs WRITE costs the memory node;
//! - `malloc_free_<n>`: a heap allocation of `n` bytes and its free (`Vec::with_capacity`, the
//!   process's global allocator: mimalloc in `dmkit`).
//!
//! `object_alloc_vs_persist` is `alloc_free_64` over `persist64` (target ≥ 0.4: with two
//! persists per pair the ceiling is about 0.5, so the allocator's own work is at most a fifth
//! of the pair); `object_alloc_vs_malloc` is `alloc_free_64` over `malloc_free_64`.
//!
//! The operations that wait for the medium take turns one at a time (persist64, then an
//! allocation of each size, then persist64 again ...), each timed on its own, and each rate is
//! its operations over their own time: a persist that waits behind another process's disk
//! traffic then weighs on every side alike (measured in slices instead, the ratio swung
//! between 0.36 and 0.53 on a shared machine; this way it held at 0.50 to 0.52). malloc runs
//! in slices between the rounds. Every persist writes back a freshly dirtied page: msync of a
//! clean page would cost nothing and say nothing.

use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use dmkit_pmem_pool::{Pool, PoolOptions};
use dmkit_verbs::RegionMemory;
use hdrhistogram::Histogram;
use serde_json::Value;

use super::{Measurement, Report, Sample, progress};
use crate::CliError;

#[derive(Debug, clap::Args)]
pub struct PoolArgs {
    /// The pool's medium: `file` (a pool file mapped and persisted with msync, or libpmem where
    /// dmkit-pmem-pool is built with it: what `dmkit memnode --pool` serves) or `dram`
    /// (anonymous memory: persist is a no-op).
    #[arg(long, value_enum, default_value_t = PoolMedium::File)]
    pub medium: PoolMedium,
    /// Where the pool file goes (--medium file): a fresh directory is made in it and removed
    /// afterwards. Point it at the file system a memory node's pool lives on. Default: the
    /// system's temporary directory.
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// A short run (under a minute on two cores).
    #[arg(long)]
    pub quick: bool,
    /// Write the JSON report here.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Seconds of each measurement, over all rounds (default: 1 with --quick, 5 otherwise).
    #[arg(long)]
    pub seconds: Option<f64>,
}

/// The medium of the measured pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum PoolMedium {
    File,
    Dram,
}

impl std::fmt::Display for PoolMedium {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            PoolMedium::File => "file",
            PoolMedium::Dram => "dram",
        })
    }
}

/// Payload sizes of the allocations: 64 bytes and a few larger size classes.
const SIZES: [usize; 4] = [64, 256, 1024, 4096];
/// Bytes of the persisted write.
const PERSIST_BYTES: usize = 64;
/// Rounds: the rotation of medium-bound operations, then malloc's slices.
const ROUNDS: u32 = 10;
const POOL_BYTES: usize = 32 << 20;
const BLOCK_BYTES: usize = 1 << 20;

fn rt(e: impl std::fmt::Display) -> CliError {
    CliError::runtime(e.to_string())
}

pub fn run(args: PoolArgs) -> Result<(), CliError> {
    super::check_json_path(args.json.as_deref())?;
    let seconds = args.seconds.unwrap_or(if args.quick { 1.0 } else { 5.0 });
    if !(seconds > 0.0 && seconds <= 3600.0) {
        return Err(CliError::usage("--seconds must lie in (0, 3600]"));
    }
    if args.dir.is_some() && args.medium != PoolMedium::File {
        return Err(CliError::usage(
            "--dir is where the pool file goes: it needs --medium file",
        ));
    }
    let opts = PoolOptions::default().block_size(BLOCK_BYTES);
    // The directory lives as long as the pool (declared first, dropped last).
    let (_dir, pool) = match args.medium {
        PoolMedium::File => {
            let base = args.dir.clone().unwrap_or_else(std::env::temp_dir);
            let dir = tempfile::Builder::new()
                .prefix("dmkit-bench-pool-")
                .tempdir_in(&base)
                .map_err(|e| {
                    CliError::usage(format!(
                        "cannot make a directory for the pool file in {}: {e}",
                        base.display()
                    ))
                })?;
            let path = dir.path().join("bench.pool");
            let pool = Pool::create(&path, POOL_BYTES, opts)
                .map_err(|e| CliError::usage(format!("cannot create the pool file: {e}")))?;
            (Some(dir), pool)
        }
        PoolMedium::Dram => (None, Pool::create_dram(POOL_BYTES, opts).map_err(rt)?),
    };
    let pool = Arc::new(pool);

    let mut report = Report::new("pool");
    report.config("quick", args.quick);
    report.config("machine", super::all::machine());
    report.config("medium", args.medium.to_string());
    report.config("medium_kind", pool.medium_kind().to_string());
    report.config("persistent", pool.is_persistent());
    if let Some(p) = pool.path() {
        let base = args.dir.clone().unwrap_or_else(std::env::temp_dir);
        report.config("pool_dir", base.display().to_string());
        if let Some(fs) = file_system_of(p) {
            report.config("file_system", fs);
        }
    }
    report.config("pool_bytes", POOL_BYTES as u64);
    report.config("block_bytes", BLOCK_BYTES as u64);
    report.config("seconds_per_measurement", seconds);
    report.config("rounds", u64::from(ROUNDS));
    report.config("threads", 1u64);
    report.config(
        "sizes",
        Value::from(SIZES.iter().map(|&s| s as u64).collect::<Vec<_>>()),
    );
    report.config(
        "baseline",
        "persist64: a 64-byte write and Pool::persist of it; malloc: Vec::with_capacity + drop \
         through the global allocator (mimalloc)",
    );

    // The persisted bytes go to a block of their own, away from the allocator's slots.
    let block = pool.alloc_block(1).map_err(rt)?;
    let persist_at = pool.block_offset(block);
    let mem =
        RegionMemory::new(Arc::new(dmkit_pmem_pool::verbs::verbs_backing(&pool))).map_err(rt)?;

    // Warm-up, untimed: each size class takes its block, the pages are mapped.
    for &size in &SIZES {
        for _ in 0..8 {
            alloc_free(&pool, size)?;
        }
    }
    persist_once(&mem, &pool, persist_at, 0)?;

    // The operations that wait for the medium take turns one at a time: persist64, then an
    // allocation of each size, then persist64 again... A persist that waits behind another
    // process's disk traffic then costs every side alike. Each side's rate is its operations
    // over the time they took (their own time, not the rotation's).
    let mut persist = Acc::new();
    let mut allocs: Vec<Acc> = SIZES.iter().map(|_| Acc::new()).collect();
    let mut mallocs: Vec<Acc> = SIZES.iter().map(|_| Acc::new()).collect();
    let clock = super::Stopwatch::new();
    let turn = |acc: &mut Acc, op: &mut dyn FnMut() -> Result<(), CliError>| {
        let t0 = clock.raw();
        op()?;
        acc.record(clock.delta_as_nanos(t0, clock.raw()));
        Ok::<_, CliError>(())
    };
    let rotation = 1 + SIZES.len() as u32;
    let slice = seconds / f64::from(ROUNDS);
    let pb = progress(u64::from(ROUNDS), "bench pool");
    for round in 0..ROUNDS {
        pb.set_message(format!("round {}/{ROUNDS}", round + 1));
        let start = clock.raw();
        let budget = (slice * f64::from(rotation) * 1e9) as u64;
        let mut i = 0u64;
        while i == 0 || clock.delta_as_nanos(start, clock.raw()) < budget {
            turn(&mut persist, &mut || {
                persist_once(&mem, &pool, persist_at, i)
            })?;
            for (k, &size) in SIZES.iter().enumerate() {
                turn(&mut allocs[k], &mut || alloc_free(&pool, size))?;
            }
            i += 1;
        }
        for (k, &size) in SIZES.iter().enumerate() {
            mallocs[k].run_malloc(&clock, slice, size);
        }
        pb.inc(1);
    }
    pb.finish_and_clear();

    report.push(persist.sample(
        "persist64",
        "one 64-byte write to the data area and Pool::persist of it",
        PERSIST_BYTES,
        1,
    ));
    for (k, &size) in SIZES.iter().enumerate() {
        report.push(allocs[k].sample(
            &format!("alloc_free_{size}"),
            "Pool::alloc_object + Pool::free_object (two durable header stores)",
            size,
            2,
        ));
        report.push(mallocs[k].sample(
            &format!("malloc_free_{size}"),
            "Vec::with_capacity + drop (the global allocator)",
            size,
            0,
        ));
    }
    let tput = |r: &Report, n: &str| r.result(n).map_or(f64::NAN, |m| m.ops_per_sec);
    let ours = tput(&report, "alloc_free_64");
    let r = ours / tput(&report, "persist64");
    report.ratio("object_alloc_vs_persist", r, Some(">= 0.4"));
    let r = ours / tput(&report, "malloc_free_64");
    report.ratio("object_alloc_vs_malloc", r, None);
    // The pool must still account every object it handed out as freed.
    let live = pool.stats().live_objects;
    if live != 0 {
        return Err(rt(format!(
            "the pool counts {live} live objects after the bench freed them all"
        )));
    }
    report
        .finish(args.json.as_deref())
        .map_err(CliError::runtime)?;
    if !pool.is_persistent() {
        println!("(dram medium: persist is a no-op, so object_alloc_vs_persist says little)");
    }
    Ok(())
}

/// One allocation and its free: the measured operation.
fn alloc_free(pool: &Pool, size: usize) -> Result<(), CliError> {
    let obj = pool.alloc_object(size).map_err(rt)?;
    pool.free_object(black_box(obj).offset).map_err(rt)
}

/// One 64-byte write (its content changes every time) and the pool's persist of it.
fn persist_once(mem: &RegionMemory, pool: &Pool, at: usize, i: u64) -> Result<(), CliError> {
    let mut data = [0u8; PERSIST_BYTES];
    data[..8].copy_from_slice(&i.to_le_bytes());
    mem.write(at, &data)
        .map_err(|e| rt(format!("write to the pool: {e:?}")))?;
    pool.persist(at, PERSIST_BYTES).map_err(rt)
}

fn malloc_free(size: usize) {
    let v: Vec<u8> = Vec::with_capacity(black_box(size));
    drop(black_box(v));
}

/// Latencies, operations and the time they took, of one measurement over its rounds.
struct Acc {
    hist: Histogram<u64>,
    ops: u64,
    ns: u64,
}

impl Acc {
    fn new() -> Self {
        Self {
            hist: Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("histogram bounds"),
            ops: 0,
            ns: 0,
        }
    }

    /// One operation that took `ns`.
    fn record(&mut self, ns: u64) {
        let _ = self.hist.record(ns.max(1));
        self.ops += 1;
        self.ns += ns;
    }

    /// About `seconds` of allocations and frees of `size` bytes: the rate from chunks of
    /// operations timed whole (a clock read costs about as much as one), then the latencies
    /// of a few thousand timed one by one.
    fn run_malloc(&mut self, clock: &super::Stopwatch, seconds: f64, size: usize) {
        const CHUNK: u64 = 1024;
        let budget = (seconds * 1e9) as u64;
        let start = clock.raw();
        let mut ops = 0u64;
        let mut ns = 0;
        while ops == 0 || ns < budget {
            for _ in 0..CHUNK {
                malloc_free(size);
            }
            ops += CHUNK;
            ns = clock.delta_as_nanos(start, clock.raw());
        }
        self.ops += ops;
        self.ns += ns;
        for _ in 0..4096 {
            let t0 = clock.raw();
            malloc_free(size);
            let _ = self
                .hist
                .record(clock.delta_as_nanos(t0, clock.raw()).max(1));
        }
    }

    fn sample(&self, name: &str, what: &str, bytes: usize, persists: u64) -> Sample {
        let mut m = Measurement {
            name: name.to_string(),
            ops_per_sec: self.ops as f64 / (self.ns.max(1) as f64 / 1e9),
            p50_us: self.hist.value_at_quantile(0.5) as f64 / 1000.0,
            p99_us: self.hist.value_at_quantile(0.99) as f64 / 1000.0,
            rtts_per_op: 0.0,
            modeled: false,
            extra: serde_json::Map::new(),
        };
        m.extra.insert("bytes".into(), Value::from(bytes as u64));
        m.extra
            .insert("persists_per_op".into(), Value::from(persists));
        m.extra.insert("operations".into(), Value::from(self.ops));
        m.extra.insert("what".into(), Value::from(what));
        Sample {
            measurement: m,
            hist: self.hist.clone(),
        }
    }
}

/// The type of the file system holding `path` (the longest mount point of /proc/mounts that
/// contains it), for the report: tmpfs and ext4 persist very differently.
fn file_system_of(path: &Path) -> Option<String> {
    let path = path.canonicalize().ok()?;
    let mounts = std::fs::read_to_string("/proc/mounts").ok()?;
    mounts
        .lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            let (_dev, at, fs) = (w.next()?, w.next()?, w.next()?);
            // Mount points escape spaces as \040.
            let at = PathBuf::from(at.replace("\\040", " "));
            path.starts_with(&at)
                .then(|| (at.as_os_str().len(), fs.to_string()))
        })
        .max_by_key(|(len, _)| *len)
        .map(|(_, fs)| fs)
}
