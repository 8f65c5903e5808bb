//! Bad input to a FUSEE cluster of processes: oversized values, a client id already in use,
//! and a cluster file that mixes the memory nodes of two separately formatted clusters (same
//! node ids, told apart by the cluster uuid in the superblock). Each fails with a clear
//! one-line error.

use std::time::{Duration, Instant};

use dmkit_tests::procs::{Daemon, ProcCluster, cluster_file, run_dmkit};

type Cluster = ProcCluster;

fn start() -> Cluster {
    ProcCluster::start(3, 3, "16MiB")
}

fn one_line(stderr: &[u8]) -> String {
    let err = String::from_utf8_lossy(stderr).into_owned();
    assert_eq!(err.trim().lines().count(), 1, "one line expected: {err:?}");
    err
}

#[test]
fn oversized_value_and_a_busy_client_id_fail_with_one_line() {
    let c = start();
    // A value over the maximum (64 MiB; values beyond one object are chunked).
    let dir = tempfile::tempdir().unwrap();
    let over = dir.path().join("over");
    std::fs::File::create(&over)
        .unwrap()
        .set_len((64 << 20) + 1)
        .unwrap();
    let out = run_dmkit(
        &[
            "kv",
            "--cluster",
            &c.file,
            "put",
            "big",
            "--value-file",
            over.to_str().unwrap(),
        ],
        Duration::from_secs(30),
    );
    // Bad input, not a failure of the cluster: a usage error.
    assert_eq!(out.status.code(), Some(2));
    let err = one_line(&out.stderr);
    assert!(err.contains("larger than the maximum"), "{err}");
    // The cluster still works, and the key was not half written.
    let out = run_dmkit(
        &["kv", "--cluster", &c.file, "get", "big"],
        Duration::from_secs(30),
    );
    assert_eq!(out.status.code(), Some(1));

    // `dmkit ycsb` with an id another running process holds fails at once.
    let first = Daemon::start(
        &[
            "ycsb",
            "--cluster",
            &c.file,
            "--client-id",
            "77",
            "--records",
            "50",
            "--value-bytes",
            "64",
            "--seconds",
            "20",
        ],
        "running",
    );
    let t = Instant::now();
    let out = run_dmkit(
        &[
            "ycsb",
            "--cluster",
            &c.file,
            "--client-id",
            "77",
            "--records",
            "50",
            "--seconds",
            "1",
        ],
        Duration::from_secs(20),
    );
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    assert_eq!(out.status.code(), Some(2));
    let err = one_line(&out.stderr);
    assert!(err.contains("client id 77 is in use"), "{err}");
    drop(first);
    let _ = (&c.dir, &c.master, &c.memnodes);
}

#[test]
fn a_cluster_file_mixing_two_clusters_is_refused() {
    let a = start();
    let b = start();
    // Node 0 of cluster A with nodes 1 and 2 of cluster B: same ids, same shape.
    let mixed: Vec<_> = vec![
        (0u16, a.memnodes[0].addr.clone()),
        (1, b.memnodes[1].addr.clone()),
        (2, b.memnodes[2].addr.clone()),
    ];
    let dir = tempfile::tempdir().unwrap();
    let file = cluster_file(dir.path(), "127.0.0.1:0", 3, &mixed);
    let file = file.to_str().unwrap().to_string();
    let out = run_dmkit(
        &["kv", "--cluster", &file, "get", "x"],
        Duration::from_secs(30),
    );
    assert!(out.status.code().unwrap_or(0) >= 2, "{out:?}");
    let err = one_line(&out.stderr);
    assert!(
        err.contains("mixes memory nodes of different clusters"),
        "{err}"
    );

    let out = run_dmkit(
        &["master", "--listen", "127.0.0.1:0", "--cluster", &file],
        Duration::from_secs(30),
    );
    assert!(!out.status.success());
    let err = one_line(&out.stderr);
    assert!(
        err.contains("mixes memory nodes of different clusters"),
        "{err}"
    );

    // Each cluster on its own is fine.
    for c in [&a, &b] {
        let out = run_dmkit(
            &["kv", "--cluster", &c.file, "put", "k", "v"],
            Duration::from_secs(30),
        );
        assert!(out.status.success(), "{out:?}");
    }
}
