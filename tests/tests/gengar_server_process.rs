//! `dmkit gengar-server` as a real process: bad input is one line and exit 2; objects written
//! with confirms survive SIGKILL and a restart on the same pool file.

use std::sync::Arc;
use std::time::Duration;

use dmkit_gengar::{ClientConfig, Error, GengarClient, GlobalAddr};
use dmkit_lease::{Clock, SystemClock};
use dmkit_tests::procs::{Daemon, run_dmkit};
use dmkit_verbs::tcp::TcpConnector;
use dmkit_verbs::{Endpoint, NodeId};

fn client(addr: &str, id: u64) -> GengarClient {
    let ep = Endpoint::connect(&TcpConnector::default(), &[(NodeId(4), addr.to_string())])
        .expect("connect to the Gengar server");
    let clock: Arc<dyn Clock> = Arc::new(SystemClock::new());
    GengarClient::new(ep, id, ClientConfig::default(), clock).expect("a Gengar client")
}

fn one_line_error(args: &[&str], expect: &str) {
    let out = run_dmkit(args, Duration::from_secs(20));
    assert_eq!(out.status.code(), Some(2), "{args:?}");
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
fn bad_input_is_one_line_and_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let pool = dir.path().join("p");
    let pool = pool.to_str().unwrap();
    let base = ["gengar-server", "--listen", "127.0.0.1:0", "--id", "0"];
    let with = |more: &[&'static str]| -> Vec<String> {
        base.iter()
            .chain(more)
            .map(|s| s.to_string())
            .collect::<Vec<_>>()
    };
    let run = |args: Vec<String>, expect: &str| {
        let a: Vec<&str> = args.iter().map(String::as_str).collect();
        one_line_error(&a, expect);
    };
    let mut a = with(&["--dram", "1MiB", "--pool"]);
    a.push(pool.into());
    run(a, "does not exist; give --size");
    let mut a = with(&["--dram", "lots", "--size", "8MiB", "--pool"]);
    a.push(pool.into());
    run(a, "invalid size");
    let mut a = with(&[
        "--dram", "1MiB", "--size", "8MiB", "--window", "0", "--pool",
    ]);
    a.push(pool.into());
    run(a, "--window");
    one_line_error(
        &[
            "gengar-server",
            "--listen",
            "nowhere",
            "--id",
            "0",
            "--dram",
            "1MiB",
            "--size",
            "8MiB",
            "--pool",
            pool,
        ],
        "",
    );
    one_line_error(
        &["gengar-server", "--listen", "127.0.0.1:0", "--id", "0"],
        "required",
    );
}

#[test]
fn confirmed_objects_survive_sigkill_and_a_restart_on_the_pool_file() {
    let dir = tempfile::tempdir().unwrap();
    let pool = dir.path().join("gengar.pool");
    let pool = pool.to_str().unwrap();
    let mut server = Daemon::start(
        &[
            "gengar-server",
            "--listen",
            "127.0.0.1:0",
            "--id",
            "4",
            "--pool",
            pool,
            "--size",
            "16MiB",
            "--dram",
            "1MiB",
            "--window",
            "20",
        ],
        "serving",
    );
    assert!(
        server.ready_line.contains("created"),
        "{}",
        server.ready_line
    );
    let mut kept: Vec<(GlobalAddr, Vec<u8>)> = Vec::new();
    {
        let c = client(&server.addr(), 1);
        let mut confirms = Vec::new();
        for i in 0..100usize {
            let size = [40, 300, 3000][i % 3];
            let a = c.alloc(size).unwrap();
            assert_eq!(a.server, NodeId(4));
            let data: Vec<u8> = (0..size).map(|j| (i * 7 + j * 3) as u8).collect();
            confirms.push(c.write_proxied(a, 0, &data).unwrap());
            kept.push((a, data));
        }
        // Hot reads, so some objects are in DRAM when the process dies.
        for _ in 0..3000 {
            c.read(kept[0].0).unwrap();
        }
        c.report_hot().unwrap();
        for cf in &confirms {
            cf.wait().unwrap();
        }
        let gone = kept.pop().unwrap().0;
        c.free(gone).unwrap();
        kept.push((gone, Vec::new()));
    }
    server.kill9();
    let again = Daemon::start(
        &[
            "gengar-server",
            "--listen",
            "127.0.0.1:0",
            "--id",
            "4",
            "--pool",
            pool,
            "--dram",
            "1MiB",
        ],
        "serving",
    );
    assert!(
        again.ready_line.contains("recovered"),
        "{}",
        again.ready_line
    );
    let c = client(&again.addr(), 2);
    for (a, data) in &kept {
        if data.is_empty() {
            assert!(matches!(c.read(*a), Err(Error::Freed(_))), "{a} was freed");
        } else {
            assert_eq!(&c.read(*a).unwrap(), data, "{a} after SIGKILL and restart");
        }
    }
}
