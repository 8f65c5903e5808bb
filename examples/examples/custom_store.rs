//! A persistent key-value store from the layer crates alone (docs/COMPOSING.md): a RACE index
//! replicated on three memory nodes (kv-index, SNAPSHOT with r = 3), values in objects carved
//! from pool blocks (pmem-pool's block service and slabs, on pool files), and a DRAM tier for
//! hot objects chosen by dmkit-cache. It writes, restarts every memory node on its pool file,
//! and reads everything back. `cargo run -p dmkit-examples --example custom_store
//! [-- --backend tcp]` (tcp: each memory node is a process of its own, killed at the restart).
use std::path::Path;
use std::sync::Arc;

use dmkit_cache::{AdmissionConfig, HotTier};
use dmkit_kv_index::objects::{ObjectVerifier, encode_record};
use dmkit_kv_index::{IndexConfig, IndexReplicaSpace, ObjPtr, RaceIndex, Slot};
use dmkit_pmem_pool::remote::{BlockRequest, RemoteSlabs, memory_node};
use dmkit_pmem_pool::{Pool, PoolOptions};
use dmkit_verbs::{Endpoint, NodeId, tcp};

type Res<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;
const BLOCK: u64 = 64 << 10;
const INDEX_BLOCKS: u64 = 128; // blocks 0..128 of every pool hold its index replica
const KEYS: usize = 1000;

struct Store {
    ep: Endpoint,
    index: RaceIndex,
    objects: ObjectVerifier,
    slabs: RemoteSlabs,
    hot: HotTier<Vec<u8>>, // slot word -> value (a new version is a new word)
}

impl Store {
    fn open(ep: Endpoint, format: bool) -> Res<Store> {
        let nodes: Vec<NodeId> = (0..3).map(NodeId).collect();
        let regions = (nodes.iter().map(|n| Ok(ep.regions(*n)?[0]))).collect::<Res<Vec<_>>>()?;
        let spaces: Vec<_> = (regions.iter())
            .map(|r| IndexReplicaSpace::new(*r, 0, INDEX_BLOCKS * BLOCK))
            .collect();
        if format {
            for n in &nodes {
                let req = BlockRequest::Reserve {
                    owner: 0,
                    first: 0,
                    count: INDEX_BLOCKS,
                };
                ep.rpc("format", *n, &req.encode())?;
            }
            RaceIndex::format(&ep, &IndexConfig::default(), &spaces)?;
        }
        Ok(Store {
            index: RaceIndex::open(&ep, &spaces)?,
            objects: ObjectVerifier::records(regions),
            slabs: RemoteSlabs::new(1, BLOCK, INDEX_BLOCKS, nodes),
            hot: HotTier::new(AdmissionConfig::with_capacity(16 << 10))?,
            ep,
        })
    }

    fn put(&self, key: &[u8], value: &[u8]) -> Res<()> {
        let rec = encode_record(key, value);
        let (node, offset) = self.slabs.alloc(&self.ep, rec.len())?;
        self.ep
            .write_durable("put", self.objects.region(node)?.at(offset), &rec)?;
        let len_class = ObjPtr::len_class_of(rec.len()).ok_or("value too large")?;
        let slot = self.index.slot_for(
            key,
            ObjPtr {
                node,
                offset,
                len_class,
            },
        )?;
        if self.index.update(&self.objects, key, slot)?.is_none() {
            self.index.insert(&self.objects, key, slot)?;
        }
        Ok(())
    }

    fn get(&self, key: &[u8]) -> Res<Option<Vec<u8>>> {
        let slot = self.index.search(&self.objects, key)?;
        match slot.map(|s| (s, self.hot.get(s.raw()))) {
            Some((_, Some(v))) => Ok(Some(v)),
            Some((s, None)) => Ok(self.objects.read_value(&self.ep, &s)?),
            None => Ok(None),
        }
    }

    /// One window of the DRAM tier: the hottest objects that fit move in, the rest out.
    fn window(&self) {
        let slot = |w: u64| Slot::from_raw(w).ok().flatten();
        let load = |w| self.objects.read_value(&self.ep, &slot(w)?).ok()?;
        (self.hot).window(|w| Some(slot(w)?.object_len() as u64), load);
    }
}

/// Memory node `n`: its pool file in `dir` (created on the first start) served with the
/// pool's block service.
fn node(dir: &Path, n: u16) -> Res<Arc<dmkit_verbs::MemoryNode>> {
    let opts = PoolOptions::default().block_size(BLOCK as usize);
    let pool = Pool::open_or_create(dir.join(format!("node{n}.pool")), 32 << 20, opts)?;
    Ok(memory_node(NodeId(n), Arc::new(pool))?)
}

/// The three memory nodes (in-process, or processes on tcp), and an endpoint to them.
fn start(dir: &Path, tcp: bool, procs: &mut Vec<std::process::Child>) -> Res<Endpoint> {
    if !tcp {
        let cluster = dmkit_verbs::sim::SimCluster::new(Default::default());
        for n in 0..3 {
            cluster.add_node(node(dir, n)?);
        }
        return Ok(cluster.endpoint(1)?);
    }
    let mut nodes = Vec::new();
    for n in 0..3u16 {
        let mut child = std::process::Command::new(std::env::current_exe()?)
            .args(["memnode", &n.to_string(), &dir.display().to_string()])
            .stdout(std::process::Stdio::piped())
            .spawn()?;
        let mut out = std::io::BufReader::new(child.stdout.take().ok_or("no stdout")?);
        let mut addr = String::new();
        std::io::BufRead::read_line(&mut out, &mut addr)?;
        nodes.push((NodeId(n), addr.trim().to_string()));
        procs.push(child);
    }
    Ok(Endpoint::connect(&tcp::TcpConnector::default(), &nodes)?)
}

pub fn main() -> Res<()> {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("memnode") {
        let node = node(Path::new(&args[3]), args[2].parse()?)?;
        let server = tcp::TcpServer::start("127.0.0.1:0", node, Default::default())?;
        println!("{}", server.local_addr());
        loop {
            std::thread::park();
        }
    }
    let tcp = args.join(" ").contains("--backend tcp");
    let dir = tempfile::tempdir()?;
    let value = |i: usize| format!("value-{i}-{}", "x".repeat(i % 200)).into_bytes();
    for restart in [false, true] {
        let mut procs = Vec::new();
        let store = Store::open(start(dir.path(), tcp, &mut procs)?, !restart)?;
        for i in 0..KEYS {
            if !restart {
                store.put(format!("key-{i}").as_bytes(), &value(i))?;
            }
            // Keys 0..10 are read far more than the rest: they move into DRAM.
            for k in [i, i % 10, i % 10] {
                assert_eq!(
                    store.get(format!("key-{k}").as_bytes())?,
                    Some(value(k)),
                    "key-{k}"
                );
            }
            if i % 100 == 99 {
                store.window();
            }
        }
        let what = ["written", "read back after a restart"][usize::from(restart)];
        println!(
            "{KEYS} keys {what}; {} reads served from DRAM",
            store.hot.hits()
        );
        for mut p in procs {
            p.kill()?; // a crash: the pool files keep what was acknowledged
            p.wait()?;
        }
    }
    println!("custom_store: ok {KEYS} keys");
    Ok(())
}
