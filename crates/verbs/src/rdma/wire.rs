//! The region table a memory node sends at connect (and on refresh): each region's
//! descriptor plus what the NIC needs to reach it — the real virtual address and the NIC's
//! rkey. Remote addresses in the verbs API are region-relative (`RegionDesc::base`); the
//! client translates `base + off` to `va + off` when posting. A fenced node sends its
//! descriptors without NIC rkeys (it has none registered) and the fenced flag.

use crate::error::{Error, Result};
use crate::types::{Access, Media, NodeId, RKey, RegionDesc, RegionName};

/// A region as a client of the rdma backend knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RemoteRegion {
    pub desc: RegionDesc,
    pub nic_rkey: u32,
    pub va: u64,
}

/// What a client knows of a node's regions.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Table {
    pub regions: Vec<RemoteRegion>,
    /// The node is fenced: every verb is refused (`AccessFault::Fenced`).
    pub fenced: bool,
}

const ENTRY: usize = 4 + 8 + 8 + 1 + 1 + 4 + 8 + 1 + RegionName::MAX;

pub(crate) fn encode(node: NodeId, table: &Table) -> Vec<u8> {
    let regions = &table.regions;
    let mut out = Vec::with_capacity(7 + regions.len() * ENTRY);
    out.extend_from_slice(&node.0.to_le_bytes());
    out.extend_from_slice(&(regions.len() as u32).to_le_bytes());
    for r in regions {
        out.extend_from_slice(&r.desc.rkey.0.to_le_bytes());
        out.extend_from_slice(&r.desc.base.to_le_bytes());
        out.extend_from_slice(&r.desc.len.to_le_bytes());
        out.push(r.desc.access.bits());
        out.push(u8::from(r.desc.media == Media::Nvm));
        out.extend_from_slice(&r.nic_rkey.to_le_bytes());
        out.extend_from_slice(&r.va.to_le_bytes());
        // The name: its length and RegionName::MAX bytes, zero-padded.
        let name = r.desc.name.as_str().as_bytes();
        out.push(name.len() as u8);
        let mut padded = [0u8; RegionName::MAX];
        padded[..name.len()].copy_from_slice(name);
        out.extend_from_slice(&padded);
    }
    out.push(u8::from(table.fenced));
    out
}

pub(crate) fn decode(peer: &str, b: &[u8]) -> Result<(NodeId, Table)> {
    let bad = || Error::Protocol {
        peer: peer.to_string(),
        reason: "malformed region table".into(),
    };
    if b.len() < 6 {
        return Err(bad());
    }
    let node = NodeId(u16::from_le_bytes([b[0], b[1]]));
    let n = u32::from_le_bytes(b[2..6].try_into().map_err(|_| bad())?) as usize;
    if b.len() != 7 + n * ENTRY || b[b.len() - 1] > 1 {
        return Err(bad());
    }
    let u32at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().expect("4"));
    let u64at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().expect("8"));
    let regions = (0..n)
        .map(|i| {
            let o = 6 + i * ENTRY;
            let name_len = usize::from(b[o + 34]).min(RegionName::MAX);
            let name = std::str::from_utf8(&b[o + 35..o + 35 + name_len])
                .ok()
                .and_then(RegionName::new)
                .ok_or_else(bad)?;
            Ok(RemoteRegion {
                desc: RegionDesc {
                    node,
                    name,
                    rkey: RKey(u32at(o)),
                    base: u64at(o + 4),
                    len: u64at(o + 12),
                    access: Access::from_bits(b[o + 20]),
                    media: if b[o + 21] == 1 {
                        Media::Nvm
                    } else {
                        Media::Dram
                    },
                },
                nic_rkey: u32at(o + 22),
                va: u64at(o + 26),
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let fenced = b[b.len() - 1] == 1;
    Ok((node, Table { regions, fenced }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn region_tables_round_trip() {
        let r = RemoteRegion {
            desc: RegionDesc {
                node: NodeId(4),
                name: RegionName::new("gengar.nvm").unwrap(),
                rkey: RKey(0xdead_beef),
                base: 1 << 40,
                len: 4096,
                access: Access::REMOTE_READ,
                media: Media::Nvm,
            },
            nic_rkey: 77,
            va: 0x7f00_0000_1000,
        };
        for fenced in [false, true] {
            let t = Table {
                regions: vec![r, r],
                fenced,
            };
            let b = encode(NodeId(4), &t);
            assert_eq!(decode("p", &b).unwrap(), (NodeId(4), t));
            assert!(decode("p", &b[..b.len() - 1]).is_err());
            let mut bad_flag = b.clone();
            *bad_flag.last_mut().unwrap() = 2;
            assert!(decode("p", &bad_flag).is_err());
        }
    }
}
