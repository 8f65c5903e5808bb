//! An operator's bad input, as real processes on loopback (issue #22): the same pool served
//! twice, two masters of one cluster, the creating command run again, a dead address or the
//! master's address in the cluster file, two clusters on one host with the default client
//! id, values over the limit, empty keys. Each test starts `dmkit` processes and checks
//! what an operator sees: the exit status and the one line on stderr.

use std::time::Duration;

use dmkit_tests::procs::{Memnode, run_dmkit};

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
