//! Gengar under concurrency and restarts: locked updates from many clients, promotion /
//! eviction / free churn under concurrent readers (with injected network delays), a server
//! reopened on its pool file, and the bad-input errors not covered in `gengar.rs`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use dmkit_gengar::{ClientConfig, Error, GengarClient, GengarServer, GlobalAddr, ServerConfig};
use dmkit_lease::{Clock, SystemClock, TunerConfig};
use dmkit_pmem_pool::{Pool, PoolOptions};
use dmkit_verbs::NodeId;
use dmkit_verbs::sim::{SimCluster, SimConfig};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

fn clock() -> Arc<dyn Clock> {
    Arc::new(SystemClock::new())
}

fn leases(min_ms: u64, max_ms: u64) -> TunerConfig {
    TunerConfig {
        initial_nvm: Duration::from_millis(min_ms),
        initial_dram: Duration::from_millis(min_ms),
        min: Duration::from_millis(min_ms),
        max: Duration::from_millis(max_ms),
        ..TunerConfig::default()
    }
}

fn sim(servers: u16, cfg: &ServerConfig) -> (SimCluster, Vec<Arc<GengarServer>>) {
    let cluster = SimCluster::new(SimConfig::default());
    let servers = (0..servers)
        .map(|i| {
            let nvm =
                Pool::create_dram(16 << 20, PoolOptions::default().block_size(64 << 10)).unwrap();
            let s = GengarServer::new(NodeId(i), nvm, cfg.clone(), clock()).unwrap();
            cluster.add_node(s.node().clone());
            s
        })
        .collect();
    (cluster, servers)
}

fn client(cluster: &SimCluster, id: u64) -> GengarClient {
    GengarClient::new(
        cluster.endpoint(id).unwrap(),
        id,
        ClientConfig {
            report_every: 64,
            ..ClientConfig::default()
        },
        clock(),
    )
    .unwrap()
}

#[test]
fn locked_increments_from_many_clients_lose_no_update() {
    const THREADS: u64 = 4;
    const ROUNDS: u64 = 150;
    const OBJECTS: usize = 6;
    const COUNTERS: usize = 4;
    let cfg = ServerConfig {
        dram_bytes: 1 << 20,
        min_hot_count: 1,
        tuner: leases(2, 10),
        ..ServerConfig::default()
    };
    let (cluster, servers) = sim(2, &cfg);
    // The windows promote and evict while the clients update (write-through, leases).
    let _w: Vec<_> = servers
        .iter()
        .map(|s| s.spawn_windows(Duration::from_millis(3)))
        .collect();
    let setup = client(&cluster, 100);
    let objs: Vec<GlobalAddr> = (0..OBJECTS).map(|_| setup.alloc(256).unwrap()).collect();
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let (cluster, objs) = (&cluster, &objs);
            s.spawn(move || {
                let c = client(cluster, t + 1);
                let mut rng = ChaCha8Rng::seed_from_u64(t);
                for i in 0..ROUNDS {
                    let o = objs[(i as usize + t as usize) % OBJECTS];
                    let k = rng.random_range(0..COUNTERS);
                    c.lock(o).unwrap();
                    let b = c.read_at(o, k * 8, 8).unwrap();
                    let v = u64::from_le_bytes(b.try_into().unwrap());
                    c.write_proxied(o, k * 8, &(v + 1).to_le_bytes()).unwrap();
                    // A second counter, written synchronously, so both modes interleave.
                    let b = c.read_at(o, 128, 8).unwrap();
                    let w = u64::from_le_bytes(b.try_into().unwrap());
                    if i % 2 == 0 {
                        c.write(o, 128, &(w + 1).to_le_bytes()).unwrap();
                    } else {
                        c.write_proxied(o, 128, &(w + 1).to_le_bytes()).unwrap();
                    }
                    c.unlock(o).unwrap();
                }
                c.flush().unwrap();
            });
        }
    });
    let check = client(&cluster, 200);
    let mut total = 0;
    let mut second = 0;
    for o in &objs {
        let b = check.read(*o).unwrap();
        for k in 0..COUNTERS {
            total += u64::from_le_bytes(b[k * 8..k * 8 + 8].try_into().unwrap());
        }
        second += u64::from_le_bytes(b[128..136].try_into().unwrap());
    }
    assert_eq!(total, THREADS * ROUNDS, "lost updates");
    assert_eq!(second, THREADS * ROUNDS, "lost updates (second counters)");
}

/// Object body: [id u64][fill bytes derived from id].
fn body(id: u64, size: usize) -> Vec<u8> {
    let mut b = vec![0u8; size];
    b[..8].copy_from_slice(&id.to_le_bytes());
    for (i, x) in b[8..].iter_mut().enumerate() {
        *x = (id.wrapping_mul(31).wrapping_add(i as u64 * 7) % 251) as u8;
    }
    b
}

#[test]
fn churn_under_readers_never_exposes_stale_or_foreign_data() {
    const SLOTS: usize = 64;
    const SIZE: usize = 2040;
    let cfg = ServerConfig {
        // 1 MiB holds about 480 such objects: make it hold fewer by using bigger ones below.
        dram_bytes: 1 << 20,
        min_hot_count: 1,
        hysteresis: 0.0,
        tuner: leases(1, 4),
        ..ServerConfig::default()
    };
    let (cluster, servers) = sim(2, &cfg);
    let _w: Vec<_> = servers
        .iter()
        .map(|s| s.spawn_windows(Duration::from_millis(2)))
        .collect();
    let owner = client(&cluster, 1);
    let next_id = AtomicU64::new(1);
    let table: Vec<parking_lot::Mutex<(GlobalAddr, u64)>> = (0..SLOTS)
        .map(|_| {
            let id = next_id.fetch_add(1, Ordering::Relaxed);
            let a = owner.alloc(SIZE).unwrap();
            owner.write(a, 0, &body(id, SIZE)).unwrap();
            parking_lot::Mutex::new((a, id))
        })
        .collect();
    let stop = AtomicBool::new(false);
    let deadline = Instant::now() + Duration::from_millis(1500);
    let (reads, freed_reads, churned) = (AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0));
    std::thread::scope(|s| {
        for r in 0..3u64 {
            let (cluster, table, stop) = (&cluster, &table, &stop);
            let (reads, freed_reads) = (&reads, &freed_reads);
            s.spawn(move || {
                let c = client(cluster, 10 + r);
                let mut rng = ChaCha8Rng::seed_from_u64(r);
                while !stop.load(Ordering::Relaxed) {
                    // Skewed: a few hot slots get promoted, the rest churn through NVM.
                    let k = if rng.random_bool(0.7) {
                        rng.random_range(0..8)
                    } else {
                        rng.random_range(0..SLOTS)
                    };
                    let (addr, id) = *table[k].lock();
                    match c.read(addr) {
                        Ok(b) => {
                            let got = u64::from_le_bytes(b[..8].try_into().unwrap());
                            assert_eq!(got, id, "{addr} returned object {got}'s data");
                            assert!(b == body(id, SIZE), "{addr}: torn or stale data");
                            reads.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(Error::Freed(_)) => {
                            freed_reads.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(e) => panic!("read {addr}: {e}"),
                    }
                }
            });
        }
        // The churner: frees objects (hot ones too) and re-allocates their slots with new
        // data; delays some verbs on the way so reads and lease grants straddle expiries.
        let (cluster, table, stop, next_id, churned) =
            (&cluster, &table, &stop, &next_id, &churned);
        s.spawn(move || {
            let c = client(cluster, 2);
            let mut rng = ChaCha8Rng::seed_from_u64(99);
            while Instant::now() < deadline {
                let k = rng.random_range(0..SLOTS);
                let (old, _) = *table[k].lock();
                if rng.random_bool(0.3) {
                    cluster.delay(Some(old.server), Duration::from_millis(3), Some(2));
                }
                c.free(old).unwrap();
                let id = next_id.fetch_add(1, Ordering::Relaxed);
                let a = c.alloc(SIZE).unwrap();
                c.write(a, 0, &body(id, SIZE)).unwrap();
                *table[k].lock() = (a, id);
                churned.fetch_add(1, Ordering::Relaxed);
            }
            stop.store(true, Ordering::Relaxed);
        });
    });
    let promotions: u64 = servers
        .iter()
        .map(|s| s.stats().promotions.load(Ordering::Relaxed))
        .sum();
    assert!(reads.load(Ordering::Relaxed) > 100, "too few reads");
    assert!(churned.load(Ordering::Relaxed) > 20, "too little churn");
    assert!(promotions > 0, "nothing was promoted");
    // A freed slot is re-used, and old addresses keep failing cleanly.
    let (a, id) = *table[0].lock();
    assert_eq!(owner.read(a).unwrap(), body(id, SIZE));
}

#[test]
fn a_server_reopened_on_its_pool_file_keeps_every_confirmed_object() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("gengar.pool");
    let cfg = ServerConfig {
        dram_bytes: 1 << 20,
        min_hot_count: 1,
        ..ServerConfig::default()
    };
    let mut kept: Vec<(GlobalAddr, Vec<u8>)> = Vec::new();
    {
        let nvm =
            Pool::create(&path, 8 << 20, PoolOptions::default().block_size(64 << 10)).unwrap();
        let server = GengarServer::new(NodeId(0), nvm, cfg.clone(), clock()).unwrap();
        let cluster = SimCluster::new(SimConfig::default());
        cluster.add_node(server.node().clone());
        let c = client(&cluster, 1);
        let mut confirms = Vec::new();
        for i in 0..200usize {
            let size = [24, 200, 1000, 5000][i % 4];
            let a = c.alloc(size).unwrap();
            let data: Vec<u8> = (0..size).map(|j| (i * 13 + j) as u8).collect();
            confirms.push(c.write_proxied(a, 0, &data).unwrap());
            kept.push((a, data));
        }
        // Some objects are hot and cached in DRAM when the server goes away (write-through:
        // NVM has their data too); some are freed.
        for _ in 0..50 {
            c.read(kept[3].0).unwrap();
        }
        c.report_hot().unwrap();
        server.run_window();
        c.write(kept[3].0, 0, b"written while cached").unwrap();
        kept[3].1[..20].copy_from_slice(b"written while cached");
        for c in &confirms {
            c.wait().unwrap();
        }
        let freed = kept.remove(10).0;
        c.free(freed).unwrap();
        kept.push((freed, Vec::new()));
        drop(c);
        cluster.remove_node(NodeId(0));
    }
    let nvm = Pool::open(&path).unwrap();
    let server = GengarServer::new(NodeId(0), nvm, cfg, clock()).unwrap();
    let cluster = SimCluster::new(SimConfig::default());
    cluster.add_node(server.node().clone());
    let c = client(&cluster, 7);
    for (a, data) in &kept {
        if data.is_empty() {
            assert!(matches!(c.read(*a), Err(Error::Freed(_))), "{a} was freed");
        } else {
            assert_eq!(&c.read(*a).unwrap(), data, "object {a} after the restart");
        }
    }
    // The allocator recovered too: new objects never overlap kept ones.
    let fresh: Vec<GlobalAddr> = (0..50).map(|_| c.alloc(1000).unwrap()).collect();
    for f in &fresh {
        c.write(*f, 0, &[0xee; 1000]).unwrap();
    }
    for (a, data) in kept.iter().filter(|(_, d)| !d.is_empty()) {
        assert_eq!(
            &c.read(*a).unwrap(),
            data,
            "object {a} after new allocations"
        );
    }
}

#[test]
fn bad_addresses_and_lock_misuse_are_clear_errors() {
    let cfg = ServerConfig {
        tuner: leases(100, 300),
        ..ServerConfig::default()
    };
    let (cluster, _servers) = sim(1, &cfg);
    let c = client(&cluster, 1);
    let a = c.alloc(100).unwrap();
    // Past the object's end, by every path.
    assert!(matches!(
        c.read_at(a, 100, 1),
        Err(Error::OutOfObject { .. })
    ));
    assert!(matches!(
        c.read_at(a, usize::MAX, 2),
        Err(Error::OutOfObject { .. })
    ));
    assert!(matches!(
        c.write_proxied(a, 90, &[0; 11]),
        Err(Error::OutOfObject { .. })
    ));
    let e = c.write(a, 99, &[0; 2]).unwrap_err();
    assert!(e.to_string().contains("do not fit"), "{e}");
    // Unknown servers.
    let mut elsewhere = a;
    elsewhere.server = NodeId(9);
    assert!(matches!(
        c.write(elsewhere, 0, b"x"),
        Err(Error::UnknownServer(9))
    ));
    assert!(matches!(
        c.write_proxied(elsewhere, 0, b"x"),
        Err(Error::UnknownServer(9))
    ));
    assert!(matches!(c.free(elsewhere), Err(Error::UnknownServer(9))));
    assert!(matches!(c.lock(elsewhere), Err(Error::UnknownServer(9))));
    assert!(matches!(c.unlock(elsewhere), Err(Error::UnknownServer(9))));
    // Never-allocated addresses: inside an object, beyond the pool, a wrong generation.
    for bogus in [
        GlobalAddr {
            offset: a.offset + 16,
            ..a
        },
        GlobalAddr {
            offset: 1 << 40,
            ..a
        },
        GlobalAddr {
            generation: a.generation + 5,
            ..a
        },
    ] {
        let e = c.read(bogus).unwrap_err();
        assert!(matches!(e, Error::Freed(_)), "{bogus}: {e}");
        assert!(e.to_string().contains("never allocated"), "{e}");
        assert!(matches!(c.write(bogus, 0, b"x"), Err(Error::Freed(_))));
        assert!(matches!(c.free(bogus), Err(Error::Freed(_))));
    }
    // Double free, and use after free.
    c.write(a, 0, b"live").unwrap();
    c.free(a).unwrap();
    assert!(matches!(c.free(a), Err(Error::Freed(_))));
    assert!(matches!(c.read(a), Err(Error::Freed(_))));
    assert!(matches!(c.write_proxied(a, 0, b"x"), Err(Error::Freed(_))));
    // Unlock without lock, and twice.
    let b = c.alloc(8).unwrap();
    assert!(matches!(c.unlock(b), Err(Error::NotLockHolder(_))));
    c.lock(b).unwrap();
    c.unlock(b).unwrap();
    // Not re-entrant: through one client (shared by threads or tasks), a held lock is not
    // taken again — the second locker waits for the unlock, here past the lock timeout.
    let short = ClientConfig {
        lock_timeout: Duration::from_millis(100),
        ..ClientConfig::default()
    };
    let shared = GengarClient::new(cluster.endpoint(2).unwrap(), 2, short, clock()).unwrap();
    shared.lock(b).unwrap();
    let t = Instant::now();
    assert!(
        matches!(shared.lock(b), Err(Error::LockTimeout(_))),
        "a held lock is not taken twice through one client"
    );
    assert!(t.elapsed() >= Duration::from_millis(100));
    shared.unlock(b).unwrap();
    assert!(matches!(c.unlock(b), Err(Error::NotLockHolder(_))));
    // The pool is unharmed by all of that.
    c.write(b, 0, b"12345678").unwrap();
    assert_eq!(&c.read(b).unwrap(), b"12345678");
}

/// One client shared by many operations in flight at once, from one thread (as FUSEE's
/// coroutines share theirs), over tcp: locked increments lose nothing, proxied and direct
/// writes read back, and nothing is left in flight.
#[test]
fn one_client_keeps_many_operations_in_flight_over_tcp() {
    use dmkit_verbs::tcp::{TcpConnector, TcpServer, TcpServerConfig};
    const TASKS: usize = 48;
    const ROUNDS: usize = 5;
    let nvm = Pool::create_dram(16 << 20, PoolOptions::default().block_size(64 << 10)).unwrap();
    let server = GengarServer::new(NodeId(0), nvm, ServerConfig::default(), clock()).unwrap();
    let tcp = TcpServer::start(
        "127.0.0.1:0",
        server.node().clone(),
        TcpServerConfig::default(),
    )
    .unwrap();
    let ep = dmkit_verbs::Endpoint::connect(
        &TcpConnector::default(),
        &[(NodeId(0), tcp.local_addr().to_string())],
    )
    .unwrap();
    let c = GengarClient::new(ep, 7, ClientConfig::default(), clock()).unwrap();
    let counter = c.alloc(8).unwrap();
    let c = &c;
    let outcomes = dmkit_verbs::block_on(dmkit_verbs::join_all(
        (0..TASKS)
            .map(|t| async move {
                let own = c.alloc_async(64).await?;
                for r in 0..ROUNDS {
                    let v = format!("task {t} round {r}");
                    if r % 2 == 0 {
                        c.write_async(own, 0, v.as_bytes()).await?;
                    } else {
                        c.write_proxied_async(own, 0, v.as_bytes())
                            .await?
                            .confirmed()
                            .await?;
                    }
                    let back = c.read_at_async(own, 0, v.len()).await?;
                    assert_eq!(back, v.as_bytes());
                    c.lock_async(counter).await?;
                    let n = u64::from_le_bytes(
                        c.read_async(counter).await?.try_into().expect("8 bytes"),
                    );
                    c.write_async(counter, 0, &(n + 1).to_le_bytes()).await?;
                    c.unlock_async(counter).await?;
                }
                c.free_async(own).await
            })
            .collect(),
    ));
    for o in outcomes {
        o.unwrap();
    }
    let total = u64::from_le_bytes(c.read(counter).unwrap().try_into().unwrap());
    assert_eq!(total, (TASKS * ROUNDS) as u64);
    c.flush().unwrap();
    assert_eq!(c.endpoint().in_flight(), 0);
}
