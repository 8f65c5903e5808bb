//! A MapReduce job on the pool: TeraGen-style generation of 100-byte records (a 10-byte key,
//! then words drawn from a zipfian vocabulary) into split objects, then WordCount — mappers
//! read splits and write per-reducer partitions of their counts plus a directory object,
//! reducers read every mapper's directory and their partitions and write sorted results plus a
//! result directory. Only directory addresses pass between phases outside the pool (the job
//! tracker's role); everything else is read from and written to Gengar objects.
//!
//! The counts read back from the pool are checked against WordCount over the same records
//! computed in one process.

use std::collections::{BTreeMap, HashMap};

use dmkit_gengar::{GengarClient, GlobalAddr};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::{
    AppError, AppResult, CHUNK_BYTES, Deployment, Outcome, Runner, Worker, WriteMode, fnv,
};
use crate::ycsb::Zipfian;

/// Bytes per record (TeraGen's).
pub const RECORD: usize = 100;
/// Records per split object.
pub const RECORDS_PER_SPLIT: usize = CHUNK_BYTES / RECORD;
/// Writers buffer this much before a write (like an output stream's packets).
const WRITE_BUF: usize = 4096;

/// A WordCount job.
#[derive(Debug, Clone)]
pub struct WordCountConfig {
    pub records: usize,
    pub vocabulary: usize,
    /// Skew of word popularity.
    pub zipf: f64,
    pub seed: u64,
}

impl Default for WordCountConfig {
    fn default() -> Self {
        Self {
            records: 100_000,
            vocabulary: 20_000,
            zipf: 0.9,
            seed: 7,
        }
    }
}

/// The words of the vocabulary: distinct lowercase strings (a letter giving the number of
/// base-26 digits, then the digits of the word's id, then a filler of 0 to 4 letters).
pub fn vocabulary(n: usize) -> Vec<String> {
    (0..n)
        .map(|i| {
            let mut digits = Vec::new();
            let mut id = i;
            loop {
                digits.push(b'a' + (id % 26) as u8);
                id /= 26;
                if id == 0 {
                    break;
                }
            }
            let mut w = vec![b'a' + digits.len() as u8];
            w.extend(digits);
            let filler = fnv(&(i as u64).to_le_bytes()) % 5;
            w.extend((0..filler).map(|k| b'e' + k as u8));
            String::from_utf8(w).expect("ascii")
        })
        .collect()
}

/// The generator of record `i` (deterministic for the seed).
fn record(cfg: &WordCountConfig, vocab: &[String], zipf: &Zipfian, i: usize) -> [u8; RECORD] {
    let mut z = zipf.clone();
    let mut rng = ChaCha8Rng::seed_from_u64(cfg.seed ^ (i as u64).wrapping_mul(0x9E37_79B9));
    let mut r = [b' '; RECORD];
    for b in &mut r[..10] {
        *b = b'A' + rng.random_range(0..26u8);
    }
    let mut at = 11;
    loop {
        let w = &vocab[z.next(&mut rng) as usize];
        if at + w.len() > RECORD - 1 {
            break;
        }
        r[at..at + w.len()].copy_from_slice(w.as_bytes());
        at += w.len() + 1;
    }
    r[RECORD - 1] = b'\n';
    r
}

/// Counts the words of records (the text after each record's key).
fn count_into<'a>(counts: &mut HashMap<&'a [u8], u64>, data: &'a [u8]) {
    for rec in data.chunks(RECORD) {
        for w in rec
            .get(10..)
            .unwrap_or(&[])
            .split(|b| *b == b' ' || *b == b'\n')
        {
            if !w.is_empty() {
                *counts.entry(w).or_default() += 1;
            }
        }
    }
}

/// WordCount over the same records in one process.
pub fn reference(cfg: &WordCountConfig) -> BTreeMap<String, u64> {
    let vocab = vocabulary(cfg.vocabulary);
    let zipf = Zipfian::new(0, cfg.vocabulary as i64 - 1, cfg.zipf);
    let mut all = Vec::with_capacity(cfg.records * RECORD);
    for i in 0..cfg.records {
        all.extend_from_slice(&record(cfg, &vocab, &zipf, i));
    }
    let mut counts = HashMap::new();
    count_into(&mut counts, &all);
    counts
        .into_iter()
        .map(|(k, v)| (String::from_utf8_lossy(k).into_owned(), v))
        .collect()
}

/// Encodes `(word, count)` entries into objects of at most [`CHUNK_BYTES`], written through
/// `w`; returns their addresses.
fn write_entries<'a>(
    w: &Worker<'_>,
    entries: impl Iterator<Item = (&'a [u8], u64)>,
) -> AppResult<Vec<GlobalAddr>> {
    let mut objects = Vec::new();
    let mut cur = Vec::new();
    let flush = |cur: &mut Vec<u8>, objects: &mut Vec<GlobalAddr>| -> AppResult<()> {
        if !cur.is_empty() {
            let a = w.client.alloc(cur.len())?;
            write_buffered(w, a, cur)?;
            objects.push(a);
            cur.clear();
        }
        Ok(())
    };
    for (word, count) in entries {
        if cur.len() + 1 + word.len() + 8 > CHUNK_BYTES {
            flush(&mut cur, &mut objects)?;
        }
        cur.push(word.len() as u8);
        cur.extend_from_slice(word);
        cur.extend_from_slice(&count.to_le_bytes());
    }
    flush(&mut cur, &mut objects)?;
    Ok(objects)
}

fn write_buffered(w: &Worker<'_>, a: GlobalAddr, data: &[u8]) -> AppResult<()> {
    for (i, piece) in data.chunks(WRITE_BUF).enumerate() {
        w.write(a, i * WRITE_BUF, piece)?;
    }
    Ok(())
}

fn read_entries(c: &GengarClient, a: GlobalAddr, out: &mut HashMap<Vec<u8>, u64>) -> AppResult<()> {
    let b = c.read(a)?;
    let mut at = 0;
    while at < b.len() {
        let len = b[at] as usize;
        let end = at + 1 + len + 8;
        if len == 0 || end > b.len() {
            return Err(AppError::Corrupt(format!("a count entry in {a}")));
        }
        let word = b[at + 1..at + 1 + len].to_vec();
        let n = u64::from_le_bytes(b[at + 1 + len..end].try_into().expect("8 bytes"));
        *out.entry(word).or_default() += n;
        at = end;
    }
    Ok(())
}

/// A directory object: `(tag, address)` entries.
fn write_directory(w: &Worker<'_>, entries: &[(u32, GlobalAddr)]) -> AppResult<GlobalAddr> {
    let mut b = Vec::with_capacity(entries.len() * 22);
    for (t, a) in entries {
        b.extend_from_slice(&t.to_le_bytes());
        b.extend_from_slice(&a.to_bytes());
    }
    if b.is_empty() {
        b.extend_from_slice(&[0xff; 4]);
    }
    let a = w.client.alloc(b.len())?;
    write_buffered(w, a, &b)?;
    Ok(a)
}

fn read_directory(c: &GengarClient, a: GlobalAddr) -> AppResult<Vec<(u32, GlobalAddr)>> {
    let b = c.read(a)?;
    if b.len() == 4 {
        return Ok(Vec::new());
    }
    if b.len() % 22 != 0 {
        return Err(AppError::Corrupt(format!("directory {a}")));
    }
    Ok(b.chunks_exact(22)
        .map(|e| {
            let t = u32::from_le_bytes(e[..4].try_into().expect("4 bytes"));
            (
                t,
                GlobalAddr::from_bytes(e[4..].try_into().expect("18 bytes")),
            )
        })
        .collect())
}

/// TeraGen ("generate"), map and reduce ("job") on `workers` clients; checks the counts.
pub fn run(
    d: &Deployment,
    workers: usize,
    mode: WriteMode,
    cfg: &WordCountConfig,
) -> AppResult<Outcome> {
    let vocab = vocabulary(cfg.vocabulary);
    let zipf = Zipfian::new(0, cfg.vocabulary as i64 - 1, cfg.zipf);
    let splits = cfg.records.div_ceil(RECORDS_PER_SPLIT);
    let mut runner = Runner::new(d, workers, mode)?;
    // TeraGen: worker i generates splits i, i + n, ...
    let generated = runner.phase("generate", |w| {
        let mut mine = Vec::new();
        for s in (w.index..splits).step_by(w.workers) {
            let recs = s * RECORDS_PER_SPLIT..((s + 1) * RECORDS_PER_SPLIT).min(cfg.records);
            let a = w.client.alloc(recs.len() * RECORD)?;
            let mut buf = Vec::with_capacity(WRITE_BUF);
            let mut at = 0;
            for i in recs {
                buf.extend_from_slice(&record(cfg, &vocab, &zipf, i));
                if buf.len() + RECORD > WRITE_BUF {
                    w.write(a, at, &buf)?;
                    at += buf.len();
                    buf.clear();
                }
            }
            if !buf.is_empty() {
                w.write(a, at, &buf)?;
            }
            mine.push((s, a));
        }
        Ok(mine)
    })?;
    let mut split_addrs = vec![None; splits];
    for (s, a) in generated.into_iter().flatten() {
        split_addrs[s] = Some(a);
    }
    let split_addrs: Vec<GlobalAddr> = split_addrs
        .into_iter()
        .collect::<Option<_>>()
        .ok_or_else(|| AppError::Setup("a split was not generated".into()))?;
    let reducers = runner.clients.len();
    // Map: count the words of my splits, partition by word hash, write partitions and a
    // directory of (reducer, object).
    let map_dirs = runner.phase("job-map", |w| {
        let mut counts: HashMap<&[u8], u64> = HashMap::new();
        let data: Vec<Vec<u8>> = (w.index..splits)
            .step_by(w.workers)
            .map(|s| Ok(w.client.read(split_addrs[s])?))
            .collect::<AppResult<_>>()?;
        for d in &data {
            count_into(&mut counts, d);
        }
        let mut parts: Vec<Vec<(&[u8], u64)>> = vec![Vec::new(); reducers];
        for (word, n) in counts {
            parts[(fnv(word) % reducers as u64) as usize].push((word, n));
        }
        let mut dir = Vec::new();
        for (r, p) in parts.into_iter().enumerate() {
            for a in write_entries(w, p.into_iter())? {
                dir.push((r as u32, a));
            }
        }
        write_directory(w, &dir)
    })?;
    // Reduce: every reducer reads every mapper's directory and its partitions.
    let result_dirs = runner.phase("job-reduce", |w| {
        let mut counts: HashMap<Vec<u8>, u64> = HashMap::new();
        for m in &map_dirs {
            for (r, a) in read_directory(w.client, *m)? {
                if r as usize == w.index {
                    read_entries(w.client, a, &mut counts)?;
                }
            }
        }
        let mut sorted: Vec<_> = counts.iter().map(|(k, v)| (k.as_slice(), *v)).collect();
        sorted.sort_unstable();
        let objects = write_entries(w, sorted.into_iter())?;
        let dir: Vec<_> = objects.into_iter().map(|a| (w.index as u32, a)).collect();
        write_directory(w, &dir)
    })?;
    // Read the results back from the pool and compare.
    let c = &runner.clients[0];
    let mut got: HashMap<Vec<u8>, u64> = HashMap::new();
    for rd in &result_dirs {
        for (_, a) in read_directory(c, *rd)? {
            read_entries(c, a, &mut got)?;
        }
    }
    let got: BTreeMap<String, u64> = got
        .into_iter()
        .map(|(k, v)| (String::from_utf8_lossy(&k).into_owned(), v))
        .collect();
    let want = reference(cfg);
    if got != want {
        let diff = want
            .iter()
            .find(|(k, v)| got.get(*k) != Some(v))
            .map(|(k, v)| format!("`{k}`: {:?} in the pool, {v} in one process", got.get(k)))
            .unwrap_or_else(|| format!("{} words in the pool, {} expected", got.len(), want.len()));
        return Err(AppError::Mismatch(format!("WordCount: {diff}")));
    }
    let mut out = runner.outcome(cfg.records as u64);
    out.notes.push(("splits".into(), splits.to_string()));
    out.notes
        .push(("distinct_words".into(), want.len().to_string()));
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gengar_apps::DeploymentConfig;

    #[test]
    fn vocabulary_words_are_distinct() {
        let v = vocabulary(5000);
        let set: std::collections::HashSet<_> = v.iter().collect();
        assert_eq!(set.len(), v.len());
        assert!(v.iter().all(|w| w.len() < 255));
    }

    #[test]
    fn wordcount_in_the_pool_matches_one_process() {
        let d = Deployment::sim(&DeploymentConfig::default(), false).unwrap();
        let cfg = WordCountConfig {
            records: 3000,
            vocabulary: 500,
            ..Default::default()
        };
        for mode in [WriteMode::Sync, WriteMode::Proxied] {
            let out = run(&d, 3, mode, &cfg).unwrap();
            assert_eq!(out.ops, 3000);
            let total: u64 = reference(&cfg).values().sum();
            assert!(total > 3000 * 5);
        }
    }
}
