//! Starting `dmkit` processes on loopback and waiting for them.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// The `dmkit` binary of this build, brought up to date once per test process (a no-op when
/// `cargo test --workspace` already built it). `DMKIT_TEST_BIN` names a prebuilt one instead
/// (the rdma tier builds `dmkit --features rdma` on the host and runs the tests in the
/// SoftRoCE guest, where building is slow).
pub fn dmkit_bin() -> PathBuf {
    static BIN: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BIN.get_or_init(|| match std::env::var_os("DMKIT_TEST_BIN") {
        Some(p) => PathBuf::from(p),
        None => build_dmkit(),
    })
    .clone()
}

/// The verbs backend the process tests run their memory nodes on: `tcp` on loopback, or
/// `rdma` when `DMKIT_TEST_BACKEND=rdma` (inside the SoftRoCE guest: memory nodes listen on
/// `$SOFTROCE_IP`, since rdma-cm cannot use loopback).
pub fn backend() -> &'static str {
    match std::env::var("DMKIT_TEST_BACKEND").as_deref() {
        Ok("rdma") => "rdma",
        Ok("tcp") | Err(_) => "tcp",
        Ok(other) => panic!("DMKIT_TEST_BACKEND={other}: use tcp or rdma"),
    }
}

/// A connector for the tests' [`backend`] (rdma needs this crate's `rdma` feature).
pub fn connector() -> std::sync::Arc<dyn dmkit_verbs::Connector> {
    match backend() {
        #[cfg(feature = "rdma")]
        "rdma" => std::sync::Arc::new(dmkit_verbs::rdma::RdmaConnector::new(
            dmkit_verbs::rdma::RdmaConfig::from_env().expect("DMKIT_RDMA_* settings"),
        )),
        #[cfg(not(feature = "rdma"))]
        "rdma" => panic!("DMKIT_TEST_BACKEND=rdma needs dmkit-tests built with --features rdma"),
        _ => std::sync::Arc::new(dmkit_verbs::tcp::TcpConnector::default()),
    }
}

/// An endpoint for `connector` (with its registered buffers, if it has any).
pub fn endpoint_for(connector: &dyn dmkit_verbs::Connector) -> dmkit_verbs::Endpoint {
    match connector.buf_allocator().expect("the backend's buffers") {
        Some(a) => dmkit_verbs::Endpoint::with_allocator(Default::default(), a),
        None => dmkit_verbs::Endpoint::default(),
    }
}

/// Where memory nodes listen, port 0: loopback on tcp, the RDMA interface on rdma.
pub fn memnode_listen() -> String {
    if backend() == "rdma" {
        let ip = std::env::var("SOFTROCE_IP")
            .expect("DMKIT_TEST_BACKEND=rdma needs SOFTROCE_IP (run inside the SoftRoCE guest)");
        format!("{ip}:0")
    } else {
        "127.0.0.1:0".into()
    }
}

fn build_dmkit() -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    // target/<profile>/deps/<test> -> target/<profile>/dmkit
    let dir = exe
        .parent()
        .and_then(|d| d.parent())
        .expect("target dir")
        .to_path_buf();
    let bin = dir.join("dmkit");
    {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let mut cmd = Command::new(cargo);
        cmd.args(["build", "-p", "dmkit-tools", "--bin", "dmkit"]);
        if dir.file_name().is_some_and(|n| n == "release") {
            cmd.arg("--release");
        }
        cmd.current_dir(env!("CARGO_MANIFEST_DIR"));
        let st = cmd.status().expect("run cargo build");
        assert!(st.success(), "cargo build -p dmkit-tools failed");
    }
    bin
}

/// Runs `dmkit ARGS` to completion with a timeout.
pub fn run_dmkit(args: &[&str], timeout: Duration) -> Output {
    let mut child = Command::new(dmkit_bin())
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn dmkit");
    let deadline = std::time::Instant::now() + timeout;
    loop {
        if child.try_wait().expect("wait").is_some() {
            return child.wait_with_output().expect("output");
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output().expect("output");
            panic!(
                "dmkit {args:?} did not finish in {timeout:?}; stderr: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Any long-running `dmkit` child process (master, resp, ...), started once its stderr shows
/// `ready`. Killed (SIGKILL) when dropped; dropped by a failing test, it prints the last
/// lines of its stderr first.
#[derive(Debug)]
pub struct Daemon {
    child: Child,
    /// What it was started as (for the failing test's output).
    what: String,
    /// The stderr line that said it was ready.
    pub ready_line: String,
    pub stderr: mpsc::Receiver<String>,
}

impl Daemon {
    pub fn start(args: &[&str], ready: &str) -> Daemon {
        Self::start_with_env(args, ready, &[])
    }

    /// Like [`Daemon::start`] with extra environment variables.
    pub fn start_with_env(args: &[&str], ready: &str, env: &[(&str, &str)]) -> Daemon {
        Self::start_program(&dmkit_bin(), args, ready, env)
    }

    /// Any program (e.g. `ip netns exec NS dmkit ...`), ready once its stderr shows `ready`.
    pub fn start_program(
        program: &std::path::Path,
        args: &[&str],
        ready: &str,
        env: &[(&str, &str)],
    ) -> Daemon {
        let mut child = Command::new(program)
            .envs(env.iter().copied())
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn dmkit");
        let rx = lines(&mut child);
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        let mut seen = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match rx.recv_timeout(left) {
                Ok(line) if line.contains(ready) => {
                    return Daemon {
                        child,
                        what: format!("{} {}", program.display(), args.join(" ")),
                        ready_line: line,
                        stderr: rx,
                    };
                }
                Ok(line) => seen.push(line),
                Err(_) => {
                    let _ = child.kill();
                    panic!("dmkit {args:?} did not get ready; stderr: {seen:?}");
                }
            }
        }
    }

    /// The `host:port` after " on " in the ready line.
    pub fn addr(&self) -> String {
        self.ready_line
            .split(" on ")
            .last()
            .and_then(|r| r.split_whitespace().next())
            .expect("an address in the ready line")
            .trim_end_matches(|c: char| !c.is_ascii_digit())
            .to_string()
    }

    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The stderr lines it printed since its start line (or since the last call), and how
    /// it exited if it did (for a failing test's message).
    pub fn log(&mut self) -> String {
        let exit = match self.child.try_wait() {
            Ok(Some(st)) => format!(" [exited: {st}]"),
            _ => String::new(),
        };
        format!("{}{exit}", tail(&self.stderr))
    }

    /// Waits up to `timeout` for it to exit by itself: its exit code (`None` if it still
    /// runs, then it is left running, or was killed by a signal).
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<i32> {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            if let Ok(Some(st)) = self.child.try_wait() {
                return st.code();
            }
            if std::time::Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let (pid, log) = (self.pid(), self.log());
            eprintln!("--- {} (pid {pid}), its last stderr lines:{log}", self.what);
        }
        self.kill9();
    }
}

/// The lines in `rx` now, the last 60 of them, one per line.
pub fn tail(rx: &mpsc::Receiver<String>) -> String {
    let lines: Vec<String> = rx.try_iter().collect();
    let skip = lines.len().saturating_sub(60);
    let mut out = String::new();
    for l in &lines[skip..] {
        out.push_str("\n    ");
        out.push_str(l);
    }
    out
}

fn lines(child: &mut Child) -> mpsc::Receiver<String> {
    let stderr = child.stderr.take().expect("stderr");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { return };
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    rx
}

/// Writes a cluster file for `memnodes` (id, addr) into `dir`.
pub fn cluster_file(
    dir: &std::path::Path,
    master: &str,
    replicas: usize,
    memnodes: &[(u16, String)],
) -> PathBuf {
    let mut s = format!(
        "backend = \"{}\"\nmaster = \"{master}\"\nindex_replicas = {replicas}\ndata_replicas = {replicas}\nindex_mib = 1\n",
        backend()
    );
    for (id, addr) in memnodes {
        s.push_str(&format!("[[memnode]]\nid = {id}\naddr = \"{addr}\"\n"));
    }
    let p = dir.join("cluster.toml");
    std::fs::write(&p, s).expect("write the cluster file");
    p
}

/// A `dmkit memnode` child process. Killed (SIGKILL) when dropped; dropped by a failing
/// test, it prints the last lines of its stderr first.
#[derive(Debug)]
pub struct Memnode {
    child: Child,
    /// The address it listens on (`host:port`).
    pub addr: String,
    /// Its stderr lines after the start line.
    pub stderr: mpsc::Receiver<String>,
}

impl Memnode {
    /// Starts `dmkit memnode --listen 127.0.0.1:0 ARGS` (see [`memnode_listen`]) on the
    /// tests' [`backend`] and waits until it serves.
    pub fn start(args: &[&str]) -> Memnode {
        Self::start_on(&memnode_listen(), args)
    }

    /// Starts it on a given listen address.
    pub fn start_on(listen: &str, args: &[&str]) -> Memnode {
        let mut child = Command::new(dmkit_bin())
            .arg("memnode")
            .args(["--listen", listen, "--backend", backend()])
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn dmkit memnode");
        let rx = lines(&mut child);
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        // What it said before it served (or gave up), for the failure message.
        let mut said = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match rx.recv_timeout(left) {
                Ok(line) if line.contains(" serving ") => {
                    let addr = line
                        .split(" on ")
                        .nth(1)
                        .and_then(|r| r.split_whitespace().next())
                        .expect("address in the start line")
                        .to_string();
                    return Memnode {
                        child,
                        addr,
                        stderr: rx,
                    };
                }
                Ok(line) => said.push(line),
                Err(_) => {
                    let _ = child.kill();
                    panic!(
                        "memnode {args:?} did not start; it said:\n{}",
                        said.join("\n")
                    );
                }
            }
        }
    }

    /// SIGKILL, and wait for the process to be gone.
    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Memnode {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "--- dmkit memnode on {} (pid {}), its last stderr lines:{}",
                self.addr,
                self.pid(),
                tail(&self.stderr)
            );
        }
        self.kill9();
    }
}

/// A FUSEE cluster of processes on loopback: `nodes` `dmkit memnode`s on DRAM (64 KiB
/// blocks), a cluster file in a temporary directory, and a `dmkit master` that formatted it.
/// Everything is killed when it is dropped.
#[derive(Debug)]
pub struct ProcCluster {
    /// The cluster file's path.
    pub file: String,
    pub master: Daemon,
    pub memnodes: Vec<Memnode>,
    /// Holds the cluster file (and whatever else a test puts there).
    pub dir: tempfile::TempDir,
    /// With [`ProcCluster::start_relayed`]: memory node `i` is reached (by the master, the
    /// clients and the other memory nodes) through `relays[i]`, which a test can cut.
    pub relays: Vec<crate::proxy::Relay>,
}

impl ProcCluster {
    /// `nodes` memory nodes of `dram` each, `replicas` index and data replicas.
    pub fn start(nodes: u16, replicas: usize, dram: &str) -> ProcCluster {
        Self::start_with(nodes, replicas, dram, |_| Vec::new())
    }

    /// Like [`ProcCluster::start`], with extra arguments for memory node `i`.
    pub fn start_with(
        nodes: u16,
        replicas: usize,
        dram: &str,
        extra: impl Fn(u16) -> Vec<String>,
    ) -> ProcCluster {
        Self::start_full(nodes, replicas, dram, extra, &[])
    }

    /// Like [`ProcCluster::start_with`], with extra arguments for the master too.
    pub fn start_full(
        nodes: u16,
        replicas: usize,
        dram: &str,
        extra: impl Fn(u16) -> Vec<String>,
        master_extra: &[&str],
    ) -> ProcCluster {
        Self::start_inner(nodes, replicas, dram, extra, master_extra, false)
    }

    /// Like [`ProcCluster::start`], with every memory node behind a [`crate::proxy::Relay`]
    /// (the cluster file names the relays): cutting `relays[i]` partitions node `i` from
    /// everything that connects to it, while it keeps running.
    pub fn start_relayed(nodes: u16, replicas: usize, dram: &str) -> ProcCluster {
        Self::start_inner(nodes, replicas, dram, |_| Vec::new(), &[], true)
    }

    fn start_inner(
        nodes: u16,
        replicas: usize,
        dram: &str,
        extra: impl Fn(u16) -> Vec<String>,
        master_extra: &[&str],
        relayed: bool,
    ) -> ProcCluster {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let memnodes: Vec<_> = (0..nodes)
            .map(|i| {
                let id = i.to_string();
                let more = extra(i);
                let mut args = vec!["--id", &id, "--block-size", "64KiB"];
                // (A node given a pool file serves that instead of DRAM.)
                if !more.iter().any(|a| a == "--pool") {
                    args.extend(["--dram", dram]);
                }
                args.extend(more.iter().map(String::as_str));
                Memnode::start(&args)
            })
            .collect();
        let relays: Vec<_> = if relayed {
            memnodes
                .iter()
                .map(|m| crate::proxy::Relay::start(&m.addr))
                .collect()
        } else {
            Vec::new()
        };
        let addrs: Vec<_> = memnodes
            .iter()
            .enumerate()
            .map(|(i, m)| {
                let addr = relays.get(i).map_or(&*m.addr, |r| r.addr());
                (i as u16, addr.to_string())
            })
            .collect();
        let file = cluster_file(dir.path(), "127.0.0.1:0", replicas, &addrs)
            .to_str()
            .expect("a UTF-8 path")
            .to_string();
        let mut margs = vec!["master", "--listen", "127.0.0.1:0", "--cluster", &file];
        margs.extend_from_slice(master_extra);
        let master = Daemon::start(&margs, "serving on");
        assert!(
            master.ready_line.contains("formatted"),
            "the master did not format the cluster: {}",
            master.ready_line
        );
        ProcCluster {
            file,
            master,
            memnodes,
            dir,
            relays,
        }
    }
}

/// A free loopback address (the kernel's pick, released before the caller binds it).
pub fn free_addr() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    l.local_addr().expect("its address").to_string()
}

/// `GET path` over HTTP/1.0 with extra header lines: (status, headers, body); `None` when
/// nothing answers.
pub fn http_get(addr: &str, path: &str, headers: &str) -> Option<(u16, String, String)> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n{headers}\r\n").ok()?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).ok()?;
    let text = String::from_utf8_lossy(&buf).into_owned();
    let status = text.split_whitespace().nth(1)?.parse().ok()?;
    let (head, body) = text.split_once("\r\n\r\n")?;
    Some((status, head.to_string(), body.to_string()))
}

/// A child process killed (SIGKILL) when dropped, so a failing test leaves nothing running.
#[derive(Debug)]
pub struct Proc(Option<Child>);

impl Proc {
    pub fn new(child: Child) -> Proc {
        Proc(Some(child))
    }

    /// Waits for it to exit and collects its output.
    pub fn wait_with_output(mut self) -> std::process::Output {
        self.0
            .take()
            .expect("still running")
            .wait_with_output()
            .expect("wait for the child")
    }

    /// Its stderr as lines (it must have been spawned with stderr piped; once).
    pub fn stderr_lines(&mut self) -> mpsc::Receiver<String> {
        lines(self.0.as_mut().expect("still running"))
    }

    /// Its process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.0.as_ref().map(Child::id)
    }

    /// SIGKILL, and wait for it to be gone.
    pub fn kill(&mut self) {
        if let Some(c) = &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// FNV-1a 64, as `dmkit ycsb` hashes values in its ack log.
pub fn fnv1a_64(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// `dmkit ycsb --load` of `records` keys of `value_bytes` as client `id`, acknowledgements
/// appended to `log`; panics with its stderr if it fails.
pub fn ycsb_load(file: &str, id: u64, records: u64, value_bytes: u32, log: &Path) {
    let out = run_dmkit(
        &[
            "ycsb",
            "--cluster",
            file,
            "--client-id",
            &id.to_string(),
            "--records",
            &records.to_string(),
            "--value-bytes",
            &value_bytes.to_string(),
            "--load",
            "--seconds",
            "0",
            "--ack-log",
            log.to_str().expect("a UTF-8 path"),
        ],
        Duration::from_secs(60),
    );
    assert!(
        out.status.success(),
        "ycsb load: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A running `dmkit ycsb` client: YCSB-A on its `share` (`i/n`) of `records` keys for
/// `seconds`, every acknowledged write appended to `log`.
pub fn ycsb_a(
    file: &str,
    id: u64,
    share: &str,
    seconds: &str,
    records: u64,
    value_bytes: u32,
    log: &Path,
) -> Proc {
    ycsb_a_logged(file, id, share, seconds, records, value_bytes, log, None)
}

/// [`ycsb_a`], every read also appended to `reads` (`dmkit ycsb --read-log`).
#[allow(clippy::too_many_arguments)]
pub fn ycsb_a_logged(
    file: &str,
    id: u64,
    share: &str,
    seconds: &str,
    records: u64,
    value_bytes: u32,
    log: &Path,
    reads: Option<&Path>,
) -> Proc {
    let mut cmd = Command::new(dmkit_bin());
    cmd.arg("ycsb");
    if let Some(r) = reads {
        cmd.args(["--read-log", r.to_str().expect("a UTF-8 path")]);
    }
    Proc::new(
        cmd.args(["--cluster", file])
            .args(["--client-id", &id.to_string()])
            .args(["--workload", "a", "--seconds", seconds])
            .args(["--records", &records.to_string()])
            .args(["--value-bytes", &value_bytes.to_string()])
            .args(["--partition", share])
            .args(["--ack-log", log.to_str().expect("a UTF-8 path")])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn dmkit ycsb"),
    )
}

/// Reads a `dmkit ycsb` ack log into key → (tag, value hash) of its last acknowledged write;
/// appends each line's time (unix ms) to `times`. Returns the lines read.
pub fn read_ack_log(
    log: &Path,
    into: &mut std::collections::HashMap<String, (String, u64)>,
    times: &mut Vec<u64>,
) -> usize {
    let text = std::fs::read_to_string(log).expect("read the ack log");
    let mut n = 0;
    for line in text.lines() {
        let f: Vec<_> = line.split('\t').collect();
        assert!(f.len() >= 4, "bad ack log line {line:?}");
        into.insert(
            f[0].to_string(),
            (
                f[1].to_string(),
                u64::from_str_radix(f[2], 16).expect("a hex hash"),
            ),
        );
        times.push(f[3].parse().expect("unix milliseconds"));
        n += 1;
    }
    n
}
