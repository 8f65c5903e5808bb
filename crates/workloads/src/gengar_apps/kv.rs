//! A hash-table key-value store on the pool, driven by YCSB.
//!
//! - **Buckets** are objects of [`BUCKET_BYTES`]: a header (entry count, the address of the
//!   next bucket of the chain) and up to [`BUCKET_ENTRIES`] entries (key hash, object address).
//!   A key's chain starts at bucket `hash % buckets`; full buckets chain to overflow buckets.
//! - **Records** are objects `[key len u16][value len u32][key][value][checksum u64]`; the
//!   checksum (FNV-1a of the rest) lets a reader detect a read that raced a write and retry,
//!   as one-sided stores do.
//! - **Concurrency**: updates take the record's Gengar lock, write the whole record and unlock
//!   (unlock waits for the write's confirm); inserts lock the chain's first bucket. Reads take
//!   no lock. The bulk load partitions buckets between loaders and writes them whole.
//!
//! The check: every value a read returned must be the loaded value or one some worker wrote to
//! that key, and after the run each key must hold the last value one of the workers wrote (or
//! the loaded one if none did) — with one worker, exactly the value a sequential map holds.

use std::collections::{HashMap, HashSet};

use dmkit_gengar::{GengarClient, GlobalAddr};

use super::{AppError, AppResult, Deployment, Outcome, Runner, Worker, WriteMode, fnv};
use crate::ycsb::{Operation, Workload, WorkloadSpec};

/// Payload bytes of a bucket object (a 1 KiB slot with its header).
pub const BUCKET_BYTES: usize = 1016;
const HEADER: usize = 32;
const ENTRY: usize = 32;
/// Entries per bucket.
pub const BUCKET_ENTRIES: usize = (BUCKET_BYTES - HEADER) / ENTRY;

/// A YCSB run on the store.
#[derive(Debug, Clone)]
pub struct KvConfig {
    /// Standard workload `a`..`d`, `f` (`e` scans, which a hash table cannot serve).
    pub workload: char,
    pub records: u64,
    pub operations: u64,
    /// Average records per bucket chain at load.
    pub load_factor: usize,
    /// The run is cut into this many phases with a hot-object window between two.
    pub epochs: usize,
    pub seed: u64,
}

impl Default for KvConfig {
    fn default() -> Self {
        Self {
            workload: 'a',
            records: 20_000,
            operations: 40_000,
            load_factor: 16,
            epochs: 8,
            seed: 1,
        }
    }
}

fn encode_record(key: &str, value: &[u8]) -> Vec<u8> {
    let mut b = Vec::with_capacity(6 + key.len() + value.len() + 8);
    b.extend_from_slice(&(key.len() as u16).to_le_bytes());
    b.extend_from_slice(&(value.len() as u32).to_le_bytes());
    b.extend_from_slice(key.as_bytes());
    b.extend_from_slice(value);
    let sum = fnv(&b);
    b.extend_from_slice(&sum.to_le_bytes());
    b
}

/// `(key, value)` of a record, or `None` if it is torn (checksum mismatch).
fn decode_record(b: &[u8]) -> Option<(&[u8], &[u8])> {
    let klen = u16::from_le_bytes(b.get(..2)?.try_into().ok()?) as usize;
    let vlen = u32::from_le_bytes(b.get(2..6)?.try_into().ok()?) as usize;
    let end = 6 + klen + vlen;
    let sum = u64::from_le_bytes(b.get(end..end + 8)?.try_into().ok()?);
    (fnv(&b[..end]) == sum).then(|| (&b[6..6 + klen], &b[6 + klen..end]))
}

#[derive(Debug, Default, Clone)]
struct Bucket {
    next: Option<GlobalAddr>,
    entries: Vec<(u64, GlobalAddr)>,
}

fn encode_bucket(b: &Bucket) -> Vec<u8> {
    let mut v = vec![0u8; HEADER + b.entries.len() * ENTRY];
    v[..4].copy_from_slice(&(b.entries.len() as u32).to_le_bytes());
    if let Some(n) = b.next {
        v[8..26].copy_from_slice(&n.to_bytes());
    }
    for (i, (h, a)) in b.entries.iter().enumerate() {
        let at = HEADER + i * ENTRY;
        v[at..at + 8].copy_from_slice(&h.to_le_bytes());
        v[at + 8..at + 26].copy_from_slice(&a.to_bytes());
    }
    v
}

fn decode_bucket(v: &[u8]) -> AppResult<Bucket> {
    let bad = || AppError::Corrupt("a bucket".into());
    let n = u32::from_le_bytes(v.get(..4).ok_or_else(bad)?.try_into().expect("4")) as usize;
    if n > BUCKET_ENTRIES || v.len() < HEADER + n * ENTRY {
        return Err(bad());
    }
    let next = GlobalAddr::from_bytes(v[8..26].try_into().expect("18"));
    let entries = (0..n)
        .map(|i| {
            let at = HEADER + i * ENTRY;
            (
                u64::from_le_bytes(v[at..at + 8].try_into().expect("8")),
                GlobalAddr::from_bytes(v[at + 8..at + 26].try_into().expect("18")),
            )
        })
        .collect();
    Ok(Bucket {
        next: (next.size != 0).then_some(next),
        entries,
    })
}

/// The store: the bucket array's addresses (shared by every client).
#[derive(Debug, Clone)]
pub struct Store {
    pub buckets: Vec<GlobalAddr>,
}

impl Store {
    fn head(&self, h: u64) -> GlobalAddr {
        self.buckets[(h % self.buckets.len() as u64) as usize]
    }

    /// The record address of `key` (by its 64-bit hash) and its chain's bucket.
    fn locate(&self, c: &GengarClient, key: &str) -> AppResult<Option<GlobalAddr>> {
        let h = fnv(key.as_bytes());
        let mut at = Some(self.head(h));
        while let Some(b) = at {
            let bucket = decode_bucket(&c.read(b)?)?;
            if let Some((_, a)) = bucket.entries.iter().find(|(eh, _)| *eh == h) {
                return Ok(Some(*a));
            }
            at = bucket.next;
        }
        Ok(None)
    }

    /// Reads a record, retrying reads that raced a writer.
    fn read_record(c: &GengarClient, a: GlobalAddr, key: &str) -> AppResult<Vec<u8>> {
        for _ in 0..1000 {
            let b = c.read(a)?;
            if let Some((k, v)) = decode_record(&b) {
                if k != key.as_bytes() {
                    return Err(AppError::Corrupt(format!("record {a} is not `{key}`")));
                }
                return Ok(v.to_vec());
            }
            std::thread::yield_now();
        }
        Err(AppError::Corrupt(format!("record {a} stays torn")))
    }

    /// GET: two reads (bucket, record) plus the chain's overflow buckets.
    pub fn get(&self, c: &GengarClient, key: &str) -> AppResult<Option<Vec<u8>>> {
        match self.locate(c, key)? {
            Some(a) => Ok(Some(Self::read_record(c, a, key)?)),
            None => Ok(None),
        }
    }

    /// UPDATE of an existing key (same value size): lock the record, write it, unlock.
    pub fn update(&self, w: &Worker<'_>, key: &str, value: &[u8]) -> AppResult<()> {
        let a = self
            .locate(w.client, key)?
            .ok_or_else(|| AppError::Mismatch(format!("update of missing key `{key}`")))?;
        let rec = encode_record(key, value);
        if rec.len() != a.size as usize {
            return Err(AppError::Setup(format!(
                "update of `{key}` changes its size (not supported)"
            )));
        }
        w.client.lock(a)?;
        let r = w.write(a, 0, &rec);
        w.client.unlock(a)?;
        r
    }

    /// INSERT of a new key: write the record, then append it to the chain under the chain's
    /// lock (its first bucket's).
    pub fn insert(&self, w: &Worker<'_>, key: &str, value: &[u8]) -> AppResult<()> {
        let c = w.client;
        let rec = encode_record(key, value);
        let a = c.alloc(rec.len())?;
        w.write(a, 0, &rec)?;
        // The record must be complete before the entry publishes it.
        w.sync()?;
        let h = fnv(key.as_bytes());
        let head = self.head(h);
        c.lock(head)?;
        let r = (|| {
            let mut at = head;
            loop {
                let b = decode_bucket(&c.read(at)?)?;
                if b.entries.iter().any(|(eh, _)| *eh == h) {
                    return Err(AppError::Mismatch(format!(
                        "insert of existing key `{key}`"
                    )));
                }
                if b.entries.len() < BUCKET_ENTRIES {
                    // The entry first, then the count: a reader never sees a half entry.
                    let n = b.entries.len();
                    let mut e = vec![0u8; ENTRY];
                    e[..8].copy_from_slice(&h.to_le_bytes());
                    e[8..26].copy_from_slice(&a.to_bytes());
                    w.write(at, HEADER + n * ENTRY, &e)?;
                    w.write(at, 0, &((n + 1) as u32).to_le_bytes())?;
                    return Ok(());
                }
                match b.next {
                    Some(n) => at = n,
                    None => {
                        let nb = c.alloc(BUCKET_BYTES)?;
                        let img = encode_bucket(&Bucket {
                            next: None,
                            entries: vec![(h, a)],
                        });
                        w.write(nb, 0, &img)?;
                        w.write(at, 8, &nb.to_bytes())?;
                        return Ok(());
                    }
                }
            }
        })();
        c.unlock(head)?;
        r
    }
}

/// What one worker saw and did, for the check.
#[derive(Debug, Default)]
struct Log {
    /// (key, digest of the value read).
    reads: Vec<(String, u64)>,
    /// (key, digest of the value written), in this worker's order.
    writes: Vec<(String, u64)>,
}

fn digest(v: &[u8]) -> u64 {
    fnv(v)
}

/// Loads the records ("load"), runs the operations in epochs ("run") on `workers` clients and
/// checks every read and the final state.
pub fn run(d: &Deployment, workers: usize, mode: WriteMode, cfg: &KvConfig) -> AppResult<Outcome> {
    let spec = WorkloadSpec {
        record_count: cfg.records,
        operation_count: cfg.operations,
        ..WorkloadSpec::standard(cfg.workload).map_err(|e| AppError::Setup(e.to_string()))?
    };
    let mut workload = Workload::new(spec, cfg.seed).map_err(|e| AppError::Setup(e.to_string()))?;
    let records: Vec<(String, Vec<u8>)> = workload.load_records().collect();
    let nb = (records.len() / cfg.load_factor.max(1)).max(1);
    let mut runner = Runner::new(d, workers, mode)?;
    // Load: worker i owns buckets b ≡ i (mod n): it writes their records, then the buckets.
    let loaded = runner.phase("load", |w| {
        let c = w.client;
        let mine: Vec<usize> = (w.index..nb).step_by(w.workers).collect();
        let mut chains: HashMap<usize, Vec<(u64, GlobalAddr)>> = HashMap::new();
        for (k, v) in &records {
            let h = fnv(k.as_bytes());
            let b = (h % nb as u64) as usize;
            if b % w.workers != w.index {
                continue;
            }
            let rec = encode_record(k, v);
            let a = c.alloc(rec.len())?;
            w.write(a, 0, &rec)?;
            let chain = chains.entry(b).or_default();
            if chain.iter().any(|(eh, _)| *eh == h) {
                return Err(AppError::Setup(format!("64-bit hash collision at `{k}`")));
            }
            chain.push((h, a));
        }
        let mut heads = Vec::with_capacity(mine.len());
        for b in mine {
            let entries = chains.remove(&b).unwrap_or_default();
            let parts: Vec<&[(u64, GlobalAddr)]> = if entries.is_empty() {
                vec![&[]]
            } else {
                entries.chunks(BUCKET_ENTRIES).collect()
            };
            let addrs = parts
                .iter()
                .map(|_| Ok(c.alloc(BUCKET_BYTES)?))
                .collect::<AppResult<Vec<_>>>()?;
            for (i, p) in parts.iter().enumerate() {
                let img = encode_bucket(&Bucket {
                    next: addrs.get(i + 1).copied(),
                    entries: p.to_vec(),
                });
                w.write(addrs[i], 0, &img)?;
            }
            heads.push((b, addrs[0]));
        }
        Ok(heads)
    })?;
    let mut buckets = vec![None; nb];
    for (b, a) in loaded.into_iter().flatten() {
        buckets[b] = Some(a);
    }
    let store = Store {
        buckets: buckets
            .into_iter()
            .collect::<Option<_>>()
            .ok_or_else(|| AppError::Setup("a bucket was not loaded".into()))?,
    };
    // Run: each worker its own YCSB stream (shared insert counter), in epochs.
    let gens: Vec<parking_lot::Mutex<(Workload, Log)>> = workload
        .split(runner.clients.len())
        .into_iter()
        .map(|g| parking_lot::Mutex::new((g, Log::default())))
        .collect();
    let epochs = cfg.epochs.max(1);
    for e in 0..epochs {
        runner.phase("run", |w| {
            let share = super::share(cfg.operations as usize, e, epochs);
            let ops = super::share(share.len(), w.index, w.workers).len();
            let mut g = gens[w.index].lock();
            let (ops_gen, log) = &mut *g;
            for _ in 0..ops {
                match ops_gen.next_op() {
                    Operation::Read { key } => {
                        let v = store.get(w.client, &key)?.ok_or_else(|| {
                            AppError::Mismatch(format!("read of `{key}` found nothing"))
                        })?;
                        log.reads.push((key, digest(&v)));
                    }
                    Operation::Update { key, value } => {
                        store.update(w, &key, &value)?;
                        log.writes.push((key, digest(&value)));
                    }
                    Operation::ReadModifyWrite { key, value } => {
                        let v = store.get(w.client, &key)?.ok_or_else(|| {
                            AppError::Mismatch(format!("read of `{key}` found nothing"))
                        })?;
                        log.reads.push((key.clone(), digest(&v)));
                        store.update(w, &key, &value)?;
                        log.writes.push((key, digest(&value)));
                    }
                    Operation::Insert { key, value } => {
                        store.insert(w, &key, &value)?;
                        log.writes.push((key, digest(&value)));
                    }
                    Operation::Scan { .. } => {
                        return Err(AppError::Setup(
                            "a hash table does not serve scans (YCSB E)".into(),
                        ));
                    }
                }
            }
            ops_gen.acknowledge_insert();
            Ok(())
        })?;
    }
    // Check against the per-key history.
    let logs: Vec<Log> = gens.into_iter().map(|m| m.into_inner().1).collect();
    let mut legit: HashMap<&str, HashSet<u64>> = HashMap::new();
    let mut finals: HashMap<&str, HashSet<u64>> = HashMap::new();
    for (k, v) in &records {
        legit.entry(k).or_default().insert(digest(v));
    }
    for log in &logs {
        let mut last: HashMap<&str, u64> = HashMap::new();
        for (k, dg) in &log.writes {
            legit.entry(k).or_default().insert(*dg);
            last.insert(k, *dg);
        }
        for (k, dg) in last {
            finals.entry(k).or_default().insert(dg);
        }
    }
    for (k, v) in &records {
        finals
            .entry(k)
            .or_insert_with(|| HashSet::from([digest(v)]));
    }
    for log in &logs {
        for (k, dg) in &log.reads {
            if !legit.get(k.as_str()).is_some_and(|s| s.contains(dg)) {
                return Err(AppError::Mismatch(format!(
                    "a read of `{k}` returned a value nobody wrote"
                )));
            }
        }
    }
    let c = &runner.clients[0];
    for (k, want) in &finals {
        let v = store
            .get(c, k)?
            .ok_or_else(|| AppError::Mismatch(format!("`{k}` is missing after the run")))?;
        if !want.contains(&digest(&v)) {
            return Err(AppError::Mismatch(format!(
                "`{k}` holds a value that is not the last one any worker wrote"
            )));
        }
    }
    let mut out = runner.outcome(cfg.operations);
    out.notes.push(("buckets".into(), nb.to_string()));
    out.notes.push(("keys".into(), finals.len().to_string()));
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gengar_apps::DeploymentConfig;

    #[test]
    fn records_and_buckets_round_trip() {
        let r = encode_record("user1", b"value");
        assert_eq!(decode_record(&r), Some((&b"user1"[..], &b"value"[..])));
        let mut torn = r.clone();
        torn[8] ^= 1;
        assert_eq!(decode_record(&torn), None);
        let a = GlobalAddr {
            server: dmkit_verbs::NodeId(1),
            offset: 4096,
            generation: 3,
            size: 1016,
        };
        let b = Bucket {
            next: Some(a),
            entries: vec![(7, a), (9, a)],
        };
        let d = decode_bucket(&encode_bucket(&b)).unwrap();
        assert_eq!((d.next, d.entries), (b.next, b.entries));
        assert_eq!(BUCKET_ENTRIES, 30);
    }

    #[test]
    fn ycsb_on_the_store_checks_out() {
        let d = Deployment::sim(&DeploymentConfig::default(), false).unwrap();
        for (workload, mode, workers) in [
            ('a', WriteMode::Sync, 1),
            ('a', WriteMode::Proxied, 3),
            ('d', WriteMode::Proxied, 2),
        ] {
            let cfg = KvConfig {
                workload,
                records: 600,
                operations: 1500,
                load_factor: 40, // overflow buckets
                epochs: 2,
                ..Default::default()
            };
            run(&d, workers, mode, &cfg).unwrap();
        }
    }
}
