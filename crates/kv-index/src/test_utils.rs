//! A [`KeyVerifier`] for tests and examples: keys stored as small objects in remote memory.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use dmkit_verbs::{Endpoint, NodeId, RegionDesc};

use crate::error::{Error, Result};
use crate::slot::{OBJECT_ALIGN, ObjPtr, Slot};
use crate::verifier::KeyVerifier;

/// Tag of the key store's verbs.
pub const KEYSTORE_TAG: &str = "kv_index.test_keystore";

/// Objects holding just a key (`[len: u32][key]`, padded to 64 bytes), bump-allocated
/// round-robin over the regions given (one per memory node). Clones share the allocator.
#[derive(Debug, Clone)]
pub struct KeyStore {
    regions: Arc<Vec<RegionDesc>>,
    next: Arc<Vec<AtomicU64>>,
    rr: Arc<AtomicU64>,
}

impl KeyStore {
    pub fn new(regions: Vec<RegionDesc>) -> Self {
        let next = regions.iter().map(|_| AtomicU64::new(0)).collect();
        Self {
            regions: Arc::new(regions),
            next: Arc::new(next),
            rr: Arc::new(AtomicU64::new(0)),
        }
    }

    fn region(&self, node: NodeId) -> Result<&RegionDesc> {
        self.regions
            .iter()
            .find(|r| r.node == node)
            .ok_or_else(|| Error::Verifier(format!("no object region on node {node}")))
    }

    fn record(key: &[u8]) -> Vec<u8> {
        let mut rec = Vec::with_capacity(4 + key.len());
        rec.extend_from_slice(&(key.len() as u32).to_le_bytes());
        rec.extend_from_slice(key);
        rec
    }

    fn alloc(&self, len: usize) -> Result<(usize, ObjPtr)> {
        let k = (self.rr.fetch_add(1, Ordering::Relaxed) % self.regions.len() as u64) as usize;
        let units = (len as u64).div_ceil(OBJECT_ALIGN).max(1);
        let len_class = u8::try_from(units)
            .map_err(|_| Error::InvalidSlot(format!("a key of {len} bytes is too long")))?;
        let offset = self.next[k].fetch_add(units * OBJECT_ALIGN, Ordering::Relaxed);
        if offset + units * OBJECT_ALIGN > self.regions[k].len {
            return Err(Error::Verifier("the key store is full".into()));
        }
        Ok((
            k,
            ObjPtr {
                node: self.regions[k].node,
                offset,
                len_class,
            },
        ))
    }

    /// Stores `key` in a new object (one round trip) and returns where.
    pub fn put(&self, ep: &Endpoint, key: &[u8]) -> Result<ObjPtr> {
        Ok(self.put_many(ep, &[key])?[0])
    }

    /// Stores many keys, one batch per node, all in one round trip.
    pub fn put_many(&self, ep: &Endpoint, keys: &[&[u8]]) -> Result<Vec<ObjPtr>> {
        let mut batches: Vec<_> = self.regions.iter().map(|r| ep.batch(r.node)).collect();
        let mut out = Vec::with_capacity(keys.len());
        for key in keys {
            let rec = Self::record(key);
            let (k, p) = self.alloc(rec.len())?;
            batches[k].write(self.regions[k].at(p.offset), &rec);
            out.push(p);
        }
        let batches = batches.into_iter().filter(|b| !b.is_empty()).collect();
        for r in ep.execute_many(KEYSTORE_TAG, batches) {
            r?;
        }
        Ok(out)
    }
}

impl KeyVerifier for KeyStore {
    fn keys(&self, ep: &Endpoint, slots: &[Slot]) -> Result<Vec<Vec<u8>>> {
        let mut batches = Vec::new();
        let mut where_ = Vec::with_capacity(slots.len());
        for s in slots {
            let r = self.region(s.node())?;
            if s.offset() + s.object_len() as u64 > r.len {
                return Err(Error::Verifier(format!(
                    "slot {:#x} points outside",
                    s.raw()
                )));
            }
            let bi = match batches.iter().position(|(n, _)| *n == s.node()) {
                Some(i) => i,
                None => {
                    batches.push((s.node(), ep.batch(s.node())));
                    batches.len() - 1
                }
            };
            let op = batches[bi].1.read(r.at(s.offset()), s.object_len());
            where_.push((bi, op));
        }
        let results: Vec<_> = ep
            .execute_many(KEYSTORE_TAG, batches.into_iter().map(|b| b.1).collect())
            .into_iter()
            .collect::<std::result::Result<_, _>>()?;
        where_
            .into_iter()
            .map(|(bi, op)| {
                let rec = results[bi].read(op);
                let len = u32::from_le_bytes(rec[..4].try_into().unwrap_or([0xFF; 4])) as usize;
                rec.get(4..4 + len)
                    .map(<[u8]>::to_vec)
                    .ok_or_else(|| Error::Verifier("a key object does not decode".into()))
            })
            .collect()
    }
}
