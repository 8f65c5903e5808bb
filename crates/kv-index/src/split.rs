//! Online growth: splitting one subtable into two (extendible hashing), while other clients
//! keep searching, inserting, updating and deleting.
//!
//! One split runs at a time (a lock word in the primary's space header). The splitter of
//! subtable S (local depth l, prefix p) into S (prefix p) and N (prefix p | 1 << l):
//!
//! 1. allocates N by FAA on the primary's bump pointer (the same index on every replica);
//! 2. marks every bucket header of S *splitting* on every replica: writers wait from now on,
//!    searches that miss re-read;
//! 3. **freezes** every slot of S (empty or not) by SNAPSHOT rounds `v → v | FROZEN`. A frozen
//!    slot still holds its value for searches, but every writer's CAS on it fails, so the
//!    copy below is exact. A writer whose round was in flight either wins (its value gets
//!    frozen in the next round) or loses to the freeze and redoes its operation after the
//!    split — it never reports a write the split dropped;
//! 4. reads the frozen S, asks the [`KeyVerifier`] for the keys, and writes N's image (the
//!    keys whose hash bit l is 1, at the same bucket and slot: the bucket choice does not
//!    depend on the directory bits) to every replica;
//! 5. points the directory at N (doubling it first if l + 1 exceeds the global depth);
//! 6. writes S's final image (headers at depth l + 1, the keys that stay, unfrozen, the others
//!    cleared) to the backups, then to the primary — backups first, so no writer reads an
//!    unfrozen primary while the backups are still frozen.
//!
//! **Failures.** Before step 2 the holder writes the split record `(S, N, l)` into the
//! primary's space header; step 6 clears it. Whoever takes the lock next (a fresh lock, a
//! lock stranded by this process when its release failed, or a lock taken over after it
//! stood still for the split timeout — the holder renews it, a CAS to the next word, before
//! each step, and stops when a renewal fails) first finishes the recorded split: every step
//! is redone from the frozen primary, which no writer can change, so the redo writes what the
//! first attempt would have; N's image is not rewritten once the directory points at N (its
//! writers may have used it), and a primary already at depth l + 1 means only the record was
//! left. A writer or search that waited the split timeout on a splitting subtable does the
//! same instead of failing. What remains: a holder stalled longer than the split timeout in
//! the middle of a step while another takes over could write a stale image after the other
//! finished (both write the same images from the same frozen primary; only a write after the
//! taker's step 6 would be stale) — renewals between steps bound that window to one step.
//!
//! A search never misses a present key: its READ sees a bucket's slots before its header
//! (the header is the bucket's last word); a header still at depth l and not splitting means
//! the slots were read before step 2; a splitting header makes a miss re-read; a header at
//! depth l + 1 that does not cover the key sends the search to the refreshed directory, which
//! already points at N (step 5 precedes step 6).

use std::time::Instant;

use rand::RngCore;

use crate::error::{Error, Result};
use crate::index::{Backoff, RaceIndex, subtable_image, tags, words};
use crate::layout::{
    DirEntry, HDR_BUMP, HDR_GLOBAL_DEPTH, HDR_LOCK, HDR_SPLIT, HEADER_WORD, KeyHash, SlotPos,
};
use crate::slot::{FROZEN, Header, Slot, is_frozen, low_bits, thaw};
use crate::verifier::KeyVerifier;

/// The split record (space header word 7 of the primary): the split the lock holder runs,
/// so that whoever holds the lock next finishes it. `valid | l << 56 | n << 28 | s`.
const RECORD_VALID: u64 = 1 << 63;
const RECORD_FIELD: u64 = (1 << 28) - 1;

fn encode_record(st: u32, n: u32, l: u8) -> u64 {
    RECORD_VALID | u64::from(l) << 56 | u64::from(n) << 28 | u64::from(st)
}

fn decode_record(w: u64) -> Option<(u32, u32, u8)> {
    (w & RECORD_VALID != 0).then_some((
        (w & RECORD_FIELD) as u32,
        (w >> 28 & RECORD_FIELD) as u32,
        (w >> 56 & 0x7f) as u8,
    ))
}

/// Lock words of this process whose release failed (the connection broke under it): the
/// next split attempt of any handle here takes such a word as its own instead of waiting
/// for itself. Lock words are random 64-bit values, so no other client holds one of them.
static STRANDED: parking_lot::Mutex<Vec<u64>> = parking_lot::Mutex::new(Vec::new());

/// The split lock as its holder sees it: the word it last wrote. The holder *renews* it
/// between steps (a CAS to the next word), so waiters can tell a live holder from a dead
/// one; a word that stands still for the split timeout may be taken over.
#[derive(Debug)]
pub(crate) struct SplitLock {
    word: u64,
}

/// A holder's CAS did not find its own word: another client took the split over.
fn taken_over() -> Error {
    Error::SplitTakenOver
}

impl RaceIndex {
    /// Splits the subtable that `kh` maps to, unless another client is splitting (then waits
    /// for it) or it has room again. The caller retries its operation afterwards. A split
    /// left unfinished by a crashed or disconnected holder is finished first, by whoever
    /// holds the lock next (a holder that stood still for the split timeout is taken over).
    pub(crate) async fn split<V: KeyVerifier + ?Sized>(
        &self,
        verifier: &V,
        kh: &KeyHash,
    ) -> Result<()> {
        let Some(mut lock) = self.acquire_split_lock().await? else {
            // Another client's split ended meanwhile: the caller looks again.
            return self.refresh_directory_tagged_async(tags::SPLIT).await;
        };
        let r = match self.finish_pending_split(verifier, &mut lock).await {
            Ok(()) => self.split_locked(verifier, kh, &mut lock).await,
            Err(e) => Err(e),
        };
        let released = self.release_split_lock(&lock).await;
        r?;
        released
    }

    /// Helps a split that stands still: called by writers that waited the split timeout on a
    /// splitting subtable. Takes the lock (over, if its holder stopped renewing it) and
    /// finishes whatever split its record names.
    pub(crate) async fn help_split<V: KeyVerifier + ?Sized>(&self, verifier: &V) -> Result<()> {
        let Some(mut lock) = self.acquire_split_lock().await? else {
            return self.refresh_directory_tagged_async(tags::SPLIT).await;
        };
        let r = self.finish_pending_split(verifier, &mut lock).await;
        let released = self.release_split_lock(&lock).await;
        r?;
        released?;
        self.refresh_directory_tagged_async(tags::SPLIT).await
    }

    /// The split lock: `Some` once held (fresh, stranded by this process, or taken over),
    /// `None` when another holder released it while we waited.
    async fn acquire_split_lock(&self) -> Result<Option<SplitLock>> {
        let addr = self.spaces[0].at(HDR_LOCK);
        let token = rand::rng().next_u64() | 1;
        let held = self.ep.cas_async(tags::SPLIT, addr, 0, token).await?;
        if held == 0 {
            return Ok(Some(SplitLock { word: token }));
        }
        if take_stranded(held) {
            tracing::info!(
                "resuming a split this process left holding the lock (its release failed)"
            );
            return Ok(Some(SplitLock { word: held }));
        }
        // Wait for the holder; a word that stands still for the split timeout is taken over.
        // (The overall bound only stops a holder that renews forever without finishing.)
        let start = Instant::now();
        let mut backoff = Backoff::new(self.wait_timeout.saturating_mul(10));
        let (mut seen, mut since) = (held, Instant::now());
        loop {
            if !backoff.pause_async().await {
                return Err(Error::SplitStalled {
                    waited: start.elapsed(),
                });
            }
            let now = self.read_word(addr).await?;
            if now == 0 {
                return Ok(None);
            }
            if now != seen {
                (seen, since) = (now, Instant::now());
                continue;
            }
            if since.elapsed() < self.wait_timeout {
                continue;
            }
            let token = rand::rng().next_u64() | 1;
            let prev = self.ep.cas_async(tags::SPLIT, addr, seen, token).await?;
            if prev == seen {
                tracing::warn!(
                    stood_still = ?since.elapsed(),
                    "taking over a split whose holder stopped renewing its lock"
                );
                metrics::counter!("dmkit_kv_index_split_takeovers_total").increment(1);
                return Ok(Some(SplitLock { word: token }));
            }
            if prev == 0 {
                return Ok(None);
            }
            (seen, since) = (prev, Instant::now());
        }
    }

    /// Renews the lock (between the steps of a split): fails if another client took it.
    async fn renew_split_lock(&self, lock: &mut SplitLock) -> Result<()> {
        let next = lock.word.wrapping_add(2) | 1;
        let prev = self
            .ep
            .cas_async(tags::SPLIT, self.spaces[0].at(HDR_LOCK), lock.word, next)
            .await?;
        if prev != lock.word {
            return Err(taken_over());
        }
        lock.word = next;
        Ok(())
    }

    /// Releases the lock. If the release cannot be sent (the connection broke), the word is
    /// remembered, so this process's next split takes it back at once instead of waiting for
    /// itself; other clients take it over after the split timeout.
    async fn release_split_lock(&self, lock: &SplitLock) -> Result<()> {
        match self
            .ep
            .cas_async(tags::SPLIT, self.spaces[0].at(HDR_LOCK), lock.word, 0)
            .await
        {
            Ok(prev) if prev == lock.word || prev == 0 => Ok(()),
            Ok(_) => Err(taken_over()),
            Err(e) => {
                STRANDED.lock().push(lock.word);
                Err(e.into())
            }
        }
    }

    async fn read_word(&self, at: dmkit_verbs::RemoteAddr) -> Result<u64> {
        let b = self.ep.read_async(tags::SPLIT, at, 8).await?;
        Ok(words(&b).first().copied().unwrap_or(0))
    }

    /// Finishes the split the record names, if any (its holder crashed, lost its connection
    /// or was taken over). Every step is redone from the frozen primary, which no writer can
    /// change, so a redo writes what the first attempt would have written.
    async fn finish_pending_split<V: KeyVerifier + ?Sized>(
        &self,
        verifier: &V,
        lock: &mut SplitLock,
    ) -> Result<()> {
        let rec = self.read_word(self.spaces[0].at(HDR_SPLIT)).await?;
        let Some((st, n, l)) = decode_record(rec) else {
            return Ok(());
        };
        if u64::from(st) >= self.layout.capacity || u64::from(n) >= self.layout.capacity {
            return Err(self.corrupt(format!("split record {rec:#x}")));
        }
        let h = self
            .read_word(self.spaces[0].at(self.layout.bucket_off(st, 0) + 8 * HEADER_WORD as u64))
            .await?;
        let h = Header::decode(h)
            .ok_or_else(|| self.corrupt(format!("subtable {st}: bucket header {h:#018x}")))?;
        metrics::counter!("dmkit_kv_index_split_resumes_total").increment(1);
        if h.local_depth > l && !h.splitting {
            // The primary got its final image: only the record is left.
            tracing::info!(
                subtable = st,
                "an interrupted split had finished; clearing its record"
            );
            return self.write_record(0).await;
        }
        tracing::warn!(
            subtable = st,
            new = n,
            depth = l,
            "finishing an interrupted split"
        );
        let p = low_bits(u64::from(h.prefix), l) as u32;
        self.run_split(verifier, lock, st, n, l, p, true).await
    }

    async fn write_record(&self, w: u64) -> Result<()> {
        self.ep
            .write_async(tags::SPLIT, self.spaces[0].at(HDR_SPLIT), &w.to_le_bytes())
            .await?;
        Ok(())
    }

    async fn split_locked<V: KeyVerifier + ?Sized>(
        &self,
        verifier: &V,
        kh: &KeyHash,
        lock: &mut SplitLock,
    ) -> Result<()> {
        self.refresh_directory_tagged_async(tags::SPLIT).await?;
        let dir = self.dir.read().clone();
        let e = dir.entries[kh.dir_index(dir.global_depth) as usize];
        let (st, l) = (e.subtable, e.local_depth);

        // Someone may have split it (or emptied slots) while we waited for the lock.
        let mut b = self.ep.batch(self.primary_node());
        let [r0, r1] = self.post_reads(st, kh).map(|(a, n)| b.read(a, n));
        let res = self.ep.execute_async(tags::SPLIT, b).await?;
        if let Some(v) = self.parse_view(st, kh, [res.read(r0), res.read(r1)])? {
            if !v.splitting && v.has_free_slot() {
                return Ok(());
            }
        }
        if l >= self.layout.max_depth {
            return Err(Error::Full(format!(
                "subtable {st} is at the maximum depth {}",
                self.layout.max_depth
            )));
        }
        let n = self
            .ep
            .faa_async(tags::SPLIT, self.spaces[0].at(HDR_BUMP), 1)
            .await?;
        if n >= self.layout.capacity || n > RECORD_FIELD {
            return Err(Error::Full(format!(
                "all {} subtables of the replica spaces are in use",
                self.layout.capacity
            )));
        }
        let n = n as u32;
        let p = low_bits(kh.dir, l) as u32;
        // 1. The record, so that a next holder can finish this split if we stop.
        self.write_record(encode_record(st, n, l)).await?;
        self.run_split(verifier, lock, st, n, l, p, false).await
    }

    /// Steps 2-6 of splitting subtable `st` (depth `l`, prefix `p`) into `st` and `n`, then
    /// the record cleared. `resumed`: another holder may have done any prefix of the steps.
    #[allow(clippy::too_many_arguments)]
    async fn run_split<V: KeyVerifier + ?Sized>(
        &self,
        verifier: &V,
        lock: &mut SplitLock,
        st: u32,
        n: u32,
        l: u8,
        p: u32,
        resumed: bool,
    ) -> Result<()> {
        let t0 = Instant::now();
        let buckets = self.layout.buckets();

        // 2. Mark S splitting everywhere.
        self.renew_split_lock(lock).await?;
        let splitting = Header {
            local_depth: l,
            prefix: p,
            splitting: true,
        }
        .encode()
        .to_le_bytes();
        let batches = self
            .spaces
            .iter()
            .map(|s| {
                let mut b = self.ep.batch(s.region.node);
                for bk in 0..buckets {
                    b.write_durable(
                        s.at(self.layout.bucket_off(st, bk) + 8 * HEADER_WORD as u64),
                        &splitting,
                    );
                }
                b
            })
            .collect();
        for r in self.ep.execute_many_async(tags::SPLIT, batches).await {
            r?;
        }

        // 3. Freeze every slot.
        self.renew_split_lock(lock).await?;
        let img = self.read_subtable(tags::SPLIT, st).await?;
        let items: Vec<(SlotPos, u64, u64)> = slot_words(&img)
            .filter(|(_, raw)| !is_frozen(*raw))
            .map(|(i, raw)| (self.pos_of(st, i), raw, raw | FROZEN))
            .collect();
        self.snapshot_many(tags::SPLIT, items, |v| v | FROZEN)
            .await?;

        // 4. Rehash the frozen entries and build both images.
        self.renew_split_lock(lock).await?;
        let img = self.read_subtable(tags::SPLIT, st).await?;
        if let Some((i, raw)) = slot_words(&img).find(|(_, raw)| !is_frozen(*raw)) {
            return Err(self.corrupt(format!(
                "subtable {st} word {i} ({raw:#x}) is not frozen after the freeze"
            )));
        }
        let live: Vec<(usize, Slot)> = slot_words(&img)
            .filter_map(|(i, raw)| match Slot::from_raw(thaw(raw)) {
                Ok(Some(s)) => Some(Ok((i, s))),
                Ok(None) => None,
                Err(e) => Some(Err(e)),
            })
            .collect::<Result<_>>()?;
        let slots: Vec<Slot> = live.iter().map(|x| x.1).collect();
        let keys = verifier.keys(&self.ep, &slots)?;
        if keys.len() != slots.len() {
            return Err(Error::Verifier(format!(
                "{} keys for {} slots",
                keys.len(),
                slots.len()
            )));
        }
        let (mut stay, mut moved, mut dropped) = (Vec::new(), Vec::new(), 0u64);
        for ((i, s), key) in live.iter().zip(&keys) {
            let h = self.hash(key);
            if h.fp != s.fingerprint() {
                return Err(Error::Verifier(format!(
                    "the object of slot {:#x} holds a key of another fingerprint",
                    s.raw()
                )));
            }
            if low_bits(h.dir, l) != u64::from(p) {
                // An entry stranded by an insert that raced a previous split of this
                // subtable; its inserter takes it back, it was never visible.
                dropped += 1;
            } else if h.dir >> l & 1 == 1 {
                moved.push((*i, s.raw()));
            } else {
                stay.push((*i, s.raw()));
            }
        }
        // N is new (no round can be under way in it); S's emptied slots get this split's
        // markers, so no SNAPSHOT CAS from before the split can land on them.
        let n_img = subtable_image(
            &self.layout,
            Header::normal(l + 1, p | 1 << l),
            &moved,
            None,
        );
        let s_img = subtable_image(&self.layout, Header::normal(l + 1, p), &stay, Some(n));

        // Where a resumed split stands: once the directory points at N, writers may have
        // written into N, so its image is not written again.
        self.refresh_directory_tagged_async(tags::SPLIT).await?;
        let dir = self.dir.read().clone();
        let sibling = u64::from(p | 1 << l);
        let published = resumed
            && dir.global_depth > l
            && dir.entries[sibling as usize]
                == (DirEntry {
                    subtable: n,
                    local_depth: l + 1,
                });
        if !published {
            // (Renewed right before: a holder that stood still here has been taken over.)
            self.renew_split_lock(lock).await?;
            self.write_all(&n_img, self.layout.subtable_off(n), 0..self.spaces.len())
                .await?;
        }

        // 5. The directory (again on every replica when resumed: the primary's is the truth).
        self.renew_split_lock(lock).await?;
        let mut g = dir.global_depth;
        let mut entries = dir.entries.clone();
        if !published {
            if l + 1 > g {
                entries.extend_from_within(..);
                g += 1;
            }
            for (i, ent) in entries.iter_mut().enumerate() {
                if low_bits(i as u64, l) == u64::from(p) {
                    *ent = DirEntry {
                        subtable: if i >> l & 1 == 1 { n } else { st },
                        local_depth: l + 1,
                    };
                }
            }
        }
        let mut dir_bytes = Vec::with_capacity(entries.len() * 8);
        for ent in &entries {
            dir_bytes.extend_from_slice(&ent.encode().to_le_bytes());
        }
        let batches = self
            .spaces
            .iter()
            .map(|s| {
                let mut b = self.ep.batch(s.region.node);
                b.write_durable(s.at(self.layout.dir_off(0)), &dir_bytes);
                // Entries before depth (in order on the connection): a reader that sees the
                // new depth finds the doubled entries.
                b.write_durable(s.at(HDR_GLOBAL_DEPTH), &u64::from(g).to_le_bytes());
                b
            })
            .collect();
        for r in self.ep.execute_many_async(tags::SPLIT, batches).await {
            r?;
        }

        // 6. Unfreeze: backups first, then the primary; then the record is done.
        self.renew_split_lock(lock).await?;
        let off = self.layout.subtable_off(st);
        self.write_all(&s_img, off, 1..self.spaces.len()).await?;
        self.renew_split_lock(lock).await?;
        self.write_all(&s_img, off, 0..1).await?;
        self.write_record(0).await?;

        *self.dir.write() = crate::index::DirCache {
            global_depth: g,
            entries,
        };
        metrics::counter!("dmkit_kv_index_splits_total").increment(1);
        metrics::counter!("dmkit_kv_index_split_dropped_entries_total").increment(dropped);
        metrics::gauge!("dmkit_kv_index_subtables").set(f64::from(n + 1));
        metrics::histogram!("dmkit_kv_index_split_duration_seconds")
            .record(t0.elapsed().as_secs_f64());
        Ok(())
    }

    /// Subtable `st` from the primary, as words (one READ, counted under `tag`).
    pub(crate) async fn read_subtable(&self, tag: dmkit_verbs::Tag, st: u32) -> Result<Vec<u64>> {
        let bytes = self
            .ep
            .read_async(
                tag,
                self.spaces[0].at(self.layout.subtable_off(st)),
                self.layout.subtable_bytes() as usize,
            )
            .await?;
        let w = words(&bytes);
        if w.len() as u64 * 8 != self.layout.subtable_bytes() {
            return Err(self.corrupt("short subtable read"));
        }
        Ok(w)
    }

    async fn write_all(
        &self,
        img: &[u8],
        off: u64,
        replicas: std::ops::Range<usize>,
    ) -> Result<()> {
        let batches = self.spaces[replicas]
            .iter()
            .map(|s| {
                let mut b = self.ep.batch(s.region.node);
                b.write_durable(s.at(off), img);
                b
            })
            .collect();
        for r in self.ep.execute_many_async(tags::SPLIT, batches).await {
            r?;
        }
        Ok(())
    }

    fn pos_of(&self, st: u32, word: usize) -> SlotPos {
        SlotPos {
            subtable: st,
            bucket: (word / 8) as u64,
            slot: (word % 8) as u8,
        }
    }
}

/// Whether this process has a split lock whose release failed.
pub(crate) fn stranded_here() -> bool {
    !STRANDED.lock().is_empty()
}

/// Takes `word` off this process's stranded lock words, if it is one.
fn take_stranded(word: u64) -> bool {
    let mut s = STRANDED.lock();
    match s.iter().position(|&w| w == word) {
        Some(i) => {
            s.swap_remove(i);
            true
        }
        None => false,
    }
}

/// (word index, raw) of every slot word of a subtable image (headers excluded).
fn slot_words(img: &[u64]) -> impl Iterator<Item = (usize, u64)> + '_ {
    img.iter()
        .enumerate()
        .filter(|(i, _)| i % 8 != HEADER_WORD)
        .map(|(i, &w)| (i, w))
}
