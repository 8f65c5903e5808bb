//! Power cuts on NVM: FUSEE memory nodes on pools whose medium records every store and
//! persist (the pool crate's crash medium, which also records what the NIC writes), under
//! concurrent clients; then, for every persist point, the images a power failure there could
//! leave (each dirty cache line at some prefix of its stores) are reopened as a cluster, every
//! client recovers from its log, and: every image opens, every acknowledged write is there (or
//! the key's next write, in flight at the cut), and no object is leaked. With r = 1 nothing but
//! the node's own persists can keep a write; with r = 2 both nodes lose power at once (their
//! pools share one recorded medium, so one image is one instant for both).
//!
//! `DMKIT_POWER_CUT_OPS` sets the operations per client (default 24), `DMKIT_POWER_CUT_IMAGES`
//! caps the images checked per configuration (default 1500, spread over the whole run).

use std::path::Path;
use std::sync::Arc;

use dmkit_fusee::alloc::BlockGeometry;
use dmkit_fusee::{LocalCluster, LocalConfig};
use dmkit_pmem_pool::test_utils::{CrashMedium, CrashPolicy};
use dmkit_pmem_pool::{Medium, MediumKind, Pool, PoolOptions};
use parking_lot::Mutex;

const POOL: usize = 4 << 20;
const BLOCK: usize = 64 << 10;
const CLIENTS: [u64; 2] = [10, 11];
const KEYS_PER_CLIENT: usize = 3;

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// `len` bytes of a shared medium from `base`: one node's pool.
#[derive(Debug, Clone)]
struct Window {
    medium: CrashMedium,
    base: usize,
    len: usize,
}

impl Medium for Window {
    fn kind(&self) -> MediumKind {
        MediumKind::Test
    }
    fn location(&self) -> String {
        format!("<crash-test window at {:#x}>", self.base)
    }
    fn path(&self) -> Option<&Path> {
        None
    }
    fn as_ptr(&self) -> *mut u8 {
        self.medium.as_ptr().wrapping_add(self.base)
    }
    fn len(&self) -> usize {
        self.len
    }
    fn is_persistent(&self) -> bool {
        true
    }
    fn load_u64(&self, offset: usize) -> u64 {
        self.medium.load_u64(self.base + offset)
    }
    fn store_u64(&self, offset: usize, value: u64) {
        self.medium.store_u64(self.base + offset, value)
    }
    fn read(&self, offset: usize, buf: &mut [u8]) {
        self.medium.read(self.base + offset, buf)
    }
    fn write(&self, offset: usize, data: &[u8]) {
        self.medium.write(self.base + offset, data)
    }
    fn persist(&self, offset: usize, len: usize) -> dmkit_pmem_pool::Result<()> {
        self.medium.persist(self.base + offset, len)
    }
    fn note_write(&self, offset: usize, len: usize) {
        self.medium.note_write(self.base + offset, len)
    }
}

fn config(nodes: u16, r: usize) -> LocalConfig {
    let mut cfg = LocalConfig::new(nodes, r);
    cfg.pool_bytes = POOL;
    cfg.block_size = BLOCK;
    cfg.cluster.index_bytes = 256 << 10;
    cfg
}

fn pools_on(medium: &CrashMedium, nodes: usize, create: bool) -> Vec<Pool> {
    (0..nodes)
        .map(|i| {
            let w = Box::new(Window {
                medium: medium.clone(),
                base: i * POOL,
                len: POOL,
            });
            if create {
                Pool::create_on(w, PoolOptions::default().block_size(BLOCK)).unwrap()
            } else {
                Pool::open_on(w)
                    .unwrap_or_else(|e| panic!("an image of pool {i} does not open: {e}"))
            }
        })
        .collect()
}

/// What client `c` does, in order: per step, a key and the value it holds after (`None`:
/// deleted).
fn script(c: u64, ops: usize) -> Vec<(String, Option<Vec<u8>>)> {
    let mut present = [false; KEYS_PER_CLIENT];
    (0..ops)
        .map(|i| {
            let k = i % KEYS_PER_CLIENT;
            let key = format!("c{c}-k{k}");
            // Insert when absent; when present, update twice, then delete.
            let v = if !present[k] || (i / KEYS_PER_CLIENT) % 3 != 2 {
                present[k] = true;
                Some(format!("c{c} step {i}").into_bytes())
            } else {
                present[k] = false;
                None
            };
            (key, v)
        })
        .collect()
}

fn run(nodes: u16, r: usize) {
    let ops = env("DMKIT_POWER_CUT_OPS", 24);
    let cap = env("DMKIT_POWER_CUT_IMAGES", 1500);
    let medium = CrashMedium::new(POOL * nodes as usize);
    let c =
        LocalCluster::start_on(config(nodes, r), pools_on(&medium, nodes as usize, true)).unwrap();
    // The cluster exists from here on (a cut while formatting is the pool's own crash suite).
    let formatted = medium.persist_points();
    // Every acknowledged step, in order (client, step); the medium is marked with the count.
    let acked = Arc::new(Mutex::new(Vec::<(u64, usize)>::new()));
    std::thread::scope(|s| {
        for id in CLIENTS {
            let (c, medium, acked) = (&c, medium.clone(), acked.clone());
            s.spawn(move || {
                let kv = c.client(id).unwrap();
                for (i, (key, v)) in script(id, ops).into_iter().enumerate() {
                    match &v {
                        Some(v) => kv.upsert(key.as_bytes(), v).unwrap(),
                        None => {
                            kv.delete(key.as_bytes()).unwrap();
                        }
                    }
                    let mut a = acked.lock();
                    a.push((id, i));
                    medium.mark(a.len() as u64);
                }
                kv.flush().unwrap();
            });
        }
    });
    medium.stop_recording();
    drop(c);
    let acked = acked.lock().clone();
    let scripts: Vec<_> = CLIENTS.iter().map(|id| script(*id, ops)).collect();
    let policy = CrashPolicy {
        exhaustive_limit: 4,
        samples: 2,
        seed: 0x90e4,
    };
    let (total, checked) =
        medium.for_each_sampled_image(policy, formatted, cap, |img, seen, total| {
            let at = format!(
                "r = {r}, image {seen} of {total} (persist point {}, {} acked)",
                img.point, img.mark
            );
            let image = CrashMedium::from_image(img.bytes);
            let c = LocalCluster::reopen(config(nodes, r), pools_on(&image, nodes as usize, false))
                .unwrap_or_else(|e| panic!("{at}: the cluster does not open: {e}"));
            let recovered: Vec<_> = CLIENTS
                .iter()
                .map(|id| {
                    let (rec, report) = c
                        .recover(*id)
                        .unwrap_or_else(|e| panic!("{at}: recovery of {id}: {e}"));
                    rec.flush().unwrap();
                    (rec, report)
                })
                .collect();
            let reader = c.client(1).unwrap();
            for (ci, id) in CLIENTS.iter().enumerate() {
                // The steps of this client acknowledged before the cut: a prefix of its script.
                let done = acked[..img.mark as usize]
                    .iter()
                    .filter(|(c, _)| c == id)
                    .count();
                let mut live = 0;
                for k in 0..KEYS_PER_CLIENT {
                    let key = format!("c{id}-k{k}");
                    let steps: Vec<_> = scripts[ci]
                        .iter()
                        .enumerate()
                        .filter(|(_, (kk, _))| *kk == key)
                        .collect();
                    let before = steps
                        .iter()
                        .rev()
                        .find(|(i, _)| *i < done)
                        .map(|(_, (_, v))| v.clone())
                        .unwrap_or(None);
                    let next = steps
                        .iter()
                        .find(|(i, _)| *i >= done)
                        .map(|(_, (_, v))| v.clone());
                    let now = reader.search(key.as_bytes()).unwrap();
                    assert!(
                        now == before || Some(&now) == next.as_ref(),
                        "{at}: {key} holds {:?}; acknowledged {:?}, in flight {:?}",
                        now.as_deref().map(String::from_utf8_lossy),
                        before.as_deref().map(String::from_utf8_lossy),
                        next.map(|v| v.map(|v| String::from_utf8_lossy(&v).into_owned()))
                    );
                    live += usize::from(now.is_some());
                }
                // No leak: every object of the client's blocks is live (one of its keys) or free.
                let (rec, report) = &recovered[ci];
                rec.reclaim().unwrap();
                let objects: u64 = rec
                    .owned_block_classes()
                    .iter()
                    .map(|class| BlockGeometry::new(BLOCK as u64, *class).objects)
                    .sum();
                assert_eq!(
                    rec.free_objects() + live,
                    objects as usize,
                    "{at}: client {id} leaked objects ({live} live keys; recovery: {report:?})"
                );
            }
        });
    eprintln!("power cut r = {r}: {ops} steps per client, {total} images, {checked} checked");
    assert!(
        checked >= cap.min(total) * 9 / 10,
        "{checked} of {total} images checked"
    );
}

#[test]
fn power_cuts_with_one_replica_lose_no_acknowledged_write() {
    run(1, 1);
}

#[test]
fn power_cuts_of_two_replicas_at_once_lose_no_acknowledged_write() {
    run(2, 2);
}
