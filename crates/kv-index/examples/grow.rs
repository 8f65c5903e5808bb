//! Grows a RACE index online: three clients insert into an index that starts as one small
//! subtable replicated on three memory nodes (SNAPSHOT, r = 3), while it splits under them.
//! Prints the round trips per operation from the verbs layer's accounting.
//!
//! ```text
//! cargo run -p dmkit-kv-index --example grow
//! ```

use std::sync::Arc;

use dmkit_kv_index::objects::{ObjectVerifier, encode_record};
use dmkit_kv_index::{IndexConfig, IndexReplicaSpace, InsertOutcome, ObjPtr, RaceIndex, tags};
use dmkit_verbs::sim::{SimCluster, SimConfig};
use dmkit_verbs::{Access, DramBacking, MemoryNode, NodeId};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let cluster = SimCluster::new(SimConfig::default());
    let (mut spaces, mut objects) = (Vec::new(), Vec::new());
    for id in 0..3 {
        let node = Arc::new(MemoryNode::new(NodeId(id)));
        let index = node.register(Arc::new(DramBacking::new(16 << 20)), Access::ALL, None)?;
        objects.push(node.register(Arc::new(DramBacking::new(16 << 20)), Access::ALL, None)?);
        spaces.push(IndexReplicaSpace {
            region: index,
            offset: 0,
            len: index.len,
        });
        cluster.add_node(node);
    }
    // What FUSEE's master does once: format the index (one subtable of 64 groups).
    let config = IndexConfig {
        groups_per_subtable_log2: 6,
        ..IndexConfig::default()
    };
    RaceIndex::format(&cluster.endpoint(0)?, &config, &spaces)?;
    // The keys live in records (the index's general object format) in the object regions.
    let keys = ObjectVerifier::records(objects.clone());

    const PER_CLIENT: u64 = 20_000;
    std::thread::scope(|s| -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
        let handles: Vec<_> = (0..3u64)
            .map(|c| {
                let (cluster, spaces, keys, objects) = (&cluster, &spaces, &keys, &objects);
                s.spawn(move || -> Result<(), dmkit_kv_index::Error> {
                    let idx = RaceIndex::open(&cluster.endpoint(c + 1)?, spaces)?;
                    for i in 0..PER_CLIENT {
                        let key = format!("user:{c}:{i}");
                        // Each key's record in its own 64-byte unit, spread over the nodes.
                        let (n, unit) = ((c + i) % 3, c * PER_CLIENT + i);
                        let rec = encode_record(key.as_bytes(), b"");
                        idx.endpoint().write("put", objects[n as usize].at(unit * 64), &rec)?;
                        let ptr = ObjPtr { node: NodeId(n as u16), offset: unit * 64, len_class: 1 };
                        let slot = idx.slot_for(key.as_bytes(), ptr)?;
                        let out = idx.insert(keys, key.as_bytes(), slot)?;
                        assert!(matches!(out, InsertOutcome::Inserted { .. }));
                    }
                    let ep = idx.endpoint();
                    let per = |tag| ep.stats().tag(tag).round_trips as f64 / PER_CLIENT as f64;
                    println!(
                        "client {c}: {PER_CLIENT} inserts, {:.3} RTTs/insert, split RTTs {}, directory refreshes {}",
                        per(tags::INSERT),
                        ep.stats().tag(tags::SPLIT).round_trips,
                        ep.stats().tag(tags::DIRECTORY).round_trips,
                    );
                    Ok(())
                })
            })
            .collect();
        for h in handles {
            h.join().expect("client thread")?;
        }
        Ok(())
    })
    .map_err(|e| e.to_string())?;

    let idx = RaceIndex::open(&cluster.endpoint(9)?, &spaces)?;
    let before = idx.endpoint().stats().tag(tags::SEARCH);
    let mut n = 0;
    for c in 0..3 {
        for i in (0..PER_CLIENT).step_by(7) {
            let key = format!("user:{c}:{i}");
            assert!(
                idx.search(&keys, key.as_bytes())?.is_some(),
                "{key} missing"
            );
            n += 1;
        }
    }
    let searched = idx.endpoint().stats().tag(tags::SEARCH).since(&before);
    println!(
        "grew to {} subtables (global depth {}); {n} searches, {:.3} RTTs/search (the first refreshes nothing: open read the directory)",
        idx.subtables(),
        idx.global_depth(),
        searched.round_trips as f64 / f64::from(n),
    );
    Ok(())
}
