//! The `tcp` backend: memory nodes in their own processes, reached over TCP. A soft NIC on the
//! node executes the one-sided verbs against registered memory with the same checks a real NIC
//! makes (rkey, bounds, access, alignment); atomics are atomic across all connections because
//! every access to registered memory is word-atomic.
//!
//! Both sides run on the process's I/O runtime ([`crate::runtime`], tokio): a connection is a
//! task and a socket, not a thread — 10 000 idle connections cost a memory node about 10 KiB
//! each and no thread. The frames a peer sent in one write are read at once, executed in
//! order, and answered in one write; clients send what their concurrent operations posted in
//! one write too (see [`crate::batched`]). [`TcpServer::traffic`] counts frames, reads and
//! writes. A thread blocked on a completion watches for the reader task's delivery for
//! `DMKIT_VERBS_SPIN_US` (default 200 µs, yielding its core between looks) before it sleeps,
//! so a reply within that time costs no wake-up of a sleeping thread.
//!
//! Admission: a node started with a cluster secret admits only peers that prove they know it
//! (HMAC challenge-response both ways; the secret never crosses the wire). Frames are
//! length-prefixed and versioned (see `frame`); a malformed or hostile frame closes that one
//! connection with a logged error.
//!
//! ```
//! use std::sync::Arc;
//! use dmkit_verbs::tcp::{TcpConnector, TcpServer, TcpServerConfig};
//! use dmkit_verbs::{Access, DramBacking, Endpoint, MemoryNode, NodeId};
//!
//! let node = Arc::new(MemoryNode::new(NodeId(3)));
//! let region = node.register(Arc::new(DramBacking::new(4096)), Access::ALL, None)?;
//! let server = TcpServer::start("127.0.0.1:0", node, TcpServerConfig::default())?;
//! let ep = Endpoint::connect(
//!     &TcpConnector::default(),
//!     &[(NodeId(3), server.local_addr().to_string())],
//! )?;
//! assert_eq!(ep.faa("count", region.at(0), 5)?, 0);
//! assert_eq!(ep.faa("count", region.at(0), 1)?, 5);
//! # Ok::<(), dmkit_verbs::Error>(())
//! ```

mod auth;
mod client;
pub mod frame;
mod server;

pub use client::{TcpConnection, TcpConnector};
pub use server::{TcpServer, TcpServerConfig, TcpTraffic, serve_frame};
