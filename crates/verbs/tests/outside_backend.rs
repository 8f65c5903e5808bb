//! The conformance suite on a backend written outside this crate (the `thread_backend`
//! example, which uses the public API only): proof that a verbs backend can live elsewhere.

use std::sync::Arc;
use std::time::Duration;

use dmkit_verbs::conformance::Harness;
use dmkit_verbs::{Endpoint, MemoryNode, NodeId, Result};

#[path = "../examples/thread_backend.rs"]
mod thread_backend;

struct ThreadHarness(thread_backend::ThreadFabric);

impl ThreadHarness {
    fn new() -> Self {
        Self(thread_backend::ThreadFabric::new(Duration::from_secs(1)))
    }
}

impl Harness for ThreadHarness {
    fn start_node(&self, node: Arc<MemoryNode>) -> Result<()> {
        self.0.serve(node)
    }
    fn endpoint(&self) -> Result<Endpoint> {
        self.0.endpoint()
    }
    fn kill_node(&self, id: NodeId) {
        self.0.kill(id)
    }
    fn pause_node(&self, id: NodeId, paused: bool) {
        self.0.pause(id, paused)
    }
    fn op_timeout(&self) -> Duration {
        Duration::from_secs(1)
    }
}

dmkit_verbs::conformance_tests!(ThreadHarness::new());

#[test]
fn the_example_runs() {
    thread_backend::main().expect("the example's main");
}

#[test]
fn a_dropped_completer_fails_its_work_at_once() {
    let (p, done) = dmkit_verbs::Pending::<u32>::channel(NodeId(3), Duration::from_secs(30));
    drop(done);
    let t = std::time::Instant::now();
    assert!(matches!(
        p.wait(),
        Err(dmkit_verbs::Error::Disconnected {
            node: NodeId(3),
            ..
        })
    ));
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "waited for the timeout"
    );
    let (p, done) = dmkit_verbs::Pending::channel(NodeId(3), Duration::from_secs(30));
    std::thread::spawn(move || done.complete(Ok(7u32)));
    assert_eq!(dmkit_verbs::block_on(p).unwrap(), 7);
}

#[test]
fn a_remote_backend_fills_a_result_from_the_requests_alone() {
    use dmkit_verbs::{Access, Batch, DramBacking, OpKind};
    // What a backend with a wire in between does: ship the requests, execute them on the
    // node one by one, and fill the batch's result from the answers.
    let node = MemoryNode::new(NodeId(0));
    let r = node
        .register(Arc::new(DramBacking::new(4096)), Access::ALL, None)
        .unwrap();
    let mut b = Batch::new(NodeId(0));
    b.write(r.at(0), b"12345678");
    let cas = b.cas(r.at(0), u64::from_le_bytes(*b"12345678"), 9);
    let read = b.read(r.at(0), 8);
    let answers: Vec<(Vec<u8>, u64)> = b
        .requests()
        .map(|wr| {
            let mut dst = vec![
                0;
                if wr.kind == OpKind::Read {
                    wr.len as usize
                } else {
                    0
                }
            ];
            let old = node.execute_request(&wr, &mut dst).unwrap();
            (dst, old)
        })
        .collect();
    let mut res = b.into_result();
    for (i, (data, old)) in answers.into_iter().enumerate() {
        res.read_dest(i).copy_from_slice(&data);
        res.set_old(i, old);
    }
    assert!(res.cas_succeeded(cas));
    assert_eq!(res.read(read), 9u64.to_le_bytes());
    // A request whose destination does not fit is refused before memory is touched.
    let mut b = Batch::new(NodeId(0));
    b.read(r.at(0), 8);
    let wr = b.requests().next().unwrap();
    assert!(node.execute_request(&wr, &mut [0; 4]).is_err());
}
