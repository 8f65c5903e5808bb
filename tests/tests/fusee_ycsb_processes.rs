//! FUSEE as real processes under YCSB-A: three `dmkit memnode`s, a `dmkit master` and four
//! concurrent `dmkit ycsb` client processes over `tcp`. Each client writes only its own share
//! of the key space (`--partition i/4`) and reads anywhere, and logs every acknowledged write;
//! afterwards every key must hold exactly its last acknowledged write.

use std::collections::HashMap;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use dmkit_fusee::{Client, ClientConfig};
use dmkit_tests::procs::{ProcCluster, dmkit_bin, fnv1a_64, run_dmkit};
use dmkit_verbs::tcp::TcpConnector;
use dmkit_verbs::{Endpoint, NodeId};

const RECORDS: u64 = 400;
const VALUE_BYTES: &str = "200";

/// key -> (tag, hash) of its last acknowledged write in one ack log (writes in log order).
fn last_writes(log: &str, into: &mut HashMap<String, (String, u64)>) -> usize {
    let mut n = 0;
    for line in log.lines() {
        let mut f = line.split('\t');
        let (Some(k), Some(tag), Some(h)) = (f.next(), f.next(), f.next()) else {
            panic!("bad ack log line {line:?}");
        };
        into.insert(
            k.to_string(),
            (tag.to_string(), u64::from_str_radix(h, 16).unwrap()),
        );
        n += 1;
    }
    n
}

#[test]
fn four_ycsb_a_processes_every_acknowledged_write_is_readable() {
    let cluster = ProcCluster::start(3, 3, "64MiB");
    let (dir, file) = (&cluster.dir, cluster.file.clone());
    let records = RECORDS.to_string();
    let load_log = dir.path().join("ack-load.log");
    let out = run_dmkit(
        &[
            "ycsb",
            "--cluster",
            &file,
            "--client-id",
            "40",
            "--records",
            &records,
            "--value-bytes",
            VALUE_BYTES,
            "--load",
            "--inflight",
            "8",
            "--seconds",
            "0",
            "--ack-log",
            load_log.to_str().unwrap(),
        ],
        Duration::from_secs(60),
    );
    assert!(
        out.status.success(),
        "load: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    // Four clients at once, ~3 s of YCSB-A each.
    let started = Instant::now();
    let children: Vec<_> = (0..4u64)
        .map(|i| {
            let log = dir.path().join(format!("ack-{i}.log"));
            let child = Command::new(dmkit_bin())
                .args(["ycsb", "--cluster", &file])
                .args(["--client-id", &(41 + i).to_string()])
                .args(["--workload", "a", "--seconds", "3"])
                .args(["--records", &records, "--value-bytes", VALUE_BYTES])
                .args(["--partition", &format!("{i}/4")])
                // Two of them with many operations in flight.
                .args(["--inflight", if i % 2 == 0 { "1" } else { "16" }])
                .args(["--ack-log", log.to_str().unwrap()])
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("spawn dmkit ycsb");
            (child, log)
        })
        .collect();
    let mut logs = vec![load_log];
    for (child, log) in children {
        let out = child.wait_with_output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "ycsb: {}{}",
            stdout,
            String::from_utf8_lossy(&out.stderr)
        );
        let summary: Vec<_> = stdout.lines().collect();
        assert_eq!(summary.len(), 1, "one summary line: {stdout}");
        assert!(
            summary[0].contains("ops/s") && summary[0].contains("RTTs/op"),
            "{stdout}"
        );
        logs.push(log);
    }
    assert!(started.elapsed() < Duration::from_secs(60));

    // The expected final state: the load, then each client's own share in its log order.
    let mut expected = HashMap::new();
    let mut acked = 0;
    for log in &logs {
        acked += last_writes(&std::fs::read_to_string(log).unwrap(), &mut expected);
    }
    assert_eq!(
        expected.len() as u64,
        RECORDS,
        "YCSB-A writes only loaded keys"
    );
    assert!(
        acked as u64 > RECORDS + 20,
        "the clients acknowledged only {} writes",
        acked as u64 - RECORDS
    );

    // Read everything back with an in-test client over tcp.
    let nodes: Vec<_> = cluster
        .memnodes
        .iter()
        .enumerate()
        .map(|(i, m)| (NodeId(i as u16), m.addr.clone()))
        .collect();
    let ids: Vec<_> = nodes.iter().map(|(i, _)| *i).collect();
    let (c, _) = Client::recover(
        || Ok(Endpoint::connect(&TcpConnector::default(), &nodes)?),
        &ids,
        ClientConfig::new(60),
    )
    .unwrap();
    let mut wrong = Vec::new();
    for (key, (tag, hash)) in &expected {
        match c.search(key.as_bytes()).unwrap() {
            Some(v) if fnv1a_64(&v) == *hash => {}
            Some(v) => {
                let got = String::from_utf8_lossy(&v[..v.len().min(24)]).into_owned();
                wrong.push(format!("{key}: expected {tag}, found {got}"));
            }
            None => wrong.push(format!("{key}: expected {tag}, found nothing")),
        }
    }
    assert!(
        wrong.is_empty(),
        "{} of {} keys do not hold their last acknowledged write: {:?}",
        wrong.len(),
        expected.len(),
        &wrong[..wrong.len().min(10)]
    );
}
