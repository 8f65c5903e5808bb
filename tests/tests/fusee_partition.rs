//! A memory node partitioned away instead of killed: three `dmkit memnode`s, each in its own
//! network namespace (ip netns, a veth pair to the host, which routes between them), the
//! master and YCSB-A clients on the host. One node's link goes down mid-run: it fences itself
//! when its lease runs out, the master fails it over, no acknowledged write is lost, and a
//! client inside the partition cannot write through it. When the link comes back, the node
//! is refilled and readmitted.
//!
//! Needs root and iproute2: the `netns` tier of `.ci/run` runs it
//! (`cargo test -p dmkit-tests --test fusee_partition -- --ignored`).

use std::collections::HashMap;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use dmkit_fusee::{Client, ClientConfig};
use dmkit_tests::procs::{Daemon, Proc, cluster_file, dmkit_bin, fnv1a_64, ycsb_a, ycsb_load};
use dmkit_verbs::tcp::TcpConnector;
use dmkit_verbs::{Connector, Endpoint, NodeId};

const RECORDS: u64 = 200;

fn sh(args: &[&str]) {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .unwrap_or_else(|e| panic!("cannot run {args:?}: {e} (is iproute2 installed?)"));
    assert!(
        out.status.success(),
        "{args:?} failed (root and iproute2 needed): {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Three namespaces with a veth each to the host; removed when dropped.
struct Net {
    tag: String,
    forward_was: String,
}

impl Net {
    fn ns(&self, i: usize) -> String {
        format!("{}n{i}", self.tag)
    }
    fn host_link(&self, i: usize) -> String {
        format!("{}h{i}", self.tag)
    }
    fn addr(i: usize) -> String {
        format!("10.213.{i}.2")
    }

    fn new() -> Net {
        let tag = format!("dk{}", std::process::id() % 10_000);
        let forward_was = std::fs::read_to_string("/proc/sys/net/ipv4/ip_forward")
            .unwrap_or_else(|_| "0".into())
            .trim()
            .to_string();
        let net = Net { tag, forward_was };
        sh(&["sysctl", "-qw", "net.ipv4.ip_forward=1"]);
        for i in 0..3 {
            let (ns, h, n) = (net.ns(i), net.host_link(i), format!("{}v{i}", net.tag));
            sh(&["ip", "netns", "add", &ns]);
            sh(&["ip", "link", "add", &h, "type", "veth", "peer", "name", &n]);
            sh(&["ip", "link", "set", &n, "netns", &ns]);
            sh(&["ip", "addr", "add", &format!("10.213.{i}.1/24"), "dev", &h]);
            sh(&["ip", "link", "set", &h, "up"]);
            let inns = |args: &[&str]| {
                let mut v = vec!["ip", "netns", "exec", &ns];
                v.extend_from_slice(args);
                sh(&v);
            };
            inns(&[
                "ip",
                "addr",
                "add",
                &format!("{}/24", Net::addr(i)),
                "dev",
                &n,
            ]);
            inns(&["ip", "link", "set", &n, "up"]);
            inns(&["ip", "link", "set", "lo", "up"]);
            inns(&[
                "ip",
                "route",
                "add",
                "default",
                "via",
                &format!("10.213.{i}.1"),
            ]);
        }
        net
    }

    fn set_link(&self, i: usize, up: bool) {
        sh(&[
            "ip",
            "link",
            "set",
            &self.host_link(i),
            if up { "up" } else { "down" },
        ]);
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        for i in 0..3 {
            let _ = Command::new("ip")
                .args(["netns", "del", &self.ns(i)])
                .output();
            let _ = Command::new("ip")
                .args(["link", "del", &self.host_link(i)])
                .output();
        }
        let _ = Command::new("sysctl")
            .args(["-qw", &format!("net.ipv4.ip_forward={}", self.forward_was)])
            .output();
    }
}

fn ycsb(file: &str, id: u64, share: &str, seconds: &str, log: &Path) -> Proc {
    ycsb_a(file, id, share, seconds, RECORDS, 64, log)
}

fn membership_of(addr: &str, id: u16) -> Option<dmkit_fusee::membership::Membership> {
    let c = TcpConnector {
        connect_timeout: Duration::from_millis(500),
        op_timeout: Duration::from_millis(500),
        ..TcpConnector::default()
    }
    .connect(addr)
    .ok()?;
    let ep = Endpoint::default();
    ep.add_connection(c);
    dmkit_fusee::membership::query(&ep, NodeId(id)).ok()?.record
}

fn wait_for(what: &str, limit: Duration, mut cond: impl FnMut() -> bool) -> Duration {
    let t = Instant::now();
    while !cond() {
        assert!(t.elapsed() < limit, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
    t.elapsed()
}

#[test]
#[ignore = "needs root and iproute2: run by .ci/tier-netns.sh"]
fn a_partitioned_memnode_is_fenced_and_no_acknowledged_write_is_lost() {
    let net = Net::new();
    let dir = tempfile::tempdir().unwrap();
    let ip = Path::new("/usr/sbin/ip");
    let ip = if ip.exists() { ip } else { Path::new("ip") };
    let bin = dmkit_bin();
    let mut memnodes: Vec<Daemon> = (0..3)
        .map(|i| {
            let ns = net.ns(i);
            let listen = format!("{}:7700", Net::addr(i));
            let id = i.to_string();
            Daemon::start_program(
                ip,
                &[
                    "netns",
                    "exec",
                    &ns,
                    bin.to_str().unwrap(),
                    "memnode",
                    "--listen",
                    &listen,
                    "--id",
                    &id,
                    "--dram",
                    "64MiB",
                    "--block-size",
                    "64KiB",
                ],
                " serving ",
                &[],
            )
        })
        .collect();
    let addrs: Vec<_> = (0..3u16)
        .map(|i| (i, format!("{}:7700", Net::addr(usize::from(i)))))
        .collect();
    let file = cluster_file(dir.path(), "127.0.0.1:0", 3, &addrs)
        .to_str()
        .unwrap()
        .to_string();
    let _master = Daemon::start(
        &["master", "--listen", "127.0.0.1:0", "--cluster", &file],
        "serving on",
    );
    let load_log = dir.path().join("ack-load.log");
    ycsb_load(&file, 70, RECORDS, 64, &load_log);
    let logs: Vec<_> = (0..2)
        .map(|i| dir.path().join(format!("ack-{i}.log")))
        .collect();
    let clients: Vec<_> = (0..2u64)
        .map(|i| ycsb(&file, 71 + i, &format!("{i}/2"), "14", &logs[i as usize]))
        .collect();
    std::thread::sleep(Duration::from_secs(2));

    // Cut node 2 off from everyone.
    net.set_link(2, false);
    let t = Instant::now();
    wait_for("node 2 failed over", Duration::from_secs(30), || {
        membership_of(&addrs[0].1, 0).is_some_and(|m| !m.is_member(NodeId(2)) && !m.repairing)
    });
    eprintln!(
        "partitioned node 2 failed over {:?} after the cut",
        t.elapsed()
    );
    // It fenced itself: a client inside its partition cannot write through it.
    let inside = Command::new(ip)
        .args(["netns", "exec", &net.ns(2), bin.to_str().unwrap()])
        .args([
            "kv",
            "--cluster",
            &file,
            "--client-id",
            "79",
            "put",
            "inside",
            "x",
        ])
        .env("DMKIT_FAILOVER_WAIT_MS", "2000")
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&inside.stderr);
    assert!(
        !inside.status.success(),
        "a write from inside the partition succeeded: {said}"
    );
    assert!(said.contains("fenced"), "not refused as fenced: {said}");
    let fenced_line =
        std::iter::from_fn(|| memnodes[2].stderr.try_recv().ok()).find(|l| l.contains("fenced"));
    assert!(
        fenced_line.is_some(),
        "node 2 never logged that it fenced itself"
    );

    // Heal: node 2 is refilled and readmitted.
    net.set_link(2, true);
    let back = wait_for("node 2 readmitted", Duration::from_secs(40), || {
        // (node 2 itself still holds the record it was cut off with: ask a survivor)
        membership_of(&addrs[0].1, 0).is_some_and(|m| m.is_member(NodeId(2)) && !m.repairing)
    });
    eprintln!("node 2 refilled and readmitted {back:?} after the link came back");

    let mut expected: HashMap<String, u64> = HashMap::new();
    for c in clients {
        let out = c.wait_with_output();
        assert!(
            out.status.success(),
            "ycsb failed across the partition: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    for log in std::iter::once(&load_log).chain(logs.iter()) {
        for line in std::fs::read_to_string(log).unwrap().lines() {
            let f: Vec<_> = line.split('\t').collect();
            expected.insert(f[0].to_string(), u64::from_str_radix(f[2], 16).unwrap());
        }
    }
    assert!(
        std::fs::read_to_string(dir.path().join("ack-0.log"))
            .unwrap()
            .lines()
            .count()
            > 50
    );
    let ep = Endpoint::default();
    for (i, a) in &addrs {
        let c = TcpConnector::default().connect(a).unwrap();
        assert_eq!(c.node(), NodeId(*i));
        ep.add_connection(c);
    }
    let ids: Vec<_> = addrs.iter().map(|(i, _)| NodeId(*i)).collect();
    let reader = Client::connect(ep, &ids, ClientConfig::new(78)).unwrap();
    let mut lost = Vec::new();
    for (k, h) in &expected {
        match reader.search(k.as_bytes()).unwrap() {
            Some(v) if fnv1a_64(&v) == *h => {}
            other => lost.push(format!("{k}: {:?}", other.map(|v| v.len()))),
        }
    }
    assert!(lost.is_empty(), "acknowledged writes lost: {lost:?}");
    assert_eq!(reader.search(b"inside").unwrap(), None);
    memnodes.clear();
}
