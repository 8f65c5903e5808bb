//! A nemesis over processes: three `dmkit memnode`s (r = 3), a `dmkit master` and three
//! YCSB-A clients on loopback, while a seeded nemesis SIGKILLs and restarts memory nodes
//! (the master fails them over and refills them), pauses them (SIGSTOP past their lease:
//! fenced and restarted; shorter: they resume), partitions them (every connection to the
//! node goes through a relay, [`dmkit_tests::proxy::Relay`], which the nemesis cuts: the node
//! keeps running, unreachable; past its lease it is failed over and fences itself, shorter
//! it is reached again), SIGKILLs clients and restarts them under their id (recovery from
//! their logs), pauses clients, and kills and restarts the master.
//!
//! Every client logs every acknowledged write (`ycsb --ack-log`) and every read
//! (`--read-log`), with their invocation and return times. Afterwards every key must hold
//! its last acknowledged write — or a later one in flight when its writer was killed (tags
//! grow across restarts, so an older value come back is told from it) — and the whole
//! history of reads and writes must be linearizable ([`dmkit_tests::registers`]: each key
//! has one writer, so no read may return a write older than one acknowledged before it
//! began, one not yet invoked when it returned, or one older than an earlier read's).
//!
//! CI runs it for `DMKIT_NEMESIS_SECS` (default 40); the long run is
//! `DMKIT_NEMESIS_SECS=1800 cargo test --release -p dmkit-tests --test nemesis -- --nocapture`
//! (`DMKIT_NEMESIS_SEED` replays a schedule of faults; the processes' own timing is the OS's;
//! `DMKIT_NEMESIS_FAULTS=client-pause,memnode-kill` draws from those faults only).
//! One-way partitions between particular hosts are the netns tier's (`fusee_partition.rs`).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use dmkit_fusee::{Client, ClientConfig};
use dmkit_tests::procs::{
    Daemon, Memnode, Proc, ProcCluster, connector, endpoint_for, fnv1a_64, ycsb_a_logged, ycsb_load,
};
use dmkit_tests::registers;
use dmkit_verbs::NodeId;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const RECORDS: u64 = 600;
const VALUE: u32 = 64;
const CLIENTS: u64 = 3;

fn env(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

/// The faults to draw from, by number: `DMKIT_NEMESIS_FAULTS` (names, comma-separated) or
/// all of them, each equally likely.
fn fault_kinds() -> Vec<u32> {
    const NAMES: [&str; 7] = [
        "memnode-kill",
        "memnode-pause",
        "client-kill",
        "client-pause",
        "master-kill",
        "partition",
        "quiet",
    ];
    let Ok(list) = std::env::var("DMKIT_NEMESIS_FAULTS") else {
        return (0..NAMES.len() as u32).collect();
    };
    let kinds: Vec<u32> = list
        .split(',')
        .map(str::trim)
        .filter(|n| !n.is_empty())
        .map(|n| match NAMES.iter().position(|k| *k == n) {
            Some(i) => i as u32,
            None => panic!("DMKIT_NEMESIS_FAULTS: unknown fault {n:?}; the faults are {NAMES:?}"),
        })
        .collect();
    assert!(!kinds.is_empty(), "DMKIT_NEMESIS_FAULTS names no fault");
    kinds
}

fn signal(pid: u32, sig: &str) {
    let _ = std::process::Command::new("kill")
        .args([sig, &pid.to_string()])
        .status();
}

/// The membership record memory node `via` holds, if it answers.
fn record_at(addr: &str, via: u16) -> Option<dmkit_fusee::membership::Membership> {
    let conn = connector();
    let c = conn.connect(addr).ok()?;
    let ep = endpoint_for(&*conn);
    ep.add_connection(c);
    dmkit_fusee::membership::query(&ep, NodeId(via))
        .ok()?
        .record
}

fn is_member(addr: &str, id: u16) -> bool {
    record_at(addr, id).is_some_and(|r| r.is_member(NodeId(id)) && !r.repairing)
}

struct Run {
    cluster: ProcCluster,
    clients: Vec<Proc>,
    logs: Vec<PathBuf>,
    reads: Vec<PathBuf>,
    end: Instant,
    faults: Vec<String>,
}

impl Run {
    fn memnode_args(id: u16) -> Vec<String> {
        [
            "--id",
            &id.to_string(),
            "--dram",
            "64MiB",
            "--block-size",
            "64KiB",
        ]
        .map(String::from)
        .to_vec()
    }

    fn secs_left(&self) -> String {
        let left = self.end.saturating_duration_since(Instant::now()).as_secs() + 3;
        left.to_string()
    }

    fn start_client(&self, i: usize) -> Proc {
        ycsb_a_logged(
            &self.cluster.file,
            71 + i as u64,
            &format!("{i}/{CLIENTS}"),
            &self.secs_left(),
            RECORDS,
            VALUE,
            &self.logs[i],
            Some(&self.reads[i]),
        )
    }

    /// Whether another member's record no longer counts memory node `i` (it was failed over).
    fn is_failed_over(&self, i: usize) -> bool {
        self.cluster.memnodes.iter().enumerate().any(|(j, m)| {
            j != i && record_at(&m.addr, j as u16).is_some_and(|r| !r.is_member(NodeId(i as u16)))
        })
    }

    /// Waits until the other members have failed memory node `i` over (bounded).
    fn wait_failed_over(&self, i: usize) {
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(30) {
            let done = self.cluster.memnodes.iter().enumerate().any(|(j, m)| {
                j != i
                    && record_at(&m.addr, j as u16)
                        .is_some_and(|r| !r.is_member(NodeId(i as u16)) && !r.repairing)
            });
            if done {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!(
            "memory node {i} was never failed over; faults so far: {:?}",
            self.faults
        );
    }

    /// SIGKILLs memory node `i`, waits for its failover, restarts it on its address with an
    /// empty pool and waits until the master refilled and readmitted it.
    /// What the master and the memory nodes printed lately (for a failure's message).
    fn daemon_logs(&mut self) -> String {
        let mut out = format!("\nmaster:{}", self.cluster.master.log());
        for (i, m) in self.cluster.memnodes.iter().enumerate() {
            out.push_str(&format!(
                "\nmemnode {i}:{}",
                dmkit_tests::procs::tail(&m.stderr)
            ));
        }
        out
    }

    fn restart_memnode(&mut self, i: usize) {
        let addr = self.cluster.memnodes[i].addr.clone();
        self.cluster.memnodes[i].kill9();
        self.wait_failed_over(i);
        let args = Self::memnode_args(i as u16);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        self.cluster.memnodes[i] = Memnode::start_on(&addr, &args);
        let t = Instant::now();
        while !is_member(&addr, i as u16) {
            assert!(
                t.elapsed() < Duration::from_secs(60),
                "memory node {i} was not readmitted; faults so far: {:?}",
                self.faults
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// The tag of a value (`c<id>:<counter>`) as (client id, counter).
fn tag_of(value: &[u8]) -> Option<(u64, u64)> {
    let end = value.iter().position(|b| *b == b'|')?;
    let tag = std::str::from_utf8(&value[..end]).ok()?;
    let (c, n) = tag.strip_prefix('c')?.split_once(':')?;
    Some((c.parse().ok()?, n.parse().ok()?))
}

/// Per key: the acknowledged write with the highest tag, and its value's hash.
fn last_acked(logs: &[&Path]) -> HashMap<String, ((u64, u64), u64)> {
    let mut last: HashMap<String, ((u64, u64), u64)> = HashMap::new();
    for log in logs {
        let text = std::fs::read_to_string(log).expect("read an ack log");
        for line in text.lines() {
            let f: Vec<_> = line.split('\t').collect();
            assert!(f.len() >= 4, "bad ack log line {line:?}");
            let tag = tag_of(format!("{}|", f[1]).as_bytes()).expect("a tag");
            let hash = u64::from_str_radix(f[2], 16).expect("a hex hash");
            let e = last.entry(f[0].to_string()).or_insert((tag, hash));
            if tag.1 > e.0.1 {
                *e = (tag, hash);
            }
        }
    }
    last
}

#[test]
fn a_nemesis_over_processes_loses_no_acknowledged_write() {
    let secs = env("DMKIT_NEMESIS_SECS").unwrap_or(40);
    let seed = env("DMKIT_NEMESIS_SEED").unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64
    });
    eprintln!("nemesis: {secs} s, seed {seed} (DMKIT_NEMESIS_SEED={seed} replays the faults)");
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let kinds = fault_kinds();
    let cluster = ProcCluster::start_relayed(3, 3, "64MiB");
    let dir = cluster.dir.path().to_path_buf();
    let load_log = dir.join("ack-load.log");
    ycsb_load(&cluster.file, 70, RECORDS, VALUE, &load_log);
    let logs: Vec<_> = (0..CLIENTS)
        .map(|i| dir.join(format!("ack-{i}.log")))
        .collect();
    let reads: Vec<_> = (0..CLIENTS)
        .map(|i| dir.join(format!("reads-{i}.log")))
        .collect();
    let mut run = Run {
        cluster,
        clients: Vec::new(),
        logs,
        reads,
        end: Instant::now() + Duration::from_secs(secs),
        faults: Vec::new(),
    };
    run.clients = (0..CLIENTS as usize).map(|i| run.start_client(i)).collect();
    while Instant::now() < run.end {
        std::thread::sleep(Duration::from_millis(rng.random_range(300..1500)));
        let t = Instant::now();
        // (On the logs' clock, so that an anomaly's times can be matched with the faults.)
        let at_us = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_micros());
        let fault = match kinds[rng.random_range(0..kinds.len())] {
            0 => {
                let i = rng.random_range(0..3);
                run.restart_memnode(i);
                format!("memnode {i} SIGKILLed, failed over, restarted, refilled")
            }
            1 => {
                let i = rng.random_range(0..3);
                let ms = rng.random_range(100..6000);
                let pid = run.cluster.memnodes[i].pid();
                signal(pid, "-STOP");
                std::thread::sleep(Duration::from_millis(ms));
                let out = if run.is_failed_over(i) {
                    " (failed over meanwhile, readmitted)"
                } else {
                    ""
                };
                signal(pid, "-CONT");
                // Long enough to lose its lease: failed over and fenced; back by a restart
                // unless the master readmitted it (it refills a member that comes back).
                std::thread::sleep(Duration::from_millis(1500));
                let addr = run.cluster.memnodes[i].addr.clone();
                if is_member(&addr, i as u16) {
                    format!("memnode {i} paused {ms} ms{out}")
                } else {
                    run.restart_memnode(i);
                    format!("memnode {i} paused {ms} ms, fenced, restarted, refilled")
                }
            }
            2 => {
                let i = rng.random_range(0..CLIENTS as usize);
                run.clients[i].kill();
                run.clients[i] = run.start_client(i);
                format!("client {i} SIGKILLed and restarted (recovery)")
            }
            3 => {
                let i = rng.random_range(0..CLIENTS as usize);
                let ms = rng.random_range(100..3000);
                if let Some(pid) = run.clients[i].pid() {
                    signal(pid, "-STOP");
                    std::thread::sleep(Duration::from_millis(ms));
                    signal(pid, "-CONT");
                }
                format!("client {i} paused {ms} ms")
            }
            4 => {
                run.cluster.master.kill9();
                let file = run.cluster.file.clone();
                run.cluster.master = Daemon::start(
                    &[
                        "master",
                        "--listen",
                        "127.0.0.1:0",
                        "--cluster",
                        &file,
                        "--standby",
                    ],
                    "serving on",
                );
                "master SIGKILLed, a standby took over once its claim ran out".to_string()
            }
            5 => {
                let i = rng.random_range(0..3);
                let ms = rng.random_range(100..6000);
                run.cluster.relays[i].cut();
                std::thread::sleep(Duration::from_millis(ms));
                let out = if run.is_failed_over(i) {
                    " (failed over meanwhile, readmitted)"
                } else {
                    ""
                };
                run.cluster.relays[i].heal();
                // As a pause: past its lease, failed over and fenced; back by a restart
                // unless the master readmitted it.
                std::thread::sleep(Duration::from_millis(1500));
                let addr = run.cluster.memnodes[i].addr.clone();
                if is_member(&addr, i as u16) {
                    format!("memnode {i} partitioned {ms} ms{out}")
                } else {
                    run.restart_memnode(i);
                    format!("memnode {i} partitioned {ms} ms, fenced, restarted, refilled")
                }
            }
            _ => "quiet".to_string(),
        };
        run.faults.push(format!(
            "{fault} (from {at_us} us, {} ms)",
            t.elapsed().as_millis()
        ));
    }
    eprintln!("nemesis: {} faults: {:#?}", run.faults.len(), run.faults);
    for (i, c) in std::mem::take(&mut run.clients).into_iter().enumerate() {
        let out = c.wait_with_output();
        if !out.status.success() {
            let logs = run.daemon_logs();
            panic!(
                "client {i} failed: {}; faults: {:?}; the daemons' last lines:{}",
                String::from_utf8_lossy(&out.stderr),
                run.faults,
                logs
            );
        }
    }
    // Every key, read through a fresh client.
    let mut all: Vec<&Path> = vec![&load_log];
    all.extend(run.logs.iter().map(PathBuf::as_path));
    let last = last_acked(&all);
    let conn = connector();
    let ep = endpoint_for(&*conn);
    for m in &run.cluster.memnodes {
        if let Ok(c) = conn.connect(&m.addr) {
            ep.add_connection(c);
        }
    }
    let kv = Client::connect(
        ep,
        &[NodeId(0), NodeId(1), NodeId(2)],
        ClientConfig::new(79),
    )
    .expect("a client after the nemesis");
    let mut wrong = Vec::new();
    let mut later = 0;
    for (key, (tag, hash)) in &last {
        match kv.search(key.as_bytes()).expect("read a key") {
            Some(v) if fnv1a_64(&v) == *hash => {}
            // A write in flight when its writer was killed: a later tag of the same writer.
            Some(v) if tag_of(&v).is_some_and(|t| t.0 == tag.0 && t.1 > tag.1) => later += 1,
            Some(v) => wrong.push(format!(
                "{key}: last acknowledged c{}:{}, holds {}",
                tag.0,
                tag.1,
                String::from_utf8_lossy(&v[..v.len().min(40)])
            )),
            None => wrong.push(format!(
                "{key}: last acknowledged c{}:{}, holds nothing",
                tag.0, tag.1
            )),
        }
    }
    eprintln!(
        "nemesis: {} keys checked, {later} hold a write in flight at a kill",
        last.len()
    );
    // The whole history: every acknowledged write and every read, checked per key.
    let mut writes = Vec::new();
    for log in &all {
        writes.extend(registers::read_writes(log));
    }
    let mut reads = Vec::new();
    for log in &run.reads {
        if log.exists() {
            reads.extend(registers::read_reads(log));
        }
    }
    let anomalies = registers::check(&writes, &reads);
    eprintln!(
        "nemesis: history of {} acknowledged writes and {} reads checked: {} anomalies",
        writes.len(),
        reads.len(),
        anomalies.len()
    );
    assert!(
        reads.len() > 100,
        "too few reads logged to check: {}",
        reads.len()
    );
    assert!(
        anomalies.is_empty(),
        "the history is not linearizable (seed {seed}): {:#?}; faults: {:?}",
        &anomalies[..anomalies.len().min(10)],
        run.faults
    );
    assert!(
        wrong.is_empty(),
        "{} keys lost their last acknowledged write (seed {seed}): {:?}; faults: {:?}",
        wrong.len(),
        &wrong[..wrong.len().min(10)],
        run.faults
    );
}
