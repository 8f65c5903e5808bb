//! Cluster membership: which memory nodes serve, at which epoch, with which rkeys.
//!
//! The master publishes a [`Membership`] record to every member memory node (by RPC, so it is
//! readable whatever the rkeys are); clients read it from the nodes, so a client can join and
//! keep serving while the master is down. Epoch 0 means "no record published yet": every node
//! of the superblock serves with the rkey it announced at connect.
//!
//! A failover or rejoin goes through two records: first `repairing` (the members' pool
//! regions got fresh rkeys, so every client still holding the old ones is cut off at once —
//! the fence — and learns the new epoch on its next attempt; writes wait, SEARCH may read the
//! backups), then `active` once the index is repaired.

use dmkit_verbs::wire::{Reader, Wire, WireError, Writer};
use dmkit_verbs::{Endpoint, NodeId, RKey};

use crate::memnode::{Request, status};

const MAGIC: u32 = u32::from_le_bytes(*b"FMb3");
/// The record before `primary_lost` (read, never written).
const MAGIC_V2: u32 = u32::from_le_bytes(*b"FMb2");

/// How many completed DELETE rounds a record remembers.
pub const DELETES_KEPT: usize = 256;

/// Drops the oldest entries of a record's history past [`DELETES_KEPT`].
fn keep_newest<T>(v: &mut Vec<T>) {
    let excess = v.len().saturating_sub(DELETES_KEPT);
    v.drain(..excess);
}

/// One published membership.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Membership {
    /// The cluster's uuid (from its superblock; 0 in the unpublished epoch 0): a node of
    /// another cluster never passes for a member.
    pub cluster: u128,
    /// Increases with every change; 0 = nothing published (all nodes serve).
    pub epoch: u64,
    /// The index is being repaired or a node refilled: writes wait for the next epoch.
    pub repairing: bool,
    /// The serving memory nodes, in ring order, with their pool regions' current rkeys.
    pub members: Vec<(NodeId, RKey)>,
    /// DELETE rounds the master completed in repairs: (the epoch that published it, slot
    /// offset in the index space, the value the primary held, 0 if unknown), newest last, at
    /// most [`DELETES_KEPT`]. A DELETE
    /// has no commit record the master could write (its slot value points nowhere), so its
    /// writer, cut short, looks here to learn that its DELETE took effect.
    pub deletes: Vec<(u64, u64, u64)>,
    /// Epochs published by failovers whose repair saw no backup of the index (only the old
    /// primary survived): a round cut short before them may have committed without the
    /// master seeing it (its backups are gone). Newest last, at most [`DELETES_KEPT`].
    pub blind: Vec<u64>,
    /// Epochs published by failovers that lost the index primary (a backup took over, with
    /// its values): a DELETE cut short after its round had every backup took effect then,
    /// though the master never saw the value it replaced. Newest last, at most
    /// [`DELETES_KEPT`].
    pub primary_lost: Vec<u64>,
}

impl Membership {
    /// Whether `node` serves in this membership.
    pub fn is_member(&self, node: NodeId) -> bool {
        self.members.iter().any(|(n, _)| *n == node)
    }

    /// The record after this one (`epoch + 1`) serving `members`, with this one's history
    /// (the completed DELETE rounds, blind and primary-lost epochs).
    pub(crate) fn next(&self, repairing: bool, members: Vec<(NodeId, RKey)>) -> Membership {
        Membership {
            cluster: self.cluster,
            epoch: self.epoch + 1,
            repairing,
            members,
            deletes: self.deletes.clone(),
            blind: self.blind.clone(),
            primary_lost: self.primary_lost.clone(),
        }
    }

    /// Records that this record's epoch completed the DELETE rounds `new` (slot offset, value
    /// replaced) in a repair; the oldest go past [`DELETES_KEPT`].
    pub(crate) fn remember_deletes(&mut self, new: Vec<(u64, u64)>) {
        let epoch = self.epoch;
        self.deletes
            .extend(new.into_iter().map(|(off, v)| (epoch, off, v)));
        keep_newest(&mut self.deletes);
    }

    /// Records that this record's epoch was published by a failover that saw no backup of
    /// the index ([`Membership::blind`]).
    pub(crate) fn remember_blind(&mut self) {
        self.blind.push(self.epoch);
        keep_newest(&mut self.blind);
    }

    /// Records that this record's epoch was published by a failover that lost the index
    /// primary ([`Membership::primary_lost`]).
    pub(crate) fn remember_primary_lost(&mut self) {
        self.primary_lost.push(self.epoch);
        keep_newest(&mut self.primary_lost);
    }

    /// The rkey `node` serves its pool under.
    pub fn rkey(&self, node: NodeId) -> Option<RKey> {
        self.members
            .iter()
            .find(|(n, _)| *n == node)
            .map(|(_, k)| *k)
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::new()
            .u32(MAGIC)
            .u64((self.cluster >> 64) as u64)
            .u64(self.cluster as u64)
            .u64(self.epoch)
            .u8(u8::from(self.repairing))
            .u16(self.members.len() as u16);
        for (n, k) in &self.members {
            w = w.u16(n.0).u32(k.0);
        }
        w = w.u16(self.deletes.len() as u16);
        for (epoch, off, old) in &self.deletes {
            w = w.u64(*epoch).u64(*off).u64(*old);
        }
        w = w.u16(self.blind.len() as u16);
        for e in &self.blind {
            w = w.u64(*e);
        }
        w = w.u16(self.primary_lost.len() as u16);
        for e in &self.primary_lost {
            w = w.u64(*e);
        }
        let mut b = w.finish();
        let crc = crc32c::crc32c(&b);
        b.extend_from_slice(&crc.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8]) -> Result<Membership, WireError> {
        if b.len() < 4 || crc32c::crc32c(&b[..b.len() - 4]).to_le_bytes() != b[b.len() - 4..] {
            return Err(WireError("membership checksum"));
        }
        let mut r = Reader::new(&b[..b.len() - 4]);
        let magic = r.u32()?;
        if magic != MAGIC && magic != MAGIC_V2 {
            return Err(WireError("membership magic"));
        }
        let hi = r.u64()?;
        let lo = r.u64()?;
        let epoch = r.u64()?;
        let repairing = r.u8()? != 0;
        let n = r.u16()?;
        let mut members = Vec::with_capacity(usize::from(n));
        for _ in 0..n {
            members.push((NodeId(r.u16()?), RKey(r.u32()?)));
        }
        let d = r.u16()?;
        let mut deletes = Vec::with_capacity(usize::from(d));
        for _ in 0..d {
            deletes.push((r.u64()?, r.u64()?, r.u64()?));
        }
        let nb = r.u16()?;
        let mut blind = Vec::with_capacity(usize::from(nb));
        for _ in 0..nb {
            blind.push(r.u64()?);
        }
        let mut primary_lost = Vec::new();
        if magic == MAGIC {
            let np = r.u16()?;
            for _ in 0..np {
                primary_lost.push(r.u64()?);
            }
        }
        r.finish()?;
        Ok(Membership {
            cluster: u128::from(hi) << 64 | u128::from(lo),
            epoch,
            repairing,
            members,
            deletes,
            blind,
            primary_lost,
        })
    }
}

/// What one memory node says about membership.
#[derive(Debug, Clone)]
pub struct NodeMembership {
    pub node: NodeId,
    /// The node refuses one-sided verbs (fenced out, or not yet rejoined).
    pub fenced: bool,
    /// The newest record it was given, if any.
    pub record: Option<Membership>,
    /// A client asked (through this node) for a fence and repair of the cluster in this
    /// epoch, for this reason (see [`crate::failover::Master::run`]).
    pub resync: Option<(u64, String)>,
}

/// Asks `node` for its membership record.
pub fn query(ep: &Endpoint, node: NodeId) -> crate::Result<NodeMembership> {
    let reply = ep.rpc(
        crate::cluster::TAG,
        node,
        &Request::MembershipGet.to_bytes(),
    )?;
    parse_reply(node, &reply)
}

/// Decodes a node's answer to a membership query (or to the master's heartbeat).
pub(crate) fn parse_reply(node: NodeId, reply: &[u8]) -> crate::Result<NodeMembership> {
    let bad = |e: WireError| crate::Error::Node {
        node,
        reason: format!("bad membership reply: {e}"),
    };
    let mut r = Reader::new(reply);
    if r.u8().map_err(bad)? != status::OK {
        return Err(crate::Error::Node {
            node,
            reason: "does not serve membership (an older memory node?)".into(),
        });
    }
    let fenced = r.u8().map_err(bad)? != 0;
    let record = match r.u8().map_err(bad)? {
        0 => None,
        _ => Some(Membership::decode(r.bytes().map_err(bad)?).map_err(bad)?),
    };
    let resync = match r.remaining() {
        0 => None,
        _ => Some((
            r.u64().map_err(bad)?,
            String::from_utf8_lossy(r.bytes().map_err(bad)?).into_owned(),
        )),
    };
    Ok(NodeMembership {
        node,
        fenced,
        record,
        resync,
    })
}

/// Gives `node` a membership record (the master's call). A node that is a member serves
/// (unfenced); one that is not refuses one-sided verbs.
pub fn publish(ep: &Endpoint, node: NodeId, m: &Membership) -> crate::Result<()> {
    publish_as(ep, node, m, None)
}

/// [`publish`] by the master holding the claim `token` (see [`crate::memnode::as_master`]):
/// a node that granted the cluster to another master refuses it.
pub fn publish_as(
    ep: &Endpoint,
    node: NodeId,
    m: &Membership,
    token: Option<u64>,
) -> crate::Result<()> {
    let req = Request::MembershipSet { record: m.encode() }.to_bytes();
    let reply = ep.rpc(
        crate::cluster::TAG,
        node,
        &crate::memnode::as_master(token, req),
    )?;
    match reply.split_first() {
        Some((&status::OK, _)) => Ok(()),
        Some((_, rest)) => Err(crate::Error::Node {
            node,
            reason: crate::memnode::refusal(rest, "refused the membership record"),
        }),
        None => Err(crate::Error::Node {
            node,
            reason: "refused the membership record".into(),
        }),
    }
}

/// The newest membership any of `nodes` holds (epoch 0, every node a member, when none was
/// published). Nodes that do not answer are skipped; an error when none answers, or when the
/// records belong to different clusters.
pub fn newest(ep: &Endpoint, nodes: &[NodeId]) -> crate::Result<Membership> {
    let mut best: Option<Membership> = None;
    let mut any = false;
    let mut clusters: Vec<(NodeId, u128)> = Vec::new();
    for n in nodes {
        let Ok(q) = query(ep, *n) else { continue };
        any = true;
        if let Some(rec) = q.record {
            if rec.cluster != 0 {
                clusters.push((*n, rec.cluster));
            }
            if best.as_ref().is_none_or(|b| rec.epoch > b.epoch) {
                best = Some(rec);
            }
        }
    }
    if let (Some(a), Some(b)) = (
        clusters.first(),
        clusters.iter().find(|(_, c)| *c != clusters[0].1),
    ) {
        return Err(crate::Error::Cluster(format!(
            "memory node {} belongs to cluster {:032x}, memory node {} to cluster {:032x}: \
             the cluster file mixes memory nodes of different clusters",
            b.0, b.1, a.0, a.1
        )));
    }
    if !any {
        return Err(crate::Error::Cluster(format!(
            "none of the memory nodes {nodes:?} answers (are they running?)"
        )));
    }
    Ok(best.unwrap_or_else(|| Membership {
        cluster: 0,
        epoch: 0,
        repairing: false,
        deletes: Vec::new(),
        blind: Vec::new(),
        primary_lost: Vec::new(),
        members: nodes
            .iter()
            .filter_map(|n| Some((*n, crate::cluster::pool_region(ep, *n).ok()?.rkey)))
            .collect(),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A membership record as the master publishes it. A change here is a format change
    /// between masters, memory nodes and clients of different builds: bump [`MAGIC`] and keep
    /// reading the old one.
    #[test]
    fn record_bytes_are_pinned() {
        let m = Membership {
            cluster: 0x0011_2233_4455_6677_8899_aabb_ccdd_eeff,
            epoch: 7,
            repairing: true,
            members: vec![(NodeId(0), RKey(0x1111)), (NodeId(2), RKey(0x2222))],
            deletes: vec![(7, 4096, 0x0002_0000_0004_0040)],
            blind: vec![5],
            primary_lost: vec![6],
        };
        let b = m.encode();
        assert_eq!(Membership::decode(&b).unwrap(), m);
        insta::assert_snapshot!(crate::object::hex_dump(&b));
    }

    #[test]
    fn a_record_round_trips_and_a_flipped_bit_is_caught() {
        let m = Membership {
            cluster: 0xfeed << 70 | 3,
            epoch: 7,
            repairing: true,
            members: vec![(NodeId(0), RKey(11)), (NodeId(2), RKey(99))],
            deletes: vec![(7, 4096, 77)],
            blind: vec![5],
            primary_lost: vec![6, 9],
        };
        let mut b = m.encode();
        assert_eq!(Membership::decode(&b).unwrap(), m);
        b[5] ^= 1;
        assert!(Membership::decode(&b).is_err());
        assert!(Membership::decode(&[]).is_err());
    }

    #[test]
    fn records_written_before_primary_lost_existed_still_read() {
        let m = Membership {
            cluster: 5,
            epoch: 3,
            repairing: false,
            members: vec![(NodeId(1), RKey(4))],
            deletes: vec![(2, 64, 0)],
            blind: vec![2],
            primary_lost: Vec::new(),
        };
        // The previous layout: magic FMb2, no primary_lost list (its u16 count, 0 here).
        let now = m.encode();
        let mut old = now[..now.len() - 4 - 2].to_vec();
        old[..4].copy_from_slice(b"FMb2");
        old.extend_from_slice(&crc32c::crc32c(&old).to_le_bytes());
        assert_eq!(Membership::decode(&old).unwrap(), m);
    }
}
