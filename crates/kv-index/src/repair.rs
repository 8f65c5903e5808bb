//! Repairing the serving replicas after one failed (the master's job, with every writer
//! fenced): make them identical again, so that any of them can be the primary.
//!
//! Metadata (the space header, the directory, bucket headers) comes from the new primary;
//! the primary-only words are rebuilt (the subtable bump from the directory, the split lock
//! released), and slots frozen or buckets marked splitting by a split whose client was
//! fenced are released. A slot whose replicas disagree is an interrupted SNAPSHOT round: the
//! caller decides its value ([`SlotConflict`]), since only the layer above knows the logs.

use dmkit_verbs::Endpoint;

use crate::error::{Error, Result};
use crate::index::words;
use crate::layout::{
    BUCKET_BYTES, DIR_OFFSET, DirEntry, HDR_BUMP, HDR_CAPACITY, HDR_LOCK, HDR_PARAMS, HEADER_WORD,
    IndexReplicaSpace, MAGIC,
};
use crate::slot::{Header, is_empty_word, is_frozen, thaw};

/// Tag of the repair's verbs.
pub const TAG: &str = "kv_index.repair";

/// Bytes read per request while scanning a replica.
const CHUNK: u64 = 256 << 10;

/// A slot whose serving replicas disagree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotConflict {
    /// The slot's offset in the replica space.
    pub offset: u64,
    /// The old primary's value, when the old primary still serves.
    pub primary: Option<u64>,
    /// The serving backups' values, in replica order.
    pub backups: Vec<u64>,
}

/// The master's choice for a slot whose serving index replicas disagree (a SNAPSHOT round
/// the fence cut short), as the FUSEE paper's failure algorithm does
/// (the caller is FUSEE's master, or any layer that repairs an index after a failure): the old primary's
/// value when it survived (`primary`), unless every surviving backup already agrees on
/// another value (the round's winner may have committed); without the old primary, the
/// value a majority of the surviving backups holds, else the smallest one (SNAPSHOT's rule
/// 3). `valid(v)` says whether a non-empty word names a whole object (the caller reads it);
/// an empty word is always valid for the caller to answer. 0 when nothing is valid.
///
/// ```
/// use dmkit_kv_index::repair::repair_choice;
///
/// let ok = |_| Ok::<_, ()>(true);
/// // The old primary survived and the backups agree on a newer value: the round's winner
/// // had every backup, keep its value.
/// assert_eq!(repair_choice(Some(0x10), &[0x20, 0x20], ok), Ok(0x20));
/// // The backups disagree: the primary's value stands.
/// assert_eq!(repair_choice(Some(0x10), &[0x20, 0x30], ok), Ok(0x10));
/// // The primary is lost: the majority of the backups, else the smallest.
/// assert_eq!(repair_choice(None, &[0x30, 0x20, 0x30], ok), Ok(0x30));
/// assert_eq!(repair_choice(None, &[0x30, 0x20], ok), Ok(0x20));
/// ```
pub fn repair_choice<E>(
    primary: Option<u64>,
    backups: &[u64],
    mut valid: impl FnMut(u64) -> Result<bool, E>,
) -> Result<u64, E> {
    Ok(match primary {
        Some(p) => match backups.first().copied() {
            Some(b) if b != p && backups.iter().all(|x| *x == b) && valid(b)? => b,
            _ => p,
        },
        None => {
            // At most one value holds a strict majority.
            let majority = backups.iter().copied().find(|v| {
                backups.iter().filter(|w| *w == v).count() * 2 > backups.len()
                    && valid(*v).unwrap_or(false)
            });
            match majority {
                Some(v) => v,
                None => {
                    let mut cands: Vec<u64> = backups.to_vec();
                    cands.sort_unstable();
                    cands.dedup();
                    let mut pick = None;
                    for v in cands {
                        if valid(v)? {
                            pick = Some(v);
                            break;
                        }
                    }
                    pick.unwrap_or(0)
                }
            }
        }
    })
}

/// Whether the repair's choice `chosen` for a conflicting slot completed a DELETE: the slot
/// ends on a DELETE's tombstone where a replica held a key, or the old primary was lost.
/// Returns the word the membership lists for the DELETE's writer to find
/// (FUSEE's `rules::delete_listed`): the chosen tombstone itself. A DELETE's tombstone carries
/// its writer's mark ([`crate::tombstone_by`]), so it names the one DELETE whose round
/// the repair completed, and only that DELETE may count the deletion as its own.
///
/// (Until session 12 the list named the value replaced — 0, "any", when the old primary was
/// lost — and every DELETE of that value cut short counted it, the first to claim reporting
/// Deleted. The protocol model found two ways that goes wrong at r = 3: DELETEs of one value
/// sharing one tombstone, and a DELETE that completed normally beside one cut short that
/// then claimed "any" deletion — both reported Deleted.)
pub fn repair_completed_delete(primary: Option<u64>, backups: &[u64], chosen: u64) -> Option<u64> {
    let held_key =
        primary.is_none_or(|p| !is_empty_word(p)) || backups.iter().any(|b| !is_empty_word(*b));
    (is_empty_word(chosen) && chosen != 0 && held_key).then_some(chosen)
}

/// What a repair did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RepairReport {
    /// Slots compared across the replicas.
    pub slots_checked: u64,
    /// Slots whose replicas disagreed (interrupted rounds).
    pub conflicts: u64,
    /// Words rewritten, over all replicas.
    pub words_written: u64,
}

/// Makes the serving replicas `spaces` (the new primary first) identical. `primary_served`:
/// `spaces[0]` was already the primary (only a backup failed). `decide` picks the value of
/// each conflicting slot. Nobody may write the index meanwhile (the caller fenced it).
pub fn repair_replicas(
    ep: &Endpoint,
    spaces: &[IndexReplicaSpace],
    primary_served: bool,
    mut decide: impl FnMut(&SlotConflict) -> Result<u64>,
) -> Result<RepairReport> {
    let Some(first) = spaces.first() else {
        return Err(Error::InvalidConfig(
            "no serving index replica to repair".into(),
        ));
    };
    let Geometry {
        dir_entries,
        area,
        total,
    } = geometry(ep, first)?;
    if total > first.len {
        return Err(Error::NotFormatted {
            node: first.region.node,
            reason: format!("header claims {total} bytes, the space has {}", first.len),
        });
    }
    // The whole of every replica (index spaces are MiBs).
    let mut images: Vec<Vec<u64>> = vec![Vec::with_capacity((total / 8) as usize); spaces.len()];
    let mut off = 0;
    while off < total {
        let len = CHUNK.min(total - off);
        let batches = spaces
            .iter()
            .map(|s| {
                let mut b = ep.batch(s.region.node);
                let i = b.read(s.at(off), len as usize);
                (b, i)
            })
            .collect::<Vec<_>>();
        let (batches, idx): (Vec<_>, Vec<_>) = batches.into_iter().unzip();
        for (k, r) in ep.execute_many(TAG, batches).into_iter().enumerate() {
            images[k].extend(words(r?.read(idx[k])));
        }
        off += len;
    }
    // The target image: the new primary's, with primary-only words rebuilt.
    let mut target = images[0].clone();
    let mut used = 0u64;
    for i in 0..dir_entries {
        let w = target[((DIR_OFFSET + 8 * i) / 8) as usize];
        if let Some(e) = DirEntry::decode(w) {
            used = used.max(u64::from(e.subtable) + 1);
        }
    }
    let bump_at = (HDR_BUMP / 8) as usize;
    let bump = images
        .iter()
        .map(|im| im[bump_at])
        .max()
        .unwrap_or(0)
        .max(used);
    target[bump_at] = bump;
    target[(HDR_LOCK / 8) as usize] = 0;
    let mut rep = RepairReport::default();
    let area_w = (area / 8) as usize;
    for w in area_w..target.len() {
        let in_bucket = (w - area_w) % (BUCKET_BYTES / 8) as usize;
        if in_bucket == HEADER_WORD {
            if let Some(h) = Header::decode(target[w]) {
                target[w] = Header {
                    splitting: false,
                    ..h
                }
                .encode();
            }
            continue;
        }
        rep.slots_checked += 1;
        let vals: Vec<u64> = images.iter().map(|im| thaw(im[w])).collect();
        if images.iter().any(|im| is_frozen(im[w])) || vals.iter().any(|v| *v != vals[0]) {
            if vals.iter().all(|v| *v == vals[0]) {
                target[w] = vals[0];
                continue;
            }
            rep.conflicts += 1;
            let c = SlotConflict {
                offset: w as u64 * 8,
                primary: primary_served.then_some(vals[0]),
                backups: if primary_served {
                    vals[1..].to_vec()
                } else {
                    vals.clone()
                },
            };
            target[w] = decide(&c)?;
        }
    }
    // Write the differences, replica by replica, in batches.
    for (k, s) in spaces.iter().enumerate() {
        let diffs: Vec<usize> = (0..target.len())
            .filter(|w| images[k][*w] != target[*w])
            .collect();
        rep.words_written += diffs.len() as u64;
        for chunk in diffs.chunks(256) {
            let mut b = ep.batch(s.region.node);
            for w in chunk {
                b.write_durable(s.at(*w as u64 * 8), &target[*w].to_le_bytes());
            }
            ep.execute(TAG, b)?;
        }
    }
    Ok(rep)
}

/// Every non-empty slot value of one replica (its whole image read in chunks), with the
/// slot's offset in the space.
pub fn slot_values(ep: &Endpoint, space: &IndexReplicaSpace) -> Result<Vec<(u64, u64)>> {
    let Geometry { area, total, .. } = geometry(ep, space)?;
    let mut out = Vec::new();
    let mut off = area;
    while off < total {
        let len = CHUNK.min(total - off);
        let w = words(&ep.read(TAG, space.at(off), len as usize)?);
        for (i, v) in w.into_iter().enumerate() {
            let at = off + i as u64 * 8;
            if (at - area) / 8 % (BUCKET_BYTES / 8) != HEADER_WORD as u64 && !is_empty_word(v) {
                out.push((at, thaw(v)));
            }
        }
        off += len;
    }
    Ok(out)
}

/// Where things are in a replica space, from its header.
struct Geometry {
    dir_entries: u64,
    /// The subtable area's offset.
    area: u64,
    /// The bytes in use: header, directory and every subtable.
    total: u64,
}

fn geometry(ep: &Endpoint, space: &IndexReplicaSpace) -> Result<Geometry> {
    let head = words(&ep.read(TAG, space.at(0), 64)?);
    if head.len() < 8 || head[0] != MAGIC {
        return Err(Error::NotFormatted {
            node: space.region.node,
            reason: "bad magic".into(),
        });
    }
    let params = head[(HDR_PARAMS / 8) as usize];
    let dir_entries = 1u64 << ((params >> 8) as u8);
    let area = (DIR_OFFSET + 8 * dir_entries).div_ceil(64) * 64;
    let subtable_bytes = (1u64 << (params as u8)) * 3 * BUCKET_BYTES;
    Ok(Geometry {
        dir_entries,
        area,
        total: area + head[(HDR_CAPACITY / 8) as usize] * subtable_bytes,
    })
}

/// The index replica space's length the header of `space` says is in use (for copying a
/// replica to a rejoining node).
pub fn used_len(ep: &Endpoint, space: &IndexReplicaSpace) -> Result<u64> {
    Ok(geometry(ep, space)?.total)
}
