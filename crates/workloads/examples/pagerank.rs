//! PageRank on the Gengar pool: an R-MAT graph of 2^16 vertices and about a million edges,
//! its in-edge CSR arrays split into pool objects, ten iterations on four worker clients with
//! the rank and contribution vectors in the pool. The code is
//! `dmkit_workloads::gengar_apps::pagerank` (only `GengarClient`'s public API); the ranks are
//! checked bit for bit against the same computation in one process.
//!
//! `cargo run --release -p dmkit-workloads --example pagerank`

use dmkit_gengar::ServerConfig;
use dmkit_workloads::gengar_apps::{Deployment, DeploymentConfig, WriteMode, pagerank};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let cfg = pagerank::PageRankConfig::default();
    let d = Deployment::sim(
        &DeploymentConfig {
            server: ServerConfig {
                min_hot_count: 1,
                ..ServerConfig::default()
            },
            ..DeploymentConfig::default()
        },
        true,
    )?;
    let out = pagerank::run(&d, 4, WriteMode::Proxied, &cfg)?;
    let (load, _) = out.time("load");
    let (iterate, wall) = out.time("iterate");
    println!(
        "{} vertices, {} edges: load {:.2} ms, {} iterations {:.2} ms modeled ({:.0} ms wall); {} objects promoted to DRAM",
        out.notes[1].1,
        out.notes[0].1,
        load.as_secs_f64() * 1e3,
        cfg.iterations,
        iterate.as_secs_f64() * 1e3,
        wall.as_secs_f64() * 1e3,
        d.promotions()
    );
    println!("ranks match the single-process PageRank");
    Ok(())
}
