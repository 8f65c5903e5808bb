//! `dmkit resp` as a process in front of a FUSEE cluster of real processes.
//!
//! - Bad input (default run): a bad or missing cluster file, unreachable memory nodes and
//!   malformed RESP give clear errors, and a malformed request closes only its connection.
//! - The real Redis tools (`#[ignore]`d; `.ci/tier-redis.sh` installs `redis-tools` and
//!   `redis-server` and runs them with `--ignored`): `redis-cli` sees Redis's replies and
//!   error formats, and `redis-benchmark -t set,get` completes without errors. Without the
//!   tools these tests fail with a message naming the package; they never pass silently.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::time::Duration;

use dmkit_tests::procs::{Daemon, Memnode, ProcCluster, cluster_file, run_dmkit};

type Cluster = ProcCluster;

fn start_cluster(nodes: u16, replicas: usize) -> Cluster {
    ProcCluster::start(nodes, replicas, "32MiB")
}

/// `dmkit resp` on a free loopback port, with its own client id (tests run in parallel).
fn start_gateway(c: &Cluster, client_id: u64) -> (Daemon, String) {
    let d = Daemon::start(
        &[
            "resp",
            "--listen",
            "127.0.0.1:0",
            "--cluster",
            &c.file,
            "--client-id",
            &client_id.to_string(),
        ],
        "serving Redis clients on",
    );
    let addr = d.addr();
    (d, addr)
}

fn port_of(addr: &str) -> String {
    addr.rsplit_once(':').unwrap().1.to_string()
}

// ---------------------------------------------------------------------------------------
// Bad input (default run)
// ---------------------------------------------------------------------------------------

fn one_line_error(out: &std::process::Output) -> String {
    let err = String::from_utf8_lossy(&out.stderr).trim().to_string();
    assert_eq!(err.lines().count(), 1, "expected one stderr line: {err}");
    assert!(err.starts_with("dmkit: error: "), "{err}");
    err
}

#[test]
fn resp_rejects_a_bad_or_missing_cluster_file() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, "backend = \"carrier-pigeon\"\n").unwrap();
    let out = run_dmkit(
        &[
            "resp",
            "--listen",
            "127.0.0.1:0",
            "--cluster",
            bad.to_str().unwrap(),
        ],
        Duration::from_secs(20),
    );
    assert_eq!(out.status.code(), Some(2));
    let err = one_line_error(&out);
    assert!(err.contains("bad.toml"), "names the file: {err}");

    let garbage = dir.path().join("garbage.toml");
    std::fs::write(&garbage, "this is [not toml\n").unwrap();
    let out = run_dmkit(
        &[
            "resp",
            "--listen",
            "127.0.0.1:0",
            "--cluster",
            garbage.to_str().unwrap(),
        ],
        Duration::from_secs(20),
    );
    assert_eq!(out.status.code(), Some(2));
    one_line_error(&out);

    let out = run_dmkit(
        &[
            "resp",
            "--listen",
            "127.0.0.1:0",
            "--cluster",
            "/nonexistent/cluster.toml",
        ],
        Duration::from_secs(20),
    );
    assert_eq!(out.status.code(), Some(2));
    let err = one_line_error(&out);
    assert!(err.contains("/nonexistent/cluster.toml"), "{err}");

    // A password file that is missing or empty: a usage error naming it, before anything.
    let good = dir.path().join("good.toml");
    std::fs::write(
        &good,
        "backend = \"tcp\"\nindex_replicas = 1\ndata_replicas = 1\n[[memnode]]\nid = 0\naddr = \"127.0.0.1:1\"\n",
    )
    .unwrap();
    let empty = dir.path().join("empty-password");
    std::fs::write(&empty, "\n").unwrap();
    for (file, says) in [
        (
            "/nonexistent/password",
            "cannot read --password-file /nonexistent/password",
        ),
        (empty.to_str().unwrap(), "is empty"),
    ] {
        let out = run_dmkit(
            &[
                "resp",
                "--listen",
                "127.0.0.1:0",
                "--cluster",
                good.to_str().unwrap(),
                "--password-file",
                file,
            ],
            Duration::from_secs(20),
        );
        assert_eq!(out.status.code(), Some(2));
        let err = one_line_error(&out);
        assert!(err.contains(says), "{err}");
    }
}

#[test]
fn resp_reports_unreachable_memory_nodes() {
    // A port nobody listens on: bind, note, release.
    let dead = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().to_string()
    };
    let dir = tempfile::tempdir().unwrap();
    let file = cluster_file(dir.path(), "127.0.0.1:0", 1, &[(0, dead.clone())]);
    let out = run_dmkit(
        &[
            "resp",
            "--listen",
            "127.0.0.1:0",
            "--cluster",
            file.to_str().unwrap(),
            "--client-id",
            "7340001",
        ],
        Duration::from_secs(60),
    );
    let code = out.status.code().unwrap_or(-1);
    assert!(code >= 1, "exit {code}");
    let err = one_line_error(&out);
    assert!(err.contains("cannot join the cluster"), "{err}");
    assert!(
        err.contains(&dead),
        "names the unreachable node {dead}: {err}"
    );
}

#[test]
fn malformed_resp_closes_only_that_connection() {
    let c = start_cluster(1, 1);
    let (_gw, addr) = start_gateway(&c, 7340002);
    let exchange = |input: &[u8]| -> String {
        let mut s = TcpStream::connect(&addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        s.write_all(input).unwrap();
        let mut out = Vec::new();
        // The gateway closes after a protocol error (or QUIT): read to the end.
        let _ = s.read_to_end(&mut out);
        String::from_utf8_lossy(&out).into_owned()
    };
    assert_eq!(
        exchange(b"*1\r\n$x\r\n"),
        "-ERR Protocol error: invalid count 'x'\r\n"
    );
    let r = exchange(b"*2\r\n$3\r\nGET\r\n$-5\r\n");
    assert!(r.starts_with("-ERR Protocol error"), "{r:?}");
    let r = exchange(b"SET k v\r\nGET k\r\n*1\r\n:1\r\n");
    assert!(
        r.starts_with("+OK\r\n$1\r\nv\r\n-ERR Protocol error"),
        "replies before the bad request are kept: {r:?}"
    );
    // The gateway still serves others.
    assert_eq!(
        exchange(b"GET k\r\nNOSUCH 1\r\nQUIT\r\n"),
        "$1\r\nv\r\n-ERR unknown command 'NOSUCH', with args beginning with: '1' \r\n+OK\r\n"
    );
}

/// Sends `input` and reads until the reply holds `want_lines` lines (CRLF-terminated).
fn exchange_lines(s: &mut TcpStream, input: &[u8], want_lines: usize) -> String {
    exchange_lines_within(s, input, want_lines, Duration::from_secs(20))
}

/// [`exchange_lines`], waiting up to `limit` for each read.
fn exchange_lines_within(
    s: &mut TcpStream,
    input: &[u8],
    want_lines: usize,
    limit: Duration,
) -> String {
    s.set_read_timeout(Some(limit)).unwrap();
    s.write_all(input).unwrap();
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    while out.windows(2).filter(|w| w == b"\r\n").count() < want_lines {
        let n = s.read(&mut buf).unwrap();
        assert!(n > 0, "closed after {:?}", String::from_utf8_lossy(&out));
        out.extend_from_slice(&buf[..n]);
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `--auth-cluster-secret`: the cluster secret is the default user's password. Nothing runs
/// before AUTH; a wrong secret gets Redis's WRONGPASS; `AUTH secret`, `AUTH default secret`
/// and `HELLO 3 AUTH default secret` are accepted. Without a cluster secret, or with a
/// --password-file too, the gateway refuses to start (exit 2, one line).
#[test]
fn auth_against_the_cluster_secret() {
    let dir = tempfile::tempdir().unwrap();
    let secret = "a-cluster-secret-of-enough-bytes";
    let sfile = dir.path().join("secret");
    std::fs::write(&sfile, format!("{secret}\n")).unwrap();
    let s = sfile.to_str().unwrap();
    let node = Memnode::start(&[
        "--id",
        "0",
        "--dram",
        "16MiB",
        "--block-size",
        "64KiB",
        "--secret-file",
        s,
    ]);
    let file = dir.path().join("cluster.toml");
    std::fs::write(
        &file,
        format!(
            "backend = \"tcp\"\nmaster = \"127.0.0.1:0\"\nindex_replicas = 1\ndata_replicas = 1\n\
             index_mib = 1\nsecret_file = \"{s}\"\n[[memnode]]\nid = 0\naddr = \"{}\"\n",
            node.addr
        ),
    )
    .unwrap();
    let file = file.to_str().unwrap();
    let _master = Daemon::start(
        &["master", "--listen", "127.0.0.1:0", "--cluster", file],
        "serving on",
    );
    let gw = Daemon::start(
        &[
            "resp",
            "--listen",
            "127.0.0.1:0",
            "--cluster",
            file,
            "--client-id",
            "7340010",
            "--auth-cluster-secret",
        ],
        "serving Redis clients on",
    );
    assert!(
        gw.ready_line.contains("AUTH required: the cluster secret"),
        "{}",
        gw.ready_line
    );
    let addr = gw.addr();
    let wrong = "-WRONGPASS invalid username-password pair or user is disabled.\r\n";
    let mut c = TcpStream::connect(&addr).unwrap();
    let got = exchange_lines(
        &mut c,
        b"SET k v\r\nAUTH not-the-secret\r\nAUTH default not-the-secret\r\nAUTH bob a-cluster-secret-of-enough-bytes\r\n\
          AUTH a-cluster-secret-of-enough-byte\r\nAUTH a-cluster-secret-of-enough-bytesX\r\nGET k\r\n",
        7,
    );
    assert_eq!(
        got,
        format!(
            "-NOAUTH Authentication required.\r\n{wrong}{wrong}{wrong}{wrong}{wrong}-NOAUTH Authentication required.\r\n"
        )
    );
    let got = exchange_lines(
        &mut c,
        format!("AUTH {secret}\r\nSET k v\r\nGET k\r\n").as_bytes(),
        4,
    );
    assert_eq!(got, "+OK\r\n+OK\r\n$1\r\nv\r\n");
    let mut c = TcpStream::connect(&addr).unwrap();
    let got = exchange_lines(
        &mut c,
        format!("AUTH default {secret}\r\nGET k\r\n").as_bytes(),
        3,
    );
    assert_eq!(got, "+OK\r\n$1\r\nv\r\n");
    let mut c = TcpStream::connect(&addr).unwrap();
    let got = exchange_lines(
        &mut c,
        format!("HELLO 3 AUTH default {secret}\r\nGET k\r\n").as_bytes(),
        17,
    );
    assert!(got.starts_with("%7\r\n"), "{got}");
    assert!(got.ends_with("$1\r\nv\r\n"), "{got}");
    // The secret is not shown.
    let mut c = TcpStream::connect(&addr).unwrap();
    let got = exchange_lines(
        &mut c,
        format!("AUTH {secret}\r\nCONFIG GET *\r\nINFO\r\n").as_bytes(),
        10,
    );
    std::thread::sleep(Duration::from_millis(200));
    let mut rest = [0u8; 65536];
    c.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let n = c.read(&mut rest).unwrap_or(0);
    let all = format!("{got}{}", String::from_utf8_lossy(&rest[..n]));
    assert!(!all.contains(secret), "{all}");

    // Refusals at start: no secret in the cluster, or a password file as well.
    let plain = dir.path().join("plain.toml");
    std::fs::write(
        &plain,
        "backend = \"tcp\"\nindex_replicas = 1\ndata_replicas = 1\n[[memnode]]\nid = 0\naddr = \"127.0.0.1:1\"\n",
    )
    .unwrap();
    let mut cmd = Command::new(dmkit_tests::procs::dmkit_bin());
    cmd.env_remove("DMKIT_SECRET")
        .env_remove("DMKIT_SECRET_FILE")
        .args(["resp", "--listen", "127.0.0.1:0", "--cluster"])
        .arg(&plain)
        .arg("--auth-cluster-secret");
    let out = cmd.output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = one_line_error(&out);
    assert!(err.contains("this cluster has no secret"), "{err}");
    let out = run_dmkit(
        &[
            "resp",
            "--listen",
            "127.0.0.1:0",
            "--cluster",
            file,
            "--auth-cluster-secret",
            "--password-file",
            s,
        ],
        Duration::from_secs(20),
    );
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cannot be used with"), "{err}");
}

// ---------------------------------------------------------------------------------------
// The real Redis tools (tier: .ci/tier-redis.sh)
// ---------------------------------------------------------------------------------------

fn need(tool: &str, package: &str) {
    let ok = Command::new(tool)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        ok,
        "{tool} not found: install the Debian package `{package}` (or run .ci/tier-redis.sh)"
    );
}

/// `redis-cli --no-raw ARGS` against the gateway: its stdout, trimmed (Redis's formatted
/// output: `OK`, `"value"`, `(nil)`, `(integer) 1`, `(error) ERR ...`).
fn cli(port: &str, args: &[&str]) -> String {
    let out = Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", port, "--no-raw"])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run redis-cli");
    assert!(
        out.status.success(),
        "redis-cli {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim_end().to_string()
}

#[test]
#[ignore = "needs redis-cli and redis-benchmark (Debian redis-tools): run .ci/tier-redis.sh"]
fn redis_cli_sees_redis_replies_and_errors() {
    need("redis-cli", "redis-tools");
    let c = start_cluster(3, 3);
    let (_gw, addr) = start_gateway(&c, 7340003);
    let p = port_of(&addr);
    let p = p.as_str();
    assert_eq!(cli(p, &["PING"]), "PONG");
    assert_eq!(cli(p, &["PING", "hello there"]), "\"hello there\"");
    assert_eq!(cli(p, &["SET", "fruit", "apple"]), "OK");
    assert_eq!(cli(p, &["GET", "fruit"]), "\"apple\"");
    assert_eq!(cli(p, &["GET", "nothing"]), "(nil)");
    assert_eq!(cli(p, &["SET", "fruit", "banana", "NX"]), "(nil)");
    assert_eq!(cli(p, &["GET", "fruit"]), "\"apple\"");
    assert_eq!(cli(p, &["SET", "fruit", "cherry", "XX"]), "OK");
    assert_eq!(cli(p, &["GET", "fruit"]), "\"cherry\"");
    assert_eq!(cli(p, &["SET", "veg", "carrot", "XX"]), "(nil)");
    assert_eq!(cli(p, &["SET", "veg", "carrot", "NX"]), "OK");
    assert_eq!(cli(p, &["SET", "with space", "a b\tc"]), "OK");
    assert_eq!(cli(p, &["GET", "with space"]), "\"a b\\tc\"");
    assert_eq!(
        cli(p, &["EXISTS", "fruit", "veg", "nothing"]),
        "(integer) 2"
    );
    assert_eq!(cli(p, &["MSET", "a", "1", "b", "2"]), "OK");
    assert_eq!(
        cli(p, &["MGET", "a", "b", "nothing"]),
        "1) \"1\"\n2) \"2\"\n3) (nil)"
    );
    assert_eq!(cli(p, &["DEL", "a", "b", "nothing"]), "(integer) 2");
    assert_eq!(cli(p, &["EXISTS", "a"]), "(integer) 0");
    let info = cli(p, &["INFO"]);
    assert!(info.contains("redis_version:"), "{info}");
    assert!(info.contains("fusee_memory_nodes:3"), "{info}");
    assert_eq!(
        cli(p, &["FOOBAR", "x", "y"]),
        "(error) ERR unknown command 'FOOBAR', with args beginning with: 'x' 'y'"
    );
    assert_eq!(
        cli(p, &["GET"]),
        "(error) ERR wrong number of arguments for 'get' command"
    );
    assert_eq!(
        cli(p, &["SET", "k", "v", "NX", "XX"]),
        "(error) ERR syntax error"
    );
    assert_eq!(cli(p, &["QUIT"]), "OK");

    // Several commands in one session from stdin (redis-cli's pipe of commands).
    let mut child = Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", p])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run redis-cli");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"SET s1 one\nGET s1\nDEL s1\nGET s1\n")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let lines: Vec<String> = BufReader::new(&out.stdout[..])
        .lines()
        .map(Result::unwrap)
        .collect();
    assert_eq!(
        lines,
        ["OK", "one", "1", ""],
        "raw output of a stdin session"
    );
}

#[test]
#[ignore = "needs redis-benchmark (Debian redis-tools): run .ci/tier-redis.sh"]
fn redis_benchmark_completes_without_errors() {
    need("redis-benchmark", "redis-tools");
    let c = start_cluster(3, 3);
    let (_gw, addr) = start_gateway(&c, 7340004);
    let p = port_of(&addr);
    let out = Command::new("redis-benchmark")
        .args(["-h", "127.0.0.1", "-p", &p])
        .args(["-t", "set,get", "-n", "2000", "-q"])
        .stdin(Stdio::null())
        .output()
        .expect("run redis-benchmark");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("redis-benchmark: {stdout}{stderr}");
    assert!(out.status.success(), "exit {}: {stderr}", out.status);
    assert!(
        !stdout.contains("Error") && !stderr.contains("Error"),
        "{stdout}{stderr}"
    );
    for test in ["SET: ", "GET: "] {
        let line = stdout
            .split(['\n', '\r'])
            .rfind(|l| l.starts_with(test) && l.contains("requests per second"))
            .unwrap_or_else(|| panic!("no final {test} line in: {stdout}"));
        let rps: f64 = line[test.len()..]
            .split_whitespace()
            .next()
            .unwrap()
            .parse()
            .unwrap();
        assert!(rps > 0.0, "{line}");
    }
    // The data is really there: the keys redis-benchmark wrote are readable.
    assert_eq!(cli(&p, &["EXISTS", "key:__rand_int__"]), "(integer) 1");
}

/// redis-server on a free loopback port, without persistence; killed when dropped.
struct RedisServer(std::process::Child, String);

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_redis_server() -> RedisServer {
    need("redis-server", "redis-server");
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
        .to_string();
    let child = Command::new("redis-server")
        .args([
            "--port",
            &port,
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("run redis-server");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(format!("127.0.0.1:{port}")).is_err() {
        assert!(
            std::time::Instant::now() < deadline,
            "redis-server did not start"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    RedisServer(child, port)
}

#[test]
#[ignore = "needs redis-server and redis-py (pip install redis): run .ci/tier-redis.sh"]
fn redis_py_at_its_defaults_sees_what_redis_server_gives() {
    // The newest redis-py opens every connection with HELLO 3 (RESP3).
    let has_py = Command::new("python3")
        .args(["-c", "import redis"])
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        has_py,
        "redis-py not found: `python3 -m pip install redis` (or run .ci/tier-redis.sh)"
    );
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/redis_py_session.py");
    let session = |port: &str| {
        let out = Command::new("python3")
            .args([script, port])
            .stdin(Stdio::null())
            .output()
            .expect("run python3");
        assert!(
            out.status.success(),
            "redis-py session against port {port}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let redis = start_redis_server();
    let expected = session(&redis.1);
    let c = start_cluster(3, 3);
    let (_gw, addr) = start_gateway(&c, 7340005);
    let got = session(&port_of(&addr));
    eprintln!("redis-py session against the gateway:\n{got}");
    assert_eq!(
        got, expected,
        "the gateway and redis-server answered differently"
    );
    assert!(got.contains("empty key get: b'empty'"), "{got}");
}

/// The compatibility script (tests/scripts/compat.py): 186 everyday commands sent to the
/// gateway and to a real redis-server through redis-py (its defaults: RESP3) and through
/// redis-cli (RESP2, one session), compared reply by reply. It prints the per-command table,
/// the match rate and the allow-list of deliberate differences, and fails on a difference not
/// in the allow-list, an allow-list entry that no longer differs, or a match rate under 90%.
#[test]
#[ignore = "needs redis-server, redis-cli and redis-py: run .ci/tier-redis.sh"]
fn compatibility_script_matches_redis_server() {
    need("redis-cli", "redis-tools");
    let has_py = Command::new("python3")
        .args(["-c", "import redis"])
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        has_py,
        "redis-py not found: `python3 -m pip install redis` (or run .ci/tier-redis.sh)"
    );
    let redis = start_redis_server();
    let c = start_cluster(3, 3);
    let (_gw, addr) = start_gateway(&c, 7340006);
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/compat.py");
    let out = Command::new("python3")
        .args([
            script,
            "--gateway",
            &port_of(&addr),
            "--redis",
            &redis.1,
            "--client",
            "both",
        ])
        .stdin(Stdio::null())
        .output()
        .expect("run python3");
    let stdout = String::from_utf8_lossy(&out.stdout);
    eprintln!("{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        out.status.success(),
        "the gateway differs from redis-server beyond the allow-list (table above)"
    );
    assert!(stdout.contains("0 unexpected"), "{stdout}");
}

/// A 64 MiB value (the store's maximum) round-trips through the gateway over FUSEE; a
/// longer one is refused with Redis's errors and nothing is written: a SET whose bulk is over
/// the limit gets `Protocol error: invalid bulk length` (and its connection closes, as
/// Redis's does), an APPEND past the maximum `string exceeds maximum allowed size`.
#[test]
fn a_64_mib_value_round_trips_through_the_gateway() {
    const MAX: usize = 64 << 20;
    let c = ProcCluster::start(3, 1, "192MiB");
    let (_gw, addr) = start_gateway(&c, 7340011);
    let big: Vec<u8> = (0..MAX).map(|i| (i * 13 + i / 8191) as u8).collect();
    let mut s = TcpStream::connect(&addr).unwrap();
    let mut req = format!("*3\r\n$3\r\nSET\r\n$3\r\nbig\r\n${MAX}\r\n").into_bytes();
    req.extend_from_slice(&big);
    req.extend_from_slice(b"\r\n");
    let t = std::time::Instant::now();
    assert_eq!(
        exchange_lines_within(&mut s, &req, 1, Duration::from_secs(300)),
        "+OK\r\n"
    );
    eprintln!("SET of 64 MiB: {:?}", t.elapsed());
    s.write_all(b"GET big\r\n").unwrap();
    s.set_read_timeout(Some(Duration::from_secs(300))).unwrap();
    let head = format!("${MAX}\r\n");
    let mut got = Vec::with_capacity(MAX + 64);
    let mut buf = vec![0u8; 1 << 20];
    while got.len() < head.len() + MAX + 2 {
        let n = s.read(&mut buf).unwrap();
        assert!(n > 0, "closed after {} bytes", got.len());
        got.extend_from_slice(&buf[..n]);
    }
    assert!(got.starts_with(head.as_bytes()), "{:?}", &got[..32]);
    assert!(
        got[head.len()..head.len() + MAX] == big[..],
        "the value came back changed"
    );
    assert_eq!(
        exchange_lines(&mut s, b"APPEND big x\r\nSTRLEN big\r\n", 2),
        "-ERR string exceeds maximum allowed size (proto-max-bulk-len)\r\n:67108864\r\n"
    );
    // A slice, presence and type read the value's manifest and the chunk the slice is in,
    // not 64 MiB (the byte counts are checked in dmkit-fusee's tests).
    let t = std::time::Instant::now();
    let want = [
        &b"$10\r\n"[..],
        &big[40_000_000..40_000_010],
        b"\r\n$3\r\n",
        &big[MAX - 3..],
        b"\r\n:1\r\n+string\r\n",
    ]
    .concat();
    s.write_all(
        b"GETRANGE big 40000000 40000009\r\nGETRANGE big -3 -1\r\nEXISTS big\r\nTYPE big\r\n",
    )
    .unwrap();
    let mut got = vec![0; want.len()];
    s.read_exact(&mut got).unwrap();
    assert_eq!(got, want);
    eprintln!(
        "GETRANGE (twice), EXISTS, TYPE of 64 MiB: {:?}",
        t.elapsed()
    );
    // One byte over, announced: refused before its bytes are read.
    let mut s2 = TcpStream::connect(&addr).unwrap();
    s2.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    s2.write_all(format!("*3\r\n$3\r\nSET\r\n$3\r\nbig\r\n${}\r\n", MAX + 1).as_bytes())
        .unwrap();
    let mut out = Vec::new();
    let _ = s2.read_to_end(&mut out);
    assert_eq!(
        String::from_utf8_lossy(&out),
        format!("-ERR Protocol error: invalid bulk length {}\r\n", MAX + 1)
    );
    assert_eq!(
        exchange_lines(&mut s, b"STRLEN big\r\nDEL big\r\n", 2),
        ":67108864\r\n:1\r\n"
    );
}
