//! FUSEE's protocol decisions as pure functions: what the master's repair keeps of a round a
//! failover cut short, whether a client's write cut short by a membership change took
//! effect, and how recovery starts on a crashed writer's log entry.
//!
//! The client ([`crate::Client`]), its recovery and the master ([`crate::failover`]) decide
//! with these functions, and so does the protocol model checked by stateright
//! (`crates/fusee/tests/protocol_model.rs`), so the model and the code cannot drift apart.
//! They take the facts the caller gathered (slot words, flags); where gathering a fact costs
//! a round trip the caller passes a closure, called only when the rule needs it (the code's
//! round trips are the same as before the rules were pulled out). The round-decision rule of
//! SNAPSHOT itself is [`dmkit_kv_index::decide`]; what the master's repair keeps of a slot
//! whose replicas disagree is [`dmkit_kv_index::repair::repair_choice`] and
//! [`dmkit_kv_index::repair::repair_completed_delete`].

// The repair's choice for a conflicting slot and its completed-DELETE rule are the index
// layer's: `dmkit_kv_index::repair::{repair_choice, repair_completed_delete}`.

/// Whether the membership lists a DELETE round the master completed after `epoch` that is
/// the attempt's `round` (slot offset, value replaced) whose proposal was the tombstone
/// `own`: `deletes` holds (epoch, slot offset, the tombstone the repair chose). (Records
/// written before session 12 list the value replaced, 0 for "unknown": still honoured.)
pub fn delete_listed(
    round: Option<(u64, u64)>,
    own: u64,
    epoch: u64,
    deletes: &[(u64, u64, u64)],
) -> bool {
    round.is_some_and(|(off, old)| {
        deletes.iter().any(|&(e, o, v)| {
            e > epoch && o == off && (v == old || v == 0 || (own != 0 && v == own))
        })
    })
}

/// What a client knows of a write attempt cut short by a membership change, once the new
/// membership is active (see [`settle`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SettleFacts {
    /// The attempt was a DELETE.
    pub delete: bool,
    /// The attempt's commit record is there.
    pub committed: bool,
    /// A failover since the attempt kept only the old primary's index replica: its repair
    /// could not see the backups.
    pub blind_since: bool,
    /// Index replicas serving in the attempt's epoch.
    pub attempt_replicas: usize,
    /// Index replicas serving now.
    pub replicas_now: usize,
    /// The index primary is another node than in the attempt's epoch.
    pub primary_moved: bool,
    /// (DELETE) a failover since the attempt lost the index primary.
    pub primary_lost_since: bool,
    /// (DELETE) the attempt's last round reached its primary swap (every backup held it).
    pub swapping: bool,
    /// (DELETE) the attempt's primary CAS may have run: it was posted and the error that cut
    /// the attempt short is not a refusal by the node (a refused verb did not run).
    pub primary_may_have_run: bool,
    /// (DELETE) the membership lists the attempt's round as completed by the master
    /// ([`delete_listed`]).
    pub listed: bool,
    /// (DELETE) the attempt had found the key.
    pub found: bool,
}

/// Whether a write attempt cut short by a membership change took effect. `referenced()`:
/// the key's slot names the attempt's object (INSERT, UPDATE); `key_absent()`: the key is
/// absent now (DELETE). Each is called only when the rule needs it. A DELETE that took
/// effect still claims its round (two DELETEs of one value can both pass these tests).
///
/// The rules: a commit record counts when the repairs since could see the round (`visible`:
/// no blind failover, the attempt ran with a backup, and the index still has one or its
/// primary moved); an INSERT or UPDATE whose object the key names took effect. A DELETE
/// took effect when its round held every backup and a failover lost the primary (the repair
/// kept the backups' value), when the master lists it, or when it was committed, had found
/// the key, its primary CAS may have run and the key is gone. (Without the last-but-one
/// test, a DELETE whose primary CAS never ran — its commit record write or the CAS itself
/// refused by the fence — counted another DELETE's emptying of the key as its own, after a
/// failover that kept only the old primary: two DELETEs reported for one deletion, the open
/// seed 406660, found again by the protocol model.)
pub fn settle<E>(
    f: &SettleFacts,
    referenced: impl FnOnce() -> Result<bool, E>,
    key_absent: impl FnOnce() -> Result<bool, E>,
) -> Result<bool, E> {
    let visible =
        !f.blind_since && f.attempt_replicas >= 2 && (f.replicas_now >= 2 || f.primary_moved);
    if f.delete {
        let kept_by_repair = f.swapping && !f.blind_since && f.primary_lost_since;
        Ok(kept_by_repair
            || (f.committed && visible)
            || f.listed
            || (f.committed && f.found && f.primary_may_have_run && key_absent()?))
    } else {
        Ok(referenced()? || (f.committed && visible))
    }
}

/// How recovery starts on an unfinished log entry of a crashed writer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RedoStart {
    /// The key moved on past this entry's value and the word it replaced is back naming a
    /// reused object: not resumed (resuming would put an older value back); the entry is
    /// marked finished.
    Superseded,
    /// A committed entry whose key no longer holds the value it replaced: it is done.
    AlreadyDone,
    /// Resume the entry's SNAPSHOT round from where the slot stands.
    Resume,
}

/// The first decision of recovery on an unfinished entry: `delete`, and for an entry with a
/// commit record, `(holds, reused)` — the key's slot holds the word the record says was
/// replaced, and that word names an object whose generation changed since (freed and
/// reused).
pub fn redo_start(delete: bool, committed: Option<(bool, bool)>) -> RedoStart {
    let (done, aba) = match (delete, committed) {
        (true, Some((holds, reused))) => (!holds || reused, reused),
        // A committed write whose key no longer holds the word it replaced: its swap
        // happened (the record precedes it, and only the round's last writer — the one
        // with the record — or the master completing its round swaps that word), and the
        // key moved on since, perhaps by a later write recovery resumes first (entries of
        // different size classes have no common order). Resuming would find its value
        // nowhere and take it for never swapped in: the object it replaced would leak.
        (false, Some((holds, reused))) => (!holds, reused),
        (_, None) => (false, false),
    };
    if aba && !delete {
        RedoStart::Superseded
    } else if done {
        RedoStart::AlreadyDone
    } else {
        RedoStart::Resume
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redo_start_rules() {
        assert_eq!(redo_start(false, None), RedoStart::Resume);
        assert_eq!(redo_start(true, None), RedoStart::Resume);
        assert_eq!(redo_start(true, Some((true, false))), RedoStart::Resume);
        assert_eq!(
            redo_start(true, Some((false, false))),
            RedoStart::AlreadyDone
        );
        assert_eq!(redo_start(true, Some((true, true))), RedoStart::AlreadyDone);
        assert_eq!(redo_start(false, Some((true, true))), RedoStart::Superseded);
        assert_eq!(
            redo_start(false, Some((false, false))),
            RedoStart::AlreadyDone
        );
        assert_eq!(redo_start(false, Some((true, false))), RedoStart::Resume);
    }

    #[test]
    fn settle_asks_only_what_it_needs() {
        let f = SettleFacts {
            committed: true,
            attempt_replicas: 2,
            replicas_now: 2,
            ..Default::default()
        };
        // Referenced decides first for an INSERT or UPDATE.
        assert_eq!(settle::<()>(&f, || Ok(false), || panic!()), Ok(true));
        // A blind failover hides the round: only the slot tells.
        let blind = SettleFacts {
            blind_since: true,
            ..f
        };
        assert_eq!(settle::<()>(&blind, || Ok(false), || panic!()), Ok(false));
        // A committed DELETE that found the key, blind: the key being gone tells.
        let d = SettleFacts {
            delete: true,
            found: true,
            primary_may_have_run: true,
            ..blind
        };
        assert_eq!(settle::<()>(&d, || panic!(), || Ok(true)), Ok(true));
        assert_eq!(settle::<()>(&d, || panic!(), || Ok(false)), Ok(false));
        // Its primary CAS never ran: the key being gone is another DELETE's doing.
        let never = SettleFacts {
            primary_may_have_run: false,
            ..d
        };
        assert_eq!(settle::<()>(&never, || panic!(), || panic!()), Ok(false));
    }

    #[test]
    fn completed_deletes_and_listing() {
        use dmkit_kv_index::repair::repair_completed_delete;
        const KEY: u64 = (1 << 47) | 1; // length class 1: a key
        let t = dmkit_kv_index::tombstone_by(KEY, 7);
        assert_eq!(repair_completed_delete(Some(KEY), &[t], t), Some(t));
        assert_eq!(repair_completed_delete(Some(KEY), &[t, KEY], KEY), None);
        assert_eq!(repair_completed_delete(Some(0), &[0, 0], 0), None);
        // An INSERT rolled back to the slot's old tombstone: listed, but only its long-done
        // DELETE could count it.
        assert_eq!(repair_completed_delete(Some(t), &[KEY], t), Some(t));
        assert!(delete_listed(Some((8, 5)), 0, 3, &[(4, 8, 5)]));
        assert!(delete_listed(Some((8, 5)), 0, 3, &[(4, 8, 0)]));
        assert!(!delete_listed(Some((8, 5)), 0, 4, &[(4, 8, 5)]));
        assert!(!delete_listed(None, 0, 0, &[(4, 8, 5)]));
        // The old primary lost, the survivors held two DELETEs' tombstones: the one chosen
        // is listed, and only its DELETE counts it.
        let (t1, t2) = (
            dmkit_kv_index::tombstone_by(KEY, 7),
            dmkit_kv_index::tombstone_by(KEY, 9),
        );
        let chosen = t1.min(t2);
        assert_eq!(
            repair_completed_delete(None, &[t1, t2], chosen),
            Some(chosen)
        );
        assert_eq!(repair_completed_delete(None, &[0, 0], 0), None);
        let deletes = [(4, 8, chosen)];
        assert!(delete_listed(Some((8, KEY)), chosen, 3, &deletes));
        assert!(!delete_listed(Some((8, KEY)), t1.max(t2), 3, &deletes));
    }
}
