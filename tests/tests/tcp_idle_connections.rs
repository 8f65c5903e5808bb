//! A `dmkit memnode` with 10 000 idle tcp connections: they cost it memory, not threads
//! (connections are tasks on its I/O runtime), and it goes on serving.

use std::time::Duration;

use dmkit_tests::procs::{Memnode, backend};
use dmkit_verbs::tcp::{TcpConnection, TcpConnector};
use dmkit_verbs::{Connection, Endpoint, NodeId};

/// `Threads:` and `VmRSS:` (KiB) of a process.
fn threads_and_rss(pid: u32) -> (usize, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    let field = |name: &str| -> u64 {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{name} in /proc/{pid}/status"))
    };
    (field("Threads:") as usize, field("VmRSS:"))
}

#[test]
fn ten_thousand_idle_connections_cost_a_memnode_no_threads() {
    if backend() != "tcp" {
        eprintln!("tcp connections only: skipped on backend {}", backend());
        return;
    }
    const CONNS: usize = 10_000;
    let node = Memnode::start(&["--id", "4", "--dram", "1MiB"]);
    let cfg = TcpConnector {
        connect_timeout: Duration::from_secs(20),
        ..TcpConnector::default()
    };
    let first = TcpConnection::connect(&cfg, &node.addr).expect("first connection");
    assert_eq!(first.node(), NodeId(4));
    let (before, rss_before) = threads_and_rss(node.pid());

    // Four threads open them, each connection with its handshake done.
    let conns: Vec<TcpConnection> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..4)
            .map(|_| {
                s.spawn(|| {
                    (0..CONNS / 4)
                        .map(|_| TcpConnection::connect(&cfg, &node.addr).expect("connect"))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        hs.into_iter()
            .flat_map(|h| h.join().expect("connecting thread"))
            .collect()
    });
    assert_eq!(conns.len(), CONNS);
    assert!(conns.iter().all(|c| c.is_alive()));
    let (after, rss_after) = threads_and_rss(node.pid());
    eprintln!(
        "memnode with {CONNS} idle connections: {before} -> {after} threads, RSS {rss_before} -> {rss_after} KiB ({:.1} KiB per connection)",
        (rss_after.saturating_sub(rss_before)) as f64 / CONNS as f64
    );
    assert!(
        after <= before + 4,
        "{CONNS} connections took threads: {before} -> {after}"
    );

    // It still serves, on a fresh connection and on an old one.
    let ep = Endpoint::connect(&cfg, &[(NodeId(4), node.addr.clone())]).expect("endpoint");
    let region = ep.regions(NodeId(4)).expect("regions")[0];
    ep.write("w", region.at(0), b"idle").expect("write");
    assert_eq!(ep.read("r", region.at(0), 4).expect("read"), b"idle");
    assert_eq!(
        conns[CONNS / 2]
            .refresh_regions()
            .expect("an idle connection still answers")
            .len(),
        1
    );
    drop(conns);
    assert_eq!(ep.read("r", region.at(0), 4).expect("read after"), b"idle");
}
