//! A write proxy: a thread that posts a client's proxied writes for it, in order, so the
//! writer returns once its data is copied and queued — whatever posting costs on the backend
//! (on a software NIC such as SoftRoCE the doorbell itself executes the write). The bytes
//! queued for the thread are bounded by the endpoint's staging capacity: past it, writers
//! wait (awaited) for the thread to catch up. Gengar's clients post their proxied writes
//! through one.
//!
//! Each write may have several parts (the same bytes to several remote addresses, each
//! durable or not); its [`ProxiedWrite`] says when every part is posted and when every part
//! is confirmed. [`OutstandingWrites`] keeps a writer's writes per object until they are.
//!
//! ```
//! use std::sync::Arc;
//! use dmkit_verbs::sim::{SimCluster, SimConfig};
//! use dmkit_verbs::{Access, DramBacking, MemoryNode, NodeId, ProxiedWrite, WriteProxy};
//!
//! let cluster = SimCluster::new(SimConfig::default());
//! let node = Arc::new(MemoryNode::new(NodeId(0)));
//! let region = node.register(Arc::new(DramBacking::new(1 << 20)), Access::ALL, None)?;
//! cluster.add_node(node);
//! let ep = cluster.endpoint(1)?;
//!
//! // Two copies of one write, posted by the proxy thread; the second one durable.
//! let proxy = WriteProxy::start(ep.clone(), "proxied")?;
//! let parts = vec![(region.at(0), false), (region.at(64), true)];
//! let w = dmkit_verbs::block_on(proxy.submit(parts.clone(), b"copied"))?;
//! w.wait()?;
//! assert!(w.is_confirmed());
//!
//! // The same without a thread: the caller posts the parts itself.
//! let w = dmkit_verbs::block_on(ProxiedWrite::post(&ep, "proxied", &parts, b"posted"))?;
//! w.wait()?;
//! assert_eq!(ep.read("check", region.at(64), 6)?, b"posted");
//! # Ok::<(), dmkit_verbs::Error>(())
//! ```

use std::collections::{HashMap, VecDeque};
use std::hash::Hash;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::Sender;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use parking_lot::Mutex;

use crate::endpoint::{Endpoint, WriteConfirm};
use crate::error::{Error, Result};
use crate::stats::Tag;
use crate::types::RemoteAddr;

/// The remote addresses a proxied write goes to, each with whether it is durable.
pub type WriteParts = Vec<(RemoteAddr, bool)>;

/// A proxied write with one or more parts: posted once every part is posted (or one failed to
/// be), confirmed once every part completed at its node. Clones share the write.
#[derive(Debug, Clone)]
pub struct ProxiedWrite(Arc<Posting>);

#[derive(Debug)]
struct Posting {
    result: OnceLock<Result<Vec<WriteConfirm>>>,
    notify: tokio::sync::Notify,
}

impl ProxiedWrite {
    fn new() -> Self {
        ProxiedWrite(Arc::new(Posting {
            result: OnceLock::new(),
            notify: tokio::sync::Notify::new(),
        }))
    }

    fn set(&self, r: Result<Vec<WriteConfirm>>) {
        let _ = self.0.result.set(r);
        self.0.notify.notify_waiters();
    }

    /// Posts every part of the write from the calling task, in order (awaiting staging room
    /// under back-pressure); the first part that fails to be posted fails the call.
    pub async fn post(
        ep: &Endpoint,
        tag: Tag,
        parts: &[(RemoteAddr, bool)],
        data: &[u8],
    ) -> Result<ProxiedWrite> {
        let mut confirms = Vec::with_capacity(parts.len());
        for (remote, durable) in parts {
            confirms.push(ep.proxied_write_async(tag, *remote, data, *durable).await?);
        }
        let w = ProxiedWrite::new();
        w.set(Ok(confirms));
        Ok(w)
    }

    /// The parts' confirms once posted, or why posting failed.
    async fn posting(&self) -> &Result<Vec<WriteConfirm>> {
        loop {
            if let Some(r) = self.0.result.get() {
                return r;
            }
            let n = self.0.notify.notified();
            let mut n = std::pin::pin!(n);
            n.as_mut().enable();
            if let Some(r) = self.0.result.get() {
                return r;
            }
            n.await;
        }
    }

    /// Waits until every part is posted (or one failed to be): what the same client posts
    /// on the connection afterwards executes after it.
    pub async fn posted(&self) {
        self.posting().await;
    }

    /// Whether every part has completed (or the write failed).
    pub fn is_confirmed(&self) -> bool {
        match self.0.result.get() {
            None => false,
            Some(Err(_)) => true,
            Some(Ok(parts)) => parts.iter().all(WriteConfirm::is_confirmed),
        }
    }

    /// Waits until every part completed at its node; the first failure (of posting, or of a
    /// part).
    pub async fn confirmed(&self) -> Result<()> {
        match self.posting().await {
            Err(e) => Err(e.clone_shallow()),
            Ok(parts) => {
                for c in parts {
                    c.confirmed().await?;
                }
                Ok(())
            }
        }
    }

    /// [`ProxiedWrite::confirmed`], blocking.
    pub fn wait(&self) -> Result<()> {
        crate::block_on(self.confirmed())
    }
}

/// A write for the proxy thread to post.
struct Job {
    parts: WriteParts,
    data: Vec<u8>,
    done: ProxiedWrite,
}

/// A thread posting queued proxied writes in order (see the module docs). It ends when the
/// proxy is dropped and its queue is drained.
#[derive(Debug)]
pub struct WriteProxy {
    tx: Sender<Job>,
    queued: Arc<AtomicUsize>,
    limit: usize,
}

impl WriteProxy {
    /// Starts the thread, posting on `ep` under `tag`.
    pub fn start(ep: Endpoint, tag: Tag) -> Result<WriteProxy> {
        let (tx, rx) = std::sync::mpsc::channel::<Job>();
        let queued = Arc::new(AtomicUsize::new(0));
        let q = queued.clone();
        let limit = ep.staging_capacity();
        std::thread::Builder::new()
            .name("verbs-write-proxy".into())
            .spawn(move || {
                for job in rx {
                    let mut posted = Vec::with_capacity(job.parts.len());
                    let mut failed = None;
                    for (remote, durable) in &job.parts {
                        match ep.proxied_write(tag, *remote, &job.data, *durable) {
                            Ok(c) => posted.push(c),
                            Err(e) => {
                                failed = Some(e);
                                break;
                            }
                        }
                    }
                    q.fetch_sub(job.data.len(), Ordering::AcqRel);
                    job.done.set(match failed {
                        None => Ok(posted),
                        Some(e) => Err(e),
                    });
                }
            })?;
        Ok(WriteProxy { tx, queued, limit })
    }

    /// Copies `data` and queues it for the thread to post to every part; returns at once
    /// unless the bytes queued exceed the staging capacity, then awaits room (one write
    /// larger than the capacity is queued alone).
    pub async fn submit(&self, parts: WriteParts, data: &[u8]) -> Result<ProxiedWrite> {
        let len = data.len();
        while self.queued.load(Ordering::Acquire) > 0
            && self.queued.load(Ordering::Acquire) + len > self.limit
        {
            crate::sleep(Duration::from_micros(50)).await;
        }
        self.queued.fetch_add(len, Ordering::AcqRel);
        let done = ProxiedWrite::new();
        let job = Job {
            parts,
            data: data.to_vec(),
            done: done.clone(),
        };
        if self.tx.send(job).is_err() {
            self.queued.fetch_sub(len, Ordering::AcqRel);
            return Err(Error::Io(std::io::Error::other(
                "the write proxy thread is gone",
            )));
        }
        Ok(done)
    }

    /// Bytes queued for the thread and not posted yet.
    pub fn queued_bytes(&self) -> usize {
        self.queued.load(Ordering::Acquire)
    }
}

/// The proxied writes still outstanding per key (an object, say), oldest first: what a
/// writer waits for before it reads its own writes back ([`OutstandingWrites::posted`]), or
/// before it frees the object or hands its lock on ([`OutstandingWrites::confirmed`]).
#[derive(Debug)]
pub struct OutstandingWrites<K> {
    writes: Mutex<HashMap<K, VecDeque<ProxiedWrite>>>,
}

impl<K: Hash + Eq> Default for OutstandingWrites<K> {
    fn default() -> Self {
        Self {
            writes: Mutex::new(HashMap::new()),
        }
    }
}

impl<K: Hash + Eq> OutstandingWrites<K> {
    /// Adds `w` to `key`'s writes.
    pub fn push(&self, key: K, w: ProxiedWrite) {
        let mut all = self.writes.lock();
        let list = all.entry(key).or_default();
        // Confirms mostly fire in posting order: dropping the confirmed ones at the front keeps
        // the list short at O(1) per write (a scan of every outstanding one would make a fast
        // writer's calls slower the more it has in flight).
        while list.front().is_some_and(ProxiedWrite::is_confirmed) {
            list.pop_front();
        }
        list.push_back(w);
    }

    /// Waits until `key`'s writes so far are posted, so that what the writer posts next on
    /// the connection executes after them.
    pub async fn posted(&self, key: &K) {
        let last = self.writes.lock().get(key).and_then(|l| l.back().cloned());
        if let Some(w) = last {
            w.posted().await;
        }
    }

    /// Takes `key`'s writes and waits until each is confirmed; the first failure.
    pub async fn confirmed(&self, key: &K) -> Result<()> {
        let pending = self.writes.lock().remove(key).unwrap_or_default();
        for w in pending {
            w.confirmed().await?;
        }
        Ok(())
    }

    /// Takes every key's writes and waits for all of them; the first failure.
    pub async fn all_confirmed(&self) -> Result<()> {
        let pending: Vec<_> = self.writes.lock().drain().flat_map(|(_, l)| l).collect();
        let mut first = Ok(());
        for w in pending {
            if let Err(e) = w.confirmed().await {
                first = first.and(Err(e));
            }
        }
        first
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_are_posted_in_order_and_a_bad_part_fails_the_write() {
        let (_cluster, ep, region) = crate::sim::one_node();
        let proxy = WriteProxy::start(ep.clone(), "t").unwrap();
        let writes: Vec<_> = (0..50u8)
            .map(|i| crate::block_on(proxy.submit(vec![(region.at(0), i % 2 == 0)], &[i; 8])))
            .collect::<Result<_>>()
            .unwrap();
        for w in &writes {
            w.wait().unwrap();
        }
        assert_eq!(proxy.queued_bytes(), 0);
        let outstanding = OutstandingWrites::default();
        for w in &writes {
            outstanding.push(7u64, w.clone());
        }
        crate::block_on(outstanding.posted(&7));
        assert!(crate::block_on(outstanding.confirmed(&7)).is_ok());
        assert_eq!(ep.read("t", region.at(0), 8).unwrap(), vec![49; 8]);
        // A part out of the region: the write fails, and says so to every clone.
        let bad = crate::block_on(proxy.submit(vec![(region.at(1 << 20), false)], &[1; 8]));
        let bad = bad.unwrap();
        let copy = bad.clone();
        assert!(bad.wait().is_err());
        assert!(copy.is_confirmed() && copy.wait().is_err());
        outstanding.push(8, copy);
        assert!(crate::block_on(outstanding.all_confirmed()).is_err());
    }
}
