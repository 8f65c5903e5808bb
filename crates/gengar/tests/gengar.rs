//! Gengar end to end on the sim backend (and once over tcp): round trips, write-through,
//! promotion and eviction, leases guarding free, proxied writes, locks, placement.

use std::sync::Arc;
use std::time::{Duration, Instant};

use dmkit_gengar::{ClientConfig, Error, GengarClient, GengarServer, ServerConfig, tags};
use dmkit_lease::{Clock, SystemClock, TunerConfig};
use dmkit_pmem_pool::{Pool, PoolOptions};
use dmkit_verbs::NodeId;
use dmkit_verbs::sim::{SimCluster, SimConfig};

fn clock() -> Arc<dyn Clock> {
    Arc::new(SystemClock::new())
}

/// Leases long enough that a loaded test machine does not expire them between two calls.
fn long_leases() -> ServerConfig {
    ServerConfig {
        tuner: TunerConfig {
            initial_nvm: Duration::from_millis(300),
            initial_dram: Duration::from_millis(300),
            min: Duration::from_millis(100),
            max: Duration::from_millis(600),
            ..TunerConfig::default()
        },
        ..ServerConfig::default()
    }
}

fn short_leases() -> ServerConfig {
    ServerConfig {
        tuner: TunerConfig {
            initial_nvm: Duration::from_millis(40),
            initial_dram: Duration::from_millis(40),
            min: Duration::from_millis(20),
            max: Duration::from_millis(80),
            ..TunerConfig::default()
        },
        ..ServerConfig::default()
    }
}

fn pool(mib: usize) -> Pool {
    Pool::create_dram(mib << 20, PoolOptions::default().block_size(64 << 10)).unwrap()
}

struct Setup {
    cluster: SimCluster,
    servers: Vec<Arc<GengarServer>>,
}

fn setup(n: u16, cfg: ServerConfig) -> Setup {
    let cluster = SimCluster::new(SimConfig::default());
    let servers = (0..n)
        .map(|i| {
            let s = GengarServer::new(NodeId(i), pool(8), cfg.clone(), clock()).unwrap();
            cluster.add_node(s.node().clone());
            s
        })
        .collect();
    Setup { cluster, servers }
}

impl Setup {
    fn client(&self, id: u64) -> GengarClient {
        GengarClient::new(
            self.cluster.endpoint(id).unwrap(),
            id,
            ClientConfig::default(),
            clock(),
        )
        .unwrap()
    }
}

#[test]
fn one_round_trip_with_a_valid_lease_two_without() {
    let s = setup(1, long_leases());
    let c = s.client(1);
    let a = c.alloc(100).unwrap();
    let rt = |t| c.endpoint().stats().tag(t).round_trips;
    c.write(a, 0, b"abc").unwrap();
    assert_eq!(rt(tags::WRITE), 2, "first write: lease + write");
    c.write(a, 3, b"def").unwrap();
    assert_eq!(rt(tags::WRITE), 3, "second write: one round trip");
    let before = rt(tags::READ);
    assert_eq!(&c.read_at(a, 0, 6).unwrap(), b"abcdef");
    assert_eq!(rt(tags::READ) - before, 1, "read with the write's lease");
    let other = s.client(2);
    assert_eq!(&other.read_at(a, 0, 6).unwrap(), b"abcdef");
    assert_eq!(other.endpoint().stats().tag(tags::READ).round_trips, 2);
    assert_eq!(&other.read_at(a, 0, 6).unwrap(), b"abcdef");
    assert_eq!(other.endpoint().stats().tag(tags::READ).round_trips, 3);
}

#[test]
fn hot_objects_are_promoted_with_their_data_and_writes_go_through() {
    let s = setup(1, short_leases());
    let c = s.client(1);
    let hot = c.alloc(256).unwrap();
    let cold = c.alloc(256).unwrap();
    c.write(hot, 0, &[7; 256]).unwrap();
    c.write(cold, 0, &[9; 256]).unwrap();
    for _ in 0..200 {
        c.read(hot).unwrap();
    }
    c.read(cold).unwrap();
    c.report_hot().unwrap();
    let (promoted, _) = s.servers[0].run_window();
    // The hot object, and the one read once: lukewarm, it takes DRAM that is free (it would
    // not displace a resident; the cache crate's admission tests show that).
    assert_eq!(promoted, 2);
    assert!(s.servers[0].is_cached(hot.offset));
    assert!(s.servers[0].is_cached(cold.offset));
    // After its old lease expires, the client is pointed at the DRAM copy, which holds the data.
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(c.read(hot).unwrap(), vec![7; 256]);
    assert!(c.cached_in_dram(hot));
    // Write-through: both copies change.
    c.write(hot, 10, &[1; 16]).unwrap();
    let nvm = s.servers[0].nvm_region();
    let raw = c.endpoint().read("t", nvm.at(hot.offset + 10), 16).unwrap();
    assert_eq!(
        raw,
        vec![1; 16],
        "the NVM copy missed a write to a cached object"
    );
    assert_eq!(&c.read_at(hot, 10, 16).unwrap(), &[1; 16]);
}

#[test]
fn admission_counts_the_dram_slots_objects_take() {
    // The smallest DRAM buffer (1 MiB in 64 KiB blocks). Objects of 33 000 bytes take a whole
    // 64 KiB slot each there: as many fit as there are free blocks, not twice as many, as
    // their payloads would suggest.
    let cfg = ServerConfig {
        dram_bytes: 1 << 20,
        hysteresis: 0.0,
        ..short_leases()
    };
    let s = setup(1, cfg);
    let fit = (s.servers[0].free().1 / (64 << 10)) as usize;
    assert!(fit >= 4, "{fit}");
    let c = s.client(1);
    let objs: Vec<_> = (0..2 * fit).map(|_| c.alloc(33_000).unwrap()).collect();
    for _ in 0..3 {
        for (i, o) in objs.iter().enumerate() {
            for _ in 0..(10 + i) {
                c.read_at(*o, 0, 8).unwrap();
            }
        }
        c.report_hot().unwrap();
        s.servers[0].run_window();
    }
    let st = s.servers[0].stats();
    assert_eq!(s.servers[0].cached_objects(), fit);
    assert_eq!(
        st.promotions_skipped
            .load(std::sync::atomic::Ordering::Relaxed),
        0,
        "the policy planned promotions the DRAM pool had no room for"
    );
    for o in &objs[fit..] {
        assert!(s.servers[0].is_cached(o.offset), "the hottest are cached");
    }
}

#[test]
fn evicted_objects_keep_every_write_made_while_cached() {
    // A DRAM buffer of 1 MiB in 64 KiB blocks holds 16 objects of 60 KB.
    let cfg = ServerConfig {
        dram_bytes: 1 << 20,
        hysteresis: 0.0,
        ..short_leases()
    };
    let s = setup(1, cfg);
    let c = s.client(1);
    let objs: Vec<_> = (0..32).map(|_| c.alloc(60_000).unwrap()).collect();
    let heat = |set: &[dmkit_gengar::GlobalAddr], rounds: usize| {
        for _ in 0..rounds {
            for o in set {
                c.read_at(*o, 0, 8).unwrap();
            }
        }
        c.report_hot().unwrap();
        s.servers[0].run_window()
    };
    let (first, second) = objs.split_at(16);
    let (promoted, _) = heat(first, 20);
    assert!(promoted >= 8, "promoted {promoted}");
    std::thread::sleep(Duration::from_millis(100));
    // Write to cached objects (write-through), then make the other half hotter.
    for (i, o) in first.iter().enumerate() {
        c.write(*o, 100, &[i as u8 + 1; 64]).unwrap();
    }
    let mut evicted = 0;
    for _ in 0..6 {
        evicted += heat(second, 60).1;
    }
    assert!(evicted >= 8, "evicted {evicted}");
    std::thread::sleep(Duration::from_millis(100));
    for (i, o) in first.iter().enumerate() {
        assert_eq!(
            c.read_at(*o, 100, 64).unwrap(),
            vec![i as u8 + 1; 64],
            "object {i}"
        );
    }
    assert!(
        s.servers[0]
            .stats()
            .evictions
            .load(std::sync::atomic::Ordering::Relaxed)
            >= 8
    );
}

#[test]
fn free_waits_for_leases_and_stale_addresses_never_read_new_data() {
    let s = setup(1, short_leases());
    let a_client = s.client(1);
    let b_client = s.client(2);
    let obj = a_client.alloc(64).unwrap();
    a_client.write(obj, 0, &[5; 64]).unwrap();
    assert!(a_client.has_lease(obj));
    let t = Instant::now();
    b_client.free(obj).unwrap();
    assert!(
        t.elapsed() >= Duration::from_millis(15),
        "free returned while another client's lease was valid ({:?})",
        t.elapsed()
    );
    assert!(!a_client.has_lease(obj));
    assert!(matches!(a_client.read(obj), Err(Error::Freed(_))));
    // The slot is reused by a new object: the old address must not see its bytes.
    let mut reused = None;
    for _ in 0..64 {
        let n = b_client.alloc(64).unwrap();
        if n.offset == obj.offset {
            reused = Some(n);
            break;
        }
    }
    let n = reused.expect("the freed slot is reused");
    assert_ne!(n.generation, obj.generation);
    b_client.write(n, 0, &[8; 64]).unwrap();
    assert!(matches!(a_client.read(obj), Err(Error::Freed(_))));
    assert!(matches!(a_client.write(obj, 0, b"x"), Err(Error::Freed(_))));
    assert!(matches!(b_client.free(obj), Err(Error::Freed(_))));
    assert_eq!(a_client.read(n).unwrap(), vec![8; 64]);
}

#[test]
fn proxied_writes_confirm_after_the_data_is_visible_and_unlock_waits_for_them() {
    let s = setup(1, long_leases());
    let writer = s.client(1);
    let reader = s.client(2);
    let obj = writer.alloc(4096).unwrap();
    writer.lock(obj).unwrap();
    // A slow network: the confirm is not immediate.
    s.cluster
        .delay(Some(NodeId(0)), Duration::from_millis(30), Some(1));
    let t = Instant::now();
    let c = writer.write_proxied(obj, 0, &[3; 4096]).unwrap();
    assert!(
        t.elapsed() < Duration::from_millis(25),
        "proxied write waited for the network"
    );
    assert!(!c.is_confirmed());
    // Another client waits for the lock, then must see the write.
    let r = std::thread::spawn(move || {
        reader.lock(obj).unwrap();
        let v = reader.read(obj).unwrap();
        reader.unlock(obj).unwrap();
        v
    });
    std::thread::sleep(Duration::from_millis(5));
    writer.unlock(obj).unwrap();
    assert!(
        c.is_confirmed(),
        "unlock returned before the object's confirms"
    );
    assert_eq!(r.join().unwrap(), vec![3; 4096]);
    writer.flush().unwrap();
}

#[test]
fn locks_exclude_and_time_out() {
    let s = setup(1, long_leases());
    let a = s.client(1);
    let b = GengarClient::new(
        s.cluster.endpoint(2).unwrap(),
        2,
        ClientConfig {
            lock_timeout: Duration::from_millis(50),
            ..ClientConfig::default()
        },
        clock(),
    )
    .unwrap();
    let obj = a.alloc(8).unwrap();
    a.lock(obj).unwrap();
    assert!(matches!(b.lock(obj), Err(Error::LockTimeout(_))));
    assert!(matches!(b.unlock(obj), Err(Error::NotLockHolder(_))));
    a.unlock(obj).unwrap();
    b.lock(obj).unwrap();
    b.unlock(obj).unwrap();
}

#[test]
fn new_objects_go_to_the_server_with_the_most_free_nvm() {
    let s = setup(2, long_leases());
    let c = s.client(1);
    // Fill server 0 somewhat, through another client.
    let filler = s.client(9);
    let mut big = Vec::new();
    while big.len() < 40 {
        let a = filler.alloc(60_000).unwrap();
        big.push(a);
    }
    let on0 = big.iter().filter(|a| a.server == NodeId(0)).count();
    let on1 = big.len() - on0;
    assert!(
        on0.abs_diff(on1) <= 2,
        "placement unbalanced: {on0} vs {on1}"
    );
    let _ = c.alloc(64).unwrap();
    let free = c.free_nvm();
    assert_eq!(free.len(), 2);
}

#[test]
fn bad_requests_are_errors() {
    let s = setup(1, long_leases());
    let c = s.client(1);
    let a = c.alloc(16).unwrap();
    assert!(matches!(
        c.read_at(a, 10, 10),
        Err(Error::OutOfObject { .. })
    ));
    assert!(matches!(
        c.write(a, 0, &[0; 17]),
        Err(Error::OutOfObject { .. })
    ));
    assert!(c.alloc(0).is_err());
    assert!(matches!(c.alloc(1 << 30), Err(Error::OutOfSpace { .. })));
    let mut foreign = a;
    foreign.server = NodeId(7);
    assert!(matches!(c.read(foreign), Err(Error::UnknownServer(7))));
    assert_eq!(
        c.read(a).unwrap(),
        vec![0; 16],
        "new objects are zero-filled"
    );
}

#[test]
fn works_over_tcp() {
    use dmkit_verbs::Endpoint;
    use dmkit_verbs::tcp::{TcpConnector, TcpServer, TcpServerConfig};
    let server = GengarServer::new(NodeId(0), pool(8), long_leases(), clock()).unwrap();
    let tcp = TcpServer::start(
        "127.0.0.1:0",
        server.node().clone(),
        TcpServerConfig::default(),
    )
    .unwrap();
    let ep = Endpoint::connect(
        &TcpConnector::default(),
        &[(NodeId(0), tcp.local_addr().to_string())],
    )
    .unwrap();
    let c = GengarClient::new(ep, 1, ClientConfig::default(), clock()).unwrap();
    let a = c.alloc(1000).unwrap();
    c.write(a, 0, &[4; 1000]).unwrap();
    let conf = c.write_proxied(a, 500, &[6; 500]).unwrap();
    conf.wait().unwrap();
    let mut want = vec![4; 1000];
    want[500..].fill(6);
    assert_eq!(c.read(a).unwrap(), want);
    c.free(a).unwrap();
}

#[test]
fn a_lease_past_half_is_renewed_off_the_callers_path() {
    // Leases of 400 ms: half is 200 ms.
    let fixed = Duration::from_millis(400);
    let s = setup(
        1,
        ServerConfig {
            tuner: TunerConfig {
                initial_nvm: fixed,
                initial_dram: fixed,
                min: fixed,
                max: fixed,
                ..TunerConfig::default()
            },
            ..ServerConfig::default()
        },
    );
    for early in [true, false] {
        let c = GengarClient::new(
            s.cluster.endpoint(10 + u64::from(early)).unwrap(),
            10 + u64::from(early),
            ClientConfig {
                renew_early: early,
                ..ClientConfig::default()
            },
            clock(),
        )
        .unwrap();
        let a = c.alloc(64).unwrap();
        let rt = |t| c.endpoint().stats().tag(t).round_trips;
        let t0 = Instant::now();
        let at = |ms: u64| {
            let until = t0 + Duration::from_millis(ms);
            std::thread::sleep(until.saturating_duration_since(Instant::now()));
        };
        c.read(a).unwrap();
        assert_eq!(rt(tags::READ), 2, "the first read takes the lease");
        at(250);
        c.read(a).unwrap(); // past half: posts the renewal (early) and reads
        at(270);
        c.read(a).unwrap(); // installs it
        at(450);
        c.read(a).unwrap(); // the first lease has lapsed
        if early {
            assert_eq!(rt(tags::READ), 5, "no read waited for a lease RPC");
            assert!(rt(tags::RENEW) >= 1, "renewed early");
        } else {
            assert_eq!(rt(tags::READ), 6, "the last read renewed the lease itself");
            assert_eq!(rt(tags::RENEW), 0);
        }
    }
}

#[test]
fn lapsed_leases_are_forgotten_once_a_window() {
    let s = setup(1, short_leases());
    let c = GengarClient::new(
        s.cluster.endpoint(1).unwrap(),
        1,
        ClientConfig {
            report_every: 64,
            ..ClientConfig::default()
        },
        clock(),
    )
    .unwrap();
    // 200 objects read once each: 200 leases.
    let addrs: Vec<_> = (0..200).map(|_| c.alloc(64).unwrap()).collect();
    for a in &addrs {
        c.read(*a).unwrap();
    }
    assert!(c.lease_entries() >= 100, "{}", c.lease_entries());
    // Past every lease, a window's worth of reads of one object: the lapsed ones go.
    std::thread::sleep(Duration::from_millis(200));
    for _ in 0..64 {
        c.read(addrs[0]).unwrap();
    }
    assert!(c.lease_entries() <= 2, "{} entries kept", c.lease_entries());
}
