//! `dmkit bench index`: the RACE index of `dmkit-kv-index` on its own, client-side: SEARCH,
//! UPDATE and INSERT throughput with 1, 2, 4 and 8 operations in flight on one client, and a
//! `DashMap` lookup of the same keys as the same-run baseline.
//!
//! The index has `--replicas` replicas (default 3, SNAPSHOT between them), each on its own
//! memory node: in-process nodes of the `sim` backend (no latency model: wall-clock time of
//! the code path), or nodes in this process serving over loopback TCP (`tcp`). The client is
//! one endpoint and one [`RaceIndex`] handle; n tasks are n async operation loops on one
//! thread ([`dmkit_verbs::block_on`] over [`dmkit_verbs::join_all`], as FUSEE's coroutines:
//! the verbs the loops post in one poll share a doorbell). Keys are not stored in the index:
//! each key is a small object in remote memory (as a KV layer's objects hold their keys), read
//! by the bench's [`KeyVerifier`](dmkit_kv_index::KeyVerifier) when a fingerprint matches — one READ round trip, awaited, so
//! the other loops run meanwhile.
//!
//! - `search_<n>_tasks`: SEARCH of loaded keys, uniformly at random (each must be found);
//! - `update_<n>_tasks`: UPDATE of loaded keys, each task its own keys (no write conflicts),
//!   swapping each key between two objects that hold it;
//! - `insert_<n>_tasks`: INSERT of new keys (their objects written before the clock starts),
//!   splitting subtables as the index grows;
//! - `dashmap_get`: `DashMap<Vec<u8>, u64>::get` of the same key sequence as the first
//!   SEARCH row, on one thread, with the same keys loaded.
//!
//! `rtts_per_op` counts every round trip the rows' operations made (the endpoint's counters:
//! one per batch, or group of parallel batches, awaited): the index's own (the operation's
//! tag, `index_rtts_per_op`, the contract in `dmkit-kv-index`'s crate docs), the key reads
//! (`verifier_rtts_per_op`), splits and directory refreshes. Ratios:
//! `index_search_vs_dashmap` (SEARCH ops/s at the first task count over the dashmap's),
//! `index_<op>_<n>_vs_<first>_tasks` (scaling with operations in flight, at the largest n).

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::time::Instant;

use dashmap::DashMap;
use dmkit_kv_index::objects::ObjectVerifier;
use dmkit_kv_index::{
    IndexConfig, IndexReplicaSpace, InsertOutcome, NoHooks, OBJECT_ALIGN, ObjPtr, RaceIndex, Slot,
    SnapshotOutcome, tags,
};
use dmkit_verbs::sim::{SimCluster, SimConfig};
use dmkit_verbs::tcp::{TcpConnector, TcpServer, TcpServerConfig};
use dmkit_verbs::{Access, DramBacking, Endpoint, MemoryNode, NodeId, RegionDesc, TagStats};
use hdrhistogram::Histogram;
use rand::{Rng, SeedableRng};
use serde_json::Value;

use super::{Measurement, Report, Sample, progress};
use crate::{Backend, CliError};

#[derive(Debug, clap::Args)]
pub struct IndexArgs {
    /// Backend of the in-process memory nodes: sim, or tcp over loopback.
    #[arg(long, value_enum, default_value_t = Backend::Sim)]
    pub backend: Backend,
    /// A short run (under a minute on two cores).
    #[arg(long)]
    pub quick: bool,
    /// Write the JSON report here.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Operations in flight on the one client (async tasks on one thread), e.g. 1,2,4,8.
    #[arg(long, value_delimiter = ',', default_values_t = [1usize, 2, 4, 8])]
    pub tasks: Vec<usize>,
    /// Keys loaded before the runs (default: 20000 on sim and 10000 on tcp with --quick,
    /// 100000 otherwise).
    #[arg(long)]
    pub keys: Option<u64>,
    /// Operations of each kind at each task count (default: 50000 on sim and 10000 on tcp
    /// with --quick; 200000 and 100000 otherwise).
    #[arg(long)]
    pub ops: Option<u64>,
    /// Index replicas, each on its own memory node (1 to 5).
    #[arg(long, default_value_t = 3)]
    pub replicas: usize,
}

fn rt(e: impl std::fmt::Display) -> CliError {
    CliError::runtime(e.to_string())
}

/// Tag of the key objects' verbs (reads by the verifier, writes while preparing).
const KEYS_TAG: &str = "bench_index.keys";
/// Keys written per round trip while preparing.
const PUT_CHUNK: usize = 256;
/// Operations in flight while loading (untimed).
const LOAD_TASKS: usize = 16;
/// The shortest run of the dashmap baseline, in seconds.
const DASHMAP_MIN_SECS: f64 = 0.2;

pub fn run(args: IndexArgs) -> Result<(), CliError> {
    super::check_json_path(args.json.as_deref())?;
    match args.backend {
        Backend::Sim | Backend::Tcp => {}
        Backend::Rdma => {
            return Err(CliError::usage(
                "bench index runs on sim or tcp (--backend sim|tcp)",
            ));
        }
    }
    if args.tasks.is_empty() || args.tasks.iter().any(|&t| !(1..=256).contains(&t)) {
        return Err(CliError::usage(
            "--tasks takes task counts between 1 and 256, e.g. 1,2,4,8",
        ));
    }
    if !(1..=5).contains(&args.replicas) {
        return Err(CliError::usage(
            "--replicas must lie in 1..=5 (the index keeps 1 to 5 replicas)",
        ));
    }
    // sim runs ten times the operations a second tcp does: more of them keep its rows
    // from lasting a few milliseconds.
    let sim = args.backend == Backend::Sim;
    let keys = args.keys.unwrap_or(match (args.quick, sim) {
        (true, true) => 20_000,
        (true, false) => 10_000,
        (false, _) => 100_000,
    });
    let ops = args.ops.unwrap_or(match (args.quick, sim) {
        (true, true) => 50_000,
        (true, false) => 10_000,
        (false, true) => 200_000,
        (false, false) => 100_000,
    });
    if !(1..=10_000_000).contains(&keys) || !(1..=10_000_000).contains(&ops) {
        return Err(CliError::usage("--keys and --ops must lie in 1..=10000000"));
    }
    let first = args.tasks[0];
    let max = *args.tasks.iter().max().expect("non-empty");
    if ops < max as u64 {
        return Err(CliError::usage(format!(
            "--ops {ops} leaves some of the {max} tasks nothing to do"
        )));
    }

    let inserted = ops * args.tasks.len() as u64;
    let total_keys = keys + inserted;
    let nodes = args.replicas;
    // A subtable of 1024 groups holds about 21 000 slots in 192 KiB: with splits that leave
    // subtables half full, 48 bytes a key is ample.
    let index_bytes = (total_keys as usize * 48 + (8 << 20)).next_multiple_of(1 << 20);
    // Two objects per loaded key (UPDATE swaps between them), one per inserted key, spread
    // round robin over the nodes.
    let objects = (keys * 2 + inserted) as usize * OBJECT_ALIGN as usize;
    let object_bytes = (objects / nodes * 5 / 4 + (1 << 20)).next_multiple_of(1 << 20);
    let cluster = Cluster::start(args.backend, nodes, index_bytes, object_bytes)?;
    let ep = &cluster.ep;

    let mut report = Report::new("index");
    report.config("backend", args.backend.to_string());
    report.config("quick", args.quick);
    report.config("machine", super::all::machine());
    report.config("memory_nodes", nodes as u64);
    report.config("index_replicas", nodes as u64);
    report.config("keys_loaded", keys);
    report.config("ops_per_point", ops);
    report.config(
        "tasks",
        Value::from(args.tasks.iter().map(|&t| t as u64).collect::<Vec<_>>()),
    );
    report.config(
        "client",
        "one endpoint and one RaceIndex; n tasks = n async operation loops on one thread",
    );
    report.config(
        "verifier",
        "each key in a 64-byte object in remote memory, read when a fingerprint matches",
    );
    report.config(
        "baseline",
        "DashMap<Vec<u8>, u64>::get (dashmap crate), the same key sequence, one thread",
    );
    report.config(
        "threads_available",
        std::thread::available_parallelism().map_or(1, |n| n.get() as u64),
    );

    let pb = progress(
        1 + 3 * args.tasks.len() as u64,
        &format!("bench index ({})", args.backend),
    );
    pb.set_message("loading");
    let config = IndexConfig::default();
    let index = RaceIndex::format(ep, &config, &cluster.spaces).map_err(rt)?;
    let store = KeyObjects::new(cluster.objects.clone());
    let names: Vec<Vec<u8>> = (0..total_keys).map(key).collect();
    let loaded = &names[..keys as usize];
    // Two objects per loaded key: the index points at `a` first, UPDATE swaps a <-> b.
    let a = store.put_all(ep, loaded)?;
    let b = store.put_all(ep, loaded)?;
    let slot = |ptrs: &[ObjPtr], i: usize| index.slot_for(&names[i], ptrs[i]).map_err(rt);
    let slots_a: Vec<Slot> = (0..loaded.len())
        .map(|i| slot(&a, i))
        .collect::<Result<_, _>>()?;
    let slots_b: Vec<Slot> = (0..loaded.len())
        .map(|i| slot(&b, i))
        .collect::<Result<_, _>>()?;
    let items: Vec<(usize, Slot)> = slots_a.iter().copied().enumerate().collect();
    insert_all(&index, &store, &names, &items, LOAD_TASKS)?;
    pb.inc(1);
    // Which object each loaded key's slot points at now (0: a, 1: b).
    let current: Vec<AtomicU8> = (0..loaded.len()).map(|_| AtomicU8::new(0)).collect();

    let mut next_new = keys as usize;
    for &t in &args.tasks {
        pb.set_message(format!("SEARCH, {t} tasks"));
        let seqs = search_sequences(keys, ops, t);
        let before = Counters::read(ep, tags::SEARCH);
        let start = Instant::now();
        let tallies = dmkit_verbs::block_on(dmkit_verbs::join_all(
            seqs.iter()
                .map(|seq| search_task(&index, &store, &names, &slots_a, &slots_b, seq))
                .collect(),
        ));
        let secs = start.elapsed().as_secs_f64();
        report.push(sample(
            format!("search_{t}_tasks"),
            t,
            tallies,
            secs,
            &Counters::read(ep, tags::SEARCH).since(&before),
        )?);
        pb.inc(1);
        if t == first {
            // The baseline, right after: the same key sequence against a local map.
            let seq: Vec<u32> = seqs.concat();
            report.push(dashmap_get(loaded, &slots_a, &seq));
        }

        pb.set_message(format!("UPDATE, {t} tasks"));
        let share = ops / t as u64;
        let before = Counters::read(ep, tags::UPDATE);
        let start = Instant::now();
        let tallies = dmkit_verbs::block_on(dmkit_verbs::join_all(
            (0..t)
                .map(|k| {
                    update_task(
                        &index, &store, &names, &slots_a, &slots_b, &current, k, t, share,
                    )
                })
                .collect(),
        ));
        let secs = start.elapsed().as_secs_f64();
        report.push(sample(
            format!("update_{t}_tasks"),
            t,
            tallies,
            secs,
            &Counters::read(ep, tags::UPDATE).since(&before),
        )?);
        pb.inc(1);

        pb.set_message(format!("INSERT, {t} tasks"));
        let fresh = next_new..next_new + ops as usize;
        next_new = fresh.end;
        let ptrs = store.put_all(ep, &names[fresh.clone()])?;
        let items: Vec<(usize, Slot)> = fresh
            .clone()
            .zip(&ptrs)
            .map(|(i, p)| Ok((i, index.slot_for(&names[i], *p).map_err(rt)?)))
            .collect::<Result<_, CliError>>()?;
        let before = Counters::read(ep, tags::INSERT);
        let start = Instant::now();
        let tallies = insert_tasks(&index, &store, &names, &items, t);
        let secs = start.elapsed().as_secs_f64();
        report.push(sample(
            format!("insert_{t}_tasks"),
            t,
            tallies,
            secs,
            &Counters::read(ep, tags::INSERT).since(&before),
        )?);
        pb.inc(1);
    }
    pb.finish_and_clear();
    report.config("subtables_at_end", index.subtables() as u64);
    report.config("global_depth_at_end", u64::from(index.global_depth()));

    let tput = |r: &Report, n: &str| r.result(n).map_or(f64::NAN, |m| m.ops_per_sec);
    let r = tput(&report, &format!("search_{first}_tasks")) / tput(&report, "dashmap_get");
    report.ratio("index_search_vs_dashmap", r, None);
    if max != first {
        for op in ["search", "update", "insert"] {
            let r = tput(&report, &format!("{op}_{max}_tasks"))
                / tput(&report, &format!("{op}_{first}_tasks"));
            report.ratio(&format!("index_{op}_{max}_vs_{first}_tasks"), r, None);
        }
    }
    report
        .finish(args.json.as_deref())
        .map_err(CliError::runtime)
}

/// The bench's key `i`.
fn key(i: u64) -> Vec<u8> {
    format!("bench-key-{i:010}").into_bytes()
}

/// The memory nodes: each has an index space and an object region.
struct Cluster {
    ep: Endpoint,
    spaces: Vec<IndexReplicaSpace>,
    objects: Vec<RegionDesc>,
    _sim: Option<SimCluster>,
    _tcp: Vec<TcpServer>,
}

impl Cluster {
    fn start(
        backend: Backend,
        nodes: usize,
        index_bytes: usize,
        object_bytes: usize,
    ) -> Result<Cluster, CliError> {
        let mut spaces = Vec::new();
        let mut objects = Vec::new();
        let mut mem = Vec::new();
        for id in 0..nodes as u16 {
            let node = Arc::new(MemoryNode::new(NodeId(id)));
            let backing = |bytes: usize| {
                DramBacking::try_new(bytes).map(Arc::new).map_err(|e| {
                    CliError::runtime(format!("cannot allocate {bytes} bytes of memory: {e}"))
                })
            };
            let index = node
                .register(backing(index_bytes)?, Access::ALL, None)
                .map_err(rt)?;
            objects.push(
                node.register(backing(object_bytes)?, Access::ALL, None)
                    .map_err(rt)?,
            );
            spaces.push(IndexReplicaSpace {
                region: index,
                offset: 0,
                len: index.len,
            });
            mem.push(node);
        }
        match backend {
            Backend::Tcp => {
                let mut servers = Vec::new();
                let mut addrs = Vec::new();
                for node in mem {
                    let id = node.id();
                    let s = TcpServer::start("127.0.0.1:0", node, TcpServerConfig::default())
                        .map_err(rt)?;
                    addrs.push((id, s.local_addr().to_string()));
                    servers.push(s);
                }
                let ep = Endpoint::connect(&TcpConnector::default(), &addrs).map_err(rt)?;
                Ok(Cluster {
                    ep,
                    spaces,
                    objects,
                    _sim: None,
                    _tcp: servers,
                })
            }
            _ => {
                let sim = SimCluster::new(SimConfig::default());
                for node in mem {
                    sim.add_node(node);
                }
                let ep = sim.endpoint(1).map_err(rt)?;
                Ok(Cluster {
                    ep,
                    spaces,
                    objects,
                    _sim: Some(sim),
                    _tcp: Vec::new(),
                })
            }
        }
    }
}

/// Where a key read is: (batch, operation in it).
/// Keys kept as objects in remote memory (`[len: u32][key]`, one 64-byte unit each),
/// bump-allocated round robin over one region per memory node: what the index's
/// [`KeyVerifier`](dmkit_kv_index::KeyVerifier) reads to tell which candidate slot holds a key.
struct KeyObjects {
    regions: Vec<RegionDesc>,
    next: Vec<AtomicU64>,
    rr: AtomicU64,
    /// Reads them back for the index (kv-index's general verifier, reads tagged `KEYS_TAG`).
    verifier: ObjectVerifier,
}

impl KeyObjects {
    fn new(regions: Vec<RegionDesc>) -> Self {
        let next = regions.iter().map(|_| AtomicU64::new(0)).collect();
        Self {
            verifier: ObjectVerifier::new(regions.clone(), key_of as fn(&[u8]) -> Option<&[u8]>)
                .with_tag(KEYS_TAG),
            regions,
            next,
            rr: AtomicU64::new(0),
        }
    }

    /// Writes one object per key, `PUT_CHUNK` keys per round trip; where each went.
    fn put_all(&self, ep: &Endpoint, keys: &[Vec<u8>]) -> Result<Vec<ObjPtr>, CliError> {
        let mut out = Vec::with_capacity(keys.len());
        for chunk in keys.chunks(PUT_CHUNK) {
            let mut batches: Vec<_> = self.regions.iter().map(|r| ep.batch(r.node)).collect();
            for k in chunk {
                let mut rec = (k.len() as u32).to_le_bytes().to_vec();
                rec.extend_from_slice(k);
                let units = (rec.len() as u64).div_ceil(OBJECT_ALIGN);
                let len_class = u8::try_from(units).map_err(|_| rt("a bench key is too long"))?;
                let n =
                    (self.rr.fetch_add(1, Ordering::Relaxed) % self.regions.len() as u64) as usize;
                let offset = self.next[n].fetch_add(units * OBJECT_ALIGN, Ordering::Relaxed);
                if offset + units * OBJECT_ALIGN > self.regions[n].len {
                    return Err(rt("the bench's key objects outgrew their region"));
                }
                batches[n].write(self.regions[n].at(offset), &rec);
                out.push(ObjPtr {
                    node: self.regions[n].node,
                    offset,
                    len_class,
                });
            }
            let batches = batches.into_iter().filter(|b| !b.is_empty()).collect();
            for r in ep.execute_many(KEYS_TAG, batches) {
                r.map_err(rt)?;
            }
        }
        Ok(out)
    }
}

/// A key object's key: `[len: u32][key]`.
fn key_of(rec: &[u8]) -> Option<&[u8]> {
    let len = u32::from_le_bytes(rec.get(..4)?.try_into().ok()?) as usize;
    rec.get(4..4usize.checked_add(len)?)
}

/// Round trips of a row: all of them, the operation's own, the key reads', the splits'.
#[derive(Debug, Clone, Copy)]
struct Counters {
    total: u64,
    op: TagStats,
    keys: TagStats,
    split: TagStats,
    directory: TagStats,
}

impl Counters {
    fn read(ep: &Endpoint, tag: &'static str) -> Counters {
        let s = ep.stats();
        Counters {
            total: s.total().round_trips,
            op: s.tag(tag),
            keys: s.tag(KEYS_TAG),
            split: s.tag(tags::SPLIT),
            directory: s.tag(tags::DIRECTORY),
        }
    }

    fn since(&self, before: &Counters) -> Counters {
        Counters {
            total: self.total - before.total,
            op: self.op.since(&before.op),
            keys: self.keys.since(&before.keys),
            split: self.split.since(&before.split),
            directory: self.directory.since(&before.directory),
        }
    }
}

/// One task's latencies.
struct Tally {
    hist: Histogram<u64>,
    ops: u64,
}

impl Tally {
    fn new() -> Self {
        Tally {
            hist: Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("histogram bounds"),
            ops: 0,
        }
    }

    fn record(&mut self, since: Instant) {
        let _ = self.hist.record((since.elapsed().as_nanos() as u64).max(1));
        self.ops += 1;
    }
}

/// A row from the tasks' tallies (the first failure, if any, fails the bench).
fn sample(
    name: String,
    tasks: usize,
    tallies: Vec<Result<Tally, CliError>>,
    secs: f64,
    c: &Counters,
) -> Result<Sample, CliError> {
    let mut hist = Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("histogram bounds");
    let mut ops = 0u64;
    for t in tallies {
        let t = t?;
        let _ = hist.add(&t.hist);
        ops += t.ops;
    }
    let per = |n: u64| n as f64 / ops.max(1) as f64;
    let mut m = Measurement {
        name,
        ops_per_sec: ops as f64 / secs.max(1e-9),
        p50_us: hist.value_at_quantile(0.5) as f64 / 1000.0,
        p99_us: hist.value_at_quantile(0.99) as f64 / 1000.0,
        rtts_per_op: per(c.total),
        modeled: false,
        extra: serde_json::Map::new(),
    };
    let round = |x: f64| Value::from((x * 1000.0).round() / 1000.0);
    m.extra.insert("tasks".into(), Value::from(tasks as u64));
    m.extra.insert("operations".into(), Value::from(ops));
    m.extra
        .insert("index_rtts_per_op".into(), round(per(c.op.round_trips)));
    m.extra.insert(
        "verifier_rtts_per_op".into(),
        round(per(c.keys.round_trips)),
    );
    m.extra
        .insert("split_rtts_per_op".into(), round(per(c.split.round_trips)));
    m.extra.insert(
        "directory_rtts_per_op".into(),
        round(per(c.directory.round_trips)),
    );
    Ok(Sample {
        measurement: m,
        hist,
    })
}

/// Each task's SEARCH keys: `ops` in all, uniformly at random over the loaded keys, seeded
/// by the task count (so the dashmap replays exactly the first row's).
fn search_sequences(keys: u64, ops: u64, tasks: usize) -> Vec<Vec<u32>> {
    let share = ops / tasks as u64;
    (0..tasks)
        .map(|k| {
            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(
                0x1DE7_0000 + (tasks as u64) * 1000 + k as u64,
            );
            (0..share)
                .map(|_| rng.random_range(0..keys) as u32)
                .collect()
        })
        .collect()
}

async fn search_task(
    index: &RaceIndex,
    store: &KeyObjects,
    names: &[Vec<u8>],
    slots_a: &[Slot],
    slots_b: &[Slot],
    seq: &[u32],
) -> Result<Tally, CliError> {
    let mut t = Tally::new();
    for &i in seq {
        let i = i as usize;
        let s0 = Instant::now();
        let found = index
            .search_async(&store.verifier, &names[i])
            .await
            .map_err(rt)?;
        t.record(s0);
        match found {
            Some(s) if s == slots_a[i] || s == slots_b[i] => {}
            other => {
                return Err(rt(format!(
                    "SEARCH of a loaded key found {other:?}: the index lost it"
                )));
            }
        }
    }
    Ok(t)
}

/// Task `k` of `tasks`: `count` UPDATEs of its own keys (those `≡ k mod tasks`), in turn,
/// each swapping the key's object between its two copies.
#[allow(clippy::too_many_arguments)]
async fn update_task(
    index: &RaceIndex,
    store: &KeyObjects,
    names: &[Vec<u8>],
    slots_a: &[Slot],
    slots_b: &[Slot],
    current: &[AtomicU8],
    k: usize,
    tasks: usize,
    count: u64,
) -> Result<Tally, CliError> {
    let mut t = Tally::new();
    let mine: Vec<usize> = (k..current.len()).step_by(tasks).collect();
    if mine.is_empty() {
        return Ok(t);
    }
    for n in 0..count as usize {
        let i = mine[n % mine.len()];
        let now = current[i].load(Ordering::Relaxed);
        let (old, new) = if now == 0 {
            (slots_a[i], slots_b[i])
        } else {
            (slots_b[i], slots_a[i])
        };
        let s0 = Instant::now();
        let out = index
            .update_hooked_async(&store.verifier, &names[i], new, &NoHooks)
            .await
            .map_err(rt)?;
        t.record(s0);
        match out {
            Some(m) if m.old == old && matches!(m.outcome, SnapshotOutcome::Won(_)) => {
                current[i].store(1 - now, Ordering::Relaxed);
            }
            other => {
                return Err(rt(format!(
                    "UPDATE of a loaded key without another writer ended {other:?}"
                )));
            }
        }
    }
    Ok(t)
}

/// INSERTs of `items` (key number, slot) by `tasks` loops, each its share, timed.
fn insert_tasks(
    index: &RaceIndex,
    store: &KeyObjects,
    names: &[Vec<u8>],
    items: &[(usize, Slot)],
    tasks: usize,
) -> Vec<Result<Tally, CliError>> {
    let share = items.len().div_ceil(tasks);
    dmkit_verbs::block_on(dmkit_verbs::join_all(
        items
            .chunks(share.max(1))
            .map(|part| insert_task(index, store, names, part))
            .collect(),
    ))
}

async fn insert_task(
    index: &RaceIndex,
    store: &KeyObjects,
    names: &[Vec<u8>],
    part: &[(usize, Slot)],
) -> Result<Tally, CliError> {
    let mut t = Tally::new();
    for &(i, slot) in part {
        let s0 = Instant::now();
        let out = index
            .insert_async(&store.verifier, &names[i], slot)
            .await
            .map_err(rt)?;
        t.record(s0);
        if let InsertOutcome::AlreadyExists { slot } = out {
            return Err(rt(format!(
                "INSERT of a new key found it present (slot {:#x})",
                slot.raw()
            )));
        }
    }
    Ok(t)
}

/// The untimed load: every item inserted, `tasks` at a time.
fn insert_all(
    index: &RaceIndex,
    store: &KeyObjects,
    names: &[Vec<u8>],
    items: &[(usize, Slot)],
    tasks: usize,
) -> Result<(), CliError> {
    for r in insert_tasks(index, store, names, items, tasks) {
        r?;
    }
    Ok(())
}

/// The baseline: `DashMap::get` of `seq` (indices into `keys`) on one thread, with every
/// loaded key mapped to its slot word. The rate comes from passes without a clock read per
/// operation (one costs about as much as the lookup), repeated whole for at least
/// [`DASHMAP_MIN_SECS`] (one pass can last a millisecond); the latencies from one more pass.
fn dashmap_get(keys: &[Vec<u8>], slots: &[Slot], seq: &[u32]) -> Sample {
    let map: DashMap<Vec<u8>, u64> = DashMap::new();
    for (k, s) in keys.iter().zip(slots) {
        map.insert(k.clone(), s.raw());
    }
    let get = |i: u32| map.get(keys[i as usize].as_slice()).map_or(0, |v| *v);
    let mut sink = 0u64;
    let mut ops = 0u64;
    let start = Instant::now();
    while ops == 0 || start.elapsed().as_secs_f64() < DASHMAP_MIN_SECS {
        for &i in seq {
            sink ^= get(std::hint::black_box(i));
        }
        ops += seq.len() as u64;
    }
    let secs = start.elapsed().as_secs_f64();
    let clock = super::Stopwatch::new();
    let mut hist = Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("histogram bounds");
    for &i in seq {
        let t0 = clock.raw();
        sink ^= get(std::hint::black_box(i));
        let _ = hist.record(clock.delta_as_nanos(t0, clock.raw()).max(1));
    }
    std::hint::black_box(sink);
    let mut m = Measurement {
        name: "dashmap_get".into(),
        ops_per_sec: ops as f64 / secs.max(1e-9),
        p50_us: hist.value_at_quantile(0.5) as f64 / 1000.0,
        p99_us: hist.value_at_quantile(0.99) as f64 / 1000.0,
        rtts_per_op: 0.0,
        modeled: false,
        extra: serde_json::Map::new(),
    };
    m.extra.insert("threads".into(), Value::from(1u64));
    m.extra.insert("operations".into(), Value::from(ops));
    Sample {
        measurement: m,
        hist,
    }
}
