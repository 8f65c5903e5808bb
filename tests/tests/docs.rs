//! The operator docs' own commands, run: every ```sh block of docs/OPERATOR.md preceded by
//! `<!-- tested -->` is executed line by line, the blocks in order in one fresh directory (the
//! daemons of a block still running in the next), with `dmkit` the binary of this build and
//! every `127.0.0.1:PORT` mapped to a free port (the same one everywhere in the file). And every flag of every
//! operator subcommand's `--help` is in docs/REFERENCE.md. So the docs cannot rot.
//!
//! What a tested line may be (docs/TESTING.md has the same list):
//! - `COMMAND` — run with bash; must exit 0. A trailing `# exit N` expects status N,
//!   `# prints: TEXT` expects stdout TEXT (a line), `# says: TEXT` expects TEXT in stderr,
//!   `# eventually prints: TEXT` retries for up to 30 s;
//! - `COMMAND &` — a daemon: started, and ready once its stderr says `serving` (or
//!   `standby`); `kill %N` / `kill -9 %N` signal the N-th daemon, `wait %N` waits for it;
//! - `cat > FILE <<'EOF'` ... `EOF` — writes FILE; a line ending in `\` continues.

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use dmkit_tests::procs::{dmkit_bin, free_addr};

fn docs() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs")
}

/// The tested blocks of a markdown file: (first line number, lines).
fn tested_blocks(md: &str) -> Vec<(usize, Vec<String>)> {
    let mut out = Vec::new();
    let mut lines = md.lines().enumerate().peekable();
    while let Some((_, l)) = lines.next() {
        if l.trim() != "<!-- tested -->" {
            continue;
        }
        let Some((_, fence)) = lines.next() else {
            break;
        };
        assert_eq!(
            fence.trim(),
            "```sh",
            "<!-- tested --> must precede a ```sh block"
        );
        let mut block = Vec::new();
        let mut first = 0;
        for (n, l) in lines.by_ref() {
            if first == 0 {
                first = n + 1;
            }
            if l.trim() == "```" {
                break;
            }
            block.push(l.to_string());
        }
        out.push((first, block));
    }
    out
}

struct Daemon {
    child: Child,
    cmd: String,
    stderr: mpsc::Receiver<String>,
}

struct Runner {
    dir: tempfile::TempDir,
    bin_dir: PathBuf,
    ports: HashMap<String, String>,
    daemons: Vec<Daemon>,
}

impl Drop for Runner {
    fn drop(&mut self) {
        for d in &mut self.daemons {
            let _ = d.child.kill();
            let _ = d.child.wait();
        }
    }
}

impl Runner {
    fn new() -> Runner {
        let bin = dmkit_bin();
        Runner {
            dir: tempfile::tempdir().unwrap(),
            bin_dir: bin.parent().unwrap().to_path_buf(),
            ports: HashMap::new(),
            daemons: Vec::new(),
        }
    }

    /// The line with every `127.0.0.1:PORT` (PORT ≠ 0) mapped to a free port of its own.
    fn map_ports(&mut self, line: &str) -> String {
        let mut out = String::new();
        let mut rest = line;
        while let Some(i) = rest.find("127.0.0.1:") {
            out.push_str(&rest[..i]);
            let after = &rest[i + "127.0.0.1:".len()..];
            let end = after
                .find(|c: char| !c.is_ascii_digit())
                .unwrap_or(after.len());
            let port = &after[..end];
            if port.is_empty() || port == "0" {
                out.push_str(&rest[i..i + "127.0.0.1:".len() + end]);
            } else {
                let mapped = self
                    .ports
                    .entry(port.to_string())
                    .or_insert_with(free_addr)
                    .clone();
                out.push_str(&mapped);
            }
            rest = &after[end..];
        }
        out.push_str(rest);
        out
    }

    fn bash(&self, script: &str) -> Command {
        let mut c = Command::new("bash");
        let path = format!(
            "{}:{}",
            self.bin_dir.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        c.arg("-c")
            .arg(script)
            .current_dir(self.dir.path())
            .env("PATH", path)
            .env_remove("DMKIT_SECRET")
            .env_remove("DMKIT_SECRET_FILE")
            .env_remove("DMKIT_LOG")
            .stdin(Stdio::null());
        c
    }

    fn run_block(&mut self, file: &str, first: usize, block: &[String]) {
        let mut i = 0;
        while i < block.len() {
            let at = format!("{file}:{}", first + i);
            let mut line = block[i].clone();
            i += 1;
            while line.trim_end().ends_with('\\') && i < block.len() {
                line = format!(
                    "{} {}",
                    line.trim_end().trim_end_matches('\\'),
                    block[i].trim()
                );
                i += 1;
            }
            let line = line.trim().to_string();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            if let Some(rest) = line.strip_prefix("cat > ") {
                let (file_name, _) = rest.split_once(" <<").expect("cat > FILE <<'EOF'");
                let mut text = String::new();
                while i < block.len() && block[i].trim() != "EOF" {
                    text.push_str(&self.map_ports(&block[i]));
                    text.push('\n');
                    i += 1;
                }
                i += 1;
                std::fs::write(self.dir.path().join(file_name.trim()), text).unwrap();
                continue;
            }
            let (cmd, expect) = match line.split_once(" # ") {
                Some((c, e)) => (c.trim().to_string(), e.trim().to_string()),
                None => (line.clone(), String::new()),
            };
            let cmd = self.map_ports(&cmd);
            let expect = self.map_ports(&expect);
            if let Some(job) = job_signal(&cmd) {
                let (sig, n) = job;
                let d = self
                    .daemons
                    .get_mut(n - 1)
                    .unwrap_or_else(|| panic!("{at}: no daemon %{n}"));
                let pid = d.child.id().to_string();
                if sig == "wait" {
                    let t = Instant::now();
                    loop {
                        if d.child.try_wait().unwrap().is_some() {
                            break;
                        }
                        assert!(
                            t.elapsed() < Duration::from_secs(30),
                            "{at}: %{n} still runs"
                        );
                        std::thread::sleep(Duration::from_millis(50));
                    }
                } else {
                    let st = Command::new("kill").args([sig, &pid]).status().unwrap();
                    assert!(st.success(), "{at}: kill failed");
                    let _ = d.child.wait();
                }
                continue;
            }
            if let Some(daemon) = cmd.strip_suffix('&') {
                self.start_daemon(&at, daemon.trim());
                continue;
            }
            self.run_line(&at, &cmd, &expect);
        }
    }

    fn start_daemon(&mut self, at: &str, cmd: &str) {
        let mut child = self
            .bash(&format!("exec {cmd}"))
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for l in BufReader::new(stderr).lines() {
                let Ok(l) = l else { return };
                if tx.send(l).is_err() {
                    return;
                }
            }
        });
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut seen = Vec::new();
        loop {
            match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                Ok(l) if l.contains("serving") || l.contains("standby") => break,
                Ok(l) => seen.push(l),
                Err(_) => {
                    let _ = child.kill();
                    panic!("{at}: `{cmd}` did not get ready: {seen:?}");
                }
            }
        }
        self.daemons.push(Daemon {
            child,
            cmd: cmd.to_string(),
            stderr: rx,
        });
    }

    fn run_line(&mut self, at: &str, cmd: &str, expect: &str) {
        let (eventually, expect) = match expect.strip_prefix("eventually ") {
            Some(e) => (true, e),
            None => (false, expect),
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let child = self
                .bash(cmd)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap();
            let out = wait_bounded(child, Duration::from_secs(60))
                .unwrap_or_else(|| panic!("{at}: `{cmd}` did not finish in 60 s"));
            let code = out.status.code().unwrap_or(-1);
            let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
            let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
            let failure = if let Some(n) = expect.strip_prefix("exit ") {
                let n: i32 = n.split_whitespace().next().unwrap().parse().unwrap();
                (code != n).then(|| format!("exit {code}, expected {n}"))
            } else if let Some(t) = expect.strip_prefix("prints: ") {
                (code != 0 || stdout.trim_end() != t)
                    .then(|| format!("exit {code}, printed {stdout:?}, expected {t:?}"))
            } else if let Some(t) = expect.strip_prefix("says: ") {
                (!stderr.contains(t)).then(|| format!("stderr lacks {t:?}"))
            } else {
                (code != 0).then(|| format!("exit {code}"))
            };
            match failure {
                None => return,
                Some(_) if eventually && Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(500));
                }
                Some(f) => {
                    let daemons: Vec<String> = self
                        .daemons
                        .iter()
                        .map(|d| {
                            let logs: Vec<String> = d.stderr.try_iter().collect();
                            format!("{}: {logs:?}", d.cmd)
                        })
                        .collect();
                    panic!("{at}: `{cmd}`: {f}\nstderr: {stderr}\ndaemons: {daemons:#?}");
                }
            }
        }
    }
}

/// The output of `child`, or `None` (it is killed) if it runs longer than `limit`.
fn wait_bounded(mut child: Child, limit: Duration) -> Option<std::process::Output> {
    let t = Instant::now();
    loop {
        if child.try_wait().ok()?.is_some() {
            return child.wait_with_output().ok();
        }
        if t.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `kill %N`, `kill -9 %N`, `wait %N`: (the signal flag or "wait", N).
fn job_signal(cmd: &str) -> Option<(&str, usize)> {
    let w: Vec<&str> = cmd.split_whitespace().collect();
    let (sig, job) = match w.as_slice() {
        ["kill", job] => ("-TERM", *job),
        ["kill", "-9", job] => ("-KILL", *job),
        ["kill", "-STOP", job] => ("-STOP", *job),
        ["kill", "-CONT", job] => ("-CONT", *job),
        ["wait", job] => ("wait", *job),
        _ => return None,
    };
    Some((sig, job.strip_prefix('%')?.parse().ok()?))
}

#[test]
fn the_operator_guide_runs_as_written() {
    let name = "OPERATOR.md";
    let md = std::fs::read_to_string(docs().join(name)).unwrap();
    let blocks = tested_blocks(&md);
    assert!(
        blocks.len() >= 5,
        "{name} has {} tested blocks",
        blocks.len()
    );
    // One walkthrough: the blocks in order, in one directory, the processes of a block
    // still running in the next (as for a reader following the guide).
    let mut r = Runner::new();
    for (first, block) in &blocks {
        r.run_block(name, *first, block);
    }
}

#[test]
fn the_reference_names_every_flag_of_every_operator_command() {
    let reference = std::fs::read_to_string(docs().join("REFERENCE.md")).unwrap();
    let mut missing = Vec::new();
    for sub in [
        "memnode",
        "master",
        "kv",
        "resp",
        "ycsb",
        "gengar-server",
        "gengar",
        "demo",
    ] {
        assert!(
            reference.contains(&format!("dmkit {sub}")),
            "no section for dmkit {sub}"
        );
        let out = Command::new(dmkit_bin())
            .args([sub, "--help"])
            .output()
            .unwrap();
        let help = String::from_utf8_lossy(&out.stdout);
        for flag in help
            .split_whitespace()
            .filter(|w| w.starts_with("--") && w.len() > 2)
            .map(|w| w.trim_end_matches([',', '.', ')', ';']))
        {
            if ["--help", "--version"].contains(&flag) {
                continue;
            }
            if !reference.contains(&format!("`{flag}")) {
                missing.push(format!("dmkit {sub} {flag}"));
            }
        }
    }
    missing.sort();
    missing.dedup();
    assert!(missing.is_empty(), "not in docs/REFERENCE.md: {missing:?}");
}
