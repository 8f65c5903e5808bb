//! Gengar: a distributed NVM/DRAM hybrid memory pool (ICDCS 2021), composed from dmkit's
//! layers — verbs for one-sided access, pmem-pool for the servers' NVM objects, lease for the
//! clients' cached addresses, cache for hot-object selection and DRAM admission.
//!
//! - **Global address space.** Objects live in the NVM pools of many servers; a
//!   [`GlobalAddr`] is (server, offset, generation, size). Clients place new objects on the
//!   server that reports the most free NVM (every reply carries free NVM and DRAM).
//! - **Hot objects in DRAM.** Clients count their reads and report their hottest objects every
//!   window; each server selects globally and promotes into its DRAM buffer (the DRAM copy
//!   holds the real data), evicting colder ones. Writes go through: DRAM and NVM when cached,
//!   NVM only otherwise, so eviction just drops the copy.
//! - **Leases.** A client needs a lease on an object to use its address: one round trip per
//!   access with a valid lease, two without (lease RPC, then the access). Free, promotion and
//!   eviction wait until the object's leases expired, plus a grace for operations posted
//!   under a lease that arrive late (`ServerConfig::late_op_grace`). Durations adapt per object
//!   (`dmkit_lease::LeaseTuner`): short for hot objects still in NVM, long in DRAM.
//! - **Proxied writes and locks.** [`GengarClient::write_proxied`] returns once the write is
//!   staged and posted; its [`Confirm`] fires when the server completed it. Unlocking a shared
//!   object waits for the object's outstanding confirms.
//! - **Stale addresses** are detected by generation: a read never returns a freed or
//!   re-allocated object's bytes.
//! - **Proxied writes go through the client's write proxy** (a thread per client,
//!   [`ClientConfig::proxy_thread`]): the writer returns once its data is copied and queued
//!   (bounded by the endpoint's staging capacity), whatever posting costs on the backend — on
//!   a software NIC such as SoftRoCE, the doorbell itself executes the write. The client's
//!   own later reads and writes of that object wait until it is posted, so they see it.
//! - **Any verbs backend.** Serve [`GengarServer::node`] with `sim`, `tcp` or `rdma`
//!   (`dmkit_verbs::rdma::RdmaServer`, which registers the NVM pool and the DRAM buffer with
//!   the NIC once); hot reads from a DRAM copy are then one RDMA READ of header and payload.
//!   `dmkit gengar-server --backend rdma` serves one; the rdma tier runs these tests on
//!   SoftRoCE.
//! - **Servers that go away.** A server killed or unreachable fails the operations on its own
//!   objects with [`Error::ServerDown`], at once; the others go on. With
//!   [`GengarClient::set_reconnect`] the client connects again when it is back and drops the
//!   old connection's leases; confirmed writes are in its pool and read back.
//! - **Many operations in flight.** Every operation has an `_async` form; one client (in an
//!   `Arc`) is shared by threads and tasks, as FUSEE's coroutines share theirs. A lock is
//!   held by one caller of the client at a time (not re-entrant): another task of the same
//!   client waits for the unlock, as another client does.
//!
//! ```
//! use std::sync::Arc;
//! use dmkit_gengar::{ClientConfig, GengarClient, GengarServer, ServerConfig};
//! use dmkit_lease::SystemClock;
//! use dmkit_pmem_pool::{Pool, PoolOptions};
//! use dmkit_verbs::NodeId;
//! use dmkit_verbs::sim::{SimCluster, SimConfig};
//!
//! let clock: Arc<dyn dmkit_lease::Clock> = Arc::new(SystemClock::new());
//! let cluster = SimCluster::new(SimConfig::default());
//! let nvm = Pool::create_dram(8 << 20, PoolOptions::default().block_size(64 << 10))?;
//! let server = GengarServer::new(NodeId(0), nvm, ServerConfig::default(), clock.clone())?;
//! cluster.add_node(server.node().clone());
//!
//! let client = GengarClient::new(cluster.endpoint(1)?, 1, ClientConfig::default(), clock)?;
//! let obj = client.alloc(64)?;
//! client.write(obj, 0, b"hello, hybrid memory")?;
//! assert_eq!(&client.read_at(obj, 0, 20)?, b"hello, hybrid memory");
//! client.free(obj)?;
//! assert!(client.read(obj).is_err());
//!
//! // Awaited: operations on several objects in flight at once from one thread.
//! let objs: Vec<_> = (0..8).map(|_| client.alloc(16)).collect::<Result<_, _>>()?;
//! let c = &client;
//! let written = dmkit_verbs::block_on(dmkit_verbs::join_all(
//!     objs.iter().map(|&o| async move { c.write_async(o, 0, b"in flight").await }).collect(),
//! ));
//! assert!(written.iter().all(Result::is_ok));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod addr;
mod client;
mod error;
mod proto;
mod server;

pub use addr::GlobalAddr;
pub use client::{ClientConfig, Confirm, GengarClient, Reconnect, tags};
/// The handle of a server's window thread ([`GengarServer::spawn_windows`]).
pub use dmkit_cache::WindowThread;
pub use error::{Error, Result};
pub use server::{DRAM_BASE, GengarServer, NVM_BASE, ServerConfig, ServerStats};

#[cfg(test)]
mod tests {
    use super::*;

    fn send<T: Send>(_: T) {}

    /// Every operation's future can be spawned on a multi-threaded executor (tokio): the
    /// layers' generic drivers (lease acquisition, locks) keep them `Send`.
    #[allow(dead_code)]
    fn operations_are_send(c: &GengarClient, a: GlobalAddr) {
        send(c.alloc_async(8));
        send(c.read_async(a));
        send(c.write_async(a, 0, b""));
        send(c.write_proxied_async(a, 0, b""));
        send(c.lock_async(a));
        send(c.unlock_async(a));
        send(c.free_async(a));
        send(c.flush_async());
        send(c.report_hot_async());
    }
}
