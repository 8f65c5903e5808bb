//! Two Gengar servers in-process, one client reading a few objects much more than the rest:
//! the servers promote the hot ones into DRAM and the client's reads follow them there.
//!
//! `cargo run -p dmkit-gengar --example hot_reads`

use std::sync::Arc;
use std::time::Duration;

use dmkit_gengar::{ClientConfig, GengarClient, GengarServer, ServerConfig, tags};
use dmkit_lease::{Clock, SystemClock};
use dmkit_pmem_pool::{Pool, PoolOptions};
use dmkit_verbs::NodeId;
use dmkit_verbs::sim::{SimCluster, SimConfig};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let clock: Arc<dyn Clock> = Arc::new(SystemClock::new());
    let cluster = SimCluster::new(SimConfig::default());
    let mut servers = Vec::new();
    for id in 0..2 {
        let nvm = Pool::create_dram(16 << 20, PoolOptions::default().block_size(64 << 10))?;
        let s = GengarServer::new(NodeId(id), nvm, ServerConfig::default(), clock.clone())?;
        cluster.add_node(s.node().clone());
        servers.push(s);
    }
    let client = GengarClient::new(cluster.endpoint(1)?, 1, ClientConfig::default(), clock)?;
    let objects: Vec<_> = (0..64)
        .map(|_| client.alloc(1024))
        .collect::<Result<_, _>>()?;
    for (i, o) in objects.iter().enumerate() {
        client.write(*o, 0, &[i as u8; 1024])?;
    }
    for window in 0..3 {
        for round in 0..200 {
            // Objects 0..4 are read 50 times more often than the others.
            for o in &objects[..4] {
                client.read(*o)?;
            }
            if round % 100 == 0 {
                for o in &objects[4..] {
                    client.read(*o)?;
                }
            }
        }
        client.report_hot()?;
        let promoted: usize = servers.iter().map(|s| s.run_window().0).sum();
        println!("window {window}: promoted {promoted}");
        std::thread::sleep(Duration::from_millis(20));
    }
    let cached: usize = servers.iter().map(|s| s.cached_objects()).sum();
    client.read(objects[0])?;
    println!(
        "{cached} objects cached in DRAM; object 0 read from DRAM: {}",
        client.cached_in_dram(objects[0])
    );
    let s = client.endpoint().stats().tag(tags::READ);
    println!(
        "reads: {} round trips for {} verbs",
        s.round_trips,
        s.verbs()
    );
    Ok(())
}
