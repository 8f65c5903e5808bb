//! An operator's bad input, as real processes on loopback (issue #22): the same pool served
//! twice, two masters of one cluster, the creating command run again, a dead address or the
//! master's address in the cluster file, two clusters on one host with the default client
//! id, values over the limit, empty keys. Each test starts `dmkit` processes and checks
//! what an operator sees: the exit status and the one line on stderr.

use std::time::{Duration, Instant};

use dmkit_tests::procs::{Daemon, Memnode, ProcCluster, run_dmkit};

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// `dmkit ARGS` to completion: (exit code, stdout, stderr).
fn dmkit(args: &[&str]) -> (i32, String, String) {
    let out = run_dmkit(args, Duration::from_secs(60));
    (
        out.status.code().unwrap_or(-1),
        text(&out.stdout),
        text(&out.stderr),
    )
}

#[test]
fn a_pool_file_is_served_by_one_memnode_and_a_second_is_told_which() {
    let dir = tempfile::tempdir().unwrap();
    let pool = dir.path().join("node0.pool");
    let p = pool.to_str().unwrap();
    let first = Memnode::start(&["--id", "0", "--pool", p, "--size", "8MiB"]);
    // Another port, the same file: refused, naming the holder's pid and address.
    for extra in [&["--size", "8MiB"][..], &[][..]] {
        let mut args = vec![
            "memnode",
            "--listen",
            "127.0.0.1:0",
            "--id",
            "1",
            "--pool",
            p,
        ];
        args.extend_from_slice(extra);
        let (code, _, err) = dmkit(&args);
        assert_eq!(code, 2, "{err}");
        assert_eq!(err.trim().lines().count(), 1, "{err}");
        assert!(err.contains("in use by"), "{err}");
        assert!(err.contains(&format!("pid {}", first.pid())), "{err}");
        assert!(err.contains(&first.addr), "{err}");
    }
    // A Gengar server on it is refused too.
    let (code, _, err) = dmkit(&[
        "gengar-server",
        "--listen",
        "127.0.0.1:0",
        "--id",
        "0",
        "--dram",
        "1MiB",
        "--pool",
        p,
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains(&format!("pid {}", first.pid())), "{err}");
    // Once the holder is gone (even by SIGKILL), the file is free again.
    let mut first = first;
    first.kill9();
    let again = Memnode::start(&["--id", "0", "--pool", p, "--size", "8MiB"]);
    drop(again);
}

#[test]
fn the_command_that_created_a_pool_reopens_it() {
    let dir = tempfile::tempdir().unwrap();
    let pool = dir.path().join("node0.pool");
    let p = pool.to_str().unwrap();
    for size in ["64MiB", "10MB"] {
        let _ = std::fs::remove_file(&pool);
        let args = ["--id", "0", "--pool", p, "--size", size];
        let mut m = Memnode::start(&args);
        let want = dmkit_tools_size(size);
        assert_eq!(
            std::fs::metadata(&pool).unwrap().len(),
            want,
            "--size {size}"
        );
        m.kill9();
        // The same command again: opened, not refused.
        let m = Memnode::start(&args);
        drop(m);
        assert_eq!(std::fs::metadata(&pool).unwrap().len(), want);
    }
    // A size that differs is refused with both sizes named.
    let (code, _, err) = dmkit(&[
        "memnode",
        "--listen",
        "127.0.0.1:0",
        "--pool",
        p,
        "--size",
        "20MB",
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("10MB") || err.contains("9.5MiB"), "{err}");
}

/// The byte count of the sizes used above.
fn dmkit_tools_size(s: &str) -> u64 {
    match s {
        "64MiB" => 64 << 20,
        "10MB" => 10_000_000,
        _ => unreachable!(),
    }
}

/// The master of `c` is the one its `ProcCluster` started; a second one (another port, the
/// same cluster file) is refused naming it; a `--standby` waits and takes over once the first
/// is gone; a first one frozen past its claim exits when it wakes, never acting beside the
/// standby that took over.
#[test]
fn one_master_per_cluster_and_a_standby_takes_over() {
    let mut c = ProcCluster::start(3, 1, "16MiB");
    let first_addr = c.master.addr();
    let (code, _, err) = dmkit(&["master", "--listen", "127.0.0.1:0", "--cluster", &c.file]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("another master holds this cluster"), "{err}");
    assert!(err.contains(&first_addr), "{err}");
    assert!(err.contains("--standby"), "{err}");
    // A standby waits, saying for whom.
    let standby = std::process::Command::new(dmkit_tests::procs::dmkit_bin())
        .args(["master", "--listen", "127.0.0.1:0", "--cluster", &c.file])
        .args(["--standby", "--claim-ms", "1000"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut standby = dmkit_tests::procs::Proc::new(standby);
    let lines = standby.stderr_lines();
    let waiting = lines.recv_timeout(Duration::from_secs(20)).unwrap();
    assert!(waiting.contains("standby"), "{waiting}");
    assert!(waiting.contains(&first_addr), "{waiting}");
    // Still waiting while the first one is alive.
    assert!(
        lines.recv_timeout(Duration::from_secs(4)).is_err(),
        "the standby acted while the first master was alive"
    );
    let t = Instant::now();
    c.master.kill9();
    let mut took_over = false;
    while let Ok(l) = lines.recv_timeout(Duration::from_secs(15)) {
        if l.contains("serving on") {
            took_over = true;
            break;
        }
    }
    assert!(took_over, "the standby did not take over");
    // The default claim is 3 s: taken over after about that plus a poll (bounded loosely for
    // loaded machines).
    assert!(t.elapsed() < Duration::from_secs(12), "{:?}", t.elapsed());
    // The cluster works under the new master.
    let (code, _, err) = dmkit(&["kv", "--cluster", &c.file, "put", "k", "v"]);
    assert_eq!(code, 0, "{err}");
    standby.kill();
}

/// A master frozen (SIGSTOP) past its claim: a standby takes over, and when the first wakes it
/// steps down at once instead of acting beside it — it stays up as a standby behind the new
/// master (it does not exit), and the cluster works.
#[test]
fn a_master_that_lost_its_claim_steps_down_when_it_wakes() {
    let c = ProcCluster::start(3, 1, "16MiB");
    let mut c = c;
    c.master.kill9();
    // (A standby: the killed master's claim still runs for up to 3 s.)
    let first = Daemon::start(
        &[
            "master",
            "--listen",
            "127.0.0.1:0",
            "--cluster",
            &c.file,
            "--claim-ms",
            "1000",
            "--standby",
        ],
        "serving on",
    );
    let second = Daemon::start(
        &[
            "master",
            "--listen",
            "127.0.0.1:0",
            "--cluster",
            &c.file,
            "--claim-ms",
            "1000",
            "--standby",
        ],
        "standby",
    );
    let pid = first.pid().to_string();
    let st = std::process::Command::new("kill")
        .args(["-STOP", &pid])
        .status()
        .unwrap();
    assert!(st.success());
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let l = second
            .stderr
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            .expect("the standby took over");
        if l.contains("serving on") {
            break;
        }
    }
    let _ = std::process::Command::new("kill")
        .args(["-CONT", &pid])
        .status();
    // The old master steps down and waits behind the new one.
    let mut said = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(15);
    while !said
        .iter()
        .any(|l: &String| l.contains("standby: the cluster's master is"))
    {
        match first
            .stderr
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
        {
            Ok(l) => said.push(l),
            Err(_) => panic!("the old master did not step down to a standby: {said:?}"),
        }
    }
    assert!(said.iter().any(|l| l.contains("stepped down")), "{said:?}");
    assert!(
        !said.iter().any(|l| l.contains("serving on")),
        "the old master acted again beside the new one: {said:?}"
    );
    let mut first = first;
    assert_eq!(
        first.wait_exit(Duration::from_secs(1)),
        None,
        "the old master exited instead of stepping down"
    );
    // The cluster works under the new master.
    let (code, _, err) = dmkit(&["kv", "--cluster", &c.file, "put", "k", "v"]);
    assert_eq!(code, 0, "{err}");
}

/// `dmkit kv --cluster FILE ARGS`: (exit code, stdout, stderr, how long it took).
fn kv(file: &str, args: &[&str]) -> (i32, String, String, Duration) {
    let mut a = vec!["kv", "--cluster", file];
    a.extend_from_slice(args);
    let t = Instant::now();
    let (code, out, err) = dmkit(&a);
    (code, out, err, t.elapsed())
}

/// A copy of the cluster file with memory node `id`'s address replaced by `addr`.
fn file_with_addr(c: &ProcCluster, id: usize, addr: &str, name: &str) -> String {
    let text = std::fs::read_to_string(&c.file).unwrap();
    let text = text.replace(&c.memnodes[id].addr, addr);
    let p = c.dir.path().join(name);
    std::fs::write(&p, text).unwrap();
    p.to_str().unwrap().to_string()
}

#[test]
fn a_dead_memnode_address_is_reported_within_seconds_naming_the_node() {
    let c = ProcCluster::start(3, 3, "16MiB");
    assert_eq!(kv(&c.file, &["put", "fruit", "apple"]).0, 0);
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().to_string()
    };
    let bad = file_with_addr(&c, 2, &dead, "dead.toml");
    // Node 2 is alive and a member (the master reaches it): a read goes on without it (the
    // index primary is node 0; objects come from a replica that answers), with a warning
    // naming the node and the address this client tried.
    let (code, out, err, took) = kv(&bad, &["get", "fruit"]);
    eprintln!("kv get with node 2 unreachable, {took:?}: {err}");
    assert_eq!((code, out.as_str()), (0, "apple"), "{err}");
    assert!(took < Duration::from_secs(10), "{took:?}: {err}");
    assert!(
        err.contains("memory node 2") && err.contains(&dead) && err.contains("WARN"),
        "{err}"
    );
    assert!(
        !err.contains("\u{1b}["),
        "ANSI codes in a log to a pipe: {err:?}"
    );
    // A write needs every index replica: it cannot go on, and says at once which node, at
    // which address, and why.
    let (code, _, err, took) = kv(&bad, &["put", "fruit", "banana"]);
    eprintln!("kv put with node 2 unreachable, {took:?}: {err}");
    assert_eq!(code, 3, "{err}");
    assert!(took < Duration::from_secs(10), "{took:?}: {err}");
    let last = err.trim().lines().last().unwrap();
    assert!(last.contains("memory node 2"), "{last}");
    assert!(last.contains("does not answer"), "{last}");
    assert!(last.contains(&dead), "{last}");

    // Node 2 really down: the master fails it over and the command goes on with the two
    // replicas that answer, saying which node it went on without.
    let mut c = c;
    let gone = c.memnodes[2].addr.clone();
    c.memnodes[2].kill9();
    // (A generous --wait: a loaded CI machine may take longer than the default 5 s.)
    let (code, _, err, took) = kv(&c.file, &["--wait", "20s", "put", "fruit", "cherry"]);
    eprintln!("kv put with node 2 killed, {took:?}: {err}");
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains("memory node 2") && err.contains(&gone),
        "{err}"
    );
    let (code, out, err, _) = kv(&c.file, &["get", "fruit"]);
    assert_eq!((code, out.as_str()), (0, "cherry"), "{err}");
}

/// The master and a memory node both lost: a new master starts with the dead member (it
/// names it), fails it over after its missed heartbeats, and the cluster serves again.
#[test]
fn a_master_started_with_a_member_down_fails_it_over() {
    let mut c = ProcCluster::start(3, 2, "16MiB");
    assert_eq!(kv(&c.file, &["put", "fruit", "apple"]).0, 0);
    c.master.kill9();
    let gone = c.memnodes[2].addr.clone();
    c.memnodes[2].kill9();
    let t = Instant::now();
    // --standby: the dead master's claim runs out first (3 s by default).
    let master = dmkit_tests::procs::Daemon::start(
        &[
            "master",
            "--listen",
            "127.0.0.1:0",
            "--cluster",
            &c.file,
            "--standby",
        ],
        "serving on",
    );
    eprintln!("the new master serves after {:?}", t.elapsed());
    let (code, _, err, took) = kv(&c.file, &["--wait", "20s", "put", "fruit", "cherry"]);
    eprintln!("kv put with node 2 dead under a new master, {took:?}: {err}");
    assert_eq!(code, 0, "{err}");
    let (code, out, err, _) = kv(&c.file, &["get", "fruit"]);
    assert_eq!((code, out.as_str()), (0, "cherry"), "{err}");
    // The master named the member it started without (before "serving on": in
    // `ready_line`'s predecessors, not kept), and failed it over once serving.
    let mut said = Vec::new();
    while let Ok(l) = master.stderr.recv_timeout(Duration::from_millis(200)) {
        said.push(l);
    }
    let said = said.join("\n");
    assert!(
        said.contains("failed over") && said.contains("failed: [NodeId(2)]"),
        "{said}\n(node 2 was {gone})"
    );
}

/// The "Disk or pool full" runbook. A pool larger than its disk's free space: the memnode
/// exits 2 naming ENOSPC and leaves no file. A full cluster: `kv put` exits 3 with `out of
/// memory` and nothing else breaks; deleting keys makes room again.
#[test]
fn a_full_disk_and_a_full_pool_are_clear_errors_and_deleting_makes_room() {
    // On tmpfs (/dev/shm), whose fallocate refuses a size over the filesystem's at once: a
    // disk filled for real, even for a moment, would fail whatever else runs beside.
    let dir = tempfile::tempdir_in("/dev/shm").expect("a tmpfs at /dev/shm");
    let avail = {
        let out = std::process::Command::new("df")
            .args(["--output=size", "-B1"])
            .arg(dir.path())
            .output()
            .unwrap();
        let text = text(&out.stdout);
        text.lines().last().unwrap().trim().parse::<u64>().unwrap()
    };
    let pool = dir.path().join("big.pool");
    let size = format!("{}MiB", (avail >> 20) + 1024);
    let (code, _, err) = dmkit(&[
        "memnode",
        "--listen",
        "127.0.0.1:0",
        "--id",
        "0",
        "--pool",
        pool.to_str().unwrap(),
        "--size",
        &size,
    ]);
    eprintln!("a pool of {size} on a {avail}-byte tmpfs: {err}");
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("No space left on device"), "{err}");
    assert!(!pool.exists(), "a half-made pool file was left behind");

    // One 4 MiB node, r = 1: a few hundred 16 KiB values fill it.
    let c = ProcCluster::start(1, 1, "4MiB");
    let acks = c.dir.path().join("acks.log");
    let load = dmkit(&[
        "ycsb",
        "--cluster",
        &c.file,
        "--client-id",
        "7",
        "--load",
        "--seconds",
        "0",
        "--records",
        "400",
        "--value-bytes",
        "15000",
        "--ack-log",
        acks.to_str().unwrap(),
    ]);
    assert_ne!(load.0, 0, "400 x 15 KB fit in 4 MiB?");
    assert!(load.2.contains("out of memory"), "{}", load.2);
    let big = "x".repeat(15000);
    let (code, _, err, _) = kv(&c.file, &["put", "one-more", &big]);
    assert_eq!(code, 3, "{err}");
    assert!(err.contains("out of memory"), "{err}");
    // What is there still reads; deleting makes room for new writes.
    let loaded = std::fs::read_to_string(&acks).unwrap();
    let keys: Vec<&str> = loaded
        .lines()
        .filter_map(|l| l.split('\t').next())
        .collect();
    assert!(keys.len() >= 40, "only {} keys were loaded", keys.len());
    let (code, out, err, _) = kv(&c.file, &["get", keys[0]]);
    assert_eq!((code, out.len()), (0, 15000), "{err}");
    for k in &keys[..40] {
        let (code, _, err, _) = kv(&c.file, &["del", k]);
        assert_eq!(code, 0, "{err}");
    }
    // The room comes back to the client that wrote the deleted values (a running one
    // reclaims in the background; here the loader is gone, and its id's recovery does it).
    let (code, _, err, _) = kv(&c.file, &["--client-id", "7", "put", "one-more", &big]);
    assert_eq!(code, 0, "no room after deleting 40 keys: {err}");
    let (code, out, _, _) = kv(&c.file, &["get", "one-more"]);
    assert_eq!((code, out.len()), (0, big.len()));
}

#[test]
fn a_memnode_address_that_is_the_master_says_so() {
    let c = ProcCluster::start(3, 1, "16MiB");
    let master = c.master.addr();
    let bad = file_with_addr(&c, 1, &master, "master.toml");
    let (code, _, err, took) = kv(&bad, &["get", "x"]);
    eprintln!("kv get with node 1 at the master's address, {took:?}: {err}");
    assert_eq!(code, 3, "{err}");
    assert!(took < Duration::from_secs(10), "{took:?}");
    assert!(
        err.contains("is a dmkit master, not a memory node"),
        "{err}"
    );
    assert!(err.contains("memory node 1"), "{err}");
    assert!(!err.contains("65535"), "{err}");
}

#[test]
fn bad_arguments_to_kv_are_usage_errors() {
    let c = ProcCluster::start(3, 1, "16MiB");
    // (Empty keys and values beyond one object are valid: tests/tests/kv_values.rs.)
    let cases: [(&[&str], &str); 3] = [
        (
            &["put", "k", "v", "--value-file", "/nonexistent"],
            "cannot be used with",
        ),
        (
            &["put", "k", "--value-file", "/nonexistent"],
            "cannot read --value-file",
        ),
        (&["frobnicate", "k"], "frobnicate"),
    ];
    for (args, expect) in cases {
        let (code, out, err, _) = kv(&c.file, args);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(out.is_empty());
        assert_eq!(err.trim().lines().count(), 1, "{args:?}: {err}");
        assert!(err.contains(expect), "{args:?}: {err}");
    }
    // Nothing was half written.
    assert_eq!(kv(&c.file, &["get", "k"]).0, 1);
}

#[test]
fn two_clusters_on_one_host_with_the_default_client_id() {
    let a = ProcCluster::start(3, 1, "16MiB");
    let b = ProcCluster::start(3, 1, "16MiB");
    // A long-running client with the default id on each cluster at once (the gateway holds
    // its id for its lifetime).
    let ga = Daemon::start(
        &["resp", "--listen", "127.0.0.1:0", "--cluster", &a.file],
        "serving Redis clients on",
    );
    let gb = Daemon::start(
        &["resp", "--listen", "127.0.0.1:0", "--cluster", &b.file],
        "serving Redis clients on",
    );
    // A second one on the same cluster is refused, naming --client-id.
    let (code, _, err) = dmkit(&["resp", "--listen", "127.0.0.1:0", "--cluster", &a.file]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--client-id"), "{err}");
    assert!(err.contains(&format!("process {}", ga.pid())), "{err}");
    // Another id on the same cluster is fine.
    assert_eq!(kv(&a.file, &["--client-id", "9", "put", "k", "a"]).0, 0);
    assert_eq!(kv(&b.file, &["--client-id", "9", "put", "k", "b"]).0, 0);
    drop((ga, gb));
    assert_eq!(kv(&a.file, &["get", "k"]).1, "a");
    assert_eq!(kv(&b.file, &["get", "k"]).1, "b");
}

/// A gateway killed (SIGKILL) and restarted while a memory node failed too: it says which
/// node it waits for and listens again within seconds, not after half a minute of silence.
#[test]
fn a_gateway_restarted_after_sigkill_with_a_memnode_down_listens_within_seconds() {
    let mut c = ProcCluster::start(3, 3, "16MiB");
    let listen = dmkit_tests::procs::free_addr();
    let mut gw = Daemon::start(
        &["resp", "--listen", &listen, "--cluster", &c.file],
        "serving Redis clients on",
    );
    gw.kill9();
    let node = c.memnodes[1].addr.clone();
    c.memnodes[1].kill9();
    let t = Instant::now();
    let child = std::process::Command::new(dmkit_tests::procs::dmkit_bin())
        .args(["resp", "--listen", &listen, "--cluster", &c.file])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut gw = dmkit_tests::procs::Proc::new(child);
    let lines = gw.stderr_lines();
    let mut said = Vec::new();
    loop {
        let l = lines
            .recv_timeout(Duration::from_secs(10))
            .unwrap_or_else(|_| panic!("not listening after {:?}: {said:?}", t.elapsed()));
        if l.contains("serving Redis clients on") {
            break;
        }
        said.push(l);
    }
    let took = t.elapsed();
    assert!(took < Duration::from_secs(10), "{took:?}");
    assert!(
        said.iter()
            .any(|l| l.contains("memory node 1") && l.contains(&node)),
        "it did not say which node it waited for: {said:?}"
    );
    gw.kill();
}

/// A master stopped with SIGTERM gives its claim up: it exits 0 and the next master starts at
/// once, without waiting for the claim to run out.
#[test]
fn a_master_stopped_with_sigterm_releases_the_cluster() {
    let c = ProcCluster::start(3, 1, "16MiB");
    let mut c = c;
    let pid = c.master.pid().to_string();
    let st = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap();
    assert!(st.success());
    let code = c.master.wait_exit(Duration::from_secs(10));
    assert_eq!(code, Some(0), "the master did not stop cleanly");
    let said: Vec<String> = c.master.stderr.try_iter().collect();
    assert!(
        said.iter().any(|l| l.contains("claim is released")),
        "{said:?}"
    );
    let t = Instant::now();
    let next = Daemon::start(
        &["master", "--listen", "127.0.0.1:0", "--cluster", &c.file],
        "serving on",
    );
    assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    assert!(next.ready_line.contains("opened"), "{}", next.ready_line);
    let (code, _, err) = dmkit(&["kv", "--cluster", &c.file, "put", "k", "v"]);
    assert_eq!(code, 0, "{err}");
}
