//! Serving the process's metrics at `http://ADDR/metrics`: the Prometheus text format
//! (`text/plain; version=0.0.4`), or OpenMetrics 1.0 when the scraper asks for it in
//! `Accept`. Every family has `# HELP` and `# TYPE`; latencies are histograms with buckets
//! from 50 µs to 10 s; the counters an alert watches exist at 0 from the start. Only
//! `/metrics` answers (404 elsewhere, 405 for methods other than GET and HEAD). The listener
//! is a task on a one-thread tokio runtime of its own.

use std::net::SocketAddr;

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

/// Latency buckets (seconds) of every histogram: verbs on loopback take tens of µs, a
/// FUSEE operation a few hundred, a failover one or two seconds.
pub const LATENCY_BUCKETS: [f64; 17] = [
    0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0,
];

/// Buckets (seconds) of the gaps between a memory node's lease renewals: heartbeats come
/// every 100 ms by default and the lease is 500 ms, so the buckets are fine where the
/// margin is decided (`dmkit bench soak` reads its quantiles from them).
pub const RENEWAL_GAP_BUCKETS: [f64; 16] = [
    0.025, 0.05, 0.075, 0.1, 0.11, 0.125, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.75, 1.0, 2.0, 5.0,
];

/// The content type of the Prometheus text format.
pub const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";
/// The content type of OpenMetrics text.
pub const OPENMETRICS_TEXT: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// What each family measures (`# HELP`); every metric dmkit records is here, and a test
/// checks the scrapes of real processes against it.
pub const FAMILIES: &[(&str, &str)] = &[
    // verbs
    (
        "dmkit_verbs_round_trips_total",
        "Round trips (doorbell batches awaited) by operation tag.",
    ),
    (
        "dmkit_verbs_verbs_total",
        "One-sided verbs and RPCs posted, by operation tag and verb.",
    ),
    (
        "dmkit_verbs_bytes_total",
        "Payload bytes moved by verbs, by operation tag and direction.",
    ),
    (
        "dmkit_verbs_registered_bytes",
        "Bytes of memory registered for remote access, by node.",
    ),
    (
        "dmkit_memnode_verbs_served_total",
        "Verbs a memory node executed for its tcp clients, by op (read, write, cas, faa, rpc).",
    ),
    // memory node
    (
        "dmkit_memnode_memory_bytes",
        "A memory node's served memory in bytes, by node, medium (dram or pool) and state (used or free).",
    ),
    (
        "dmkit_memnode_rpc_seconds",
        "Time a memory node took to handle a FUSEE block/membership RPC, by kind.",
    ),
    (
        "dmkit_memnode_up",
        "1 while the memory node serves (its start time is the series' start).",
    ),
    (
        "dmkit_memnode_fences_total",
        "Times the memory node was fenced, by cause (lease: it heard neither the master nor a majority in time; not_member: a membership without it; master: the master fenced the cluster for a change).",
    ),
    (
        "dmkit_memnode_lease_renewal_gap_seconds",
        "Time between consecutive renewals of the memory node's lease, by who renewed it (master: a heartbeat; peers: a majority vouching).",
    ),
    // pmem pool
    (
        "dmkit_pmem_pool_allocated_blocks",
        "Blocks allocated in a pool file, by pool uuid.",
    ),
    (
        "dmkit_pmem_pool_free_bytes",
        "Free bytes of a pool file's data area, by pool uuid.",
    ),
    (
        "dmkit_pmem_pool_live_objects",
        "Live objects in a pool file, by pool uuid.",
    ),
    (
        "dmkit_pmem_pool_object_allocs_total",
        "Objects allocated in a pool file, by pool uuid.",
    ),
    (
        "dmkit_pmem_pool_object_frees_total",
        "Objects freed in a pool file, by pool uuid.",
    ),
    (
        "dmkit_pmem_pool_recovered_log_entries_total",
        "Redo-log entries replayed when a pool file was opened after a crash.",
    ),
    // fusee
    (
        "dmkit_fusee_membership_epoch",
        "The membership epoch the master last published.",
    ),
    (
        "dmkit_fusee_members",
        "Memory nodes in the current membership (serving).",
    ),
    (
        "dmkit_fusee_cluster_nodes",
        "Memory nodes the cluster was formatted with.",
    ),
    (
        "dmkit_fusee_failovers_total",
        "Memory nodes the master failed over.",
    ),
    (
        "dmkit_fusee_rejoins_total",
        "Memory nodes the master refilled and readmitted.",
    ),
    (
        "dmkit_fusee_master_step_downs_total",
        "Times this master stopped acting because it could not renew its claim in time (it then competes for the claim again).",
    ),
    (
        "dmkit_fusee_resyncs_total",
        "Fences and repairs of the members the master ran because a client asked (a round or a verb nobody could finish in its epoch).",
    ),
    (
        "dmkit_fusee_resync_requests_total",
        "Times this client asked the master for a resync (a SNAPSHOT round it waited on past resync_after, or no newer membership after a failure).",
    ),
    (
        "dmkit_fusee_master_claim_renewals_total",
        "Renewals of the master's claim on the cluster, by result (granted: by a majority; short: not).",
    ),
    (
        "dmkit_fusee_failover_retries_total",
        "Client operations retried after a memory node failure cut them short.",
    ),
    (
        "dmkit_fusee_blocks_acquired_total",
        "Memory blocks clients acquired from memory nodes.",
    ),
    (
        "dmkit_fusee_reclaimed_objects_total",
        "Objects clients reclaimed (freed) in the background.",
    ),
    (
        "dmkit_fusee_cleanup_waits_total",
        "Writes that waited for their client's background cleanups to catch up (back-pressure).",
    ),
    (
        "dmkit_fusee_recovery_seconds",
        "Time a client took to recover at start.",
    ),
    (
        "dmkit_fusee_op_seconds",
        "Latency of FUSEE client operations, by op.",
    ),
    (
        "dmkit_fusee_op_errors_total",
        "FUSEE client operations that failed, by op.",
    ),
    // kv-index
    ("dmkit_kv_index_subtables", "Subtables of the RACE index."),
    (
        "dmkit_kv_index_directory_refreshes_total",
        "Index directory re-reads after a split.",
    ),
    (
        "dmkit_kv_index_stale_candidates_total",
        "Index candidates found stale on read.",
    ),
    (
        "dmkit_kv_index_moved_candidates_total",
        "Index candidates found moved by a split.",
    ),
    (
        "dmkit_kv_index_retries_total",
        "Index operations retried, by op.",
    ),
    (
        "dmkit_kv_index_duplicates_resolved_total",
        "Duplicate index entries resolved.",
    ),
    (
        "dmkit_kv_index_split_takeovers_total",
        "Splits taken over from a stalled client.",
    ),
    (
        "dmkit_kv_index_split_resumes_total",
        "Splits resumed by the client that started them.",
    ),
    ("dmkit_kv_index_splits_total", "Index subtable splits."),
    (
        "dmkit_kv_index_split_dropped_entries_total",
        "Entries dropped (stale) during splits.",
    ),
    (
        "dmkit_kv_index_split_duration_seconds",
        "Duration of index subtable splits.",
    ),
    (
        "dmkit_kv_index_snapshot_rounds_total",
        "SNAPSHOT replication rounds, by outcome and deciding rule.",
    ),
    (
        "dmkit_kv_index_snapshot_abandoned_total",
        "SNAPSHOT rounds abandoned.",
    ),
    (
        "dmkit_kv_index_snapshot_stuck_total",
        "SNAPSHOT rounds a losing writer waited on past its stuck bound (FUSEE then asks for a resync).",
    ),
    (
        "dmkit_kv_index_forced_repairs_total",
        "Index replicas forced to the decided value.",
    ),
    // lease
    ("dmkit_lease_grants_total", "Leases granted."),
    ("dmkit_lease_renewals_total", "Leases renewed."),
    ("dmkit_lease_releases_total", "Leases released."),
    ("dmkit_lease_refused_total", "Lease requests refused."),
    ("dmkit_lease_pruned_total", "Expired leases pruned."),
    (
        "dmkit_lease_expiry_wait_seconds",
        "Time spent waiting for leases to expire.",
    ),
    (
        "dmkit_lease_tuner_steps_total",
        "Adaptive lease-duration adjustments.",
    ),
    // cache
    (
        "dmkit_cache_accesses_total",
        "Object accesses counted for hot-object selection.",
    ),
    (
        "dmkit_cache_promotions_total",
        "Objects admitted to the DRAM cache.",
    ),
    (
        "dmkit_cache_evictions_total",
        "Objects evicted from the DRAM cache.",
    ),
    (
        "dmkit_cache_selected_bytes",
        "Bytes of the hot set selected for DRAM.",
    ),
    (
        "dmkit_cache_address_hits_total",
        "Client address-cache hits.",
    ),
    (
        "dmkit_cache_address_misses_total",
        "Client address-cache misses.",
    ),
    (
        "dmkit_cache_address_stale_total",
        "Client address-cache entries found stale.",
    ),
    (
        "dmkit_cache_address_evictions_total",
        "Client address-cache evictions.",
    ),
    (
        "dmkit_cache_address_bypassed_total",
        "Lookups that bypassed the client address cache.",
    ),
    // gengar
    (
        "dmkit_gengar_allocs_total",
        "Gengar objects allocated by clients.",
    ),
    (
        "dmkit_gengar_stale_reads_total",
        "Gengar reads retried after a stale address.",
    ),
    (
        "dmkit_gengar_promotions_total",
        "Gengar objects promoted to the DRAM buffer.",
    ),
    (
        "dmkit_gengar_evictions_total",
        "Gengar objects evicted from the DRAM buffer.",
    ),
    (
        "dmkit_gengar_promotions_skipped_total",
        "Gengar promotions planned but not carried out (object freed, or no DRAM slot).",
    ),
    // resp gateway
    (
        "dmkit_resp_commands_total",
        "Redis commands the gateway served, by command.",
    ),
    (
        "dmkit_resp_errors_total",
        "Redis commands the gateway answered with an error.",
    ),
    (
        "dmkit_resp_command_seconds",
        "Latency of the gateway's Redis commands, by command.",
    ),
    (
        "dmkit_resp_connected_clients",
        "Redis clients connected to the gateway.",
    ),
    (
        "dmkit_verbs_staging_bytes",
        "Staging bytes held by proxied writes not yet confirmed, over the process's endpoints.",
    ),
];

/// What a process serving metrics is (which counters it exports at 0 from the start).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Memnode,
    Master,
    /// A FUSEE client process (the gateway, ycsb).
    Client,
    Other,
}

impl Role {
    /// From the subcommand this process runs.
    fn of_this_process() -> Role {
        match std::env::args().nth(1).as_deref() {
            Some("memnode") => Role::Memnode,
            Some("master") => Role::Master,
            Some("resp" | "ycsb" | "kv") => Role::Client,
            _ => Role::Other,
        }
    }
}

/// Installs the global metrics recorder and serves it on `addr` (for the role of this
/// process's subcommand). Fails if the address cannot be bound or a recorder is installed
/// already.
pub fn serve(addr: &str) -> Result<SocketAddr, String> {
    serve_as(addr, Role::of_this_process())
}

/// [`serve`] for `role`.
pub fn serve_as(addr: &str, role: Role) -> Result<SocketAddr, String> {
    let sa: SocketAddr = addr.parse().map_err(|_| {
        format!("invalid metrics address '{addr}': expected host:port such as 127.0.0.1:9100")
    })?;
    // Bind first so a busy port is a clear error here, not a log line from a background task.
    let listener = std::net::TcpListener::bind(sa)
        .map_err(|e| format!("cannot serve metrics on {sa}: {e}"))?;
    let at = listener
        .local_addr()
        .map_err(|e| format!("cannot serve metrics on {sa}: {e}"))?;
    listener
        .set_nonblocking(true)
        .map_err(|e| format!("cannot serve metrics on {sa}: {e}"))?;
    let handle = PrometheusBuilder::new()
        .set_buckets(&LATENCY_BUCKETS)
        .map_err(|e| format!("cannot set up metrics: {e}"))?
        .set_buckets_for_metric(
            metrics_exporter_prometheus::Matcher::Full(
                "dmkit_memnode_lease_renewal_gap_seconds".into(),
            ),
            &RENEWAL_GAP_BUCKETS,
        )
        .map_err(|e| format!("cannot set up metrics: {e}"))?
        .install_recorder()
        .map_err(|e| format!("cannot serve metrics on {sa}: {e}"))?;
    describe_all();
    zero_counters(role);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .build()
        .map_err(|e| format!("cannot start the metrics listener: {e}"))?;
    std::thread::Builder::new()
        .name("metrics-http".into())
        .spawn(move || {
            rt.block_on(async move {
                let listener = match tokio::net::TcpListener::from_std(listener) {
                    Ok(l) => l,
                    Err(e) => {
                        tracing::error!(error = %e, "the metrics listener cannot run");
                        return;
                    }
                };
                let h = handle.clone();
                tokio::spawn(async move {
                    loop {
                        tokio::time::sleep(std::time::Duration::from_secs(5)).await;
                        h.run_upkeep();
                    }
                });
                loop {
                    match listener.accept().await {
                        Ok((s, _)) => {
                            let h = handle.clone();
                            tokio::spawn(async move {
                                let _ = tokio::time::timeout(
                                    std::time::Duration::from_secs(10),
                                    answer(s, &h),
                                )
                                .await;
                            });
                        }
                        Err(e) => {
                            tracing::debug!(error = %e, "metrics accept failed");
                            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                        }
                    }
                }
            })
        })
        .map_err(|e| format!("cannot start the metrics listener: {e}"))?;
    Ok(at)
}

fn describe_all() {
    for (name, help) in FAMILIES {
        let (name, help) = (*name, *help);
        // The kind is the exporter's business (it writes # TYPE from how the metric is
        // recorded); the description is shared by all kinds.
        if name.ends_with("_total") {
            metrics::describe_counter!(name, help);
        } else if name.ends_with("_seconds") {
            metrics::describe_histogram!(name, metrics::Unit::Seconds, help);
        } else {
            metrics::describe_gauge!(name, help);
        }
    }
}

/// Counters that alerts take `increase()` of exist from the start, at 0, so the first event
/// is an increase.
fn zero_counters(role: Role) {
    let zero = |name: &'static str| metrics::counter!(name).absolute(0);
    match role {
        Role::Master => {
            zero("dmkit_fusee_failovers_total");
            zero("dmkit_fusee_rejoins_total");
            zero("dmkit_fusee_master_step_downs_total");
            zero("dmkit_fusee_resyncs_total");
            for r in ["granted", "short"] {
                metrics::counter!("dmkit_fusee_master_claim_renewals_total", "result" => r)
                    .absolute(0);
            }
        }
        Role::Client => {
            zero("dmkit_fusee_failover_retries_total");
            zero("dmkit_resp_errors_total");
            for op in ["search", "insert", "update", "delete"] {
                metrics::counter!("dmkit_fusee_op_errors_total", "op" => op).absolute(0);
            }
        }
        // A memnode's pool counters (file pools only) are registered at 0 when it opens.
        Role::Memnode => {
            for cause in ["lease", "not_member", "master"] {
                metrics::counter!("dmkit_memnode_fences_total", "cause" => cause).absolute(0);
            }
        }
        Role::Other => {}
    }
}

/// Answers one HTTP/1.x request on `s` and closes it.
async fn answer(mut s: tokio::net::TcpStream, h: &PrometheusHandle) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") && !buf.windows(2).any(|w| w == b"\n\n") {
        match s.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
        if buf.len() > 16 << 10 {
            let _ = s
                .write_all(&reply(431, "text/plain", b"request head too large\n", true))
                .await;
            return;
        }
    }
    let head = String::from_utf8_lossy(&buf);
    let (status, ctype, body, with_body) = respond(&head, || h.render());
    let _ = s.write_all(&reply(status, ctype, &body, with_body)).await;
    let _ = s.shutdown().await;
}

/// The response to a request head: (status, content type, body, whether to send the body).
pub fn respond(head: &str, render: impl FnOnce() -> String) -> (u16, &'static str, Vec<u8>, bool) {
    let mut lines = head.lines();
    let first = lines.next().unwrap_or_default();
    let mut parts = first.split_whitespace();
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = target.split('?').next().unwrap_or("");
    let not_found = b"not found: metrics are at /metrics\n".to_vec();
    if path != "/metrics" {
        return (
            404,
            "text/plain; charset=utf-8",
            not_found,
            method != "HEAD",
        );
    }
    if method != "GET" && method != "HEAD" {
        return (
            405,
            "text/plain; charset=utf-8",
            b"use GET\n".to_vec(),
            true,
        );
    }
    let accept = lines
        .filter_map(|l| l.split_once(':'))
        .find(|(k, _)| k.trim().eq_ignore_ascii_case("accept"))
        .map(|(_, v)| v.to_ascii_lowercase())
        .unwrap_or_default();
    let text = with_help(&render());
    if accept.contains("application/openmetrics-text") {
        (
            200,
            OPENMETRICS_TEXT,
            to_openmetrics(&text).into_bytes(),
            method == "GET",
        )
    } else {
        (200, PROMETHEUS_TEXT, text.into_bytes(), method == "GET")
    }
}

fn reply(status: u16, ctype: &str, body: &[u8], with_body: bool) -> Vec<u8> {
    let reason = match status {
        200 => "OK",
        404 => "Not Found",
        405 => "Method Not Allowed",
        431 => "Request Header Fields Too Large",
        _ => "Error",
    };
    let mut out = format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    if with_body {
        out.extend_from_slice(body);
    }
    out
}

/// Adds a `# HELP` line to any family the exporter rendered without one (a metric recorded
/// before its description, or one missing from [`FAMILIES`]), so that every family has both.
pub fn with_help(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 256);
    let mut helped = std::collections::HashSet::new();
    for l in text.lines() {
        if let Some(rest) = l.strip_prefix("# HELP ") {
            helped.insert(rest.split_whitespace().next().unwrap_or("").to_string());
        }
    }
    for l in text.lines() {
        if let Some(rest) = l.strip_prefix("# TYPE ") {
            let name = rest.split_whitespace().next().unwrap_or("");
            if !helped.contains(name) {
                let help = FAMILIES
                    .iter()
                    .find(|(n, _)| *n == name)
                    .map_or("dmkit metric (undocumented)", |(_, h)| *h);
                out.push_str(&format!("# HELP {name} {help}\n"));
            }
        }
        out.push_str(l);
        out.push('\n');
    }
    out
}

/// The Prometheus text as OpenMetrics 1.0: a counter family is named without its `_total`
/// suffix (its samples keep it), and the exposition ends with `# EOF`.
pub fn to_openmetrics(text: &str) -> String {
    let mut counters = std::collections::HashSet::new();
    for l in text.lines() {
        if let Some(rest) = l.strip_prefix("# TYPE ") {
            let mut w = rest.split_whitespace();
            if let (Some(n), Some("counter")) = (w.next(), w.next()) {
                counters.insert(n.to_string());
            }
        }
    }
    let mut out = String::with_capacity(text.len() + 16);
    for l in text.lines() {
        if l.trim().is_empty() {
            continue;
        }
        let meta = l
            .strip_prefix("# HELP ")
            .map(|r| ("# HELP ", r))
            .or_else(|| l.strip_prefix("# TYPE ").map(|r| ("# TYPE ", r)));
        match meta {
            Some((kind, rest)) => {
                let (name, tail) = rest.split_once(' ').unwrap_or((rest, ""));
                if counters.contains(name) {
                    match name.strip_suffix("_total") {
                        Some(family) => out.push_str(&format!("{kind}{family} {tail}\n")),
                        // OpenMetrics counters' samples end in _total; one that does not is
                        // exposed as unknown.
                        None if kind == "# TYPE " => {
                            out.push_str(&format!("# TYPE {name} unknown\n"));
                        }
                        None => out.push_str(&format!("{l}\n")),
                    }
                } else {
                    out.push_str(l);
                    out.push('\n');
                }
            }
            None if l.starts_with('#') => {}
            None => {
                out.push_str(l);
                out.push('\n');
            }
        }
    }
    out.push_str("# EOF\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "# TYPE dmkit_fusee_failovers_total counter\ndmkit_fusee_failovers_total 0\n\n# HELP dmkit_fusee_members Memory nodes.\n# TYPE dmkit_fusee_members gauge\ndmkit_fusee_members 3\n";

    #[test]
    fn only_metrics_answers_and_in_the_standard_type() {
        let r = respond("GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n", || SAMPLE.into());
        assert_eq!((r.0, r.1), (200, PROMETHEUS_TEXT));
        assert!(r.3);
        let r = respond("GET /metrics?x=1 HTTP/1.0\r\n\r\n", || SAMPLE.into());
        assert_eq!(r.0, 200);
        for p in ["/", "/metricsx", "/favicon.ico", "/metrics/x"] {
            let r = respond(&format!("GET {p} HTTP/1.1\r\n\r\n"), || unreachable!());
            assert_eq!(r.0, 404, "{p}");
        }
        let r = respond("POST /metrics HTTP/1.1\r\n\r\n", || unreachable!());
        assert_eq!(r.0, 405);
        let r = respond("HEAD /metrics HTTP/1.1\r\n\r\n", || SAMPLE.into());
        assert_eq!(r.0, 200);
        assert!(!r.3);
    }

    #[test]
    fn every_family_gets_help_and_openmetrics_on_request() {
        let t = with_help(SAMPLE);
        assert!(
            t.contains("# HELP dmkit_fusee_failovers_total Memory nodes the master failed over.")
        );
        assert_eq!(t.matches("# HELP dmkit_fusee_members").count(), 1);
        let r = respond(
            "GET /metrics HTTP/1.1\r\nAccept: application/openmetrics-text;version=1.0.0,text/plain;q=0.5\r\n\r\n",
            || SAMPLE.into(),
        );
        assert_eq!(r.1, OPENMETRICS_TEXT);
        let body = String::from_utf8(r.2).unwrap();
        assert!(
            body.contains("# TYPE dmkit_fusee_failovers counter\n"),
            "{body}"
        );
        assert!(body.contains("\ndmkit_fusee_failovers_total 0\n"), "{body}");
        assert!(body.ends_with("# EOF\n"), "{body}");
        assert!(!body.contains("\n\n"), "{body}");
    }

    /// The documented metric families (the names an operator's dashboards and alerts use),
    /// sorted, with their kind by the naming convention. Renaming, adding or removing one
    /// shows up as a reviewed snapshot diff (`tools/src/snapshots/`); the metric names the
    /// code actually records are pinned by `tests/tests/metric_names.rs`.
    #[test]
    fn family_names_are_pinned() {
        let mut names: Vec<&str> = FAMILIES.iter().map(|(n, _)| *n).collect();
        names.sort_unstable();
        let kind = |n: &str| {
            if n.ends_with("_total") {
                "counter"
            } else if n.ends_with("_seconds") {
                "histogram"
            } else {
                "gauge"
            }
        };
        let lines: Vec<String> = names.iter().map(|n| format!("{n} {}", kind(n))).collect();
        insta::assert_snapshot!(lines.join("\n"));
    }

    #[test]
    fn families_are_unique_and_named_by_the_convention() {
        let mut seen = std::collections::HashSet::new();
        for (n, h) in FAMILIES {
            assert!(seen.insert(*n), "{n} twice");
            assert!(n.starts_with("dmkit_"), "{n}");
            assert!(!h.is_empty());
        }
    }
}
