//! A client crashes in the middle of an UPDATE (fault injection on the sim backend); restarted
//! with the same id, it walks its log and repairs the index. Prints the recovery breakdown.
//!
//! `cargo run -p dmkit-fusee --example crash_and_recover`

use dmkit_fusee::{LocalCluster, LocalConfig};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let cluster = LocalCluster::start(LocalConfig::new(3, 3))?;
    let kv = cluster.client(7)?;
    for i in 0..100 {
        kv.insert(format!("k{i}").as_bytes(), b"v1")?;
    }
    kv.flush()?;
    // The client dies after 6 more verbs, partway through the UPDATE.
    cluster.sim.crash_client_after(7, 6);
    let r = kv.update(b"k42", b"v2");
    println!("update during the crash: {r:?}");
    drop(kv);
    let (kv, report) = cluster.recover(7)?;
    println!(
        "recovered in {:?}: reconnect {:?}, metadata {:?}, log walk {:?}, redo {:?}, free lists {:?}",
        report.total(),
        report.reconnect,
        report.metadata,
        report.log_walk,
        report.redo,
        report.free_lists
    );
    println!(
        "{} unfinished operations: {} completed, {} rolled back; {} live objects",
        report.unfinished, report.completed, report.rolled_back, report.live_objects
    );
    println!(
        "k42 = {:?}",
        kv.search(b"k42")?
            .map(|v| String::from_utf8_lossy(&v).into_owned())
    );
    Ok(())
}
