//! Power cuts on a Gengar server's NVM pool: the pool's recording crash medium (which also
//! records what the NIC writes) under a client's allocations, synchronous writes and proxied
//! writes; every crash image after setup is reopened as a new server, and every
//! acknowledged allocation and write (a synchronous write once it returned, a proxied one
//! once its confirm fired) is there. A write in flight at the cut may be torn (Gengar writes
//! are atomic per 8-byte word, as NVM is): each word holds the acknowledged or the in-flight
//! bytes. The pool holds no object beyond the acknowledged allocations and the one in flight.
//!
//! `DMKIT_POWER_CUT_OPS` sets the writes (default 160), `DMKIT_POWER_CUT_IMAGES` caps the
//! images checked (default 1500).

use std::sync::Arc;

use dmkit_gengar::{ClientConfig, GengarClient, GengarServer, ServerConfig};
use dmkit_lease::{Clock, SystemClock};
use dmkit_pmem_pool::test_utils::{CrashMedium, CrashPolicy};
use dmkit_pmem_pool::{Pool, PoolOptions};
use dmkit_verbs::NodeId;
use dmkit_verbs::sim::{SimCluster, SimConfig};

const POOL: usize = 4 << 20;
const OBJECTS: usize = 4;
const SIZE: usize = 200;

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn clock() -> Arc<dyn Clock> {
    Arc::new(SystemClock::new())
}

fn serve(pool: Pool) -> (SimCluster, Arc<GengarServer>, GengarClient) {
    let cluster = SimCluster::new(SimConfig::default());
    let server = GengarServer::new(NodeId(0), pool, ServerConfig::default(), clock()).unwrap();
    cluster.add_node(server.node().clone());
    let client = GengarClient::new(
        cluster.endpoint(7).unwrap(),
        7,
        ClientConfig::default(),
        clock(),
    )
    .unwrap();
    (cluster, server, client)
}

/// The bytes write `i` puts in its object.
fn pattern(i: usize) -> Vec<u8> {
    (0..SIZE).map(|j| (i * 37 + j) as u8 | 1).collect()
}

#[test]
fn power_cuts_lose_no_acknowledged_gengar_write() {
    let writes = env("DMKIT_POWER_CUT_OPS", 160);
    let cap = env("DMKIT_POWER_CUT_IMAGES", 1500);
    let medium = CrashMedium::new(POOL);
    let pool =
        Pool::create_on(medium.boxed(), PoolOptions::default().block_size(64 << 10)).unwrap();
    let formatted = medium.persist_points();
    let (cluster, server, client) = serve(pool);
    // Acknowledged events in order, the medium marked with their count: allocations, then
    // writes `(object, write index)`.
    let mut acked: Vec<(usize, Option<usize>)> = Vec::new();
    let mut addrs = Vec::new();
    for o in 0..OBJECTS {
        addrs.push(client.alloc(SIZE).unwrap());
        acked.push((o, None));
        medium.mark(acked.len() as u64);
    }
    for i in 0..writes {
        let o = i % OBJECTS;
        if i % 2 == 0 {
            client.write(addrs[o], 0, &pattern(i)).unwrap();
        } else {
            client
                .write_proxied(addrs[o], 0, &pattern(i))
                .unwrap()
                .wait()
                .unwrap();
        }
        acked.push((o, Some(i)));
        medium.mark(acked.len() as u64);
    }
    medium.stop_recording();
    drop(client);
    drop(server);
    drop(cluster);
    let policy = CrashPolicy {
        exhaustive_limit: 4,
        samples: 2,
        seed: 0x6e6a,
    };
    let (total, checked) =
        medium.for_each_sampled_image(policy, formatted, cap, |img, seen, total| {
            let at = format!(
                "image {seen} of {total} (persist point {}, {} acked)",
                img.point, img.mark
            );
            let pool = Pool::open_on(CrashMedium::from_image(img.bytes).boxed())
                .unwrap_or_else(|e| panic!("{at}: the pool does not open: {e}"));
            let done = &acked[..img.mark as usize];
            let allocated = done.iter().filter(|(_, w)| w.is_none()).count();
            let live = pool.stats().live_objects;
            assert!(
                live >= allocated && live <= (allocated + 1).min(OBJECTS),
                "{at}: {live} objects in the pool, {allocated} allocations acknowledged"
            );
            let (_cluster, _server, reader) = serve(pool);
            for (o, addr) in addrs.iter().enumerate().take(allocated) {
                let last = done.iter().rev().find(|(oo, w)| *oo == o && w.is_some());
                let want = last
                    .map(|(_, w)| pattern(w.expect("a write")))
                    .unwrap_or(vec![0; SIZE]);
                // The next write of this object, if it was in flight at the cut.
                let next = acked[img.mark as usize..]
                    .iter()
                    .find(|(oo, w)| *oo == o && w.is_some())
                    .map(|(_, w)| pattern(w.expect("a write")));
                let now = reader
                    .read(*addr)
                    .unwrap_or_else(|e| panic!("{at}: object {o} cannot be read: {e}"));
                for w in 0..SIZE.div_ceil(8) {
                    let r = w * 8..(w * 8 + 8).min(SIZE);
                    let ok = now[r.clone()] == want[r.clone()]
                        || next
                            .as_ref()
                            .is_some_and(|n| now[r.clone()] == n[r.clone()]);
                    assert!(
                        ok,
                        "{at}: object {o} bytes {}..{}: {:?}, acknowledged {:?}",
                        r.start,
                        r.end,
                        &now[r.clone()],
                        &want[r.clone()]
                    );
                }
            }
        });
    eprintln!("gengar power cut: {writes} writes, {total} images, {checked} checked");
    assert!(checked >= cap.min(total) * 9 / 10);
}
