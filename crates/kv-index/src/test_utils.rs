//! A [`KeyVerifier`] for tests and examples: keys stored as small objects in remote memory.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use dmkit_verbs::{Endpoint, RegionDesc};

use crate::error::{Error, Result};
use crate::objects::ObjectVerifier;
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
        // (The index's general verifier, over this store's `[len: u32][key]` records.)
        ObjectVerifier::new(self.regions.to_vec(), key_of)
            .with_tag(KEYSTORE_TAG)
            .keys(ep, slots)
    }
}

/// A key record's key: `[len: u32][key]`.
fn key_of(rec: &[u8]) -> Option<&[u8]> {
    let len = u32::from_le_bytes(rec.get(..4)?.try_into().ok()?) as usize;
    rec.get(4..4usize.checked_add(len)?)
}
