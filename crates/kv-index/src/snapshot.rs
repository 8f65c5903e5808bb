//! SNAPSHOT: last-writer-wins replication of one slot over r replicas, without a lock.
//!
//! A writer knows the primary's current value `expected` (from its bucket read). It CASes
//! every backup `expected → new` in one round trip, and judges from the old values:
//!
//! 1. it won **all** backups → it is the last writer;
//! 2. it won a **majority** of the backups → it is the last writer;
//! 3. nobody holds a majority and its value is the **smallest** among the values now in the
//!    backups (and it won at least one) → it is the last writer.
//!
//! The winner repairs the backups it lost (CAS the value it saw → its value), then CASes the
//! primary `expected → new`: the primary only changes once every backup agrees. Losers wait
//! until the primary changes and report it. With r = 1 the primary CAS alone decides.
//!
//! Hardening beyond the paper: a rule-3 winner first re-reads the primary. If it no longer
//! holds `expected`, the round ended before some of this writer's backup CASes ran, so the
//! values they returned belong to a later round and the judgment is void; the writer loses
//! instead of "repairing" a backup that a later round owns. Rules 1 and 2 need no check: the
//! round cannot end before its winner swaps the primary.

use dmkit_verbs::{RemoteAddr, Tag};

use crate::error::{Error, Result};
use crate::hooks::{NoHooks, WriteHooks};
use crate::index::{Backoff, RaceIndex};
use crate::layout::SlotPos;
use crate::slot::{is_empty_word, is_frozen};

/// Which SNAPSHOT rule made a writer the last writer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Rule {
    /// r = 1: the primary CAS alone decided.
    PrimaryOnly,
    /// Rule 1: won every backup.
    AllBackups,
    /// Rule 2: won a majority of the backups.
    Majority,
    /// Rule 3: no majority anywhere; this writer's value is the smallest one voted.
    SmallestValue,
}

impl Rule {
    fn label(self) -> &'static str {
        match self {
            Rule::PrimaryOnly => "primary_only",
            Rule::AllBackups => "all_backups",
            Rule::Majority => "majority",
            Rule::SmallestValue => "smallest_value",
        }
    }
}

/// How a SNAPSHOT round ended for this writer (raw slot words).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RawOutcome {
    Won(Rule),
    /// Lost; the primary now holds this word.
    Lost(u64),
}

/// **The** SNAPSHOT round-decision rule: judges a writer's round from the old values its
/// backup CASes returned, and says which rule makes it the last writer (`None`: it lost).
///
/// `expected` is the primary's word the writer read (what every backup CAS expected), `new`
/// the word it proposed, `olds` the value each backup CAS found, in backup order (a CAS
/// won where the old value is `expected`). With r index replicas there are r − 1 backups;
/// r = 1 has none and never asks (the primary CAS alone decides, [`Rule::PrimaryOnly`]).
///
/// The rules, in order: won every backup ([`Rule::AllBackups`]); won a majority, counting
/// backups that hold the same proposal from another writer (two DELETEs of one value
/// propose the same tombstone) ([`Rule::Majority`]); nobody holds a majority of the backups
/// as they now stand and `new` is the smallest word among them, having won at least one
/// ([`Rule::SmallestValue`]). Every writer, its recovery and the protocol model
/// (`crates/fusee/tests/protocol_model.rs`) judge a round with this function.
///
/// ```
/// use dmkit_kv_index::{Rule, decide};
///
/// // r = 3 (two backups), the primary held 0: a writer proposing 5 won both backup CASes.
/// assert_eq!(decide(0, 5, &[0, 0]), Some(Rule::AllBackups));
/// // Split vote between 5 and 9: the smaller value wins by rule 3, the other one loses.
/// assert_eq!(decide(0, 5, &[0, 9]), Some(Rule::SmallestValue));
/// assert_eq!(decide(0, 9, &[5, 0]), None);
/// // r = 2 (one backup): the one CAS decides.
/// assert_eq!(decide(0, 5, &[4]), None);
/// ```
pub fn decide(expected: u64, new: u64, olds: &[u64]) -> Option<Rule> {
    let b = olds.len();
    let wins = olds.iter().filter(|&&o| o == expected).count();
    if wins == b {
        return Some(Rule::AllBackups);
    }
    if 2 * wins > b {
        return Some(Rule::Majority);
    }
    if wins == 0 {
        return None;
    }
    let view: Vec<u64> = olds
        .iter()
        .map(|&o| if o == expected { new } else { o })
        .collect();
    // Two writers can propose the same value (two DELETEs, or a DELETE and an INSERT's
    // retraction: the same tombstone). Backups holding it count for either: a majority for our own value
    // is ours too, and the primary CAS picks which of us reports the change.
    if 2 * view.iter().filter(|w| **w == new).count() > b {
        return Some(Rule::Majority);
    }
    let someone_has_majority = view
        .iter()
        .any(|v| 2 * view.iter().filter(|w| *w == v).count() > b);
    if someone_has_majority {
        return None;
    }
    (view.iter().min() == Some(&new)).then_some(Rule::SmallestValue)
}

/// The handles of `dmkit_kv_index_snapshot_rounds_total`, one per outcome (a won round by its
/// rule, then a lost one), each looked up once per index under the recorder of its first
/// round: no key built and hashed per write.
#[derive(Debug, Default)]
pub(crate) struct RoundCounters([std::sync::OnceLock<metrics::Counter>; 5]);

impl RoundCounters {
    fn record(&self, outcome: &RawOutcome) {
        let (i, labels) = match outcome {
            RawOutcome::Won(r) => (*r as usize, ("won", r.label())),
            RawOutcome::Lost(_) => (4, ("lost", "none")),
        };
        self.0[i]
            .get_or_init(|| {
                metrics::counter!("dmkit_kv_index_snapshot_rounds_total", "outcome" => labels.0, "rule" => labels.1)
            })
            .increment(1);
    }
}

impl RaceIndex {
    pub(crate) fn slot_addr(&self, replica: usize, pos: SlotPos) -> RemoteAddr {
        self.spaces[replica].at(self.layout.slot_off(pos))
    }

    /// One SNAPSHOT round on one slot. `post` are READs (on the primary) appended to the
    /// primary CAS batch; their bytes come back when this writer swapped the primary.
    pub(crate) async fn snapshot_async(
        &self,
        tag: Tag,
        pos: SlotPos,
        expected: u64,
        new: u64,
        post: &[(RemoteAddr, usize)],
        hooks: &dyn WriteHooks,
    ) -> Result<(RawOutcome, Vec<Vec<u8>>)> {
        let r = if self.spaces.len() == 1 {
            let (ok, now, bytes) = self
                .swap_primary_async(tag, pos, expected, new, post, hooks)
                .await?;
            if ok {
                (RawOutcome::Won(Rule::PrimaryOnly), bytes)
            } else {
                (RawOutcome::Lost(now), Vec::new())
            }
        } else {
            let olds = self.cas_backups_async(tag, &[(pos, expected, new)]).await?;
            self.finish_round_async(tag, pos, expected, new, &olds[0], post, hooks)
                .await?
        };
        self.rounds.record(&r.0);
        Ok(r)
    }

    /// A loser takes its value back out of the backups its CAS won (`new → expected`), once
    /// the round is over. Normally the winner's repairs replaced it already and these CASes
    /// fail harmlessly; but a CAS that landed after the winner's round ended (the backup
    /// had returned to `expected`: a DELETE of the winner's value, A-B-A) left an orphan that
    /// no winner would ever repair, and every later round on the slot lost to it by rule 3.
    async fn withdraw_async(
        &self,
        tag: Tag,
        pos: SlotPos,
        expected: u64,
        new: u64,
        olds: &[u64],
    ) -> Result<()> {
        if new == expected {
            return Ok(());
        }
        let won: Vec<usize> = (0..olds.len()).filter(|k| olds[*k] == expected).collect();
        self.take_back_from_async(tag, pos, new, expected, &won)
            .await
    }

    /// CASes backups `which` (0 = the first backup) `ours → to`, all in one round trip.
    async fn take_back_from_async(
        &self,
        tag: Tag,
        pos: SlotPos,
        ours: u64,
        to: u64,
        which: &[usize],
    ) -> Result<()> {
        if which.is_empty() {
            return Ok(());
        }
        let batches = which
            .iter()
            .map(|k| {
                let mut b = self.ep.batch(self.spaces[k + 1].region.node);
                b.cas(self.slot_addr(k + 1, pos), ours, to);
                b
            })
            .collect();
        for r in self.ep.execute_many_async(tag, batches).await {
            r?;
        }
        Ok(())
    }

    /// The last writer's primary swap: the hooks' work before it (in the CAS's batch where
    /// they can put it there, [`WriteHooks::with_primary`]), then the CAS.
    async fn swap_primary_async(
        &self,
        tag: Tag,
        pos: SlotPos,
        expected: u64,
        new: u64,
        post: &[(RemoteAddr, usize)],
        hooks: &dyn WriteHooks,
    ) -> Result<(bool, u64, Vec<Vec<u8>>)> {
        let primary = self.primary_node();
        let lead = hooks
            .with_primary(expected, primary)
            .filter(|b| b.node() == primary);
        if lead.is_none() {
            hooks.before_primary_async(expected).await?;
        }
        self.cas_primary_async(tag, pos, expected, new, post, lead)
            .await
    }

    /// CAS on the primary plus trailing READs in the same batch, after `lead`'s verbs (a batch
    /// for the primary's node) when there are some: one round trip.
    pub(crate) async fn cas_primary_async(
        &self,
        tag: Tag,
        pos: SlotPos,
        expected: u64,
        new: u64,
        post: &[(RemoteAddr, usize)],
        lead: Option<dmkit_verbs::Batch>,
    ) -> Result<(bool, u64, Vec<Vec<u8>>)> {
        let mut b = lead.unwrap_or_else(|| self.ep.batch(self.primary_node()));
        let c = b.cas(self.slot_addr(0, pos), expected, new);
        let reads: Vec<_> = post.iter().map(|(a, l)| b.read(*a, *l)).collect();
        let res = self.ep.execute_async(tag, b).await?;
        let old = res.old(c);
        let bytes = if old == expected || (old == new && !is_empty_word(new)) {
            reads.into_iter().map(|i| res.read(i).to_vec()).collect()
        } else {
            Vec::new()
        };
        Ok((old == expected, old, bytes))
    }

    /// CASes every backup of every item `expected → new`, all backups in parallel: one round
    /// trip. Returns, per item, the old values in backup order.
    pub(crate) async fn cas_backups_async(
        &self,
        tag: Tag,
        items: &[(SlotPos, u64, u64)],
    ) -> Result<Vec<Vec<u64>>> {
        let mut batches = Vec::with_capacity(self.spaces.len() - 1);
        let mut idx = Vec::with_capacity(self.spaces.len() - 1);
        for k in 1..self.spaces.len() {
            let mut b = self.ep.batch(self.spaces[k].region.node);
            idx.push(
                items
                    .iter()
                    .map(|(pos, e, n)| b.cas(self.slot_addr(k, *pos), *e, *n))
                    .collect::<Vec<_>>(),
            );
            batches.push(b);
        }
        let results = self.ep.execute_many_async(tag, batches).await;
        let mut out = vec![Vec::with_capacity(self.spaces.len() - 1); items.len()];
        for (res, idx) in results.into_iter().zip(idx) {
            let res = res?;
            for (o, i) in out.iter_mut().zip(idx) {
                o.push(res.old(i));
            }
        }
        Ok(out)
    }

    /// Judges a round from the backups' old values and finishes it: repair and swap the
    /// primary if this writer won, wait for the primary to change if it lost.
    // The round's identity (slot, expected, new), its judgment input (olds) and what rides on
    // the primary swap (post reads, hooks): splitting them into structs would only rename them.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn finish_round_async(
        &self,
        tag: Tag,
        pos: SlotPos,
        expected: u64,
        new: u64,
        olds: &[u64],
        post: &[(RemoteAddr, usize)],
        hooks: &dyn WriteHooks,
    ) -> Result<(RawOutcome, Vec<Vec<u8>>)> {
        let Some(rule) = decide(expected, new, olds) else {
            let now = self.wait_change_async(tag, pos, expected, hooks).await?;
            self.withdraw_async(tag, pos, expected, new, olds).await?;
            return Ok((RawOutcome::Lost(now), Vec::new()));
        };
        if rule == Rule::SmallestValue {
            let now = self.read_primary_slot_async(tag, pos).await?;
            if now != expected {
                self.withdraw_async(tag, pos, expected, new, olds).await?;
                return Ok((RawOutcome::Lost(now), Vec::new()));
            }
        }
        if rule != Rule::AllBackups {
            let mut batches = Vec::new();
            let mut which = Vec::new();
            for (k, &old) in olds.iter().enumerate() {
                if old != expected {
                    let mut b = self.ep.batch(self.spaces[k + 1].region.node);
                    let i = b.cas(self.slot_addr(k + 1, pos), old, new);
                    batches.push(b);
                    which.push((k + 1, old, i));
                }
            }
            let mut missed = Vec::new();
            for (r, (k, old, i)) in self
                .ep
                .execute_many_async(tag, batches)
                .await
                .into_iter()
                .zip(which)
            {
                let was = r?.old(i);
                if was != old && was != new {
                    missed.push(k);
                }
            }
            // A repair can miss when the value it replaces moved meanwhile (a loser of an
            // older round taking its value back). The primary must not change before every
            // backup holds the winner's value, or the slot stays split forever.
            for k in missed {
                self.force_backup_async(tag, k, pos, new).await?;
            }
        }
        let (ok, now, bytes) = self
            .swap_primary_async(tag, pos, expected, new, post, hooks)
            .await?;
        if ok || (now == new && (!is_empty_word(new) || hooks.delete_mark() != 0)) {
            // (`now == new` with a unique value — an object's word, a marked tombstone:
            // recovery already finished our round.)
            return Ok((RawOutcome::Won(rule), bytes));
        }
        if now == new {
            // Another writer proposing the same value (the tombstone of the value both
            // replace: a DELETE or a retraction) shared
            // our majority and swapped the primary first: the round is over and the backups
            // already agree with it. Rolling them back would undo it.
            return Ok((RawOutcome::Lost(now), Vec::new()));
        }
        // The primary moved without a round winner: a split froze it after our backup CASes
        // ran on backups it had already unfrozen (the value came back: A-B-A). Take our
        // value out of the backups again, so they agree with the primary, and let the
        // round's other writers see it abandoned.
        let all: Vec<usize> = (0..self.spaces.len() - 1).collect();
        self.take_back_from_async(tag, pos, new, expected, &all)
            .await?;
        metrics::counter!("dmkit_kv_index_snapshot_abandoned_total").increment(1);
        Ok((RawOutcome::Lost(now), Vec::new()))
    }

    /// CASes the primary of every item (one batch); items whose primary held something else
    /// go to `again`, retargeted from what it held.
    async fn cas_primaries(
        &self,
        tag: Tag,
        items: &[(SlotPos, u64, u64)],
        again: &mut Vec<(SlotPos, u64, u64)>,
        retarget: &impl Fn(u64) -> u64,
    ) -> Result<()> {
        let mut b = self.ep.batch(self.primary_node());
        let idx: Vec<_> = items
            .iter()
            .map(|(pos, e, n)| b.cas(self.slot_addr(0, *pos), *e, *n))
            .collect();
        let res = self.ep.execute_async(tag, b).await?;
        for (it, i) in items.iter().zip(idx) {
            let old = res.old(i);
            if old != it.1 {
                again.push((it.0, old, retarget(old)));
            }
        }
        Ok(())
    }

    /// Moves backup `k` of `pos` to `new` with CASes from whatever it holds.
    async fn force_backup_async(&self, tag: Tag, k: usize, pos: SlotPos, new: u64) -> Result<()> {
        let at = self.slot_addr(k, pos);
        for _ in 0..64 {
            let v = self.ep.read_async(tag, at, 8).await?;
            let cur = u64::from_le_bytes(v[..8].try_into().map_err(|_| Error::Corrupt {
                node: self.spaces[k].region.node,
                what: "short slot read".into(),
            })?);
            if cur == new || is_frozen(cur) {
                // (Frozen: a split holds the slot; the primary swap will fail and roll back.)
                return Ok(());
            }
            if self.ep.cas_async(tag, at, cur, new).await? == cur {
                metrics::counter!("dmkit_kv_index_forced_repairs_total").increment(1);
                return Ok(());
            }
        }
        Err(Error::SnapshotStalled {
            waited: std::time::Duration::ZERO,
            state: format!("backup {k} of slot {pos:?} kept changing under a repair"),
        })
    }

    pub(crate) async fn read_primary_slot_async(&self, tag: Tag, pos: SlotPos) -> Result<u64> {
        let v = self.ep.read_async(tag, self.slot_addr(0, pos), 8).await?;
        Ok(u64::from_le_bytes(v[..8].try_into().map_err(|_| {
            Error::Corrupt {
                node: self.primary_node(),
                what: "short slot read".into(),
            }
        })?))
    }

    /// A loser waits until the primary no longer holds `expected`; returns what it holds.
    /// Returns `expected` itself when the round was abandoned (every backup holds `expected`
    /// again: the winner took its value back, see [`Self::finish_round`]).
    pub(crate) async fn wait_change_async(
        &self,
        tag: Tag,
        pos: SlotPos,
        expected: u64,
        hooks: &dyn WriteHooks,
    ) -> Result<u64> {
        let mut backoff = Backoff::new(self.wait_timeout);
        let mut stuck_after = hooks.stuck_after();
        loop {
            let (batches, idx): (Vec<_>, Vec<_>) = (0..self.spaces.len())
                .map(|k| {
                    let mut b = self.ep.batch(self.spaces[k].region.node);
                    let i = b.read(self.slot_addr(k, pos), 8);
                    (b, i)
                })
                .unzip();
            let mut vals = Vec::with_capacity(self.spaces.len());
            for (r, i) in self
                .ep
                .execute_many_async(tag, batches)
                .await
                .into_iter()
                .zip(idx)
            {
                let r = r?;
                let w = crate::index::words(r.read(i));
                vals.push(
                    w.first()
                        .copied()
                        .ok_or_else(|| self.corrupt("short slot read"))?,
                );
            }
            if vals[0] != expected {
                return Ok(vals[0]);
            }
            if vals[1..].iter().all(|&v| v == expected) {
                return Ok(expected);
            }
            if stuck_after.is_some_and(|d| backoff.waited() >= d) {
                stuck_after = None;
                metrics::counter!("dmkit_kv_index_snapshot_stuck_total").increment(1);
                hooks.round_stuck(&format!(
                    "slot {pos:?} expected {expected:#x}, primary and backups {vals:x?}"
                ));
            }
            if !backoff.pause_async().await {
                if dmkit_verbs::sim::trace::on() {
                    for k in 0..self.spaces.len() {
                        let a = self.slot_addr(k, pos);
                        eprintln!("replica {k} ({} {:#x}):", a.node, a.addr);
                        for line in dmkit_verbs::sim::trace::word_history(a.node, a.addr) {
                            eprintln!("  {line}");
                        }
                    }
                }
                return Err(Error::SnapshotStalled {
                    waited: backoff.waited(),
                    state: format!(
                        "slot {pos:?} expected {expected:#x}, primary and backups {:x?}",
                        vals
                    ),
                });
            }
        }
    }

    /// Runs SNAPSHOT rounds for many slots at once (a split freezing a subtable): every
    /// item ends with the primary holding `retarget(v)` for the value `v` it last held.
    pub(crate) async fn snapshot_many(
        &self,
        tag: Tag,
        mut items: Vec<(SlotPos, u64, u64)>,
        retarget: impl Fn(u64) -> u64,
    ) -> Result<()> {
        let mut backoff = Backoff::new(self.wait_timeout);
        while !items.is_empty() {
            let mut again = Vec::new();
            if self.spaces.len() == 1 {
                self.cas_primaries(tag, &items, &mut again, &retarget)
                    .await?;
            } else {
                let olds = self.cas_backups_async(tag, &items).await?;
                let mut rule1 = Vec::new();
                for (it, o) in items.iter().zip(&olds) {
                    // A backup may hold our value already: the same proposal from a split
                    // holder that stopped midway (freezes propose `v | FROZEN`, whoever runs
                    // them). Every backup holds it now either way.
                    if o.iter().all(|&v| v == it.1 || v == it.2) {
                        rule1.push(*it);
                    } else {
                        match self
                            .finish_round_async(tag, it.0, it.1, it.2, o, &[], &NoHooks)
                            .await?
                            .0
                        {
                            RawOutcome::Won(_) => {}
                            RawOutcome::Lost(now) => again.push((it.0, now, retarget(now))),
                        }
                    }
                }
                if !rule1.is_empty() {
                    self.cas_primaries(tag, &rule1, &mut again, &retarget)
                        .await?;
                }
            }
            if !again.is_empty() && !backoff.pause_async().await {
                return Err(Error::SnapshotStalled {
                    waited: backoff.waited(),
                    state: format!("{} slots still moving", again.len()),
                });
            }
            items = again;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_pick_one_winner() {
        // r = 3: two backups.
        assert_eq!(decide(0, 5, &[0, 0]), Some(Rule::AllBackups));
        // Split vote: the smaller value wins, the larger loses.
        assert_eq!(decide(0, 5, &[0, 9]), Some(Rule::SmallestValue));
        assert_eq!(decide(0, 9, &[5, 0]), None);
        assert_eq!(decide(0, 9, &[5, 5]), None);
        // r = 5: four backups.
        assert_eq!(decide(0, 5, &[0, 0, 0, 7]), Some(Rule::Majority));
        assert_eq!(decide(0, 7, &[5, 5, 5, 0]), None);
        // 2-2 tie between two writers: smallest wins.
        assert_eq!(decide(0, 5, &[0, 0, 7, 7]), Some(Rule::SmallestValue));
        assert_eq!(decide(0, 7, &[5, 5, 0, 0]), None);
        // Three writers 2-1-1: nobody has a majority (3 of 4); smallest voted value wins.
        assert_eq!(decide(0, 3, &[0, 8, 9, 8]), Some(Rule::SmallestValue));
        assert_eq!(decide(0, 8, &[3, 0, 9, 0]), None);
        // Two writers proposing the same value (0: two deletes) share a majority.
        assert_eq!(decide(7, 0, &[7, 0]), Some(Rule::Majority));
        assert_eq!(decide(7, 0, &[0, 7]), Some(Rule::Majority));
        // r = 2: one backup.
        assert_eq!(decide(0, 5, &[0]), Some(Rule::AllBackups));
        assert_eq!(decide(0, 5, &[4]), None);
    }
}
