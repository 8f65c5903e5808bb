//! `dmkit gengar-server` as a real process: bad input is one line and exit 2; objects written
//! with confirms survive SIGKILL and a restart on the same pool file; a server killed under
//! clients fails only its objects, its clients reconnect when it is back and no confirmed
//! write is lost; hot reads from a DRAM copy take one round trip; leases expire; locks hand
//! proxied writes to the next holder; promotion and eviction while clients read.
//!
//! Every server and client runs on the tests' backend: tcp on loopback, or rdma with
//! `DMKIT_TEST_BACKEND=rdma` inside the SoftRoCE guest (`.ci/softroce-gengar.sh` runs them
//! there with `DMKIT_TEST_BIN` naming a `dmkit` built with `--features rdma`).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use dmkit_gengar::{ClientConfig, Error, GengarClient, GlobalAddr, tags};
use dmkit_lease::{Clock, SystemClock};
use dmkit_tests::procs::{Daemon, backend, connector, endpoint_for, memnode_listen, run_dmkit};
use dmkit_verbs::NodeId;
use parking_lot::Mutex;

/// A client of the servers at `addrs` (id, address), reconnecting through the shared map (a
/// restarted server listens on a new port: the test updates the map).
fn client_of(addrs: &Arc<Mutex<HashMap<NodeId, String>>>, id: u64) -> GengarClient {
    client_with(addrs, id, ClientConfig::default())
}

fn client_with(
    addrs: &Arc<Mutex<HashMap<NodeId, String>>>,
    id: u64,
    cfg: ClientConfig,
) -> GengarClient {
    let conn = connector();
    let ep = endpoint_for(conn.as_ref());
    for (node, addr) in addrs.lock().iter() {
        let c = conn.connect(addr).expect("connect to the Gengar server");
        assert_eq!(c.node(), *node);
        ep.add_connection(c);
    }
    let clock: Arc<dyn Clock> = Arc::new(SystemClock::new());
    let c = GengarClient::new(ep, id, cfg, clock).expect("a Gengar client");
    let map = addrs.clone();
    c.set_reconnect(Arc::new(move |node: NodeId| {
        let addr = map
            .lock()
            .get(&node)
            .cloned()
            .ok_or(dmkit_verbs::Error::NoSuchNode(node))?;
        conn.connect(&addr)
    }));
    c
}

fn client(addr: &str, id: u64) -> GengarClient {
    let addrs = Arc::new(Mutex::new(HashMap::from([(NodeId(4), addr.to_string())])));
    client_of(&addrs, id)
}

/// Lease durations of the tests' servers, times the defaults: on rdma (SoftRoCE under
/// emulation, where a lease RPC takes milliseconds) 20, as `bench gengar` uses there.
fn lease_scale() -> u32 {
    if backend() == "rdma" { 20 } else { 1 }
}

/// `dmkit gengar-server` on the tests' backend: id, pool file, then more flags.
fn server(id: u16, pool: &str, more: &[&str]) -> Daemon {
    server_scaled(id, pool, lease_scale(), more)
}

/// [`server`] with leases `scale` times the defaults.
fn server_scaled(id: u16, pool: &str, scale: u32, more: &[&str]) -> Daemon {
    let id = id.to_string();
    let listen = memnode_listen();
    let scale = scale.to_string();
    let mut args = vec![
        "gengar-server",
        "--backend",
        backend(),
        "--listen",
        &listen,
        "--id",
        &id,
        "--lease-scale",
        &scale,
        "--pool",
        pool,
    ];
    args.extend_from_slice(more);
    Daemon::start(&args, "serving")
}

fn one_line_error(args: &[&str], expect: &str) {
    let out = run_dmkit(args, Duration::from_secs(20));
    assert_eq!(out.status.code(), Some(2), "{args:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<_> = err.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "{args:?}: not one line: {err}");
    assert!(
        lines[0].contains(expect),
        "{args:?}: expected '{expect}' in: {}",
        lines[0]
    );
}

#[test]
fn bad_input_is_one_line_and_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let pool = dir.path().join("p");
    let pool = pool.to_str().unwrap();
    let base = ["gengar-server", "--listen", "127.0.0.1:0", "--id", "0"];
    let with = |more: &[&'static str]| -> Vec<String> {
        base.iter()
            .chain(more)
            .map(|s| s.to_string())
            .collect::<Vec<_>>()
    };
    let run = |args: Vec<String>, expect: &str| {
        let a: Vec<&str> = args.iter().map(String::as_str).collect();
        one_line_error(&a, expect);
    };
    let mut a = with(&["--dram", "1MiB", "--pool"]);
    a.push(pool.into());
    run(a, "does not exist; give --size");
    let mut a = with(&["--dram", "lots", "--size", "8MiB", "--pool"]);
    a.push(pool.into());
    run(a, "invalid size");
    let mut a = with(&[
        "--dram", "1MiB", "--size", "8MiB", "--window", "0", "--pool",
    ]);
    a.push(pool.into());
    run(a, "--window");
    one_line_error(
        &[
            "gengar-server",
            "--listen",
            "nowhere",
            "--id",
            "0",
            "--dram",
            "1MiB",
            "--size",
            "8MiB",
            "--pool",
            pool,
        ],
        "",
    );
    one_line_error(
        &["gengar-server", "--listen", "127.0.0.1:0", "--id", "0"],
        "required",
    );
    let mut a = with(&[
        "--backend",
        "sim",
        "--dram",
        "1MiB",
        "--size",
        "8MiB",
        "--pool",
    ]);
    a.push(pool.into());
    run(a, "cannot serve a Gengar server");
}

#[test]
fn confirmed_objects_survive_sigkill_and_a_restart_on_the_pool_file() {
    let dir = tempfile::tempdir().unwrap();
    let pool = dir.path().join("gengar.pool");
    let pool = pool.to_str().unwrap();
    let mut first = server(
        4,
        pool,
        &["--size", "16MiB", "--dram", "1MiB", "--window", "20"],
    );
    assert!(first.ready_line.contains("created"), "{}", first.ready_line);
    let mut kept: Vec<(GlobalAddr, Vec<u8>)> = Vec::new();
    {
        let c = client(&first.addr(), 1);
        let mut confirms = Vec::new();
        for i in 0..100usize {
            let size = [40, 300, 3000][i % 3];
            let a = c.alloc(size).unwrap();
            assert_eq!(a.server, NodeId(4));
            let data: Vec<u8> = (0..size).map(|j| (i * 7 + j * 3) as u8).collect();
            confirms.push(c.write_proxied(a, 0, &data).unwrap());
            kept.push((a, data));
        }
        // Hot reads, so some objects are in DRAM when the process dies.
        for _ in 0..3000 {
            c.read(kept[0].0).unwrap();
        }
        c.report_hot().unwrap();
        for cf in &confirms {
            cf.wait().unwrap();
        }
        let gone = kept.pop().unwrap().0;
        c.free(gone).unwrap();
        kept.push((gone, Vec::new()));
    }
    first.kill9();
    drop(first);
    let again = server(4, pool, &["--dram", "1MiB"]);
    assert!(
        again.ready_line.contains("recovered"),
        "{}",
        again.ready_line
    );
    let c = client(&again.addr(), 2);
    for (a, data) in &kept {
        if data.is_empty() {
            assert!(matches!(c.read(*a), Err(Error::Freed(_))), "{a} was freed");
        } else {
            assert_eq!(&c.read(*a).unwrap(), data, "{a} after SIGKILL and restart");
        }
    }
}

/// Waits up to `limit` for `f` to hold.
fn eventually(limit: Duration, mut f: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + limit;
    while Instant::now() < end {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    f()
}

fn pattern(tag: u64, size: usize) -> Vec<u8> {
    (0..size)
        .map(|j| (tag.wrapping_mul(31) as usize + j * 7) as u8)
        .collect()
}

#[test]
fn a_killed_server_fails_only_its_objects_and_its_clients_reconnect_without_losing_a_confirmed_write()
 {
    let dir = tempfile::tempdir().unwrap();
    let pools: Vec<String> = (0..2)
        .map(|i| {
            dir.path()
                .join(format!("g{i}.pool"))
                .to_str()
                .unwrap()
                .to_string()
        })
        .collect();
    let flags = ["--size", "16MiB", "--dram", "1MiB", "--window", "20"];
    let mut a = server(4, &pools[0], &flags);
    let mut b = server(5, &pools[1], &flags);
    let addrs = Arc::new(Mutex::new(HashMap::from([
        (NodeId(4), a.addr()),
        (NodeId(5), b.addr()),
    ])));
    let c = client_of(&addrs, 1);
    // Objects on both servers (placement follows free NVM, so they alternate).
    let mut objs: Vec<GlobalAddr> = Vec::new();
    while objs.iter().filter(|o| o.server == NodeId(5)).count() < 6
        || objs.iter().filter(|o| o.server == NodeId(4)).count() < 6
    {
        objs.push(c.alloc(300).unwrap());
        assert!(objs.len() < 100, "placement never used both servers");
    }
    // Version 0 of every object, confirmed.
    let confirms: Vec<_> = objs
        .iter()
        .map(|o| c.write_proxied(*o, 0, &pattern(o.offset, 300)).unwrap())
        .collect();
    for cf in &confirms {
        cf.wait().unwrap();
    }
    // A stream of proxied writes to server 5's objects, and the server killed under it:
    // versions 1.. per object, the confirms left for later.
    let on5: Vec<GlobalAddr> = objs
        .iter()
        .copied()
        .filter(|o| o.server == NodeId(5))
        .collect();
    let mut posted: Vec<(GlobalAddr, u64, dmkit_gengar::Confirm)> = Vec::new();
    for v in 1..=20u64 {
        for o in &on5 {
            match c.write_proxied(*o, 0, &pattern(o.offset + v, 300)) {
                Ok(cf) => posted.push((*o, v, cf)),
                Err(Error::ServerDown { .. }) => {}
                Err(e) => panic!("write to {o} while its server dies: {e}"),
            }
        }
        if v == 10 {
            // At least one write of the stream confirmed before the kill (on an emulated
            // NIC the proxy may not have posted any yet); the rest stay in flight.
            if let Some((o, v, cf)) = posted.first() {
                cf.wait()
                    .unwrap_or_else(|e| panic!("confirm of {o} v{v} before the kill: {e}"));
            }
            b.kill9();
        }
    }
    drop(b);
    // Down: its objects fail with a clear error, soon; server 4's are untouched.
    let t0 = Instant::now();
    for o in &on5 {
        match c.read(*o) {
            Err(Error::ServerDown { node: 5, reason }) => assert!(!reason.is_empty()),
            other => panic!("read of {o} with its server killed: {other:?}"),
        }
    }
    assert!(
        t0.elapsed() < Duration::from_secs(15),
        "the down server's objects took {:?} to fail",
        t0.elapsed()
    );
    let err = c.read(on5[0]).unwrap_err().to_string();
    assert!(err.contains("server 5 is down"), "{err}");
    for o in objs.iter().filter(|o| o.server == NodeId(4)) {
        assert_eq!(
            c.read(*o).unwrap(),
            pattern(o.offset, 300),
            "{o} on the live server"
        );
        c.write(*o, 0, &pattern(o.offset + 100, 300)).unwrap();
    }
    let placed = c.alloc(64).unwrap();
    assert_eq!(
        placed.server,
        NodeId(4),
        "allocation goes to the live server"
    );
    // Back on the same pool file (a new port): the confirms of the writes posted before the
    // kill have all arrived — each confirmed or failed, none left hanging.
    let again = server(5, &pools[1], &["--dram", "1MiB", "--window", "20"]);
    assert!(
        again.ready_line.contains("recovered"),
        "{}",
        again.ready_line
    );
    addrs.lock().insert(NodeId(5), again.addr());
    let mut last_confirmed: HashMap<GlobalAddr, u64> = HashMap::new();
    let mut last_posted: HashMap<GlobalAddr, u64> = HashMap::new();
    let (mut ok, mut failed) = (0, 0);
    for (o, v, cf) in &posted {
        let t = Instant::now();
        match cf.wait() {
            Ok(()) => {
                ok += 1;
                last_confirmed.insert(*o, *v);
            }
            Err(Error::ServerDown { .. }) => failed += 1,
            Err(e) => panic!("confirm of {o} v{v}: {e}"),
        }
        assert!(t.elapsed() < Duration::from_secs(10), "a confirm hung");
        last_posted.insert(*o, *v);
    }
    assert!(ok > 0, "no write was confirmed before the kill");
    // The client reconnects on its next operation; no confirmed write is lost: each object
    // holds its last confirmed version or one posted after it (not confirmed, yet it may
    // have landed).
    for o in &on5 {
        let got = c
            .read(*o)
            .unwrap_or_else(|e| panic!("{o} after the restart: {e}"));
        let from = last_confirmed.get(o).copied().unwrap_or(0);
        let to = last_posted.get(o).copied().unwrap_or(0);
        assert!(
            (from..=to).any(|v| got == pattern(o.offset + v, 300)),
            "{o}: not its last confirmed version {from} nor a later one up to {to}"
        );
        c.write(*o, 0, &pattern(o.offset + 500, 300)).unwrap();
        assert_eq!(c.read(*o).unwrap(), pattern(o.offset + 500, 300));
    }
    eprintln!(
        "{ok} proxied writes confirmed and {failed} failed across the kill; {} objects read back",
        on5.len()
    );
    a.kill9();
}

#[test]
fn hot_reads_from_a_dram_copy_take_one_round_trip() {
    let dir = tempfile::tempdir().unwrap();
    let pool = dir.path().join("hot.pool");
    let _s = server(
        4,
        pool.to_str().unwrap(),
        &["--size", "16MiB", "--dram", "1MiB", "--window", "20"],
    );
    let addrs = Arc::new(Mutex::new(HashMap::from([(NodeId(4), _s.addr())])));
    let c = client_of(&addrs, 1);
    let o = c.alloc(1000).unwrap();
    c.write(o, 0, &pattern(9, 1000)).unwrap();
    // Hot: read and reported until the server promotes it.
    assert!(
        eventually(Duration::from_secs(30), || {
            for _ in 0..20 {
                c.read(o).unwrap();
            }
            c.report_hot().unwrap();
            std::thread::sleep(Duration::from_millis(40));
            c.read(o).unwrap();
            c.cached_in_dram(o)
        }),
        "the object never reached DRAM"
    );
    let rtts = || c.endpoint().stats().tag(tags::READ).round_trips;
    let (mut hot, mut one) = (0u64, 0u64);
    for _ in 0..200 {
        let leased = c.has_lease(o) && c.cached_in_dram(o);
        let r0 = rtts();
        assert_eq!(c.read(o).unwrap(), pattern(9, 1000));
        if leased {
            hot += 1;
            one += u64::from(rtts() - r0 == 1);
        }
    }
    assert!(hot >= 50, "only {hot} of 200 reads began with a DRAM lease");
    // A lease may lapse between the check and the read: a handful of reads then pay the
    // lease RPC; every other hot read is one round trip.
    assert!(
        one * 100 >= hot * 97,
        "{one} of {hot} hot reads took one round trip"
    );
    eprintln!("{one} of {hot} hot reads from DRAM took one round trip");
}

#[test]
fn leases_expire_and_free_waits_for_them() {
    let dir = tempfile::tempdir().unwrap();
    let pool = dir.path().join("lease.pool");
    let s = server(
        4,
        pool.to_str().unwrap(),
        &["--size", "16MiB", "--dram", "1MiB", "--window", "20"],
    );
    let addrs = Arc::new(Mutex::new(HashMap::from([(NodeId(4), s.addr())])));
    let (a, b) = (client_of(&addrs, 1), client_of(&addrs, 2));
    let o = a.alloc(100).unwrap();
    a.write(o, 0, b"leased").unwrap();
    let rtts = || a.endpoint().stats().tag(tags::READ).round_trips;
    // With its lease: one round trip. After it expired (leases last at most 100 ms times the
    // lease scale): the lease RPC and the read.
    // An early renewal posted by one read (past half of its lease) completes during the
    // next and is counted under its tag, and on a loaded machine a lease may lapse between
    // the check and the read (CI saw 2 once): a few tries, each at most the lease RPC and
    // the read, one of them the read alone.
    b.read(o).unwrap();
    let mut took = Vec::new();
    for _ in 0..5 {
        a.read(o).unwrap();
        let r0 = rtts();
        if a.has_lease(o) {
            a.read(o).unwrap();
            took.push(rtts() - r0);
            if took.last() == Some(&1) {
                break;
            }
        }
    }
    assert!(
        took.contains(&1) && took.iter().all(|&t| t <= 2),
        "reads under a valid lease took {took:?} round trips"
    );
    std::thread::sleep(Duration::from_millis(100 * u64::from(lease_scale()) + 300));
    assert!(!a.has_lease(o), "the lease outlived its longest duration");
    let r1 = rtts();
    assert_eq!(&a.read(o).unwrap()[..6], b"leased");
    // The lease RPC and the read; one more lease RPC when the server answers Busy (it is
    // promoting or evicting the object in its 20 ms window: seen once on a loaded machine).
    let took = rtts() - r1;
    assert!(
        (2..=3).contains(&took),
        "a read after the lease expired took {took} round trips"
    );
    // A frees the object while B holds a lease: the free waits it out; then B's cached
    // address is refused, never read.
    b.read(o).unwrap();
    a.free(o).unwrap();
    assert!(matches!(b.read(o), Err(Error::Freed(_))));
}

#[test]
fn locks_hand_proxied_writes_to_the_next_holder() {
    let dir = tempfile::tempdir().unwrap();
    let pool = dir.path().join("lock.pool");
    let s = server(
        4,
        pool.to_str().unwrap(),
        &["--size", "16MiB", "--dram", "1MiB", "--window", "20"],
    );
    let addrs = Arc::new(Mutex::new(HashMap::from([(NodeId(4), s.addr())])));
    let setup = client_of(&addrs, 100);
    let counter = setup.alloc(8).unwrap();
    const EACH: u64 = 15;
    std::thread::scope(|sc| {
        for id in 1..=3u64 {
            let addrs = &addrs;
            sc.spawn(move || {
                let c = client_of(addrs, id);
                for _ in 0..EACH {
                    c.lock(counter).unwrap();
                    let v =
                        u64::from_le_bytes(c.read_at(counter, 0, 8).unwrap().try_into().unwrap());
                    // Proxied: the unlock waits for its confirm, so the next holder reads it.
                    c.write_proxied(counter, 0, &(v + 1).to_le_bytes()).unwrap();
                    c.unlock(counter).unwrap();
                }
            });
        }
    });
    let v = u64::from_le_bytes(setup.read_at(counter, 0, 8).unwrap().try_into().unwrap());
    assert_eq!(v, 3 * EACH, "locked read-modify-writes lost an increment");
    // Unlocking what one does not hold is refused.
    assert!(matches!(
        setup.unlock(counter),
        Err(Error::NotLockHolder(_))
    ));
}

/// What a reader saw: reads from DRAM and from NVM, promotions and evictions it noticed, and
/// which objects of the first hot set were in DRAM when the hot set moved.
type Seen = (u64, u64, u64, u64, Vec<usize>);

#[test]
fn objects_are_promoted_and_evicted_while_clients_read_them() {
    let dir = tempfile::tempdir().unwrap();
    let pool = dir.path().join("evict.pool");
    // Default leases, windows of 200 ms: each window sees a few reads of every object of the
    // hot set (32 KiB reads are slow on an emulated device), enough heat to promote it.
    let s = server_scaled(
        4,
        pool.to_str().unwrap(),
        1,
        &["--size", "32MiB", "--dram", "1MiB", "--window", "200"],
    );
    let addrs = Arc::new(Mutex::new(HashMap::from([(NodeId(4), s.addr())])));
    let setup = client_of(&addrs, 100);
    // 40 objects of one 32 KiB slot each: more than the DRAM buffer holds (about 30), and
    // two hot sets of 20 that do not fit together.
    const SIZE: usize = (32 << 10) - 8;
    let objs: Vec<GlobalAddr> = (0..40)
        .map(|i| {
            let o = setup.alloc(SIZE).unwrap();
            setup.write(o, 0, &pattern(i, SIZE)).unwrap();
            o
        })
        .collect();
    let seen: Vec<Seen> = std::thread::scope(|sc| {
        let hs: Vec<_> = (1..=2u64)
            .map(|id| {
                let (addrs, objs) = (&addrs, &objs);
                sc.spawn(move || {
                    let c = client_with(
                        addrs,
                        id,
                        ClientConfig {
                            report_every: 16,
                            ..ClientConfig::default()
                        },
                    );
                    let mut was = vec![None::<bool>; objs.len()];
                    let (mut dram, mut nvm, mut promoted, mut evicted) = (0, 0, 0, 0);
                    let mut first_in_dram = Vec::new();
                    // The hot set moves: the first 20 objects, then the other 20.
                    for round in 0..600usize {
                        if round == 300 {
                            first_in_dram = (0..20).filter(|i| was[*i] == Some(true)).collect();
                        }
                        let base = if round < 300 { 0 } else { 20 };
                        let i = base + (round * 7 + id as usize) % 20;
                        let got = c.read(objs[i]).unwrap();
                        assert!(
                            got == pattern(i as u64, SIZE),
                            "object {i} read wrong bytes"
                        );
                        let now = c.cached_in_dram(objs[i]);
                        match (was[i], now) {
                            (Some(false), true) => promoted += 1,
                            (Some(true), false) => evicted += 1,
                            _ => {}
                        }
                        was[i] = Some(now);
                        if now { dram += 1 } else { nvm += 1 }
                    }
                    (dram, nvm, promoted, evicted, first_in_dram)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let sum = |f: fn(&Seen) -> u64| seen.iter().map(f).sum::<u64>();
    let (dram, nvm, promoted) = (sum(|s| s.0), sum(|s| s.1), sum(|s| s.2));
    let evicted_seen = sum(|s| s.3);
    eprintln!(
        "reads from DRAM {dram}, from NVM {nvm}; promotions seen {promoted}, evictions seen \
         {evicted_seen}"
    );
    assert!(dram > 0 && nvm > 0, "reads from DRAM {dram}, NVM {nvm}");
    assert!(promoted > 0, "no client saw an object move into DRAM");
    // Evictions: objects of the first hot set that were in DRAM leave it for the second set
    // (a fresh client, which reports nothing, sees where they are now).
    let mut first: Vec<usize> = seen.iter().flat_map(|s| s.4.clone()).collect();
    first.sort_unstable();
    first.dedup();
    assert!(
        !first.is_empty(),
        "no object of the first hot set reached DRAM"
    );
    let c = client_of(&addrs, 200);
    assert!(
        evicted_seen > 0
            || eventually(Duration::from_secs(30), || {
                first.iter().any(|i| {
                    assert_eq!(c.read(objs[*i]).unwrap(), pattern(*i as u64, SIZE));
                    !c.cached_in_dram(objs[*i])
                })
            }),
        "none of the first hot set's cached objects {first:?} was evicted"
    );
}
