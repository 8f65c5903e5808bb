//! Per-tag accounting of verbs, bytes and round trips. Upper layers tag each operation
//! ("search", "insert", ...) so they can report "round trips per SEARCH" from code and export
//! the same numbers through the `metrics` facade.

use rustc_hash::FxHashMap as HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::RwLock;

use crate::batch::Op;
use crate::node::OpKind;

/// A caller-chosen operation tag.
pub type Tag = &'static str;

#[derive(Debug)]
struct Counter {
    value: AtomicU64,
    metric: metrics::Counter,
}

impl Counter {
    fn new(name: &'static str, tag: Tag, extra: Option<(&'static str, &'static str)>) -> Self {
        let metric = match extra {
            Some((k, v)) => metrics::counter!(name, "tag" => tag, k => v),
            None => metrics::counter!(name, "tag" => tag),
        };
        Self {
            value: AtomicU64::new(0),
            metric,
        }
    }

    fn add(&self, n: u64) {
        if n > 0 {
            self.value.fetch_add(n, Ordering::Relaxed);
            self.metric.increment(n);
        }
    }

    fn get(&self) -> u64 {
        self.value.load(Ordering::Relaxed)
    }
}

#[derive(Debug)]
struct TagCounters {
    round_trips: Counter,
    reads: Counter,
    writes: Counter,
    cas: Counter,
    faa: Counter,
    rpcs: Counter,
    bytes_out: Counter,
    bytes_in: Counter,
}

impl TagCounters {
    fn new(tag: Tag) -> Self {
        let verb = |v| Counter::new("dmkit_verbs_verbs_total", tag, Some(("verb", v)));
        Self {
            round_trips: Counter::new("dmkit_verbs_round_trips_total", tag, None),
            reads: verb("read"),
            writes: verb("write"),
            cas: verb("cas"),
            faa: verb("faa"),
            rpcs: verb("rpc"),
            bytes_out: Counter::new("dmkit_verbs_bytes_total", tag, Some(("direction", "out"))),
            bytes_in: Counter::new("dmkit_verbs_bytes_total", tag, Some(("direction", "in"))),
        }
    }
}

/// What one tag has done so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TagStats {
    /// Round trips: each batch, group of parallel batches or RPC awaited counts one.
    pub round_trips: u64,
    pub reads: u64,
    pub writes: u64,
    pub cas: u64,
    pub faa: u64,
    pub rpcs: u64,
    /// Bytes sent to memory nodes (write payloads, atomics' operands, RPC requests).
    pub bytes_out: u64,
    /// Bytes brought back (read payloads, atomics' old values, RPC replies).
    pub bytes_in: u64,
}

impl TagStats {
    /// One-sided verbs (RPCs not included).
    pub fn verbs(&self) -> u64 {
        self.reads + self.writes + self.cas + self.faa
    }

    /// `self - earlier`, for measuring one operation (zero where `earlier` is larger).
    pub fn since(&self, earlier: &TagStats) -> TagStats {
        TagStats {
            round_trips: self.round_trips.saturating_sub(earlier.round_trips),
            reads: self.reads.saturating_sub(earlier.reads),
            writes: self.writes.saturating_sub(earlier.writes),
            cas: self.cas.saturating_sub(earlier.cas),
            faa: self.faa.saturating_sub(earlier.faa),
            rpcs: self.rpcs.saturating_sub(earlier.rpcs),
            bytes_out: self.bytes_out.saturating_sub(earlier.bytes_out),
            bytes_in: self.bytes_in.saturating_sub(earlier.bytes_in),
        }
    }
}

/// The accounting of one endpoint (shared by its clones).
#[derive(Debug, Default)]
pub struct Stats {
    tags: RwLock<HashMap<Tag, Arc<TagCounters>>>,
}

impl Stats {
    /// Runs `f` on the tag's counters (under the read lock: no reference count to bump on
    /// the verbs' hot path).
    fn with<R>(&self, tag: Tag, f: impl FnOnce(&TagCounters) -> R) -> R {
        if let Some(c) = self.tags.read().get(tag) {
            return f(c);
        }
        let c = self
            .tags
            .write()
            .entry(tag)
            .or_insert_with(|| Arc::new(TagCounters::new(tag)))
            .clone();
        f(&c)
    }

    pub(crate) fn round_trip(&self, tag: Tag) {
        self.with(tag, |c| c.round_trips.add(1));
    }

    /// Counts a batch's verbs, and `round_trips` with them.
    pub(crate) fn ops(&self, tag: Tag, ops: &[Op], round_trips: u64) {
        self.with(tag, |c| Self::count_ops(c, ops, round_trips));
    }

    fn count_ops(c: &TagCounters, ops: &[Op], round_trips: u64) {
        if round_trips > 0 {
            c.round_trips.add(round_trips);
        }
        let (mut r, mut w, mut cas, mut faa, mut out, mut inb) = (0, 0, 0, 0, 0u64, 0u64);
        for op in ops {
            match op.kind {
                OpKind::Read => {
                    r += 1;
                    inb += u64::from(op.len);
                }
                OpKind::Write { .. } => {
                    w += 1;
                    out += u64::from(op.len);
                }
                OpKind::Cas { .. } => {
                    cas += 1;
                    out += 16;
                    inb += 8;
                }
                OpKind::Faa { .. } => {
                    faa += 1;
                    out += 8;
                    inb += 8;
                }
            }
        }
        c.reads.add(r);
        c.writes.add(w);
        c.cas.add(cas);
        c.faa.add(faa);
        c.bytes_out.add(out);
        c.bytes_in.add(inb);
    }

    pub(crate) fn rpc(&self, tag: Tag, out: usize) {
        self.with(tag, |c| {
            c.rpcs.add(1);
            c.bytes_out.add(out as u64);
        });
    }

    pub(crate) fn rpc_reply(&self, tag: Tag, inb: usize) {
        self.with(tag, |c| c.bytes_in.add(inb as u64));
    }

    /// The counts of one tag (zero if it was never used).
    pub fn tag(&self, tag: &str) -> TagStats {
        match self.tags.read().get(tag) {
            Some(c) => Self::snap(c),
            None => TagStats::default(),
        }
    }

    fn snap(c: &TagCounters) -> TagStats {
        TagStats {
            round_trips: c.round_trips.get(),
            reads: c.reads.get(),
            writes: c.writes.get(),
            cas: c.cas.get(),
            faa: c.faa.get(),
            rpcs: c.rpcs.get(),
            bytes_out: c.bytes_out.get(),
            bytes_in: c.bytes_in.get(),
        }
    }

    /// Every tag's counts, sorted by tag.
    pub fn snapshot(&self) -> Vec<(Tag, TagStats)> {
        let mut v: Vec<_> = self
            .tags
            .read()
            .iter()
            .map(|(t, c)| (*t, Self::snap(c)))
            .collect();
        v.sort_by_key(|(t, _)| *t);
        v
    }

    /// The sum over all tags.
    pub fn total(&self) -> TagStats {
        self.snapshot()
            .into_iter()
            .fold(TagStats::default(), |mut a, (_, s)| {
                a.round_trips += s.round_trips;
                a.reads += s.reads;
                a.writes += s.writes;
                a.cas += s.cas;
                a.faa += s.faa;
                a.rpcs += s.rpcs;
                a.bytes_out += s.bytes_out;
                a.bytes_in += s.bytes_in;
                a
            })
    }
}
