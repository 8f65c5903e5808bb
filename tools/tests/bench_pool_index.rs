//! `dmkit bench pool` and `dmkit bench index` in their smallest runs: the JSON reports carry
//! the ratios the benches exist for, as positive finite numbers, and every row measured
//! something; bad input is a one-line usage error (exit 2), never a panic.

use std::path::Path;
use std::process::{Command, Output};

use serde_json::Value;

fn dmkit(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_dmkit"))
        .args(args)
        .output()
        .expect("run dmkit")
}

/// Runs a bench that must succeed and returns its JSON report.
fn report(args: &[&str], json: &Path) -> Value {
    let mut all = args.to_vec();
    let json_arg = json.to_str().expect("utf-8 path");
    all.extend(["--json", json_arg]);
    let out = dmkit(&all);
    assert!(
        out.status.success(),
        "dmkit {all:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(&std::fs::read_to_string(json).expect("report written"))
        .expect("report is JSON")
}

fn positive(v: &Value, what: &str) -> f64 {
    let x = v
        .as_f64()
        .unwrap_or_else(|| panic!("{what} is not a number: {v}"));
    assert!(
        x.is_finite() && x > 0.0,
        "{what} = {x}, not a positive number"
    );
    x
}

fn row<'a>(r: &'a Value, name: &str) -> &'a Value {
    r["results"]
        .as_array()
        .expect("results")
        .iter()
        .find(|m| m["name"] == name)
        .unwrap_or_else(|| panic!("no row {name} in {r}"))
}

/// Every row measured a rate and a latency.
fn rows_measured(r: &Value) {
    let rows = r["results"].as_array().expect("results");
    assert!(!rows.is_empty(), "no results");
    for m in rows {
        let name = m["name"].as_str().unwrap_or("?");
        positive(&m["ops_per_sec"], &format!("{name}.ops_per_sec"));
        positive(&m["p50_us"], &format!("{name}.p50_us"));
    }
}

#[test]
fn bench_pool_reports_alloc_against_persist_and_malloc() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("pool.json");
    let r = report(
        &[
            "bench",
            "pool",
            "--quick",
            "--seconds",
            "0.15",
            "--dir",
            dir.path().to_str().unwrap(),
        ],
        &json,
    );
    assert_eq!(r["bench"], "pool");
    assert_eq!(r["config"]["medium"], "file");
    rows_measured(&r);
    for name in [
        "persist64",
        "alloc_free_64",
        "malloc_free_64",
        "alloc_free_4096",
    ] {
        row(&r, name);
    }
    assert_eq!(row(&r, "alloc_free_64")["persists_per_op"], 2);
    positive(
        &r["ratios"]["object_alloc_vs_persist"],
        "object_alloc_vs_persist",
    );
    positive(
        &r["ratios"]["object_alloc_vs_malloc"],
        "object_alloc_vs_malloc",
    );
    assert_eq!(
        r["config"]["targets"]["object_alloc_vs_persist"], ">= 0.4",
        "the target travels with the ratio"
    );
    // The pool's directory went with the run: only the report is left.
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left, vec![std::ffi::OsString::from("pool.json")]);
}

#[test]
fn bench_pool_on_dram_runs_too() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("pool.json");
    let r = report(
        &["bench", "pool", "--medium", "dram", "--seconds", "0.03"],
        &json,
    );
    assert_eq!(r["config"]["medium_kind"], "dram");
    assert_eq!(r["config"]["persistent"], false);
    positive(
        &r["ratios"]["object_alloc_vs_malloc"],
        "object_alloc_vs_malloc",
    );
}

fn index_report(backend: &str) -> Value {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("index.json");
    let r = report(
        &[
            "bench",
            "index",
            "--backend",
            backend,
            "--keys",
            "500",
            "--ops",
            "300",
            "--tasks",
            "1,2",
        ],
        &json,
    );
    assert_eq!(r["bench"], "index");
    assert_eq!(r["config"]["backend"], backend);
    rows_measured(&r);
    positive(
        &r["ratios"]["index_search_vs_dashmap"],
        "index_search_vs_dashmap",
    );
    for op in ["search", "update", "insert"] {
        positive(
            &r["ratios"][format!("index_{op}_2_vs_1_tasks")],
            &format!("index_{op}_2_vs_1_tasks"),
        );
        for t in [1, 2] {
            let m = row(&r, &format!("{op}_{t}_tasks"));
            positive(&m["rtts_per_op"], &format!("{op}_{t}_tasks.rtts_per_op"));
            assert_eq!(m["operations"], 300, "{op}_{t}_tasks ran its operations");
        }
    }
    row(&r, "dashmap_get");
    // The index's own round trips are its contract (3 replicas, a fresh directory, no
    // conflicting writer): SEARCH reads the buckets once, UPDATE adds a CAS of the backups
    // and one of the primary; the key reads come on top.
    assert_eq!(row(&r, "search_1_tasks")["index_rtts_per_op"], 1.0);
    assert_eq!(row(&r, "update_2_tasks")["index_rtts_per_op"], 3.0);
    assert_eq!(row(&r, "search_2_tasks")["verifier_rtts_per_op"], 1.0);
    r
}

#[test]
fn bench_index_on_sim_reports_throughput_rtts_and_the_dashmap_ratio() {
    index_report("sim");
}

#[test]
fn bench_index_on_tcp_reports_throughput_rtts_and_the_dashmap_ratio() {
    index_report("tcp");
}

/// A usage error: exit 2, one line on stderr that says `says`, no panic, nothing on stdout.
fn refused(args: &[&str], says: &str) {
    let out = dmkit(args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "dmkit {args:?}: {stderr}");
    assert!(
        stderr.contains(says),
        "dmkit {args:?} should say {says:?}: {stderr}"
    );
    assert!(
        !stderr.contains("panicked"),
        "dmkit {args:?} panicked: {stderr}"
    );
    assert_eq!(stderr.trim().lines().count(), 1, "one line: {stderr}");
    assert!(out.stdout.is_empty(), "dmkit {args:?} ran anyway");
}

#[test]
fn bad_input_is_a_usage_error_before_anything_runs() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no-such-dir/report.json");
    let missing = missing.to_str().unwrap();
    let a_dir = dir.path().to_str().unwrap();
    refused(&["bench", "pool", "--medium", "tape"], "tape");
    refused(
        &["bench", "index", "--backend", "carrier-pigeon"],
        "carrier-pigeon",
    );
    refused(&["bench", "index", "--backend", "rdma"], "sim or tcp");
    refused(&["bench", "pool", "--json", missing], "cannot write --json");
    refused(
        &["bench", "index", "--json", missing],
        "cannot write --json",
    );
    refused(&["bench", "index", "--json", a_dir], "is a directory");
    refused(
        &["bench", "pool", "--dir", &format!("{a_dir}/absent")],
        "cannot make a directory",
    );
    refused(
        &["bench", "pool", "--medium", "dram", "--dir", a_dir],
        "--medium file",
    );
    refused(&["bench", "pool", "--seconds", "0"], "--seconds");
    refused(&["bench", "index", "--tasks", "0"], "--tasks");
    refused(&["bench", "index", "--replicas", "9"], "--replicas");
    refused(&["bench", "index", "--ops", "3", "--tasks", "8"], "--ops");
    // The refused --json path was not left behind.
    assert!(!Path::new(missing).exists());
}
