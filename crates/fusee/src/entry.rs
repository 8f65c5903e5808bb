//! The key-value API over stored values ([`crate::value`]): plain values, values with a
//! deadline, and values larger than one object. Every operation here is the SNAPSHOT
//! operation of the same name on the key's stored bytes, plus what a deadline or chunks
//! need around it: an expired key reads as absent, and a write that replaced or deleted a
//! large value deletes its chunks after.

use std::collections::HashMap;
use std::ops::Range;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use crate::client::{CasResult, Client, DeleteResult, InsertResult, UpdateResult};
use crate::error::{Error, Result};
use crate::value::{self, Body, Manifest};
use crate::{alloc, object};

/// A key's value as read: the value, its deadline, and the version a conditional write
/// ([`Client::replace`], [`Client::delete_entry`]) compares — exactly this write of the key,
/// not only its bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub value: Vec<u8>,
    /// Unix milliseconds after which the key reads as absent (`None`: never).
    pub expires_at: Option<u64>,
    version: Vec<u8>,
}

impl Entry {
    /// Milliseconds left at `now` (Unix milliseconds) before the key expires.
    pub fn ttl_ms(&self, now: u64) -> Option<u64> {
        self.expires_at.map(|d| d.saturating_sub(now))
    }
}

/// Part of a key's value, as [`Client::get_range`] read it: the bytes asked for, and the
/// whole value's length.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValueRange {
    pub len: u64,
    pub bytes: Vec<u8>,
}

/// The whole value, for [`Client::get_range_async`]'s `pick`.
fn whole(len: u64) -> Range<u64> {
    0..len
}

/// `r` within a value of `len` bytes (an empty range where it starts past the end).
fn clamp(r: Range<u64>, len: u64) -> Range<u64> {
    let end = r.end.min(len);
    r.start.min(end)..end
}

/// One step of the background sweep ([`Client::reclaim_expired`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Swept {
    /// Expired keys (and orphaned chunks) it deleted.
    pub deleted: usize,
    /// Keys it met that have a deadline, expired or not.
    pub deadlines: usize,
    /// The cursor of the next step (0: a round over the whole index is done).
    pub next: u64,
}

/// The pace of a background sweep: where it is, and how long it waits before its next step
/// — at least `every`, and at most a tenth of the time sweeping (a pause of 9 × the last
/// step's time) while keys with a deadline are about; a hundredth (99 ×), and at least ten
/// times `every`, when neither the last whole round nor this one met any (as when it
/// starts): a store without deadlines pays almost nothing for the sweep, and a key given one
/// later is still absent once expired, its space reclaimed within one slow round.
#[derive(Debug, Clone)]
pub struct SweepPacer {
    every: Duration,
    cursor: u64,
    pause: Duration,
    /// Keys with a deadline met in this round, in the last whole round.
    seen: bool,
    seen_last_round: bool,
}

/// A sweep that meets no deadline waits at least this many ticks between steps.
const IDLE_TICKS: u32 = 10;

impl SweepPacer {
    pub fn new(every: Duration) -> SweepPacer {
        SweepPacer {
            every,
            cursor: 0,
            pause: every,
            seen: false,
            seen_last_round: false,
        }
    }

    /// The cursor of the next step.
    pub fn cursor(&self) -> u64 {
        self.cursor
    }

    /// How long to wait before the next step.
    pub fn pause(&self) -> Duration {
        self.pause
    }

    /// A step took `took` and swept `step` (`None`: it failed, to be tried again).
    pub fn stepped(&mut self, step: Option<Swept>, took: Duration) {
        if let Some(s) = step {
            self.seen |= s.deadlines > 0;
            self.cursor = s.next;
            if s.next == 0 {
                self.seen_last_round = std::mem::take(&mut self.seen);
            }
        }
        self.pause = if self.seen || self.seen_last_round {
            self.every.max(took * 9)
        } else {
            // No deadline about: a step is a bulk read of a subtable (on a fabric whose
            // packets cost CPU, an idle gateway's main cost), so wait ten ticks at least.
            (self.every * IDLE_TICKS).max(took * 99)
        };
    }
}

/// Chunk operations a large value keeps in flight.
const CHUNK_WAVE: usize = 64;
/// Reads of a large value before giving up on one whose chunks keep being replaced.
const READ_TRIES: usize = 16;
/// The smallest chunk worth the name (a longer key leaves less room in a chunk object).
const MIN_CHUNK: usize = 4096;

/// What a key's stored bytes say, once opened.
enum Opened {
    /// The entry (its value: the bytes asked for) and the whole value's length.
    Live(Entry, u64),
    /// Its deadline passed: absent (these are the stored bytes, to delete exactly them).
    Expired(Vec<u8>),
    /// A chunk of its large value is gone: the key was written since; read again.
    Changed,
}

/// A value made ready to write: its stored bytes, and the manifest of the chunks written
/// for it (deleted again if the write does not take effect).
struct Prepared {
    raw: Vec<u8>,
    large: Option<Manifest>,
}

fn check_key(key: &[u8]) -> Result<()> {
    if value::is_reserved(key) {
        return Err(Error::ReservedKey {
            prefix: value::CHUNK_PREFIX.escape_ascii().to_string(),
        });
    }
    Ok(())
}

impl Client {
    dmkit_verbs::blocking_facade! {
        /// SEARCH: the value of `key` (`None` if absent or expired). One round trip on an
        /// address-cache hit (the slot and the object read together), two otherwise (buckets,
        /// then object); a large value reads its chunks after, many at once.
        pub fn search(&self, key: &[u8]) -> Result<Option<Vec<u8>>> = search_async;
        /// The value of `key` with its deadline and version (`None` if absent or expired; an
        /// expired key met here is deleted, by a conditional delete of exactly what was read).
        pub fn get(&self, key: &[u8]) -> Result<Option<Entry>> = get_async;
        /// Part of `key`'s value (`None` if absent or expired): `pick` is given the value's
        /// length and names the bytes wanted (clamped to the value). A large value's chunks
        /// outside them are not read, so an empty range costs the key's search alone — the
        /// length of a 64 MiB value is one read of its manifest (STRLEN, EXISTS), a slice of
        /// it the chunks it spans (GETRANGE). The bytes and the length are of one version of
        /// the value, the one the search found.
        pub fn get_range(
            &self,
            key: &[u8],
            pick: impl Fn(u64) -> Range<u64>,
        ) -> Result<Option<ValueRange>>
            = get_range_async;
        /// INSERT: `key → value` unless the key is present (an expired key counts as absent).
        pub fn insert(&self, key: &[u8], value: &[u8]) -> Result<InsertResult> = insert_async;
        /// [`Client::insert`] with a deadline (Unix milliseconds; `None`: never expires).
        pub fn insert_with(
            &self,
            key: &[u8],
            value: &[u8],
            expires_at: Option<u64>,
        ) -> Result<InsertResult>
            = insert_with_async;
        /// UPDATE: replaces the value of a present (unexpired) key; the new value has no
        /// deadline.
        pub fn update(&self, key: &[u8], value: &[u8]) -> Result<UpdateResult> = update_async;
        /// SET semantics: update if present, insert otherwise; no deadline.
        pub fn upsert(&self, key: &[u8], value: &[u8]) -> Result<()> = upsert_async;
        /// SET with a deadline (Unix milliseconds; `None`: never expires): update if present
        /// (expired or not), insert otherwise.
        pub fn put(&self, key: &[u8], value: &[u8], expires_at: Option<u64>) -> Result<()>
            = put_async;
        /// Compare-and-set: replaces the value of `key` with `value` (no deadline) only if it
        /// is `expected` (byte for byte, whatever its deadline) when the write takes effect —
        /// one SNAPSHOT round, as UPDATE, when the key has no deadline. Linearizable:
        /// [`CasResult::Mismatch`] carries the value the key held instead.
        pub fn compare_and_set(
            &self,
            key: &[u8],
            expected: &[u8],
            value: &[u8],
        ) -> Result<CasResult>
            = compare_and_set_async;
        /// Replaces `key`'s value and deadline only if the key still holds exactly `current`
        /// (as read by [`Client::get`]: the same write, not only the same bytes). Linearizable.
        pub fn replace(
            &self,
            key: &[u8],
            current: &Entry,
            value: &[u8],
            expires_at: Option<u64>,
        ) -> Result<CasResult>
            = replace_async;
        /// DELETE: removes a present (unexpired) key.
        pub fn delete(&self, key: &[u8]) -> Result<DeleteResult> = delete_async;
        /// Conditional DELETE: removes `key` only if its value is `expected` when the delete takes
        /// effect (GETDEL is a read, then this). Linearizable, as [`Client::compare_and_set`].
        pub fn delete_if(&self, key: &[u8], expected: &[u8]) -> Result<CasResult> = delete_if_async;
        /// Deletes `key` only if it still holds exactly `current` (as read by [`Client::get`]).
        pub fn delete_entry(&self, key: &[u8], current: &Entry) -> Result<CasResult>
            = delete_entry_async;
        /// One step of a scan over every key: the keys of one index subtable, and the cursor of
        /// the next step (0 when the scan is done; start with 0). Every key present for the whole
        /// scan is returned at least once, even while the index grows; a key may come twice
        /// (deduplicate to count), and one written or deleted during the scan may or may not come
        /// (as Redis's SCAN). Expired keys and the chunks of large values are not returned.
        /// Three round trips a step: directory, subtable, objects.
        pub fn scan(&self, cursor: u64) -> Result<(Vec<Vec<u8>>, u64)> = scan_async;
        /// One step of the background sweep (over the same cursor as [`Client::scan`]): deletes
        /// the expired keys of one index subtable, and the chunks there that no manifest names
        /// and that are older than [`crate::ClientConfig::orphan_grace`] (left by a large write
        /// that crashed). Returns how many it deleted, how many keys there have a deadline,
        /// and the next cursor (0: done).
        pub fn reclaim_expired(&self, cursor: u64) -> Result<Swept> = reclaim_expired_async;
    }

    /// [`Client::search`], awaited: one client serves many searches in flight at once, from
    /// any executor.
    pub async fn search_async(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        check_key(key)?;
        // A plain value (no deadline, not in chunks) is the stored bytes after the kind byte.
        match self.search_raw_async(key).await? {
            None => Ok(None),
            Some(mut raw) if raw.first() == Some(&0) => {
                raw.remove(0);
                Ok(Some(raw))
            }
            // Boxed: the rare path's future is most of the operation's size, and every
            // caller would move it whole on the common path.
            first => Ok(Box::pin(self.entry_from(key, first, whole))
                .await?
                .map(|(e, _)| e.value)),
        }
    }

    /// [`Client::get`], awaited.
    pub async fn get_async(&self, key: &[u8]) -> Result<Option<Entry>> {
        check_key(key)?;
        let first = self.search_raw_async(key).await?;
        Ok(self.entry_from(key, first, whole).await?.map(|(e, _)| e))
    }

    /// [`Client::get_range`], awaited.
    pub async fn get_range_async(
        &self,
        key: &[u8],
        pick: impl Fn(u64) -> Range<u64>,
    ) -> Result<Option<ValueRange>> {
        check_key(key)?;
        let first = self.search_raw_async(key).await?;
        let e = Box::pin(self.entry_from(key, first, pick)).await?;
        Ok(e.map(|(e, len)| ValueRange {
            len,
            bytes: e.value,
        }))
    }

    /// The entry of `key` whose stored bytes a search just returned (`first`), with the
    /// bytes `pick` names of its value and the value's length, reading the key again while
    /// a large value's chunks keep changing under the read.
    async fn entry_from(
        &self,
        key: &[u8],
        first: Option<Vec<u8>>,
        pick: impl Fn(u64) -> Range<u64>,
    ) -> Result<Option<(Entry, u64)>> {
        let mut before: Option<Vec<u8>> = None;
        let mut next = Some(first);
        for _ in 0..READ_TRIES {
            let read = match next.take() {
                Some(r) => r,
                None => self.search_raw_async(key).await?,
            };
            let Some(raw) = read else {
                return Ok(None);
            };
            if before.as_ref() == Some(&raw) {
                // The same manifest (they are unique) and a chunk still missing.
                return Err(Error::LargeValue {
                    key: key.escape_ascii().to_string(),
                    reason: "a chunk of its value is missing".into(),
                });
            }
            match self.open_stored(key, raw.clone(), &pick).await? {
                Opened::Live(e, len) => return Ok(Some((e, len))),
                Opened::Expired(raw) => {
                    self.reclaim_one(key, &raw).await;
                    return Ok(None);
                }
                Opened::Changed => before = Some(raw),
            }
        }
        Err(Error::LargeValue {
            key: key.escape_ascii().to_string(),
            reason: format!("it was rewritten under each of {READ_TRIES} reads"),
        })
    }

    /// [`Client::insert`], awaited.
    pub async fn insert_async(&self, key: &[u8], value: &[u8]) -> Result<InsertResult> {
        self.insert_with_async(key, value, None).await
    }

    /// [`Client::insert_with`], awaited.
    pub async fn insert_with_async(
        &self,
        key: &[u8],
        value: &[u8],
        expires_at: Option<u64>,
    ) -> Result<InsertResult> {
        let p = self.prepare(key, value, expires_at).await?;
        let r = loop {
            if self.insert_raw_async(key, &p.raw).await? == InsertResult::Inserted {
                break InsertResult::Inserted;
            }
            // Present; an expired key is replaced as if absent (exactly the version read).
            let Some(cur) = self.search_raw_async(key).await? else {
                continue;
            };
            if !value::expired(&cur, self.now()) {
                break InsertResult::AlreadyExists;
            }
            if self.cas_raw_async(key, &cur, &p.raw).await? == CasResult::Swapped {
                self.after_write(key, Some(cur)).await;
                break InsertResult::Inserted;
            }
        };
        if r == InsertResult::AlreadyExists {
            self.abandon(key, &p).await;
        }
        Ok(r)
    }

    /// [`Client::update`], awaited.
    pub async fn update_async(&self, key: &[u8], value: &[u8]) -> Result<UpdateResult> {
        let p = self.prepare(key, value, None).await?;
        let replaced = Mutex::new(None);
        let r = self.update_raw_async(key, &p.raw, true, &replaced).await?;
        match r {
            UpdateResult::Updated => self.after_write(key, replaced.into_inner()).await,
            UpdateResult::NotFound => self.abandon(key, &p).await,
        }
        Ok(r)
    }

    /// [`Client::upsert`], awaited.
    pub async fn upsert_async(&self, key: &[u8], value: &[u8]) -> Result<()> {
        self.put_async(key, value, None).await
    }

    /// [`Client::put`], awaited. A key whose address is cached is most likely present: it
    /// is updated first (the rounds of an UPDATE). For any other key the client guesses
    /// from the upserts of uncached keys before it: while they mostly found their keys
    /// present (a loaded store, YCSB's updates), UPDATE first; otherwise (a store filling
    /// up with fresh keys) INSERT first. A wrong guess costs the first attempt's rounds
    /// plus one to take its object back (about three at r = 3), then the other operation.
    pub async fn put_async(&self, key: &[u8], value: &[u8], expires_at: Option<u64>) -> Result<()> {
        let p = self.prepare(key, value, expires_at).await?;
        let cached = self.is_cached(key);
        // Learn only from uncached keys' first attempts (a cached key says nothing about
        // the others).
        let mut learn = !cached;
        let mut update_first = cached || self.uncached_puts_find_keys();
        loop {
            if update_first {
                let replaced = Mutex::new(None);
                let updated = self.update_raw_async(key, &p.raw, false, &replaced).await?
                    == UpdateResult::Updated;
                if std::mem::take(&mut learn) {
                    self.learn_put(updated);
                }
                if updated {
                    self.after_write(key, replaced.into_inner()).await;
                    return Ok(());
                }
            } else {
                update_first = true;
            }
            let inserted = self.insert_raw_async(key, &p.raw).await? == InsertResult::Inserted;
            if std::mem::take(&mut learn) {
                self.learn_put(!inserted);
            }
            if inserted {
                return Ok(());
            }
        }
    }

    /// [`Client::compare_and_set`], awaited.
    pub async fn compare_and_set_async(
        &self,
        key: &[u8],
        expected: &[u8],
        value: &[u8],
    ) -> Result<CasResult> {
        let p = self.prepare(key, value, None).await?;
        // First guess: the key holds `expected` inline, with no deadline.
        let mut version = value::encode_inline(expected, None);
        let r = loop {
            match self.cas_raw_async(key, &version, &p.raw).await? {
                CasResult::Swapped => {
                    self.after_write(key, Some(version)).await;
                    break CasResult::Swapped;
                }
                CasResult::NotFound => break CasResult::NotFound,
                CasResult::Mismatch(held) => match self.open_stored(key, held, whole).await? {
                    // The expected value, stored otherwise (a deadline, chunks): that exactly.
                    Opened::Live(e, _) if e.value == expected => version = e.version,
                    Opened::Live(e, _) => break CasResult::Mismatch(e.value),
                    Opened::Expired(raw) => {
                        self.reclaim_one(key, &raw).await;
                        break CasResult::NotFound;
                    }
                    Opened::Changed => {}
                },
            }
        };
        if r != CasResult::Swapped {
            self.abandon(key, &p).await;
        }
        Ok(r)
    }

    /// [`Client::replace`], awaited.
    pub async fn replace_async(
        &self,
        key: &[u8],
        current: &Entry,
        value: &[u8],
        expires_at: Option<u64>,
    ) -> Result<CasResult> {
        let p = self.prepare(key, value, expires_at).await?;
        let r = self.cas_raw_async(key, &current.version, &p.raw).await?;
        if r == CasResult::Swapped {
            self.after_write(key, Some(current.version.clone())).await;
            return Ok(r);
        }
        self.abandon(key, &p).await;
        self.held(key, r).await
    }

    /// [`Client::delete`], awaited.
    pub async fn delete_async(&self, key: &[u8]) -> Result<DeleteResult> {
        check_key(key)?;
        let replaced = Mutex::new(None);
        let r = self.delete_raw_async(key, true, &replaced).await?;
        if r == DeleteResult::Deleted {
            self.after_write(key, replaced.into_inner()).await;
        }
        Ok(r)
    }

    /// [`Client::delete_if`], awaited.
    pub async fn delete_if_async(&self, key: &[u8], expected: &[u8]) -> Result<CasResult> {
        check_key(key)?;
        let mut version = value::encode_inline(expected, None);
        loop {
            match self.delete_if_raw_async(key, &version).await? {
                CasResult::Swapped => {
                    self.after_write(key, Some(version)).await;
                    return Ok(CasResult::Swapped);
                }
                CasResult::NotFound => return Ok(CasResult::NotFound),
                CasResult::Mismatch(held) => match self.open_stored(key, held, whole).await? {
                    Opened::Live(e, _) if e.value == expected => version = e.version,
                    Opened::Live(e, _) => return Ok(CasResult::Mismatch(e.value)),
                    Opened::Expired(raw) => {
                        self.reclaim_one(key, &raw).await;
                        return Ok(CasResult::NotFound);
                    }
                    Opened::Changed => {}
                },
            }
        }
    }

    /// [`Client::delete_entry`], awaited.
    pub async fn delete_entry_async(&self, key: &[u8], current: &Entry) -> Result<CasResult> {
        check_key(key)?;
        let r = self.delete_if_raw_async(key, &current.version).await?;
        if r == CasResult::Swapped {
            self.after_write(key, Some(current.version.clone())).await;
            return Ok(r);
        }
        self.held(key, r).await
    }

    /// [`Client::scan`], awaited.
    pub async fn scan_async(&self, cursor: u64) -> Result<(Vec<Vec<u8>>, u64)> {
        let (items, next) = self.scan_raw_async(cursor).await?;
        let now = self.now();
        let keys = items
            .into_iter()
            .filter(|(k, raw)| !value::is_reserved(k) && !value::expired(raw, now))
            .map(|(k, _)| k)
            .collect();
        Ok((keys, next))
    }

    /// [`Client::reclaim_expired`], awaited.
    pub async fn reclaim_expired_async(&self, cursor: u64) -> Result<Swept> {
        let (items, next) = self.scan_raw_async(cursor).await?;
        let now = self.now();
        let grace = self.config().orphan_grace.as_millis() as u64;
        let mut named: HashMap<Vec<u8>, Option<(u64, u64, u64)>> = HashMap::new();
        let mut deleted = 0;
        let mut deadlines = 0;
        for (k, raw) in items {
            if let Some(c) = value::parse_chunk_key(&k) {
                if c.created_ms.saturating_add(grace) > now {
                    continue;
                }
                let owner = c.key.to_vec();
                let names = match named.get(&owner) {
                    Some(n) => *n,
                    None => {
                        let held = self.search_raw_async(&owner).await?;
                        let n = held.and_then(|raw| match value::decode(&raw).ok()?.body {
                            Body::Large(m) => Some((m.created_ms, m.writer, m.seq)),
                            Body::Inline(_) => None,
                        });
                        named.insert(owner, n);
                        n
                    }
                };
                if names != Some((c.created_ms, c.writer, c.seq))
                    && self.delete_if_raw_async(&k, &raw).await? == CasResult::Swapped
                {
                    deleted += 1;
                }
            } else if let Ok(d) = value::decode(&raw).map(|d| d.deadline) {
                deadlines += usize::from(d.is_some());
                if d.is_some_and(|d| d <= now)
                    && self.delete_if_raw_async(&k, &raw).await? == CasResult::Swapped
                {
                    self.after_write(&k, Some(raw)).await;
                    deleted += 1;
                }
            }
        }
        if deleted > 0 {
            metrics::counter!("dmkit_fusee_reclaimed_keys_total").increment(deleted as u64);
        }
        Ok(Swept {
            deleted,
            deadlines,
            next,
        })
    }

    /// Opens stored bytes: the entry with the bytes `pick` names of its value (a large
    /// value's chunks there read and checked), or why not.
    async fn open_stored(
        &self,
        key: &[u8],
        raw: Vec<u8>,
        pick: impl Fn(u64) -> Range<u64>,
    ) -> Result<Opened> {
        let d = value::decode(&raw)?;
        // The clock only for a value with a deadline (reading it is a system call where the
        // vDSO cannot serve it, as in emulated guests).
        if d.deadline.is_some() && d.expired(self.now()) {
            return Ok(Opened::Expired(raw));
        }
        let (value, len) = match d.body {
            Body::Inline(v) => {
                let r = clamp(pick(v.len() as u64), v.len() as u64);
                (v[r.start as usize..r.end as usize].to_vec(), v.len() as u64)
            }
            Body::Large(m) => match self.read_chunks(key, &m, clamp(pick(m.len), m.len)).await? {
                Some(v) => (v, m.len),
                None => return Ok(Opened::Changed),
            },
        };
        let e = Entry {
            value,
            expires_at: d.deadline,
            version: raw,
        };
        Ok(Opened::Live(e, len))
    }

    /// A conditional write's result that did not swap, with the value as the caller sees it.
    async fn held(&self, key: &[u8], r: CasResult) -> Result<CasResult> {
        let CasResult::Mismatch(held) = r else {
            return Ok(r);
        };
        Ok(match self.open_stored(key, held, whole).await? {
            Opened::Live(e, _) => CasResult::Mismatch(e.value),
            Opened::Expired(raw) => {
                self.reclaim_one(key, &raw).await;
                CasResult::NotFound
            }
            // Written again since: what it holds now.
            Opened::Changed => match self.get_async(key).await? {
                Some(e) => CasResult::Mismatch(e.value),
                None => CasResult::NotFound,
            },
        })
    }

    /// Deletes an expired key met by a read (exactly the version read: a write since wins).
    async fn reclaim_one(&self, key: &[u8], raw: &[u8]) {
        match self.delete_if_raw_async(key, raw).await {
            Ok(CasResult::Swapped) => {
                metrics::counter!("dmkit_fusee_reclaimed_keys_total").increment(1);
                self.after_write(key, Some(raw.to_vec())).await;
            }
            Ok(_) => {}
            Err(e) => tracing::debug!(error = %e, "expired key left to the sweep"),
        }
    }

    /// Makes a value ready to write: checks it, and writes the chunks of a large one.
    async fn prepare(&self, key: &[u8], value: &[u8], expires_at: Option<u64>) -> Result<Prepared> {
        check_key(key)?;
        let cfg = self.config();
        if value.len() > cfg.max_value {
            return Err(Error::ValueTooLarge {
                len: value.len(),
                max: cfg.max_value,
            });
        }
        let inline = value::inline_len(value.len(), expires_at);
        if object::object_len(key.len(), inline) <= alloc::MAX_OBJECT {
            return Ok(Prepared {
                raw: value::encode_inline(value, expires_at),
                large: None,
            });
        }
        // A chunk object: header, chunk key, kind byte and bytes, log entry.
        let chunk_key_len = value::CHUNK_PREFIX.len() + 28 + key.len();
        let room = (alloc::MAX_OBJECT - object::LOG_LEN - object::HEADER_LEN)
            .saturating_sub(chunk_key_len + 1)
            / 8
            * 8;
        if room < MIN_CHUNK {
            return Err(Error::KeyTooLong(key.len()));
        }
        let m = Manifest {
            len: value.len() as u64,
            chunk_len: room as u32,
            chunks: value.len().div_ceil(room) as u32,
            created_ms: self.now(),
            writer: self.id(),
            seq: self
                .inner_large_seq()
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            crc: crc32c::crc32c(value),
        };
        let started = Instant::now();
        let written = self.write_chunks(key, &m, value).await;
        let late = started.elapsed() > cfg.orphan_grace / 2;
        if written.is_err() || late {
            self.drop_chunks(key, &m).await;
        }
        written?;
        if late {
            return Err(Error::LargeValue {
                key: key.escape_ascii().to_string(),
                reason: "writing its chunks took longer than half the orphan grace period; \
                         nothing was written"
                    .into(),
            });
        }
        Ok(Prepared {
            raw: value::encode_large(&m, expires_at),
            large: Some(m),
        })
    }

    async fn write_chunks(&self, key: &[u8], m: &Manifest, value: &[u8]) -> Result<()> {
        for wave in (0..m.chunks).collect::<Vec<_>>().chunks(CHUNK_WAVE) {
            let writes = wave.iter().map(|&i| async move {
                let k = m.chunk_key(key, i);
                let raw = value::encode_inline(&value[m.range(i)], None);
                match self.insert_raw_async(&k, &raw).await? {
                    InsertResult::Inserted => Ok(()),
                    InsertResult::AlreadyExists => Err(Error::LargeValue {
                        key: key.escape_ascii().to_string(),
                        reason: format!("chunk key {} is taken", k.escape_ascii()),
                    }),
                }
            });
            for r in dmkit_verbs::join_all(writes.collect()).await {
                r?;
            }
        }
        Ok(())
    }

    /// The bytes `want` of `m`'s value, from the chunks they span, checked (`None`: one is
    /// gone, the key was written since). The whole value's checksum is checked when all of
    /// it is read; a chunk is an object of its own, checked when read.
    async fn read_chunks(
        &self,
        key: &[u8],
        m: &Manifest,
        want: Range<u64>,
    ) -> Result<Option<Vec<u8>>> {
        let mut out = vec![0u8; (want.end - want.start) as usize];
        let cl = u64::from(m.chunk_len);
        let spans = if want.is_empty() {
            0..0
        } else {
            (want.start / cl) as u32..(want.end.div_ceil(cl)) as u32
        };
        for wave in spans.collect::<Vec<_>>().chunks(CHUNK_WAVE) {
            let reads = wave
                .iter()
                .map(|&i| async move { (i, self.search_raw_async(&m.chunk_key(key, i)).await) });
            for (i, r) in dmkit_verbs::join_all(reads.collect()).await {
                let Some(raw) = r? else {
                    return Ok(None);
                };
                let range = m.range(i);
                match value::decode(&raw)?.body {
                    Body::Inline(b) if b.len() == range.len() => {
                        // The part of the chunk inside `want`, where it goes in `out`.
                        let from = (want.start as usize).max(range.start);
                        let to = (want.end as usize).min(range.end);
                        let at = from - want.start as usize;
                        out[at..at + (to - from)]
                            .copy_from_slice(&b[from - range.start..to - range.start]);
                    }
                    _ => {
                        return Err(Error::Corrupt(format!(
                            "chunk {i} of key {:?} has the wrong shape",
                            key.escape_ascii().to_string()
                        )));
                    }
                }
            }
        }
        if want == (0..m.len) && crc32c::crc32c(&out) != m.crc {
            return Err(Error::Corrupt(format!(
                "the value of key {:?} fails its checksum",
                key.escape_ascii().to_string()
            )));
        }
        Ok(Some(out))
    }

    /// Deletes the chunks of `m` (best effort: what is left, the sweep takes).
    async fn drop_chunks(&self, key: &[u8], m: &Manifest) {
        for wave in (0..m.chunks).collect::<Vec<_>>().chunks(CHUNK_WAVE) {
            let deletes = wave.iter().map(|&i| async move {
                let unused = Mutex::new(None);
                self.delete_raw_async(&m.chunk_key(key, i), false, &unused)
                    .await
            });
            for r in dmkit_verbs::join_all(deletes.collect()).await {
                if let Err(e) = r {
                    tracing::warn!(error = %e, "a chunk left to the sweep");
                }
            }
        }
    }

    /// After a write took effect: the chunks of the value it replaced (or of its own value,
    /// when it was overwritten at once) go.
    pub(crate) async fn after_write(&self, key: &[u8], replaced: Option<Vec<u8>>) {
        let Some(raw) = replaced else {
            return;
        };
        if let Ok(value::Decoded {
            body: Body::Large(m),
            ..
        }) = value::decode(&raw)
        {
            self.drop_chunks(key, &m).await;
        }
    }

    /// A write that did not take effect: its chunks go.
    async fn abandon(&self, key: &[u8], p: &Prepared) {
        if let Some(m) = &p.large {
            self.drop_chunks(key, m).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(deadlines: usize, next: u64) -> Option<Swept> {
        Some(Swept {
            deleted: 0,
            deadlines,
            next,
        })
    }

    #[test]
    fn the_sweep_slows_down_after_a_whole_round_without_deadlines() {
        let (every, took) = (Duration::from_millis(100), Duration::from_millis(20));
        let mut p = SweepPacer::new(every);
        assert_eq!((p.cursor(), p.pause()), (0, every));
        // No deadline met yet: a hundredth.
        p.stepped(step(0, 7), took);
        assert_eq!((p.cursor(), p.pause()), (7, took * 99));
        p.stepped(step(0, 0), took);
        assert_eq!((p.cursor(), p.pause()), (0, took * 99));
        // A failed step keeps its cursor; a quick one waits at least ten ticks while no
        // deadline is about, one tick once one is.
        p.stepped(None, Duration::from_micros(1));
        assert_eq!((p.cursor(), p.pause()), (0, every * 10));
        p.stepped(step(1, 3), Duration::from_micros(1));
        assert_eq!((p.cursor(), p.pause()), (3, every));
        // One key with a deadline: back to a tenth at once, and for the next whole round.
        p.stepped(step(1, 4), took);
        assert_eq!(p.pause(), took * 9);
        p.stepped(step(0, 0), took);
        p.stepped(step(0, 5), took);
        assert_eq!(p.pause(), took * 9);
        p.stepped(step(0, 0), took);
        assert_eq!(p.pause(), took * 99);
    }
}
