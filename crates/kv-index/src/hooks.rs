//! What a KV layer built on the index (FUSEE) needs beyond plain operations: hooks into the
//! write protocol, slot positions for its address cache, and resuming a crashed writer's
//! round during recovery.

use dmkit_verbs::{Batch, BatchResult, NodeId, RemoteAddr};

use crate::error::Result;
use crate::index::{Backoff, RaceIndex};
use crate::layout::SlotPos;
use crate::slot::{Slot, is_frozen, thaw, tombstone_by};
use crate::snapshot::RawOutcome;
use crate::verifier::KeyVerifier;

/// Hooks into the write protocol of INSERT, UPDATE and DELETE.
pub trait WriteHooks: Sync {
    /// Batches posted together with the operation's first bucket read (the same round trip):
    /// FUSEE writes the KV object to its data replicas here. Called once per operation.
    fn first_round(&self) -> Vec<Batch> {
        Vec::new()
    }

    /// The results of the [`Self::first_round`] batches, in their order, once the round
    /// completed (before any candidate is verified): FUSEE reads the object its address cache
    /// names there, so a cached UPDATE or DELETE needs no separate object read.
    fn first_round_done(&self, results: &[BatchResult]) {
        let _ = results;
    }

    /// This writer is the last writer and is about to swap the primary, whose value it
    /// replaces is `old` (raw; 0 = empty). FUSEE writes its log entry's commit record here.
    /// An error abandons the operation before the primary changes.
    fn before_primary(&self, old: u64) -> Result<()> {
        let _ = old;
        Ok(())
    }

    /// [`WriteHooks::before_primary`] for async operations (the default runs it in place).
    fn before_primary_async(&self, old: u64) -> crate::BoxFuture<'_, Result<()>> {
        Box::pin(std::future::ready(self.before_primary(old)))
    }

    /// Instead of [`WriteHooks::before_primary_async`]: verbs that go *in the primary CAS's
    /// batch*, ahead of the CAS, to `primary` — one round trip for both, as a batch executes
    /// in order. FUSEE's commit record goes here when every write of it is to the primary's
    /// node and durable there before the CAS runs ([`dmkit_verbs::Endpoint::durable_in_order`]):
    /// with r = 1 and one memory node a write takes the FUSEE paper's two round trips, commit
    /// record included. `None` (the default): `before_primary_async` runs first, in round
    /// trips of its own.
    fn with_primary(&self, old: u64, primary: NodeId) -> Option<Batch> {
        let _ = (old, primary);
        None
    }

    /// A SNAPSHOT round is about to start on `pos`, replacing `expected` (raw). Called before
    /// every round of the operation; FUSEE remembers the last one, to tell afterwards whether a
    /// round cut short by a failure was completed by the master.
    fn round(&self, pos: SlotPos, expected: u64) {
        let _ = (pos, expected);
    }

    /// How long a writer that lost a round waits for it to end before it calls
    /// [`WriteHooks::round_stuck`]. `None` (the default): it never does.
    fn stuck_after(&self) -> Option<std::time::Duration> {
        None
    }

    /// The round this writer lost has not ended after [`WriteHooks::stuck_after`]: its backups
    /// split and whoever should finish it stopped (a paused or cut-off writer). FUSEE asks
    /// its master to fence and repair the cluster, which finishes or rolls back the round;
    /// the writer's next verb is refused and it settles in the new epoch. Called once per
    /// wait; the writer goes on waiting.
    fn round_stuck(&self, state: &str) {
        let _ = state;
    }

    /// A DELETE writer's mark ([`crate::delete_mark`]): its round proposes
    /// [`crate::tombstone_by`]`(replaced, mark)`, a word no other DELETE in flight proposes,
    /// so SNAPSHOT decides between two DELETEs of one value as between any two writers. It
    /// must be the same when [`RaceIndex::resume`] finishes a crashed writer's round. 0 (the
    /// default): the plain [`crate::tombstone`], shared by every DELETE of that value.
    fn delete_mark(&self) -> u64 {
        0
    }
}

/// No hooks.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoHooks;

impl WriteHooks for NoHooks {}

/// How [`RaceIndex::resume`] found a crashed writer's round.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResumeOutcome {
    /// The primary already held the writer's value (for a DELETE: the key is absent).
    AlreadyDone,
    /// The writer's value was in some backups and the rules make it the last writer: the
    /// round was finished now (backups repaired, primary swapped from `old`).
    Won { old: u64 },
    /// The writer's value was in some backups but another writer wins the round; that writer
    /// finished it.
    Lost,
    /// The writer's value is nowhere in the key's buckets: it never reached the index (or it
    /// was replaced since).
    NotStarted,
}

pub(crate) const RESUME: &str = "kv_index.resume";

impl RaceIndex {
    /// SEARCH that also says where the key's slot is (for an address cache).
    pub fn search_at<V: KeyVerifier + ?Sized>(
        &self,
        verifier: &V,
        key: &[u8],
    ) -> Result<Option<(Slot, SlotPos)>> {
        dmkit_verbs::block_on(self.search_at_async(verifier, key))
    }

    /// [`Self::search_at`], awaited: many may be in flight on one thread.
    pub async fn search_at_async<V: KeyVerifier + ?Sized>(
        &self,
        verifier: &V,
        key: &[u8],
    ) -> Result<Option<(Slot, SlotPos)>> {
        let kh = self.hash(key);
        let mut backoff = Backoff::new(self.wait_timeout);
        loop {
            let view = self.read_view_async(crate::tags::SEARCH, &kh).await?;
            let cands = view.candidates(&kh)?;
            let slots: Vec<Slot> = cands.iter().map(|c| c.2).collect();
            if !slots.is_empty() {
                // "Absent" is confirmed (the candidates' words re-read): an object read after
                // its slot moved on may have been freed and reused by another key, which says
                // nothing about this one (a reader paused between its two reads meets it).
                match self
                    .find_confirmed_async(crate::tags::SEARCH, verifier, key, &cands, &slots, true)
                    .await
                {
                    Ok(Some(i)) => return Ok(Some((slots[i], cands[i].0))),
                    Ok(None) => {}
                    Err(crate::Error::StaleCandidate) => {
                        self.stale(&mut backoff).await?;
                        continue;
                    }
                    Err(e) => return Err(e),
                }
            }
            if !view.splitting {
                return Ok(None);
            }
            // (A split that stands still is finished here: its owner may be the process
            // now recovering, or stopped for good.)
            self.wait_split(verifier, &mut backoff).await?;
        }
    }

    /// SEARCH while the replicas may disagree (a failover is repairing them): reads the key's
    /// buckets on every replica in one round trip and answers only if they agree on the
    /// key's candidate slots. `Ok(None)`: they disagree (or a split is under way) — the key
    /// is in a round the repair is deciding; ask again after it.
    pub fn search_agreed<V: KeyVerifier + ?Sized>(
        &self,
        verifier: &V,
        key: &[u8],
    ) -> Result<Option<Option<(Slot, SlotPos)>>> {
        let kh = self.hash(key);
        let e = self.lookup(&kh);
        let reads = self.post_reads(e.subtable, &kh);
        let base = self.spaces[0].region.base + self.spaces[0].offset;
        let mut batches = Vec::new();
        let mut idx = Vec::new();
        for sp in &self.spaces {
            let mut b = self.ep.batch(sp.region.node);
            let i = reads.map(|(a, len)| b.read(sp.at(a.addr - base), len));
            batches.push(b);
            idx.push(i);
        }
        let mut agreed: Option<Vec<(SlotPos, u64, Slot)>> = None;
        for (r, i) in self
            .ep
            .execute_many(crate::tags::SEARCH, batches)
            .into_iter()
            .zip(idx)
        {
            let r = r?;
            let Some(view) = self.parse_view(e.subtable, &kh, [r.read(i[0]), r.read(i[1])])? else {
                return Ok(None);
            };
            if view.splitting {
                return Ok(None);
            }
            let cands = view.candidates(&kh)?;
            match &agreed {
                None => agreed = Some(cands),
                Some(a) if *a == cands => {}
                Some(_) => return Ok(None),
            }
        }
        let cands = agreed.unwrap_or_default();
        let slots: Vec<Slot> = cands.iter().map(|c| c.2).collect();
        if slots.is_empty() {
            return Ok(Some(None));
        }
        match verifier.find(&self.ep, key, &slots) {
            Ok(Some(i)) if i < slots.len() => Ok(Some(Some((slots[i], cands[i].0)))),
            // Candidates, none of them the key's: their objects may have been freed and
            // reused by other keys after the buckets were read (their slots moved on), which
            // says nothing about this key. Ask again after the repair.
            Ok(_) => Ok(None),
            // The key's round moved on meanwhile: ask again after the repair.
            Err(crate::Error::StaleCandidate) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The primary copy of the slot at `pos`: read it (8 bytes) to check a cached address.
    pub fn primary_slot_addr(&self, pos: SlotPos) -> RemoteAddr {
        self.slot_addr(0, pos)
    }

    /// Where `key`'s entry cached at `pos` is now, as this client's directory knows the
    /// index: a split moves an entry to its new subtable at the same bucket and slot, so a
    /// position cached before any number of splits is translated without a round (the
    /// caller checks the slot word and the object it points to, as for any cached position:
    /// a directory that does not know the split yet just gives the old position back).
    pub fn current_pos(&self, key: &[u8], pos: SlotPos) -> SlotPos {
        SlotPos {
            subtable: self.lookup(&self.hash(key)).subtable,
            ..pos
        }
    }

    /// Recovery of a crashed writer of `key` whose new slot value was `new` (0 for a DELETE,
    /// whose round proposed the tombstone of the key's slot word):
    /// finds where the round stands on the primary and the backups and finishes it — as the
    /// winner if the SNAPSHOT rules say so (calling `hooks.before_primary` before the swap),
    /// otherwise by waiting for the winner.
    pub fn resume<V: KeyVerifier + ?Sized>(
        &self,
        verifier: &V,
        key: &[u8],
        new: u64,
        hooks: &dyn WriteHooks,
    ) -> Result<ResumeOutcome> {
        let kh = self.hash(key);
        let mut backoff = Backoff::new(self.wait_timeout);
        loop {
            let view = self.read_view(RESUME, &kh)?;
            let frozen = view.slots(&kh).any(|(_, raw)| is_frozen(raw));
            if view.splitting || frozen {
                // The split's owner may be the crashed writer this recovery resumes (a
                // gateway killed mid-split, restarting): a split that stands still is
                // finished here rather than waited out.
                dmkit_verbs::block_on(self.wait_split(verifier, &mut backoff))?;
                continue;
            }
            // Which position is the round about?
            let positions: Vec<(SlotPos, u64)> = view.slots(&kh).collect();
            let target: Option<(SlotPos, u64)> = if new != 0 {
                if positions.iter().any(|(_, raw)| thaw(*raw) == new) {
                    return Ok(ResumeOutcome::AlreadyDone);
                }
                None
            } else {
                // A DELETE: the key's current slot, if the key is still there.
                let cands = view.candidates(&kh)?;
                let slots: Vec<Slot> = cands.iter().map(|c| c.2).collect();
                let found = match (!slots.is_empty())
                    .then(|| verifier.find(&self.ep, key, &slots))
                    .transpose()
                {
                    Err(crate::Error::StaleCandidate) => {
                        dmkit_verbs::block_on(self.stale(&mut backoff))?;
                        continue;
                    }
                    r => r?.flatten(),
                };
                match found {
                    Some(i) if i < cands.len() => Some((cands[i].0, cands[i].1)),
                    // The key is gone: deleted (by this writer, or another).
                    _ => return Ok(ResumeOutcome::AlreadyDone),
                }
            };
            if self.spaces.len() == 1 {
                return Ok(ResumeOutcome::NotStarted);
            }
            // A DELETE proposed the tombstone of the word it found, with its mark.
            let new = match target {
                Some((_, raw)) if new == 0 => tombstone_by(raw, hooks.delete_mark()),
                _ => new,
            };
            // The backups' words at every candidate position (one round trip).
            let look: Vec<(SlotPos, u64)> = match target {
                Some(t) => vec![t],
                None => positions,
            };
            let batches: Vec<_> = (1..self.spaces.len())
                .map(|k| {
                    let mut b = self.ep.batch(self.spaces[k].region.node);
                    let idx: Vec<_> = look
                        .iter()
                        .map(|(pos, _)| b.read(self.slot_addr(k, *pos), 8))
                        .collect();
                    (b, idx)
                })
                .collect();
            let (batches, idx): (Vec<_>, Vec<_>) = batches.into_iter().unzip();
            let mut backups = vec![Vec::with_capacity(self.spaces.len() - 1); look.len()];
            for (res, idx) in self.ep.execute_many(RESUME, batches).into_iter().zip(idx) {
                let res = res?;
                for (j, i) in idx.into_iter().enumerate() {
                    let w = res.read(i);
                    backups[j].push(u64::from_le_bytes(w.try_into().unwrap_or([0; 8])));
                }
            }
            let hit = look
                .iter()
                .zip(&backups)
                .find(|(_, olds)| olds.contains(&new));
            let Some(((pos, expected), olds)) = hit else {
                return Ok(ResumeOutcome::NotStarted);
            };
            let (pos, expected) = (*pos, *expected);
            // Backups already holding our value are the CASes we won before crashing; those
            // still holding `expected` never saw our CAS: make it now, as the crashed writer
            // would have, and judge the round on what the backups really answered.
            let pending: Vec<usize> = olds
                .iter()
                .enumerate()
                .filter(|(_, o)| **o == expected)
                .map(|(k, _)| k)
                .collect();
            let mut answered = olds.clone();
            if !pending.is_empty() {
                let batches = pending
                    .iter()
                    .map(|&k| {
                        let mut b = self.ep.batch(self.spaces[k + 1].region.node);
                        let i = b.cas(self.slot_addr(k + 1, pos), expected, new);
                        (b, i)
                    })
                    .collect::<Vec<_>>();
                let (batches, idx): (Vec<_>, Vec<_>) = batches.into_iter().unzip();
                for ((res, i), &k) in self
                    .ep
                    .execute_many(RESUME, batches)
                    .into_iter()
                    .zip(idx)
                    .zip(&pending)
                {
                    let old = res?.old(i);
                    answered[k] = if old == expected { new } else { old };
                }
            }
            let seen: Vec<u64> = answered
                .iter()
                .map(|&o| if o == new { expected } else { o })
                .collect();
            // The round goes on as a live writer's would (`finish_round_async`), judged on
            // what the backups answered: a rule-3 win re-reads the primary first (the answers
            // of backups not CASed now are a read's, and the round may have ended since),
            // missed repairs are forced, and a loser takes its value back out of the backups.
            // (Resuming without those let a recovered writer repair backups of a round that
            // had ended and then resume into the next round with its stale value, swapping it
            // in after a DELETE: found by the protocol model, crates/fusee/tests/protocol_model.rs.)
            let (out, _) = dmkit_verbs::block_on(self.finish_round_async(
                RESUME,
                pos,
                expected,
                new,
                &seen,
                &[],
                hooks,
            ))?;
            match out {
                RawOutcome::Won(_) => return Ok(ResumeOutcome::Won { old: expected }),
                // A split froze the slot: look again once it is done.
                RawOutcome::Lost(now) if is_frozen(now) => {}
                RawOutcome::Lost(_) => return Ok(ResumeOutcome::Lost),
            }
            if !backoff.pause() {
                return Err(crate::Error::SnapshotStalled {
                    waited: backoff.waited(),
                    state: format!(
                        "resuming slot {:?} of a crashed writer",
                        look.first().map(|l| l.0)
                    ),
                });
            }
        }
    }
}
