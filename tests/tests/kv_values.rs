//! `dmkit kv` with values as bytes, against a FUSEE cluster of real processes: a value from
//! the argument, from `--value-file` or from stdin (any bytes, `\0` included), `get` writing
//! the raw bytes (no newline when stdout is not a terminal), empty keys, a 64 MiB value round
//! trip, and a value over the maximum refused before anything is written.

use std::io::Write;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use dmkit_tests::procs::{ProcCluster, dmkit_bin};

/// The largest value FUSEE takes (its `ClientConfig::max_value` default).
const MAX: usize = 64 << 20;

/// `dmkit kv --cluster FILE ARGS` with `stdin` fed to it (none: /dev/null), its stdout and
/// stderr read as it runs (a large value does not block on a full pipe).
fn kv(c: &ProcCluster, args: &[&str], stdin: Option<Vec<u8>>, timeout: Duration) -> Output {
    let mut child = Command::new(dmkit_bin())
        .args(["kv", "--cluster", &c.file])
        .args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn dmkit");
    let feeder = stdin.map(|data| {
        let mut pipe = child.stdin.take().expect("stdin");
        // (The child may stop reading early, e.g. at the maximum: a broken pipe is fine.)
        std::thread::spawn(move || {
            let _ = pipe.write_all(&data);
        })
    });
    let pid = child.id();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let watchdog = std::thread::spawn(move || {
        if done_rx.recv_timeout(timeout).is_err() {
            // The child this test spawned (still unreaped: the main thread waits on it).
            let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
            return true;
        }
        false
    });
    let out = child.wait_with_output().expect("output");
    let _ = done_tx.send(());
    assert!(
        !watchdog.join().unwrap(),
        "dmkit kv {args:?} did not finish in {timeout:?}"
    );
    if let Some(f) = feeder {
        let _ = f.join();
    }
    out
}

fn ok(out: &Output) {
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn usage_error(out: &Output) -> String {
    assert_eq!(
        out.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let err = String::from_utf8_lossy(&out.stderr).trim().to_string();
    assert_eq!(err.lines().count(), 1, "one line: {err}");
    err
}

const T: Duration = Duration::from_secs(60);

#[test]
fn values_are_bytes_from_the_argument_a_file_or_stdin() {
    let c = ProcCluster::start(3, 1, "32MiB");
    // From stdin: any bytes; `get` writes them back exactly, with no newline (a pipe).
    let bin = b"a\0b\r\n\xff\xfe end\n".to_vec();
    ok(&kv(&c, &["put", "bin"], Some(bin.clone()), T));
    let got = kv(&c, &["get", "bin"], None, T);
    ok(&got);
    assert_eq!(got.stdout, bin);
    // From a file.
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("value");
    std::fs::write(&f, b"\x00from a file\x00").unwrap();
    ok(&kv(
        &c,
        &["put", "file", "--value-file", f.to_str().unwrap()],
        None,
        T,
    ));
    assert_eq!(
        kv(&c, &["get", "file"], None, T).stdout,
        b"\x00from a file\x00"
    );
    // From the argument; an empty key, as in Redis; an empty value from an empty stdin.
    ok(&kv(&c, &["put", "arg", "plain value"], None, T));
    assert_eq!(kv(&c, &["get", "arg"], None, T).stdout, b"plain value");
    ok(&kv(&c, &["put", "", "empty key"], None, T));
    assert_eq!(kv(&c, &["get", ""], None, T).stdout, b"empty key");
    ok(&kv(&c, &["put", "nothing"], Some(Vec::new()), T));
    let got = kv(&c, &["get", "nothing"], None, T);
    ok(&got);
    assert!(got.stdout.is_empty());
    ok(&kv(&c, &["del", ""], None, T));
    assert_eq!(kv(&c, &["get", ""], None, T).status.code(), Some(1));

    // Bad input: both a VALUE and a file, or a file that cannot be read: exit 2, one line,
    // nothing written.
    let out = kv(
        &c,
        &["put", "arg", "x", "--value-file", f.to_str().unwrap()],
        None,
        T,
    );
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cannot be used with"), "{err}");
    let err = usage_error(&kv(
        &c,
        &["put", "arg", "--value-file", "/nonexistent/value"],
        None,
        T,
    ));
    assert!(
        err.contains("cannot read --value-file /nonexistent/value"),
        "{err}"
    );
    assert_eq!(kv(&c, &["get", "arg"], None, T).stdout, b"plain value");
}

#[test]
fn a_64_mib_value_round_trips_and_a_larger_one_is_refused_before_anything_is_written() {
    // One replica: 64 MiB of chunks (twice, while one value replaces another) fits.
    let c = ProcCluster::start(3, 1, "192MiB");
    let dir = tempfile::tempdir().unwrap();
    let big: Vec<u8> = (0..MAX).map(|i| (i * 7 + i / 4099) as u8).collect();
    let f = dir.path().join("big");
    std::fs::write(&f, &big).unwrap();
    let t = Instant::now();
    ok(&kv(
        &c,
        &["put", "big", "--value-file", f.to_str().unwrap()],
        None,
        Duration::from_secs(600),
    ));
    eprintln!("put of 64 MiB: {:?}", t.elapsed());
    let t = Instant::now();
    let got = kv(&c, &["get", "big"], None, Duration::from_secs(600));
    ok(&got);
    eprintln!("get of 64 MiB: {:?}", t.elapsed());
    assert!(got.stdout == big, "the 64 MiB value came back changed");

    // One byte more: refused before anything is connected or written, from a file or from
    // stdin; the key keeps its value.
    let over = dir.path().join("over");
    std::fs::File::create(&over)
        .unwrap()
        .set_len(MAX as u64 + 1)
        .unwrap();
    for (args, stdin) in [
        (
            vec!["put", "big", "--value-file", over.to_str().unwrap()],
            None,
        ),
        (vec!["put", "big"], Some(vec![1u8; MAX + 1])),
    ] {
        let err = usage_error(&kv(&c, &args, stdin, Duration::from_secs(120)));
        assert!(
            err.contains("larger than the maximum of 67108864 bytes (64 MiB): nothing was written"),
            "{err}"
        );
    }
    let got = kv(&c, &["get", "big"], None, Duration::from_secs(600));
    ok(&got);
    assert!(got.stdout == big, "a refused write changed the value");
    ok(&kv(&c, &["del", "big"], None, Duration::from_secs(600)));
}
