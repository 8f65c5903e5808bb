//! The FUSEE client: INSERT, SEARCH, UPDATE and DELETE over the replicated RACE index, with
//! r data replicas per KV object, the embedded operation log, two-level memory management and
//! an adaptive address cache.
//!
//! A write (INSERT, UPDATE, DELETE) runs the paper's four phases, each one round trip:
//!
//! 1. write the KV object (with its log entry, commit record empty) to its r data replicas,
//!    and read the key's buckets — together (an UPDATE or DELETE whose key's address is
//!    cached also reads the cached object here, so it needs no round of its own to compare
//!    keys);
//! 2. CAS the index backups (SNAPSHOT);
//! 3. if this writer is the last writer: write the commit record (the primary's old value
//!    and the old object's generation, with a crc32c) to the log entry;
//! 4. CAS the index primary — in phase 3's round trip when the record's writes all go to the
//!    primary's node and are durable before the CAS runs (r = 1 on one memory node).
//!
//! Then, off the critical path (the client's background task): free the replaced object
//! (one FAA on its block's bitmap, with its "outdated" flag set for cached readers) and mark
//! the log entry finished. The task gets this work in batches: an operation wakes it only
//! once 16 jobs wait (otherwise the verbs timer thread does within 40 ms, or a
//! [`Client::flush`] at once), so a write does not pay the wake-up of a parked runtime
//! worker. A writer that lost the round, or found nothing to update, takes its object back
//! *before* returning, so a crash can never redo an operation whose outcome was already
//! reported.

use dmkit_verbs::background::Background;
use std::convert::Infallible;
use std::sync::Arc;
use std::sync::mpsc;
use std::time::Duration;

/// The background task's side of a client's job queue (see [`Client::start_worker`]).
pub(crate) type JobRx = Arc<Background<Job>>;

use dmkit_cache::{AddressCache, AddressCacheConfig};
use dmkit_kv_index::{
    InsertOutcome, Modified, ObjPtr, RaceIndex, Slot, SlotPos, SnapshotOutcome, WriteHooks,
};
use dmkit_verbs::record::{timed, timed_async};
use dmkit_verbs::{Batch, Endpoint, NodeId, Reconnect, Reconnector};
use std::future::Future;
use std::task::Poll;

use parking_lot::Mutex;

use crate::alloc::{self, Allocation, FreeLists};
use crate::cluster::{self, ClusterView, MAX_CLIENT_ID};
use crate::error::{Error, Result};
use crate::object::{self, Addr, Commit, Op};
use crate::verifier::{Expect, Verifier, guard, slot_addr, verifier};

/// Operation tags of FUSEE's own verbs (the index and the verifier have theirs).
pub mod tags {
    pub const WRITE_KV: &str = "fusee_write_kv";
    pub const COMMIT: &str = "fusee_commit";
    pub const SEARCH: &str = "fusee_search";
    pub const RECLAIM: &str = "fusee_reclaim";
    pub const CLEANUP: &str = "fusee_cleanup";
    pub const BLOCKS: &str = "fusee_blocks";

    use dmkit_verbs::{Tag, TagStats};

    /// Tags of work the caller does not wait for (the background task's cleanups,
    /// reclaims and block prefetches).
    pub const BACKGROUND: [&str; 3] = [CLEANUP, RECLAIM, BLOCKS];

    /// (critical-path, background) round trips between two snapshots of an endpoint's
    /// stats ([`dmkit_verbs::Stats::snapshot`]): the split the round-trip contract (crate docs)
    /// is stated in.
    pub fn split_round_trips(before: &[(Tag, TagStats)], after: &[(Tag, TagStats)]) -> (u64, u64) {
        let (mut critical, mut background) = (0, 0);
        for (t, s) in after {
            let n = match before.iter().find(|(b, _)| b == t) {
                Some((_, b)) => s.since(b).round_trips,
                None => s.round_trips,
            };
            if BACKGROUND.contains(t) {
                background += n;
            } else {
                critical += n;
            }
        }
        (critical, background)
    }
}

/// Settings of a client.
#[derive(Clone)]
pub struct ClientConfig {
    /// This client's id (unique; it owns blocks and logs under it). Below
    /// [`cluster::MAX_CLIENT_ID`].
    pub id: u64,
    /// The address cache (key → slot position and value) and its adaptive bypass.
    pub cache: AddressCacheConfig,
    /// Fetch a new block for a size class when fewer free objects remain.
    pub prefetch_below: usize,
    /// Reclaim freed objects (read the blocks' bitmaps) every this many allocations.
    pub reclaim_every: u64,
    /// Run background jobs (cleanup, prefetch, reclaim) on the calling thread right after the
    /// operation that queued them, instead of on the client's background task: slower, but
    /// every verb is issued by the caller's thread (deterministic simulation needs that).
    pub inline_jobs: bool,
    /// How long an operation that hit a failed memory node waits for the master to publish
    /// a membership without it (then it fails with the original error).
    pub failover_wait: Duration,
    /// How to reconnect to a memory node that restarted or was unreachable (its old
    /// connection is dead). Without it, such a node is only used by new clients.
    pub reconnect: Option<Reconnect>,
    /// Join even when a member does not answer this client (the master still counts it):
    /// operations that need it fail after `failover_wait`, reads of the others go on. For a
    /// reader that must not wait for a failover that may never come (`dmkit kv get` with a
    /// member only it cannot reach). Off: joining waits for an epoch whose members answer.
    pub join_without_silent_members: bool,
    /// The largest value a write accepts (larger: [`Error::ValueTooLarge`], nothing
    /// written). Values beyond one object are stored in chunks ([`crate::value`]).
    pub max_value: usize,
    /// How old an unreferenced chunk of a large value must be before the background sweep
    /// ([`Client::reclaim_expired`]) deletes it: longer than any large write takes (a writer
    /// gives up after half of it) plus the clients' clock skew.
    pub orphan_grace: Duration,
    /// Milliseconds added to the system clock for this client's deadline decisions
    /// ([`crate::value`]): 0 in production; tests model a skewed clock with it.
    pub clock_skew_ms: i64,
    /// How long a writer waits on a SNAPSHOT round it lost before it asks the master for a
    /// resync (fence and repair in a new epoch): a round whose winner stopped midway — a
    /// paused or cut-off client — is otherwise finished by nobody. Also how long a client
    /// waits for a newer membership after a failure no failover explains (a verb lost on a
    /// member every heartbeat still reaches) before it asks.
    pub resync_after: Duration,
}

impl std::fmt::Debug for ClientConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientConfig")
            .field("id", &self.id)
            .field("cache", &self.cache)
            .field("prefetch_below", &self.prefetch_below)
            .field("reclaim_every", &self.reclaim_every)
            .field("inline_jobs", &self.inline_jobs)
            .field("failover_wait", &self.failover_wait)
            .field("reconnect", &self.reconnect.is_some())
            .field("max_value", &self.max_value)
            .field("orphan_grace", &self.orphan_grace)
            .field("clock_skew_ms", &self.clock_skew_ms)
            .field("resync_after", &self.resync_after)
            .finish()
    }
}

impl ClientConfig {
    pub fn new(id: u64) -> Self {
        Self {
            id,
            // A SEARCH of a key whose address is cached is one round trip, of any other key
            // two: room for the keys of a loaded 100 000-key store and more (each entry is
            // about 100 bytes and its key; only what is used is held).
            cache: AddressCacheConfig {
                capacity: 1 << 18,
                name: "fusee",
                ..AddressCacheConfig::default()
            },
            prefetch_below: 16,
            reclaim_every: 256,
            inline_jobs: false,
            failover_wait: Duration::from_secs(30),
            reconnect: None,
            join_without_silent_members: false,
            max_value: 64 << 20,
            orphan_grace: Duration::from_secs(600),
            clock_skew_ms: 0,
            resync_after: Duration::from_secs(1),
        }
    }
}

/// What an INSERT did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InsertResult {
    Inserted,
    AlreadyExists,
}

/// What an UPDATE did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpdateResult {
    Updated,
    NotFound,
}

/// What a DELETE did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeleteResult {
    Deleted,
    NotFound,
}

/// What a conditional write ([`Client::compare_and_set`], [`Client::delete_if`]) did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CasResult {
    /// The key held the expected value; it now holds the new one (or is deleted).
    Swapped,
    /// The key holds another value (this one, as read): nothing was written.
    Mismatch(Vec<u8>),
    /// The key is absent: nothing was written.
    NotFound,
}

/// A conditional write's attempt: done, or lost its SNAPSHOT round to another writer (then
/// the value is read again, and compared again).
#[derive(Debug, Clone, PartialEq, Eq)]
enum CondStep {
    Done(CasResult),
    Lost,
}

/// A read answered from an epoch being repaired (`None`: the replicas disagree, wait).
/// Whether a write cut short took effect (`Some`: the operation's result).
type Settled<'a, T> = dyn Fn() -> Result<Option<T>> + Sync + 'a;

type RepairRead<'a, T> = dyn Fn(&ClusterView, &RaceIndex) -> Result<Option<T>> + Sync + 'a;

/// A write attempt's object, to tell afterwards whether the attempt took effect.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Attempt {
    addr: Addr,
    len: usize,
    generation: u32,
    /// The index primary's node in the attempt's epoch.
    primary: NodeId,
    /// The index replicas serving in the attempt's epoch.
    replicas: usize,
    delete: bool,
    /// (DELETE) the attempt had found the key before it was cut short.
    found: bool,
    /// (DELETE) the slot offset and the value its last round replaced.
    round: Option<(u64, u64)>,
    /// (DELETE) that round reached its primary swap: every backup held the DELETE's value.
    swapping: bool,
    /// (DELETE) that round's primary CAS may have run: it was posted (the commit record was
    /// written) and the error that cut the attempt short is not the node refusing a verb
    /// (a refused verb did not run; so did none after it).
    primary_may_have_run: bool,
    /// The index decided the attempt did not take effect (lost its round, found nothing to
    /// do): whatever cuts the operation short afterwards, it is not settled as done.
    lost: bool,
    /// The epoch the attempt ran in.
    epoch: u64,
    /// (DELETE) who claims the attempt's round ([`Client::claim_delete`]): unique per
    /// attempt, not per client — two DELETEs of one value can be in flight in one client.
    token: u64,
}

impl Attempt {
    fn of(a: &Allocation, len: usize, inner: &Inner, delete: bool) -> Attempt {
        let (view, index) = inner.state();
        Attempt {
            addr: a.addr,
            len,
            generation: a.generation,
            primary: index.primary(),
            replicas: index.replicas(),
            delete,
            found: false,
            round: None,
            swapping: false,
            primary_may_have_run: false,
            lost: false,
            epoch: view.epoch,
            token: inner.id.rotate_left(32)
                ^ inner
                    .attempts
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed),
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct CachedAddr {
    slot: Slot,
    pos: SlotPos,
    /// The object's generation when cached: a reused slot never passes for it.
    generation: u32,
}

/// Work done after an operation returned.
#[derive(Debug)]
pub(crate) enum Job {
    /// A won write: free what it replaced, then mark its log entry finished.
    Cleanup(crate::mm::CleanupItem),
    /// Make sure `class` has free objects ahead of need.
    Prefetch(usize),
    /// Read the bitmaps and take back freed objects.
    Reclaim,
    /// Reply when everything queued before is done.
    Flush(mpsc::Sender<Result<()>>),
}

pub(crate) struct Inner {
    pub ep: Endpoint,
    pub id: u64,
    /// The membership epoch's view and index (replaced when the membership changes).
    state: parking_lot::RwLock<(Arc<ClusterView>, Arc<RaceIndex>)>,
    /// The ring order of the cluster's memory nodes (as the client was given them).
    pub(crate) nodes: Vec<NodeId>,
    pub free: Mutex<FreeLists>,
    cache: AddressCache<Vec<u8>, CachedAddr>,
    /// The background task's jobs. Those queued inside an operation are handed to the task
    /// when the operation ends ([`Inner::kick_jobs`]), not in its middle.
    jobs: Arc<Background<Job>>,
    allocs: std::sync::atomic::AtomicU64,
    /// `dmkit_fusee_op_seconds{op}` by [`OpName`].
    op_seconds: [std::sync::OnceLock<metrics::Histogram>; 4],
    cfg: ClientConfig,
    /// One block acquisition at a time.
    pub(crate) block_lock: tokio::sync::Mutex<u64>,
    /// Reconnects to memory nodes that restarted (set by the process that knows addresses).
    reconnector: Reconnector,
    /// Sequence numbers of this client's large values.
    pub(crate) large_seq: std::sync::atomic::AtomicU64,
    /// Write attempts made (their claim tokens).
    attempts: std::sync::atomic::AtomicU64,
    /// How often an upsert of a key with no cached address lately found the key present
    /// (+1) or absent (−1), clamped to ±[`PUT_GUESS_CLAMP`]: above zero, such upserts try
    /// UPDATE first (see [`Client::put_async`]).
    put_guess: std::sync::atomic::AtomicI32,
}

/// Bound of [`Inner::put_guess`]: a workload that turns from updates to fresh keys (or
/// back) changes the guess within this many upserts.
const PUT_GUESS_CLAMP: i32 = 4;

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client").field("id", &self.id).finish()
    }
}

/// A FUSEE client. Cheap to clone; clones share connections, free lists and cache, and may
/// run operations from many threads at once.
#[derive(Debug, Clone)]
pub struct Client {
    pub(crate) inner: Arc<Inner>,
}

/// Hooks that put FUSEE's object write into the index's first round trip and its commit
/// record before the primary swap.
pub(crate) struct Hooks<'a> {
    inner: &'a Inner,
    first: Mutex<Option<Vec<Batch>>>,
    ours: &'a Allocation,
    op: Op,
    verifier: &'a Verifier<'a>,
    /// The last SNAPSHOT round started: (slot, the value it replaces).
    round: Mutex<Option<(SlotPos, u64)>>,
    /// The last round reached its primary swap: every backup held this writer's value.
    swapping: std::sync::atomic::AtomicBool,
    /// The last round's commit record is written: its primary CAS is posted next.
    posted: std::sync::atomic::AtomicBool,
    /// The cached object read in the first round: (its cache entry, batch, op index).
    prefetch: Option<(CachedAddr, usize, dmkit_verbs::OpIdx)>,
    key: &'a [u8],
}

impl Hooks<'_> {
    /// This write's commit record (replacing `old`, whose object has generation `old_gen`):
    /// [`Inner::commit_batches`].
    fn commit_batches(&self, old: u64, old_gen: u32) -> Result<(Vec<Batch>, bool)> {
        self.inner.commit_batches(
            self.verifier.locator().0,
            self.ours,
            self.op,
            Commit { old, old_gen },
        )
    }

    /// The generation of the object the slot word `old` names, if this operation read it
    /// (0 for a word that names none: an INSERT's empty slot).
    fn known_generation(&self, old: u64) -> Option<u32> {
        if matches!(Slot::from_raw(old), Ok(None)) {
            return Some(0);
        }
        self.verifier
            .peek(|s, o| (s.raw() == old).then_some(o.generation))
            .flatten()
    }
}

impl WriteHooks for Hooks<'_> {
    fn first_round(&self) -> Vec<Batch> {
        self.first.lock().take().unwrap_or_default()
    }

    fn first_round_done(&self, results: &[dmkit_verbs::BatchResult]) {
        let Some((c, b, i)) = self.prefetch else {
            return;
        };
        let Some(r) = results.get(b) else { return };
        let found = object::decode(r.read(i), slot_addr(c.slot))
            .filter(|o| o.key == self.key && o.generation == c.generation)
            .filter(|o| o.flags & (object::FLAG_OUTDATED | object::FLAG_RECLAIMED) == 0);
        if let Some(o) = found {
            self.verifier.prefetched(c.slot, o);
        }
    }

    /// A DELETE's tombstone carries its log object's address: unique per attempt, so two
    /// DELETEs of one value do not share a proposal (and recovery, finishing a crashed
    /// DELETE from its log object, proposes the same word again).
    fn delete_mark(&self) -> u64 {
        if self.op == Op::Delete {
            dmkit_kv_index::delete_mark(self.ours.addr.node, self.ours.addr.offset)
        } else {
            0
        }
    }

    fn stuck_after(&self) -> Option<Duration> {
        Some(self.inner.cfg.resync_after)
    }

    fn round_stuck(&self, state: &str) {
        let epoch = self.inner.view().epoch;
        self.inner
            .ask_resync(epoch, format!("a SNAPSHOT round nobody finishes: {state}"));
    }

    fn round(&self, pos: SlotPos, expected: u64) {
        *self.round.lock() = Some((pos, expected));
        self.swapping
            .store(false, std::sync::atomic::Ordering::Relaxed);
        self.posted
            .store(false, std::sync::atomic::Ordering::Relaxed);
    }

    fn before_primary(&self, old: u64) -> dmkit_kv_index::Result<()> {
        dmkit_verbs::block_on(self.before_primary_async(old))
    }

    /// The commit record in the primary CAS's batch, when all of it goes to the primary's
    /// node and is durable there before the CAS runs (r = 1 with the object on the index's
    /// node): a write's commit round and swap round are one. The node executes the batch in
    /// order, so a swap without its record cannot happen; a batch cut short leaves the
    /// record alone (as a failure between the two rounds did) or nothing.
    fn with_primary(&self, old: u64, primary: NodeId) -> Option<Batch> {
        use std::sync::atomic::Ordering::Relaxed;
        self.swapping.store(true, Relaxed);
        // (With r ≥ 2 the record goes to r nodes, never one batch: not built here, and again
        // by `before_primary_async`.)
        let view = self.verifier.locator().0;
        if view
            .block_replicas(self.ours.addr.offset / view.block_size)
            .len()
            != 1
        {
            return None;
        }
        let old_gen = self.known_generation(old)?;
        let (mut batches, ordered) = self.commit_batches(old, old_gen).ok()?;
        if !ordered || batches.len() != 1 || batches[0].node() != primary {
            return None;
        }
        self.posted.store(true, Relaxed);
        batches.pop()
    }

    fn before_primary_async(
        &self,
        old: u64,
    ) -> dmkit_kv_index::BoxFuture<'_, dmkit_kv_index::Result<()>> {
        Box::pin(async move {
            self.swapping
                .store(true, std::sync::atomic::Ordering::Relaxed);
            let known = self.known_generation(old);
            let to_index = |e: Error| match e {
                Error::Verbs(v) => dmkit_kv_index::Error::from(v),
                e => dmkit_kv_index::Error::Verifier(e.to_string()),
            };
            let old_gen = match known {
                Some(g) => g,
                // Recovery resumes rounds without having read the object it replaces: read its
                // generation now (one round trip, only on that path).
                None => self.inner.generation_of(old).map_err(to_index)?,
            };
            // Phase 3 in a round trip of its own: the commit record and the replaced object's
            // outdated flag.
            let (batches, _) = self.commit_batches(old, old_gen).map_err(to_index)?;
            for r in self
                .inner
                .ep
                .execute_many_async(tags::COMMIT, batches)
                .await
            {
                r?;
            }
            self.posted
                .store(true, std::sync::atomic::Ordering::Relaxed);
            Ok(())
        })
    }
}

/// Runs one client operation, recording its latency in `dmkit_fusee_op_seconds{op}` and a
/// failure in `dmkit_fusee_op_errors_total{op}` (an upsert records the update and insert it
/// is made of). When it is over, the jobs it queued for the background task are handed to
/// the task ([`Inner::kick_jobs`]: after the reply is ready, not in the middle of the
/// operation). A plain future, not an `async fn`: that would keep the operation's future
/// twice in its state (the argument and the awaited copy), and every caller moves it.
fn op_timed<'a, T, F: Future<Output = Result<T>>>(
    inner: &'a Inner,
    op: OpName,
    f: F,
) -> OpTimed<'a, F> {
    OpTimed {
        f,
        inner,
        op,
        start: None,
    }
}

/// The `op` label of an operation's metrics.
#[derive(Debug, Clone, Copy)]
enum OpName {
    Search,
    Insert,
    Update,
    Delete,
}

impl OpName {
    fn label(self) -> &'static str {
        match self {
            OpName::Search => "search",
            OpName::Insert => "insert",
            OpName::Update => "update",
            OpName::Delete => "delete",
        }
    }
}

pin_project_lite::pin_project! {
    struct OpTimed<'a, F> {
        #[pin]
        f: F,
        inner: &'a Inner,
        op: OpName,
        start: Option<std::time::Instant>,
    }
}

impl<T, F: Future<Output = Result<T>>> Future for OpTimed<'_, F> {
    type Output = Result<T>;

    fn poll(self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> Poll<Result<T>> {
        let this = self.project();
        let t = *this.start.get_or_insert_with(std::time::Instant::now);
        let r = std::task::ready!(this.f.poll(cx));
        this.inner.kick_jobs();
        let op = *this.op;
        // (The handle is looked up once per client, under the recorder of its first
        // operation: not a key built and hashed per operation.)
        this.inner.op_seconds[op as usize]
            .get_or_init(|| metrics::histogram!("dmkit_fusee_op_seconds", "op" => op.label()))
            .record(t.elapsed().as_secs_f64());
        if r.is_err() {
            metrics::counter!("dmkit_fusee_op_errors_total", "op" => op.label()).increment(1);
        }
        Poll::Ready(r)
    }
}

impl Client {
    /// Joins the cluster whose memory nodes `ep` is connected to (`nodes` in ring order).
    pub fn connect(ep: Endpoint, nodes: &[NodeId], cfg: ClientConfig) -> Result<Client> {
        let (c, rx) = Self::open(ep, nodes, cfg)?;
        c.start_worker(rx);
        Ok(c)
    }

    pub(crate) fn open(
        ep: Endpoint,
        nodes: &[NodeId],
        cfg: ClientConfig,
    ) -> Result<(Client, JobRx)> {
        if cfg.id >= MAX_CLIENT_ID {
            return Err(Error::Config(format!(
                "client id {} is reserved (use ids below {MAX_CLIENT_ID})",
                cfg.id
            )));
        }
        // Join in an active epoch (one being repaired is only for reading); a node failing
        // meanwhile means waiting for the master's next one.
        let deadline = std::time::Instant::now() + cfg.failover_wait;
        let reconnector = Reconnector::default();
        if let Some(rc) = cfg.reconnect.clone() {
            reconnector.set(rc);
        }
        let (view, index) = loop {
            let open = if cfg.join_without_silent_members {
                cluster::open_tolerant
            } else {
                cluster::open
            };
            let opened = open(&ep, nodes).and_then(|v| {
                let index = RaceIndex::open(&ep, &v.index_spaces())?;
                Ok((v, index))
            });
            let late = std::time::Instant::now() > deadline;
            match opened {
                Ok((v, i)) if !v.repairing || late => break (v, i),
                Ok(_) => {}
                Err(e) if needs_membership(&e) && !late => {
                    tracing::debug!(error = %e, "joining while the membership changes");
                    for n in nodes {
                        if ep.connection(*n).is_err() {
                            let _ = reconnector.ensure(&ep, *n, |_| Ok::<_, Infallible>(()));
                        }
                    }
                }
                Err(e) => return Err(e),
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let cache =
            AddressCache::new(cfg.cache.clone()).map_err(|e| Error::Config(e.to_string()))?;
        let jobs = Arc::new(Background::new());
        let inner = Arc::new(Inner {
            id: cfg.id,
            ep,
            state: parking_lot::RwLock::new((Arc::new(view), Arc::new(index))),
            nodes: nodes.to_vec(),
            free: Mutex::new(FreeLists::default()),
            cache,
            jobs: jobs.clone(),
            allocs: std::sync::atomic::AtomicU64::new(0),
            op_seconds: Default::default(),
            cfg,
            block_lock: tokio::sync::Mutex::new(0),
            reconnector,
            large_seq: std::sync::atomic::AtomicU64::new(0),
            put_guess: std::sync::atomic::AtomicI32::new(0),
            attempts: std::sync::atomic::AtomicU64::new(0),
        });
        Ok((Client { inner }, jobs))
    }

    /// Starts the background task (cleanup, prefetch, reclaim) on the I/O runtime: a client
    /// costs no thread of its own.
    pub(crate) fn start_worker(&self, rx: JobRx) {
        let weak = Arc::downgrade(&self.inner);
        dmkit_verbs::runtime::io_runtime().spawn(worker(weak, rx));
    }

    pub fn id(&self) -> u64 {
        self.inner.id
    }

    /// Runs the background sweep ([`Client::reclaim_expired`]) on the I/O runtime: one index
    /// subtable every `every`, round after round, until the client is dropped. One client of
    /// a deployment is enough (the gateway runs one).
    pub fn start_expiry_sweep(&self, every: Duration) {
        let weak = Arc::downgrade(&self.inner);
        dmkit_verbs::runtime::io_runtime().spawn(async move {
            let mut pacer = crate::SweepPacer::new(every);
            loop {
                tokio::time::sleep(pacer.pause()).await;
                let Some(inner) = weak.upgrade() else { return };
                let client = Client { inner };
                let started = std::time::Instant::now();
                let step = client.reclaim_expired_async(pacer.cursor()).await;
                if let Err(e) = &step {
                    tracing::debug!(error = %e, "expiry sweep step failed; again later");
                }
                pacer.stepped(step.ok(), started.elapsed());
            }
        });
    }

    pub fn endpoint(&self) -> &Endpoint {
        &self.inner.ep
    }

    /// The cluster as of the client's current membership epoch.
    pub fn view(&self) -> Arc<ClusterView> {
        self.inner.view()
    }

    /// The address cache's statistics.
    pub fn cache_stats(&self) -> dmkit_cache::AddressCacheStats {
        self.inner.cache.stats()
    }

    /// Blocks this client owns (data blocks, across the cluster).
    pub fn owned_blocks(&self) -> usize {
        self.inner.free.lock().slabs.blocks.len()
    }

    /// The size class of each data block this client owns.
    pub fn owned_block_classes(&self) -> Vec<usize> {
        self.inner
            .free
            .lock()
            .slabs
            .blocks
            .iter()
            .map(|b| b.class)
            .collect()
    }

    /// Free objects on this client's lists.
    pub fn free_objects(&self) -> usize {
        self.inner.free.lock().total()
    }

    /// Waits until every background job queued so far (cleanups, reclaims) is done.
    pub fn flush(&self) -> Result<()> {
        if self.inner.jobs.pending() == 0 {
            // Nothing queued or running: no need to wake the task to hear it.
            return Ok(());
        }
        let (tx, rx) = mpsc::channel();
        if !self.inner.send(Job::Flush(tx)) {
            return Ok(());
        }
        dmkit_verbs::runtime::blocking(|| rx.recv_timeout(Duration::from_secs(60)))
            .map_err(|_| Error::Config("the background task did not answer".into()))?
    }

    /// Takes back freed objects now (normally done every `reclaim_every` allocations).
    pub fn reclaim(&self) -> Result<usize> {
        dmkit_verbs::block_on(self.inner.reclaim())
    }

    /// SEARCH: the stored bytes of `key` ([`crate::value`]). One round trip on an
    /// address-cache hit (the slot and the object read together), two otherwise (buckets,
    /// then object).
    pub(crate) async fn search_raw_async(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        op_timed(&self.inner, OpName::Search, async move {
            self.with_failover_async(
                || self.search_once_async(key),
                Some(&|view: &ClusterView, index: &RaceIndex| {
                    // The index is being repaired: answer when the replicas agree on the key; a
                    // slot they disagree on is being decided, so wait for that.
                    let v = verifier(view);
                    Ok(match index.search_agreed(&v, key)? {
                        None => None,
                        Some(None) => Some(None),
                        Some(Some(_)) => v.take().map(|(_, obj)| Some(obj.value)),
                    })
                }),
                None,
            )
            .await
        })
        .await
    }

    fn search_once(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        dmkit_verbs::block_on(self.search_once_async(key))
    }

    async fn search_once_async(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        let inner = &self.inner;
        if !inner.cache.should_bypass() {
            if let Some(c) = inner.cache.get(key) {
                match inner.cached_search_async(key, c).await {
                    Ok(Some(v)) => return Ok(Some(v)),
                    Ok(None) => inner.cache.report_stale(key),
                    // The cached object's node does not answer: the uncached path below
                    // reads the buckets and the object from a replica that does.
                    Err(e) if needs_membership(&e) => {}
                    Err(e) => return Err(e),
                }
            }
        }
        let (view, index) = inner.state();
        let v = verifier(&view);
        match index.search_at_async(&v, key).await? {
            Some((slot, pos)) => {
                let Some((s, obj)) = v.take() else {
                    return Err(Error::Corrupt(
                        "index matched a key the verifier did not".into(),
                    ));
                };
                if s != slot {
                    return Err(Error::Corrupt("verifier matched another slot".into()));
                }
                inner.cache.insert(
                    key.to_vec(),
                    CachedAddr {
                        slot,
                        pos,
                        generation: obj.generation,
                    },
                );
                Ok(Some(obj.value))
            }
            None => {
                inner.cache.remove(key);
                Ok(None)
            }
        }
    }

    /// INSERT: `key → value` (stored bytes) unless the key is present (expired or not).
    pub(crate) async fn insert_raw_async(&self, key: &[u8], value: &[u8]) -> Result<InsertResult> {
        op_timed(&self.inner, OpName::Insert, async move {
            let last = Mutex::new(None);
            self.with_failover_async(
                || self.insert_once(key, value, &last),
                None,
                Some(&|| self.settled(key, &last, InsertResult::Inserted)),
            )
            .await
        })
        .await
    }

    async fn insert_once(
        &self,
        key: &[u8],
        value: &[u8],
        last: &Mutex<Option<Attempt>>,
    ) -> Result<InsertResult> {
        let inner = &self.inner;
        let a = timed_async(
            "fusee.alloc",
            inner.allocate_attempt(object::object_len(key.len(), value.len()), false, last),
        )
        .await?;
        let res = async {
            let bytes = timed("fusee.encode", || {
                object::encode(key, value, a.next, a.prev, a.generation, Op::Insert)
            })?;
            let slot = inner.slot_of(key, &a, bytes.len())?;
            let (view, index) = inner.state();
            let v = verifier(&view);
            let hooks = inner.hooks(key, &a, &bytes, Op::Insert, &v);
            let out =
                timed_async("index", index.insert_hooked_async(&v, key, slot, &hooks)).await?;
            Ok::<_, Error>((out, slot, bytes.len()))
        }
        .await;
        match res {
            Ok((InsertOutcome::Inserted { pos, .. }, slot, len)) => {
                inner.cache.insert(
                    key.to_vec(),
                    CachedAddr {
                        slot,
                        pos,
                        generation: a.generation,
                    },
                );
                inner.enqueue_cleanup(&a, len, Op::Insert, None).await;
                Ok(InsertResult::Inserted)
            }
            Ok((InsertOutcome::AlreadyExists { .. }, _, _)) => {
                inner.take_back_lost(&a, last).await?;
                Ok(InsertResult::AlreadyExists)
            }
            Err(e) => Err(e),
        }
    }

    /// UPDATE: replaces the stored bytes of a present key (with `live`, one whose deadline
    /// has not passed: an expired key is not found). `replaced` gets the stored bytes the
    /// UPDATE replaced, when it knows them.
    pub(crate) async fn update_raw_async(
        &self,
        key: &[u8],
        value: &[u8],
        live: bool,
        replaced: &Mutex<Option<Vec<u8>>>,
    ) -> Result<UpdateResult> {
        op_timed(&self.inner, OpName::Update, async move {
            let expect = if live {
                Expect::Live(self.inner.cfg.clock_skew_ms)
            } else {
                Expect::Any
            };
            Ok(
                match self.update_until_done(key, value, expect, replaced).await? {
                    CasResult::NotFound => UpdateResult::NotFound,
                    _ => UpdateResult::Updated,
                },
            )
        })
        .await
    }

    /// UPDATE (`expected: None`) or compare-and-set, attempt after attempt until one is done:
    /// an attempt that lost its round to a conditional write or a DELETE (any, for a
    /// conditional one) writes again after it, reading and comparing again.
    async fn update_until_done(
        &self,
        key: &[u8],
        value: &[u8],
        expected: Expect<'_>,
        replaced: &Mutex<Option<Vec<u8>>>,
    ) -> Result<CasResult> {
        loop {
            let last = Mutex::new(None);
            let done = CondStep::Done(CasResult::Swapped);
            let step = self
                .with_failover_async(
                    || self.update_once(key, value, expected, &last, replaced),
                    None,
                    Some(&|| self.settled(key, &last, done.clone())),
                )
                .await?;
            match step {
                CondStep::Done(r) => return Ok(r),
                CondStep::Lost => continue,
            }
        }
    }

    /// Compare-and-set on stored bytes: replaces those of `key` with `value` only if they
    /// are `expected` (byte for byte) when the write takes effect — one SNAPSHOT round, as
    /// UPDATE. Linearizable: [`CasResult::Mismatch`] carries the stored bytes the key held
    /// instead.
    pub(crate) async fn cas_raw_async(
        &self,
        key: &[u8],
        expected: &[u8],
        value: &[u8],
    ) -> Result<CasResult> {
        let unused = Mutex::new(None);
        op_timed(
            &self.inner,
            OpName::Update,
            self.update_until_done(key, value, Expect::Exactly(expected), &unused),
        )
        .await
    }

    async fn update_once(
        &self,
        key: &[u8],
        value: &[u8],
        expected: Expect<'_>,
        last: &Mutex<Option<Attempt>>,
        replaced: &Mutex<Option<Vec<u8>>>,
    ) -> Result<CondStep> {
        let inner = &self.inner;
        let a = timed_async(
            "fusee.alloc",
            inner.allocate_attempt(object::object_len(key.len(), value.len()), false, last),
        )
        .await?;
        let bytes = timed("fusee.encode", || {
            let cond = matches!(expected, Expect::Exactly(_));
            object::encode_as(key, value, a.next, a.prev, a.generation, Op::Update, cond)
        })?;
        let slot = inner.slot_of(key, &a, bytes.len())?;
        let (view, index) = inner.state();
        let v = verifier(&view);
        let guard = guard(&v, expected);
        let hooks = inner.hooks(key, &a, &bytes, Op::Update, &v);
        let m = timed_async(
            "index",
            index.update_hooked_async(&guard, key, slot, &hooks),
        )
        .await?;
        let found = v.take();
        match m {
            None => {
                inner.take_back_lost(&a, last).await?;
                inner.cache.remove(key);
                Ok(CondStep::Done(match guard.rejection().flatten() {
                    Some(held) => CasResult::Mismatch(held),
                    None => CasResult::NotFound,
                }))
            }
            Some(Modified {
                old,
                pos,
                outcome: SnapshotOutcome::Won(_),
            }) => {
                inner.cache.insert(
                    key.to_vec(),
                    CachedAddr {
                        slot,
                        pos,
                        generation: a.generation,
                    },
                );
                let found = found.filter(|(s, _)| *s == old).map(|(_, o)| o);
                let old_gen = found.as_ref().map(|o| o.generation).unwrap_or(0);
                *replaced.lock() = found.map(|o| o.value);
                inner
                    .enqueue_cleanup(&a, bytes.len(), Op::Update, Some((old, old_gen)))
                    .await;
                Ok(CondStep::Done(CasResult::Swapped))
            }
            Some(Modified {
                old,
                outcome: SnapshotOutcome::Lost { now },
                ..
            }) => {
                // Unconditional, against the unconditional write that replaced the word we
                // replace: linearized just before it, done, and overwritten at once (FUSEE's
                // rule). When that write was conditional (it compared the value both replace,
                // so nothing comes between), or the primary has moved on past it, or a DELETE
                // won (maybe a delete-if): write again, after it. A conditional loser: the
                // winner's value decides (read and compare again).
                inner.take_back_lost(&a, last).await?;
                inner.cache.remove(key);
                if matches!(expected, Expect::Exactly(_)) {
                    return Ok(CondStep::Lost);
                }
                let again = match now {
                    Some(w) => crate::verifier::read_objects_async(&inner.ep, &view, &[w])
                        .await?
                        .into_iter()
                        .next()
                        .flatten()
                        .is_none_or(|o| {
                            o.conditional || o.log.commit.is_none_or(|c| c.old != old.raw())
                        }),
                    None => true,
                };
                Ok(if again {
                    CondStep::Lost
                } else {
                    // Done, and overwritten at once: the value this write stored is the
                    // one to clean up after (the chunks of a large one).
                    *replaced.lock() = Some(value.to_vec());
                    CondStep::Done(CasResult::Swapped)
                })
            }
        }
    }

    /// DELETE: removes a present key (with `live`, one whose deadline has not passed).
    /// `replaced` gets the stored bytes it removed, when it knows them.
    pub(crate) async fn delete_raw_async(
        &self,
        key: &[u8],
        live: bool,
        replaced: &Mutex<Option<Vec<u8>>>,
    ) -> Result<DeleteResult> {
        op_timed(&self.inner, OpName::Delete, async move {
            let last = Mutex::new(None);
            let expect = if live {
                Expect::Live(self.inner.cfg.clock_skew_ms)
            } else {
                Expect::Any
            };
            let r = self
                .with_failover_async(
                    || self.delete_once(key, expect, &last, replaced),
                    None,
                    Some(&|| self.settled(key, &last, CasResult::Swapped)),
                )
                .await?;
            Ok(if r == CasResult::Swapped {
                DeleteResult::Deleted
            } else {
                DeleteResult::NotFound
            })
        })
        .await
    }

    /// Conditional DELETE on stored bytes: removes `key` only if they are `expected` when
    /// the delete takes effect. Linearizable, as [`Client::cas_raw_async`].
    pub(crate) async fn delete_if_raw_async(
        &self,
        key: &[u8],
        expected: &[u8],
    ) -> Result<CasResult> {
        op_timed(&self.inner, OpName::Delete, async move {
            let last = Mutex::new(None);
            let unused = Mutex::new(None);
            self.with_failover_async(
                || self.delete_once(key, Expect::Exactly(expected), &last, &unused),
                None,
                Some(&|| self.settled(key, &last, CasResult::Swapped)),
            )
            .await
        })
        .await
    }

    async fn delete_once(
        &self,
        key: &[u8],
        expected: Expect<'_>,
        last: &Mutex<Option<Attempt>>,
        replaced: &Mutex<Option<Vec<u8>>>,
    ) -> Result<CasResult> {
        let inner = &self.inner;
        loop {
            // The log entry of a DELETE lives in a temporary object holding the key.
            let a = timed_async(
                "fusee.alloc",
                inner.allocate_attempt(object::object_len(key.len(), 0), true, last),
            )
            .await?;
            let bytes = timed("fusee.encode", || {
                object::encode(key, &[], a.next, a.prev, a.generation, Op::Delete)
            })?;
            let (view, index) = inner.state();
            let v = verifier(&view);
            let guard = guard(&v, expected);
            let hooks = inner.hooks(key, &a, &bytes, Op::Delete, &v);
            let m = match timed_async("index", index.delete_hooked_async(&guard, key, &hooks)).await
            {
                Ok(m) => m,
                Err(e) => {
                    // Whether the attempt had found the key (a cut-short DELETE that did not
                    // find it cannot have taken effect).
                    if let Some(at) = last.lock().as_mut() {
                        at.found = v.has_found();
                        at.round = hooks
                            .round
                            .lock()
                            .map(|(pos, old)| (index.slot_offset(pos), old));
                        at.swapping = hooks.swapping.load(std::sync::atomic::Ordering::Relaxed);
                        at.primary_may_have_run =
                            hooks.posted.load(std::sync::atomic::Ordering::Relaxed) && !refused(&e);
                    }
                    return Err(e.into());
                }
            };
            let found = v.take();
            inner.cache.remove(key);
            match m {
                None => {
                    inner.take_back_lost(&a, last).await?;
                    return Ok(match guard.rejection().flatten() {
                        Some(held) => CasResult::Mismatch(held),
                        None => CasResult::NotFound,
                    });
                }
                Some(Modified {
                    old,
                    outcome: SnapshotOutcome::Won(_),
                    ..
                }) => {
                    let found = found.filter(|(s, _)| *s == old).map(|(_, o)| o);
                    let old_gen = found.as_ref().map(|o| o.generation).unwrap_or(0);
                    *replaced.lock() = found.map(|o| o.value);
                    inner
                        .enqueue_cleanup(&a, bytes.len(), Op::Delete, Some((old, old_gen)))
                        .await;
                    return Ok(CasResult::Swapped);
                }
                Some(Modified {
                    outcome: SnapshotOutcome::Lost { now },
                    ..
                }) => {
                    inner.take_back_lost(&a, last).await?;
                    if now.is_none() {
                        // Another DELETE won: ours comes after it and finds nothing.
                        return Ok(CasResult::NotFound);
                    }
                    // An UPDATE won: a DELETE cannot be linearized before it; try again.
                }
            }
        }
    }

    /// Whether the write attempt in `last`, cut short by a membership change, took effect
    /// (then `done` is the answer). Asked after the new membership is active, so the master
    /// has decided. The key pointing at the attempt's object says so. Otherwise its commit
    /// record does — a writer forces every backup to its value before writing the record, and
    /// the master completes a round whose value it finds on a surviving replica (writing the
    /// record itself when it completes one) — unless the old primary is now the only index
    /// replica: then the backups that held the value are gone, the master could not see the
    /// round, and a record may precede a primary swap that never happened; only the key tells.
    /// The object of an attempt that did not take effect is left (one object per cut-short
    /// write; recovery after a crash of this client takes it back).
    fn settled<T>(&self, key: &[u8], last: &Mutex<Option<Attempt>>, done: T) -> Result<Option<T>> {
        let Some(at) = *last.lock() else {
            return Ok(None);
        };
        if at.lost {
            return Ok(None);
        }
        let inner = &self.inner;
        let index = inner.index();
        let committed = inner.attempt_committed(&at)?;
        // Did every repair since the attempt see the index's backups? (A failover that kept
        // only the old primary's replica could not see a round cut short on the backups.)
        let view = inner.view();
        let blind_since = view.blind.iter().any(|e| *e > at.epoch);
        // (A round with no backup at all — the index down to one replica in the attempt's
        // epoch — leaves no trace a repair could see: its commit record says the primary
        // swap was next, not that it happened; the slot itself tells. A DELETE the master
        // completed has no commit record — its value, a tombstone, points to no log entry —
        // so the membership lists the DELETE rounds the master completed, and the epochs of
        // failovers that lost the index primary. The rules: `rules::settle`.)
        let facts = crate::rules::SettleFacts {
            delete: at.delete,
            committed,
            blind_since,
            attempt_replicas: at.replicas,
            replicas_now: index.replicas(),
            primary_moved: index.primary() != at.primary,
            primary_lost_since: view.primary_lost.iter().any(|e| *e > at.epoch),
            swapping: at.swapping,
            primary_may_have_run: at.primary_may_have_run,
            listed: crate::rules::delete_listed(
                at.round,
                at.round.map_or(0, |(_, old)| {
                    dmkit_kv_index::tombstone_by(
                        old,
                        dmkit_kv_index::delete_mark(at.addr.node, at.addr.offset),
                    )
                }),
                at.epoch,
                &view.deletes,
            ),
            found: at.found,
        };
        let took = crate::rules::settle(
            &facts,
            || inner.is_referenced(key, at.addr),
            || Ok(self.search_once(key)?.is_none()),
        )?;
        let took = match at.round {
            // Another DELETE of the same value, cut short in the same epoch, can pass the
            // same tests: only one of the two did it (see `claim_delete`).
            Some((off, old)) if at.delete && took => {
                self.claim_delete((at.epoch, off, old), at.token)?
            }
            _ => took,
        };
        if took {
            inner.cache.remove(key);
            return Ok(Some(done));
        }
        Ok(None)
    }

    /// Claims a completed DELETE round `(epoch, slot offset, value replaced)` for the
    /// attempt `token`, on the lowest-numbered member: true if the claim is this attempt's.
    /// Two DELETEs of one value, both cut short, both learn that a DELETE completed; only one
    /// did it — the first to claim reports Deleted, the other NotFound (it ran after, on no
    /// key). The claimant is the attempt, not the client: two DELETEs of one value in flight
    /// in one client both claimed "this client" and both reported Deleted (in-flight seed
    /// 1200334).
    fn claim_delete(&self, round: (u64, u64, u64), token: u64) -> Result<bool> {
        let inner = &self.inner;
        let view = inner.view();
        let node = view
            .members
            .iter()
            .copied()
            .min()
            .ok_or_else(|| Error::Membership("no member to claim a DELETE on".into()))?;
        let req = dmkit_verbs::wire::Wire::to_bytes(&crate::memnode::Request::ClaimDelete {
            epoch: round.0,
            offset: round.1,
            replaced: round.2,
            client: token,
        });
        let reply = inner.ep.rpc(cluster::TAG, node, &req)?;
        let mut r = dmkit_verbs::wire::Reader::new(&reply);
        let bad = |why: String| Error::Node {
            node,
            reason: format!("bad DELETE claim reply: {why}"),
        };
        if r.u8().map_err(|e| bad(e.to_string()))? != crate::memnode::status::OK {
            return Err(bad("refused".into()));
        }
        let owner = r.u64().map_err(|e| bad(e.to_string()))?;
        Ok(owner == token)
    }

    /// Sets how this client reconnects to memory nodes that restart (their old connections
    /// are dead). Without it, a restarted node is only used by new clients.
    pub fn set_reconnect(&self, reconnect: Reconnect) {
        self.inner.reconnector.set(reconnect);
    }

    /// The membership epoch this client works in.
    pub fn epoch(&self) -> u64 {
        self.inner.view().epoch
    }

    /// Runs `op`; when it fails because a memory node failed or was fenced, waits for the
    /// master's next active membership and runs it again. With `during_repair` (SEARCH), a
    /// membership being repaired is tried first: `Some` answer ends the wait. With `settled`
    /// (writes), the cut-short attempt is examined before running again: `Some` means it took
    /// effect (its commit record is there), and that is the answer.
    async fn with_failover_async<T, F: Future<Output = Result<T>>>(
        &self,
        op: impl Fn() -> F,
        during_repair: Option<&RepairRead<'_, T>>,
        settled: Option<&Settled<'_, T>>,
    ) -> Result<T> {
        let mut attempts = 0;
        loop {
            let seen = self.inner.view().epoch;
            match op().await {
                Err(e) if needs_membership(&e) && attempts < 16 => {
                    attempts += 1;
                    metrics::counter!("dmkit_fusee_failover_retries_total").increment(1);
                    if let Some(f) = during_repair {
                        if let Some((view, index)) = self.inner.repairing_epoch(seen) {
                            if let Ok(Some(v)) = f(&view, &index) {
                                return Ok(v);
                            }
                        }
                    }
                    if let Err(again) = self.inner.catch_up(&e, seen) {
                        tracing::warn!(error = %again, "no new membership");
                        // This client crashing (fault injection) says more than the failure.
                        let crashed = matches!(
                            again,
                            Error::Verbs(dmkit_verbs::Error::ClientCrashed { .. })
                                | Error::Index(dmkit_kv_index::Error::Verbs(
                                    dmkit_verbs::Error::ClientCrashed { .. }
                                ))
                        );
                        return Err(if crashed { again } else { e });
                    }
                    if let Some(s) = settled {
                        // Settle before running again — in whatever epoch that takes.
                        let took = loop {
                            match s() {
                                Ok(took) => break took,
                                Err(e2) if needs_membership(&e2) && attempts < 16 => {
                                    attempts += 1;
                                    let now = self.inner.view().epoch;
                                    self.inner.catch_up(&e2, now).map_err(|_| e2)?;
                                }
                                Err(e2) => return Err(e2),
                            }
                        };
                        if let Some(v) = took {
                            return Ok(v);
                        }
                    }
                }
                r => return r,
            }
        }
    }

    /// One step of a scan over every key: the keys and stored bytes of one index subtable,
    /// and the cursor of the next step (0 when the scan is done; start with 0).
    pub(crate) async fn scan_raw_async(
        &self,
        cursor: u64,
    ) -> Result<(Vec<(Vec<u8>, Vec<u8>)>, u64)> {
        let (view, index) = self.inner.state();
        let (slots, next) = index.scan_async(cursor).await?;
        let objs = crate::verifier::read_objects_async(&self.inner.ep, &view, &slots).await?;
        let keys = objs
            .into_iter()
            .flatten()
            .filter(|o| o.flags & object::FLAG_RECLAIMED == 0)
            .map(|o| (o.key, o.value))
            .collect();
        Ok((keys, next))
    }

    /// This client's clock (Unix milliseconds, with its configured skew).
    pub fn now(&self) -> u64 {
        crate::value::now_ms().saturating_add_signed(self.inner.cfg.clock_skew_ms)
    }

    /// This client's settings.
    pub(crate) fn config(&self) -> &ClientConfig {
        &self.inner.cfg
    }

    /// The sequence numbers of this client's large values.
    pub(crate) fn inner_large_seq(&self) -> &std::sync::atomic::AtomicU64 {
        &self.inner.large_seq
    }

    /// Whether `key`'s address is cached (it is most likely present).
    pub(crate) fn is_cached(&self, key: &[u8]) -> bool {
        self.inner.cache.contains(key)
    }

    /// Whether upserts of uncached keys have lately found their keys present (so the next
    /// one should try UPDATE first).
    pub(crate) fn uncached_puts_find_keys(&self) -> bool {
        self.inner
            .put_guess
            .load(std::sync::atomic::Ordering::Relaxed)
            > 0
    }

    /// An upsert of an uncached key found it `present` (or not) in its first attempt.
    pub(crate) fn learn_put(&self, present: bool) {
        let step = if present { 1 } else { -1 };
        let _ = self.inner.put_guess.fetch_update(
            std::sync::atomic::Ordering::Relaxed,
            std::sync::atomic::Ordering::Relaxed,
            |g| Some((g + step).clamp(-PUT_GUESS_CLAMP, PUT_GUESS_CLAMP)),
        );
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.jobs.close();
    }
}

/// Keeps in `best` the newest of it and `r`, counting only records of cluster `uuid`.
fn keep_newest(
    best: &mut Option<crate::membership::Membership>,
    r: Option<crate::membership::Membership>,
    uuid: u128,
) {
    if let Some(r) = r.filter(|r| r.cluster == uuid) {
        if best.as_ref().is_none_or(|b| r.epoch > b.epoch) {
            *best = Some(r);
        }
    }
}

/// Whether `e` means the membership changed under the operation (a failed or fenced node, a
/// rotated rkey), so it should be retried in the next epoch.
/// The memory node refused a verb of the index (a fenced or stale rkey, a bad access): that
/// verb did not run, nor any after it (SNAPSHOT posts nothing after a verb that failed).
fn refused(e: &dmkit_kv_index::Error) -> bool {
    matches!(
        e,
        dmkit_kv_index::Error::Verbs(dmkit_verbs::Error::RemoteAccess { .. })
    )
}

pub(crate) fn needs_membership(e: &Error) -> bool {
    let verbs = match e {
        Error::Verbs(v) | Error::Index(dmkit_kv_index::Error::Verbs(v)) => v,
        Error::Unavailable(_) | Error::Refused(_) => return true,
        Error::Index(dmkit_kv_index::Error::Verifier(m)) => {
            return m.contains("does not serve") || m.contains("node");
        }
        _ => return false,
    };
    use dmkit_verbs::{AccessFault, Error as V};
    verbs.is_node_failure()
        || matches!(
            verbs,
            V::RemoteAccess {
                fault: AccessFault::UnknownRkey | AccessFault::Fenced,
                ..
            } | V::NoSuchNode(_)
                | V::Dropped { .. }
        )
}

impl Inner {
    /// One round of asking every node for its membership at once (a node cut off may take
    /// its whole timeout to fail, so the first record `want` accepts ends the round): that
    /// record, else the newest of this cluster's.
    fn poll_membership(
        &self,
        want: impl Fn(&crate::membership::Membership) -> bool,
    ) -> Result<Option<crate::membership::Membership>> {
        let rc = self.reconnector.get();
        let uuid = self.view().uuid;
        if self.cfg.inline_jobs {
            // Every verb from the caller's thread (deterministic simulation): ask in turn.
            let mut best: Option<crate::membership::Membership> = None;
            for n in &self.nodes {
                let r = match crate::failover::query_or_reconnect(&self.ep, rc.as_ref(), *n) {
                    Err(e @ Error::Verbs(dmkit_verbs::Error::ClientCrashed { .. })) => {
                        return Err(e);
                    }
                    Err(_) => continue,
                    Ok(q) => q.record,
                };
                keep_newest(&mut best, r, uuid);
            }
            return Ok(best);
        }
        let (tx, rx) = mpsc::channel();
        for n in &self.nodes {
            let (ep, rc, tx, n) = (self.ep.clone(), rc.clone(), tx.clone(), *n);
            std::thread::spawn(move || {
                let r = crate::failover::query_or_reconnect(&ep, rc.as_ref(), n).map(|q| q.record);
                let _ = tx.send(r);
            });
        }
        drop(tx);
        let mut best: Option<crate::membership::Membership> = None;
        let round_ends = std::time::Instant::now() + Duration::from_secs(10);
        while let Ok(r) =
            rx.recv_timeout(round_ends.saturating_duration_since(std::time::Instant::now()))
        {
            let r = match r {
                Err(e @ Error::Verbs(dmkit_verbs::Error::ClientCrashed { .. })) => return Err(e),
                Err(_) => None,
                Ok(r) => r,
            };
            keep_newest(&mut best, r, uuid);
            if best.as_ref().is_some_and(&want) {
                break;
            }
        }
        Ok(best)
    }

    fn open_epoch(&self, m: &crate::membership::Membership) -> Result<(ClusterView, RaceIndex)> {
        // A member this client lost its connection to (it failed and came back): connect
        // again before working in the epoch that readmits it.
        for (n, _) in &m.members {
            self.reconnect_if_gone(*n);
        }
        let view = cluster::open_at(&self.ep, &self.nodes, m)?;
        let index = RaceIndex::open(&self.ep, &view.index_spaces())?;
        Ok((view, index))
    }

    /// The membership being repaired after epoch `seen`, opened (for SEARCH while the master
    /// repairs the index); `None` when there is none.
    pub(crate) fn repairing_epoch(&self, seen: u64) -> Option<(ClusterView, RaceIndex)> {
        let m = self.poll_membership(|m| m.epoch > seen).ok()??;
        if m.epoch <= seen || !m.repairing {
            return None;
        }
        self.open_epoch(&m).ok()
    }

    /// Waits for an active membership newer than epoch `seen` and switches to it (a client
    /// only ever works in active epochs: the rkeys of a repairing one are for reading). Fails
    /// after `failover_wait`.
    /// After `e` cut an operation short in epoch `seen`: waits for what it calls for — the
    /// refusing member to catch up ([`Inner::await_refused`]), else a newer epoch.
    pub(crate) fn catch_up(&self, e: &Error, seen: u64) -> Result<()> {
        match e {
            Error::Refused(n) => self.await_refused(*n, seen),
            // No connection to a member of the current epoch (lost while it failed, and it
            // is back): connect again and retry in this epoch, rather than wait for another.
            Error::Verbs(dmkit_verbs::Error::NoSuchNode(n))
            | Error::Index(dmkit_kv_index::Error::Verbs(dmkit_verbs::Error::NoSuchNode(n)))
                if self.view().epoch == seen
                    && self.view().is_member(*n)
                    && self.reconnect_if_gone(*n) =>
            {
                Ok(())
            }
            _ => self.refresh(seen),
        }
    }

    /// Connects to `node` again if this client has no live connection to it (and knows
    /// how): whether it has one now.
    fn reconnect_if_gone(&self, node: NodeId) -> bool {
        // (A connection a timeout killed is still listed, dead: every verb on it fails at
        // once. Treating it as there wedged a gateway until it restarted: the epoch-179 wait.)
        self.ep.connection(node).is_ok_and(|c| c.is_alive())
            || self
                .reconnector
                .ensure(&self.ep, node, |_| Ok::<_, Infallible>(()))
                .is_ok()
    }

    /// After `node` refused a block request in epoch `seen`: the master publishes a new
    /// record to one member after another, so a member can still hold the previous (repairing)
    /// one when this client already works in the new epoch. Waits until `node` serves in
    /// `seen` — or, if it does not within the failover wait, for a newer epoch as
    /// [`Inner::refresh`] does.
    pub(crate) fn await_refused(&self, node: NodeId, seen: u64) -> Result<()> {
        let deadline = std::time::Instant::now() + self.cfg.failover_wait;
        let rc = self.reconnector.get();
        loop {
            {
                let st = self.state.read();
                if st.0.epoch > seen && !st.0.repairing {
                    return Ok(());
                }
            }
            match crate::failover::query_or_reconnect(&self.ep, rc.as_ref(), node) {
                Err(e @ Error::Verbs(dmkit_verbs::Error::ClientCrashed { .. })) => return Err(e),
                Ok(q) => match q.record {
                    Some(r) if r.epoch > seen => return self.refresh(seen),
                    Some(r)
                        if r.epoch == seen && !r.repairing && r.is_member(node) && !q.fenced =>
                    {
                        return Ok(());
                    }
                    _ => {}
                },
                Err(_) => {}
            }
            if std::time::Instant::now() > deadline {
                return self.refresh(seen);
            }
            let pause = if self.cfg.inline_jobs { 1 } else { 5 };
            std::thread::sleep(Duration::from_millis(pause));
        }
    }

    /// Asks every member, in the background, to have the master fence and repair the
    /// cluster in `epoch` (see [`crate::failover::Master::run`]); `why` goes to its log.
    /// Best effort: a member that does not answer is skipped (the master fails it over).
    pub(crate) fn ask_resync(&self, epoch: u64, why: String) {
        metrics::counter!("dmkit_fusee_resync_requests_total").increment(1);
        tracing::info!(client = self.id, epoch, %why, "asking the master for a resync");
        let req = crate::memnode::Request::Resync {
            epoch,
            why: why.into_bytes(),
        };
        let req = dmkit_verbs::wire::Wire::to_bytes(&req);
        let members: Vec<NodeId> = self.view().members.clone();
        if self.cfg.inline_jobs {
            // (Deterministic simulation: every verb from the caller's thread.)
            for n in members {
                let _ = self.ep.rpc(cluster::TAG, n, &req);
            }
            return;
        }
        let ep = self.ep.clone();
        std::thread::spawn(move || {
            for n in members {
                let _ = ep.rpc(cluster::TAG, n, &req);
            }
        });
    }

    pub(crate) fn refresh(&self, seen: u64) -> Result<()> {
        let start = std::time::Instant::now();
        let deadline = start + self.cfg.failover_wait;
        let wanted = |m: &crate::membership::Membership| m.epoch > seen && !m.repairing;
        // No newer epoch after `resync_after`, with every member still answering the master,
        // means nobody will fail anything over (a verb timed out on a live member, its fate
        // unknown): ask the master for a resync, again every few seconds.
        let mut ask_at = start + self.cfg.resync_after;
        loop {
            {
                let st = self.state.read();
                if st.0.epoch > seen && !st.0.repairing {
                    return Ok(());
                }
            }
            if let Some(m) = self.poll_membership(wanted)?.filter(wanted) {
                // A member may fail while we open the new epoch: then wait for the next one.
                match self.open_epoch(&m) {
                    Ok((view, index)) => {
                        let mut st = self.state.write();
                        if st.0.epoch < view.epoch {
                            tracing::info!(
                                client = self.id,
                                epoch = view.epoch,
                                "membership changed"
                            );
                            *st = (Arc::new(view), Arc::new(index));
                        }
                        return Ok(());
                    }
                    Err(e) if needs_membership(&e) => {
                        tracing::debug!(error = %e, epoch = m.epoch, "cannot open the new epoch yet");
                    }
                    Err(e) => return Err(e),
                }
            }
            let now = std::time::Instant::now();
            if now >= ask_at && self.view().epoch == seen {
                self.ask_resync(
                    seen,
                    format!(
                        "client {} waited {:?} for a membership newer than epoch {seen}",
                        self.id,
                        now - start
                    ),
                );
                ask_at = now + Duration::from_secs(3);
            }
            if now > deadline {
                return Err(Error::Membership(format!(
                    "no membership newer than epoch {seen} within {:?} (is the master running?)",
                    self.cfg.failover_wait
                )));
            }
            // (Under the deterministic scheduler nobody moves while this thread sleeps.)
            let pause = if self.cfg.inline_jobs { 1 } else { 20 };
            std::thread::sleep(Duration::from_millis(pause));
        }
    }

    /// Allocates the object of a write attempt and remembers the attempt in `last` (to settle
    /// it if a membership change cuts it short).
    async fn allocate_attempt(
        &self,
        len: usize,
        delete: bool,
        last: &Mutex<Option<Attempt>>,
    ) -> Result<Allocation> {
        let a = self.allocate(len, delete).await?;
        *last.lock() = Some(Attempt::of(&a, len, self, delete));
        Ok(a)
    }

    /// Whether a write attempt's commit record is there (or its object was since replaced,
    /// freed and reused, which only follows a commit).
    pub(crate) fn attempt_committed(&self, at: &Attempt) -> Result<bool> {
        let view = self.view();
        let ra = view
            .acting(at.addr.node, at.addr.offset)
            .ok_or(Error::Unavailable(at.addr.node))?;
        let b = self.ep.read(tags::COMMIT, ra, at.len)?;
        let Some(h) = object::decode_header(&b) else {
            return Ok(false);
        };
        if h.generation != at.generation {
            // Older: the attempt's object never landed; newer: it was reused since.
            return Ok(h.generation > at.generation);
        }
        let lo = object::log_offset(h.klen, h.vlen);
        if b.len() < lo + object::LOG_LEN {
            return Ok(false);
        }
        Ok(
            object::decode_log(&b[lo..lo + object::LOG_LEN], h.generation, at.addr)
                .is_some_and(|l| l.commit.is_some()),
        )
    }

    /// The view and the index of the current membership epoch, together (an operation uses
    /// one epoch throughout: a verb of another epoch's rkeys is refused, never misdirected).
    pub(crate) fn state(&self) -> (Arc<ClusterView>, Arc<RaceIndex>) {
        let st = self.state.read();
        (st.0.clone(), st.1.clone())
    }

    /// The cluster view of the current membership epoch.
    pub(crate) fn view(&self) -> Arc<ClusterView> {
        self.state.read().0.clone()
    }

    /// The index over the current epoch's serving replicas.
    pub(crate) fn index(&self) -> Arc<RaceIndex> {
        self.state.read().1.clone()
    }

    /// SEARCH through the address cache: the slot word and the object it should point to,
    /// read together (one round trip). `None` when the cache entry is stale.
    async fn cached_search_async(&self, key: &[u8], c: CachedAddr) -> Result<Option<Vec<u8>>> {
        // (A split since the key was cached moved its entry: same bucket and slot, in the
        // subtable the directory now maps it to.)
        let pos = self.index().current_pos(key, c.pos);
        let slot_at = self.index().primary_slot_addr(pos);
        let obj = slot_addr(c.slot);
        let Some(obj_at) = self.view().acting(obj.node, obj.offset) else {
            return Ok(None);
        };
        let (batches, si, oi, same) = if slot_at.node == obj_at.node {
            let mut b = self.ep.batch(obj_at.node);
            let si = b.read(slot_at, 8);
            let oi = b.read(obj_at, c.slot.object_len());
            (vec![b], si, oi, true)
        } else {
            let mut b1 = self.ep.batch(slot_at.node);
            let si = b1.read(slot_at, 8);
            let mut b2 = self.ep.batch(obj_at.node);
            let oi = b2.read(obj_at, c.slot.object_len());
            (vec![b1, b2], si, oi, false)
        };
        let mut res = self.ep.execute_many_async(tags::SEARCH, batches).await;
        let r_obj = if same {
            None
        } else {
            Some(res.pop().expect("two")?)
        };
        let r_slot = res.pop().expect("one")?;
        let word = u64::from_le_bytes(r_slot.read(si).try_into().unwrap_or([0; 8]));
        if Slot::from_raw(word).ok().flatten() != Some(c.slot) {
            return Ok(None);
        }
        let bytes = match &r_obj {
            Some(r) => r.read(oi),
            None => r_slot.read(oi),
        };
        let value = object::decode(bytes, obj)
            .filter(|o| o.key == key && o.generation == c.generation)
            .filter(|o| o.flags & object::FLAG_OUTDATED == 0)
            .map(|o| o.value);
        if value.is_some() && pos != c.pos {
            self.cache.insert(key.to_vec(), CachedAddr { pos, ..c });
        }
        Ok(value)
    }

    /// The generation of the object a raw slot value points to (0 for an empty slot).
    pub(crate) fn generation_of(&self, raw: u64) -> Result<u32> {
        let Some(s) = Slot::from_raw(raw)? else {
            return Ok(0);
        };
        let a = slot_addr(s);
        let Some(at) = self.view().acting(a.node, a.offset) else {
            return Ok(0);
        };
        let h = self.ep.read(tags::COMMIT, at, object::HEADER_LEN)?;
        Ok(object::decode_header(&h).map(|h| h.generation).unwrap_or(0))
    }

    pub(crate) fn cfg(&self) -> &ClientConfig {
        &self.cfg
    }

    fn send(&self, j: Job) -> bool {
        if self.cfg.inline_jobs {
            dmkit_verbs::block_on(self.run_job(j));
            return true;
        }
        // Cleanups, prefetches and reclaims are queued inside an operation: the task gets them
        // when the operation ends (`kick_jobs`), a prefetch or a reclaim at once then. A flush
        // is waited for: wake it now.
        match j {
            Job::Flush(_) => self.jobs.push(j).is_ok(),
            Job::Prefetch(_) | Job::Reclaim => self.jobs.push_soon(j).is_ok(),
            Job::Cleanup(_) => self.jobs.push_deferred(j).is_ok(),
        }
    }

    pub(crate) fn slot_of(&self, key: &[u8], a: &Allocation, len: usize) -> Result<Slot> {
        let ptr = ObjPtr {
            node: a.addr.node,
            offset: a.addr.offset,
            len_class: ObjPtr::len_class_of(len)
                .ok_or(Error::ObjectTooLarge(len, alloc::MAX_OBJECT))?,
        };
        Ok(self.index().slot_for(key, ptr)?)
    }

    fn hooks<'a>(
        &'a self,
        key: &'a [u8],
        a: &'a Allocation,
        bytes: &[u8],
        op: Op,
        v: &'a Verifier<'a>,
    ) -> Hooks<'a> {
        // The operation's epoch: its serving replicas (not the ones of the epoch the object
        // was allocated in — a node may have failed or rejoined since).
        let view = v.locator().0;
        let mut batches: Vec<Batch> = alloc::replicas_of(view, a.addr)
            .iter()
            .filter_map(|r| {
                let region = view.region(r.node)?;
                let mut b = self.ep.batch(r.node);
                b.write_durable(region.at(r.offset), bytes);
                Some(b)
            })
            .collect();
        // UPDATE and DELETE with the key's address cached: read the object it names in the
        // same round trip (FUSEE, Fig. 9: "read the KV pair according to the index cache").
        let mut prefetch = None;
        if matches!(op, Op::Update | Op::Delete) && !self.cache.should_bypass() {
            if let Some(c) = self.cache.get(key) {
                let o = slot_addr(c.slot);
                if let Some(at) = view.acting(o.node, o.offset) {
                    let k = match batches.iter().position(|b| b.node() == at.node) {
                        Some(k) => k,
                        None => {
                            batches.push(self.ep.batch(at.node));
                            batches.len() - 1
                        }
                    };
                    let i = batches[k].read(at, c.slot.object_len());
                    prefetch = Some((c, k, i));
                }
            }
        }
        Hooks {
            inner: self,
            first: Mutex::new(Some(batches)),
            ours: a,
            op,
            verifier: v,
            round: Mutex::new(None),
            swapping: std::sync::atomic::AtomicBool::new(false),
            posted: std::sync::atomic::AtomicBool::new(false),
            prefetch,
            key,
        }
    }

    /// Hooks for an operation whose object is already written (recovery).
    pub(crate) fn hooks_for_redo<'a>(
        &'a self,
        a: &'a Allocation,
        op: Op,
        v: &'a Verifier<'a>,
    ) -> Hooks<'a> {
        Hooks {
            inner: self,
            first: Mutex::new(None),
            ours: a,
            op,
            verifier: v,
            round: Mutex::new(None),
            swapping: std::sync::atomic::AtomicBool::new(false),
            posted: std::sync::atomic::AtomicBool::new(false),
            prefetch: None,
            key: &[],
        }
    }

    /// The commit record's writes, one batch per node: the record on every data replica of
    /// `a`, and the replaced object's outdated flag. The mark goes on *before* the primary
    /// swap, so an object that left the index by replacement always carries it: recovery
    /// tells "completed, then replaced by someone" (marked) from "never swapped in" (not
    /// marked). With whether every one of these writes is durable before the later verbs of
    /// its batch run ([`Endpoint::durable_in_order`]): then a batch of them can carry the
    /// primary CAS too.
    fn commit_batches(
        &self,
        view: &ClusterView,
        a: &Allocation,
        op: Op,
        c: Commit,
    ) -> Result<(Vec<Batch>, bool)> {
        let rec = object::encode_commit(&c, a.generation, op, a.addr);
        let at = a.log_offset + object::COMMIT_OFF as u64;
        let mut ordered = true;
        let mut batches: Vec<Batch> = Vec::new();
        let mut write = |to: dmkit_verbs::RemoteAddr, bytes: &[u8]| {
            ordered &= self.ep.durable_in_order(to);
            let k = match batches.iter().position(|b| b.node() == to.node) {
                Some(k) => k,
                None => {
                    batches.push(self.ep.batch(to.node));
                    batches.len() - 1
                }
            };
            batches[k].write_durable(to, bytes);
        };
        for r in alloc::replicas_of(view, a.addr) {
            if let Some(region) = view.region(r.node) {
                write(region.at(r.offset + at), &rec);
            }
        }
        if let Some(old) = Slot::from_raw(c.old)? {
            let o = slot_addr(old);
            if let Some(flag) = view.acting(o.node, o.offset + object::FLAGS_OFF as u64) {
                // Durable, as the commit record: recovery takes an outdated flag for
                // "swapped in and replaced since" (its replacer frees what it replaced);
                // a power cut must not leave the swap without the flag.
                write(flag, &[object::FLAG_OUTDATED]);
            }
        }
        Ok((batches, ordered))
    }

    /// [`Self::take_back`] once the index decided the attempt in `last` did not take effect
    /// (it lost its round, or found nothing to do). The attempt is marked lost first: if the
    /// take-back is cut short, the operation is retried, never settled as done — a DELETE
    /// that lost the primary swap to another DELETE of the same value has a commit record
    /// too (seed 822). A memory node failing under the take-back is ridden through (the
    /// object's flag is written where its block is served in the next epoch), so the object
    /// is marked reclaimed before the operation reports, and recovery never redoes it.
    async fn take_back_lost(&self, a: &Allocation, last: &Mutex<Option<Attempt>>) -> Result<()> {
        if let Some(at) = last.lock().as_mut() {
            at.lost = true;
        }
        let mut tries = 0;
        loop {
            let seen = self.view().epoch;
            match self.take_back(a).await {
                Err(e) if needs_membership(&e) && tries < 16 => {
                    tries += 1;
                    // (Rare: a membership change. Catching up blocks; off the runtime.)
                    dmkit_verbs::runtime::blocking(|| self.catch_up(&e, seen))?;
                }
                r => return r,
            }
        }
    }

    /// The reclaimed flag of the object at `addr` on every data replica (one round trip).
    pub(crate) fn mark_reclaimed(&self, addr: crate::object::Addr) -> Result<()> {
        dmkit_verbs::block_on(self.mark_reclaimed_async(addr))
    }

    /// [`Inner::mark_reclaimed`], awaited (an operation's own path: no thread blocks on it).
    pub(crate) async fn mark_reclaimed_async(&self, addr: crate::object::Addr) -> Result<()> {
        let mut batches = Vec::new();
        self.mark_replicas(
            &self.view(),
            addr,
            object::FLAGS_OFF as u64,
            object::FLAG_RECLAIMED,
            &mut batches,
        );
        if batches.is_empty() {
            return Err(Error::Unavailable(addr.node));
        }
        for r in self.ep.execute_many_async(tags::RECLAIM, batches).await {
            r?;
        }
        Ok(())
    }

    /// Adds a one-byte write of `byte` at `off` within the object at `addr` on every data
    /// replica that serves its block to `batches` (one batch per node).
    pub(crate) fn mark_replicas(
        &self,
        view: &ClusterView,
        addr: crate::object::Addr,
        off: u64,
        byte: u8,
        batches: &mut Vec<Batch>,
    ) {
        for r in alloc::replicas_of(view, addr) {
            let Some(region) = view.region(r.node) else {
                continue;
            };
            let i = self.ep.batch_for(batches, r.node);
            batches[i].write(region.at(r.offset + off), &[byte]);
        }
    }

    /// Gives back an object that never made it into the index (reclaimed flag first, then the
    /// free list): before the operation returns, so recovery never redoes it.
    ///
    /// The flag goes to every data replica of the object (one round trip): a memory node
    /// failing after the take-back must not lose it, or recovery would find an unfinished
    /// entry and resume a round this writer already reported as lost (seed 4017: a DELETE
    /// that had answered NotFound deleted the key much later, when its client recovered).
    async fn take_back(&self, a: &Allocation) -> Result<()> {
        self.mark_reclaimed_async(a.addr).await?;
        self.free.lock().push(
            a.class,
            alloc::FreeObject {
                addr: a.addr,
                generation: a.generation,
            },
        );
        Ok(())
    }

    /// Queues a won write's cleanup for the background task. When the task is more than
    /// [`MAX_BACKLOG`] jobs behind (it shares a few runtime threads with every client of
    /// the process, and busy callers can outrun it), the caller waits until it has caught up
    /// half way: replaced objects are freed at the pace they are replaced, so memory stays
    /// bounded. (The cleanup is queued first: a caller that stops waiting loses nothing.)
    async fn enqueue_cleanup(&self, a: &Allocation, len: usize, op: Op, old: Option<(Slot, u32)>) {
        let job = Job::Cleanup(crate::mm::CleanupItem {
            ours: a.addr,
            ours_len: len,
            op,
            old: old.map(|(s, _)| s),
            class: a.class,
            generation: a.generation,
        });
        if !self.send(job) {
            tracing::warn!("FUSEE background task gone; cleanup left to recovery");
            return;
        }
        if self.jobs.wait_below(MAX_BACKLOG).await {
            metrics::counter!("dmkit_fusee_cleanup_waits_total").increment(1);
        }
    }

    /// Hands the jobs queued so far to the background task, at the end of an operation: a
    /// prefetch or a reclaim wakes it at once; cleanups (the frees and log marks of won
    /// writes) wake it once [`LAZY_BATCH`] wait, or within [`LAZY_DELAY`] — so a client
    /// running operation after operation pays a wake-up of the task (a system call, and on a
    /// machine with few cores a preemption) once per batch rather than per write, and the
    /// task runs the batch's cleanups in two round trips. [`Client::flush`] wakes it at once.
    fn kick_jobs(&self) {
        self.jobs.kick_lazily(LAZY_BATCH, LAZY_DELAY);
    }

    /// One object for `len` bytes, from the local free lists (fetching a block if empty; a
    /// DELETE's may come from the blocks kept back for deletes).
    async fn allocate(&self, len: usize, delete: bool) -> Result<Allocation> {
        let class = alloc::class_of(len)?;
        let n = self
            .allocs
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            + 1;
        if n % self.cfg.reclaim_every == 0 {
            self.send(Job::Reclaim);
        }
        loop {
            {
                let mut f = self.free.lock();
                // Keep one spare so the next pointer is always known.
                if f.len(class) >= 2 {
                    let mut a = f.pop(&self.view(), class).expect("non-empty");
                    a.log_offset = object::log_offset_for_len(len) as u64;
                    if f.len(class) < self.cfg.prefetch_below {
                        drop(f);
                        self.send(Job::Prefetch(class));
                    }
                    return Ok(a);
                }
            }
            self.acquire_block(class, delete).await?;
        }
    }
}

/// Cleanups taken off the queue together at most (their verbs go out as two round trips).
const CLEANUP_BATCH: usize = 64;

/// Jobs that wake the background task at the end of an operation ([`Inner::kick_jobs`]).
const LAZY_BATCH: usize = 16;

/// How long fewer jobs may wait for the background task ([`Inner::kick_jobs`]): long enough
/// that arming it never wakes the verbs timer thread.
const LAZY_DELAY: std::time::Duration = std::time::Duration::from_millis(40);

/// Cleanups a client's background task may be behind before writers wait for it.
const MAX_BACKLOG: usize = 4 * CLEANUP_BATCH;

/// The background task (one per client, on the I/O runtime): cleanups in order, prefetches,
/// reclaims. Cleanups that queued up while it worked (operations from several tasks, or faster
/// than their cleanups) run together: every free in one round trip, every log entry's finish
/// mark in a second.
async fn worker(inner: std::sync::Weak<Inner>, rx: JobRx) {
    while let Some(jobs) = rx.take(usize::MAX).await {
        let Some(inner) = inner.upgrade() else { return };
        let mut jobs = jobs.into_iter().peekable();
        // Each job reported done as it finishes (writers held back by the backlog look again).
        while let Some(job) = jobs.next() {
            if !matches!(job, Job::Cleanup(_)) {
                inner.run_job(job).await;
                rx.done(1);
                continue;
            }
            let mut batch = vec![job];
            while batch.len() < CLEANUP_BATCH {
                match jobs.next_if(|j| matches!(j, Job::Cleanup(_))) {
                    Some(j) => batch.push(j),
                    None => break,
                }
            }
            let k = batch.len();
            if k == 1 {
                inner.run_job(batch.pop().expect("one")).await;
            } else {
                inner.run_cleanups(batch).await;
            }
            rx.done(k);
        }
    }
}

impl Inner {
    /// Runs several cleanups together (see [`worker`]). Like a single one, a batch cut short
    /// is not retried: a free may have landed, and a second would free a neighbour.
    async fn run_cleanups(&self, jobs: Vec<Job>) {
        let items: Vec<_> = jobs
            .into_iter()
            .filter_map(|j| match j {
                Job::Cleanup(it) => Some(it),
                _ => None,
            })
            .collect();
        if let Err(e) = self.cleanup_many(&items).await {
            tracing::warn!(client = self.id, error = %e, cleanups = items.len(), "FUSEE background cleanups failed");
        }
    }

    /// Runs one background job (on the background task, or inline with `inline_jobs`).
    async fn run_job(&self, job: Job) {
        let seen = self.view().epoch;
        let r = match self.run_job_once(&job).await {
            // A membership change cut the job short: once more in the next epoch. Not a
            // cleanup: its free (an FAA) may have landed, and a second one would free a
            // neighbour; a cut-short cleanup leaks the replaced object instead.
            Err(e)
                if needs_membership(&e)
                    && !matches!(job, Job::Cleanup(_))
                    && dmkit_verbs::runtime::blocking(|| self.refresh(seen)).is_ok() =>
            {
                self.run_job_once(&job).await
            }
            r => r,
        };
        if let Err(e) = r {
            tracing::warn!(client = self.id, error = %e, "FUSEE background job failed");
        }
    }

    async fn run_job_once(&self, job: &Job) -> Result<()> {
        match job {
            Job::Cleanup(it) => self.cleanup_many(std::slice::from_ref(it)).await,
            Job::Prefetch(class) => {
                let low = self.free.lock().len(*class) < self.cfg.prefetch_below;
                if low {
                    self.acquire_block(*class, false).await
                } else {
                    Ok(())
                }
            }
            Job::Reclaim => self.reclaim().await.map(drop),
            Job::Flush(tx) => {
                let _ = tx.send(Ok(()));
                Ok(())
            }
        }
    }
}
