//! What a backend implements: a [`Connection`] to one memory node (an RC queue pair, in RDMA
//! terms) and a [`Connector`] that makes them.

use std::sync::Arc;
use std::time::Duration;

use crate::batch::{Batch, BatchResult};
use crate::error::Result;
use crate::pending::Pending;
use crate::types::{NodeId, RegionDesc};

/// Context of one post: who posts and, in the sim latency model, when (virtual ns).
#[derive(Debug, Clone, Copy)]
pub struct PostCtx {
    pub virtual_now: u64,
}

/// A reliable connection to one memory node.
///
/// Contract (checked by the conformance suite, `dmkit_verbs::conformance`): work requests on
/// one connection execute in order; a completion means the node has executed the work (reads
/// and atomics' data are in the result); a refused work request fails its batch with
/// [`crate::Error::RemoteAccess`] without touching memory and leaves the connection usable;
/// a dead node surfaces as an error within the connection's timeout.
pub trait Connection: Send + Sync + std::fmt::Debug {
    /// The node at the other end.
    fn node(&self) -> NodeId;
    /// The node's regions as learned when connecting (or at the last refresh).
    fn regions(&self) -> Vec<RegionDesc>;
    /// Asks the node for its current regions (after it registered or removed some).
    fn refresh_regions(&self) -> Result<Vec<RegionDesc>>;
    /// Posts a batch with one doorbell. Errors (including a dead connection) arrive through
    /// the returned completion.
    fn post(&self, batch: Batch, ctx: PostCtx) -> Pending<BatchResult>;
    /// Posts a batch for a caller that blocks on it ([`crate::Endpoint::execute`]): a backend
    /// that can run the work to completion on the calling thread (rdma: post, then poll the
    /// completion queue right here) returns [`Executed::Done`]; otherwise
    /// [`Executed::Posted`], as [`Connection::post`] — the default.
    fn post_blocking(&self, batch: Batch, ctx: PostCtx) -> Executed {
        Executed::Posted(self.post(batch, ctx))
    }
    /// Sends an RPC request to the node's handler; the completion carries the reply.
    fn rpc(&self, req: &[u8], ctx: PostCtx) -> Pending<Vec<u8>>;
    /// False once the connection is known to be broken.
    fn is_alive(&self) -> bool;
    /// Closes the connection; outstanding work fails.
    fn close(&self);
    /// How long a wait on this connection may take before it is a timeout.
    fn timeout(&self) -> Duration;
    /// Work posted and not yet completed (batches and RPCs): what the connection's in-flight
    /// table holds. Returns to zero once everything posted has completed or failed, whether or
    /// not anyone waited for it.
    fn in_flight(&self) -> usize {
        0
    }
    /// Whether a durable WRITE to region `rkey` is durable before the verbs after it in its
    /// batch execute — so one batch can carry a record and the swap that publishes it, and a
    /// power cut never keeps the swap without the record. True for backends that persist a
    /// durable write as they execute it (the default; sim and tcp); rdma persists an NVM
    /// region's writes only after the batch's verbs (its persist request), so false there.
    fn durable_in_order(&self, rkey: crate::types::RKey) -> bool {
        let _ = rkey;
        true
    }
}

/// What [`Connection::post_blocking`] did with a batch.
#[derive(Debug)]
pub enum Executed {
    /// It ran to completion on the calling thread: its result.
    Done(Result<BatchResult>),
    /// It was posted: wait on it.
    Posted(Pending<BatchResult>),
}

/// Makes connections to memory nodes given their address (backend-specific form: `host:port`
/// for tcp and rdma, the node id for sim).
pub trait Connector: Send + Sync + std::fmt::Debug {
    /// Connects to the node at `addr`, runs the handshake and learns its regions.
    fn connect(&self, addr: &str) -> Result<Arc<dyn Connection>>;

    /// Registered buffers for endpoints using this connector, when the NIC needs them
    /// (rdma); `None` means heap memory will do.
    fn buf_allocator(&self) -> Result<Option<Arc<dyn crate::BufAllocator>>> {
        Ok(None)
    }
}
