//! The metrics endpoint of real processes — three `dmkit memnode --metrics` (one on a pool
//! file), a `dmkit master --metrics` and a `dmkit resp --metrics` gateway that served some
//! commands: `/metrics` only, the standard content type (OpenMetrics on request), `# HELP`
//! and `# TYPE` for every family, counters at 0 from the start, latency histograms, the
//! gauges an operator needs; and the Grafana dashboard's every series found in these scrapes.

use std::collections::{BTreeSet, HashMap};
use std::io::{BufRead, Write};
use std::time::{Duration, Instant};

use dmkit_tests::procs::{Daemon, ProcCluster, free_addr, http_get};

const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.trim().eq_ignore_ascii_case(name).then_some(v.trim())
    })
}

/// A scrape checked for format: every sample's family has `# TYPE` and a documented
/// `# HELP`, once each. Returns the body.
fn scrape(addr: &str) -> String {
    let (status, head, body) = http_get(addr, "/metrics", "").expect("a /metrics answer");
    assert_eq!(status, 200, "{head}");
    assert_eq!(
        header(&head, "content-type"),
        Some(PROMETHEUS_TEXT),
        "{head}"
    );
    let mut helps: HashMap<String, String> = HashMap::new();
    let mut types: HashMap<String, String> = HashMap::new();
    for l in body.lines() {
        if let Some(r) = l.strip_prefix("# HELP ") {
            let (n, h) = r.split_once(' ').unwrap_or((r, ""));
            assert!(
                helps.insert(n.into(), h.into()).is_none(),
                "two HELP for {n}"
            );
        } else if let Some(r) = l.strip_prefix("# TYPE ") {
            let (n, t) = r.split_once(' ').unwrap_or((r, ""));
            assert!(
                types.insert(n.into(), t.into()).is_none(),
                "two TYPE for {n}"
            );
        }
    }
    for (n, t) in &types {
        let h = helps
            .get(n)
            .unwrap_or_else(|| panic!("{addr}: no HELP for {n}"));
        assert!(
            !h.is_empty() && !h.contains("undocumented"),
            "{addr}: {n} has no description in tools/src/metrics_http.rs FAMILIES"
        );
        assert!(
            ["counter", "gauge", "histogram", "summary"].contains(&t.as_str()),
            "{n}: {t}"
        );
    }
    for l in body
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let name = l.split(['{', ' ']).next().unwrap();
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| {
                name.strip_suffix(s).filter(|f| {
                    types
                        .get(*f)
                        .is_some_and(|t| t == "histogram" || t == "summary")
                })
            })
            .unwrap_or(name);
        assert!(
            types.contains_key(family),
            "{addr}: sample {name} without # TYPE"
        );
    }
    body
}

/// The value of the sample `series` (name with its labels, as rendered) in `body`.
fn value(body: &str, series: &str) -> Option<f64> {
    body.lines()
        .find(|l| l.starts_with(series) && l[series.len()..].starts_with(' '))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

fn resp_commands(addr: &str, commands: &[&str]) -> Vec<String> {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut r = std::io::BufReader::new(s.try_clone().unwrap());
    let mut replies = Vec::new();
    for c in commands {
        s.write_all(format!("{c}\r\n").as_bytes()).unwrap();
        let mut line = String::new();
        r.read_line(&mut line).unwrap();
        if line.starts_with('$') && !line.starts_with("$-1") {
            let mut v = String::new();
            r.read_line(&mut v).unwrap();
            line.push_str(&v);
        }
        replies.push(line);
    }
    replies
}

#[test]
fn metrics_endpoints_answer_questions_and_the_dashboard_finds_its_series() {
    let m: Vec<String> = (0..3).map(|_| free_addr()).collect();
    let master_m = free_addr();
    let pool_dir = tempfile::tempdir().unwrap();
    let pool = pool_dir.path().join("node2.pool");
    let pool = pool.to_str().unwrap().to_string();
    let c = ProcCluster::start_full(
        3,
        3,
        "16MiB",
        |i| {
            let mut a = vec!["--metrics".to_string(), m[i as usize].clone()];
            if i == 2 {
                // Node 2 on a pool file (the others on DRAM).
                a = vec![
                    "--metrics".into(),
                    m[2].clone(),
                    "--pool".into(),
                    pool.clone(),
                    "--size".into(),
                    "16MiB".into(),
                ];
            }
            a
        },
        &["--metrics", &master_m],
    );
    // The master's counters exist, at 0, before anything happened.
    let body = scrape(&master_m);
    for s in ["dmkit_fusee_failovers_total", "dmkit_fusee_rejoins_total"] {
        assert_eq!(value(&body, s), Some(0.0), "{s} in {body}");
    }
    assert_eq!(value(&body, "dmkit_fusee_members"), Some(3.0), "{body}");
    assert_eq!(
        value(&body, "dmkit_fusee_cluster_nodes"),
        Some(3.0),
        "{body}"
    );
    assert!(
        value(&body, "dmkit_fusee_membership_epoch").is_some(),
        "{body}"
    );

    let gw_m = free_addr();
    let gw = Daemon::start(
        &[
            "resp",
            "--listen",
            "127.0.0.1:0",
            "--cluster",
            &c.file,
            "--metrics",
            &gw_m,
        ],
        "serving Redis clients on",
    );
    // Before any command: the client's failure counters at 0.
    let body = scrape(&gw_m);
    assert_eq!(
        value(&body, "dmkit_fusee_failover_retries_total"),
        Some(0.0),
        "{body}"
    );
    assert_eq!(value(&body, "dmkit_resp_errors_total"), Some(0.0), "{body}");
    let replies = resp_commands(
        &gw.addr(),
        &[
            "SET fruit apple",
            "GET fruit",
            "GET none",
            "DEL fruit",
            "PING",
        ],
    );
    assert_eq!(replies[0], "+OK\r\n");
    assert_eq!(replies[1], "$5\r\napple\r\n");

    // Only /metrics answers; other methods are refused.
    for addr in [&m[0], &master_m, &gw_m] {
        for p in ["/", "/metric", "/metrics/x", "/favicon.ico"] {
            let (status, _, _) = http_get(addr, p, "").unwrap();
            assert_eq!(status, 404, "{addr}{p}");
        }
        let mut s = std::net::TcpStream::connect(addr.as_str()).unwrap();
        s.write_all(b"POST /metrics HTTP/1.0\r\n\r\n").unwrap();
        let mut r = String::new();
        std::io::BufReader::new(s).read_line(&mut r).unwrap();
        assert!(r.contains(" 405 "), "{r}");
        // OpenMetrics on request.
        let (status, head, body) = http_get(
            addr,
            "/metrics",
            "Accept: application/openmetrics-text; version=1.0.0\r\n",
        )
        .unwrap();
        assert_eq!(status, 200);
        assert!(
            header(&head, "content-type")
                .unwrap()
                .starts_with("application/openmetrics-text; version=1.0.0"),
            "{head}"
        );
        assert!(body.ends_with("# EOF\n"), "{body}");
    }

    // Latency histograms per operation (with buckets), on the client and the memory nodes.
    let deadline = Instant::now() + Duration::from_secs(10);
    let gw_body = loop {
        let b = scrape(&gw_m);
        if b.contains("dmkit_fusee_op_seconds_bucket{op=\"search\"") || Instant::now() > deadline {
            break b;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    for op in ["search", "insert", "delete"] {
        assert!(
            gw_body.contains(&format!(
                "dmkit_fusee_op_seconds_bucket{{op=\"{op}\",le=\"0.001\"}}"
            )),
            "no {op} histogram: {gw_body}"
        );
    }
    // The gateway's own: command latency by command, and its connected clients (the
    // command connection has closed).
    for cmd in ["get", "set", "del"] {
        assert!(
            gw_body.contains(&format!(
                "dmkit_resp_command_seconds_bucket{{command=\"{cmd}\",le=\"0.001\"}}"
            )),
            "no {cmd} latency histogram: {gw_body}"
        );
    }
    assert!(
        value(&gw_body, "dmkit_resp_connected_clients").is_some(),
        "{gw_body}"
    );
    let mut bodies = vec![gw_body, scrape(&master_m)];
    for (i, addr) in m.iter().enumerate() {
        let b = scrape(addr);
        assert!(
            b.contains("dmkit_memnode_rpc_seconds_bucket{kind=\""),
            "{b}"
        );
        let medium = if i == 2 { "pool" } else { "dram" };
        for state in ["used", "free"] {
            let s = format!(
                "dmkit_memnode_memory_bytes{{node=\"{i}\",medium=\"{medium}\",state=\"{state}\"}}"
            );
            assert!(value(&b, &s).is_some(), "{s} missing: {b}");
        }
        assert_eq!(
            value(&b, &format!("dmkit_memnode_up{{node=\"{i}\"}}")),
            Some(1.0)
        );
        // A DRAM node exports no pool-file series; the pool node does.
        assert_eq!(b.contains("dmkit_pmem_pool_"), i == 2, "node {i}: {b}");
        bodies.push(b);
    }

    // The dashboard: every series it queries is in these scrapes.
    let dash =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/grafana-dashboard.json");
    let dash = std::fs::read_to_string(&dash).unwrap();
    let json: serde_json::Value = serde_json::from_str(&dash).expect("the dashboard is JSON");
    let mut exprs = Vec::new();
    collect_exprs(&json, &mut exprs);
    assert!(exprs.len() >= 10, "{exprs:?}");
    let mut series = BTreeSet::new();
    for e in &exprs {
        series.extend(metric_names(e));
    }
    let all = bodies.join("\n");
    let missing: Vec<_> = series
        .iter()
        .filter(|s| s.as_str() != "up")
        .filter(|s| {
            !all.lines()
                .any(|l| l.starts_with(s.as_str()) && l[s.len()..].starts_with(['{', ' ']))
        })
        .collect();
    assert!(
        missing.is_empty(),
        "dashboard series not in any scrape: {missing:?}"
    );
    drop(gw);
}

fn collect_exprs(v: &serde_json::Value, out: &mut Vec<String>) {
    match v {
        serde_json::Value::Object(m) => {
            for (k, v) in m {
                match (k.as_str(), v) {
                    ("expr", serde_json::Value::String(s)) => out.push(s.clone()),
                    _ => collect_exprs(v, out),
                }
            }
        }
        serde_json::Value::Array(a) => a.iter().for_each(|v| collect_exprs(v, out)),
        _ => {}
    }
}

/// The metric names a PromQL expression selects (`dmkit_*` and `up`).
pub fn metric_names(expr: &str) -> Vec<String> {
    let mut names = Vec::new();
    let b = expr.as_bytes();
    let mut i = 0;
    while i < b.len() {
        let word = b[i].is_ascii_alphanumeric() || b[i] == b'_';
        let start_ok = i == 0 || !(b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_');
        if word && start_ok {
            let mut j = i;
            while j < b.len() && (b[j].is_ascii_alphanumeric() || b[j] == b'_') {
                j += 1;
            }
            let w = &expr[i..j];
            if w.starts_with("dmkit_") || w == "up" {
                names.push(w.to_string());
            }
            i = j;
        } else {
            i += 1;
        }
    }
    names
}
