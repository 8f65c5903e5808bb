//! A hash-table key-value store on the Gengar pool (buckets are objects holding chains of
//! `GlobalAddr`s), loaded and driven by YCSB workload A from four worker clients, on two
//! in-process servers with the sim latency model. The store's code is
//! `dmkit_workloads::gengar_apps::kv` and uses only `GengarClient`'s public API; the run checks
//! every read and the final state against the operations' history.
//!
//! `cargo run --release -p dmkit-workloads --example kv_store [-- WORKLOAD]`

use dmkit_workloads::gengar_apps::{Deployment, DeploymentConfig, WriteMode, kv};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let workload = std::env::args()
        .nth(1)
        .and_then(|a| a.chars().next())
        .unwrap_or('a');
    let cfg = kv::KvConfig {
        workload,
        records: 10_000,
        operations: 20_000,
        ..kv::KvConfig::default()
    };
    for (name, mode) in [("sync", WriteMode::Sync), ("proxied", WriteMode::Proxied)] {
        let d = Deployment::sim(&DeploymentConfig::default(), true)?;
        let out = kv::run(&d, 4, mode, &cfg)?;
        let (load, _) = out.time("load");
        let (run, _) = out.time("run");
        println!(
            "YCSB-{workload} with {name} writes: load {:.2} ms, run {:.2} ms modeled ({} ops, {} objects promoted to DRAM)",
            load.as_secs_f64() * 1e3,
            run.as_secs_f64() * 1e3,
            out.ops,
            d.promotions()
        );
    }
    Ok(())
}
