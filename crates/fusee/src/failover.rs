//! The master's side of memory-node failures: leases (heartbeats), fencing, index repair,
//! membership publication, and refilling a node that rejoins.
//!
//! The master is off the data path: clients read the membership from the memory nodes, so a
//! cluster whose master is down keeps serving (it just cannot fail over until it is back).
//!
//! **Failover** of dead node(s) `X` (the master stopped hearing from them):
//!
//! 1. *Fence*: every surviving member gets a fresh rkey for its pool region. Every client
//!    still working with the old membership is refused at once by every survivor, fails the
//!    operation it had in flight, and re-reads the membership (a client can never finish a
//!    write touching only `X`: every write CASes the index on a majority of nodes).
//! 2. Publish `epoch + 1, repairing` to the survivors (with their new rkeys): clients may
//!    SEARCH, writes wait.
//! 3. *Repair the index* ([`dmkit_kv_index::repair`]): the survivors' replicas become
//!    identical. A slot they disagree on is a SNAPSHOT round cut short; its value is chosen as
//!    the paper's failure algorithm does — the old primary's value when it survived, unless
//!    every surviving backup already agrees on a newer one (the round's winner may have
//!    committed); without the old primary, the value a majority of backups holds, else the
//!    smallest, as SNAPSHOT's rule 3. A chosen object whose log entry has no commit record
//!    gets one written on its writer's behalf, so recovery treats it as done.
//! 4. Publish `epoch + 2, active`: writes resume; the first serving index holder is the
//!    primary, each block's first serving replica its acting primary.
//!
//! **Rejoin** of node `N` (restarted on its pool file, or a new pool): fence and publish
//! `repairing` (writes wait), copy block 0, the index replica and every data block `N`
//! replicates from a serving replica (with the block table's owners), then publish `active`
//! with `N` a member again: the cluster tolerates another failure.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use dmkit_kv_index::repair::{self, SlotConflict};
use dmkit_kv_index::{Slot, is_empty_word};
use dmkit_lease::{FailureDetector, SystemClock, Verdict};
use dmkit_verbs::wire::{Reader, Wire};
use dmkit_verbs::{Endpoint, NodeId, RKey};
use parking_lot::Mutex;

use crate::cluster::{self, ClusterView};
use crate::error::{Error, Result};
use crate::membership::{self, Membership};
use crate::memnode::{NO_OWNER, Peers, Request, status};
use crate::object::{self, Commit, Op};
use crate::verifier::slot_addr;
use dmkit_pmem_pool::remote::{self, BlockClient, BlockRequest};
use dmkit_pmem_pool::slabs;

/// Opens a fresh connection to a memory node (one that restarted, or was unreachable).
pub use dmkit_verbs::Reconnect;

impl std::fmt::Debug for Master {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Master")
            .field("nodes", &self.nodes)
            .field("membership", &*self.current.lock())
            .finish()
    }
}

/// Asks `node` for its membership; when that fails and `reconnect` is given, reconnects once
/// and asks again.
pub fn query_or_reconnect(
    ep: &Endpoint,
    reconnect: Option<&Reconnect>,
    node: NodeId,
) -> Result<membership::NodeMembership> {
    ep.reconnecting(node, reconnect, || membership::query(ep, node))
}

/// What an index repair did: its figures, the commit records written on writers' behalf,
/// and the DELETE rounds it completed (slot offset, the value replaced).
type IndexRepair = (repair::RepairReport, u64, Vec<(u64, u64)>);

/// Tag of the master's verbs.
pub const TAG: &str = "fusee_master";

/// Settings of the master's failure detector.
#[derive(Debug, Clone)]
pub struct MasterConfig {
    /// How often each memory node is probed.
    pub heartbeat: Duration,
    /// A node that missed this many probes in a row is failed over.
    pub miss_limit: u32,
    /// Refill memory nodes that come back (restarted) automatically.
    pub auto_rejoin: bool,
}

/// The memory nodes' leases (see [`Master::with_leases`]).
#[derive(Debug, Clone)]
pub struct LeaseConfig {
    /// How long a memory node serves without hearing from the master or a majority of the
    /// members.
    pub length: Duration,
    /// Every memory node's address, for the nodes to reach each other.
    pub peers: Vec<(NodeId, String)>,
}

impl Default for MasterConfig {
    fn default() -> Self {
        Self {
            heartbeat: Duration::from_millis(100),
            miss_limit: 5,
            auto_rejoin: true,
        }
    }
}

/// What a failover did.
#[derive(Debug, Clone, Default)]
pub struct FailoverReport {
    pub failed: Vec<NodeId>,
    /// The epoch published at the end.
    pub epoch: u64,
    pub index: repair::RepairReport,
    /// Objects whose commit record the master wrote on their writer's behalf.
    pub committed_on_behalf: u64,
    /// From the fence to the active membership.
    pub took: Duration,
}

/// What a rejoin did.
#[derive(Debug, Clone, Default)]
pub struct RejoinReport {
    pub node: NodeId,
    pub epoch: u64,
    pub blocks_copied: u64,
    pub bytes_copied: u64,
    pub took: Duration,
}

/// The master: the cluster's membership service.
pub struct Master {
    ep: Endpoint,
    reconnect: Option<Reconnect>,
    nodes: Vec<NodeId>,
    current: Mutex<Membership>,
    /// One membership change at a time.
    change: Mutex<()>,
    leases: Option<LeaseConfig>,
    /// The claim this master holds (see [`MasterOptions::claim_token`]).
    token: Option<u64>,
    /// See [`MasterOptions::acting`].
    acting: Option<Arc<std::sync::atomic::AtomicBool>>,
}

/// How a [`Master`] runs, set before it acts ([`Master::open`]).
#[derive(Clone, Default)]
pub struct MasterOptions {
    /// Reconnects to memory nodes that restart or were unreachable.
    pub reconnect: Option<Reconnect>,
    /// The memory nodes' leases (see [`Master::with_leases`]).
    pub leases: Option<LeaseConfig>,
    /// The token of the claim this master holds on the cluster
    /// ([`crate::memnode::claim_master`]): every change it makes on a memory node (a
    /// membership record, a fence, a refill) carries it, and a node that granted the cluster
    /// to another master since refuses it ([`crate::memnode::as_master`]).
    pub claim_token: Option<u64>,
    /// Whether this master may act now (its claim holds). While it reads false the master
    /// changes nothing — every membership record, fence, refill or heartbeat it would send
    /// is refused before it leaves — so a master whose claim ran out stops at once, whatever
    /// its failure detector was doing, and can step down instead of exiting.
    pub acting: Option<Arc<std::sync::atomic::AtomicBool>>,
}

impl std::fmt::Debug for MasterOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MasterOptions")
            .field("reconnect", &self.reconnect.is_some())
            .field("leases", &self.leases)
            .field("claim_token", &self.claim_token.map(|_| "…"))
            .field("acting", &self.acting)
            .finish()
    }
}

impl Master {
    /// Like [`Master::new`], with a way to reconnect to memory nodes that restart.
    pub fn with_reconnect(
        ep: Endpoint,
        nodes: &[NodeId],
        reconnect: Reconnect,
    ) -> Result<Arc<Master>> {
        Self::open(
            ep,
            nodes,
            MasterOptions {
                reconnect: Some(reconnect),
                ..Default::default()
            },
        )
    }

    /// Gives the memory nodes leases: the heartbeats carry `cfg`, and a failover waits out
    /// the lease of the failed node before writes resume (a node that is only cut off has
    /// fenced itself by then).
    pub fn with_leases(self: Arc<Self>, cfg: LeaseConfig) -> Arc<Master> {
        let mut m = Arc::try_unwrap(self).expect("not shared yet");
        m.leases = Some(cfg);
        Arc::new(m)
    }

    /// Takes over the cluster whose memory nodes `ep` is connected to (formatted already):
    /// adopts the newest published membership, or publishes the first one (epoch 1, every
    /// answering node) when there is none.
    pub fn new(ep: Endpoint, nodes: &[NodeId]) -> Result<Arc<Master>> {
        Self::open(ep, nodes, MasterOptions::default())
    }

    /// [`Master::new`] with `opts` in force from its first action (a repair redone at start
    /// waits out the leases and carries the claim).
    pub fn open(ep: Endpoint, nodes: &[NodeId], opts: MasterOptions) -> Result<Arc<Master>> {
        let mut m = membership::newest(&ep, nodes)?;
        let uuid = cluster::open_at_tolerant(&ep, nodes, &m)?.uuid;
        if m.cluster != 0 && m.cluster != uuid {
            return Err(Error::Cluster(format!(
                "the membership belongs to cluster {:032x}, the superblocks to {uuid:032x}",
                m.cluster
            )));
        }
        m.cluster = uuid;
        let master = Arc::new(Master {
            ep,
            nodes: nodes.to_vec(),
            reconnect: opts.reconnect,
            current: Mutex::new(m.clone()),
            change: Mutex::new(()),
            leases: opts.leases,
            token: opts.claim_token,
            acting: opts.acting.clone(),
        });
        if m.epoch == 0 {
            let first = Membership {
                deletes: Vec::new(),
                blind: Vec::new(),
                primary_lost: Vec::new(),
                cluster: m.cluster,
                epoch: 1,
                repairing: false,
                members: m.members,
            };
            master.publish(&first)?;
            return Ok(master);
        }
        // A member that does not answer now is the failure detector's to fail over (after
        // its heartbeats are missed and its lease has run out: it may only be cut off).
        let (mut silent, mut fenced) = (Vec::new(), Vec::new());
        for (n, _) in &m.members {
            match membership::query(&master.ep, *n) {
                Err(_) => silent.push(*n),
                Ok(q) if q.fenced => fenced.push(*n),
                Ok(_) => {}
            }
        }
        for n in &silent {
            tracing::warn!(
                node = n.0,
                "memory node {n} is a member but does not answer; the failure detector will fail it over unless it comes back"
            );
        }
        if (m.repairing || !fenced.is_empty()) && silent.is_empty() {
            // A master died mid-change, or members fenced themselves while no master was
            // there (their clients wait for a newer epoch): redo the repair over the same
            // members, which publishes one. (With a member silent, the detector's failover
            // of it does.)
            master.fail_over(&[])?;
        } else {
            // Members that missed the last record get it again (those that answer; not
            // those fenced: the next epoch lifts their fence).
            for n in &master.nodes {
                if !silent.contains(n) && !fenced.contains(n) {
                    let r = membership::publish_as(&master.ep, *n, &m, master.token);
                    if m.is_member(*n) {
                        r?;
                    }
                }
            }
        }
        Ok(master)
    }

    /// The membership the master published last.
    pub fn membership(&self) -> Membership {
        self.current.lock().clone()
    }

    pub fn endpoint(&self) -> &Endpoint {
        &self.ep
    }

    /// Publishes `m` to its members and to the non-members that answer (so a fenced node
    /// learns it is out); the members must all take it.
    fn publish(&self, m: &Membership) -> Result<()> {
        for n in &self.nodes {
            let r = membership::publish_as(&self.ep, *n, m, self.token);
            if m.is_member(*n) {
                r?;
            }
        }
        *self.current.lock() = m.clone();
        tracing::info!(
            epoch = m.epoch,
            repairing = m.repairing,
            members = ?m.members.iter().map(|(n, _)| n.0).collect::<Vec<_>>(),
            "published membership"
        );
        metrics::gauge!("dmkit_fusee_membership_epoch").set(m.epoch as f64);
        metrics::gauge!("dmkit_fusee_members").set(m.members.len() as f64);
        Ok(())
    }

    /// Probes every node once, in parallel (the heartbeat, carrying the lease):
    /// `(node, answered, says it is fenced, its epoch)`.
    pub fn probe(self: &Arc<Self>) -> Vec<(NodeId, bool, bool, u64)> {
        dmkit_verbs::block_on(self.probe_async())
    }

    /// [`Master::probe`], awaited: the nodes are asked at once, from this task (a node that
    /// is slow to answer, or to reconnect to, delays no other node's heartbeat; no task per
    /// node, whose spawning wakes another runtime worker every beat).
    pub async fn probe_async(self: &Arc<Self>) -> Vec<(NodeId, bool, bool, u64)> {
        let req = self.heartbeat_request();
        let answers =
            dmkit_verbs::join_all(self.nodes.iter().map(|&n| self.ask(n, &req)).collect()).await;
        (self.nodes.iter().zip(answers))
            .map(|(&n, a)| match a {
                Ok(q) => (n, true, q.fenced, q.record.map_or(0, |r| r.epoch)),
                Err(_) => (n, false, false, 0),
            })
            .collect()
    }

    /// The heartbeat's request: the lease and the peers that may vouch (or, without leases,
    /// a membership query).
    fn heartbeat_request(&self) -> Vec<u8> {
        match &self.leases {
            Some(l) => Request::Heartbeat {
                lease_ms: l.length.as_millis().min(u128::from(u32::MAX)) as u32,
                peers: Peers(l.peers.clone()),
            },
            None => Request::MembershipGet,
        }
        .to_bytes()
    }

    /// One node's heartbeat; reconnects once (a blocking connect, moved off the runtime's
    /// worker) when the connection is gone.
    async fn ask(&self, n: NodeId, req: &[u8]) -> Result<membership::NodeMembership> {
        let ask = || self.ep.rpc_async(TAG, n, req);
        let reply = (self.ep)
            .reconnecting_async(n, self.reconnect.as_ref(), ask)
            .await?;
        membership::parse_reply(n, &reply)
    }

    /// Fences the members in `members` with fresh rkeys; returns the new (node, rkey) list.
    fn fence(&self, members: &[NodeId]) -> Result<Vec<(NodeId, RKey)>> {
        let mut out = Vec::new();
        for n in members {
            let reply = self.master_rpc(*n, Request::Rekey.to_bytes())?;
            let mut r = Reader::new(&reply);
            let bad = |e: dmkit_verbs::wire::WireError| Error::Node {
                node: *n,
                reason: e.to_string(),
            };
            if r.u8().map_err(bad)? != status::OK {
                return Err(Error::Node {
                    node: *n,
                    reason: "refused to fence (rekey)".into(),
                });
            }
            out.push((*n, RKey(r.u32().map_err(bad)?)));
        }
        Ok(out)
    }

    /// Fails `dead` over (see the module docs). With `dead` empty, re-fences and repairs the
    /// current members (a master restarted mid-change).
    pub fn fail_over(&self, dead: &[NodeId]) -> Result<FailoverReport> {
        let _one = self.change.lock();
        let t = Instant::now();
        let old = self.membership();
        let survivors: Vec<NodeId> = old
            .members
            .iter()
            .map(|(n, _)| *n)
            .filter(|n| !dead.contains(n))
            .collect();
        if survivors.is_empty() {
            return Err(Error::Membership("no memory node survives".into()));
        }
        let repairing = old.next(true, self.fence(&survivors)?);
        // (Published before the cluster's shape is read: members that fenced themselves —
        // every one of them, when the master's heartbeats were held up — serve the master
        // again only under a newer membership.)
        self.publish(&repairing)?;
        let old_primary = self.index_primary(&old)?;
        match &self.leases {
            // The survivors no longer vouch for the failed node: if it is only cut off, its
            // lease runs out and it fences itself before anyone writes again. (Nothing to
            // wait out when no member failed and the last change was finished: a node it
            // dropped waited out its lease before that change's end was published.)
            Some(l) if !dead.is_empty() || old.repairing => {
                std::thread::sleep(l.length + Duration::from_millis(50))
            }
            _ => {}
        }
        let view = cluster::open_at(&self.ep, &self.nodes, &repairing)?;
        let spaces = view.index_spaces();
        if spaces.is_empty() {
            return Err(Error::Membership(
                "every index replica failed: the index is lost".into(),
            ));
        }
        let (index, mut on_behalf, deletes) = self.repair_index(&view, old_primary)?;
        let mut active = repairing.next(false, repairing.members.clone());
        active.remember_deletes(deletes);
        if spaces[0].region.node != old_primary {
            active.remember_primary_lost();
            // The old primary is gone: a round whose backups all took its value but whose
            // primary swap (on the dead node) is unknown became the slot's value without a
            // conflict to show it. Its writer may not have written the commit record yet:
            // write it, so the writer (and a later recovery) sees the operation as done.
            for (_, v) in repair::slot_values(&self.ep, &spaces[0])? {
                on_behalf += u64::from(self.commit_on_behalf(&view, v, 0)?);
            }
        }
        if spaces.len() == 1 && spaces[0].region.node == old_primary {
            // Only the old primary's replica survived: rounds cut short on the lost backups
            // were invisible to the repair.
            active.remember_blind();
        }
        self.publish(&active)?;
        let rep = FailoverReport {
            failed: dead.to_vec(),
            epoch: active.epoch,
            index,
            committed_on_behalf: on_behalf,
            took: t.elapsed(),
        };
        tracing::warn!(?rep, "failed over");
        metrics::counter!("dmkit_fusee_failovers_total").increment(1);
        Ok(rep)
    }

    /// Makes the serving index replicas identical (every writer is fenced): the rounds the
    /// fence cut short are finished or rolled back. Returns the repair's figures and the
    /// commit records written on writers' behalf.
    fn repair_index(&self, view: &ClusterView, old_primary: NodeId) -> Result<IndexRepair> {
        let spaces = view.index_spaces();
        let primary_served = spaces.first().is_some_and(|s| s.region.node == old_primary);
        let mut on_behalf = 0u64;
        let mut deletes = Vec::new();
        let rep = repair::repair_replicas(&self.ep, &spaces, primary_served, |c| {
            let (v, committed) = self.decide(view, c).map_err(|e| {
                dmkit_kv_index::Error::Verifier(format!("deciding slot {:#x}: {e}", c.offset))
            })?;
            on_behalf += u64::from(committed);
            if let Some(replaced) =
                dmkit_kv_index::repair::repair_completed_delete(c.primary, &c.backups, v)
            {
                // A DELETE completed here: its writer learns it from the membership.
                deletes.push((c.offset, replaced));
            }
            Ok(v)
        })?;
        Ok((rep, on_behalf, deletes))
    }

    /// The node holding the index primary under `m`.
    fn index_primary(&self, m: &Membership) -> Result<NodeId> {
        let view = self.shape()?;
        view.index_holders()
            .iter()
            .copied()
            .find(|n| m.is_member(*n))
            .ok_or_else(|| Error::Membership("no index replica serves".into()))
    }

    /// The cluster's shape (from any serving superblock).
    fn shape(&self) -> Result<ClusterView> {
        let m = self.membership();
        cluster::open_at_tolerant(&self.ep, &self.nodes, &m)
    }

    /// The value of a slot whose replicas disagree, and whether a commit record was written
    /// on its writer's behalf.
    fn decide(&self, view: &ClusterView, c: &SlotConflict) -> Result<(u64, bool)> {
        let valid = |v: u64| -> Result<bool> {
            if is_empty_word(v) {
                return Ok(true);
            }
            Ok(self.object_of(view, v)?.is_some())
        };
        let chosen = dmkit_kv_index::repair::repair_choice(c.primary, &c.backups, valid)?;
        let committed = if !is_empty_word(chosen) {
            self.commit_on_behalf(view, chosen, c.primary.unwrap_or(0))?
        } else {
            false
        };
        Ok((chosen, committed))
    }

    /// The object a raw slot value points to, read from a serving replica.
    fn object_of(&self, view: &ClusterView, raw: u64) -> Result<Option<object::KvObject>> {
        let Some(s) = Slot::from_raw(raw)? else {
            return Ok(None);
        };
        let a = slot_addr(s);
        let Some(at) = view.acting(a.node, a.offset) else {
            return Ok(None);
        };
        let b = self.ep.read(TAG, at, s.object_len())?;
        Ok(object::decode_checked(&b, a))
    }

    /// Writes the commit record of the object `chosen` points to, if it has none.
    fn commit_on_behalf(&self, view: &ClusterView, chosen: u64, old: u64) -> Result<bool> {
        let Some(obj) = self.object_of(view, chosen)? else {
            return Ok(false);
        };
        if obj.log.commit.is_some() {
            return Ok(false);
        }
        let s = Slot::from_raw(chosen)?.expect("non-zero");
        let a = slot_addr(s);
        let old_gen = match self.object_of(view, old)? {
            Some(o) => o.generation,
            None => 0,
        };
        let op = Op::from_u8(obj.log.op).unwrap_or(Op::Update);
        let rec = object::encode_commit(&Commit { old, old_gen }, obj.generation, op, a);
        let at = a.offset
            + object::log_offset(obj.key.len(), obj.value.len()) as u64
            + object::COMMIT_OFF as u64;
        let block = a.offset / view.block_size;
        for n in view.block_replicas(block) {
            let r = view.region(n).expect("a member");
            self.ep.write(TAG, r.at(at), &rec)?;
        }
        Ok(true)
    }

    /// What [`Master::run`] does when a client asks for a resync ([`crate::Client`]s do when
    /// a round or a verb cannot finish in their epoch), for masters driven in-process: asks
    /// every member; when all answer, in the current epoch, and one of them carries a
    /// client's request for it, fences and repairs the members in a new epoch. `None` when
    /// nobody asked (or a member did not answer: failing it over repairs as well).
    pub fn resync_if_asked(&self) -> Result<Option<FailoverReport>> {
        let m = self.membership();
        if m.repairing {
            return Ok(None);
        }
        let mut asked = false;
        for (n, _) in &m.members {
            let Ok(q) = membership::query(&self.ep, *n) else {
                return Ok(None);
            };
            asked |= q.resync.is_some_and(|(e, _)| e == m.epoch);
        }
        if !asked {
            return Ok(None);
        }
        metrics::counter!("dmkit_fusee_resyncs_total").increment(1);
        self.fail_over(&[]).map(Some)
    }

    /// Refills `node` (restarted, on its old pool or a new one) and makes it a member again.
    pub fn rejoin(&self, node: NodeId) -> Result<RejoinReport> {
        let _one = self.change.lock();
        let t = Instant::now();
        let old = self.membership();
        if old.is_member(node) {
            return Err(Error::Membership(format!(
                "memory node {node} is a member already"
            )));
        }
        if !self.nodes.contains(&node) {
            return Err(Error::Membership(format!(
                "memory node {node} is not in the cluster file"
            )));
        }
        // Fence the members (writes stop) and the newcomer (nobody uses it yet).
        let members_before: Vec<NodeId> = old.members.iter().map(|(n, _)| *n).collect();
        let mut members = self.fence(&members_before)?;
        let fresh = self.fence(&[node])?;
        let repairing = old.next(true, members.clone());
        self.publish(&repairing)?;
        // The newcomer accepts the master's refill (under an rkey only the master knows).
        let reply = self.master_rpc(node, Request::SetFenced { fenced: 0 }.to_bytes())?;
        if reply.first() != Some(&status::OK) {
            return Err(Error::Node {
                node,
                reason: "refused to be refilled".into(),
            });
        }
        let view = cluster::open_at(&self.ep, &self.nodes, &repairing)?;
        // The fence cut rounds short on the members: finish them before copying the index.
        let primary = self.index_primary(&repairing)?;
        let (_, _, deletes) = self.repair_index(&view, primary)?;
        let target = {
            let mut r = cluster::pool_region(&self.ep, node)?;
            r.rkey = fresh[0].1;
            r
        };
        let bs = view.block_size;
        let mut rep = RejoinReport {
            node,
            ..Default::default()
        };
        // The block table: every block the newcomer replicates, owned as on its source.
        let mut tables: HashMap<NodeId, HashMap<u64, u64>> = HashMap::new();
        for n in &members_before {
            tables.insert(*n, self.block_table(*n)?);
        }
        let mine = self.block_table(node).unwrap_or_default();
        let index_holder = view.index_holders().contains(&node);
        let block_count = self.block_count(node)?;
        let mut copy: Vec<(u64, NodeId)> = Vec::new();
        for b in 0..block_count {
            // (the source replica, whether the newcomer replicates this block at all)
            let (source, replicated) = if b == 0 || (index_holder && b <= view.index_blocks) {
                // The superblock and (for index holders) the index: from the index primary.
                (view.index_spaces().first().map(|s| s.region.node), true)
            } else if b <= view.index_blocks {
                // Index blocks of a node that holds no index replica: reserved, not copied.
                (None, false)
            } else {
                let reps = view.all_block_replicas(b);
                let src = reps.iter().copied().find(|n| view.is_member(*n));
                (src, reps.contains(&node))
            };
            let want = match source {
                Some(src) if replicated => tables[&src].get(&b).copied(),
                // No serving replica: the newcomer's own copy is the only one; keep it.
                None if replicated => continue,
                _ if b <= view.index_blocks => tables.values().find_map(|t| t.get(&b).copied()),
                _ => None,
            };
            let have = mine.get(&b).copied();
            if want != have {
                self.set_block(node, b, want)?;
            }
            if let (Some(src), Some(_), true) = (source, want, replicated) {
                copy.push((b, src));
            }
        }
        let ring_after = |n: NodeId| n == node || view.is_member(n);
        // Progress for the operator: the copy is the long part of a refill (a line when it
        // starts, then one a second).
        let total = copy.len();
        tracing::info!(
            node = node.0,
            blocks = total,
            "refilling memory node {node}: copying {total} blocks ({} MiB) from its replicas",
            (total as u64 * bs) >> 20
        );
        let mut said = Instant::now();
        for (done, (b, src)) in copy.into_iter().enumerate() {
            if said.elapsed() >= Duration::from_secs(1) {
                said = Instant::now();
                tracing::info!(
                    node = node.0,
                    "refilling memory node {node}: {done} of {total} blocks copied ({}%)",
                    done * 100 / total.max(1)
                );
            }
            let from = view.region(src).expect("a member").at(b * bs);
            let data = self.ep.read(TAG, from, bs as usize)?;
            self.ep.write(TAG, target.at(b * bs), &data)?;
            rep.blocks_copied += 1;
            rep.bytes_copied += bs;
            // A block's free bitmap lives on its acting primary only (frees land there, the
            // owner reclaims from there): the other replicas' copies must be empty, or a
            // later switch of acting primary would reclaim objects a second time.
            if b > view.index_blocks
                && let Ok(Some((class, _))) = slabs::decode_block_header(&data)
            {
                let g = crate::alloc::BlockGeometry::new(bs, class);
                let zero = vec![0u8; g.bitmap_len()];
                let reps: Vec<NodeId> = view
                    .all_block_replicas(b)
                    .into_iter()
                    .filter(|n| ring_after(*n))
                    .collect();
                for m in reps.iter().skip(1) {
                    let at = if *m == node {
                        target.at(b * bs + crate::alloc::BLOCK_HEADER)
                    } else {
                        view.region(*m)
                            .expect("a member")
                            .at(b * bs + crate::alloc::BLOCK_HEADER)
                    };
                    self.ep.write(TAG, at, &zero)?;
                }
            }
        }
        // The newcomer serves again, in ring order.
        members.push(fresh[0]);
        members.sort_by_key(|(n, _)| self.nodes.iter().position(|x| x == n));
        let mut active = repairing.next(false, members);
        active.remember_deletes(deletes);
        self.publish(&active)?;
        rep.epoch = active.epoch;
        rep.took = t.elapsed();
        tracing::info!(?rep, "memory node rejoined");
        metrics::counter!("dmkit_fusee_rejoins_total").increment(1);
        Ok(rep)
    }

    /// A request that changes `node`, sent under this master's claim (see
    /// [`MasterOptions::claim_token`]); a refusal because another master holds the cluster
    /// is an error naming it.
    /// Whether this master may act now (see [`MasterOptions::acting`]).
    fn may_act(&self) -> bool {
        (self.acting.as_ref()).is_none_or(|a| a.load(std::sync::atomic::Ordering::Acquire))
    }

    fn master_rpc(&self, node: NodeId, req: Vec<u8>) -> Result<Vec<u8>> {
        if !self.may_act() {
            return Err(Error::Node {
                node,
                reason: "this master stepped down (its claim on the cluster ran out): it \
                         changes nothing until it holds the claim again"
                    .into(),
            });
        }
        let reply = self
            .ep
            .rpc(TAG, node, &crate::memnode::as_master(self.token, req))?;
        if let (Some(_), Some((&status::REFUSED, rest))) = (self.token, reply.split_first()) {
            return Err(Error::Node {
                node,
                reason: crate::memnode::refusal(rest, "refused this master"),
            });
        }
        Ok(reply)
    }

    /// The memory nodes' block services, as the master asks them.
    fn blocks(&self) -> BlockClient<'_> {
        BlockClient::new(&self.ep, TAG)
    }

    fn block_count(&self, node: NodeId) -> Result<u64> {
        let (_, count, _) = self
            .blocks()
            .stat(node)
            .map_err(|e| Error::block(node, e))?;
        Ok(count)
    }

    fn block_table(&self, node: NodeId) -> Result<HashMap<u64, u64>> {
        let table = self.blocks().block_table(node);
        Ok(table
            .map_err(|e| Error::block(node, e))?
            .into_iter()
            .collect())
    }

    /// Makes `owner` the owner of `block` on `node` (under this master's claim).
    fn set_block(&self, node: NodeId, block: u64, owner: Option<u64>) -> Result<()> {
        let req = BlockRequest::SetBlock {
            block,
            owner: owner.unwrap_or(NO_OWNER),
        };
        let reply = self.master_rpc(node, req.encode())?;
        remote::decode_ok(&reply).map_err(|e| Error::block(node, e.into()))
    }

    /// Runs the failure detector until `stop` is set: heartbeats every node (a task of its
    /// own on the I/O runtime, so leases stay fresh during a repair), fails over members silent for
    /// `miss_limit` heartbeats, refills restarted nodes.
    pub fn run(self: &Arc<Self>, cfg: MasterConfig, stop: Arc<std::sync::atomic::AtomicBool>) {
        // A member silent for `miss_limit` heartbeats, or answering without its membership
        // record (restarted before it was missed: out, then back in, refilled), has failed; a
        // non-member heard within three heartbeats is back.
        let detector = Arc::new(FailureDetector::new(
            SystemClock::new(),
            cfg.heartbeat * cfg.miss_limit,
            cfg.heartbeat * 3,
        ));
        // Members that said, in a heartbeat of the current epoch, that they fenced
        // themselves (their lease ran out: no heartbeat and no majority vouching in time).
        let fenced: Arc<Mutex<Vec<NodeId>>> = Arc::default();
        // A resync a client asked for in the current epoch (through a member's answer), and
        // when each node last answered (a resync waits until every member answers: with one
        // silent, the failure detector's failover comes first and repairs as well).
        let resync: Arc<Mutex<Option<(u64, String)>>> = Arc::default();
        let answered: Arc<Mutex<HashMap<NodeId, Instant>>> = Arc::default();
        let mut last_resync: Option<Instant> = None;
        // One ticker paces every heartbeat (one timer wake-up per beat for the whole
        // cluster, not one per node: on an emulated guest each costs a slow clock read) and
        // is the runtime's pulse (below).
        let (tick_tx, tick_rx) = tokio::sync::watch::channel(0u64);
        // Heartbeats: a task per node on the I/O runtime, apart from this loop (leases stay
        // fresh during a repair) and from each other (a node cut off, whose probe waits out
        // its timeout, delays no other node's: in lockstep rounds one node partitioned for a
        // second cost every node its lease and every member was declared dead). Each beats
        // at every tick it is free for.
        let beats: Vec<_> = self
            .nodes
            .iter()
            .map(|&n| {
                let (m, detector, stop) = (self.clone(), detector.clone(), stop.clone());
                let (fenced, resync, answered) = (fenced.clone(), resync.clone(), answered.clone());
                let mut tick = tick_rx.clone();
                dmkit_verbs::runtime::io_runtime().spawn(async move {
                    let req = m.heartbeat_request();
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        // A master that stepped down renews nobody's lease.
                        if !m.may_act() {
                            if tick.changed().await.is_err() {
                                return;
                            }
                            continue;
                        }
                        if let Ok(q) = m.ask(n, &req).await {
                            let epoch = q.record.as_ref().map_or(0, |r| r.epoch);
                            detector.heard(n, epoch == 0);
                            answered.lock().insert(n, Instant::now());
                            let now = m.membership();
                            if let Some((e, why)) = q.resync {
                                if e == now.epoch && !now.repairing && now.is_member(n) {
                                    *resync.lock() = Some((e, why));
                                }
                            }
                            if q.fenced && epoch == now.epoch && now.is_member(n) {
                                let mut f = fenced.lock();
                                if !f.contains(&n) {
                                    f.push(n);
                                }
                            }
                        }
                        // (A beat that outlasted its tick beats again at once, as before.)
                        if tick.changed().await.is_err() {
                            return;
                        }
                    }
                })
            })
            .collect();
        drop(tick_rx);
        // The I/O runtime's pulse: when it last ran a task of ours, the time it ran late and
        // not yet excused, and how much of its current lateness was already excused. A
        // runtime held off the CPU — an overloaded host, or busy tasks on the same runtime —
        // runs the heartbeat tasks late and reads the answers late: that time is no member's
        // silence.
        let pulse: Arc<Mutex<Pulse>> = Arc::new(Mutex::new(Pulse::new()));
        let beat = {
            let (pulse, stop, hb) = (pulse.clone(), stop.clone(), cfg.heartbeat);
            dmkit_verbs::runtime::io_runtime().spawn(async move {
                let mut n = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    // (The runtime's own timer: the verbs timer thread stays asleep in an
                    // idle master — heartbeats' deadlines are disarmed before they fall due.)
                    tokio::time::sleep(hb).await;
                    pulse.lock().beat(hb);
                    n += 1;
                    tick_tx.send_replace(n);
                }
                // (Dropping the sender ends the heartbeat tasks' waits.)
            })
        };
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            std::thread::sleep(cfg.heartbeat);
            let stall = pulse.lock().stall(cfg.heartbeat);
            if !stall.is_zero() {
                tracing::debug!(
                    stall_ms = stall.as_millis() as u64,
                    "heartbeats ran late (the master was held off the CPU): not counted as silence"
                );
                detector.excuse(stall);
            }
            let m = self.membership();
            let Verdict { failed: dead, back } =
                detector.verdict(self.nodes.iter().copied(), |n| m.is_member(*n));
            let self_fenced: Vec<NodeId> = std::mem::take(&mut *fenced.lock());
            let asked = {
                let mut want = resync.lock();
                if want.as_ref().is_some_and(|(e, _)| *e != m.epoch) {
                    *want = None;
                }
                // Every member answered lately, and not more than one resync a second
                // (clients of one stuck epoch all ask: one repair serves them all).
                let all_heard = {
                    let heard = answered.lock();
                    let fresh = (cfg.heartbeat * 3).max(Duration::from_millis(300));
                    m.members
                        .iter()
                        .all(|(n, _)| heard.get(n).is_some_and(|t| t.elapsed() <= fresh))
                };
                let calm = last_resync.is_none_or(|t| t.elapsed() >= Duration::from_secs(1));
                match want.as_ref() {
                    Some(_) if all_heard && calm => want.take(),
                    _ => None,
                }
            };
            if !dead.is_empty() {
                match self.fail_over(&dead) {
                    Ok(_) => dead.iter().for_each(|n| detector.forget(*n)),
                    Err(e) => tracing::error!(error = %e, ?dead, "failover failed; retrying"),
                }
            } else if let Some((epoch, why)) = asked {
                // A client cannot finish in this epoch although every member answers: a
                // SNAPSHOT round whose writer stopped midway (paused, cut off: its backups
                // split with nobody to finish it), or verbs lost on a live member whose fate
                // nobody can tell. Fencing with fresh rkeys stops whatever is still on its
                // way; the repair finishes or rolls back every round; clients settle.
                tracing::warn!(epoch, %why, "a client asked for a resync: fencing and repairing the members in a new epoch");
                metrics::counter!("dmkit_fusee_resyncs_total").increment(1);
                last_resync = Some(Instant::now());
                if let Err(e) = self.fail_over(&[]) {
                    tracing::error!(error = %e, "the resync failed; retrying when asked again");
                }
            } else if m.repairing || !self_fenced.is_empty() {
                // A repair left unfinished by an earlier master, while a member was silent
                // when this one started (it answers again); or members that fenced themselves
                // and refuse every client of this epoch (a heartbeat does not lift a lease's
                // fence: only a newer membership does): redo the repair over the members,
                // which publishes the next epoch.
                if !self_fenced.is_empty() {
                    tracing::warn!(
                        nodes = ?self_fenced.iter().map(|n| n.0).collect::<Vec<_>>(),
                        epoch = m.epoch,
                        "members fenced themselves (their lease ran out): resuming them in a new epoch"
                    );
                }
                if let Err(e) = self.fail_over(&[]) {
                    tracing::error!(error = %e, "repairing over the members failed; retrying");
                }
            } else if cfg.auto_rejoin {
                for n in back {
                    if let Err(e) = self.rejoin(n) {
                        tracing::error!(error = %e, node = %n, "rejoin failed; retrying");
                    }
                }
            }
        }
        for beat in beats.into_iter().chain([beat]) {
            let _ = dmkit_verbs::block_on(beat);
        }
    }
}

/// When the master's I/O runtime last ran its pulse task, and how late it has run: what the
/// failure detector excuses ([`FailureDetector::excuse`]).
#[derive(Debug)]
struct Pulse {
    last: Instant,
    /// Lateness not yet excused.
    pending: Duration,
    /// How much of the lateness since `last` was already excused (while it was running).
    excused: Duration,
}

impl Pulse {
    fn new() -> Self {
        Self {
            last: Instant::now(),
            pending: Duration::ZERO,
            excused: Duration::ZERO,
        }
    }

    /// The pulse task ran (it meant to every `hb`): a gap of more than two beats was a stall.
    fn beat(&mut self, hb: Duration) {
        let now = Instant::now();
        let late = now.saturating_duration_since(self.last).saturating_sub(hb);
        if late > hb {
            self.pending += late.saturating_sub(self.excused);
        }
        self.last = now;
        self.excused = Duration::ZERO;
    }

    /// The stall to excuse now: what the pulse reported, and — while it is overdue by more
    /// than a beat right now — the part of its current lateness not excused yet.
    fn stall(&mut self, hb: Duration) -> Duration {
        let late = self.last.elapsed().saturating_sub(hb);
        let ongoing = if late > hb {
            late.saturating_sub(self.excused)
        } else {
            Duration::ZERO
        };
        self.excused += ongoing;
        std::mem::take(&mut self.pending) + ongoing
    }
}
