//! A verbs backend written outside `dmkit-verbs`, on its public API only: every memory node is
//! served by a thread of its own, and a client's connection hands that thread its batches and
//! RPCs over a channel; the thread executes them on the node ([`MemoryNode::execute_batch`],
//! [`MemoryNode::serve_rpc`]) and completes them through a [`Completer`]. Anything built on an
//! [`Endpoint`] (the RACE index, FUSEE, Gengar) runs on it unchanged. The same backend passes
//! the crate's conformance suite (`crates/verbs/tests/outside_backend.rs`).
//!
//! `cargo run -p dmkit-verbs --example thread_backend`

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, mpsc};
use std::time::Duration;

use dmkit_verbs::{
    Access, Batch, BatchResult, Completer, Connection, Connector, DramBacking, Endpoint, Error,
    MemoryNode, NodeId, Peer, Pending, PostCtx, RegionDesc, Result,
};
use parking_lot::{Condvar, Mutex};

/// Work for a node's thread, with the half that completes it.
enum Work {
    Batch(Batch, Completer<BatchResult>),
    Rpc(Peer, Vec<u8>, Completer<Vec<u8>>),
}

/// What a node's thread and its clients share.
#[derive(Default)]
struct NodeState {
    dead: AtomicBool,
    paused: Mutex<bool>,
    resumed: Condvar,
}

struct Served {
    node: Arc<MemoryNode>,
    tx: mpsc::Sender<Work>,
    state: Arc<NodeState>,
}

/// The fabric: the nodes it serves, by id. Its [`Connector`] takes a node id as the address.
#[derive(Clone)]
pub struct ThreadFabric {
    nodes: Arc<Mutex<HashMap<NodeId, Served>>>,
    timeout: Duration,
    next_conn: Arc<AtomicU64>,
}

impl std::fmt::Debug for ThreadFabric {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ThreadFabric").finish_non_exhaustive()
    }
}

impl ThreadFabric {
    /// A fabric whose verbs time out after `timeout`.
    pub fn new(timeout: Duration) -> Self {
        Self {
            nodes: Arc::default(),
            timeout,
            next_conn: Arc::new(AtomicU64::new(1)),
        }
    }

    /// Starts serving `node` on a thread of its own.
    pub fn serve(&self, node: Arc<MemoryNode>) -> Result<()> {
        let (tx, rx) = mpsc::channel::<Work>();
        let state = Arc::new(NodeState::default());
        let (n, st) = (node.clone(), state.clone());
        std::thread::Builder::new()
            .name(format!("node-{}", node.id()))
            .spawn(move || {
                for work in rx {
                    let mut paused = st.paused.lock();
                    while *paused && !st.dead.load(Ordering::SeqCst) {
                        st.resumed.wait(&mut paused);
                    }
                    drop(paused);
                    if st.dead.load(Ordering::SeqCst) {
                        // Dropping the work's completer fails it: the node is gone.
                        continue;
                    }
                    match work {
                        Work::Batch(b, done) => done.complete(n.execute_batch(b)),
                        Work::Rpc(peer, req, done) => {
                            done.complete(n.serve_rpc(&peer, &req).map_err(|reason| Error::Rpc {
                                node: n.id(),
                                reason,
                            }))
                        }
                    }
                }
            })?;
        self.nodes
            .lock()
            .insert(node.id(), Served { node, tx, state });
        Ok(())
    }

    /// Kills a node: its thread drops what it holds and every connection to it breaks.
    pub fn kill(&self, id: NodeId) {
        if let Some(s) = self.nodes.lock().remove(&id) {
            s.state.dead.store(true, Ordering::SeqCst);
            let _guard = s.state.paused.lock();
            s.state.resumed.notify_all();
        }
    }

    /// Makes a node hang (its thread holds work until resumed) or answer again.
    pub fn pause(&self, id: NodeId, paused: bool) {
        if let Some(s) = self.nodes.lock().get(&id) {
            *s.state.paused.lock() = paused;
            s.state.resumed.notify_all();
        }
    }

    /// An endpoint connected to every node served now.
    pub fn endpoint(&self) -> Result<Endpoint> {
        let mut ids: Vec<NodeId> = self.nodes.lock().keys().copied().collect();
        ids.sort();
        let nodes: Vec<(NodeId, String)> = ids.into_iter().map(|i| (i, i.0.to_string())).collect();
        Endpoint::connect(self, &nodes)
    }
}

impl Connector for ThreadFabric {
    fn connect(&self, addr: &str) -> Result<Arc<dyn Connection>> {
        let refused = |reason: &str| Error::Connect {
            addr: addr.to_string(),
            reason: reason.to_string(),
        };
        let id = NodeId(addr.parse().map_err(|_| refused("not a node id"))?);
        let nodes = self.nodes.lock();
        let s = nodes.get(&id).ok_or_else(|| refused("no such node"))?;
        Ok(Arc::new(ThreadConnection {
            id,
            node: s.node.clone(),
            tx: Mutex::new(s.tx.clone()),
            state: s.state.clone(),
            regions: Mutex::new(s.node.regions()),
            open: AtomicBool::new(true),
            conn_id: self.next_conn.fetch_add(1, Ordering::Relaxed),
            timeout: self.timeout,
        }))
    }
}

/// A client's connection to one node of the fabric.
struct ThreadConnection {
    id: NodeId,
    node: Arc<MemoryNode>,
    tx: Mutex<mpsc::Sender<Work>>,
    state: Arc<NodeState>,
    regions: Mutex<Vec<RegionDesc>>,
    open: AtomicBool,
    conn_id: u64,
    timeout: Duration,
}

impl std::fmt::Debug for ThreadConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ThreadConnection")
            .field("node", &self.id)
            .finish()
    }
}

impl ThreadConnection {
    fn broken(&self) -> Option<Error> {
        if self.state.dead.load(Ordering::SeqCst) {
            Some(Error::NodeFailed { node: self.id })
        } else if !self.open.load(Ordering::SeqCst) {
            Some(Error::Disconnected {
                node: self.id,
                reason: "closed".into(),
            })
        } else {
            None
        }
    }

    /// Hands `work` to the node's thread (a send to a gone thread drops the completer,
    /// which fails the work).
    fn send<T: Send + 'static>(&self, make: impl FnOnce(Completer<T>) -> Work) -> Pending<T> {
        if let Some(e) = self.broken() {
            return Pending::ready(self.id, Err(e));
        }
        let (pending, done) = Pending::channel(self.id, self.timeout);
        let _ = self.tx.lock().send(make(done));
        pending
    }
}

impl Connection for ThreadConnection {
    fn node(&self) -> NodeId {
        self.id
    }
    fn regions(&self) -> Vec<RegionDesc> {
        self.regions.lock().clone()
    }
    fn refresh_regions(&self) -> Result<Vec<RegionDesc>> {
        if let Some(e) = self.broken() {
            return Err(e);
        }
        let r = self.node.regions();
        *self.regions.lock() = r.clone();
        Ok(r)
    }
    fn post(&self, batch: Batch, _ctx: PostCtx) -> Pending<BatchResult> {
        self.send(|done| Work::Batch(batch, done))
    }
    fn rpc(&self, req: &[u8], _ctx: PostCtx) -> Pending<Vec<u8>> {
        let peer = Peer {
            conn_id: self.conn_id,
            addr: format!("thread-client-{}", self.conn_id),
        };
        self.send(|done| Work::Rpc(peer, req.to_vec(), done))
    }
    fn is_alive(&self) -> bool {
        self.broken().is_none()
    }
    fn close(&self) {
        self.open.store(false, Ordering::SeqCst);
    }
    fn timeout(&self) -> Duration {
        self.timeout
    }
}

#[allow(dead_code)] // (The conformance test includes this file for the backend alone.)
pub fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    let fabric = ThreadFabric::new(Duration::from_secs(1));
    let mut regions = Vec::new();
    for id in 0..2 {
        let node = Arc::new(MemoryNode::new(NodeId(id)));
        regions.push(node.register(Arc::new(DramBacking::new(1 << 20)), Access::ALL, None)?);
        node.set_rpc_handler(Arc::new(|_: &Peer, req: &[u8]| {
            Ok(req.iter().rev().copied().collect())
        }));
        fabric.serve(node)?;
    }
    let ep = fabric.endpoint()?;
    // One batch per node: a write, a CAS and a read back, each batch one round trip.
    for r in &regions {
        let mut b = ep.batch(r.node);
        b.write(r.at(64), b"written by an outside backend");
        let cas = b.cas(r.at(0), 0, 42);
        let read = b.read(r.at(64), 29);
        let res = ep.execute("demo", b)?;
        assert!(res.cas_succeeded(cas));
        println!(
            "node {}: {}",
            r.node,
            String::from_utf8_lossy(res.read(read))
        );
    }
    // Many verbs in flight from one thread, as futures.
    let reads = (0..64).map(|i| ep.read_async("demo", regions[i % 2].at(64), 8));
    let n = dmkit_verbs::block_on(dmkit_verbs::join_all(reads.collect()))
        .into_iter()
        .filter(|r| r.is_ok())
        .count();
    let reply = ep.rpc("demo", NodeId(1), b"olleh")?;
    println!(
        "{n} reads awaited together; rpc answered {:?}",
        String::from_utf8_lossy(&reply)
    );
    fabric.kill(NodeId(1));
    let err = ep.read("demo", regions[1].at(0), 8).unwrap_err();
    println!("after a kill: {err}");
    println!("thread_backend: ok");
    Ok(())
}
