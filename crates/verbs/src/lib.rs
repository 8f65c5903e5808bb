//! One-sided verbs for disaggregated memory: memory regions with rkeys, READ, WRITE, CAS and
//! FAA on remote memory, doorbell batches, two-sided RPC, proxied writes with write confirms,
//! durable writes — over interchangeable backends that keep one contract:
//!
//! | backend | where | module |
//! |---|---|---|
//! | `sim` | in-process, with fault injection and a virtual-time latency model | [`sim`] |
//! | `tcp` | processes over TCP: a soft NIC on the memory node executes the verbs | [`tcp`] |
//! | `rdma` | libibverbs + librdmacm (feature `rdma`) | `rdma` |
//!
//! A memory node ([`MemoryNode`]) registers memory ([`Backing`]) and gets a descriptor with an
//! unpredictable rkey; a client ([`Endpoint`]) connects to nodes and posts [`Batch`]es. Every
//! operation is tagged so the layer can count round trips, verbs and bytes per operation kind
//! ([`Stats`]), also exported through the `metrics` facade as `dmkit_verbs_*`.
//!
//! ```
//! use std::sync::Arc;
//! use dmkit_verbs::sim::{SimCluster, SimConfig};
//! use dmkit_verbs::{Access, DramBacking, MemoryNode, NodeId};
//!
//! // A memory node with 1 MiB of DRAM, in-process.
//! let cluster = SimCluster::new(SimConfig::default());
//! let node = Arc::new(MemoryNode::new(NodeId(0)));
//! let region = node.register(Arc::new(DramBacking::new(1 << 20)), Access::ALL, None)?;
//! cluster.add_node(node);
//!
//! // A client: one batch = one doorbell = one round trip.
//! let ep = cluster.endpoint(1)?;
//! let mut batch = ep.batch(NodeId(0));
//! batch.write(region.at(64), b"value");
//! let swap = batch.cas(region.at(0), 0, 64);
//! let read = batch.read(region.at(64), 5);
//! let done = ep.execute("put", batch)?;
//! assert!(done.cas_succeeded(swap));
//! assert_eq!(done.read(read), b"value");
//! assert_eq!(ep.stats().tag("put").round_trips, 1);
//! # Ok::<(), dmkit_verbs::Error>(())
//! ```
//!
//! Completions are futures too: a [`Pending`] can be awaited on any executor (the backend's
//! delivering thread wakes the task; timeouts need no runtime), so one thread keeps many verbs
//! in flight. Every blocking call has an `_async` form:
//!
//! ```
//! # use std::sync::Arc;
//! # use dmkit_verbs::sim::{SimCluster, SimConfig};
//! # use dmkit_verbs::{Access, DramBacking, MemoryNode, NodeId};
//! # let cluster = SimCluster::new(SimConfig::default());
//! # let node = Arc::new(MemoryNode::new(NodeId(0)));
//! # let region = node.register(Arc::new(DramBacking::new(1 << 20)), Access::ALL, None)?;
//! # cluster.add_node(node);
//! let ep = cluster.endpoint(1)?;
//! // Post 100 FAAs at once, then await them (here with the std-only `block_on`).
//! let pending: Vec<_> = (0..100)
//!     .map(|_| {
//!         let mut b = ep.batch(NodeId(0));
//!         let i = b.faa(region.at(0), 1);
//!         (ep.post("count", b), i)
//!     })
//!     .collect();
//! let counted = dmkit_verbs::block_on(async {
//!     let mut olds = Vec::new();
//!     for (p, i) in pending {
//!         olds.push(ep.wait_async(p).await?.old(i));
//!     }
//!     let now = ep.read_async("count", region.at(0), 8).await?;
//!     Ok::<_, dmkit_verbs::Error>((olds.len(), now))
//! })?;
//! assert_eq!(counted, (100, 100u64.to_le_bytes().to_vec()));
//! assert_eq!(ep.in_flight(), 0);
//! # Ok::<(), dmkit_verbs::Error>(())
//! ```
//!
//! The same code runs over TCP by connecting the endpoint with [`tcp::TcpConnector`] to
//! nodes served by [`tcp::TcpServer`] (what `dmkit memnode` runs). Both sides of every tcp
//! connection are tasks on the process's I/O runtime ([`runtime`], tokio), which applications
//! may share for their own tasks; a blocking wait from one of its workers moves off it. The conformance suite that
//! every backend passes is in `conformance` (feature `test_utils`).
//!
//! # Writing a backend
//!
//! A backend is a [`Connector`] and its [`Connection`]s, and it can live outside this crate:
//! [`Connection::post`] reads a [`Batch`]'s [`Batch::requests`], has the node execute them
//! ([`MemoryNode::execute_request`] one by one on the far side of a wire, or
//! [`MemoryNode::execute_batch`] in-process), and delivers the [`BatchResult`]
//! ([`Batch::into_result`], filled with [`BatchResult::read_dest`] and
//! [`BatchResult::set_old`]) either at once ([`Pending::ready`]) or later from any thread
//! through the [`Completer`] of a [`Pending::channel`]; RPCs go to
//! [`MemoryNode::serve_rpc`]. A backend that can finish a batch on the calling thread
//! overrides [`Connection::post_blocking`], which blocking callers ([`Endpoint::execute`]) go
//! through: the rdma backend posts and polls its completion queue right there, with none of a
//! [`Pending`]'s hand-over. The example `thread_backend` (a thread per node, work over
//! channels; `cargo run -p dmkit-verbs --example thread_backend`) is such a backend in 200
//! lines, and passes the conformance suite (`tests/outside_backend.rs`).

#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod background;
mod backoff;
mod batch;
mod buf;
mod conn;
mod doorbell;
mod endpoint;
mod error;
mod facade;
mod memory;
mod message;
mod node;
mod pending;
mod per_node;
mod proxy;
mod reconnect;
mod redial;
pub mod runtime;
mod serve;
mod stats;
mod types;
mod views;
mod writer;

#[cfg(feature = "rdma")]
#[cfg_attr(docsrs, doc(cfg(feature = "rdma")))]
pub mod rdma;
pub mod record;
pub mod sim;
pub mod tcp;
pub mod wire;

#[cfg(any(test, feature = "test_utils"))]
#[cfg_attr(docsrs, doc(cfg(feature = "test_utils")))]
pub mod conformance;

pub use backoff::Backoff;
pub use batch::{Batch, BatchResult, OpIdx, WorkRequest};
pub use buf::{BufAllocator, ChunkOwner, HeapAllocator, MemBuf};
pub use conn::{Connection, Connector, Executed, PostCtx};
pub use doorbell::{Batched, batched};
pub use endpoint::{Endpoint, EndpointConfig, WriteConfirm};
pub use error::{AccessFault, Error, Result};
pub use memory::{Backing, DramBacking, FnBacking, RegionMemory};
pub use node::{MemoryNode, OpKind, Peer, RpcHandler};
/// Timeouts armed by awaited completions, process-wide (returns to zero once every awaited
/// verb completed or its future was dropped).
pub use pending::timer::armed as armed_timeouts;
/// An async sleep that needs no runtime (the verbs timer thread wakes the task).
pub use pending::timer::sleep;
pub use pending::{Completer, Pending, block_on, join_all};
pub use proxy::{OutstandingWrites, ProxiedWrite, WriteParts, WriteProxy};
pub use reconnect::{Reconnect, ReconnectError, Reconnector};
pub use stats::{Stats, Tag, TagStats};
pub use types::{Access, Media, NodeId, RKey, RegionDesc, RegionName, RemoteAddr};
pub use views::{NodeViews, View, ViewError};
pub use writer::ProxiedWriter;
