//! `dmkit memnode` as a real process on loopback: bad input, dead nodes, durable writes that
//! survive SIGKILL.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use dmkit_tests::procs::{Memnode, run_dmkit};
use dmkit_verbs::tcp::TcpConnector;
use dmkit_verbs::{Endpoint, Media, NodeId};

fn connect(addr: &str, id: u16) -> Endpoint {
    Endpoint::connect(&TcpConnector::default(), &[(NodeId(id), addr.to_string())])
        .expect("connect to the memnode")
}

fn one_line_error(args: &[&str], expect: &str) {
    let out = run_dmkit(args, Duration::from_secs(20));
    assert!(!out.status.success(), "{args:?} succeeded");
    let err = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<_> = err.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "{args:?}: not one line: {err}");
    assert!(
        lines[0].contains(expect),
        "{args:?}: expected '{expect}' in: {}",
        lines[0]
    );
}

#[test]
fn bad_sizes_and_addresses_exit_with_one_line_and_nonzero_status() {
    one_line_error(
        &["memnode", "--listen", "127.0.0.1:0", "--dram", "64XB"],
        "unknown unit",
    );
    one_line_error(
        &["memnode", "--listen", "127.0.0.1:0", "--dram", "0"],
        "greater than zero",
    );
    one_line_error(
        &["memnode", "--listen", "not-an-address", "--dram", "1MiB"],
        "not-an-address",
    );
    one_line_error(&["memnode", "--listen", "127.0.0.1:0"], "nothing to serve");
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.pool");
    one_line_error(
        &[
            "memnode",
            "--listen",
            "127.0.0.1:0",
            "--pool",
            missing.to_str().unwrap(),
        ],
        "does not exist",
    );
    let held = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = held.local_addr().unwrap().to_string();
    one_line_error(
        &["memnode", "--listen", &addr, "--dram", "1MiB"],
        "cannot listen",
    );
}

#[test]
fn a_client_pointed_at_a_dead_address_gets_an_error_quickly() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let t = Instant::now();
    let r = Endpoint::connect(
        &TcpConnector::default(),
        &[(NodeId(0), format!("127.0.0.1:{port}"))],
    );
    // (Connect, normally. The port was free a moment ago; if another test's server has
    // just taken it, the handshake fails instead: a Protocol error, as quick and as clear.)
    assert!(
        matches!(
            r,
            Err(dmkit_verbs::Error::Connect { .. } | dmkit_verbs::Error::Protocol { .. })
        ),
        "{r:?}"
    );
    assert!(t.elapsed() < Duration::from_secs(5));
}

#[test]
fn a_killed_memnode_process_surfaces_as_an_error_within_the_timeout() {
    let mut node = Memnode::start(&["--id", "4", "--dram", "4MiB"]);
    let ep = connect(&node.addr, 4);
    let r = ep.regions(NodeId(4)).unwrap()[0];
    ep.write("t", r.at(0), b"alive").unwrap();
    assert_eq!(ep.read("t", r.at(0), 5).unwrap(), b"alive");
    node.kill9();
    let t = Instant::now();
    let e = ep.read("t", r.at(0), 5).unwrap_err();
    assert!(e.is_node_failure(), "{e}");
    assert!(t.elapsed() < Duration::from_secs(6));
}

#[test]
fn every_acknowledged_durable_write_survives_sigkill_and_restart() {
    let dir = tempfile::tempdir().unwrap();
    let pool = dir.path().join("node.pool");
    let pool_s = pool.to_str().unwrap();
    let mut node = Memnode::start(&["--pool", pool_s, "--size", "16MiB"]);
    let ep = connect(&node.addr, 0);
    let region = ep.regions(NodeId(0)).unwrap()[0];
    assert_eq!(region.media, Media::Nvm);

    // A writer acknowledges durable writes of distinct records until the node dies.
    let acked = Arc::new(parking_lot_free::AckLog::default());
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (ep, acked, stop) = (ep.clone(), acked.clone(), stop.clone());
        std::thread::spawn(move || {
            for i in 0u64.. {
                if stop.load(Ordering::SeqCst) {
                    break;
                }
                let off = (i % 4096) * 64;
                let rec = record(i);
                match ep.write_durable("w", region.at(off), &rec) {
                    Ok(()) => acked.push(i),
                    Err(_) => break,
                }
            }
        })
    };
    while acked.len() < 300 {
        std::thread::sleep(Duration::from_millis(5));
    }
    node.kill9();
    stop.store(true, Ordering::SeqCst);
    writer.join().unwrap();
    let acked = acked.take();
    assert!(acked.len() >= 300);

    let node2 = Memnode::start(&["--pool", pool_s]);
    let ep2 = connect(&node2.addr, 0);
    let r2 = ep2.regions(NodeId(0)).unwrap()[0];
    assert_eq!(
        r2.base, region.base,
        "the pool's remote address must be stable"
    );
    // The last acknowledged write of every slot must be there.
    let mut last = std::collections::HashMap::new();
    for i in &acked {
        last.insert(i % 4096, *i);
    }
    let all = ep2.read("r", r2.at(0), 4096 * 64).unwrap();
    for (slot, i) in last {
        let got = &all[(slot * 64) as usize..(slot * 64 + 64) as usize];
        // A later, unacknowledged write to the slot may also have landed.
        let seen = u64::from_le_bytes(got[..8].try_into().unwrap());
        assert!(
            seen >= i && seen % 4096 == slot,
            "slot {slot}: acked {i}, found {seen}"
        );
        assert_eq!(got, record(seen), "slot {slot} torn");
    }
}

fn record(i: u64) -> Vec<u8> {
    let mut v = i.to_le_bytes().to_vec();
    v.extend((0..56).map(|k| (i as u8).wrapping_mul(7).wrapping_add(k)));
    v
}

mod parking_lot_free {
    use std::sync::Mutex;

    /// Indices of acknowledged writes.
    #[derive(Default, Debug)]
    pub struct AckLog(Mutex<Vec<u64>>);

    impl AckLog {
        pub fn push(&self, i: u64) {
            self.0.lock().unwrap().push(i);
        }
        pub fn len(&self) -> usize {
            self.0.lock().unwrap().len()
        }
        pub fn take(&self) -> Vec<u64> {
            std::mem::take(&mut *self.0.lock().unwrap())
        }
    }
}
