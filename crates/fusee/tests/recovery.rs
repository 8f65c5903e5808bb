//! Client crash recovery, with the sim backend crashing the client at every verb boundary of
//! each operation type (its background cleanup included): no committed operation is lost, no
//! uncommitted one is half visible, no object is leaked, and the index replicas agree.

use std::sync::Arc;

use dmkit_fusee::alloc::BlockGeometry;
use dmkit_fusee::{Client, LocalCluster, LocalConfig, RecoveryReport};
use dmkit_verbs::Error as VerbsError;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Insert,
    Update,
    Delete,
}

fn cluster(r: usize) -> LocalCluster {
    let mut cfg = LocalConfig::new(3, r);
    cfg.pool_bytes = 16 << 20;
    cfg.block_size = 64 << 10;
    cfg.cluster.index_bytes = 1 << 20;
    LocalCluster::start(cfg).unwrap()
}

fn assert_index_replicas_identical(c: &LocalCluster) {
    let v = &c.view;
    let space = (
        v.block_size as usize,
        (v.index_blocks * v.block_size) as usize,
    );
    let read = |i: usize| {
        let m = &c.memnodes[i];
        let mem = m.node().memory(m.region().rkey).unwrap();
        let mut b = vec![0u8; space.1];
        mem.read(space.0, &mut b).unwrap();
        b
    };
    let first = read(0);
    for i in 1..v.index_replicas {
        let r = read(i);
        assert_eq!(&r[..32], &first[..32], "index replica {i}: header differs");
        assert!(r[64..] == first[64..], "index replica {i}: buckets differ");
    }
}

/// Objects of `client`'s blocks: (total, free on its lists).
fn accounted(c: &Client, block_size: u64) -> (usize, usize) {
    let total: u64 = c
        .owned_block_classes()
        .iter()
        .map(|class| BlockGeometry::new(block_size, *class).objects)
        .sum();
    (total as usize, c.free_objects())
}

fn is_crash(e: &dmkit_fusee::Error) -> bool {
    matches!(
        e,
        dmkit_fusee::Error::Verbs(VerbsError::ClientCrashed { .. })
    ) || e.to_string().contains("crashed")
}

/// Runs `kind` on a fresh key with the client crashing after `n` verbs; returns whether the
/// operation was acknowledged, and the recovery report.
fn crash_once(c: &LocalCluster, id: u64, kind: Kind, n: u64) -> (bool, RecoveryReport, String) {
    let key = format!("key-{id}");
    let setup = c.client(id).unwrap();
    if kind != Kind::Insert {
        setup.insert(key.as_bytes(), b"before").unwrap();
    }
    setup.flush().unwrap();
    c.sim.crash_client_after(id, n);
    let r = match kind {
        Kind::Insert => setup.insert(key.as_bytes(), b"after").map(drop),
        Kind::Update => setup.update(key.as_bytes(), b"after").map(drop),
        Kind::Delete => setup.delete(key.as_bytes()).map(drop),
    };
    let acked = match r {
        Ok(()) => true,
        Err(e) => {
            assert!(
                is_crash(&e),
                "{kind:?} after {n} verbs failed otherwise: {e}"
            );
            false
        }
    };
    // Whatever the background thread manages before the crash point.
    let _ = setup.flush();
    drop(setup);
    let (rec, report) = c.recover(id).unwrap();
    rec.flush().unwrap();
    let reader = c.client(1).unwrap();
    let now = reader.search(key.as_bytes()).unwrap();
    let want_after: Option<&[u8]> = match kind {
        Kind::Insert | Kind::Update => Some(b"after"),
        Kind::Delete => None,
    };
    let want_before: Option<&[u8]> = match kind {
        Kind::Insert => None,
        _ => Some(b"before"),
    };
    if acked {
        assert_eq!(
            now.as_deref(),
            want_after,
            "{kind:?} crash at {n}: acknowledged but lost"
        );
    } else {
        assert!(
            now.as_deref() == want_after || now.as_deref() == want_before,
            "{kind:?} crash at {n}: half visible: {now:?}"
        );
    }
    assert_index_replicas_identical(c);
    // No leak: every object of the client's blocks is live (the key's) or free.
    rec.reclaim().unwrap();
    let (total, free) = accounted(&rec, c.view.block_size);
    let live = usize::from(now.is_some());
    assert_eq!(
        free + live,
        total,
        "{kind:?} crash at {n}: {total} objects, {free} free, {live} live: leaked {}",
        total as i64 - (free + live) as i64
    );
    (
        acked,
        report,
        now.map(|v| String::from_utf8_lossy(&v).into_owned())
            .unwrap_or_default(),
    )
}

fn crash_at_every_verb(kind: Kind, r: usize) {
    let c = Arc::new(cluster(r));
    // How many verbs the operation and its cleanup take without a crash.
    let probe = 900;
    let k = c.client(probe).unwrap();
    if kind != Kind::Insert {
        k.insert(b"probe", b"before").unwrap();
    }
    k.flush().unwrap();
    let before = c.sim.verbs_posted(probe);
    match kind {
        Kind::Insert => drop(k.insert(b"probe", b"after").unwrap()),
        Kind::Update => drop(k.update(b"probe", b"after").unwrap()),
        Kind::Delete => drop(k.delete(b"probe").unwrap()),
    }
    k.flush().unwrap();
    let verbs = c.sim.verbs_posted(probe) - before;
    assert!(verbs >= 4, "{kind:?} took {verbs} verbs");
    let mut acked = 0;
    let mut last = RecoveryReport::default();
    for n in 0..=verbs + 1 {
        let id = 1000 + n;
        let (a, rep, _) = crash_once(&c, id, kind, n);
        acked += usize::from(a);
        last = rep;
    }
    assert!(
        acked >= 1,
        "{kind:?}: no crash point let the operation finish"
    );
    eprintln!(
        "{kind:?} r={r}: {verbs} verbs, {acked} crash points acknowledged; last recovery {:?} \
         (reconnect {:?}, metadata {:?}, log walk {:?}, redo {:?}, free lists {:?})",
        last.total(),
        last.reconnect,
        last.metadata,
        last.log_walk,
        last.redo,
        last.free_lists
    );
}

#[test]
fn insert_survives_a_crash_at_every_verb() {
    crash_at_every_verb(Kind::Insert, 3);
}

#[test]
fn update_survives_a_crash_at_every_verb() {
    crash_at_every_verb(Kind::Update, 3);
}

#[test]
fn delete_survives_a_crash_at_every_verb() {
    crash_at_every_verb(Kind::Delete, 3);
}

#[test]
fn every_verb_with_one_replica() {
    for k in [Kind::Insert, Kind::Update, Kind::Delete] {
        crash_at_every_verb(k, 1);
    }
}

#[test]
fn concurrent_tasks_of_one_client_are_all_recovered() {
    let c = Arc::new(cluster(3));
    let id = 77;
    let client = c.client(id).unwrap();
    for i in 0..40 {
        client.insert(format!("c{i}").as_bytes(), b"v0").unwrap();
    }
    client.flush().unwrap();
    // Four tasks update their keys; the client dies somewhere in the middle.
    c.sim.crash_client_after(id, 150);
    let acked: Vec<Vec<(usize, u8)>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..4)
            .map(|t| {
                let client = client.clone();
                s.spawn(move || {
                    let mut done = Vec::new();
                    for round in 1..=20u8 {
                        for i in (t..40).step_by(4) {
                            match client.update(format!("c{i}").as_bytes(), &[b'v', round]) {
                                Ok(_) => done.push((i, round)),
                                Err(_) => return done,
                            }
                        }
                    }
                    done
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let _ = client.flush();
    drop(client);
    let (rec, report) = c.recover(id).unwrap();
    // Whether an operation was mid-flight depends on where verb 150 fell; log what recovery saw.
    eprintln!("concurrent crash: {report:?}");
    let reader = c.client(1).unwrap();
    for (i, last) in
        acked
            .iter()
            .flatten()
            .fold(std::collections::HashMap::new(), |mut m, (i, r)| {
                m.insert(*i, *r);
                m
            })
    {
        let v = reader.search(format!("c{i}").as_bytes()).unwrap().unwrap();
        assert!(
            v == [b'v', last] || v == [b'v', last + 1],
            "key c{i}: acked round {last}, found {v:?}"
        );
    }
    assert_index_replicas_identical(&c);
    rec.flush().unwrap();
    rec.reclaim().unwrap();
    let (total, free) = accounted(&rec, c.view.block_size);
    assert_eq!(free + 40, total, "objects leaked");
}
