//! A writer's proxied writes, in one piece: each write is posted either by a [`WriteProxy`]
//! thread (the writer returns once its data is copied and queued) or by the writer itself
//! ([`ProxiedWrite::post`]: it returns once posted), as the writer chose when it started; and
//! every write is kept per key (an object, say) in [`OutstandingWrites`] until it is
//! confirmed, so the writer can wait for its own writes to a key — before it reads the key
//! back, frees it or hands its lock on. Gengar's clients write this way.
//!
//! ```
//! use std::sync::Arc;
//! use dmkit_verbs::sim::{SimCluster, SimConfig};
//! use dmkit_verbs::{Access, DramBacking, MemoryNode, NodeId, ProxiedWriter};
//!
//! let cluster = SimCluster::new(SimConfig::default());
//! let node = Arc::new(MemoryNode::new(NodeId(0)));
//! let region = node.register(Arc::new(DramBacking::new(1 << 20)), Access::ALL, None)?;
//! cluster.add_node(node);
//! let ep = cluster.endpoint(1)?;
//!
//! for thread in [true, false] {
//!     let writer = ProxiedWriter::start(&ep, "proxied", thread)?;
//!     let parts = vec![(region.at(0), false), (region.at(64), true)];
//!     let w = dmkit_verbs::block_on(writer.write("obj", parts, b"copied"))?;
//!     // Every write to "obj" so far, confirmed.
//!     dmkit_verbs::block_on(writer.confirmed(&"obj"))?;
//!     assert!(w.is_confirmed());
//! }
//! assert_eq!(ep.read("check", region.at(64), 6)?, b"copied");
//! # Ok::<(), dmkit_verbs::Error>(())
//! ```

use std::hash::Hash;

use crate::endpoint::Endpoint;
use crate::error::Result;
use crate::proxy::{OutstandingWrites, ProxiedWrite, WriteParts, WriteProxy};
use crate::stats::Tag;

/// A writer's proxied writes: posted by a proxy thread or by the writer, outstanding ones
/// kept per key `K` (see the module docs).
#[derive(Debug)]
pub struct ProxiedWriter<K> {
    ep: Endpoint,
    tag: Tag,
    /// The proxy thread, if the writer does not post itself.
    proxy: Option<WriteProxy>,
    outstanding: OutstandingWrites<K>,
}

impl<K: Hash + Eq> ProxiedWriter<K> {
    /// A writer on `ep`, its writes counted under `tag`; with `thread`, a [`WriteProxy`]
    /// thread posts them (starting it may fail), otherwise the writer does.
    pub fn start(ep: &Endpoint, tag: Tag, thread: bool) -> Result<Self> {
        let proxy = match thread {
            true => Some(WriteProxy::start(ep.clone(), tag)?),
            false => None,
        };
        Ok(Self {
            ep: ep.clone(),
            tag,
            proxy,
            outstanding: OutstandingWrites::default(),
        })
    }

    /// Writes `data` to every part, for `key`: queued for the proxy thread (awaiting room
    /// past the endpoint's staging capacity) or posted by the caller; the write is then one
    /// of `key`'s outstanding writes until it is confirmed.
    pub async fn write(&self, key: K, parts: WriteParts, data: &[u8]) -> Result<ProxiedWrite> {
        let w = match &self.proxy {
            Some(p) => p.submit(parts, data).await?,
            None => ProxiedWrite::post(&self.ep, self.tag, &parts, data).await?,
        };
        self.outstanding.push(key, w.clone());
        Ok(w)
    }

    /// Waits until `key`'s writes so far are posted ([`OutstandingWrites::posted`]).
    pub async fn posted(&self, key: &K) {
        self.outstanding.posted(key).await;
    }

    /// Waits until `key`'s writes so far are confirmed; the first failure
    /// ([`OutstandingWrites::confirmed`]).
    pub async fn confirmed(&self, key: &K) -> Result<()> {
        self.outstanding.confirmed(key).await
    }

    /// Waits until every write so far is confirmed; the first failure.
    pub async fn all_confirmed(&self) -> Result<()> {
        self.outstanding.all_confirmed().await
    }

    /// Waits until every write so far is confirmed, then until the endpoint's staged proxied
    /// writes are done ([`Endpoint::flush_async`]); the first failure of either.
    pub async fn flush(&self) -> Result<()> {
        let first = self.all_confirmed().await;
        let staged = self.ep.flush_async().await;
        first.and(staged)
    }

    /// Whether a proxy thread posts the writes.
    pub fn has_thread(&self) -> bool {
        self.proxy.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::block_on as run;

    #[test]
    fn both_ways_keep_writes_per_key_until_confirmed_and_in_order() {
        let (_cluster, ep, region) = crate::sim::one_node();
        for thread in [true, false] {
            let writer = ProxiedWriter::start(&ep, "t", thread).unwrap();
            assert_eq!(writer.has_thread(), thread);
            let (a, b) = (region.at(0), region.at(128));
            let first = run(writer.write(1u64, vec![(a, false)], b"first")).unwrap();
            let second = run(writer.write(1, vec![(a, true)], b"again")).unwrap();
            let other = run(writer.write(2, vec![(b, true)], b"other")).unwrap();
            run(writer.posted(&1));
            run(writer.confirmed(&1)).unwrap();
            assert!(first.is_confirmed() && second.is_confirmed());
            assert_eq!(ep.read("t", a, 5).unwrap(), b"again");
            run(writer.all_confirmed()).unwrap();
            assert!(other.is_confirmed());
            assert_eq!(ep.read("t", b, 5).unwrap(), b"other");
            run(writer.write(2, vec![(b, false)], b"later")).unwrap();
            run(writer.flush()).unwrap();
            assert_eq!(ep.staging_in_use(), 0);
            assert_eq!(ep.read("t", b, 5).unwrap(), b"later");
            // A part outside the region fails the write.
            let bad = region.at(1 << 20);
            let failed = run(async {
                let w = writer.write(3, vec![(bad, true)], b"x").await?;
                w.confirmed().await
            });
            assert!(failed.is_err());
        }
    }
}
