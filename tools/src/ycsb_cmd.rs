//! `dmkit ycsb`: one FUSEE client process running a YCSB workload against a cluster file's
//! cluster — the building block of multi-process runs (several of these at once, on one host
//! or many).
//!
//! It joins like `dmkit kv` (the client id is locked for the process's lifetime — a second
//! process with the same id on this host fails at once — and the client is recovered under
//! its id first), optionally loads the records, runs the workload for `--seconds`, prints one
//! summary line on stdout and, with `--ack-log PATH`, appends every acknowledged write as
//! `key<TAB>tag<TAB>fnv1a64-of-value-in-hex<TAB>unix-milliseconds` (tag = `c<client id>:<counter>`, the counter starting at the run's start time in ms × 10⁶ so that tags grow across restarts; also the value's
//! first bytes, so every write's value is unique).
//!
//! `--partition K/N` makes this client write only keys whose record number is K modulo N (an
//! update drawn for another key is moved to the nearest key of its own share, and keys outside
//! the loaded records, like workload D's inserts, get a `-c<id>` suffix), so that several
//! processes never write the same key and every key's last acknowledged write is well
//! defined; reads still go anywhere. With `--load`, such a client loads only its own share,
//! so N clients with `--partition 0/N` .. `N-1/N` load the key space together, at once;
//! `--verify` then reads every record it loaded back (exit 3 if one is missing or differs).
//!
//! `--inflight N` keeps N operations in flight in the one client (N async loops on one
//! thread, as FUSEE's coroutines): the load and the verify split the keys between them, the
//! run draws from the one operation stream. Two loops never write one key at once (a write
//! drawn for a key being written is skipped), so the ack log keeps each key's write order.

use std::collections::HashMap;
use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use dmkit_fusee::{Client, InsertResult, UpdateResult};
use dmkit_tools::ycsb::{Operation, Workload, WorkloadSpec, fnv1a_64};
use hdrhistogram::Histogram;

use crate::CliError;
use crate::cluster_file::ClusterFile;

#[derive(Debug, clap::Args)]
pub struct YcsbArgs {
    /// The cluster file.
    #[arg(long)]
    pub cluster: PathBuf,
    /// The FUSEE client id of this process (unique among running clients).
    #[arg(long)]
    pub client_id: u64,
    /// The YCSB workload: a, b, c, d or f (e's scans are not supported by FUSEE).
    #[arg(long, default_value = "a")]
    pub workload: char,
    /// Seconds of the run phase (0: load only).
    #[arg(long, default_value_t = 10.0)]
    pub seconds: f64,
    /// Records of the key space.
    #[arg(long, default_value_t = 10_000)]
    pub records: u64,
    /// Value bytes of every write.
    #[arg(long, default_value_t = 1000)]
    pub value_bytes: usize,
    /// Load the records first (insert, or overwrite when present).
    #[arg(long)]
    pub load: bool,
    /// Write only the keys of share K of N (`K/N`); see the module docs.
    #[arg(long)]
    pub partition: Option<String>,
    /// Random seed of the operation stream (default: derived from the client id).
    #[arg(long)]
    pub seed: Option<u64>,
    /// After the load, read every record this client loaded back and fail (exit 3) if one
    /// is missing or holds another value.
    #[arg(long, requires = "load")]
    pub verify: bool,
    /// Append every acknowledged write here as
    /// `key\ttag\tvalue-hash\tunix-ms\tinvoked-unix-us\tacknowledged-unix-us`.
    #[arg(long)]
    pub ack_log: Option<PathBuf>,
    /// Append every read of the run phase here as
    /// `key\ttag-or--\tvalue-hash-or--\tinvoked-unix-us\treturned-unix-us`, so that a
    /// checker can test the reads against the acknowledged writes (with `--partition`, each
    /// key has one writer: its reads are linearizable when none returns a write older than
    /// one acknowledged before it began, or one not yet invoked when it returned, and no
    /// read returns an older write than one that returned before it began).
    #[arg(long)]
    pub read_log: Option<PathBuf>,
    /// Operations this client keeps in flight at once (FUSEE's coroutines: async operation
    /// loops sharing the one client), in the load, the verify and the run phases.
    #[arg(long, default_value_t = 1)]
    pub inflight: usize,
}

fn fail(e: dmkit_fusee::Error) -> CliError {
    CliError::with_code(e.to_string(), 3)
}

/// Who writes what: the share of the key space this client writes.
struct Partition {
    share: u64,
    of: u64,
    /// Loaded key -> record number.
    keynums: HashMap<String, u64>,
    /// Record number -> key.
    keys: Vec<String>,
    suffix: String,
}

impl Partition {
    /// The key a write drawn for `key` goes to.
    fn remap(&self, key: String) -> String {
        let Some(&n) = self.keynums.get(&key) else {
            return format!("{key}{}", self.suffix);
        };
        if n % self.of == self.share {
            return key;
        }
        let mut m = n - n % self.of + self.share;
        if m >= self.keys.len() as u64 {
            m = m.saturating_sub(self.of);
        }
        self.keys[m as usize].clone()
    }
}

fn parse_partition(s: &str) -> Result<(u64, u64), CliError> {
    let bad = || CliError::usage(format!("--partition takes K/N with K < N, not '{s}'"));
    let (k, n) = s.split_once('/').ok_or_else(bad)?;
    let (k, n): (u64, u64) = (
        k.trim().parse().map_err(|_| bad())?,
        n.trim().parse().map_err(|_| bad())?,
    );
    if n == 0 || k >= n {
        return Err(bad());
    }
    Ok((k, n))
}

struct Writes {
    id: u64,
    counter: u64,
    log: Option<std::io::BufWriter<std::fs::File>>,
    reads: Option<std::io::BufWriter<std::fs::File>>,
    acked: u64,
}

/// Microseconds since the Unix epoch (the logs' clock: every process on a host shares it).
fn unix_us() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros())
}

impl Writes {
    /// A unique value of `len` bytes: the tag first, then `filler`.
    fn value(&mut self, filler: &[u8], len: usize) -> (String, Vec<u8>) {
        self.counter += 1;
        let tag = format!("c{}:{}", self.id, self.counter);
        let mut v = tag.as_bytes().to_vec();
        v.push(b'|');
        v.extend_from_slice(filler);
        v.resize(len.max(tag.len() + 1), b'.');
        (tag, v)
    }

    /// Logs an acknowledged write invoked at `start_us`.
    fn ack(&mut self, key: &str, tag: &str, value: &[u8], start_us: u128) -> Result<(), CliError> {
        self.acked += 1;
        if let Some(log) = &mut self.log {
            // Flushed per write: a process killed mid-run leaves every acknowledgement.
            let end_us = unix_us();
            writeln!(
                log,
                "{key}\t{tag}\t{:016x}\t{}\t{start_us}\t{end_us}",
                fnv1a_64(value),
                end_us / 1000
            )
            .and_then(|()| log.flush())
            .map_err(|e| CliError::runtime(format!("cannot write the ack log: {e}")))?;
        }
        Ok(())
    }

    /// Logs a read of `key` invoked at `start_us` that returned `value`.
    fn read(&mut self, key: &str, value: Option<&[u8]>, start_us: u128) -> Result<(), CliError> {
        if let Some(log) = &mut self.reads {
            let end_us = unix_us();
            let (tag, hash) = match value {
                Some(v) => (
                    v.split(|b| *b == b'|')
                        .next()
                        .and_then(|t| std::str::from_utf8(t).ok())
                        .filter(|t| t.len() < v.len())
                        .unwrap_or("?")
                        .to_string(),
                    format!("{:016x}", fnv1a_64(v)),
                ),
                None => ("-".to_string(), "-".to_string()),
            };
            writeln!(log, "{key}\t{tag}\t{hash}\t{start_us}\t{end_us}")
                .and_then(|()| log.flush())
                .map_err(|e| CliError::runtime(format!("cannot write the read log: {e}")))?;
        }
        Ok(())
    }

    fn finish(&mut self) -> Result<(), CliError> {
        for log in [&mut self.log, &mut self.reads].into_iter().flatten() {
            log.flush()
                .map_err(|e| CliError::runtime(format!("cannot write a log: {e}")))?;
        }
        Ok(())
    }
}

/// Insert, or overwrite when present.
/// The load's write: insert, or overwrite when present.
async fn put(c: &Client, key: &[u8], value: &[u8]) -> Result<(), CliError> {
    loop {
        if c.insert_async(key, value).await.map_err(fail)? == InsertResult::Inserted {
            return Ok(());
        }
        if c.update_async(key, value).await.map_err(fail)? == UpdateResult::Updated {
            return Ok(());
        }
    }
}

/// Runs `op(i)` for every `i` in `0..n` with at most `inflight` at once (in order within
/// each of `inflight` interleaved streams), on this thread; the first error stops the rest.
fn in_flight<F, Fut>(n: usize, inflight: usize, op: F) -> Result<(), CliError>
where
    F: Fn(usize) -> Fut,
    Fut: std::future::Future<Output = Result<(), CliError>>,
{
    let failed = std::cell::Cell::new(false);
    let streams = (0..inflight.max(1)).map(|s| {
        let (op, failed) = (&op, &failed);
        async move {
            let mut i = s;
            while i < n && !failed.get() {
                if let Err(e) = op(i).await {
                    failed.set(true);
                    return Err(e);
                }
                i += inflight.max(1);
            }
            Ok(())
        }
    });
    dmkit_verbs::block_on(futures_util::future::join_all(streams))
        .into_iter()
        .collect()
}

pub fn run(args: YcsbArgs) -> Result<(), CliError> {
    let file = ClusterFile::load(&args.cluster).map_err(CliError::usage)?;
    let w = args.workload.to_ascii_lowercase();
    if !matches!(w, 'a' | 'b' | 'c' | 'd' | 'f') {
        return Err(CliError::usage(format!(
            "--workload takes a, b, c, d or f, not '{}'",
            args.workload
        )));
    }
    if !(0.0..=86_400.0).contains(&args.seconds) {
        return Err(CliError::usage("--seconds must lie in [0, 86400]"));
    }
    if args.records == 0 {
        return Err(CliError::usage("--records must be at least 1"));
    }
    if !(1..=4096).contains(&args.inflight) {
        return Err(CliError::usage("--inflight must lie in 1..=4096"));
    }
    if !(1..=16_000).contains(&args.value_bytes) {
        return Err(CliError::usage(
            "--value-bytes must lie in 1..=16000 (the largest FUSEE object is 16 KiB)",
        ));
    }
    let partition = args.partition.as_deref().map(parse_partition).transpose()?;
    if let Some((_, n)) = partition {
        if n > args.records {
            return Err(CliError::usage("--partition: more shares than --records"));
        }
    }
    let mut spec = WorkloadSpec::standard(w).map_err(|e| CliError::usage(e.to_string()))?;
    spec.record_count = args.records;
    spec.field_count = 1;
    spec.field_length = args.value_bytes as u32;
    spec.zipfian_constant = 0.99;
    let seed = args.seed.unwrap_or(0x5EED_0000 ^ args.client_id);
    let mut workload = Workload::new(spec, seed).map_err(|e| CliError::usage(e.to_string()))?;
    let open_log = |path: &Option<PathBuf>| -> Result<_, CliError> {
        path.as_ref()
            .map(|p| {
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(p)
                    .map(std::io::BufWriter::new)
                    .map_err(|e| CliError::usage(format!("cannot open {}: {e}", p.display())))
            })
            .transpose()
    };
    let log = open_log(&args.ack_log)?;
    let reads = open_log(&args.read_log)?;
    // Fails at once (non-blocking) when another process acts as this client id.
    let _lock = crate::kv::lock_id(args.client_id, false)?;
    let c = crate::kv::client(&file, args.client_id)?;
    let part = partition.map(|(share, of)| {
        let keys: Vec<String> = workload.load_keys().collect();
        Partition {
            share,
            of,
            keynums: keys
                .iter()
                .enumerate()
                .map(|(i, k)| (k.clone(), i as u64))
                .collect(),
            keys,
            suffix: format!("-c{}", args.client_id),
        }
    });
    // Tags grow across restarts of a client id (start time in ms, then a million writes a
    // run): a checker tells a write in flight at a kill (a higher tag than the last
    // acknowledged one) from an older value come back (a lower one).
    let started_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let mut writes = Writes {
        id: args.client_id,
        counter: started_ms.saturating_mul(1_000_000),
        log,
        reads,
        acked: 0,
    };
    let r = run_phases(&args, &c, &mut workload, part.as_ref(), &mut writes);
    let flushed = writes.finish();
    // Finish background cleanups before exiting, so nothing is left for the next recovery.
    let _ = c.flush();
    r.and(flushed)
}

fn run_phases(
    args: &YcsbArgs,
    c: &Client,
    workload: &mut Workload,
    part: Option<&Partition>,
    writes: &mut Writes,
) -> Result<(), CliError> {
    let id = args.client_id;
    if args.load {
        let t = Instant::now();
        // With a partition, only this client's share (so that several clients can load one
        // key space at once, each its own keys).
        let keys: Vec<String> = workload
            .load_keys()
            .enumerate()
            .filter(|(n, _)| part.is_none_or(|p| *n as u64 % p.of == p.share))
            .map(|(_, k)| k)
            .collect();
        let loaded = std::cell::RefCell::new(vec![0u64; keys.len()]);
        let every = (keys.len() / 10).max(1);
        let done = std::cell::Cell::new(0usize);
        let shared = std::cell::RefCell::new(&mut *writes);
        in_flight(keys.len(), args.inflight, |i| {
            let key = &keys[i];
            let (tag, value) = shared.borrow_mut().value(&[], args.value_bytes);
            let (shared, loaded, done, keys) = (&shared, &loaded, &done, &keys);
            async move {
                let t0 = unix_us();
                put(c, key.as_bytes(), &value).await?;
                shared.borrow_mut().ack(key, &tag, &value, t0)?;
                loaded.borrow_mut()[i] = fnv1a_64(&value);
                done.set(done.get() + 1);
                if done.get() % every == 0 {
                    eprintln!(
                        "ycsb: client {id} loaded {} of {} records ({:.1} s)",
                        done.get(),
                        keys.len(),
                        t.elapsed().as_secs_f64()
                    );
                }
                Ok(())
            }
        })?;
        let loaded = loaded.into_inner();
        eprintln!(
            "ycsb: client {id} loaded {} records in {:.2} s",
            keys.len(),
            t.elapsed().as_secs_f64()
        );
        if args.verify {
            let t = Instant::now();
            in_flight(keys.len(), args.inflight, |i| {
                let (key, want) = (&keys[i], loaded[i]);
                async move {
                    match c.search_async(key.as_bytes()).await.map_err(fail)? {
                        Some(v) if fnv1a_64(&v) == want => Ok(()),
                        Some(_) => Err(CliError::with_code(
                            format!("verify: {key} holds another value than this client loaded"),
                            3,
                        )),
                        None => Err(CliError::with_code(
                            format!("verify: {key} is missing after the load"),
                            3,
                        )),
                    }
                }
            })?;
            eprintln!(
                "ycsb: client {id} verified {} records in {:.2} s",
                keys.len(),
                t.elapsed().as_secs_f64()
            );
        }
    }
    eprintln!(
        "ycsb: client {id} running workload {} for {} s",
        args.workload, args.seconds
    );
    let hist = std::cell::RefCell::new(
        Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3).expect("bounds"),
    );
    let rtt0 = c.endpoint().stats().total().round_trips;
    let run_for = Duration::from_secs_f64(args.seconds);
    let start = Instant::now();
    let ops = std::cell::Cell::new(0u64);
    let workload = std::cell::RefCell::new(workload);
    let shared = std::cell::RefCell::new(writes);
    // Keys being written: two loops never write one key at once, so each key's writes are
    // acknowledged (and logged) in the order they took effect.
    let busy = std::cell::RefCell::new(std::collections::HashSet::<String>::new());
    // `--inflight` loops, each drawing its next operation from the one stream.
    in_flight(args.inflight, args.inflight, |_| {
        let (hist, ops, workload, shared, busy) = (&hist, &ops, &workload, &shared, &busy);
        async move {
            while start.elapsed() < run_for {
                let op = workload.borrow_mut().next_op();
                let writes_key = match &op {
                    Operation::Update { key, .. }
                    | Operation::Insert { key, .. }
                    | Operation::ReadModifyWrite { key, .. } => Some(match part {
                        Some(p) => p.remap(key.clone()),
                        None => key.clone(),
                    }),
                    _ => None,
                };
                if let Some(k) = &writes_key {
                    if !busy.borrow_mut().insert(k.clone()) {
                        // Another loop writes it now: draw the next operation instead.
                        continue;
                    }
                }
                let s0 = Instant::now();
                let write = |filler: Vec<u8>| {
                    let key = writes_key.clone().expect("a write has its key");
                    let (tag, value) = shared.borrow_mut().value(&filler, args.value_bytes);
                    async move {
                        let t0 = unix_us();
                        let r = c.upsert_async(key.as_bytes(), &value).await.map_err(fail);
                        busy.borrow_mut().remove(&key);
                        r?;
                        shared.borrow_mut().ack(&key, &tag, &value, t0)
                    }
                };
                match op {
                    Operation::Read { key } => {
                        let t0 = unix_us();
                        let v = c.search_async(key.as_bytes()).await.map_err(fail)?;
                        shared.borrow_mut().read(&key, v.as_deref(), t0)?;
                    }
                    Operation::Update { value, .. } | Operation::Insert { value, .. } => {
                        write(value).await?;
                    }
                    Operation::ReadModifyWrite { key, value } => {
                        let t0 = unix_us();
                        let r = c.search_async(key.as_bytes()).await.map_err(fail);
                        let r = r.and_then(|v| shared.borrow_mut().read(&key, v.as_deref(), t0));
                        if let Err(e) = r {
                            busy.borrow_mut()
                                .remove(writes_key.as_deref().unwrap_or_default());
                            return Err(e);
                        }
                        write(value).await?;
                    }
                    Operation::Scan { .. } => {}
                }
                let _ = hist
                    .borrow_mut()
                    .record((s0.elapsed().as_nanos() as u64).max(1));
                ops.set(ops.get() + 1);
            }
            Ok(())
        }
    })?;
    let (hist, ops, writes) = (hist.into_inner(), ops.get(), shared.into_inner());
    let secs = start.elapsed().as_secs_f64().max(1e-9);
    let rtts = c.endpoint().stats().total().round_trips - rtt0;
    println!(
        "ycsb-{} client {id}: {ops} ops in {secs:.2} s, {:.0} ops/s, p50 {:.1} us, p99 {:.1} us, {:.2} RTTs/op, {} writes acknowledged",
        args.workload,
        ops as f64 / secs,
        hist.value_at_quantile(0.5) as f64 / 1000.0,
        hist.value_at_quantile(0.99) as f64 / 1000.0,
        rtts as f64 / ops.max(1) as f64,
        writes.acked,
    );
    Ok(())
}
