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
    DirEntry, HDR_BUMP, HDR_GLOBAL_DEPTH, HDR_LOCK, HEADER_WORD, KeyHash, SlotPos,
};
use crate::slot::{FROZEN, Header, Slot, low_bits, thaw};
use crate::verifier::KeyVerifier;

impl RaceIndex {
    /// Splits the subtable that `kh` maps to, unless another client is splitting (then waits
    /// for it) or it has room again. The caller retries its operation afterwards.
    pub(crate) fn split<V: KeyVerifier + ?Sized>(&self, verifier: &V, kh: &KeyHash) -> Result<()> {
        let lock = self.spaces[0].at(HDR_LOCK);
        let token = rand::rng().next_u64() | 1;
        let held = self.ep.cas(tags::SPLIT, lock, 0, token)?;
        if held != 0 {
            let start = Instant::now();
            let mut backoff = Backoff::new(self.wait_timeout);
            while self.ep.read(tags::SPLIT, lock, 8)? != [0u8; 8] {
                if !backoff.pause() {
                    return Err(Error::SplitStalled {
                        waited: start.elapsed(),
                    });
                }
            }
            return self.refresh_directory_tagged(tags::SPLIT);
        }
        let r = self.split_locked(verifier, kh);
        let unlocked = self.ep.cas(tags::SPLIT, lock, token, 0);
        r?;
        unlocked?;
        Ok(())
    }

    fn split_locked<V: KeyVerifier + ?Sized>(&self, verifier: &V, kh: &KeyHash) -> Result<()> {
        let t0 = Instant::now();
        self.refresh_directory_tagged(tags::SPLIT)?;
        let dir = self.dir.read().clone();
        let e = dir.entries[kh.dir_index(dir.global_depth) as usize];
        let (st, l) = (e.subtable, e.local_depth);

        // Someone may have split it (or emptied slots) while we waited for the lock.
        let mut b = self.ep.batch(self.primary_node());
        let [r0, r1] = self.post_reads(st, kh).map(|(a, n)| b.read(a, n));
        let res = self.ep.execute(tags::SPLIT, b)?;
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
        let n = self.ep.faa(tags::SPLIT, self.spaces[0].at(HDR_BUMP), 1)?;
        if n >= self.layout.capacity {
            return Err(Error::Full(format!(
                "all {} subtables of the replica spaces are in use",
                self.layout.capacity
            )));
        }
        let n = n as u32;
        let p = low_bits(kh.dir, l) as u32;
        let buckets = self.layout.buckets();

        // 2. Mark S splitting everywhere.
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
                    b.write(
                        s.at(self.layout.bucket_off(st, bk) + 8 * HEADER_WORD as u64),
                        &splitting,
                    );
                }
                b
            })
            .collect();
        for r in self.ep.execute_many(tags::SPLIT, batches) {
            r?;
        }

        // 3. Freeze every slot.
        let img = self.read_subtable(st)?;
        let items: Vec<(SlotPos, u64, u64)> = slot_words(&img)
            .map(|(i, raw)| (self.pos_of(st, i), raw, raw | FROZEN))
            .collect();
        self.snapshot_many(tags::SPLIT, items, |v| v | FROZEN)?;

        // 4. Rehash the frozen entries and build both images.
        let img = self.read_subtable(st)?;
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
        let n_img = subtable_image(&self.layout, Header::normal(l + 1, p | 1 << l), &moved);
        let s_img = subtable_image(&self.layout, Header::normal(l + 1, p), &stay);
        self.write_all(&n_img, self.layout.subtable_off(n), 0..self.spaces.len())?;

        // 5. The directory.
        let mut g = dir.global_depth;
        let mut entries = dir.entries.clone();
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
        let mut dir_bytes = Vec::with_capacity(entries.len() * 8);
        for ent in &entries {
            dir_bytes.extend_from_slice(&ent.encode().to_le_bytes());
        }
        let batches = self
            .spaces
            .iter()
            .map(|s| {
                let mut b = self.ep.batch(s.region.node);
                b.write(s.at(self.layout.dir_off(0)), &dir_bytes);
                // Entries before depth (in order on the connection): a reader that sees the
                // new depth finds the doubled entries.
                if g != dir.global_depth {
                    b.write(s.at(HDR_GLOBAL_DEPTH), &u64::from(g).to_le_bytes());
                }
                b
            })
            .collect();
        for r in self.ep.execute_many(tags::SPLIT, batches) {
            r?;
        }

        // 6. Unfreeze: backups first, then the primary.
        let off = self.layout.subtable_off(st);
        self.write_all(&s_img, off, 1..self.spaces.len())?;
        self.write_all(&s_img, off, 0..1)?;

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

    fn read_subtable(&self, st: u32) -> Result<Vec<u64>> {
        let bytes = self.ep.read(
            tags::SPLIT,
            self.spaces[0].at(self.layout.subtable_off(st)),
            self.layout.subtable_bytes() as usize,
        )?;
        let w = words(&bytes);
        if w.len() as u64 * 8 != self.layout.subtable_bytes() {
            return Err(self.corrupt("short subtable read"));
        }
        Ok(w)
    }

    fn write_all(&self, img: &[u8], off: u64, replicas: std::ops::Range<usize>) -> Result<()> {
        let batches = self.spaces[replicas]
            .iter()
            .map(|s| {
                let mut b = self.ep.batch(s.region.node);
                b.write(s.at(off), img);
                b
            })
            .collect();
        for r in self.ep.execute_many(tags::SPLIT, batches) {
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

/// (word index, raw) of every slot word of a subtable image (headers excluded).
fn slot_words(img: &[u64]) -> impl Iterator<Item = (usize, u64)> + '_ {
    img.iter()
        .enumerate()
        .filter(|(i, _)| i % 8 != HEADER_WORD)
        .map(|(i, &w)| (i, w))
}
