//! The Gengar client: a global address space over many servers, with leases on cached
//! addresses, write-through, proxied writes with write confirms, and locks.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use dmkit_cache::{AccessReporter, CounterConfig};
use dmkit_lease::{CachedLease, Clock, HeldLocks, LeaseCache, LeaseSource, LockSource, Timestamp};
use dmkit_pmem_pool::verbs::ObjectRead;
use dmkit_verbs::wire::{Reader, Wire};
use dmkit_verbs::{
    Backoff, Connection, Endpoint, NodeId, NodeViews, ProxiedWrite, ProxiedWriter, ReconnectError,
    RegionDesc, Tag, View, ViewError, WriteParts,
};

use crate::addr::GlobalAddr;
use crate::error::{Error, Result};
use crate::proto::{self, Allocated, LeaseGrant, Location, ReplyHead, Request, Status};
use crate::server::{DRAM_REGION, NVM_REGION};

/// Operation tags (for `Endpoint::stats`): each counts the round trips of the whole call,
/// lease RPC included, so `round_trips` per READ is 1 with a valid lease and 2 without.
pub mod tags {
    pub const READ: &str = "gengar_read";
    pub const WRITE: &str = "gengar_write";
    pub const ALLOC: &str = "gengar_alloc";
    pub const FREE: &str = "gengar_free";
    pub const LOCK: &str = "gengar_lock";
    pub const REPORT: &str = "gengar_report";
    /// Leases renewed before they lapse, off the callers' path
    /// ([`ClientConfig::renew_early`](super::ClientConfig::renew_early)).
    pub const RENEW: &str = "gengar_renew";
}

/// Settings of a Gengar client.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// Accesses between two hot-object reports to the servers.
    pub report_every: u64,
    /// The lease skew allowance (must match the servers').
    pub lease_skew: Duration,
    /// How long `lock` keeps trying before it gives up.
    pub lock_timeout: Duration,
    /// Access counting (sketch error bound, top-k reported per window).
    pub counter: CounterConfig,
    /// How often a request the server answered "busy" (a fenced lease) is retried.
    pub busy_retry: Duration,
    /// Post proxied writes from the client's proxy thread (Gengar's write proxy): the
    /// writer returns once its data is copied and queued, whatever posting costs on the
    /// backend — on a software NIC (SoftRoCE) the doorbell itself executes the write. Off,
    /// the writer posts itself and returns once posted (the sim backend's modeled time
    /// assumes that: its latency model charges a post, not a thread hand-over).
    pub proxy_thread: bool,
    /// Renew a lease once half of it has passed, off the caller's path: the access that
    /// finds it past half posts the renewal and goes on with the lease it holds; a later
    /// access installs the new one. An object accessed steadily then never waits for a lease
    /// RPC — which matters where RPCs queue behind other work at the server (persists on
    /// rdma). Off, a lease is renewed when it has lapsed, by the access that needs it.
    pub renew_early: bool,
}

impl Default for ClientConfig {
    fn default() -> Self {
        Self {
            report_every: 2048,
            lease_skew: dmkit_lease::LeaseConfig::default().skew,
            lock_timeout: Duration::from_secs(5),
            counter: CounterConfig::default(),
            busy_retry: Duration::from_micros(200),
            proxy_thread: true,
            renew_early: true,
        }
    }
}

/// How a client makes a new connection to a Gengar server that restarted (or whose
/// connection broke): the process that knows the servers' addresses supplies it
/// ([`GengarClient::set_reconnect`]).
pub type Reconnect = dmkit_verbs::Reconnect;

/// A server's regions as this client knows them, in the [`View`] of the connection they
/// came from. Leases carry the epoch they were granted in: a lease of an earlier connection —
/// granted by a server process that may since have restarted with an empty DRAM buffer — is
/// never used.
#[derive(Debug, Clone, Copy)]
struct Regions {
    nvm: RegionDesc,
    dram: RegionDesc,
}

/// A lease this client holds: what the grant said (the object's size and where its current
/// copy is), in the epoch of the server connection it was granted by.
type Entry = CachedLease<LeaseGrant>;

/// A write confirm of Gengar: fires when every copy (DRAM and NVM) of the write completed.
#[derive(Debug, Clone)]
pub struct Confirm(ProxiedWrite);

impl Confirm {
    /// Whether every part of the write has completed (or failed).
    pub fn is_confirmed(&self) -> bool {
        self.0.is_confirmed()
    }

    dmkit_verbs::blocking_facade! {
        /// Waits for every part; the first failure ([`Error::ServerDown`] when the server went
        /// away before confirming: the write may or may not have landed).
        pub fn wait(&self) -> Result<()> = confirmed;
    }

    /// [`Confirm::wait`], awaited.
    pub async fn confirmed(&self) -> Result<()> {
        self.0.confirmed().await.map_err(node_error)
    }
}

/// A Gengar client. Share it (in an `Arc`) between threads or tasks: every operation has an
/// `_async` form, and many may be in flight at once; the blocking forms wait for theirs.
///
/// **A server that goes away** (killed, restarted, its connection lost) fails the operations
/// on *its* objects with [`Error::ServerDown`]; the other servers' objects are not affected
/// (allocation skips it). With [`GengarClient::set_reconnect`], the next operation on that
/// server connects again once it is back (and drops every lease of the old connection:
/// a restarted server starts with an empty DRAM buffer and lease table). Writes that were
/// confirmed before it went away are in its pool (durable NVM writes) and read back.
pub struct GengarClient {
    ep: Endpoint,
    id: u64,
    cfg: ClientConfig,
    clock: Arc<dyn Clock>,
    /// Each server's free NVM bytes as its last reply said (for placement; the replies'
    /// free DRAM bytes are not used by clients).
    free_nvm: BTreeMap<NodeId, AtomicU64>,
    /// The servers' regions by connection epoch; reconnects lost servers.
    views: NodeViews<Regions>,
    /// The leases this client holds, renewed early ([`ClientConfig::renew_early`]).
    leases: LeaseCache<GlobalAddr, LeaseGrant, dmkit_verbs::Pending<Vec<u8>>>,
    /// Proxied writes, posted by Gengar's write proxy ([`ClientConfig::proxy_thread`]) or by
    /// the caller, and outstanding ones per object, oldest first.
    writes: ProxiedWriter<GlobalAddr>,
    /// Reads counted per server, reported every `report_every`.
    accesses: AccessReporter<NodeId>,
    /// Application locks are the client's (its id holds them at the server): among the
    /// threads and tasks sharing the client, the one holding the object's local lock is the
    /// holder.
    locks: HeldLocks<GlobalAddr>,
}

/// A verbs error as the client reports it: a lost server is [`Error::ServerDown`].
fn node_error(e: dmkit_verbs::Error) -> Error {
    match e.node() {
        Some(node) if e.is_node_failure() => Error::ServerDown {
            node: node.0,
            reason: e.to_string(),
        },
        _ => Error::Verbs(e),
    }
}

/// The NVM pool and DRAM buffer regions of a Gengar server's region table.
fn gengar_regions(node: NodeId, regions: &[RegionDesc]) -> Result<Regions> {
    let find = |name| regions.iter().find(|r| r.name.as_str() == name).copied();
    match (find(NVM_REGION), find(DRAM_REGION)) {
        (Some(nvm), Some(dram)) => Ok(Regions { nvm, dram }),
        _ => Err(Error::NotAServer {
            node: node.0,
            reason: "it has no NVM pool and DRAM buffer regions".into(),
        }),
    }
}

impl std::fmt::Debug for GengarClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GengarClient")
            .field("id", &self.id)
            .field("servers", &self.views)
            .finish_non_exhaustive()
    }
}

/// A server's refusal (a reply with a status that is no answer), with its message.
fn refused(node: NodeId, rest: &[u8]) -> Error {
    let reason = Reader::new(rest).get::<String>();
    let reason = reason.unwrap_or_else(|_| format!("server {node} refused"));
    Error::Server {
        node: node.0,
        reason,
    }
}

/// A reply from `node` that does not decode.
fn protocol_error(node: NodeId) -> impl Fn(dmkit_verbs::wire::WireError) -> Error {
    move |e| Error::Protocol {
        node: node.0,
        reason: e.to_string(),
    }
}

impl GengarClient {
    /// A client `id` (unique among clients: it holds leases and locks) over every Gengar
    /// server `ep` is connected to.
    pub fn new(ep: Endpoint, id: u64, cfg: ClientConfig, clock: Arc<dyn Clock>) -> Result<Self> {
        let views = NodeViews::new(&ep, gengar_regions)?;
        let free_nvm: BTreeMap<_, _> = views.nodes().map(|n| (n, AtomicU64::new(0))).collect();
        if free_nvm.is_empty() {
            return Err(Error::Setup("no Gengar servers to use".into()));
        }
        let writes = ProxiedWriter::start(&ep, tags::WRITE, cfg.proxy_thread);
        let writes =
            writes.map_err(|e| Error::Setup(format!("cannot start the write proxy: {e}")))?;
        let leases = LeaseCache::new(cfg.lease_skew, cfg.renew_early);
        let accesses = AccessReporter::new(free_nvm.keys().copied(), cfg.counter, cfg.report_every);
        let accesses = accesses.map_err(|e| Error::Setup(e.to_string()))?;
        let c = GengarClient {
            ep,
            id,
            cfg,
            clock,
            free_nvm,
            views,
            leases,
            writes,
            accesses,
            locks: HeldLocks::default(),
        };
        for node in c.views.nodes().collect::<Vec<_>>() {
            dmkit_verbs::block_on(c.call(tags::ALLOC, node, Request::Stat))?;
        }
        Ok(c)
    }

    /// The endpoint (its `stats()` hold the per-operation round trips).
    pub fn endpoint(&self) -> &Endpoint {
        &self.ep
    }

    pub fn id(&self) -> u64 {
        self.id
    }

    /// Sets how this client reconnects to a server whose connection was lost (a restarted
    /// server, a broken link). Without one, such a server's objects fail with
    /// [`Error::ServerDown`] for good.
    pub fn set_reconnect(&self, reconnect: Reconnect) {
        self.views.set_reconnect(reconnect);
    }

    /// The server's current regions (and their epoch), its connection made sure of first:
    /// when it is known to be broken, connects again (with the reconnect function) or fails
    /// with [`Error::ServerDown`].
    fn regions(&self, node: NodeId) -> Result<View<Regions>> {
        let accept = |conn: &Arc<dyn Connection>| gengar_regions(node, &conn.regions());
        let r = self.views.ensure(&self.ep, node, accept);
        if !matches!(r, Ok((_, false)) | Err(ViewError::UnknownNode(_))) {
            // Leases of the old connection (also those taken while this ran) are void.
            self.forget_server(node);
        }
        match r {
            Ok((view, fresh)) => {
                if fresh {
                    metrics::counter!("dmkit_gengar_reconnects_total").increment(1);
                    tracing::info!(server = %node, "reconnected to Gengar server");
                }
                Ok(view)
            }
            Err(ViewError::UnknownNode(_)) => Err(Error::UnknownServer(node.0)),
            Err(ViewError::Lost(ReconnectError::Refused(e))) => Err(e),
            Err(e) => Err(Error::ServerDown {
                node: node.0,
                reason: e.to_string(),
            }),
        }
    }

    /// Drops every lease this client holds on `node`'s objects.
    fn forget_server(&self, node: NodeId) {
        self.leases.retain(|a| a.server != node);
    }

    /// A verbs error of an operation on `node`: a lost server drops its leases and is
    /// reported as [`Error::ServerDown`].
    fn verbs_error(&self, node: NodeId, e: dmkit_verbs::Error) -> Error {
        if e.is_node_failure() {
            self.forget_server(node);
        }
        node_error(e)
    }

    /// One RPC; returns the status and the rest of the reply, after noting free capacity.
    async fn call(&self, t: Tag, node: NodeId, req: Request) -> Result<(Status, Vec<u8>)> {
        self.regions(node)?;
        let reply = self
            .ep
            .rpc_async(t, node, &req.to_bytes())
            .await
            .map_err(|e| self.verbs_error(node, e))?;
        self.reply_head(node, &reply)
    }

    /// The status and the rest of a reply from `node`, after noting its free capacity.
    fn reply_head(&self, node: NodeId, reply: &[u8]) -> Result<(Status, Vec<u8>)> {
        let free_nvm = self
            .free_nvm
            .get(&node)
            .ok_or(Error::UnknownServer(node.0))?;
        let mut r = Reader::new(reply);
        let head: ReplyHead = r.get().map_err(protocol_error(node))?;
        free_nvm.store(head.free_nvm, Ordering::Relaxed);
        Ok((head.status, r.rest().to_vec()))
    }

    /// Free NVM bytes per server, as last reported.
    pub fn free_nvm(&self) -> Vec<(NodeId, u64)> {
        self.free_nvm
            .iter()
            .map(|(n, free)| (*n, free.load(Ordering::Relaxed)))
            .collect()
    }

    dmkit_verbs::blocking_facade! {
        /// Allocates an object of `size` bytes (zero-filled) on the server with the most free NVM.
        pub fn alloc(&self, size: usize) -> Result<GlobalAddr> = alloc_async;
        /// Frees an object. The server waits until every lease on it expired, so no client reads it
        /// through a cached address afterwards; reads through stale addresses fail with
        /// [`Error::Freed`].
        pub fn free(&self, addr: GlobalAddr) -> Result<()> = free_async;
        /// Sends each server this client's hot objects of the window that just ended.
        pub fn report_hot(&self) -> Result<()> = report_hot_async;
        /// Reads `len` bytes at `at` inside the object.
        pub fn read_at(&self, addr: GlobalAddr, at: usize, len: usize) -> Result<Vec<u8>>
            = read_at_async;
        /// Writes `data` at `at` inside the object and returns when every copy is updated (NVM
        /// durably): one round trip with a valid lease, two without.
        pub fn write(&self, addr: GlobalAddr, at: usize, data: &[u8]) -> Result<()> = write_async;
        /// Proxied write: returns once the data is staged and posted; the confirm fires when the
        /// server completed every copy. Staging is bounded (the endpoint's), so a fast writer waits
        /// rather than growing memory.
        pub fn write_proxied(&self, addr: GlobalAddr, at: usize, data: &[u8]) -> Result<Confirm>
            = write_proxied_async;
        /// Waits until every proxied write so far is confirmed.
        pub fn flush(&self) -> Result<()> = flush_async;
        /// Takes the application lock of a shared object, waiting (up to the lock timeout) while
        /// another client — or another thread or task of this client — holds it.
        pub fn lock(&self, addr: GlobalAddr) -> Result<()> = lock_async;
        /// Releases the lock, after every proxied write this client made to the object is confirmed
        /// — so the next holder sees them.
        pub fn unlock(&self, addr: GlobalAddr) -> Result<()> = unlock_async;
    }

    /// [`GengarClient::alloc`], awaited.
    pub async fn alloc_async(&self, size: usize) -> Result<GlobalAddr> {
        let size32 = u32::try_from(size).map_err(|_| Error::OutOfSpace { size })?;
        let mut order: Vec<_> = self.free_nvm();
        order.sort_by_key(|(n, f)| (std::cmp::Reverse(*f), *n));
        let mut down = None;
        for (node, _) in order {
            let (st, rest) = match self
                .call(tags::ALLOC, node, Request::Alloc { size: size32 })
                .await
            {
                Ok(r) => r,
                // Place the object on another server.
                Err(e @ Error::ServerDown { .. }) => {
                    down = Some(e);
                    continue;
                }
                Err(e) => return Err(e),
            };
            match st {
                Status::Ok => {
                    let a = Allocated::get(&mut Reader::new(&rest));
                    let a = a.map_err(protocol_error(node))?;
                    metrics::counter!("dmkit_gengar_allocs_total").increment(1);
                    return Ok(GlobalAddr {
                        server: node,
                        offset: a.offset,
                        generation: a.generation,
                        size: size32,
                    });
                }
                Status::OutOfSpace => continue,
                _ => return Err(refused(node, &rest)),
            }
        }
        // No server had room: say so, unless one that might have had it is down.
        Err(down.unwrap_or(Error::OutOfSpace { size }))
    }

    /// [`GengarClient::free`], awaited.
    pub async fn free_async(&self, addr: GlobalAddr) -> Result<()> {
        self.writes.confirmed(&addr).await.map_err(node_error)?;
        let (st, rest) = self
            .call(
                tags::FREE,
                addr.server,
                Request::Free {
                    offset: addr.offset,
                    generation: addr.generation,
                },
            )
            .await?;
        self.leases.remove(&addr);
        match st {
            Status::Ok => Ok(()),
            Status::Freed => Err(Error::Freed(addr)),
            _ => Err(refused(addr.server, &rest)),
        }
    }

    /// A valid lease for `addr`, from the table or (one more round trip, counted under `t`)
    /// from its server.
    async fn entry(&self, t: Tag, addr: GlobalAddr) -> Result<Entry> {
        self.leases.acquire(&LeaseRpc(self, t), &addr).await
    }

    fn lease_request(&self, addr: GlobalAddr) -> Request {
        Request::Lease {
            holder: self.id,
            offset: addr.offset,
            generation: addr.generation,
        }
    }

    async fn record_access(&self, addr: GlobalAddr) -> Result<()> {
        if self.accesses.record(&addr.server, addr.offset) {
            self.prune_leases();
            self.report_hot_async().await?;
        }
        Ok(())
    }

    /// Forgets the leases that lapsed (once a window): a client that touched many objects
    /// once would otherwise keep an entry for each forever.
    fn prune_leases(&self) {
        self.leases.prune(self.clock.now());
    }

    /// Lease entries this client holds (valid or lapsed since the last window).
    pub fn lease_entries(&self) -> usize {
        self.leases.len()
    }

    /// [`GengarClient::report_hot`], awaited.
    pub async fn report_hot_async(&self) -> Result<()> {
        for (node, rep) in self.accesses.end_window(self.id) {
            match self
                .call(
                    tags::REPORT,
                    node,
                    Request::Report {
                        report: proto::Report(rep),
                    },
                )
                .await
            {
                Ok(_) => {}
                // A lost server's window is lost with it; the others still get theirs.
                Err(Error::ServerDown { node, reason }) => {
                    tracing::debug!(server = node, %reason, "hot-object report not delivered");
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Reads the whole object: one round trip with a valid lease, two without.
    pub fn read(&self, addr: GlobalAddr) -> Result<Vec<u8>> {
        self.read_at(addr, 0, addr.size as usize)
    }

    /// [`GengarClient::read`], awaited.
    pub async fn read_async(&self, addr: GlobalAddr) -> Result<Vec<u8>> {
        self.read_at_async(addr, 0, addr.size as usize).await
    }

    /// [`GengarClient::read_at`], awaited.
    pub async fn read_at_async(&self, addr: GlobalAddr, at: usize, len: usize) -> Result<Vec<u8>> {
        // Reads see this client's own proxied writes.
        self.writes.posted(&addr).await;
        for _ in 0..8 {
            let (e, s) = self.leased(tags::READ, addr, at, len).await?;
            // The header word before and after the data, in one batch: a freed or reused
            // slot (another generation) is never returned as the object.
            let (payload, want_gen) = match e.value.location {
                Location::Nvm => (s.nvm.at(addr.offset), addr.generation),
                Location::Dram { offset, generation } => (s.dram.at(offset), generation),
            };
            let mut b = self.ep.batch(addr.server);
            let read = ObjectRead::post(&mut b, payload, at, len);
            let res = match self.ep.execute_async(tags::READ, b).await {
                Ok(r) => r,
                Err(dmkit_verbs::Error::RemoteAccess { .. }) if self.replaced(addr, &e) => continue,
                Err(err) => return Err(self.verbs_error(addr.server, err)),
            };
            if let Some(data) = read.data(&res, want_gen) {
                let data = data.to_vec();
                self.record_access(addr).await?;
                return Ok(data);
            }
            // The lease was stale (it should not be: count it) — refresh and retry.
            self.leases.remove(&addr);
            metrics::counter!("dmkit_gengar_stale_reads_total").increment(1);
            if e.value.location == Location::Nvm {
                return Err(Error::Freed(addr));
            }
        }
        Err(Error::Freed(addr))
    }

    /// The regions to use with lease `e`, or `None` when its server's connection was replaced
    /// since the lease was granted (the lease is dropped: take a new one).
    fn current(&self, addr: GlobalAddr, e: &Entry) -> Result<Option<Regions>> {
        let r = self.regions(addr.server)?;
        Ok((!self.leases.outdated(&addr, e, r.epoch)).then_some(r.value))
    }

    /// After a remote access error: whether the lease `e` came from a connection that has
    /// been replaced meanwhile (its rkeys are the old server's: take a new lease and retry).
    fn replaced(&self, addr: GlobalAddr, e: &Entry) -> bool {
        let now = self.views.epoch(addr.server).unwrap_or(e.epoch);
        self.leases.outdated(&addr, e, now)
    }

    /// A valid lease for `addr` (taken under `t`) and its server's regions, from a connection
    /// still current; fails when `len` bytes at `at` are not inside the object.
    async fn leased(
        &self,
        t: Tag,
        addr: GlobalAddr,
        at: usize,
        len: usize,
    ) -> Result<(Entry, Regions)> {
        for _ in 0..8 {
            let e = self.entry(t, addr).await?;
            check_range(addr, at, len, e.value.size)?;
            if let Some(s) = self.current(addr, &e)? {
                return Ok((e, s));
            }
        }
        Err(Error::ServerDown {
            node: addr.server.0,
            reason: "its connection keeps being replaced".into(),
        })
    }

    /// The lease of `addr` and where to write, from a connection still current.
    async fn write_target(
        &self,
        addr: GlobalAddr,
        at: usize,
        data: &[u8],
    ) -> Result<(Entry, WriteParts)> {
        let (e, s) = self.leased(tags::WRITE, addr, at, data.len()).await?;
        // Write-through: the DRAM copy (if cached) and always the NVM copy, durably.
        let mut parts = Vec::with_capacity(2);
        if let Location::Dram { offset, .. } = e.value.location {
            parts.push((s.dram.at(offset + at as u64), false));
        }
        parts.push((s.nvm.at(addr.offset + at as u64), true));
        Ok((e, parts))
    }

    /// [`GengarClient::write`], awaited.
    pub async fn write_async(&self, addr: GlobalAddr, at: usize, data: &[u8]) -> Result<()> {
        // After this client's earlier proxied writes to the object, never before.
        self.writes.posted(&addr).await;
        let (e, parts) = self.write_target(addr, at, data).await?;
        let mut b = self.ep.batch(addr.server);
        b.write_parts(&parts, data);
        match self.ep.execute_async(tags::WRITE, b).await {
            Ok(_) => Ok(()),
            // The old server's rkeys on a new connection: nothing was written; once more.
            Err(dmkit_verbs::Error::RemoteAccess { .. }) if self.replaced(addr, &e) => {
                Box::pin(self.write_async(addr, at, data)).await
            }
            Err(err) => Err(self.verbs_error(addr.server, err)),
        }
    }

    /// [`GengarClient::write_proxied`], awaited: waiting for staging room is awaited too.
    pub async fn write_proxied_async(
        &self,
        addr: GlobalAddr,
        at: usize,
        data: &[u8],
    ) -> Result<Confirm> {
        let (_, parts) = self.write_target(addr, at, data).await?;
        // Bounded: past the staging capacity queued, waits for the proxy to catch up.
        let done = self.writes.write(addr, parts, data).await;
        Ok(Confirm(done.map_err(|e| self.verbs_error(addr.server, e))?))
    }

    /// [`GengarClient::flush`], awaited.
    pub async fn flush_async(&self) -> Result<()> {
        self.writes.flush().await.map_err(node_error)
    }

    /// [`GengarClient::lock`], awaited (the waits between tries are awaited too).
    pub async fn lock_async(&self, addr: GlobalAddr) -> Result<()> {
        self.locks.lock(&LockRpc(self), addr).await
    }

    /// [`GengarClient::unlock`], awaited.
    pub async fn unlock_async(&self, addr: GlobalAddr) -> Result<()> {
        self.locks.unlock(&LockRpc(self), addr).await
    }

    /// Whether this client holds a valid lease on `addr` (the next access is one round trip).
    pub fn has_lease(&self, addr: GlobalAddr) -> bool {
        let Some(epoch) = self.views.epoch(addr.server) else {
            return false;
        };
        self.leases.valid(&addr, epoch, self.clock.now()).is_some()
    }

    /// Whether this client's lease on `addr` points at a DRAM copy.
    pub fn cached_in_dram(&self, addr: GlobalAddr) -> bool {
        self.leases
            .get(&addr)
            .is_some_and(|e| matches!(e.value.location, Location::Dram { .. }))
    }
}

fn check_range(addr: GlobalAddr, at: usize, len: usize, size: u32) -> Result<()> {
    if at.checked_add(len).is_none_or(|end| end > size as usize) {
        return Err(Error::OutOfObject {
            addr,
            at,
            len,
            size: size as usize,
        });
    }
    Ok(())
}

/// How the client asks its servers for leases (the LEASE RPC, counted under the operation's
/// tag), for [`LeaseCache::acquire`].
struct LeaseRpc<'a>(&'a GengarClient, Tag);

impl LeaseSource<GlobalAddr> for LeaseRpc<'_> {
    type Value = LeaseGrant;
    type Error = Error;
    type Renewal = dmkit_verbs::Pending<Vec<u8>>;

    fn epoch(&self, addr: &GlobalAddr) -> Result<u64> {
        Ok(self.0.regions(addr.server)?.epoch)
    }

    fn known_epoch(&self, addr: &GlobalAddr) -> Option<u64> {
        self.0.views.epoch(addr.server)
    }

    fn now(&self) -> Timestamp {
        self.0.clock.now()
    }

    fn post_renewal(&self, addr: &GlobalAddr) -> Option<Self::Renewal> {
        let req = self.0.lease_request(*addr).to_bytes();
        self.0.ep.post_rpc(tags::RENEW, addr.server, &req).ok()
    }

    fn renewal_grant(
        &self,
        addr: &GlobalAddr,
        reply: dmkit_verbs::Result<Vec<u8>>,
    ) -> Option<(LeaseGrant, Duration)> {
        let (Status::Ok, rest) = self.0.reply_head(addr.server, &reply.ok()?).ok()? else {
            return None;
        };
        grant(addr.server, &rest).ok()
    }

    /// The LEASE RPC, retried while the object is fenced (the server promotes, evicts or
    /// frees it).
    async fn request(&self, addr: &GlobalAddr) -> Result<(LeaseGrant, Duration)> {
        let (c, addr) = (self.0, *addr);
        let retry = c.cfg.busy_retry;
        let mut busy = Backoff::new(retry, retry, Instant::now() + c.cfg.lock_timeout);
        loop {
            let (st, rest) = c.call(self.1, addr.server, c.lease_request(addr)).await?;
            match st {
                Status::Ok => return grant(addr.server, &rest),
                Status::Freed => {
                    c.leases.remove(&addr);
                    return Err(Error::Freed(addr));
                }
                Status::Busy if busy.wait().await => {}
                _ => return Err(refused(addr.server, &rest)),
            }
        }
    }
}

/// A grant (a LEASE reply's rest) from `node`: what it says and for how long.
fn grant(node: NodeId, rest: &[u8]) -> Result<(LeaseGrant, Duration)> {
    let g = LeaseGrant::get(&mut Reader::new(rest)).map_err(protocol_error(node))?;
    Ok((g, Duration::from_nanos(g.duration_ns)))
}

/// How the client takes and releases its servers' object locks (LOCK and UNLOCK, for its
/// id), for [`HeldLocks`].
struct LockRpc<'a>(&'a GengarClient);

impl LockSource<GlobalAddr> for LockRpc<'_> {
    type Error = Error;
    type Pace = Backoff;

    /// From 50 µs, doubling up to 5 ms, until the lock timeout.
    fn pace(&self) -> Backoff {
        let deadline = Instant::now() + self.0.cfg.lock_timeout;
        Backoff::new(
            Duration::from_micros(50),
            Duration::from_millis(5),
            deadline,
        )
    }

    async fn pause(&self, pace: &mut Backoff) -> bool {
        pace.wait().await
    }

    fn timed_out(&self, addr: &GlobalAddr) -> Error {
        Error::LockTimeout(*addr)
    }

    async fn try_lock(&self, addr: &GlobalAddr) -> Result<bool> {
        let (holder, offset) = (self.0.id, addr.offset);
        match self
            .0
            .call(tags::LOCK, addr.server, Request::Lock { holder, offset })
            .await?
        {
            (Status::Ok, _) => Ok(true),
            (Status::Busy, _) => Ok(false),
            (_, rest) => Err(refused(addr.server, &rest)),
        }
    }

    /// After every proxied write this client made to the object is confirmed.
    async fn unlock(&self, addr: &GlobalAddr) -> Result<()> {
        let c = self.0;
        c.writes.confirmed(addr).await.map_err(node_error)?;
        let (holder, offset) = (c.id, addr.offset);
        match c
            .call(tags::LOCK, addr.server, Request::Unlock { holder, offset })
            .await?
        {
            (Status::Ok, _) => Ok(()),
            (Status::NotHolder, _) => Err(Error::NotLockHolder(*addr)),
            (_, rest) => Err(refused(addr.server, &rest)),
        }
    }
}
