//! The FUSEE memory node: a pool's data area registered for one-sided access, and the one
//! thing its CPU does — hand out coarse blocks by RPC, recording each block's owner in the
//! pool's persistent block table (so a crashed client's blocks can be found again).
//!
//! Block striping: with `N` memory nodes, block `b`'s primary is node position `b mod N` and
//! its data replicas are the next positions around the ring; the replicas hold the *same block
//! id*. A primary only hands out blocks of its own stripe, so mirroring a block at the same id
//! on the replicas never collides.

use std::sync::Arc;

use dmkit_lease::{ExclusiveLeases, ServingLease, SystemClock};
use dmkit_pmem_pool::Pool;
use dmkit_pmem_pool::remote::{self, BlockRequest, ServeOptions};
use dmkit_verbs::wire::{Reader, Wire, WireError, Writer};
use dmkit_verbs::{Access, FnBacking, MemoryNode, NodeId, Peer, RegionDesc};

use crate::error::{Error, Result};
use crate::membership::Membership;

/// The remote base of the pool's data area on every FUSEE memory node.
pub const POOL_BASE: u64 = 1 << 44;
/// The name of the pool's region (clients find it by it).
pub const POOL_REGION: &str = "fusee.pool";

pub(crate) mod tag {
    // (1–6, 10 and 11 are the pool's block service: `dmkit_pmem_pool::remote::tag`.)
    pub const MEMBERSHIP_GET: u8 = 7;
    pub const MEMBERSHIP_SET: u8 = 8;
    pub const REKEY: u8 = 9;
    pub const SET_FENCED: u8 = 12;
    pub const HEARTBEAT: u8 = 13;
    pub const VOUCH: u8 = 14;
    pub const CLAIM_DELETE: u8 = 15;
    pub const MASTER_CLAIM: u8 = 16;
    /// A master's request carrying its claim token (see [`super::as_master`]).
    pub const AS_MASTER: u8 = 17;
    pub const RESYNC: u8 = 18;
}

dmkit_verbs::wire_message! {
    /// FUSEE's own requests to a memory node, beside the pool's block service
    /// ([`BlockRequest`]); each variant's tag is its constant in `tag`.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub(crate) enum Request: "request kind" {
        /// The node's membership record, and whether it is fenced.
        MembershipGet = 7,
        /// A membership record ([`Membership::encode`]) from the master.
        MembershipSet = 8 { record: Vec<u8> },
        /// A fresh rkey for the pool region (the master's fence).
        Rekey = 9,
        /// Fences the node (non-zero) or lifts its fence.
        SetFenced = 12 { fenced: u8 },
        /// The master's heartbeat: renews the node's lease and names the members' addresses;
        /// answered as [`Request::MembershipGet`].
        Heartbeat = 13 { lease_ms: u32, peers: Peers },
        /// Whether the node vouches for member `who` in `epoch` (a peer's lease renewal).
        Vouch = 14 { who: NodeId, epoch: u64 },
        /// Claims the completed DELETE round (epoch, slot offset, value replaced) for `client`.
        ClaimDelete = 15 { epoch: u64, offset: u64, replaced: u64, client: u64 },
        /// A master claims the cluster (see [`claim_master`]).
        MasterClaim = 16 { token: u64, lease_ms: u32, who: Vec<u8> },
        /// `inner`, sent by the master holding the claim `token` (see [`as_master`]).
        AsMaster = 17 { token: u64, inner: Vec<u8> },
        /// A client asks the master, through the members' heartbeat answers, to fence and
        /// repair the cluster in `epoch` (a round or a verb nobody can finish otherwise:
        /// see [`crate::failover::Master::run`]); `why` is for the master's log.
        Resync = 18 { epoch: u64, why: Vec<u8> },
    }
}

/// The members' addresses a heartbeat carries: a `u16` count, then each node and address.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Peers(pub Vec<(NodeId, String)>);

impl Wire for Peers {
    fn put(&self, w: Writer) -> Writer {
        let w = w.u16(self.0.len() as u16);
        self.0
            .iter()
            .fold(w, |w, (n, a)| w.u16(n.0).bytes(a.as_bytes()))
    }

    fn get(r: &mut Reader<'_>) -> std::result::Result<Self, WireError> {
        let n = r.u16()?;
        let mut peers = Vec::with_capacity(usize::from(n));
        for _ in 0..n {
            let id = NodeId(r.u16()?);
            peers.push((id, String::from_utf8_lossy(r.bytes()?).into_owned()));
        }
        Ok(Peers(peers))
    }
}

/// The `kind` label of a FUSEE RPC's latency.
fn rpc_kind(tag: Option<u8>) -> &'static str {
    match tag {
        Some(remote::tag::ALLOC_STRIPE) => "alloc_stripe",
        Some(remote::tag::ALLOC_AT) => "alloc_at",
        Some(remote::tag::FREE_BLOCK) => "free_block",
        Some(remote::tag::BLOCKS_OF) => "blocks_of",
        Some(remote::tag::STAT) => "stat",
        Some(remote::tag::RESERVE) => "reserve",
        Some(tag::MEMBERSHIP_GET) => "membership_get",
        Some(tag::MEMBERSHIP_SET) => "membership_set",
        Some(tag::REKEY) => "rekey",
        Some(remote::tag::BLOCK_TABLE) => "block_table",
        Some(remote::tag::SET_BLOCK) => "set_block",
        Some(tag::SET_FENCED) => "set_fenced",
        Some(tag::HEARTBEAT) => "heartbeat",
        Some(tag::VOUCH) => "vouch",
        Some(tag::CLAIM_DELETE) => "claim_delete",
        Some(tag::MASTER_CLAIM) => "master_claim",
        Some(tag::AS_MASTER) => "as_master",
        Some(tag::RESYNC) => "resync",
        _ => "other",
    }
}

pub(crate) use dmkit_pmem_pool::remote::NO_OWNER;

/// Reply statuses: the block service's (`REFUSED`: the node is not serving — fenced, not a
/// member, or its membership is being repaired: ask again in the next epoch).
pub(crate) use dmkit_pmem_pool::remote::status;

/// The pool's data area as verbs-registrable memory.
pub fn pool_backing(pool: &Arc<Pool>) -> FnBacking {
    dmkit_pmem_pool::verbs::verbs_backing(pool)
}

/// A FUSEE memory node.
#[derive(Debug)]
pub struct Memnode {
    node: Arc<MemoryNode>,
    pool: Arc<Pool>,
    region: parking_lot::Mutex<RegionDesc>,
    /// The newest membership record the master gave this node.
    membership: parking_lot::Mutex<Option<Membership>>,
    /// This node's lease on serving (renewed by the master's heartbeats or a majority of the
    /// members; the node fences itself when it runs out).
    lease: ServingLease<SystemClock>,
    /// The members' addresses, from the master's heartbeat (whom to ask to vouch).
    peers: parking_lot::Mutex<Vec<(NodeId, String)>>,
    /// Who claimed which completed DELETE round ((epoch, slot offset, value replaced) →
    /// client), oldest first, at most [`CLAIMS_KEPT`].
    claims: parking_lot::Mutex<std::collections::VecDeque<(DeleteRound, u64)>>,
    /// The master that claimed the cluster here, until when (see [`claim_master`]).
    master: ExclusiveLeases<(), String, SystemClock>,
    /// When the lease was last renewed and the gaps before the latest renewals (what a fence
    /// reports as its cause).
    renewals: parking_lot::Mutex<Renewals>,
    /// The newest epoch a client asked the master to fence and repair, and why (reported in
    /// membership answers until the membership moves past it).
    resync: parking_lot::Mutex<Option<(u64, String)>>,
    /// The lease length the master's last heartbeat gave (milliseconds).
    lease_ms: std::sync::atomic::AtomicU64,
}

/// Renewals of a memory node's lease, kept to explain a fence.
#[derive(Debug, Default)]
struct Renewals {
    last: Option<std::time::Instant>,
    /// The gaps before the latest renewals, oldest first, with who renewed.
    gaps: std::collections::VecDeque<(std::time::Duration, &'static str)>,
}

/// Renewal gaps a memory node keeps for its fence reports.
const GAPS_KEPT: usize = 8;

impl Renewals {
    /// The lease was renewed now, by `by` (`master` or `peers`).
    fn renewed(&mut self, by: &'static str) {
        let now = std::time::Instant::now();
        if let Some(last) = self.last {
            let gap = now.saturating_duration_since(last);
            metrics::histogram!("dmkit_memnode_lease_renewal_gap_seconds", "by" => by)
                .record(gap.as_secs_f64());
            if self.gaps.len() == GAPS_KEPT {
                self.gaps.pop_front();
            }
            self.gaps.push_back((gap, by));
        }
        self.last = Some(now);
    }

    /// The time since the last renewal and the gaps before it, for a log line.
    fn report(&self) -> (u64, String) {
        let since = self.last.map_or(0, |l| l.elapsed().as_millis() as u64);
        let gaps = (self.gaps.iter())
            .map(|(g, by)| format!("{}ms by {by}", g.as_millis()))
            .collect::<Vec<_>>()
            .join(", ");
        (since, gaps)
    }
}

/// Counts a fence of this memory node by its cause (`dmkit_memnode_fences_total{cause}`):
/// `lease` (it heard neither the master nor a majority in time), `not_member` (a membership
/// without it), `master` (the master fenced the cluster for a change).
fn count_fence(cause: &'static str) {
    metrics::counter!("dmkit_memnode_fences_total", "cause" => cause).increment(1);
}

/// A memory node's answer to [`claim_master`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimReply {
    /// The claim is this master's until its lease runs out (counted on the node from when the
    /// node received the request).
    pub granted: bool,
    /// The holder's description (this master's own when granted).
    pub holder: String,
    /// How long the holder's claim has left on this node.
    pub remaining: std::time::Duration,
}

/// `req` as the master holding the claim `token` sends it: a memory node that granted the
/// cluster to another master (a live claim with another token) refuses it, so a master paused
/// or cut off past its claim cannot change the membership, fence or refill once another took
/// over. `None` sends `req` as it is (a master without a claim: tests, `LocalCluster`).
pub fn as_master(token: Option<u64>, req: Vec<u8>) -> Vec<u8> {
    match token {
        Some(token) => Request::AsMaster { token, inner: req }.to_bytes(),
        None => req,
    }
}

/// The reason in a refusal's body (a length-prefixed string after the status), or `what`.
pub fn refusal(body: &[u8], what: &str) -> String {
    Reader::new(body)
        .bytes()
        .ok()
        .map(|b| format!("{what}: {}", String::from_utf8_lossy(b)))
        .unwrap_or_else(|| what.to_string())
}

/// One master per cluster: asks `node` to record this master (`token`, described by `who`,
/// e.g. its pid and address) as the cluster's master for `lease`. The node grants it when no
/// other master's claim is live there (none, run out, or the same token renewing); otherwise
/// it names the holder. A master acts only while a majority of the memory nodes granted it,
/// counting its lease from before it sent the requests, so two masters never act at once: a
/// second one needs a majority too, and majorities meet on a node that refuses it until the
/// first's lease has run out there — after it ran out at the first master. A zero `lease`
/// gives the claim up (if `token` holds it). A node's claims live in its DRAM: a restarted
/// node grants the next claimant, and the majority keeps that safe as long as fewer than
/// half the nodes restart within one lease.
/// (Async: a master asks all the nodes at once from one thread.)
pub async fn claim_master(
    ep: &dmkit_verbs::Endpoint,
    node: NodeId,
    token: u64,
    lease: std::time::Duration,
    who: &str,
) -> Result<ClaimReply> {
    let req = Request::MasterClaim {
        token,
        lease_ms: u32::try_from(lease.as_millis()).unwrap_or(u32::MAX),
        who: who.as_bytes().to_vec(),
    }
    .to_bytes();
    let reply = ep.rpc_async(crate::cluster::TAG, node, &req).await?;
    let bad = |e: WireError| Error::Node {
        node,
        reason: format!("bad master-claim reply: {e}"),
    };
    let mut r = Reader::new(&reply);
    let st = r.u8().map_err(bad)?;
    if st != status::OK {
        let msg = r
            .bytes()
            .map(|b| String::from_utf8_lossy(b).into_owned())
            .unwrap_or_else(|_| format!("status {st}"));
        return Err(Error::Node { node, reason: msg });
    }
    let granted = r.u8().map_err(bad)? != 0;
    let holder = String::from_utf8_lossy(r.bytes().map_err(bad)?).into_owned();
    let remaining = std::time::Duration::from_millis(u64::from(r.u32().map_err(bad)?));
    Ok(ClaimReply {
        granted,
        holder,
        remaining,
    })
}

/// A completed DELETE round: (epoch, slot offset, value replaced).
type DeleteRound = (u64, u64, u64);

/// A request that takes this long to answer is logged at WARN.
const SLOW_RPC: std::time::Duration = std::time::Duration::from_millis(300);

/// Claims of DELETE rounds a node remembers.
const CLAIMS_KEPT: usize = 4096;

/// How a memory node asks a peer to vouch for it: `(peer, address, request) -> vouched?`
/// (bounded by the caller; shared with the threads that ask the peers at once).
pub type VouchAsk = Arc<dyn Fn(NodeId, &str, &[u8]) -> bool + Send + Sync>;

impl Memnode {
    /// Serves `pool` as memory node `id`: registers its data area at [`POOL_BASE`] and installs
    /// the block RPCs. Serve [`Memnode::node`] with any verbs backend.
    pub fn new(id: NodeId, pool: Pool) -> Result<Arc<Memnode>> {
        let pool = Arc::new(pool);
        let node = Arc::new(MemoryNode::new(id));
        let region = node
            .register_named(
                POOL_REGION,
                Arc::new(pool_backing(&pool)),
                Access::ALL,
                Some(POOL_BASE),
            )
            .map_err(Error::Verbs)?;
        let m = Arc::new(Memnode {
            node,
            pool,
            region: parking_lot::Mutex::new(region),
            membership: parking_lot::Mutex::new(None),
            lease: ServingLease::new(SystemClock::new()),
            peers: parking_lot::Mutex::new(Vec::new()),
            claims: parking_lot::Mutex::new(std::collections::VecDeque::new()),
            master: ExclusiveLeases::new(SystemClock::new()),
            renewals: Default::default(),
            resync: Default::default(),
            lease_ms: Default::default(),
        });
        m.node
            .serve_while(&m, "the memory node", |m, peer, req| m.handle(peer, req));
        // What a heartbeat, a claim or a vouch does is read or swap a few words in DRAM: a
        // backend answers them where they arrive (on an emulated NIC the hand-off to an RPC
        // worker was most of an idle cluster's CPU).
        m.node.set_quick_rpcs(|req| {
            matches!(
                req.first().copied(),
                Some(
                    tag::MEMBERSHIP_GET
                        | tag::HEARTBEAT
                        | tag::VOUCH
                        | tag::MASTER_CLAIM
                        | tag::RESYNC
                )
            )
        });
        Ok(m)
    }

    pub fn node(&self) -> &Arc<MemoryNode> {
        &self.node
    }

    pub fn pool(&self) -> &Arc<Pool> {
        &self.pool
    }

    /// The pool region's descriptor (its rkey changes when the master fences the cluster).
    pub fn region(&self) -> RegionDesc {
        *self.region.lock()
    }

    /// The newest membership record this node was given.
    pub fn membership(&self) -> Option<Membership> {
        self.membership.lock().clone()
    }

    /// What a restart of the node's process on the same pool does to it, in place (for
    /// in-process clusters): a fresh rkey for the pool, no membership record, no lease, not
    /// fenced. The memory stays as it was.
    pub fn simulate_restart(&self) {
        let mut region = self.region.lock();
        if let Some(d) = self.node.rekey(region.rkey) {
            *region = d;
        }
        *self.membership.lock() = None;
        self.lease.reset();
        self.node.set_serve_until(None);
        self.node.set_fenced(false);
    }

    /// Whether this node serves clients now: not fenced, and (once a membership was
    /// published) a member of an active one.
    fn serving(&self) -> bool {
        !self.node.is_fenced()
            && self
                .membership
                .lock()
                .as_ref()
                .is_none_or(|m| m.is_member(self.node.id()) && !m.repairing)
    }

    /// The lease length of the master's last heartbeat.
    fn lease_len(&self) -> std::time::Duration {
        std::time::Duration::from_millis(self.lease_ms.load(std::sync::atomic::Ordering::Relaxed))
    }

    /// The lease was renewed now for `len`: verbs are refused from its end on, on their own
    /// path ([`MemoryNode::set_serve_until`]), unless it is renewed again before.
    fn serve_for(&self, len: std::time::Duration) {
        self.node
            .set_serve_until(Some(std::time::Instant::now() + len));
    }

    /// A renewal arrived after the lease had run out (the thread keeping it was held off
    /// the CPU, so the node had not fenced itself yet — its verbs were refused on their own
    /// path meanwhile): fence now, as that thread would have, before anything renews it. The
    /// master may have counted this node out; only a newer membership lifts the fence.
    /// Whether it fenced.
    fn fence_if_lapsed(&self) -> bool {
        self.node.lease_ran_out()
            && self.lease_fence("fenced: the lease ran out before this renewal arrived")
    }

    /// Fences the node for want of a lease (unless it is fenced already): counted, and logged
    /// at WARN with `why` and the renewal gaps that led to it. Whether it fenced.
    fn lease_fence(&self, why: &'static str) -> bool {
        if self.node.is_fenced() {
            return false;
        }
        let (since, gaps) = self.renewals.lock().report();
        count_fence("lease");
        tracing::warn!(since_renewal_ms = since, gaps_before = %gaps, "{why}");
        self.node.set_fenced(true);
        true
    }

    /// How long a lease keeper may sleep before calling [`Memnode::keep_lease`] again:
    /// until half the lease has passed since its last renewal (heartbeats keep pushing that
    /// back), at least `min`, at most `max` (also without a lease yet).
    pub fn lease_check_in(
        &self,
        min: std::time::Duration,
        max: std::time::Duration,
    ) -> std::time::Duration {
        self.lease.next_check().unwrap_or(max).clamp(min, max)
    }

    /// Keeps the lease (call it every quarter lease or so): while the master's heartbeats
    /// arrive nothing happens; when they stop for half a lease, asks the peers to vouch
    /// (`ask(peer, address, request) -> vouched?`) and renews on a majority of the members;
    /// when the lease runs out, fences the node. Returns whether the node serves.
    pub fn keep_lease(&self, ask: VouchAsk) -> bool {
        let vouched = || {
            let Some(m) = self.membership() else {
                return false;
            };
            let me = self.node.id();
            if !m.is_member(me) {
                return false;
            }
            let others: Vec<(NodeId, String)> = (self.peers.lock().iter())
                .filter(|(n, _)| *n != me && m.is_member(*n))
                .cloned()
                .collect();
            let req = Request::Vouch {
                who: me,
                epoch: m.epoch,
            }
            .to_bytes();
            let ask = ask.clone();
            let yes = dmkit_lease::vouched_by_majority(
                m.members.len(),
                others,
                Arc::new(move |(n, addr): &(NodeId, String)| ask(*n, addr, &req)),
            );
            if yes && !self.fence_if_lapsed() {
                self.renewals.lock().renewed("peers");
                self.serve_for(self.lease_len());
            }
            yes
        };
        let fence = || {
            self.lease_fence(
                "fenced: no word from the master and no majority of the members within the lease",
            )
        };
        self.lease.keep(vouched, fence);
        !self.node.is_fenced()
    }

    fn handle(&self, peer: &Peer, req: &[u8]) -> Vec<u8> {
        let t = std::time::Instant::now();
        let r = self.handle_untimed(peer, req);
        let (kind, took) = (rpc_kind(req.first().copied()), t.elapsed());
        metrics::histogram!("dmkit_memnode_rpc_seconds", "kind" => kind).record(took.as_secs_f64());
        if took >= SLOW_RPC {
            // Whoever asked (a client allocating, the master) waited as long.
            tracing::warn!(
                kind,
                ms = took.as_millis() as u64,
                "slow memory-node request"
            );
        }
        r
    }

    fn handle_untimed(&self, peer: &Peer, req: &[u8]) -> Vec<u8> {
        match self.dispatch(req) {
            Ok(v) => v,
            Err(e) => {
                tracing::warn!(peer = %peer.addr, error = %e, "malformed FUSEE block request");
                Writer::new()
                    .u8(status::FAILED)
                    .bytes(e.to_string().as_bytes())
                    .finish()
            }
        }
    }

    fn dispatch(&self, req: &[u8]) -> std::result::Result<Vec<u8>, WireError> {
        if let Some(block_req) = BlockRequest::decode(req)? {
            if block_req.allocates() && !self.serving() {
                // Block tables change only in an active epoch: a refill copies them consistently.
                return Ok(remote::refused(
                    "not serving block requests while the membership changes",
                ));
            }
            return Ok(remote::serve(
                &self.pool,
                &block_req,
                &ServeOptions::default(),
            ));
        }
        Ok(match Request::from_bytes(req)? {
            Request::MembershipGet => {
                let m = self.membership.lock().clone();
                let w = Writer::new()
                    .u8(status::OK)
                    .u8(u8::from(self.node.is_fenced()));
                let epoch = m.as_ref().map_or(0, |m| m.epoch);
                let w = match m {
                    Some(m) => w.u8(1).bytes(&m.encode()),
                    None => w.u8(0),
                };
                // (Trailing: a resync a client asked for in the current epoch.)
                match self.resync.lock().as_ref().filter(|(e, _)| *e == epoch) {
                    Some((e, why)) => w.u64(*e).bytes(why.as_bytes()).finish(),
                    None => w.finish(),
                }
            }
            Request::Resync { epoch, why } => {
                let current = self.membership.lock().as_ref().map_or(0, |m| m.epoch);
                let mut want = self.resync.lock();
                // Only for the epoch this node serves: an older one has been moved past.
                if epoch == current && want.as_ref().is_none_or(|(e, _)| *e < epoch) {
                    let why = String::from_utf8_lossy(&why).into_owned();
                    tracing::info!(epoch, %why, "a client asks the master for a resync");
                    *want = Some((epoch, why));
                }
                Writer::new().u8(status::OK).finish()
            }
            Request::MembershipSet { record } => {
                let m = Membership::decode(&record)?;
                let mut cur = self.membership.lock();
                if cur.as_ref().is_some_and(|c| c.epoch > m.epoch) {
                    return Ok(Writer::new()
                        .u8(status::FAILED)
                        .bytes(b"an older membership epoch")
                        .finish());
                }
                let member = m.is_member(self.node.id());
                if !member && !self.node.is_fenced() {
                    count_fence("not_member");
                    tracing::warn!(
                        epoch = m.epoch,
                        "fenced: this memory node is not a member of the new membership"
                    );
                }
                self.node.set_fenced(!member);
                *cur = Some(m);
                Writer::new().u8(status::OK).finish()
            }
            Request::Rekey => {
                let mut region = self.region.lock();
                match self.node.rekey(region.rkey) {
                    Some(d) => {
                        *region = d;
                        Writer::new().u8(status::OK).u32(d.rkey.0).finish()
                    }
                    None => Writer::new()
                        .u8(status::FAILED)
                        .bytes(b"the pool region is not registered")
                        .finish(),
                }
            }
            Request::Heartbeat { lease_ms, peers } => {
                *self.peers.lock() = peers.0;
                self.fence_if_lapsed();
                self.renewals.lock().renewed("master");
                let len = std::time::Duration::from_millis(u64::from(lease_ms));
                self.lease_ms
                    .store(u64::from(lease_ms), std::sync::atomic::Ordering::Relaxed);
                self.serve_for(len);
                if self
                    .lease
                    .renew(std::time::Duration::from_millis(u64::from(lease_ms)))
                {
                    // The master is back. The fence stays until it publishes a newer
                    // membership (it does when this reply says the node is fenced): clients
                    // this node refused wait for a newer epoch, and one cut off meanwhile may
                    // have been failed over by a record it never got.
                    tracing::info!(
                        "the master is back: fenced until it publishes the next membership"
                    );
                }
                return self.dispatch(&Request::MembershipGet.to_bytes());
            }
            Request::Vouch { who, epoch } => {
                let yes = !self.node.is_fenced()
                    && self
                        .membership
                        .lock()
                        .as_ref()
                        .is_some_and(|m| m.epoch == epoch && m.is_member(who));
                Writer::new().u8(status::OK).u8(u8::from(yes)).finish()
            }
            Request::ClaimDelete {
                epoch,
                offset,
                replaced,
                client,
            } => {
                // Two DELETEs of one value, both cut short, can both learn that the round was
                // completed; the first to claim it reports it, the other found nothing.
                let key = (epoch, offset, replaced);
                let mut claims = self.claims.lock();
                let owner = match claims.iter().find(|(k, _)| *k == key) {
                    Some((_, c)) => *c,
                    None => {
                        if claims.len() >= CLAIMS_KEPT {
                            claims.pop_front();
                        }
                        claims.push_back((key, client));
                        client
                    }
                };
                Writer::new().u8(status::OK).u64(owner).finish()
            }
            Request::AsMaster { token, inner } => {
                // The claim is the fence: a master whose claim another master replaced here
                // (it was paused or cut off past its lease) can no longer change anything.
                if inner.first() == Some(&tag::AS_MASTER) {
                    return Err(WireError("nested master request"));
                }
                match self.master.check(&(), token).err().map(|h| h.info) {
                    Some(who) => Writer::new()
                        .u8(status::REFUSED)
                        .bytes(
                            format!(
                                "another master holds the cluster ({who}): this one's claim is gone"
                            )
                            .as_bytes(),
                        )
                        .finish(),
                    None => return self.dispatch(&inner),
                }
            }
            Request::MasterClaim {
                token,
                lease_ms,
                who,
            } => {
                let who = String::from_utf8_lossy(&who).into_owned();
                let ttl = std::time::Duration::from_millis(u64::from(lease_ms));
                let had = self.master.holder(&());
                let (granted, holder) = match self.master.acquire((), token, who, ttl) {
                    Ok(h) => {
                        if had.is_none() && !ttl.is_zero() {
                            tracing::info!(master = %h.info, "a master claimed the cluster");
                        }
                        (true, h)
                    }
                    Err(h) => (false, h),
                };
                let left = self.master.remaining(&holder).as_millis();
                Writer::new()
                    .u8(status::OK)
                    .u8(u8::from(granted))
                    .bytes(holder.info.as_bytes())
                    .u32(u32::try_from(left).unwrap_or(u32::MAX))
                    .finish()
            }
            Request::SetFenced { fenced } => {
                if fenced != 0 && !self.node.is_fenced() {
                    count_fence("master");
                }
                self.node.set_fenced(fenced != 0);
                Writer::new().u8(status::OK).finish()
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn master_claim(m: &Memnode, token: u64, lease_ms: u32, who: &str) -> (bool, String) {
        let req = Request::MasterClaim {
            token,
            lease_ms,
            who: who.as_bytes().to_vec(),
        };
        let reply = m.dispatch(&req.to_bytes()).unwrap();
        let mut r = Reader::new(&reply);
        assert_eq!(r.u8().unwrap(), status::OK);
        let granted = r.u8().unwrap() != 0;
        let holder = String::from_utf8_lossy(r.bytes().unwrap()).into_owned();
        (granted, holder)
    }

    #[test]
    fn requests_keep_the_bytes_of_their_hand_written_form() {
        let w = Writer::new;
        let peers = Peers(vec![(NodeId(2), "h:1".into()), (NodeId(5), "h:2".into())]);
        let cases = [
            (Request::MembershipGet, w().u8(tag::MEMBERSHIP_GET).finish()),
            (
                Request::MembershipSet {
                    record: vec![1, 2, 3],
                },
                w().u8(tag::MEMBERSHIP_SET).bytes(&[1, 2, 3]).finish(),
            ),
            (Request::Rekey, w().u8(tag::REKEY).finish()),
            (
                Request::SetFenced { fenced: 1 },
                w().u8(tag::SET_FENCED).u8(1).finish(),
            ),
            (
                Request::Heartbeat {
                    lease_ms: 500,
                    peers,
                },
                w().u8(tag::HEARTBEAT)
                    .u32(500)
                    .u16(2)
                    .u16(2)
                    .bytes(b"h:1")
                    .u16(5)
                    .bytes(b"h:2")
                    .finish(),
            ),
            (
                Request::Vouch {
                    who: NodeId(3),
                    epoch: 9,
                },
                w().u8(tag::VOUCH).u16(3).u64(9).finish(),
            ),
            (
                Request::ClaimDelete {
                    epoch: 1,
                    offset: 2,
                    replaced: 3,
                    client: 4,
                },
                w().u8(tag::CLAIM_DELETE)
                    .u64(1)
                    .u64(2)
                    .u64(3)
                    .u64(4)
                    .finish(),
            ),
            (
                Request::MasterClaim {
                    token: 7,
                    lease_ms: 100,
                    who: b"me".to_vec(),
                },
                w().u8(tag::MASTER_CLAIM)
                    .u64(7)
                    .u32(100)
                    .bytes(b"me")
                    .finish(),
            ),
            (
                Request::AsMaster {
                    token: 7,
                    inner: vec![tag::REKEY],
                },
                w().u8(tag::AS_MASTER).u64(7).bytes(&[tag::REKEY]).finish(),
            ),
            (
                Request::Resync {
                    epoch: 4,
                    why: b"stuck".to_vec(),
                },
                w().u8(tag::RESYNC).u64(4).bytes(b"stuck").finish(),
            ),
        ];
        for (req, bytes) in cases {
            assert_eq!(req.to_bytes(), bytes, "{req:?}");
            assert_eq!(Request::from_bytes(&bytes), Ok(req));
        }
        // Addresses that are not UTF-8 still decode (lossily), as before.
        let odd = w()
            .u8(tag::HEARTBEAT)
            .u32(1)
            .u16(1)
            .u16(0)
            .bytes(&[0xff])
            .finish();
        let Ok(Request::Heartbeat { peers, .. }) = Request::from_bytes(&odd) else {
            panic!("a heartbeat");
        };
        assert_eq!(peers.0, vec![(NodeId(0), "\u{fffd}".to_string())]);
        assert_eq!(Request::from_bytes(&[200]), Err(WireError("request kind")));
    }

    #[test]
    fn one_master_holds_the_claim_until_it_lets_go_or_its_lease_runs_out() {
        let m = test_memnode();
        assert_eq!(master_claim(&m, 1, 10_000, "a"), (true, "a".into()));
        assert_eq!(master_claim(&m, 1, 10_000, "a"), (true, "a".into()));
        assert_eq!(master_claim(&m, 2, 10_000, "b"), (false, "a".into()));
        // Given up: the next claimant gets it.
        assert!(master_claim(&m, 1, 0, "a").0);
        assert_eq!(master_claim(&m, 2, 40, "b"), (true, "b".into()));
        // Giving up a claim one does not hold changes nothing.
        assert_eq!(master_claim(&m, 1, 0, "a"), (false, "b".into()));
        assert_eq!(master_claim(&m, 1, 10_000, "a"), (false, "b".into()));
        // Run out: taken over.
        std::thread::sleep(std::time::Duration::from_millis(60));
        assert_eq!(master_claim(&m, 1, 10_000, "a"), (true, "a".into()));
    }

    /// A memory node on 4 MiB of DRAM, as node 0.
    fn test_memnode() -> Arc<Memnode> {
        let pool = Pool::create_dram(
            4 << 20,
            dmkit_pmem_pool::PoolOptions::default().block_size(64 << 10),
        )
        .unwrap();
        Memnode::new(NodeId(0), pool).unwrap()
    }

    /// The master publishes membership `epoch` of nodes `0..members` to `m`.
    fn publish_members(m: &Memnode, epoch: u64, members: u16) {
        let record = Membership {
            cluster: 1,
            epoch,
            repairing: false,
            members: (0..members)
                .map(|n| (NodeId(n), dmkit_verbs::RKey(1)))
                .collect(),
            deletes: Vec::new(),
            blind: Vec::new(),
            primary_lost: Vec::new(),
        };
        let req = Request::MembershipSet {
            record: record.encode(),
        };
        assert_eq!(m.dispatch(&req.to_bytes()).unwrap()[0], status::OK);
    }

    /// Whether the node says, in a membership reply, that it is fenced.
    fn says_fenced(reply: &[u8]) -> bool {
        let mut r = Reader::new(reply);
        assert_eq!(r.u8().unwrap(), status::OK);
        r.u8().unwrap() != 0
    }

    #[test]
    fn a_lease_fence_stays_until_a_newer_membership() {
        let m = test_memnode();
        let publish = |epoch| publish_members(&m, epoch, 3);
        let heartbeat = || {
            let req = Request::Heartbeat {
                lease_ms: 20,
                peers: Peers(Vec::new()),
            };
            says_fenced(&m.dispatch(&req.to_bytes()).unwrap())
        };
        publish(5);
        assert!(!heartbeat());
        // No heartbeat and no peer vouching for a whole lease: fenced.
        std::thread::sleep(std::time::Duration::from_millis(40));
        assert!(!m.keep_lease(Arc::new(|_, _, _| false)));
        assert!(m.node().is_fenced());
        // The master is back: its heartbeat renews the lease, but the node stays fenced (and
        // says so) — clients it refused wait for a newer epoch, and a record failing it over
        // may have been published while it was cut off.
        assert!(heartbeat(), "a heartbeat lifted the lease's fence");
        assert!(
            !m.keep_lease(Arc::new(|_, _, _| false)),
            "serving on a renewed lease"
        );
        assert!(m.node().is_fenced());
        // A newer record naming the node a member lifts the fence.
        publish(6);
        assert!(!m.node().is_fenced());
        assert!(!heartbeat());
        // The thread keeping the lease is held off the CPU past the lease: the verbs' own
        // path refuses from the lease's end on, and the next renewal fences rather than
        // quietly extending a lease that ran out.
        std::thread::sleep(std::time::Duration::from_millis(40));
        assert!(m.node().lease_ran_out());
        assert!(!m.node().is_fenced(), "(nothing ran to fence it)");
        assert!(heartbeat(), "a late heartbeat revived a lapsed lease");
        assert!(m.node().is_fenced());
        publish(7);
        assert!(!heartbeat());
        assert!(!m.node().lease_ran_out());
    }

    #[test]
    fn a_client_asks_for_a_resync_of_the_current_epoch_only() {
        let m = test_memnode();
        let query = || {
            let reply = m.dispatch(&Request::MembershipGet.to_bytes()).unwrap();
            crate::membership::parse_reply(NodeId(0), &reply)
                .unwrap()
                .resync
        };
        let ask = |epoch: u64, why: &str| {
            let req = Request::Resync {
                epoch,
                why: why.as_bytes().to_vec(),
            };
            assert_eq!(m.dispatch(&req.to_bytes()).unwrap(), vec![status::OK]);
        };
        let publish = |epoch| publish_members(&m, epoch, 1);
        publish(3);
        assert_eq!(query(), None);
        // An older epoch was moved past already: ignored.
        ask(2, "stale");
        assert_eq!(query(), None);
        ask(3, "a round nobody finishes");
        assert_eq!(query(), Some((3, "a round nobody finishes".into())));
        // The master's next membership answers it.
        publish(4);
        assert_eq!(query(), None);
    }

    fn claim(m: &Memnode, round: DeleteRound, client: u64) -> u64 {
        let req = Request::ClaimDelete {
            epoch: round.0,
            offset: round.1,
            replaced: round.2,
            client,
        };
        let reply = m.dispatch(&req.to_bytes()).unwrap();
        let mut r = Reader::new(&reply);
        assert_eq!(r.u8().unwrap(), status::OK);
        r.u64().unwrap()
    }

    #[test]
    fn the_first_claim_of_a_delete_round_holds() {
        let m = test_memnode();
        assert_eq!(claim(&m, (3, 64, 7), 11), 11);
        assert_eq!(
            claim(&m, (3, 64, 7), 12),
            11,
            "the second claimant learns the first"
        );
        assert_eq!(claim(&m, (3, 64, 7), 11), 11, "asking again is harmless");
        assert_eq!(
            claim(&m, (4, 64, 7), 12),
            12,
            "another round is another claim"
        );
        // Old claims go once the node keeps too many.
        for i in 0..CLAIMS_KEPT as u64 {
            claim(&m, (9, i, 1), 20);
        }
        assert_eq!(claim(&m, (3, 64, 7), 12), 12);
    }
}
