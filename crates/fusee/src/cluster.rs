//! The cluster: which memory nodes, how many index and data replicas, and where everything
//! lives in each node's pool. Formatted once (by the master, or `Cluster::format` in tests);
//! every client reads the superblock when it joins.
//!
//! Each node's pool data area:
//!
//! | blocks | what |
//! |---|---|
//! | 0 | the cluster superblock (owner [`SUPER_OWNER`]) |
//! | 1 ..= K | this node's index replica space, if it holds one (owner [`INDEX_OWNER`]) |
//! | K+1 .. | data blocks, striped over the nodes (see [`crate::memnode`]) |

use dmkit_kv_index::{IndexConfig, IndexReplicaSpace, RaceIndex};
use dmkit_pmem_pool::MAX_OWNER;
use dmkit_verbs::wire::{Reader, Writer};
use dmkit_verbs::{Endpoint, NodeId, RKey, RegionDesc, RemoteAddr};

use crate::error::{Error, Result};
use crate::memnode::POOL_BASE;
use dmkit_pmem_pool::remote::{BlockClient, BlockRequest};

/// A block's replicas (a handful: held inline, no allocation on an operation's path).
pub type Replicas<T> = smallvec::SmallVec<[T; 4]>;

/// Owner id of block 0 (the superblock) in every node's block table.
pub const SUPER_OWNER: u64 = MAX_OWNER;
/// Owner id of the index blocks.
pub const INDEX_OWNER: u64 = MAX_OWNER - 1;
/// Client ids must be below this.
pub const MAX_CLIENT_ID: u64 = MAX_OWNER - 2;

const MAGIC: u64 = u64::from_le_bytes(*b"FUSEEcl1");
/// 2: the superblock carries the cluster's uuid (v1 had none, so two clusters with the same
/// node ids could not be told apart).
const VERSION: u32 = 2;
pub(crate) const TAG: &str = "fusee_cluster";

/// The shape of a cluster, fixed at format time.
#[derive(Debug, Clone)]
pub struct ClusterConfig {
    /// The memory nodes, in ring order.
    pub nodes: Vec<NodeId>,
    /// Index replicas (on the first `index_replicas` nodes), 1..=5.
    pub index_replicas: usize,
    /// Data replicas of every KV object, 1..=number of nodes.
    pub data_replicas: usize,
    /// Bytes reserved for each index replica (rounded up to whole blocks).
    pub index_bytes: u64,
    /// Index geometry.
    pub index: IndexConfig,
}

impl ClusterConfig {
    pub fn new(nodes: Vec<NodeId>, index_replicas: usize, data_replicas: usize) -> Self {
        Self {
            nodes,
            index_replicas,
            data_replicas,
            index_bytes: 16 << 20,
            index: IndexConfig {
                groups_per_subtable_log2: 8,
                max_global_depth: 12,
                ..IndexConfig::default()
            },
        }
    }

    pub fn validate(&self) -> Result<()> {
        let n = self.nodes.len();
        let bad = |m: String| Err(Error::Config(m));
        if n == 0 {
            return bad("a cluster needs at least one memory node".into());
        }
        if !(1..=5).contains(&self.index_replicas) || self.index_replicas > n {
            return bad(format!(
                "index_replicas = {} must be within 1..=5 and at most the {n} memory nodes",
                self.index_replicas
            ));
        }
        if self.data_replicas == 0 || self.data_replicas > n {
            return bad(format!(
                "data_replicas = {} must be within 1..={n} (the memory nodes)",
                self.data_replicas
            ));
        }
        let mut ids = self.nodes.clone();
        ids.sort();
        ids.dedup();
        if ids.len() != n {
            return bad("memory node ids must be distinct".into());
        }
        if self.nodes.iter().any(|id| id.0 > 255) {
            return bad("memory node ids must be below 256 (index slots hold 8 bits)".into());
        }
        Ok(())
    }
}

/// What a client knows of the cluster after reading the superblock.
#[derive(Debug, Clone)]
pub struct ClusterView {
    /// Every memory node of the cluster, in ring order (as formatted).
    pub nodes: Vec<NodeId>,
    /// The serving ones (see [`crate::membership`]), in ring order.
    pub members: Vec<NodeId>,
    /// The membership epoch this view belongs to.
    pub epoch: u64,
    /// The cluster's uuid (from the superblock).
    pub uuid: u128,
    /// The membership is being repaired: writes wait for the next epoch.
    pub repairing: bool,
    /// DELETE rounds the master completed in its repairs (see
    /// [`crate::membership::Membership::deletes`]).
    pub deletes: Vec<(u64, u64, u64)>,
    /// Failover epochs whose repair saw no index backup (see
    /// [`crate::membership::Membership::blind`]).
    pub blind: Vec<u64>,
    /// Epochs of failovers that lost the index primary (see
    /// [`crate::membership::Membership::primary_lost`]).
    pub primary_lost: Vec<u64>,
    pub index_replicas: usize,
    pub data_replicas: usize,
    pub block_size: u64,
    pub index_blocks: u64,
    /// Each member's pool region (with the rkey of this epoch).
    pub regions: Vec<RegionDesc>,
}

impl ClusterView {
    /// The first data block id.
    pub fn first_data_block(&self) -> u64 {
        1 + self.index_blocks
    }

    /// The node at ring position `pos`.
    pub fn node_at(&self, pos: usize) -> NodeId {
        self.nodes[pos % self.nodes.len()]
    }

    /// Ring position of `node`.
    pub fn position(&self, node: NodeId) -> Option<usize> {
        self.nodes.iter().position(|n| *n == node)
    }

    /// The region of `node`, if it is a member.
    pub fn region(&self, node: NodeId) -> Option<RegionDesc> {
        self.regions.iter().find(|r| r.node == node).copied()
    }

    /// Whether `node` serves in this view.
    pub fn is_member(&self, node: NodeId) -> bool {
        self.members.contains(&node)
    }

    /// Every data replica of block `b` as formatted (its primary first), members or not.
    pub fn all_block_replicas(&self, b: u64) -> Replicas<NodeId> {
        let n = self.nodes.len() as u64;
        (0..self.data_replicas as u64)
            .map(|i| self.node_at(((b % n) + i) as usize))
            .collect()
    }

    /// The serving data replicas of block `b`: its acting primary (the first serving one)
    /// first. Empty when every replica is down.
    pub fn block_replicas(&self, b: u64) -> Replicas<NodeId> {
        self.all_block_replicas(b)
            .into_iter()
            .filter(|n| self.is_member(*n))
            .collect()
    }

    /// Where the data at `offset` that `node` holds (an object, a block's bitmap) is served:
    /// on `node` itself while it is a member, else on its block's acting primary (replicas
    /// hold a block at the same offset). `None` when no replica serves it.
    pub fn acting(&self, node: NodeId, offset: u64) -> Option<RemoteAddr> {
        if let Some(r) = self.region(node) {
            return Some(r.at(offset));
        }
        let b = offset / self.block_size.max(1);
        let n = *self.block_replicas(b).first()?;
        self.region(n).map(|r| r.at(offset))
    }

    /// `offset` on its block's acting primary (its first serving replica): where the block's
    /// free bitmap is kept — frees land there, the owner reclaims from there.
    pub fn block_acting(&self, offset: u64) -> Option<RemoteAddr> {
        let b = offset / self.block_size.max(1);
        let n = *self.block_replicas(b).first()?;
        self.region(n).map(|r| r.at(offset))
    }

    /// The node index replica `i` lives on (the first `index_replicas` nodes hold one each).
    pub fn index_holders(&self) -> &[NodeId] {
        &self.nodes[..self.index_replicas.min(self.nodes.len())]
    }

    /// The serving index replica spaces, primary first.
    pub fn index_spaces(&self) -> Vec<IndexReplicaSpace> {
        self.index_holders()
            .iter()
            .filter_map(|n| self.region(*n))
            .map(|region| IndexReplicaSpace {
                region,
                offset: self.block_size,
                len: self.index_blocks * self.block_size,
            })
            .collect()
    }
}

/// The pool region of FUSEE memory node `node`, found by its name.
pub(crate) fn pool_region(ep: &Endpoint, node: NodeId) -> Result<RegionDesc> {
    ep.region_named(node, crate::memnode::POOL_REGION)
        .map_err(|e| match e {
            dmkit_verbs::Error::InvalidArgument(_) => Error::Node {
                node,
                reason: "not a FUSEE memory node (no pool region)".into(),
            },
            e => e.into(),
        })
}

/// A fresh random cluster uuid (never zero): a pool's kind of uuid.
fn new_uuid() -> u128 {
    u128::from_be_bytes(dmkit_pmem_pool::PoolUuid::random().0)
}

fn encode_super(cfg: &ClusterConfig, uuid: u128, block_size: u64, index_blocks: u64) -> Vec<u8> {
    let mut w = Writer::new()
        .u64(MAGIC)
        .u32(VERSION)
        .u64((uuid >> 64) as u64)
        .u64(uuid as u64)
        .u16(cfg.nodes.len() as u16)
        .u8(cfg.index_replicas as u8)
        .u8(cfg.data_replicas as u8)
        .u64(block_size)
        .u64(index_blocks);
    for n in &cfg.nodes {
        w = w.u16(n.0);
    }
    let mut b = w.finish();
    let crc = crc32c::crc32c(&b);
    b.extend_from_slice(&crc.to_le_bytes());
    b
}

/// Formats a fresh cluster over the nodes `ep` is connected to: reserves the superblock and
/// index blocks on every node, formats the index, then writes the superblocks (durably, last).
pub fn format(ep: &Endpoint, cfg: &ClusterConfig) -> Result<ClusterView> {
    cfg.validate()?;
    let blocks = BlockClient::new(ep, TAG);
    let mut block_size = 0;
    for node in &cfg.nodes {
        let (bs, _, _) = blocks.stat(*node).map_err(|e| Error::block(*node, e))?;
        if block_size != 0 && bs != block_size {
            return Err(Error::Config(format!(
                "memory node {node} has {bs}-byte blocks, others {block_size}: pools must share a block size"
            )));
        }
        block_size = bs;
    }
    let index_blocks = cfg.index_bytes.div_ceil(block_size).max(1);
    for node in &cfg.nodes {
        let reserve = |owner: u64, first: u64, count: u64| {
            let req = BlockRequest::Reserve {
                owner,
                first,
                count,
            };
            blocks.done(*node, &req).map_err(|e| Error::block(*node, e))
        };
        reserve(SUPER_OWNER, 0, 1)?;
        reserve(INDEX_OWNER, 1, index_blocks)?;
    }
    let uuid = new_uuid();
    let view = ClusterView {
        nodes: cfg.nodes.clone(),
        members: cfg.nodes.clone(),
        epoch: 0,
        uuid,
        repairing: false,
        deletes: Vec::new(),
        blind: Vec::new(),
        primary_lost: Vec::new(),
        index_replicas: cfg.index_replicas,
        data_replicas: cfg.data_replicas,
        block_size,
        index_blocks,
        regions: cfg
            .nodes
            .iter()
            .map(|n| pool_region(ep, *n))
            .collect::<Result<_>>()?,
    };
    RaceIndex::format(ep, &cfg.index, &view.index_spaces())?;
    let sb = encode_super(cfg, uuid, block_size, index_blocks);
    let batches = view
        .regions
        .iter()
        .map(|r| {
            let mut b = ep.batch(r.node);
            b.write_durable(r.at(0), &sb);
            b
        })
        .collect();
    for r in ep.execute_many(TAG, batches) {
        r?;
    }
    Ok(view)
}

/// Reads the superblock of every node that answers, checks that they all belong to one
/// cluster (the same uuid and shape: a node formatted as part of another cluster, or not
/// formatted while the others are, is an error) and that it names exactly `nodes`.
pub fn open(ep: &Endpoint, nodes: &[NodeId]) -> Result<ClusterView> {
    let membership = crate::membership::newest(ep, nodes)?;
    open_at(ep, nodes, &membership)
}

/// [`open`], going on without the members that do not answer (see [`open_at_tolerant`]).
pub fn open_tolerant(ep: &Endpoint, nodes: &[NodeId]) -> Result<ClusterView> {
    let membership = crate::membership::newest(ep, nodes)?;
    open_at_tolerant(ep, nodes, &membership)
}

/// [`open`] with a known membership: reads the superblocks of its members only. Every
/// member must answer (the error of the last that does not): a client works only in
/// epochs whose members it reaches, and waits for the master's next one otherwise.
pub fn open_at(
    ep: &Endpoint,
    nodes: &[NodeId],
    membership: &crate::membership::Membership,
) -> Result<ClusterView> {
    open_members(ep, nodes, membership, false)
}

/// [`open_at`], except that a member that does not answer does not stop the open: its region is taken from the
/// membership (pools are registered at [`POOL_BASE`], and the membership carries each
/// member's rkey), a warning names it, and every operation that needs it fails with its
/// error while those that do not go on (a SEARCH whose index primary and object live
/// elsewhere; the master's failure detector, which then fails it over). At least one
/// member must answer. For a master starting with members down, and a reader that must
/// not wait for the failover of a member it alone cannot reach.
pub fn open_at_tolerant(
    ep: &Endpoint,
    nodes: &[NodeId],
    membership: &crate::membership::Membership,
) -> Result<ClusterView> {
    open_members(ep, nodes, membership, true)
}

fn open_members(
    ep: &Endpoint,
    nodes: &[NodeId],
    membership: &crate::membership::Membership,
    tolerant: bool,
) -> Result<ClusterView> {
    let region_of = |node: NodeId| -> Result<RegionDesc> {
        let mut r = pool_region(ep, node)?;
        if let Some(k) = membership.rkey(node) {
            r.rkey = k;
        }
        Ok(r)
    };
    // (node, its region, its superblock) of the nodes that answered; None = no superblock.
    let mut seen: Vec<(NodeId, RegionDesc, Option<Super>)> = Vec::new();
    // Members that did not answer, with why.
    let mut silent: Vec<(NodeId, Error)> = Vec::new();
    for node in nodes.iter().filter(|n| membership.is_member(**n)) {
        let region = match region_of(*node) {
            Ok(r) => r,
            Err(e) => {
                silent.push((*node, e));
                continue;
            }
        };
        let raw = match ep.read(TAG, region.at(0), 4096) {
            Ok(b) => b,
            Err(e) => {
                silent.push((*node, Error::from(e)));
                continue;
            }
        };
        match decode_super(&raw) {
            Ok(sb) => seen.push((*node, region, Some(sb))),
            Err(SuperError::Missing) => seen.push((*node, region, None)),
            Err(SuperError::Bad(m)) => {
                return Err(Error::Cluster(format!(
                    "memory node {node}: {m} (is the cluster formatted?)"
                )));
            }
        }
    }
    // (The last error, as the superblocks were read: a node that answers but refuses, e.g.
    // fenced, comes after those that do not answer in ring order only by chance; keep the
    // order callers have always seen.)
    if !tolerant {
        if let Some((_, e)) = silent.pop() {
            return Err(e);
        }
    }
    let Some((first_node, _, _)) = seen.first() else {
        return Err(match silent.pop() {
            Some((_, e)) => e,
            None => Error::Cluster("no memory nodes".into()),
        });
    };
    let formatted: Vec<_> = seen
        .iter()
        .filter_map(|(n, _, sb)| sb.as_ref().map(|sb| (*n, sb)))
        .collect();
    let Some(&(ref_node, sb)) = formatted.first() else {
        return Err(Error::Cluster(format!(
            "memory node {first_node}: no FUSEE superblock (is the cluster formatted?)"
        )));
    };
    if let Some((blank, _, _)) = seen.iter().find(|(_, _, sb)| sb.is_none()) {
        return Err(Error::Cluster(format!(
            "memory node {blank} is not formatted but memory node {ref_node} belongs to cluster {:032x}: \
             the cluster file mixes memory nodes of different clusters (or a node lost its pool)",
            sb.uuid
        )));
    }
    for (n, other) in &formatted[1..] {
        if other.uuid != sb.uuid {
            return Err(Error::Cluster(format!(
                "memory node {n} belongs to cluster {:032x}, memory node {ref_node} to cluster {:032x}: \
                 the cluster file mixes memory nodes of different clusters",
                other.uuid, sb.uuid
            )));
        }
        if *other != sb {
            return Err(Error::Cluster(format!(
                "memory nodes {ref_node} and {n} of cluster {:032x} disagree on its shape (corrupt superblock?)",
                sb.uuid
            )));
        }
    }
    let sb = sb.clone();
    let mut a = sb.nodes.clone();
    let mut b = nodes.to_vec();
    a.sort();
    b.sort();
    if a != b {
        return Err(Error::Cluster(format!(
            "the cluster was formatted with memory nodes {:?}, not {nodes:?}",
            sb.nodes
        )));
    }
    let members: Vec<NodeId> = sb
        .nodes
        .iter()
        .copied()
        .filter(|n| membership.is_member(*n))
        .collect();
    // A silent member's region as the others' (same base, and the size of the largest: the
    // node checks bounds itself), with the membership's rkey (0 before the first epoch: its
    // verbs fail with a protection error, as they fail anyway while it does not answer).
    let like = seen[0].1;
    let len = seen.iter().map(|(_, r, _)| r.len).max().unwrap_or(like.len);
    let regions = members
        .iter()
        .map(|n| match seen.iter().find(|(m, _, _)| m == n) {
            Some((_, r, _)) => *r,
            None => {
                if let Some((_, e)) = silent.iter().find(|(m, _)| m == n) {
                    tracing::debug!(node = n.0, error = %e, "memory node {n} does not answer; going on without it");
                }
                RegionDesc {
                    node: *n,
                    rkey: membership.rkey(*n).unwrap_or(RKey(0)),
                    base: POOL_BASE,
                    len,
                    ..like
                }
            }
        })
        .collect();
    Ok(ClusterView {
        regions,
        members,
        epoch: membership.epoch,
        uuid: sb.uuid,
        repairing: membership.repairing,
        deletes: membership.deletes.clone(),
        blind: membership.blind.clone(),
        primary_lost: membership.primary_lost.clone(),
        nodes: sb.nodes,
        index_replicas: sb.index_replicas,
        data_replicas: sb.data_replicas,
        block_size: sb.block_size,
        index_blocks: sb.index_blocks,
    })
}

/// A decoded superblock.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Super {
    uuid: u128,
    nodes: Vec<NodeId>,
    index_replicas: usize,
    data_replicas: usize,
    block_size: u64,
    index_blocks: u64,
}

#[derive(Debug)]
enum SuperError {
    /// No FUSEE superblock at all (a fresh pool).
    Missing,
    Bad(String),
}

fn decode_super(b: &[u8]) -> std::result::Result<Super, SuperError> {
    let mut r = Reader::new(b);
    let bad = |e: dmkit_verbs::wire::WireError| SuperError::Bad(e.to_string());
    if r.u64().map_err(bad)? != MAGIC {
        return Err(SuperError::Missing);
    }
    let v = r.u32().map_err(bad)?;
    if v != VERSION {
        return Err(SuperError::Bad(format!(
            "superblock version {v}, this build reads {VERSION}"
        )));
    }
    let hi = r.u64().map_err(bad)?;
    let lo = r.u64().map_err(bad)?;
    let n = r.u16().map_err(bad)? as usize;
    let ir = r.u8().map_err(bad)? as usize;
    let dr = r.u8().map_err(bad)? as usize;
    let bs = r.u64().map_err(bad)?;
    let ib = r.u64().map_err(bad)?;
    let mut nodes = Vec::with_capacity(n);
    for _ in 0..n {
        nodes.push(NodeId(r.u16().map_err(bad)?));
    }
    let used = b.len() - r.remaining();
    let crc = r.u32().map_err(bad)?;
    if crc != crc32c::crc32c(&b[..used]) {
        return Err(SuperError::Bad("superblock checksum mismatch".into()));
    }
    Ok(Super {
        uuid: u128::from(hi) << 64 | u128::from(lo),
        nodes,
        index_replicas: ir,
        data_replicas: dr,
        block_size: bs,
        index_blocks: ib,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn superblock_round_trips_with_a_fresh_uuid() {
        let cfg = ClusterConfig::new(vec![NodeId(0), NodeId(1), NodeId(2)], 3, 2);
        let (u1, u2) = (new_uuid(), new_uuid());
        assert_ne!(u1, u2, "two formats get two uuids");
        let mut raw = encode_super(&cfg, u1, 65536, 4);
        raw.resize(4096, 0);
        let sb = decode_super(&raw).unwrap();
        assert_eq!(sb.uuid, u1);
        assert_eq!(sb.nodes, cfg.nodes);
        assert_eq!((sb.index_replicas, sb.data_replicas), (3, 2));
        assert_eq!((sb.block_size, sb.index_blocks), (65536, 4));
        raw[20] ^= 1;
        assert!(matches!(decode_super(&raw), Err(SuperError::Bad(_))));
        assert!(matches!(decode_super(&[0u8; 64]), Err(SuperError::Missing)));
    }
}
