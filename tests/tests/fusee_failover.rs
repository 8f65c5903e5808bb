//! FUSEE survives the crash of a memory node, as real processes over `tcp` (or `rdma` in the
//! SoftRoCE tier: `DMKIT_TEST_BACKEND=rdma`, see `procs::backend`): three
//! `dmkit memnode`s with r = 3, a `dmkit master` (the failure detector), and YCSB-A clients
//! that log every acknowledged write. A memory node is SIGKILLed mid-run; afterwards every
//! key must hold its last acknowledged write, and the test reports how long writes stalled.

use std::collections::HashMap;
use std::time::Duration;

use dmkit_fusee::{Client, ClientConfig};
use dmkit_tests::procs::{
    Proc, ProcCluster, connector, endpoint_for, fnv1a_64, read_ack_log, run_dmkit, ycsb_a,
    ycsb_load,
};
use dmkit_verbs::NodeId;

const RECORDS: u64 = 300;

fn ycsb(file: &str, id: u64, share: &str, seconds: &str, log: &std::path::Path) -> Proc {
    ycsb_a(file, id, share, seconds, RECORDS, 64, log)
}

/// Reads every key back through a fresh client on the surviving nodes.
fn check_all(cluster: &ProcCluster, expected: &HashMap<String, (String, u64)>) {
    let conn = connector();
    let ep = endpoint_for(&*conn);
    for (i, m) in cluster.memnodes.iter().enumerate() {
        if let Ok(c) = conn.connect(&m.addr) {
            assert_eq!(c.node(), NodeId(i as u16));
            ep.add_connection(c);
        }
    }
    let ids: Vec<_> = (0..cluster.memnodes.len() as u16).map(NodeId).collect();
    let c = Client::connect(ep, &ids, ClientConfig::new(61)).unwrap();
    let mut wrong = Vec::new();
    for (key, (tag, hash)) in expected {
        match c.search(key.as_bytes()).unwrap() {
            Some(v) if fnv1a_64(&v) == *hash => {}
            Some(v) => wrong.push(format!(
                "{key}: expected {tag}, found {}",
                String::from_utf8_lossy(&v[..v.len().min(16)])
            )),
            None => wrong.push(format!("{key}: expected {tag}, found nothing")),
        }
    }
    assert!(
        wrong.is_empty(),
        "{} of {} keys lost their last acknowledged write: {:?}",
        wrong.len(),
        expected.len(),
        &wrong[..wrong.len().min(10)]
    );
}

/// The longest gap between consecutive acknowledgements (all clients) after `from_ms`.
fn longest_stall(times: &mut [u64], from_ms: u64) -> Duration {
    times.sort_unstable();
    let mut worst = 0;
    let mut prev = from_ms;
    for t in times.iter().copied().filter(|t| *t >= from_ms) {
        worst = worst.max(t - prev);
        prev = t;
    }
    Duration::from_millis(worst)
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

#[test]
fn sigkill_of_a_memnode_under_ycsb_a_loses_no_acknowledged_write() {
    let mut cluster = ProcCluster::start(3, 3, "64MiB");
    let file = cluster.file.clone();
    let dir = cluster.dir.path().to_path_buf();
    let load_log = dir.join("ack-load.log");
    ycsb_load(&file, 40, RECORDS, 64, &load_log);
    let children: Vec<_> = (0..4u64)
        .map(|i| {
            let log = dir.join(format!("ack-{i}.log"));
            (ycsb(&file, 41 + i, &format!("{i}/4"), "8", &log), log)
        })
        .collect();
    std::thread::sleep(Duration::from_secs(2));
    let killed_at = now_ms();
    // Node 0 holds the index primary.
    cluster.memnodes[0].kill9();
    let mut logs = vec![load_log];
    for (child, log) in children {
        let out = child.wait_with_output();
        assert!(
            out.status.success(),
            "ycsb failed across the failover: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        logs.push(log);
    }
    let mut expected = HashMap::new();
    let mut times = Vec::new();
    for log in &logs {
        read_ack_log(log, &mut expected, &mut times);
    }
    let after = times.iter().filter(|t| **t > killed_at).count();
    let stall = longest_stall(&mut times, killed_at);
    eprintln!(
        "memnode 0 SIGKILLed 2 s into the run: writes stalled at most {stall:?}, {after} writes acknowledged after the kill"
    );
    assert!(
        after > 50,
        "writes did not resume after the failover ({after})"
    );
    assert!(
        stall < Duration::from_secs(10),
        "writes stalled {stall:?} (detection is ~1 s)"
    );
    check_all(&cluster, &expected);
}

#[test]
fn a_client_and_a_memnode_killed_together_lose_no_acknowledged_write() {
    let mut cluster = ProcCluster::start(3, 3, "64MiB");
    let file = cluster.file.clone();
    let dir = cluster.dir.path().to_path_buf();
    let load_log = dir.join("ack-load.log");
    ycsb_load(&file, 50, RECORDS, 64, &load_log);
    let log_a = dir.join("ack-a.log");
    let log_b = dir.join("ack-b.log");
    let mut victim = ycsb(&file, 51, "0/2", "30", &log_a);
    let other = ycsb(&file, 52, "1/2", "6", &log_b);
    std::thread::sleep(Duration::from_secs(2));
    victim.kill();
    cluster.memnodes[2].kill9();
    // The victim restarts under its id: recovery finishes or rolls back what it left.
    let rerun = ycsb(&file, 51, "0/2", "2", &log_a).wait_with_output();
    assert!(
        rerun.status.success(),
        "the restarted client failed: {}",
        String::from_utf8_lossy(&rerun.stderr)
    );
    let out = other.wait_with_output();
    assert!(
        out.status.success(),
        "the surviving client failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut expected = HashMap::new();
    let mut times = Vec::new();
    for log in [&load_log, &log_a, &log_b] {
        read_ack_log(log, &mut expected, &mut times);
    }
    check_all(&cluster, &expected);
}

/// Whether memory node `id` (at `addr`) holds a membership in which it is a member.
fn is_member(addr: &str, id: u16) -> bool {
    let conn = connector();
    let Ok(c) = conn.connect(addr) else {
        return false;
    };
    let ep = endpoint_for(&*conn);
    ep.add_connection(c);
    dmkit_fusee::membership::query(&ep, NodeId(id))
        .ok()
        .and_then(|q| q.record)
        .is_some_and(|r| r.is_member(NodeId(id)) && !r.repairing)
}

#[test]
fn a_restarted_memnode_is_refilled_and_the_cluster_survives_another_failure() {
    let mut cluster = ProcCluster::start(3, 3, "64MiB");
    let file = cluster.file.clone();
    let dir = cluster.dir.path().to_path_buf();
    let load_log = dir.join("ack-load.log");
    ycsb_load(&file, 60, RECORDS, 64, &load_log);
    let logs: Vec<_> = (0..2u64)
        .map(|i| dir.join(format!("ack-{i}.log")))
        .collect();
    let clients: Vec<_> = (0..2u64)
        .map(|i| ycsb(&file, 61 + i, &format!("{i}/2"), "10", &logs[i as usize]))
        .collect();
    std::thread::sleep(Duration::from_millis(1500));
    let addr = cluster.memnodes[1].addr.clone();
    cluster.memnodes[1].kill9();
    // Wait until it is failed over (another member's record leaves it out).
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let other = cluster.memnodes[0].addr.clone();
    loop {
        let conn = connector();
        let c = conn.connect(&other).unwrap();
        let ep = endpoint_for(&*conn);
        ep.add_connection(c);
        let rec = dmkit_fusee::membership::query(&ep, NodeId(0))
            .unwrap()
            .record;
        if rec.is_some_and(|r| !r.is_member(NodeId(1)) && !r.repairing) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "node 1 never failed over"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // Back on the same address with an empty pool: the master refills it.
    cluster.memnodes[1] = dmkit_tests::procs::Memnode::start_on(
        &addr,
        &["--id", "1", "--dram", "64MiB", "--block-size", "64KiB"],
    );
    let t = std::time::Instant::now();
    while !is_member(&addr, 1) {
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "the restarted node was not readmitted"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    eprintln!(
        "memnode 1 refilled and readmitted {:?} after its restart",
        t.elapsed()
    );
    // The master said so: when the copy started, and when the node was back.
    let mut said = Vec::new();
    while let Ok(l) = cluster
        .master
        .stderr
        .recv_timeout(Duration::from_millis(300))
    {
        said.push(l);
    }
    let said = said.join("\n");
    assert!(
        said.contains("refilling memory node 1: copying") && said.contains("memory node rejoined"),
        "{said}"
    );
    // r is back to 3: another node may fail.
    cluster.memnodes[2].kill9();
    for c in clients {
        let out = c.wait_with_output();
        assert!(
            out.status.success(),
            "ycsb failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let mut expected = HashMap::new();
    let mut times = Vec::new();
    read_ack_log(&load_log, &mut expected, &mut times);
    for l in &logs {
        read_ack_log(l, &mut expected, &mut times);
    }
    check_all(&cluster, &expected);
}

/// The master is off the data path: with it down (and every memory node healthy, keeping its
/// lease through its peers) clients keep reading and writing.
#[test]
fn with_the_master_down_clients_keep_serving() {
    let mut cluster = ProcCluster::start(3, 3, "64MiB");
    let file = cluster.file.clone();
    // Let the heartbeats hand out leases, then stop the master for several lease lengths.
    std::thread::sleep(Duration::from_millis(500));
    cluster.master.kill9();
    std::thread::sleep(Duration::from_secs(2));
    for i in 0..5 {
        let (k, v) = (format!("k{i}"), format!("v{i}"));
        let put = run_dmkit(
            &["kv", "--cluster", &file, "--client-id", "90", "put", &k, &v],
            Duration::from_secs(30),
        );
        assert!(
            put.status.success(),
            "put with the master down: {}",
            String::from_utf8_lossy(&put.stderr)
        );
        let get = run_dmkit(
            &["kv", "--cluster", &file, "--client-id", "90", "get", &k],
            Duration::from_secs(30),
        );
        assert_eq!(String::from_utf8_lossy(&get.stdout).trim(), v);
    }
    for m in &cluster.memnodes {
        let fenced: Vec<_> = std::iter::from_fn(|| m.stderr.try_recv().ok())
            .filter(|l| l.contains("fenced"))
            .collect();
        assert!(
            fenced.is_empty(),
            "a healthy memnode fenced itself: {fenced:?}"
        );
    }
}

/// A client's connection to a live member times out (the path between them stalled for
/// longer than the client's op timeout, while the master hears every member): the client
/// cannot tell whether its verbs will still run, no failover is coming, and its connection is
/// dead. It used to wait for a newer epoch until `failover_wait` and fail — and every later
/// operation did the same (a gateway wedged until restarted: "no membership newer than
/// epoch 179 within 30s" with the master up at 179). Now it asks the master for a resync
/// after `resync_after`, reconnects in the new epoch and the operation succeeds.
#[test]
fn a_client_whose_connection_to_a_live_member_timed_out_recovers_without_a_restart() {
    use dmkit_tests::proxy::Relay;
    if dmkit_tests::procs::backend() != "tcp" {
        return; // (the relay is a tcp one)
    }
    let cluster = ProcCluster::start(3, 3, "64MiB");
    // This client reaches node 1 through a relay of its own; the master and the other
    // memory nodes reach it directly.
    let relay = Relay::start(&cluster.memnodes[1].addr);
    let addrs: Vec<String> = (0..3)
        .map(|i| match i {
            1 => relay.addr().to_string(),
            _ => cluster.memnodes[i].addr.clone(),
        })
        .collect();
    let connector = std::sync::Arc::new(dmkit_verbs::tcp::TcpConnector {
        op_timeout: Duration::from_millis(300),
        ..Default::default()
    });
    let ep = dmkit_verbs::Endpoint::default();
    for a in &addrs {
        ep.add_connection(dmkit_verbs::Connector::connect(&*connector, a).unwrap());
    }
    let mut cfg = ClientConfig::new(62);
    cfg.failover_wait = Duration::from_secs(10);
    let reconnect_addrs = addrs.clone();
    let reconnect_with = connector.clone();
    cfg.reconnect = Some(std::sync::Arc::new(move |n: NodeId| {
        dmkit_verbs::Connector::connect(&*reconnect_with, &reconnect_addrs[usize::from(n.0)])
    }));
    let ids: Vec<_> = (0..3).map(NodeId).collect();
    let c = Client::connect(ep, &ids, cfg).unwrap();
    for i in 0..20 {
        c.upsert(format!("k{i}").as_bytes(), b"before").unwrap();
    }
    let epoch = c.epoch();
    // The stall: longer than the op timeout, shorter than the master's miss window and the
    // members' lease (node 1 stays a healthy member throughout).
    relay.cut();
    let healer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(700));
        relay.heal();
        relay
    });
    let t = std::time::Instant::now();
    for i in 0..20 {
        c.upsert(format!("k{i}").as_bytes(), b"after")
            .unwrap_or_else(|e| {
                panic!(
                    "upsert {i} failed {:?} after the stall began: {e}",
                    t.elapsed()
                )
            });
    }
    let took = t.elapsed();
    let _relay = healer.join().unwrap();
    eprintln!(
        "a connection to a live member timed out: the client resumed after {took:?} (epoch {epoch} → {})",
        c.epoch()
    );
    assert!(c.epoch() > epoch, "no resync happened");
    assert!(took < Duration::from_secs(6), "{took:?}");
    for i in 0..20 {
        assert_eq!(
            c.search(format!("k{i}").as_bytes()).unwrap().as_deref(),
            Some(&b"after"[..])
        );
    }
}
