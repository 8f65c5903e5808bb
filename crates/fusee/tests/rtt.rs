//! The round-trip contract of FUSEE's operations, on every backend this crate can start in
//! process (sim, and tcp on loopback; the SoftRoCE tier checks rdma through `dmkit bench
//! fusee --workload micro --backend rdma`): the critical path of each operation — what the
//! caller waits for — and the background work it leaves (cleanup: the replaced object's
//! free and the log entry's finish), with r = 1 and r = 3, the key's address cached or not.
//! See the table in the crate docs.

use dmkit_fusee::tags::split_round_trips as split;
use dmkit_fusee::{Client, LocalCluster, LocalConfig};
use dmkit_verbs::{Tag, TagStats};

fn snapshot(c: &Client) -> Vec<(Tag, TagStats)> {
    c.endpoint().stats().snapshot()
}

/// Runs `op` alone (earlier background work finished), then waits for its own background
/// work: (critical, background) round trips.
fn count(c: &Client, op: impl FnOnce()) -> (u64, u64) {
    c.flush().unwrap();
    let s0 = snapshot(c);
    op();
    let s1 = snapshot(c);
    c.flush().unwrap();
    let s2 = snapshot(c);
    let (crit, _) = split(&s0, &s1);
    let (_, bg) = split(&s0, &s2);
    (crit, bg)
}

fn median(mut v: Vec<(u64, u64)>) -> (u64, u64) {
    v.sort_unstable();
    v[v.len() / 2]
}

/// Median (critical, background) round trips of each operation over `n` keys.
#[derive(Debug, PartialEq, Eq)]
struct Rounds {
    insert: (u64, u64),
    search_cached: (u64, u64),
    update_cached: (u64, u64),
    delete_cached: (u64, u64),
    search_uncached: (u64, u64),
    update_uncached: (u64, u64),
    delete_uncached: (u64, u64),
}

/// A client whose blocks of the operations' size classes are fetched (its first allocation
/// fetches one on the critical path, as the paper's clients do at start).
fn warm(c: Client) -> Client {
    let k = format!("warm-up-{}", c.id()).into_bytes();
    c.insert(&k, b"v").unwrap();
    c.update(&k, b"first").unwrap();
    c.delete(&k).unwrap();
    c.flush().unwrap();
    c
}

fn measure(cluster: &LocalCluster) -> Rounds {
    const N: usize = 40;
    let a = cluster.client(1).unwrap();
    let b = cluster.client(2).unwrap();
    let key = |i: usize| format!("rtt-key-{i:04}").into_bytes();
    let (a, b) = (warm(a), warm(b));
    let mut r: [Vec<(u64, u64)>; 7] = Default::default();
    for i in 0..N {
        let k = key(i);
        r[0].push(count(&a, || {
            a.insert(&k, b"first").unwrap();
        }));
        r[1].push(count(&a, || {
            a.search(&k).unwrap().unwrap();
        }));
        r[2].push(count(&a, || {
            a.update(&k, b"second").unwrap();
        }));
        // Client b has never seen the key.
        r[4].push(count(&b, || {
            b.search(&k).unwrap().unwrap();
        }));
    }
    for i in 0..N {
        let k = key(i);
        if i % 2 == 0 {
            r[3].push(count(&a, || {
                a.delete(&k).unwrap();
            }));
        } else {
            let c = warm(cluster.client(3 + i as u64).unwrap());
            r[5].push(count(&c, || {
                c.update(&k, b"third").unwrap();
            }));
            let d = warm(cluster.client(100 + i as u64).unwrap());
            r[6].push(count(&d, || {
                d.delete(&k).unwrap();
            }));
        }
    }
    let [i, s, u, d, su, uu, du] = r.map(median);
    Rounds {
        insert: i,
        search_cached: s,
        update_cached: u,
        delete_cached: d,
        search_uncached: su,
        update_uncached: uu,
        delete_uncached: du,
    }
}

/// The contract: (critical, background) per operation for r = 1 (one memory node) and r ≥ 2.
fn expected(r: usize) -> Rounds {
    // Critical: object write + bucket read [+ cached object read] | backup CAS (r ≥ 2) |
    // commit record | primary CAS — with r = 1 the commit record goes in the primary CAS's
    // batch (one node, executed in order); an uncached UPDATE/DELETE reads the candidate
    // object in a round of its own. Background: the cleanup's free FAA and the log entry's
    // finish.
    let b = 2 * u64::from(r >= 2);
    Rounds {
        insert: (2 + b, 1),
        search_cached: (1, 0),
        update_cached: (2 + b, 2),
        delete_cached: (2 + b, 2),
        search_uncached: (2, 0),
        update_uncached: (3 + b, 2),
        delete_uncached: (3 + b, 2),
    }
}

/// The measured rounds as the table the snapshot pins (`snapshots/rtt__<backend>_r<r>.snap`):
/// a change to any operation's round trips shows up as a reviewed diff of it.
fn table(got: &Rounds, r: usize, backend: &str) -> String {
    let rows = [
        ("INSERT", got.insert),
        ("SEARCH, address cached", got.search_cached),
        ("UPDATE, address cached", got.update_cached),
        ("DELETE, address cached", got.delete_cached),
        ("SEARCH, not cached", got.search_uncached),
        ("UPDATE, not cached", got.update_uncached),
        ("DELETE, not cached", got.delete_uncached),
    ];
    let mut s = format!(
        "{:<24} {:>2}  {:<7}  {:>8}  {:>10}\n",
        "operation", "r", "backend", "critical", "background"
    );
    for (op, (crit, bg)) in rows {
        s.push_str(&format!(
            "{op:<24} {r:>2}  {backend:<7}  {crit:>8}  {bg:>10}\n"
        ));
    }
    s
}

fn check(cluster: LocalCluster, r: usize, backend: &str) {
    let got = measure(&cluster);
    insta::assert_snapshot!(format!("{backend}_r{r}"), table(&got, r, backend));
    assert_eq!(got, expected(r), "{backend}, r = {r}");
}

#[test]
fn round_trips_per_operation_sim_r1() {
    check(
        LocalCluster::start(LocalConfig::new(1, 1)).unwrap(),
        1,
        "sim",
    );
}

#[test]
fn round_trips_per_operation_sim_r3() {
    check(
        LocalCluster::start(LocalConfig::new(3, 3)).unwrap(),
        3,
        "sim",
    );
}

#[test]
fn round_trips_per_operation_tcp_r1() {
    check(
        LocalCluster::start_tcp(LocalConfig::new(1, 1)).unwrap(),
        1,
        "tcp",
    );
}

#[test]
fn round_trips_per_operation_tcp_r3() {
    check(
        LocalCluster::start_tcp(LocalConfig::new(3, 3)).unwrap(),
        3,
        "tcp",
    );
}

/// An upsert of a key whose address is not cached guesses from the ones before it: on a
/// store filling with fresh keys it takes an INSERT's rounds, on a loaded store (another
/// client wrote the keys) an uncached UPDATE's — after at most a couple of wrong guesses.
fn check_uncached_upserts(cluster: LocalCluster, r: usize) {
    const N: usize = 16;
    let want = expected(r);
    let key = |i: usize| format!("upsert-key-{i:04}").into_bytes();
    let a = warm(cluster.client(1).unwrap());
    let fresh: Vec<_> = (0..N)
        .map(|i| count(&a, || a.upsert(&key(i), b"first").unwrap()))
        .collect();
    assert_eq!(median(fresh).0, want.insert.0, "fresh keys, r = {r}");
    // Client b has never seen the keys: they are present but not cached.
    let b = warm(cluster.client(2).unwrap());
    let loaded: Vec<_> = (0..N)
        .map(|i| count(&b, || b.upsert(&key(i), b"second").unwrap()).0)
        .collect();
    let wrong = loaded
        .iter()
        .filter(|&&c| c > want.update_uncached.0)
        .count();
    assert!(
        wrong <= 2,
        "r = {r}: {wrong} upserts of present keys guessed INSERT: {loaded:?}"
    );
    assert_eq!(loaded[N - 1], want.update_uncached.0, "r = {r}: {loaded:?}");
    for i in 0..N {
        assert_eq!(b.search(&key(i)).unwrap().as_deref(), Some(&b"second"[..]));
    }
}

#[test]
fn uncached_upserts_guess_from_the_store_sim() {
    check_uncached_upserts(LocalCluster::start(LocalConfig::new(1, 1)).unwrap(), 1);
    check_uncached_upserts(LocalCluster::start(LocalConfig::new(3, 3)).unwrap(), 3);
}

/// Every round of a write posts one batch per node: the object write, the cached object's
/// read and the bucket read to the same node go out behind one doorbell (on a software NIC
/// each doorbell is a system call that runs the verbs).
#[test]
fn a_round_posts_one_batch_per_node() {
    for (nodes, r) in [(1, 1), (3, 3)] {
        let cluster = LocalCluster::start(LocalConfig::new(nodes, r)).unwrap();
        let a = warm(cluster.client(1).unwrap());
        let k = b"one-batch-per-node".to_vec();
        let ops: [(&str, &dyn Fn()); 3] = [
            ("insert", &|| {
                a.insert(&k, b"first").unwrap();
            }),
            ("update", &|| {
                a.update(&k, b"second").unwrap();
            }),
            ("delete", &|| {
                a.delete(&k).unwrap();
            }),
        ];
        for (name, op) in ops {
            a.flush().unwrap();
            dmkit_verbs::record::start();
            op();
            let rec = dmkit_verbs::record::take();
            assert!(!rec.rounds.is_empty(), "{name}: no rounds recorded");
            for (i, round) in rec.rounds.iter().enumerate() {
                let mut nodes: Vec<_> = round.batches.iter().map(|(n, _)| *n).collect();
                let posted = nodes.len();
                nodes.sort_unstable();
                nodes.dedup();
                assert_eq!(
                    nodes.len(),
                    posted,
                    "{name}, r = {r}: round {i} ({}) posts two batches to one node",
                    round.tag
                );
            }
        }
    }
}

/// With r = 1 the commit record rides in the primary CAS's batch only when it goes to the
/// primary's node: on three memory nodes a write whose object (or the object it replaces)
/// lives elsewhere writes its record in a round of its own first. Either way the record is
/// written before the swap: in the swap's own batch ahead of the CAS, or in the round before.
#[test]
fn with_r1_the_commit_record_rides_the_swap_only_on_the_primarys_node() {
    use dmkit_verbs::record::VerbKind;
    let cluster = LocalCluster::start(LocalConfig::new(3, 1)).unwrap();
    let clients: Vec<Client> = (1..=3).map(|i| warm(cluster.client(i).unwrap())).collect();
    let (mut merged, mut apart) = (0, 0);
    for (i, c) in clients.iter().cycle().take(48).enumerate() {
        let k = format!("r1-commit-{i:03}").into_bytes();
        for update in [false, true] {
            c.flush().unwrap();
            dmkit_verbs::record::start();
            if update {
                c.update(&k, b"second").unwrap();
            } else {
                c.insert(&k, b"first").unwrap();
            }
            let rounds = dmkit_verbs::record::take().rounds;
            let last = rounds.last().expect("a write has rounds");
            assert_eq!(
                last.batches.len(),
                1,
                "the swap round goes to the primary alone"
            );
            let kinds: Vec<VerbKind> = last.batches[0].1.iter().map(|v| v.kind).collect();
            let cas = kinds
                .iter()
                .position(|k| *k == VerbKind::Cas)
                .expect("the swap round holds the primary CAS");
            match rounds.len() {
                2 => {
                    merged += 1;
                    assert!(
                        kinds[..cas].contains(&VerbKind::Write { durable: true }),
                        "a two-round write carries its commit record ahead of the CAS: {kinds:?}"
                    );
                }
                3 => {
                    apart += 1;
                    assert_eq!(rounds[1].tag, dmkit_fusee::tags::COMMIT, "{rounds:?}");
                }
                n => panic!("a write at r = 1 took {n} rounds: {rounds:?}"),
            }
        }
    }
    eprintln!("r = 1 on three nodes: {merged} writes merged their commit record, {apart} did not");
    assert!(
        merged > 0,
        "no write merged its commit record ({apart} apart)"
    );
    assert!(
        apart > 0,
        "every write merged its commit record ({merged}): objects all on the primary?"
    );
}

/// A key's cached address survives the index's splits: after enough inserts to split the
/// index several times, the inserting client's SEARCH of every key is one round trip (a
/// split moves an entry to the same bucket and slot of its new subtable; the client reads it
/// where its directory now maps the key). Without that, every key a split moved cost a
/// stale read and an uncached search, and the miss ratio turned the cache off.
#[test]
fn a_cached_address_survives_splits() {
    const N: usize = 12_000;
    let cluster = LocalCluster::start(LocalConfig::new(1, 1)).unwrap();
    let c = warm(cluster.client(1).unwrap());
    let key = |i: usize| format!("split-key-{i:06}").into_bytes();
    let s0 = snapshot(&c);
    for i in 0..N {
        c.insert(&key(i), b"v").unwrap();
    }
    c.flush().unwrap();
    let splits: u64 = split_tag_rounds(&snapshot(&c)) - split_tag_rounds(&s0);
    assert!(
        splits > 0,
        "{N} inserts did not split the index: the test needs a split"
    );
    let s1 = snapshot(&c);
    for i in 0..N {
        assert_eq!(c.search(&key(i)).unwrap().as_deref(), Some(&b"v"[..]));
    }
    let s2 = snapshot(&c);
    let (crit, _) = split(&s1, &s2);
    assert_eq!(
        crit, N as u64,
        "SEARCH of {N} cached keys after {splits} split round trips took {crit} round trips"
    );
}

/// Round trips tagged as the index's split.
fn split_tag_rounds(s: &[(Tag, TagStats)]) -> u64 {
    s.iter()
        .filter(|(t, _)| t.to_string().contains("split"))
        .map(|(_, st)| st.round_trips)
        .sum()
}
