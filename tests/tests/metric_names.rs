//! The Prometheus metric names the code records, pinned with insta: a debugging recorder is
//! installed, a small in-process workload runs — a FUSEE cluster over `sim` (r = 3) and over
//! `tcp` on loopback, and a Gengar server over `sim` — and the sorted set of
//! `name{label keys} kind` seen is snapshotted (`tests/tests/snapshots/`). Renaming a metric,
//! or a label key, breaks dashboards and alerts: it shows up here as a reviewed snapshot diff.
//!
//! Only what these code paths register is pinned: families recorded only by the `dmkit`
//! processes (master, memnode, RESP gateway) or on rare events (failovers, retries, splits)
//! are not seen here; the documented list of every family, `FAMILIES` in
//! tools/src/metrics_http.rs, is pinned by its own snapshot in that module. Label values are
//! left out (node ids and pool uuids vary); label keys are kept.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use dmkit_fusee::{LocalCluster, LocalConfig};
use dmkit_gengar::{ClientConfig, GengarClient, GengarServer, ServerConfig};
use dmkit_lease::{Clock, SystemClock};
use dmkit_pmem_pool::{Pool, PoolOptions};
use dmkit_verbs::NodeId;
use dmkit_verbs::sim::{SimCluster, SimConfig};
use metrics_util::MetricKind;
use metrics_util::debugging::DebuggingRecorder;

fn fusee_workload(cluster: &LocalCluster) {
    let c = cluster.client(1).unwrap();
    for i in 0..8 {
        let k = format!("metric-key-{i}").into_bytes();
        c.insert(&k, b"one").unwrap();
        c.search(&k).unwrap().unwrap();
        c.update(&k, b"two").unwrap();
        c.upsert(&k, b"three").unwrap();
        c.flush().unwrap();
    }
    for i in 0..8 {
        let k = format!("metric-key-{i}").into_bytes();
        c.delete(&k).unwrap();
        c.flush().unwrap();
    }
    // A second client that has never seen the keys.
    let d = cluster.client(2).unwrap();
    assert_eq!(d.search(b"metric-key-0").unwrap(), None);
}

fn gengar_workload() {
    let clock: Arc<dyn Clock> = Arc::new(SystemClock::new());
    let sim = SimCluster::new(SimConfig::default());
    let pool = Pool::create_dram(8 << 20, PoolOptions::default().block_size(64 << 10)).unwrap();
    let server =
        GengarServer::new(NodeId(0), pool, ServerConfig::default(), clock.clone()).unwrap();
    sim.add_node(server.node().clone());
    let c = GengarClient::new(sim.endpoint(1).unwrap(), 1, ClientConfig::default(), clock).unwrap();
    let hot = c.alloc(256).unwrap();
    let cold = c.alloc(256).unwrap();
    c.write(hot, 0, &[7; 256]).unwrap();
    c.write(cold, 0, &[9; 256]).unwrap();
    for _ in 0..50 {
        c.read(hot).unwrap();
    }
    c.lock(cold).unwrap();
    c.write_proxied(cold, 0, b"proxied")
        .unwrap()
        .wait()
        .unwrap();
    c.unlock(cold).unwrap();
    c.report_hot().unwrap();
    server.run_window();
    std::thread::sleep(Duration::from_millis(10));
    c.free(cold).unwrap();
    c.flush().unwrap();
}

#[test]
fn recorded_metric_names_are_pinned() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder
        .install()
        .expect("the only recorder of this test binary");

    fusee_workload(&LocalCluster::start(LocalConfig::new(3, 3)).unwrap());
    fusee_workload(&LocalCluster::start_tcp(LocalConfig::new(1, 1)).unwrap());
    gengar_workload();

    let names: BTreeSet<String> = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .map(|(ck, _, _, _)| {
            let kind = match ck.kind() {
                MetricKind::Counter => "counter",
                MetricKind::Gauge => "gauge",
                MetricKind::Histogram => "histogram",
            };
            let key = ck.key();
            let labels: BTreeSet<&str> = key.labels().map(|l| l.key()).collect();
            let labels: Vec<&str> = labels.into_iter().collect();
            format!("{}{{{}}} {kind}", key.name(), labels.join(","))
        })
        .collect();
    assert!(
        names.iter().all(|n| n.starts_with("dmkit_")),
        "a metric outside the dmkit_ namespace: {names:?}"
    );
    insta::assert_snapshot!(names.into_iter().collect::<Vec<_>>().join("\n"));
}
