//! The client: a cached directory, bucket reads, and the four operations.

use std::time::{Duration, Instant};

use dmkit_verbs::{Batch, Endpoint, NodeId, RemoteAddr, Tag};
use parking_lot::RwLock;

use crate::error::{Error, Result};
use crate::hooks::{NoHooks, WriteHooks};
use crate::layout::{
    COMBINED_BYTES, DIR_OFFSET, DirEntry, HDR_CAPACITY, HDR_GLOBAL_DEPTH, HDR_PARAMS, HDR_SEED,
    HEADER_WORD, IndexReplicaSpace, KeyHash, Layout, MAGIC, SLOTS_PER_BUCKET, SlotPos, VERSION,
    check_spaces, combined_first_bucket,
};
use crate::slot::{Header, Slot, is_empty_word, is_frozen, thaw, tombstone, tombstone_by};
use crate::snapshot::{RawOutcome, Rule};
use crate::verifier::KeyVerifier;

/// Tags under which the index accounts its round trips ([`Endpoint::stats`]).
pub mod tags {
    /// SEARCH: bucket reads (and re-reads while a split is in progress).
    pub const SEARCH: &str = "kv_index.search";
    /// INSERT: bucket read, SNAPSHOT round (backups, repair, primary), loser waits.
    pub const INSERT: &str = "kv_index.insert";
    /// UPDATE: as INSERT.
    pub const UPDATE: &str = "kv_index.update";
    /// DELETE: as INSERT.
    pub const DELETE: &str = "kv_index.delete";
    /// Directory reads (cache misses: a stale cached directory detected from bucket headers).
    pub const DIRECTORY: &str = "kv_index.directory";
    /// Formatting the index (once, at cluster initialisation).
    pub const FORMAT: &str = "kv_index.format";
    /// Everything a split does (lock, allocation, freeze, copies, directory writes).
    pub const SPLIT: &str = "kv_index.split";
    /// Scans: the directory and one subtable per step.
    pub const SCAN: &str = "kv_index.scan";
}

/// Settings fixed when the index is formatted.
#[derive(Debug, Clone)]
pub struct IndexConfig {
    /// log2 of the bucket groups per subtable (each group is 3 buckets of 64 bytes).
    pub groups_per_subtable_log2: u8,
    /// The deepest the directory may grow (it has `2^max_global_depth` entries).
    pub max_global_depth: u8,
    /// Seed of the xxh64 hashes.
    pub seed: u64,
}

impl Default for IndexConfig {
    fn default() -> Self {
        Self {
            groups_per_subtable_log2: 10,
            max_global_depth: 12,
            seed: 0x00D3_C0DE_5EED,
        }
    }
}

/// How an UPDATE or DELETE ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SnapshotOutcome {
    /// This writer is the last writer; the primary now holds its value.
    Won(Rule),
    /// Another writer of the same round won; the primary now holds `now` (`None`: empty).
    Lost { now: Option<Slot> },
}

/// The result of an UPDATE or DELETE that found its key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Modified {
    /// The slot value this operation replaced (what FUSEE's embedded log records).
    pub old: Slot,
    /// Where the key's slot is.
    pub pos: SlotPos,
    pub outcome: SnapshotOutcome,
}

/// The result of an INSERT.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InsertOutcome {
    /// The key was absent and now maps to the new slot.
    Inserted { pos: SlotPos, rule: Rule },
    /// The key is present (with this slot); nothing was written.
    AlreadyExists { slot: Slot },
}

/// Bounded exponential backoff for the waits of the protocol.
#[derive(Debug)]
pub(crate) struct Backoff {
    limit: Duration,
    /// Set at the first pause, not at creation: an operation that never waits reads no
    /// clock (a clock read is a system call on some virtual machines' clock sources).
    deadline: Option<Instant>,
    /// The first pause, kept across [`Backoff::restart`].
    first: Option<Instant>,
    step: u32,
}

impl Backoff {
    pub fn new(limit: Duration) -> Self {
        Self {
            limit,
            deadline: None,
            first: None,
            step: 0,
        }
    }

    /// Waits from the start again (a new deadline at the next pause); [`Backoff::waited`]
    /// still counts from the first pause.
    pub fn restart(&mut self) {
        self.deadline = None;
        self.step = 0;
    }

    /// Time since the first pause (zero before it).
    pub fn waited(&self) -> Duration {
        self.first.map_or(Duration::ZERO, |t| t.elapsed())
    }

    /// The next wait: `None` once the deadline has passed, `Some(None)` to yield the CPU,
    /// `Some(Some(d))` to sleep `d` (a little longer each time).
    fn next_wait(&mut self) -> Option<Option<Duration>> {
        let now = Instant::now();
        self.first.get_or_insert(now);
        if now >= *self.deadline.get_or_insert(now + self.limit) {
            return None;
        }
        let step = self.step;
        self.step += 1;
        Some((step >= 4).then(|| Duration::from_micros(1u64 << (step - 4).min(10))))
    }

    /// Waits a little longer each time; false once the deadline has passed.
    pub fn pause(&mut self) -> bool {
        match self.next_wait() {
            None => false,
            Some(None) => {
                std::thread::yield_now();
                true
            }
            Some(Some(d)) => {
                std::thread::sleep(d);
                true
            }
        }
    }

    /// [`Backoff::pause`] for async operations: the longer waits do not hold the thread.
    pub async fn pause_async(&mut self) -> bool {
        match self.next_wait() {
            None => false,
            Some(None) => {
                std::thread::yield_now();
                true
            }
            Some(Some(d)) => {
                dmkit_verbs::sleep(d).await;
                true
            }
        }
    }
}

#[derive(Debug, Clone)]
pub(crate) struct DirCache {
    pub global_depth: u8,
    pub entries: Vec<DirEntry>,
}

/// A client of one RACE index: its replicas, its cached directory, its endpoint.
///
/// Operations are `&self` and may run from many threads; each client task would normally
/// open its own (the directory cache is per handle and cheap to refresh).
#[derive(Debug)]
pub struct RaceIndex {
    pub(crate) ep: Endpoint,
    pub(crate) spaces: Vec<IndexReplicaSpace>,
    pub(crate) layout: Layout,
    pub(crate) dir: RwLock<DirCache>,
    pub(crate) wait_timeout: Duration,
    /// `dmkit_kv_index_snapshot_rounds_total` by outcome.
    pub(crate) rounds: crate::snapshot::RoundCounters,
}

/// Two combined buckets of a key, as read from the primary.
#[derive(Debug)]
pub(crate) struct View {
    pub subtable: u32,
    /// 16 words per combined bucket: slots 0..7, header, slots 0..7, header.
    pub words: [[u64; 16]; 2],
    pub splitting: bool,
    /// The deepest local depth among the headers read.
    pub depth: u8,
}

impl View {
    fn pos(&self, kh: &KeyHash, c: usize, w: usize) -> SlotPos {
        let (g, side) = kh.cands[c];
        SlotPos {
            subtable: self.subtable,
            bucket: combined_first_bucket(g, side) + (w / 8) as u64,
            slot: (w % 8) as u8,
        }
    }

    /// Every slot word with its position (headers excluded).
    pub(crate) fn slots<'a>(
        &'a self,
        kh: &'a KeyHash,
    ) -> impl Iterator<Item = (SlotPos, u64)> + 'a {
        (0..2).flat_map(move |c| {
            (0..16)
                .filter(|w| w % 8 != HEADER_WORD)
                .map(move |w| (self.pos(kh, c, w), self.words[c][w]))
        })
    }

    /// Non-empty slots whose fingerprint matches, frozen or not.
    pub(crate) fn candidates(&self, kh: &KeyHash) -> Result<Vec<(SlotPos, u64, Slot)>> {
        let mut v = Vec::new();
        for (pos, raw) in self.slots(kh) {
            if let Some(s) = Slot::from_raw(raw)? {
                if s.fingerprint() == kh.fp && !v.iter().any(|(p, _, _)| *p == pos) {
                    v.push((pos, raw, s));
                }
            }
        }
        Ok(v)
    }

    /// Whether either combined bucket has an empty slot.
    pub fn has_free_slot(&self) -> bool {
        self.words
            .iter()
            .any(|c| (0..16).any(|w| w % 8 != HEADER_WORD && is_empty_word(c[w])))
    }

    /// The first empty slot of the combined bucket with more empty slots (main bucket first),
    /// with the word it holds (0 or a tombstone: what an INSERT's round expects).
    fn free_slot(&self, kh: &KeyHash) -> Option<(SlotPos, u64)> {
        let free = |c: usize| {
            (0..16)
                .filter(|w| w % 8 != HEADER_WORD && is_empty_word(self.words[c][*w]))
                .collect::<Vec<_>>()
        };
        let (f0, f1) = (free(0), free(1));
        let (c, f) = if f1.len() > f0.len() {
            (1, f1)
        } else {
            (0, f0)
        };
        let (_, side) = kh.cands[c];
        // The main bucket is the first of the pair for side 0 and the second for side 1:
        // fill it before the shared overflow bucket.
        f.into_iter()
            .min_by_key(|&w| (w / 8 != usize::from(side), w))
            .map(|w| (self.pos(kh, c, w), self.words[c][w]))
    }
}

impl RaceIndex {
    /// Formats a fresh index over `spaces` (primary first, then the backups): one subtable,
    /// global depth 0. What FUSEE's master runs once at cluster initialisation.
    pub fn format(
        ep: &Endpoint,
        config: &IndexConfig,
        spaces: &[IndexReplicaSpace],
    ) -> Result<RaceIndex> {
        check_spaces(spaces)?;
        if !(1..=20).contains(&config.groups_per_subtable_log2) {
            return Err(Error::InvalidConfig(format!(
                "groups_per_subtable_log2 {} is outside 1..=20",
                config.groups_per_subtable_log2
            )));
        }
        if config.max_global_depth > 24 {
            return Err(Error::InvalidConfig(format!(
                "max_global_depth {} is above 24",
                config.max_global_depth
            )));
        }
        let mut layout = Layout {
            groups_log2: config.groups_per_subtable_log2,
            max_depth: config.max_global_depth,
            replicas: spaces.len() as u8,
            seed: config.seed,
            capacity: 0,
        };
        layout.capacity = spaces
            .iter()
            .map(|s| layout.capacity_of(s.len))
            .min()
            .unwrap_or(0)
            .min(u64::from(u32::MAX));
        if layout.capacity == 0 {
            return Err(Error::InvalidConfig(format!(
                "a replica space holds no subtable: need at least {} bytes",
                layout.area_offset() + layout.subtable_bytes()
            )));
        }
        let image = subtable_image(&layout, Header::normal(0, 0), &[], None);
        let mut hdr = Vec::with_capacity(48);
        for w in [layout.params_word(), layout.seed, 0, 1, 0, layout.capacity] {
            hdr.extend_from_slice(&w.to_le_bytes());
        }
        let batches = spaces
            .iter()
            .map(|s| {
                let mut b = ep.batch(s.region.node);
                b.write_durable(s.at(layout.subtable_off(0)), &image);
                b.write_durable(
                    s.at(layout.dir_off(0)),
                    &DirEntry {
                        subtable: 0,
                        local_depth: 0,
                    }
                    .encode()
                    .to_le_bytes(),
                );
                b.write_durable(s.at(HDR_PARAMS), &hdr);
                // The magic goes last: a space is formatted only once everything is there.
                b.write_durable(s.at(0), &MAGIC.to_le_bytes());
                b
            })
            .collect();
        for r in ep.execute_many(tags::FORMAT, batches) {
            r?;
        }
        metrics::gauge!("dmkit_kv_index_subtables").set(1.0);
        Self::open(ep, spaces)
    }

    /// Opens a formatted index (a client joining the cluster): checks every replica's header
    /// and reads the directory from the primary.
    pub fn open(ep: &Endpoint, spaces: &[IndexReplicaSpace]) -> Result<RaceIndex> {
        check_spaces(spaces)?;
        let batches: Vec<_> = spaces
            .iter()
            .map(|s| {
                let mut b = ep.batch(s.region.node);
                let i = b.read(s.at(0), 64);
                (b, i)
            })
            .collect();
        let (batches, idx): (Vec<_>, Vec<_>) = batches.into_iter().unzip();
        let mut layout = None;
        let results = ep.execute_many(tags::DIRECTORY, batches);
        // A replica that does not answer does not stop the open when another does: the
        // operations that need it fail with its error (a SEARCH needs only the primary).
        let answered = results.iter().any(|r| r.is_ok());
        for (k, r) in results.into_iter().enumerate() {
            let r = match r {
                Ok(r) => r,
                Err(e) if answered => {
                    tracing::debug!(node = %spaces[k].region.node, error = %e, "index replica does not answer");
                    continue;
                }
                Err(e) => return Err(e.into()),
            };
            let node = spaces[k].region.node;
            let w = words(r.read(idx[k]));
            let bad = |reason: String| Error::NotFormatted { node, reason };
            if w.len() < 8 || w[0] != MAGIC {
                return Err(bad("bad magic".into()));
            }
            let params = w[1];
            if params >> 24 != VERSION {
                return Err(bad(format!("layout version {}", params >> 24)));
            }
            let l = Layout {
                groups_log2: params as u8,
                max_depth: (params >> 8) as u8,
                replicas: (params >> 16) as u8,
                seed: w[(HDR_SEED / 8) as usize],
                capacity: w[(HDR_CAPACITY / 8) as usize],
            };
            // Fewer is a degraded index (a replica's node failed; see `repair`).
            if usize::from(l.replicas) < spaces.len() {
                return Err(bad(format!(
                    "formatted for {} replicas, opened with {}",
                    l.replicas,
                    spaces.len()
                )));
            }
            if !(1..=20).contains(&l.groups_log2)
                || l.max_depth > 24
                || l.capacity == 0
                || l.capacity > l.capacity_of(spaces[k].len)
            {
                return Err(bad(format!("implausible parameters {params:#x}")));
            }
            match layout {
                None => layout = Some(l),
                Some(p) if p == l => {}
                Some(_) => return Err(bad("replica headers disagree with the primary".into())),
            }
        }
        let layout = layout.ok_or_else(|| Error::InvalidConfig("no replica spaces".into()))?;
        let idx = RaceIndex {
            ep: ep.clone(),
            spaces: spaces.to_vec(),
            layout,
            dir: RwLock::new(DirCache {
                global_depth: 0,
                entries: Vec::new(),
            }),
            wait_timeout: Duration::from_secs(10),
            rounds: Default::default(),
        };
        idx.refresh_directory()?;
        Ok(idx)
    }

    /// Sets how long the protocol's waits may last (a SNAPSHOT loser for the primary to
    /// change, a writer for a split to finish) before they fail. Default 10 s.
    pub fn with_wait_timeout(mut self, d: Duration) -> Self {
        self.wait_timeout = d;
        self
    }

    /// The endpoint this client uses.
    pub fn endpoint(&self) -> &Endpoint {
        &self.ep
    }

    /// Number of index replicas (r).
    pub fn replicas(&self) -> usize {
        self.spaces.len()
    }

    /// The global depth of the cached directory.
    pub fn global_depth(&self) -> u8 {
        self.dir.read().global_depth
    }

    /// Distinct subtables the cached directory names.
    pub fn subtables(&self) -> usize {
        let d = self.dir.read();
        let mut v: Vec<u32> = d.entries.iter().map(|e| e.subtable).collect();
        v.sort_unstable();
        v.dedup();
        v.len()
    }

    /// The fingerprint the index files `key` under (to build its [`Slot`]).
    pub fn fingerprint(&self, key: &[u8]) -> u8 {
        self.hash(key).fp
    }

    /// The slot for `key` pointing at `ptr`.
    pub fn slot_for(&self, key: &[u8], ptr: crate::ObjPtr) -> Result<Slot> {
        Slot::new(self.fingerprint(key), ptr)
    }

    pub(crate) fn hash(&self, key: &[u8]) -> KeyHash {
        KeyHash::new(key, self.layout.seed, self.layout.groups_log2)
    }

    pub(crate) fn primary_node(&self) -> NodeId {
        self.spaces[0].region.node
    }

    /// The node holding the primary replica.
    pub fn primary(&self) -> NodeId {
        self.primary_node()
    }

    /// The offset of slot `pos` in every replica space (as [`crate::repair::SlotConflict`]
    /// reports it).
    pub fn slot_offset(&self, pos: SlotPos) -> u64 {
        self.layout.slot_off(pos)
    }

    pub(crate) fn corrupt(&self, what: impl Into<String>) -> Error {
        Error::Corrupt {
            node: self.primary_node(),
            what: what.into(),
        }
    }

    /// One step of a scan over every key's slot: the occupied slots of the subtable `cursor`
    /// names (0 starts a scan) and the cursor of the next step (0 when the scan is done).
    /// Two round trips: the directory, then the subtable, from the primary.
    ///
    /// Subtables are scanned in the order of their numbers, and a split always moves entries
    /// to a subtable numbered after every existing one: so every key present for the whole
    /// scan is returned at least once, even while the index grows (as Redis's SCAN
    /// guarantees). A key may be returned twice (a split's copy and its source, a stale entry
    /// a split left): callers that count deduplicate, by key.
    ///
    /// ```
    /// use std::sync::Arc;
    /// use dmkit_verbs::sim::{SimCluster, SimConfig};
    /// use dmkit_verbs::{Access, DramBacking, MemoryNode, NodeId};
    /// use dmkit_kv_index::{IndexConfig, IndexReplicaSpace, RaceIndex, KeyVerifier};
    /// use dmkit_kv_index::test_utils::KeyStore;
    ///
    /// let cluster = SimCluster::new(SimConfig::default());
    /// let node = Arc::new(MemoryNode::new(NodeId(0)));
    /// let region = node.register(Arc::new(DramBacking::new(8 << 20)), Access::ALL, None)?;
    /// let objects = node.register(Arc::new(DramBacking::new(1 << 20)), Access::ALL, None)?;
    /// cluster.add_node(node);
    /// let ep = cluster.endpoint(1)?;
    /// let space = IndexReplicaSpace { region, offset: 0, len: region.len };
    /// let config = IndexConfig { groups_per_subtable_log2: 2, ..IndexConfig::default() };
    /// let index = RaceIndex::format(&ep, &config, &[space])?;
    /// let keys = KeyStore::new(vec![objects]);
    /// for k in ["a", "b", "c"] {
    ///     index.insert(&keys, k.as_bytes(), index.slot_for(k.as_bytes(), keys.put(&ep, k.as_bytes())?)?)?;
    /// }
    /// let (mut found, mut cursor) = (Vec::new(), 0);
    /// loop {
    ///     let (slots, next) = index.scan(cursor)?;
    ///     found.extend(keys.keys(&ep, &slots)?);
    ///     cursor = next;
    ///     if cursor == 0 {
    ///         break;
    ///     }
    /// }
    /// found.sort();
    /// assert_eq!(found, [b"a".to_vec(), b"b".to_vec(), b"c".to_vec()]);
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn scan(&self, cursor: u64) -> Result<(Vec<Slot>, u64)> {
        dmkit_verbs::block_on(self.scan_async(cursor))
    }

    /// [`RaceIndex::scan`], awaited.
    pub async fn scan_async(&self, cursor: u64) -> Result<(Vec<Slot>, u64)> {
        self.refresh_directory_tagged_async(tags::SCAN).await?;
        let mut subtables: Vec<u32> = self.dir.read().entries.iter().map(|e| e.subtable).collect();
        subtables.sort_unstable();
        subtables.dedup();
        let Some(&st) = subtables.iter().find(|s| u64::from(**s) >= cursor) else {
            return Ok((Vec::new(), 0));
        };
        let next = subtables
            .iter()
            .find(|s| **s > st)
            .map_or(0, |s| u64::from(*s));
        let words = self.read_subtable(tags::SCAN, st).await?;
        let mut out = Vec::new();
        for (i, raw) in words.into_iter().enumerate() {
            if i % 8 == HEADER_WORD {
                continue;
            }
            if let Some(slot) = Slot::from_raw(raw)? {
                out.push(slot);
            }
        }
        Ok((out, next))
    }

    /// Re-reads the directory from the primary (one round trip, two if it doubled).
    pub fn refresh_directory(&self) -> Result<()> {
        self.refresh_directory_tagged(tags::DIRECTORY)
    }

    pub(crate) fn refresh_directory_tagged(&self, tag: Tag) -> Result<()> {
        dmkit_verbs::block_on(self.refresh_directory_tagged_async(tag))
    }

    pub(crate) async fn refresh_directory_tagged_async(&self, tag: Tag) -> Result<()> {
        metrics::counter!("dmkit_kv_index_directory_refreshes_total").increment(1);
        let p = &self.spaces[0];
        let mut known = self.dir.read().global_depth;
        loop {
            let len = DIR_OFFSET + 8 * (1u64 << known);
            let bytes = self.ep.read_async(tag, p.at(0), len as usize).await?;
            let w = words(&bytes);
            if w.len() as u64 != len / 8 || w[0] != MAGIC {
                return Err(self.corrupt("space header lost its magic"));
            }
            let g = w[(HDR_GLOBAL_DEPTH / 8) as usize];
            if g > u64::from(self.layout.max_depth) {
                return Err(self.corrupt(format!("global depth {g}")));
            }
            let g = g as u8;
            if g > known {
                known = g;
                continue;
            }
            let mut entries = Vec::with_capacity(1 << g);
            for (i, &raw) in w[(DIR_OFFSET / 8) as usize..][..1 << g].iter().enumerate() {
                let e = DirEntry::decode(raw)
                    .filter(|e| u64::from(e.subtable) < self.layout.capacity && e.local_depth <= g)
                    .ok_or_else(|| self.corrupt(format!("directory entry {i}: {raw:#x}")))?;
                entries.push(e);
            }
            *self.dir.write() = DirCache {
                global_depth: g,
                entries,
            };
            return Ok(());
        }
    }

    pub(crate) fn lookup(&self, kh: &KeyHash) -> DirEntry {
        let d = self.dir.read();
        d.entries[kh.dir_index(d.global_depth) as usize]
    }

    fn combined_addr(&self, st: u32, g: u64, side: u8) -> RemoteAddr {
        self.spaces[0].at(self.layout.bucket_off(st, combined_first_bucket(g, side)))
    }

    pub(crate) fn post_reads(&self, st: u32, kh: &KeyHash) -> [(RemoteAddr, usize); 2] {
        kh.cands
            .map(|(g, s)| (self.combined_addr(st, g, s), COMBINED_BYTES as usize))
    }

    /// Parses two combined buckets; `None` when a header does not cover the key (the cached
    /// directory is stale, or the write landed in a subtable the key has left).
    pub(crate) fn parse_view(
        &self,
        st: u32,
        kh: &KeyHash,
        bytes: [&[u8]; 2],
    ) -> Result<Option<View>> {
        let mut view = View {
            subtable: st,
            words: [[0; 16]; 2],
            splitting: false,
            depth: 0,
        };
        let mut covered = true;
        for (dst, src) in view.words.iter_mut().zip(bytes) {
            let w = words(src);
            if w.len() != 16 {
                return Err(self.corrupt("short bucket read"));
            }
            dst.copy_from_slice(&w);
            for h in [w[HEADER_WORD], w[8 + HEADER_WORD]] {
                let h = Header::decode(h).ok_or_else(|| {
                    self.corrupt(format!("subtable {st}: bucket header {h:#018x}"))
                })?;
                covered &= h.covers(kh.dir);
                view.splitting |= h.splitting;
                view.depth = view.depth.max(h.local_depth);
            }
        }
        Ok(covered.then_some(view))
    }

    /// Reads the key's two combined buckets from the primary (one round trip on a fresh
    /// cache), refreshing the directory when the bucket headers say it is stale.
    pub(crate) async fn read_view_async(&self, tag: Tag, kh: &KeyHash) -> Result<View> {
        self.read_view_with_async(tag, kh, Vec::new(), &NoHooks)
            .await
    }

    /// [`Self::read_view_async`], blocking.
    pub(crate) fn read_view(&self, tag: Tag, kh: &KeyHash) -> Result<View> {
        dmkit_verbs::block_on(self.read_view_async(tag, kh))
    }

    /// [`Self::read_view_async`] with the caller's batches (to other nodes, or the same one)
    /// posted in the same round trip, once. The bucket reads join the caller's batch to the
    /// primary when there is one (one doorbell per node: on a software NIC each doorbell is
    /// a system call); the caller's verbs keep their indexes, as theirs come first.
    pub(crate) async fn read_view_with_async(
        &self,
        tag: Tag,
        kh: &KeyHash,
        mut extra: Vec<Batch>,
        hooks: &dyn WriteHooks,
    ) -> Result<View> {
        let mut backoff = Backoff::new(self.wait_timeout);
        loop {
            let e = self.lookup(kh);
            let (res, [r0, r1]) = if extra.is_empty() {
                let mut b = self.ep.batch(self.primary_node());
                let reads = self.post_reads(e.subtable, kh).map(|(a, l)| b.read(a, l));
                (self.ep.execute_async(tag, b).await?, reads)
            } else {
                let mut all = std::mem::take(&mut extra);
                let theirs = all.len();
                let k = self.ep.batch_for(&mut all, self.primary_node());
                let reads = self
                    .post_reads(e.subtable, kh)
                    .map(|(a, l)| all[k].read(a, l));
                let results = self.ep.execute_many_async(tag, all).await;
                let mut done = results
                    .into_iter()
                    .collect::<std::result::Result<Vec<_>, _>>()?;
                hooks.first_round_done(&done[..theirs]);
                (done.swap_remove(k), reads)
            };
            if let Some(v) = self.parse_view(e.subtable, kh, [res.read(r0), res.read(r1)])? {
                return Ok(v);
            }
            self.refresh_directory_tagged_async(tags::DIRECTORY).await?;
            if self.lookup(kh) == e && !backoff.pause_async().await {
                return Err(self.corrupt(format!(
                    "subtable {} does not cover the keys its directory entries send to it",
                    e.subtable
                )));
            }
        }
    }

    /// A writer (or search) met a splitting subtable: waits a little. When the split stood
    /// still for the split timeout, finishes it (taking the lock over if its holder stopped
    /// renewing it) instead of failing; fails only if the split still does not end.
    pub(crate) async fn wait_split<V: KeyVerifier + ?Sized>(
        &self,
        verifier: &V,
        backoff: &mut Backoff,
    ) -> Result<()> {
        if crate::split::stranded_here() {
            // This process left a split holding the lock: finish it now, not after a wait.
            return self.help_split(verifier).await;
        }
        if backoff.pause_async().await {
            return Ok(());
        }
        if backoff.waited() < self.wait_timeout.saturating_mul(3) {
            self.help_split(verifier).await?;
            backoff.restart();
            return Ok(());
        }
        Err(Error::SplitStalled {
            waited: backoff.waited(),
        })
    }

    /// SEARCH: the slot `key` maps to. One round trip for the buckets on a fresh directory
    /// cache, plus the verifier's object reads when a fingerprint matches.
    pub fn search<V: KeyVerifier + ?Sized>(
        &self,
        verifier: &V,
        key: &[u8],
    ) -> Result<Option<Slot>> {
        dmkit_verbs::block_on(self.search_async(verifier, key))
    }

    /// [`Self::search`], awaited: many may be in flight on one thread.
    pub async fn search_async<V: KeyVerifier + ?Sized>(
        &self,
        verifier: &V,
        key: &[u8],
    ) -> Result<Option<Slot>> {
        let kh = self.hash(key);
        let mut backoff = Backoff::new(self.wait_timeout);
        loop {
            let view = self.read_view_async(tags::SEARCH, &kh).await?;
            let cands = view.candidates(&kh)?;
            let slots: Vec<Slot> = cands.iter().map(|c| c.2).collect();
            let found = self
                .find_confirmed_async(tags::SEARCH, verifier, key, &cands, &slots, true)
                .await;
            match found {
                Ok(Some(i)) => return Ok(Some(slots[i])),
                Ok(None) if !view.splitting => return Ok(None),
                Ok(None) => {}
                Err(Error::StaleCandidate) => {
                    self.stale(&mut backoff).await?;
                    continue;
                }
                Err(e) => return Err(e),
            }
            // A split may have moved the key between our slot reads and header reads.
            self.wait_split(verifier, &mut backoff).await?;
        }
    }

    /// A verifier saw a candidate move on: pause, then the caller reads the buckets again.
    pub(crate) async fn stale(&self, backoff: &mut Backoff) -> Result<()> {
        metrics::counter!("dmkit_kv_index_stale_candidates_total").increment(1);
        if backoff.pause_async().await {
            Ok(())
        } else {
            Err(Error::Verifier(format!(
                "candidate objects kept moving on for {:?}",
                backoff.waited()
            )))
        }
    }

    async fn find_async<V: KeyVerifier + ?Sized>(
        &self,
        verifier: &V,
        key: &[u8],
        slots: &[Slot],
    ) -> Result<Option<usize>> {
        if slots.is_empty() {
            return Ok(None);
        }
        match verifier.find_async(&self.ep, key, slots).await? {
            Some(i) if i >= slots.len() => Err(Error::Verifier(format!(
                "returned candidate {i} of {}",
                slots.len()
            ))),
            r => Ok(r),
        }
    }

    /// The verifier's pick among `slots` (the slots of `cands`), where "absent" also needs
    /// [`Self::confirm_absent_async`]. A `read` answers with what the object holds, so an
    /// object its writer had not finished needs its slot word confirmed too; a write needs
    /// not (its swap expects the word, and fails if it moved).
    pub(crate) async fn find_confirmed_async<V: KeyVerifier + ?Sized>(
        &self,
        tag: Tag,
        verifier: &V,
        key: &[u8],
        cands: &[(SlotPos, u64, Slot)],
        slots: &[Slot],
        read: bool,
    ) -> Result<Option<usize>> {
        match self.find_async(verifier, key, slots).await? {
            None => self.confirm_absent_async(tag, cands).await.map(|()| None),
            // An object its writer had not finished: found only if its slot still holds
            // the word the buckets showed (see `KeyVerifier::unsettled`).
            Some(i) if read && verifier.unsettled() => self
                .confirm_absent_async(tag, &cands[i..=i])
                .await
                .map(|()| Some(i)),
            found => Ok(found),
        }
    }

    /// The verifier found the key in none of `cands`: check that the slots still hold what
    /// the buckets showed. An object read after its slot moved on — freed, and handed out to
    /// another key — says nothing about this key; while a slot still points to an object,
    /// FUSEE does not free it. One READ batch on the primary, only when there were
    /// candidates; [`Error::StaleCandidate`] if a word moved (the caller reads again).
    async fn confirm_absent_async(&self, tag: Tag, cands: &[(SlotPos, u64, Slot)]) -> Result<()> {
        if cands.is_empty() {
            return Ok(());
        }
        let mut b = self.ep.batch(self.primary_node());
        let idx: Vec<_> = cands
            .iter()
            .map(|(pos, _, _)| b.read(self.slot_addr(0, *pos), 8))
            .collect();
        let res = self.ep.execute_async(tag, b).await?;
        for ((_, raw, _), i) in cands.iter().zip(idx) {
            let now = words(res.read(i)).first().copied().unwrap_or(0);
            if thaw(now) != thaw(*raw) {
                metrics::counter!("dmkit_kv_index_moved_candidates_total").increment(1);
                return Err(Error::StaleCandidate);
            }
        }
        Ok(())
    }

    /// INSERT: files `key → slot` unless the key is present. No duplicates: concurrent
    /// inserts of one key yield exactly one `Inserted`. Three round trips with r ≥ 2 and no
    /// conflict (bucket read, backup CAS, primary CAS), two with r = 1; a full subtable is
    /// split first.
    pub fn insert<V: KeyVerifier + ?Sized>(
        &self,
        verifier: &V,
        key: &[u8],
        slot: Slot,
    ) -> Result<InsertOutcome> {
        self.insert_hooked(verifier, key, slot, &NoHooks)
    }

    /// [`Self::insert`], awaited.
    pub async fn insert_async<V: KeyVerifier + ?Sized>(
        &self,
        verifier: &V,
        key: &[u8],
        slot: Slot,
    ) -> Result<InsertOutcome> {
        self.insert_hooked_async(verifier, key, slot, &NoHooks)
            .await
    }

    /// INSERT with the caller's [`WriteHooks`] (FUSEE: the object write in the first round
    /// trip, the commit record before the primary swap).
    pub fn insert_hooked<V: KeyVerifier + ?Sized>(
        &self,
        verifier: &V,
        key: &[u8],
        slot: Slot,
        hooks: &dyn WriteHooks,
    ) -> Result<InsertOutcome> {
        dmkit_verbs::block_on(self.insert_hooked_async(verifier, key, slot, hooks))
    }

    /// [`Self::insert_hooked`], awaited.
    pub async fn insert_hooked_async<V: KeyVerifier + ?Sized>(
        &self,
        verifier: &V,
        key: &[u8],
        slot: Slot,
        hooks: &dyn WriteHooks,
    ) -> Result<InsertOutcome> {
        let kh = self.hash(key);
        if slot.fingerprint() != kh.fp {
            return Err(Error::InvalidSlot(
                "the slot's fingerprint is not the key's (build it with RaceIndex::slot_for)"
                    .into(),
            ));
        }
        let mut backoff = Backoff::new(self.wait_timeout);
        let mut first = hooks.first_round();
        loop {
            let view = self
                .read_view_with_async(tags::INSERT, &kh, std::mem::take(&mut first), hooks)
                .await?;
            if view.splitting {
                self.wait_split(verifier, &mut backoff).await?;
                continue;
            }
            let cands = view.candidates(&kh)?;
            let slots: Vec<Slot> = cands.iter().map(|c| c.2).collect();
            // "Absent" needs no confirming read here: the duplicate check after the CAS reads
            // the buckets again and verifies every candidate whose word moved since this view
            // (a candidate whose word did not move kept its object, which FUSEE never frees
            // while a slot points to it, so the read above was not stale).
            let found = self.find_async(verifier, key, &slots).await;
            match found {
                Ok(Some(i)) => return Ok(InsertOutcome::AlreadyExists { slot: slots[i] }),
                Ok(None) => {}
                Err(Error::StaleCandidate) => {
                    self.stale(&mut backoff).await?;
                    continue;
                }
                Err(e) => return Err(e),
            }
            let Some((pos, empty)) = view.free_slot(&kh) else {
                self.split(verifier, &kh).await?;
                continue;
            };
            if is_frozen(empty) {
                // (A split froze the slot after our read: its header said otherwise.)
                self.wait_split(verifier, &mut backoff).await?;
                continue;
            }
            let post = self.post_reads(view.subtable, &kh);
            hooks.round(pos, empty);
            let (out, bytes) = self
                .snapshot_async(tags::INSERT, pos, empty, slot.raw(), &post, hooks)
                .await?;
            let RawOutcome::Won(rule) = out else {
                // The slot went to another writer (maybe of the same key): look again.
                metrics::counter!("dmkit_kv_index_retries_total", "op" => "insert").increment(1);
                continue;
            };
            let after = self.parse_view(view.subtable, &kh, [&bytes[0], &bytes[1]])?;
            let Some(after) = after else {
                // A whole split ran between our read and our CAS, and the key now belongs to
                // the new subtable: take the stranded entry back and start over.
                self.retract_async(verifier, tags::INSERT, &kh, pos, slot.raw())
                    .await?;
                continue;
            };
            // Duplicate check on the buckets as they were right after our CAS: another
            // insert of this key that got in first makes us yield.
            // A candidate whose word is the one verified before the CAS still points to the
            // object that holds another key: only new ones are read (a fingerprint collision
            // costs its object read once, not twice).
            let other_cands: Vec<(SlotPos, u64, Slot)> = after
                .candidates(&kh)?
                .into_iter()
                .filter(|c| c.0 != pos)
                .filter(|c| !cands.iter().any(|p| p.0 == c.0 && thaw(p.1) == thaw(c.1)))
                .collect();
            let others: Vec<Slot> = other_cands.iter().map(|c| c.2).collect();
            // (A candidate whose object moved on since: that slot held the key a moment ago;
            // yield too, and the next look decides.)
            let dup = match self
                .find_confirmed_async(tags::INSERT, verifier, key, &other_cands, &others, false)
                .await
            {
                Ok(found) => found.is_some(),
                Err(Error::StaleCandidate) => true,
                Err(e) => return Err(e),
            };
            if dup {
                metrics::counter!("dmkit_kv_index_duplicates_resolved_total").increment(1);
                self.retract_async(verifier, tags::INSERT, &kh, pos, slot.raw())
                    .await?;
                continue;
            }
            return Ok(InsertOutcome::Inserted { pos, rule });
        }
    }

    /// Takes our own value out of a slot again (SNAPSHOT `value → its tombstone`).
    async fn retract_async<V: KeyVerifier + ?Sized>(
        &self,
        verifier: &V,
        tag: Tag,
        kh: &KeyHash,
        pos: SlotPos,
        value: u64,
    ) -> Result<()> {
        let gone = tombstone(value);
        let out = self
            .snapshot_async(tag, pos, value, gone, &[], &NoHooks)
            .await?;
        if let RawOutcome::Won(_) = out.0 {
            return Ok(());
        }
        // A split froze or moved it: find it again where the key lives now.
        let mut backoff = Backoff::new(self.wait_timeout);
        loop {
            let view = self.read_view_async(tag, kh).await?;
            let Some((at, raw)) = view.slots(kh).find(|(_, raw)| thaw(*raw) == value) else {
                // Gone; or stranded outside the key's subtable, never visible to anyone,
                // where the next split of that subtable drops it.
                return Ok(());
            };
            if view.splitting || is_frozen(raw) {
                self.wait_split(verifier, &mut backoff).await?;
                continue;
            }
            let out = self
                .snapshot_async(tag, at, raw, gone, &[], &NoHooks)
                .await?;
            if let RawOutcome::Won(_) = out.0 {
                return Ok(());
            }
        }
    }

    /// UPDATE: swaps the key's slot for `new` by SNAPSHOT. `None` if the key is absent.
    pub fn update<V: KeyVerifier + ?Sized>(
        &self,
        verifier: &V,
        key: &[u8],
        new: Slot,
    ) -> Result<Option<Modified>> {
        self.update_hooked(verifier, key, new, &NoHooks)
    }

    /// UPDATE with the caller's [`WriteHooks`].
    pub fn update_hooked<V: KeyVerifier + ?Sized>(
        &self,
        verifier: &V,
        key: &[u8],
        new: Slot,
        hooks: &dyn WriteHooks,
    ) -> Result<Option<Modified>> {
        dmkit_verbs::block_on(self.update_hooked_async(verifier, key, new, hooks))
    }

    /// [`Self::update_hooked`], awaited.
    pub async fn update_hooked_async<V: KeyVerifier + ?Sized>(
        &self,
        verifier: &V,
        key: &[u8],
        new: Slot,
        hooks: &dyn WriteHooks,
    ) -> Result<Option<Modified>> {
        let kh = self.hash(key);
        if new.fingerprint() != kh.fp {
            return Err(Error::InvalidSlot(
                "the slot's fingerprint is not the key's".into(),
            ));
        }
        self.modify_async(tags::UPDATE, verifier, key, &kh, new.raw(), hooks)
            .await
    }

    /// DELETE with the caller's [`WriteHooks`].
    pub fn delete_hooked<V: KeyVerifier + ?Sized>(
        &self,
        verifier: &V,
        key: &[u8],
        hooks: &dyn WriteHooks,
    ) -> Result<Option<Modified>> {
        let kh = self.hash(key);
        dmkit_verbs::block_on(self.modify_async(tags::DELETE, verifier, key, &kh, 0, hooks))
    }

    /// [`Self::delete_hooked`], awaited.
    pub async fn delete_hooked_async<V: KeyVerifier + ?Sized>(
        &self,
        verifier: &V,
        key: &[u8],
        hooks: &dyn WriteHooks,
    ) -> Result<Option<Modified>> {
        let kh = self.hash(key);
        self.modify_async(tags::DELETE, verifier, key, &kh, 0, hooks)
            .await
    }

    /// DELETE: empties the key's slot by SNAPSHOT. `None` if the key is absent.
    pub fn delete<V: KeyVerifier + ?Sized>(
        &self,
        verifier: &V,
        key: &[u8],
    ) -> Result<Option<Modified>> {
        let kh = self.hash(key);
        dmkit_verbs::block_on(self.modify_async(tags::DELETE, verifier, key, &kh, 0, &NoHooks))
    }

    async fn modify_async<V: KeyVerifier + ?Sized>(
        &self,
        tag: Tag,
        verifier: &V,
        key: &[u8],
        kh: &KeyHash,
        new: u64,
        hooks: &dyn WriteHooks,
    ) -> Result<Option<Modified>> {
        let mut backoff = Backoff::new(self.wait_timeout);
        let mut first = hooks.first_round();
        loop {
            let view = self
                .read_view_with_async(tag, kh, std::mem::take(&mut first), hooks)
                .await?;
            let cands = view.candidates(kh)?;
            let slots: Vec<Slot> = cands.iter().map(|c| c.2).collect();
            let found = self
                .find_confirmed_async(tag, verifier, key, &cands, &slots, false)
                .await;
            let found = match found {
                Err(Error::StaleCandidate) => {
                    self.stale(&mut backoff).await?;
                    continue;
                }
                r => r?,
            };
            let Some(i) = found else {
                if view.splitting {
                    self.wait_split(verifier, &mut backoff).await?;
                    continue;
                }
                return Ok(None);
            };
            let (pos, raw, old) = cands[i];
            if view.splitting || is_frozen(raw) {
                self.wait_split(verifier, &mut backoff).await?;
                continue;
            }
            hooks.round(pos, raw);
            // A DELETE (`new` 0) leaves the tombstone of the word it replaces, with its mark.
            let new = if new == 0 {
                tombstone_by(raw, hooks.delete_mark())
            } else {
                new
            };
            match self.snapshot_async(tag, pos, raw, new, &[], hooks).await?.0 {
                RawOutcome::Won(rule) => {
                    return Ok(Some(Modified {
                        old,
                        pos,
                        outcome: SnapshotOutcome::Won(rule),
                    }));
                }
                RawOutcome::Lost(now) if is_frozen(now) => {
                    // Lost to a split freezing the subtable, not to a writer: redo after it.
                    metrics::counter!("dmkit_kv_index_retries_total", "op" => tag).increment(1);
                    self.wait_split(verifier, &mut backoff).await?;
                }
                RawOutcome::Lost(now) if now == raw => {
                    // The round was abandoned (its winner lost the primary to a split).
                    metrics::counter!("dmkit_kv_index_retries_total", "op" => tag).increment(1);
                }
                RawOutcome::Lost(now) if self.moved_by_split_async(tag, kh, &view).await? => {
                    // The backups held the key's old slot no more because a split moved
                    // it to another subtable (or re-homed it): not a writer, redo.
                    let _ = now;
                    metrics::counter!("dmkit_kv_index_retries_total", "op" => tag).increment(1);
                }
                RawOutcome::Lost(now) => {
                    return Ok(Some(Modified {
                        old,
                        pos,
                        outcome: SnapshotOutcome::Lost {
                            now: Slot::from_raw(now)?,
                        },
                    }));
                }
            }
        }
    }
}

impl RaceIndex {
    /// Whether the key's subtable was split since `view` was read (one round trip).
    async fn moved_by_split_async(&self, tag: Tag, kh: &KeyHash, view: &View) -> Result<bool> {
        let again = self.read_view_async(tag, kh).await?;
        Ok(again.subtable != view.subtable || again.depth != view.depth)
    }
}

/// The little-endian words of `bytes` (a trailing partial word is dropped).
pub(crate) fn words(bytes: &[u8]) -> Vec<u64> {
    bytes
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
        .collect()
}

/// A subtable image: every bucket header `hdr`, slots from `slots` (word index → raw value);
/// the other slots empty: 0, or with `marked_by` the split markers of the split that
/// allocated that subtable number ([`crate::slot::split_marker`]).
pub(crate) fn subtable_image(
    layout: &Layout,
    hdr: Header,
    slots: &[(usize, u64)],
    marked_by: Option<u32>,
) -> Vec<u8> {
    let n = (layout.subtable_bytes() / 8) as usize;
    let mut w: Vec<u64> = match marked_by {
        None => vec![0; n],
        Some(split) => (0..n)
            .map(|i| crate::slot::split_marker(split, i))
            .collect(),
    };
    let h = hdr.encode();
    for b in 0..layout.buckets() as usize {
        w[b * 8 + HEADER_WORD] = h;
    }
    for &(i, v) in slots {
        w[i] = v;
    }
    let mut out = Vec::with_capacity(n * 8);
    for v in w {
        out.extend_from_slice(&v.to_le_bytes());
    }
    out
}

const _: () = assert!(SLOTS_PER_BUCKET == HEADER_WORD);
