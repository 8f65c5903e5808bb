//! The conformance suite on the `rdma` backend: memory nodes are served in this process by
//! `RdmaServer`s; clients connect over rdma-cm to `$SOFTROCE_IP` (the SoftRoCE guest's
//! address; see /work/shared/softroce) or, when unset, to the first active RDMA port's IPv4
//! address. Run inside the SoftRoCE guest:
//!
//! ```text
//! CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUNNER="bash $(realpath ../shared/softroce/run-in-softroce.sh)" \
//!     cargo test -p dmkit-verbs --features rdma --test conformance_rdma
//! ```
//!
//! A *paused* node is emulated honestly at the NIC: `RdmaServer::pause(true)` moves the
//! node's QPs to RESET, where the NIC drops every incoming packet, so clients' verbs go
//! unanswered and their NICs retransmit; resuming restores the QPs to RTS at the same PSNs.
//! A *killed* node is a server shutdown: rdma-cm disconnects every client.
#![cfg(feature = "rdma")]

use std::sync::Arc;
use std::time::Duration;

use dmkit_verbs::conformance::Harness;
use dmkit_verbs::rdma::{RdmaConfig, RdmaConnector, RdmaServer};
use dmkit_verbs::{Connector, Endpoint, EndpointConfig, MemoryNode, NodeId, Result};
use parking_lot::Mutex;

#[derive(Debug)]
pub struct RdmaHarness {
    servers: Mutex<Vec<RdmaServer>>,
    connector: RdmaConnector,
    ip: String,
}

/// Emulated RDMA is slow (SoftRoCE under TCG): a generous operation timeout, below the
/// NIC's retry budget (ack timeout 2^17 × 4.096 µs ≈ 0.54 s, 7 retries ≈ 3.8 s), so a
/// hung node shows as our timeout rather than as a transport retry error.
const OP_TIMEOUT: Duration = Duration::from_secs(3);

impl RdmaHarness {
    pub fn new() -> Self {
        let ip = match std::env::var("SOFTROCE_IP") {
            Ok(ip) if !ip.is_empty() => ip,
            _ => dmkit_verbs::rdma::first_active_device()
                .expect("an active RDMA device (run this test inside the SoftRoCE guest)")
                .ipv4
                .to_string(),
        };
        let config = RdmaConfig {
            op_timeout: OP_TIMEOUT,
            connect_timeout: Duration::from_secs(10),
            ..RdmaConfig::from_env().expect("DMKIT_RDMA_* settings")
        };
        Self {
            servers: Mutex::new(Vec::new()),
            connector: RdmaConnector::new(config),
            ip,
        }
    }
}

impl Default for RdmaHarness {
    fn default() -> Self {
        Self::new()
    }
}

impl Harness for RdmaHarness {
    fn start_node(&self, node: Arc<MemoryNode>) -> Result<()> {
        let s = RdmaServer::start(
            &format!("{}:0", self.ip),
            node,
            self.connector.config.clone(),
        )?;
        self.servers.lock().push(s);
        Ok(())
    }

    fn endpoint(&self) -> Result<Endpoint> {
        let ep = Endpoint::with_allocator(
            EndpointConfig::default(),
            Arc::new(self.connector.allocator()?),
        );
        let nodes: Vec<_> = self
            .servers
            .lock()
            .iter()
            .map(|s| (s.node().id(), s.local_addr().to_string()))
            .collect();
        for (id, addr) in nodes {
            let c = self.connector.connect(&addr)?;
            assert_eq!(c.node(), id);
            ep.add_connection(c);
        }
        Ok(ep)
    }

    fn kill_node(&self, id: NodeId) {
        let mut servers = self.servers.lock();
        if let Some(i) = servers.iter().position(|s| s.node().id() == id) {
            let mut s = servers.remove(i);
            s.shutdown();
        }
    }

    fn pause_node(&self, id: NodeId, paused: bool) {
        for s in self.servers.lock().iter() {
            if s.node().id() == id {
                s.pause(paused);
            }
        }
    }

    fn op_timeout(&self) -> Duration {
        OP_TIMEOUT
    }
}

dmkit_verbs::conformance_tests!(RdmaHarness::new());

/// Bad configuration is one clear error naming the device, never a crash.
#[test]
fn bad_device_settings_are_clear_errors() {
    let bad = RdmaConnector::new(RdmaConfig {
        device: Some("no_such_dev0".into()),
        ..RdmaConfig::default()
    });
    let e = bad.allocator().unwrap_err().to_string();
    assert!(e.contains("no_such_dev0"), "{e}");
    let dev = dmkit_verbs::rdma::first_active_device().unwrap();
    let bad_gid = RdmaConnector::new(RdmaConfig {
        gid_index: Some(100_000),
        device: Some(dev.device.clone()),
        ..RdmaConfig::default()
    });
    let e = bad_gid.connect("10.11.12.13:1").unwrap_err().to_string();
    assert!(
        e.contains("GID index 100000") && e.contains(&dev.device),
        "{e}"
    );
    let bad_port = RdmaConnector::new(RdmaConfig {
        port: 9,
        ..RdmaConfig::default()
    });
    let e = bad_port.allocator().unwrap_err().to_string();
    assert!(e.contains("no port 9"), "{e}");
}

/// Not a property: prints round-trip latency of 8-byte READs, batched FAA throughput and a
/// 64 KiB WRITE's bandwidth on this device (`--ignored --nocapture`). Emulated figures are
/// only comparable with perftest run in the same guest.
#[test]
#[ignore]
fn measure() {
    use dmkit_verbs::conformance::simple_node;
    use std::time::Instant;
    let h = RdmaHarness::new();
    let r = simple_node(&h, 0, 1 << 20);
    let ep = h.endpoint().unwrap();
    let n = 2000;
    let t = Instant::now();
    for _ in 0..n {
        ep.read("r", r.at(0), 8).unwrap();
    }
    let rt = t.elapsed() / n;
    let t = Instant::now();
    let batches = 200;
    for _ in 0..batches {
        let mut b = ep.batch(NodeId(0));
        for _ in 0..50 {
            b.faa(r.at(64), 1);
        }
        ep.execute("faa", b).unwrap();
    }
    let faa = f64::from(batches * 50) / t.elapsed().as_secs_f64();
    let data = vec![7u8; 64 << 10];
    let t = Instant::now();
    for _ in 0..200 {
        ep.write("w", r.at(0), &data).unwrap();
    }
    let mbs = 200.0 * 64.0 / 1024.0 / t.elapsed().as_secs_f64();
    let t = Instant::now();
    for _ in 0..500 {
        ep.rpc("rpc", NodeId(0), b"ping").unwrap_err();
    }
    let rpc = t.elapsed() / 500;
    println!(
        "rdma: READ 8 B round trip {rt:?}; FAA (batches of 50) {faa:.0}/s; WRITE 64 KiB {mbs:.1} MB/s; \
         RPC (no handler) round trip {rpc:?}"
    );
}

/// `record::doorbells` counts this thread's `ibv_post_send` calls: one batch of several verbs
/// on one node is one doorbell, whatever its length (what `bench fusee --breakdown` sets beside
/// the raw replay's).
#[test]
fn a_batch_is_one_doorbell() {
    use dmkit_verbs::{Access, DramBacking, record};
    let h = RdmaHarness::new();
    let node = Arc::new(MemoryNode::new(NodeId(0)));
    let region = node
        .register(Arc::new(DramBacking::new(4096)), Access::ALL, None)
        .unwrap();
    h.start_node(node).unwrap();
    let ep = h.endpoint().unwrap();
    // (The first verb may learn the region table; count from the second.)
    ep.write("warm", region.at(0), b"warm").unwrap();
    let (n0, w0) = record::doorbells();
    let mut b = ep.batch(NodeId(0));
    b.write(region.at(64), b"hello");
    let read = b.read(region.at(64), 5);
    b.cas(region.at(128), 0, 7);
    let res = ep.execute("doorbells", b).unwrap();
    assert_eq!(res.read(read), b"hello");
    let (n1, w1) = record::doorbells();
    assert_eq!(n1 - n0, 1, "one batch, one doorbell");
    assert_eq!(w1 - w0, 3, "its three work requests");
}
