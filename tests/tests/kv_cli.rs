//! A FUSEE cluster of real processes on loopback — three `dmkit memnode`s and a `dmkit
//! master` — driven by `dmkit kv`, whose exit codes scripts rely on.

use std::time::Duration;

use dmkit_tests::procs::{Daemon, Memnode, ProcCluster, cluster_file, run_dmkit};

type Cluster = ProcCluster;

fn start(replicas: usize) -> Cluster {
    ProcCluster::start(3, replicas, "32MiB")
}

fn kv(c: &Cluster, args: &[&str]) -> (i32, String, String) {
    let mut a = vec!["kv", "--cluster", &c.file];
    a.extend_from_slice(args);
    let out = run_dmkit(&a, Duration::from_secs(60));
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn put_get_del_and_their_exit_codes() {
    let c = start(3);
    assert_eq!(kv(&c, &["put", "fruit", "apple"]).0, 0);
    let (code, out, _) = kv(&c, &["get", "fruit"]);
    assert_eq!((code, out.as_str()), (0, "apple"));
    assert_eq!(kv(&c, &["put", "fruit", "cherry"]).0, 0);
    assert_eq!(kv(&c, &["get", "fruit"]).1, "cherry");
    let (code, out, err) = kv(&c, &["get", "nothing"]);
    assert_eq!(code, 1);
    assert!(out.is_empty());
    assert!(err.contains("not found"), "{err}");
    assert_eq!(kv(&c, &["del", "fruit"]).0, 0);
    assert_eq!(kv(&c, &["del", "fruit"]).0, 1);
    assert_eq!(kv(&c, &["get", "fruit"]).0, 1);
    // Another client id sees the same data.
    assert_eq!(kv(&c, &["--client-id", "5", "put", "k", "v"]).0, 0);
    assert_eq!(kv(&c, &["get", "k"]).1, "v");
}

/// The lock files of client ids in `$TMPDIR` (`dmkit-client-<uuid>-<id>.lock`) for `id`.
fn lock_files(id: u64) -> Vec<std::path::PathBuf> {
    std::fs::read_dir(std::env::temp_dir())
        .unwrap()
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name().and_then(|n| n.to_str()).is_some_and(|n| {
                n.starts_with("dmkit-client-") && n.ends_with(&format!("-{id}.lock"))
            })
        })
        .collect()
}

/// Processes sharing one client id take turns (each waits for the one before), every one
/// succeeds, and the id's lock file is gone once the last has exited.
#[test]
fn one_client_id_is_taken_in_turns_and_its_lock_file_removed() {
    const ID: u64 = 0x10C4_F11E;
    let c = start(1);
    let id = ID.to_string();
    let file = c.file.clone();
    std::thread::scope(|s| {
        let runs: Vec<_> = (0..4)
            .map(|i| {
                let (file, id) = (&file, &id);
                s.spawn(move || {
                    let key = format!("k{i}");
                    let args = ["kv", "--cluster", file, "--client-id", id, "put", &key, "v"];
                    run_dmkit(&args, Duration::from_secs(60))
                })
            })
            .collect();
        for r in runs {
            let out = r.join().unwrap();
            assert!(out.status.success(), "{out:?}");
        }
    });
    for i in 0..4 {
        assert_eq!(kv(&c, &["get", &format!("k{i}")]).1, "v");
    }
    assert_eq!(lock_files(ID), Vec::<std::path::PathBuf>::new());
}

#[test]
fn failures_exit_two_or_more_with_one_line() {
    let c = start(1);
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, "backend = \"carrier-pigeon\"\n").unwrap();
    let out = run_dmkit(
        &["kv", "--cluster", bad.to_str().unwrap(), "get", "x"],
        Duration::from_secs(20),
    );
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    let missing = run_dmkit(
        &["kv", "--cluster", "/nonexistent/cluster.toml", "get", "x"],
        Duration::from_secs(20),
    );
    assert_eq!(missing.status.code(), Some(2));
    // A dead memory node: the client cannot join.
    let mut c = c;
    for m in &mut c.memnodes {
        m.kill9();
    }
    let (code, out, err) = kv(&c, &["get", "x"]);
    assert!(code >= 2, "exit {code}");
    assert!(out.is_empty());
    assert!(!err.is_empty());
}

#[test]
fn a_client_without_the_cluster_secret_gets_nothing_and_changes_nothing() {
    use std::process::Command;
    let dir = tempfile::tempdir().unwrap();
    let secret = "a-cluster-secret-of-enough-bytes";
    let sfile = dir.path().join("secret");
    std::fs::write(&sfile, secret).unwrap();
    let s = sfile.to_str().unwrap();
    let memnodes: Vec<_> = (0..3u16)
        .map(|i| {
            Memnode::start(&[
                "--id",
                &i.to_string(),
                "--dram",
                "16MiB",
                "--block-size",
                "64KiB",
                "--secret-file",
                s,
            ])
        })
        .collect();
    let addrs: Vec<_> = memnodes
        .iter()
        .enumerate()
        .map(|(i, m)| (i as u16, m.addr.clone()))
        .collect();
    let file = cluster_file(dir.path(), "127.0.0.1:0", 1, &addrs);
    let file = file.to_str().unwrap().to_string();
    let run = |env: Option<&str>, args: &[&str]| {
        let mut cmd = Command::new(dmkit_tests::procs::dmkit_bin());
        cmd.env_remove("DMKIT_SECRET")
            .env_remove("DMKIT_SECRET_FILE");
        if let Some(v) = env {
            cmd.env("DMKIT_SECRET", v);
        }
        cmd.args(args).output().unwrap()
    };
    let _master = {
        let out = run(Some(secret), &["kv", "--cluster", &file, "get", "x"]);
        // Not formatted yet: the master formats it (with the secret from the environment).
        assert_ne!(out.status.code(), Some(0));
        Daemon::start_with_env(
            &["master", "--listen", "127.0.0.1:0", "--cluster", &file],
            "serving on",
            &[("DMKIT_SECRET", secret)],
        )
    };
    let ok = run(Some(secret), &["kv", "--cluster", &file, "put", "k", "v"]);
    assert_eq!(
        ok.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    for bad in [None, Some("the-wrong-secret-of-enough-bytes")] {
        let out = run(bad, &["kv", "--cluster", &file, "put", "k", "stolen"]);
        assert!(out.status.code().unwrap_or(0) >= 2);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("secret") || err.contains("authentication"),
            "{err}"
        );
    }
    let got = run(Some(secret), &["kv", "--cluster", &file, "get", "k"]);
    assert_eq!(String::from_utf8_lossy(&got.stdout), "v");
}
