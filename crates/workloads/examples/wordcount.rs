//! MapReduce on the Gengar pool: TeraGen-style records generated into pool objects, then
//! WordCount with four worker clients — map outputs, directories and reduce results are pool
//! objects too. The job's code is `dmkit_workloads::gengar_apps::wordcount` (only `GengarClient`'s
//! public API); the counts are checked against WordCount computed in one process.
//!
//! `cargo run --release -p dmkit-workloads --example wordcount`

use dmkit_workloads::gengar_apps::{Deployment, DeploymentConfig, WriteMode, wordcount};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let cfg = wordcount::WordCountConfig {
        records: 50_000,
        ..wordcount::WordCountConfig::default()
    };
    let d = Deployment::sim(&DeploymentConfig::default(), true)?;
    let out = wordcount::run(&d, 4, WriteMode::Proxied, &cfg)?;
    for p in &out.phases {
        println!(
            "{:<12} {:>8.3} ms modeled  {:>8.3} ms wall",
            p.name,
            p.modeled.as_secs_f64() * 1e3,
            p.wall.as_secs_f64() * 1e3
        );
    }
    for (k, v) in &out.notes {
        println!("{k}: {v}");
    }
    println!("counts match the single-process WordCount");
    Ok(())
}
