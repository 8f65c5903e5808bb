//! Gengar shared-object histories checked for linearizability: several clients on a few
//! shared objects, each object a register (its first 8-byte word), with
//!
//! - unlocked reads (through the client's lease: from the server's DRAM copy when the object
//!   is hot and cached, from NVM otherwise),
//! - locked reads,
//! - locked writes, synchronous or proxied (the unlock waits for the write confirms),
//! - locked read-modify-writes (read, then write a new value, synchronous or proxied),
//!
//! while the servers' windows promote and evict the objects — every window judged alone, and
//! a background reader keeps big filler objects hot, more of them than the DRAM buffer holds,
//! so the shared objects go in and out of DRAM — and, for half the seeds, 20 to 200 work
//! requests to one server are delayed by 0.1 to 3 ms (less than the servers' grace for late
//! operations).
//! A locked operation spans lock to unlock. Unlocked *writes* are left out on purpose: Gengar
//! makes shared objects consistent through application locks, and two unlocked writers of a
//! cached object may leave its DRAM and NVM copies different (write-through is two writes).
//!
//! Each seed fixes the operations, the delays and the cache settings; the threads are
//! scheduled by the OS (Gengar's leases and windows run on wall-clock time). CI runs a
//! bounded number of seeds, `DMKIT_GENGAR_LIN_SEEDS` (default 6) from
//! `DMKIT_GENGAR_LIN_FIRST_SEED` (default 1); a failure prints its seed and history.
//!
//! With `DMKIT_TEST_BACKEND=rdma` (inside the SoftRoCE guest, dmkit-tests built with
//! `--features rdma`) the servers are served by `RdmaServer`s and every client connects
//! through rdma-cm: the same histories on real verbs, without the injected delays (a sim
//! fault); 3 seeds by default there, more (up to 8) while the paths are not all taken.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use dmkit_gengar::{ClientConfig, GengarClient, GengarServer, GlobalAddr, ServerConfig};
use dmkit_lease::{Clock, SystemClock, TunerConfig};
use dmkit_pmem_pool::{Pool, PoolOptions};
use dmkit_tests::linearizability::{Call, Event, Ret, check};
use dmkit_verbs::sim::{SimCluster, SimConfig};
use dmkit_verbs::{Endpoint, NodeId};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const THREADS: u64 = 4;
const OBJECTS: usize = 3;
const OPS: usize = 30;
const SERVERS: u16 = 2;
/// Filler objects: together bigger than both servers' DRAM buffers (1 MiB, 15 blocks of 64
/// KiB for objects). Each fills a block's one slot exactly (a slot has an 8-byte header), so
/// that the admission policy's byte count and the DRAM pool's slots agree and a full buffer
/// evicts.
const FILLERS: usize = 48;
const FILLER_BYTES: usize = (64 << 10) - 8;
/// Promotions (of fillers) before the history starts: enough to fill both DRAM buffers.
const WARM_PROMOTIONS: u64 = 30;

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|s| s.parse().ok())
}

fn replay(seed: u64) -> String {
    format!(
        "DMKIT_GENGAR_LIN_SEEDS=1 DMKIT_GENGAR_LIN_FIRST_SEED={seed} cargo test -p dmkit-tests \
         --test gengar_linearizability (the threads are OS-scheduled: rerun it a few times)"
    )
}

/// The register's bytes for value `v`.
fn val(v: u64) -> Vec<u8> {
    v.to_le_bytes().to_vec()
}

/// How the servers are reached: the sim backend (with its delay injection), or real verbs
/// (`DMKIT_TEST_BACKEND=rdma`: in-process `RdmaServer`s on `SOFTROCE_IP`; tcp otherwise is
/// not used here — sim covers the logic and rdma the real NIC).
enum Net {
    Sim(SimCluster),
    #[cfg(feature = "rdma")]
    Rdma(Vec<dmkit_verbs::rdma::RdmaServer>),
}

impl Net {
    fn start(servers: &[Arc<GengarServer>]) -> Net {
        if dmkit_tests::procs::backend() == "rdma" {
            #[cfg(feature = "rdma")]
            {
                let cfg = dmkit_verbs::rdma::RdmaConfig::from_env().unwrap();
                let listen = dmkit_tests::procs::memnode_listen();
                return Net::Rdma(
                    servers
                        .iter()
                        .map(|s| {
                            dmkit_verbs::rdma::RdmaServer::start(
                                &listen,
                                s.node().clone(),
                                cfg.clone(),
                            )
                            .unwrap()
                        })
                        .collect(),
                );
            }
            #[cfg(not(feature = "rdma"))]
            panic!("DMKIT_TEST_BACKEND=rdma needs dmkit-tests built with --features rdma");
        }
        let cluster = SimCluster::new(SimConfig::default());
        for s in servers {
            cluster.add_node(s.node().clone());
        }
        Net::Sim(cluster)
    }

    fn endpoint(&self, id: u64) -> Endpoint {
        match self {
            Net::Sim(c) => c.endpoint(id).unwrap(),
            #[cfg(feature = "rdma")]
            Net::Rdma(servers) => {
                let nodes: Vec<_> = servers
                    .iter()
                    .map(|s| (s.node().id(), s.local_addr().to_string()))
                    .collect();
                let conn = dmkit_tests::procs::connector();
                Endpoint::connect(conn.as_ref(), &nodes).unwrap()
            }
        }
    }
}

/// What a seed's history covered.
#[derive(Debug, Default)]
struct Covered {
    ops: usize,
    unlocked_reads: usize,
    cached_reads: usize,
    proxied_writes: usize,
    rmws: usize,
    promotions: u64,
    evictions: u64,
}

/// What one operation did.
#[derive(Debug, Clone, Copy)]
enum Kind {
    Read,
    LockedRead,
    Write { proxied: bool },
    Rmw { proxied: bool },
}

fn run_seed(seed: u64) -> Covered {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let clock: Arc<dyn Clock> = Arc::new(SystemClock::new());
    let cfg = ServerConfig {
        dram_bytes: 1 << 20,
        // Every window judged alone with a low bar: hot objects go into DRAM, and out again
        // as soon as a window sees too few reads of them.
        min_hot_count: rng.random_range(1..3),
        history_decay: 0.0,
        hysteresis: 0.0,
        tuner: TunerConfig {
            initial_nvm: Duration::from_millis(1),
            initial_dram: Duration::from_millis(1),
            min: Duration::from_millis(1),
            max: Duration::from_millis(4),
            ..TunerConfig::default()
        },
        ..ServerConfig::default()
    };
    let servers: Vec<Arc<GengarServer>> = (0..SERVERS)
        .map(|i| {
            let nvm =
                Pool::create_dram(8 << 20, PoolOptions::default().block_size(64 << 10)).unwrap();
            GengarServer::new(NodeId(i), nvm, cfg.clone(), clock.clone()).unwrap()
        })
        .collect();
    let net = Net::start(&servers);
    let window = Duration::from_millis(rng.random_range(2..5));
    let _windows: Vec<_> = servers.iter().map(|s| s.spawn_windows(window)).collect();
    let client_cfg = ClientConfig {
        report_every: rng.random_range(2..8),
        lock_timeout: Duration::from_secs(20),
        ..ClientConfig::default()
    };
    let client = |id: u64| {
        GengarClient::new(net.endpoint(id), id, client_cfg.clone(), clock.clone()).unwrap()
    };
    let setup = client(100);
    // Objects on both servers (alloc picks the server with the most free NVM).
    let objs: Vec<GlobalAddr> = (0..OBJECTS).map(|_| setup.alloc(64).unwrap()).collect();
    let fillers: Vec<GlobalAddr> = (0..FILLERS)
        .map(|_| setup.alloc(FILLER_BYTES).unwrap())
        .collect();
    let stop = AtomicBool::new(false);
    let delay = rng.random_bool(0.5).then(|| {
        (
            NodeId(rng.random_range(0..SERVERS)),
            Duration::from_micros(rng.random_range(100..3000)),
            rng.random_range(20..200),
        )
    });
    let clock_ticks = AtomicU64::new(0);
    let t0 = Instant::now();
    let logs: Vec<(Vec<Event>, Covered)> = std::thread::scope(|s| {
        let (fillers, stop, filler_client) = (&fillers, &stop, &client);
        s.spawn(move || {
            let c = filler_client(50);
            let mut frng = ChaCha8Rng::seed_from_u64(seed ^ 0xF111);
            while !stop.load(Ordering::Relaxed) {
                // Skewed, so some fillers are hotter than the shared objects.
                let i = frng
                    .random_range(0..FILLERS)
                    .min(frng.random_range(0..FILLERS));
                c.read(fillers[i]).unwrap();
            }
        });
        // Let the fillers take the DRAM buffers first: the shared objects then get in only
        // by evicting some.
        let promoted = || {
            servers
                .iter()
                .map(|s| s.stats().promotions.load(Ordering::Relaxed))
                .sum::<u64>()
        };
        let warm = Instant::now();
        while promoted() < WARM_PROMOTIONS && warm.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(1));
        }
        if let (Some((server, by, count)), Net::Sim(cluster)) = (delay, &net) {
            cluster.delay(Some(server), by, Some(count));
        }
        let hs: Vec<_> = (0..THREADS)
            .map(|t| {
                let (objs, ticks, client) = (&objs, &clock_ticks, &client);
                let mut trng = ChaCha8Rng::seed_from_u64(seed * 1000 + t);
                s.spawn(move || {
                    let c = client(t + 1);
                    let mut events = Vec::new();
                    let mut cov = Covered::default();
                    for i in 0..OPS {
                        let k = trng.random_range(0..OBJECTS);
                        let o = objs[k];
                        let new = (t + 1) << 32 | (i as u64 + 1);
                        let kind = match trng.random_range(0..10) {
                            // Reads dominate, so objects get hot.
                            0..=3 => Kind::Read,
                            4 => Kind::LockedRead,
                            5 | 6 => Kind::Write {
                                proxied: trng.random_bool(0.5),
                            },
                            _ => Kind::Rmw {
                                proxied: trng.random_bool(0.5),
                            },
                        };
                        let ctx = || format!("seed {seed}: thread {t} op {i} {kind:?} on {o}");
                        let start = ticks.fetch_add(1, Ordering::SeqCst);
                        let read = |c: &GengarClient| {
                            let b = c
                                .read_at(o, 0, 8)
                                .unwrap_or_else(|e| panic!("{}: {e}", ctx()));
                            Some(b)
                        };
                        let write = |c: &GengarClient, proxied: bool| {
                            if proxied {
                                c.write_proxied(o, 0, &val(new)).map(drop)
                            } else {
                                c.write(o, 0, &val(new))
                            }
                            .unwrap_or_else(|e| panic!("{}: {e}", ctx()));
                        };
                        let (call, ret) = match kind {
                            Kind::Read => {
                                let r = read(&c);
                                cov.unlocked_reads += 1;
                                cov.cached_reads += usize::from(c.cached_in_dram(o));
                                (Call::Get, Ret::Value(r))
                            }
                            Kind::LockedRead => {
                                c.lock(o).unwrap_or_else(|e| panic!("{}: {e}", ctx()));
                                let r = read(&c);
                                c.unlock(o).unwrap_or_else(|e| panic!("{}: {e}", ctx()));
                                (Call::Get, Ret::Value(r))
                            }
                            Kind::Write { proxied } => {
                                c.lock(o).unwrap_or_else(|e| panic!("{}: {e}", ctx()));
                                write(&c, proxied);
                                c.unlock(o).unwrap_or_else(|e| panic!("{}: {e}", ctx()));
                                cov.proxied_writes += usize::from(proxied);
                                (Call::Put(val(new)), Ret::Ok)
                            }
                            Kind::Rmw { proxied } => {
                                c.lock(o).unwrap_or_else(|e| panic!("{}: {e}", ctx()));
                                let old = read(&c);
                                write(&c, proxied);
                                c.unlock(o).unwrap_or_else(|e| panic!("{}: {e}", ctx()));
                                cov.proxied_writes += usize::from(proxied);
                                cov.rmws += 1;
                                (Call::Swap(val(new)), Ret::Value(old))
                            }
                        };
                        let end = ticks.fetch_add(1, Ordering::SeqCst);
                        events.push(Event {
                            key: val(k as u64),
                            call,
                            ret: Some(ret),
                            start,
                            end,
                        });
                        cov.ops += 1;
                    }
                    c.flush().unwrap();
                    (events, cov)
                })
            })
            .collect();
        let logs = hs.into_iter().map(|h| h.join().unwrap()).collect();
        stop.store(true, Ordering::Relaxed);
        logs
    });
    let elapsed = t0.elapsed();
    // Objects start zero-filled.
    let initial: HashMap<Vec<u8>, Vec<u8>> =
        (0..OBJECTS).map(|k| (val(k as u64), val(0))).collect();
    let history: Vec<Event> = logs.iter().flat_map(|(e, _)| e.clone()).collect();
    if let Err(v) = check(&history, &initial) {
        panic!(
            "seed {seed}: Gengar history not linearizable (registers are objects by index, \
             values are (thread + 1) << 32 | (op + 1), little-endian) after {elapsed:?}: {v}\n\
             replay: {}",
            replay(seed)
        );
    }
    let mut total = Covered::default();
    for (_, c) in &logs {
        total.ops += c.ops;
        total.unlocked_reads += c.unlocked_reads;
        total.cached_reads += c.cached_reads;
        total.proxied_writes += c.proxied_writes;
        total.rmws += c.rmws;
    }
    for s in &servers {
        total.promotions += s.stats().promotions.load(Ordering::Relaxed);
        total.evictions += s.stats().evictions.load(Ordering::Relaxed);
    }
    total
}

#[test]
fn gengar_shared_object_histories_are_linearizable() {
    let asked = env_u64("DMKIT_GENGAR_LIN_SEEDS");
    let first = env_u64("DMKIT_GENGAR_LIN_FIRST_SEED").unwrap_or(1);
    let t0 = Instant::now();
    let mut all = Covered::default();
    // Six seeds by default, and more (up to 30) while the paths below are not all taken:
    // promotions come from the servers' timed windows, which a loaded machine (CI running
    // other tests beside this one) can starve in a few short histories. Every history run
    // is checked either way.
    let mut seeds = 0;
    let covered = |a: &Covered| {
        a.cached_reads > 0
            && a.cached_reads < a.unlocked_reads
            && a.proxied_writes > 0
            && a.rmws > 0
            && a.promotions > 0
            && a.evictions > 0
    };
    // Real verbs on an emulated device are slow: fewer histories there (but room for more
    // while the DRAM path is not taken: one CI run saw 8 seeds in a slow guest without a read
    // under a DRAM lease — the hot fillers kept the buffer).
    let (least, most) = if dmkit_tests::procs::backend() == "rdma" {
        (3, 16)
    } else {
        (6, 30)
    };
    while match asked {
        Some(n) => seeds < n,
        None => seeds < least || (!covered(&all) && seeds < most),
    } {
        let seed = first + seeds;
        seeds += 1;
        let c = run_seed(seed);
        all.ops += c.ops;
        all.unlocked_reads += c.unlocked_reads;
        all.cached_reads += c.cached_reads;
        all.proxied_writes += c.proxied_writes;
        all.rmws += c.rmws;
        all.promotions += c.promotions;
        all.evictions += c.evictions;
    }
    eprintln!(
        "{seeds} Gengar histories linearizable (seeds {first}..{}) in {:.1?}: {all:?}",
        first + seeds,
        t0.elapsed()
    );
    // The paths this test is about were taken.
    assert!(
        all.cached_reads > 0,
        "no read was served from DRAM: {all:?}"
    );
    assert!(
        all.cached_reads < all.unlocked_reads,
        "no read was served from NVM: {all:?}"
    );
    assert!(all.proxied_writes > 0 && all.rmws > 0, "{all:?}");
    assert!(all.promotions > 0 && all.evictions > 0, "{all:?}");
}
