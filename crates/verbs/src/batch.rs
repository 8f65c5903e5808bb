//! Batches of work requests: posted with one doorbell, completed with one completion.

use std::sync::Arc;

use crate::buf::{BufAllocator, HeapAllocator, MemBuf};
use crate::error::{Error, Result};
use crate::node::OpKind;
use crate::types::{NodeId, RKey, RemoteAddr};

/// The index of a work request in its batch, to find its result.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpIdx(pub(crate) usize);

#[derive(Debug, Clone, Copy)]
pub(crate) struct Op {
    pub kind: OpKind,
    pub rkey: RKey,
    pub addr: u64,
    pub len: u32,
    /// Index into `Batch::bufs` for reads (destination) and writes (source).
    pub buf: Option<usize>,
}

/// Work requests for one memory node, executed in order, posted together and completed
/// together: one doorbell, one round trip.
///
/// ```
/// use dmkit_verbs::{Batch, NodeId, RemoteAddr, RKey};
/// let target = RemoteAddr::new(NodeId(0), RKey(7), 1 << 40);
/// let mut b = Batch::new(NodeId(0));
/// let w = b.write(target, b"hello");
/// let r = b.read(target, 5);
/// let c = b.cas(target.add(8), 0, 1);
/// assert_eq!(b.len(), 3);
/// ```
#[derive(Debug)]
pub struct Batch {
    pub(crate) node: NodeId,
    pub(crate) ops: Vec<Op>,
    pub(crate) bufs: Vec<MemBuf>,
    pub(crate) error: Option<String>,
    alloc: Arc<dyn BufAllocator>,
}

impl Batch {
    /// An empty batch for `node`, using heap buffers (fine for the software backends; an
    /// [`crate::Endpoint::batch`] uses the backend's registered buffers).
    pub fn new(node: NodeId) -> Self {
        Self::with_allocator(node, Arc::new(HeapAllocator))
    }

    pub(crate) fn with_allocator(node: NodeId, alloc: Arc<dyn BufAllocator>) -> Self {
        Self {
            node,
            ops: Vec::new(),
            bufs: Vec::new(),
            error: None,
            alloc,
        }
    }

    /// The node this batch goes to.
    pub fn node(&self) -> NodeId {
        self.node
    }

    pub fn len(&self) -> usize {
        self.ops.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// Bytes this batch moves (payloads of reads and writes, 8 per atomic).
    pub fn payload_bytes(&self) -> u64 {
        self.ops.iter().map(|o| u64::from(o.len)).sum()
    }

    fn check(&mut self, remote: RemoteAddr, len: usize) -> Option<u32> {
        if remote.node != self.node {
            self.error.get_or_insert_with(|| {
                format!(
                    "work request for node {} in a batch for node {}",
                    remote.node, self.node
                )
            });
            return None;
        }
        match u32::try_from(len) {
            Ok(l) => Some(l),
            Err(_) => {
                self.error
                    .get_or_insert_with(|| format!("work request of {len} bytes is too long"));
                None
            }
        }
    }

    fn push(&mut self, kind: OpKind, remote: RemoteAddr, len: u32, buf: Option<MemBuf>) -> OpIdx {
        let buf = buf.map(|b| {
            self.bufs.push(b);
            self.bufs.len() - 1
        });
        self.ops.push(Op {
            kind,
            rkey: remote.rkey,
            addr: remote.addr,
            len,
            buf,
        });
        OpIdx(self.ops.len() - 1)
    }

    fn alloc(&mut self, len: usize) -> Option<MemBuf> {
        match self.alloc.alloc(len) {
            Ok(b) => Some(b),
            Err(e) => {
                self.error.get_or_insert_with(|| e.to_string());
                None
            }
        }
    }

    /// READ `len` bytes at `remote` into a fresh registered buffer.
    pub fn read(&mut self, remote: RemoteAddr, len: usize) -> OpIdx {
        let l = self.check(remote, len).unwrap_or(0);
        let buf = self.alloc(len);
        self.push(OpKind::Read, remote, l, buf)
    }

    /// READ into `buf` (its whole length): no allocation.
    pub fn read_into(&mut self, remote: RemoteAddr, buf: MemBuf) -> OpIdx {
        let l = self.check(remote, buf.len()).unwrap_or(0);
        self.push(OpKind::Read, remote, l, Some(buf))
    }

    /// WRITE `data` to `remote`. The bytes are copied into registered memory (they are not
    /// registered); use [`Batch::write_buf`] to write from a registered buffer without a copy.
    pub fn write(&mut self, remote: RemoteAddr, data: &[u8]) -> OpIdx {
        self.write_impl(remote, data, false)
    }

    /// WRITE that completes only once the data is durable (on a persistent region; on DRAM it
    /// is an ordinary write). Whether it is durable before the batch's next verb runs:
    /// [`crate::Endpoint::durable_in_order`]. (A batch's atomics on a persistent region are
    /// durable by its end, before it completes — a backend may flush them together, so other
    /// clients may read them before they are durable, as from an RDMA NIC.)
    pub fn write_durable(&mut self, remote: RemoteAddr, data: &[u8]) -> OpIdx {
        self.write_impl(remote, data, true)
    }

    /// WRITE `data` to each part of a [`WriteParts`](crate::WriteParts) — the copies of one
    /// write, durable where the part says so — in order: the synchronous counterpart of a
    /// proxied write to them. Returns the last part's index (`None`: no parts).
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # use dmkit_verbs::sim::{SimCluster, SimConfig};
    /// # use dmkit_verbs::{Access, DramBacking, MemoryNode, NodeId};
    /// # let cluster = SimCluster::new(SimConfig::default());
    /// # let node = Arc::new(MemoryNode::new(NodeId(0)));
    /// # let region = node.register(Arc::new(DramBacking::new(1 << 20)), Access::ALL, None)?;
    /// # cluster.add_node(node);
    /// # let ep = cluster.endpoint(1)?;
    /// let parts = vec![(region.at(0), false), (region.at(64), true)];
    /// let mut b = ep.batch(NodeId(0));
    /// b.write_parts(&parts, b"twice");
    /// ep.execute("write", b)?;
    /// assert_eq!(ep.read("check", region.at(0), 5)?, b"twice");
    /// assert_eq!(ep.read("check", region.at(64), 5)?, b"twice");
    /// # Ok::<(), dmkit_verbs::Error>(())
    /// ```
    pub fn write_parts(&mut self, parts: &[(RemoteAddr, bool)], data: &[u8]) -> Option<OpIdx> {
        let mut last = None;
        for &(remote, durable) in parts {
            last = Some(self.write_impl(remote, data, durable));
        }
        last
    }

    fn write_impl(&mut self, remote: RemoteAddr, data: &[u8], durable: bool) -> OpIdx {
        let l = self.check(remote, data.len()).unwrap_or(0);
        let buf = self.alloc(data.len()).map(|mut b| {
            b.copy_from_slice(data);
            b
        });
        self.push(OpKind::Write { durable }, remote, l, buf)
    }

    /// WRITE the whole of a registered buffer (zero-copy).
    pub fn write_buf(&mut self, remote: RemoteAddr, buf: MemBuf, durable: bool) -> OpIdx {
        let l = self.check(remote, buf.len()).unwrap_or(0);
        self.push(OpKind::Write { durable }, remote, l, Some(buf))
    }

    /// Compare-and-swap on an 8-aligned word; the result holds the old value.
    pub fn cas(&mut self, remote: RemoteAddr, expect: u64, new: u64) -> OpIdx {
        let l = self.check(remote, 8).unwrap_or(0);
        self.push(OpKind::Cas { expect, new }, remote, l, None)
    }

    /// Fetch-and-add on an 8-aligned word; the result holds the old value.
    pub fn faa(&mut self, remote: RemoteAddr, add: u64) -> OpIdx {
        let l = self.check(remote, 8).unwrap_or(0);
        self.push(OpKind::Faa { add }, remote, l, None)
    }

    pub(crate) fn validate(&self) -> Result<()> {
        match &self.error {
            Some(e) => Err(Error::InvalidArgument(e.clone())),
            None => Ok(()),
        }
    }

    /// Splits into ops and buffers for a backend; `BatchResult::new` reassembles.
    pub(crate) fn into_parts(self) -> (NodeId, Vec<Op>, Vec<MemBuf>) {
        (self.node, self.ops, self.bufs)
    }

    /// The work requests in posting order: what a backend sends to the node, or executes on
    /// it ([`crate::MemoryNode::execute_request`]). A backend outside this crate posts a batch
    /// by reading its requests, then fills [`Batch::into_result`] from the node's answer.
    pub fn requests(&self) -> impl ExactSizeIterator<Item = WorkRequest<'_>> + '_ {
        self.ops.iter().map(|op| WorkRequest {
            kind: op.kind,
            rkey: op.rkey,
            addr: op.addr,
            len: op.len,
            data: match (op.kind, op.buf) {
                (OpKind::Write { .. }, Some(b)) => &self.bufs[b][..],
                _ => &[],
            },
        })
    }

    /// The batch turned into its completion, for a backend to fill once the node executed it:
    /// READ data with [`BatchResult::read_dest`], old values with [`BatchResult::set_old`].
    pub fn into_result(self) -> BatchResult {
        BatchResult::new(self.node, self.ops, self.bufs)
    }
}

/// The bytes work request `op` writes (a WRITE's buffer) and the buffer it reads into (a
/// READ's): what a node executes it with. Empty for the other verbs.
pub(crate) fn op_io<'a>(op: &Op, bufs: &'a mut [MemBuf]) -> (&'a [u8], &'a mut [u8]) {
    match (op.kind, op.buf) {
        (OpKind::Read, Some(b)) => (&[], &mut bufs[b][..]),
        (OpKind::Write { .. }, Some(b)) => {
            let bufs: &'a [MemBuf] = bufs;
            (&bufs[b][..], &mut [])
        }
        _ => (&[], &mut []),
    }
}

/// One work request of a [`Batch`], as a backend sees it ([`Batch::requests`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkRequest<'a> {
    /// The verb.
    pub kind: OpKind,
    /// The region it targets.
    pub rkey: RKey,
    /// The remote address (in the region's address space).
    pub addr: u64,
    /// Bytes read or written (8 for atomics).
    pub len: u32,
    /// What a WRITE carries (`len` bytes); empty for the other verbs.
    pub data: &'a [u8],
}

/// The completion of a batch: read data, atomics' old values, and the buffers handed back.
#[derive(Debug)]
pub struct BatchResult {
    pub(crate) node: NodeId,
    pub(crate) ops: Vec<Op>,
    pub(crate) olds: Vec<u64>,
    pub(crate) bufs: Vec<MemBuf>,
}

impl BatchResult {
    /// Old values are empty (read as 0) until a backend with atomics sets them.
    pub(crate) fn new(node: NodeId, ops: Vec<Op>, bufs: Vec<MemBuf>) -> Self {
        Self {
            node,
            ops,
            olds: Vec::new(),
            bufs,
        }
    }

    pub fn node(&self) -> NodeId {
        self.node
    }

    /// Where the data of READ number `i` goes (its buffer, exactly its length): a backend
    /// copies the node's answer here. Empty for other verbs or an index out of range.
    pub fn read_dest(&mut self, i: usize) -> &mut [u8] {
        match self.ops.get(i) {
            Some(Op {
                kind: OpKind::Read,
                buf: Some(b),
                ..
            }) => &mut self.bufs[*b][..],
            _ => &mut [],
        }
    }

    /// Records the old value atomic number `i` (a CAS or FAA) returned at the node.
    pub fn set_old(&mut self, i: usize, old: u64) {
        if i >= self.ops.len() {
            return;
        }
        if self.olds.len() < self.ops.len() {
            self.olds.resize(self.ops.len(), 0);
        }
        self.olds[i] = old;
    }

    /// The bytes a READ brought back (empty for other verbs).
    pub fn read(&self, idx: OpIdx) -> &[u8] {
        match self.ops.get(idx.0) {
            Some(Op {
                kind: OpKind::Read,
                buf: Some(b),
                ..
            }) => &self.bufs[*b],
            _ => &[],
        }
    }

    /// The old value a CAS or FAA returned (0 for other verbs).
    pub fn old(&self, idx: OpIdx) -> u64 {
        self.olds.get(idx.0).copied().unwrap_or(0)
    }

    /// Whether a CAS swapped (its old value equals what it expected).
    pub fn cas_succeeded(&self, idx: OpIdx) -> bool {
        match self.ops.get(idx.0) {
            Some(Op {
                kind: OpKind::Cas { expect, .. },
                ..
            }) => self.old(idx) == *expect,
            _ => false,
        }
    }

    /// Takes back the buffer of a READ or WRITE, to reuse it.
    pub fn take_buf(&mut self, idx: OpIdx) -> Option<MemBuf> {
        let b = self.ops.get(idx.0)?.buf?;
        Some(std::mem::replace(&mut self.bufs[b], MemBuf::heap(0)))
    }
}

/// Which durable WRITEs of a batch get a read-after-write flush READ right after them: those
/// no READ follows later in the batch. On one queue pair a READ completes only after every
/// WRITE posted before it has been placed in the node's memory, so one READ — the batch's own
/// (a bucket read behind an object write) or one flush behind the last durable write —
/// covers every durable write before it. In batch order.
#[cfg_attr(not(feature = "rdma"), allow(dead_code))]
pub(crate) fn flushes(
    ops: impl DoubleEndedIterator<Item = (OpKind, u32)> + ExactSizeIterator,
) -> Vec<bool> {
    let mut out = vec![false; ops.len()];
    let mut covered = false;
    for (i, (kind, len)) in ops.enumerate().rev() {
        match kind {
            OpKind::Read if len > 0 => covered = true,
            OpKind::Write { durable: true } if len > 0 && !covered => {
                out[i] = true;
                covered = true;
            }
            _ => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const DW: OpKind = OpKind::Write { durable: true };
    const W: OpKind = OpKind::Write { durable: false };
    const CAS: OpKind = OpKind::Cas { expect: 0, new: 1 };

    #[test]
    fn one_read_flushes_every_durable_write_before_it() {
        // An object write behind which the bucket reads go: no flush of its own.
        let f = flushes([(DW, 100), (OpKind::Read, 64), (OpKind::Read, 64)].into_iter());
        assert_eq!(f, [false, false, false]);
        // A commit record and a flag, then the CAS: one flush, behind the last.
        let f = flushes([(DW, 16), (DW, 1), (CAS, 8)].into_iter());
        assert_eq!(f, [false, true, false]);
        // A durable write after the last READ needs its own; plain writes need none.
        let f = flushes([(DW, 8), (OpKind::Read, 8), (W, 8), (DW, 8)].into_iter());
        assert_eq!(f, [false, false, false, true]);
        // Empty writes and empty reads neither need nor give a flush.
        let f = flushes([(DW, 8), (OpKind::Read, 0), (DW, 0)].into_iter());
        assert_eq!(f, [true, false, false]);
    }
}
