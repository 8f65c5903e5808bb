//! FUSEE operations on an in-process cluster: results, replication, concurrency, memory.

use std::collections::HashMap;
use std::sync::Arc;

use dmkit_fusee::{
    CasResult, ClientConfig, DeleteResult, InsertResult, LocalCluster, LocalConfig, UpdateResult,
};

fn cluster(nodes: u16, r: usize) -> LocalCluster {
    LocalCluster::start(LocalConfig::new(nodes, r)).unwrap()
}

#[test]
fn operations_report_clear_results_for_every_replication_factor() {
    for r in 1..=3 {
        let c = cluster(3, r);
        let k = c.client(1).unwrap();
        assert_eq!(k.search(b"a").unwrap(), None);
        assert_eq!(k.insert(b"a", b"1").unwrap(), InsertResult::Inserted);
        assert_eq!(k.insert(b"a", b"2").unwrap(), InsertResult::AlreadyExists);
        assert_eq!(k.search(b"a").unwrap().as_deref(), Some(&b"1"[..]));
        assert_eq!(k.update(b"a", b"3").unwrap(), UpdateResult::Updated);
        assert_eq!(k.search(b"a").unwrap().as_deref(), Some(&b"3"[..]));
        assert_eq!(k.update(b"zz", b"3").unwrap(), UpdateResult::NotFound);
        assert_eq!(k.delete(b"a").unwrap(), DeleteResult::Deleted);
        assert_eq!(k.delete(b"a").unwrap(), DeleteResult::NotFound);
        assert_eq!(k.search(b"a").unwrap(), None);
        assert_eq!(k.insert(b"a", b"4").unwrap(), InsertResult::Inserted);
        assert_eq!(k.search(b"a").unwrap().as_deref(), Some(&b"4"[..]));
        // Another client sees it all.
        let k2 = c.client(2).unwrap();
        assert_eq!(k2.search(b"a").unwrap().as_deref(), Some(&b"4"[..]));
    }
}

#[test]
fn values_of_every_size_class_round_trip() {
    let c = cluster(2, 2);
    let k = c.client(1).unwrap();
    for (i, len) in [0usize, 1, 40, 100, 500, 1000, 3000, 8000, 16000]
        .into_iter()
        .enumerate()
    {
        let key = format!("key-{i}");
        let v: Vec<u8> = (0..len).map(|j| (j * 7 + i) as u8).collect();
        assert_eq!(
            k.insert(key.as_bytes(), &v).unwrap(),
            InsertResult::Inserted
        );
        assert_eq!(k.search(key.as_bytes()).unwrap().unwrap(), v, "len {len}");
    }
    // Beyond one object: in chunks (tests/expiry_large.rs).
    let big = vec![5u8; 20_000];
    assert_eq!(k.insert(b"big", &big).unwrap(), InsertResult::Inserted);
    assert_eq!(k.search(b"big").unwrap().unwrap(), big);
}

#[test]
fn many_keys_from_many_threads_and_clients() {
    let c = Arc::new(cluster(3, 3));
    std::thread::scope(|s| {
        for t in 0..4u64 {
            let c = c.clone();
            s.spawn(move || {
                let k = c.client(10 + t).unwrap();
                for i in 0..300 {
                    let key = format!("t{t}-{i}");
                    assert_eq!(
                        k.insert(key.as_bytes(), key.as_bytes()).unwrap(),
                        InsertResult::Inserted
                    );
                }
                for i in 0..300 {
                    let key = format!("t{t}-{i}");
                    assert_eq!(k.search(key.as_bytes()).unwrap().unwrap(), key.as_bytes());
                }
            });
        }
    });
    let k = c.client(1).unwrap();
    for t in 0..4 {
        for i in (0..300).step_by(37) {
            let key = format!("t{t}-{i}");
            assert_eq!(k.search(key.as_bytes()).unwrap().unwrap(), key.as_bytes());
        }
    }
}

#[test]
fn concurrent_writers_of_one_key_leave_one_of_their_values() {
    let c = Arc::new(cluster(3, 3));
    c.client(1).unwrap().insert(b"hot", b"start").unwrap();
    std::thread::scope(|s| {
        for t in 0..4u64 {
            let c = c.clone();
            s.spawn(move || {
                let k = c.client(20 + t).unwrap();
                for i in 0..100 {
                    let v = format!("w{t}-{i}");
                    assert_eq!(
                        k.update(b"hot", v.as_bytes()).unwrap(),
                        UpdateResult::Updated
                    );
                }
            });
        }
    });
    let k = c.client(1).unwrap();
    let v = String::from_utf8(k.search(b"hot").unwrap().unwrap()).unwrap();
    assert!(
        v.ends_with("-99"),
        "final value {v} is not some writer's last"
    );
}

#[test]
fn concurrent_inserts_of_one_key_have_one_winner() {
    let c = Arc::new(cluster(3, 3));
    for round in 0..20 {
        let key = format!("k{round}");
        let wins: usize = std::thread::scope(|s| {
            let hs: Vec<_> = (0..4u64)
                .map(|t| {
                    let (c, key) = (c.clone(), key.clone());
                    s.spawn(move || {
                        let k = c.client(40 + t).unwrap();
                        usize::from(
                            k.insert(key.as_bytes(), &[t as u8]).unwrap() == InsertResult::Inserted,
                        )
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).sum()
        });
        assert_eq!(wins, 1, "round {round}");
    }
}

#[test]
fn an_update_heavy_run_reaches_a_steady_memory_use() {
    let c = cluster(2, 2);
    let k = c
        .client_with(ClientConfig {
            reclaim_every: 64,
            ..ClientConfig::new(1)
        })
        .unwrap();
    let keys = 100;
    for i in 0..keys {
        k.insert(format!("k{i}").as_bytes(), &[0u8; 200]).unwrap();
    }
    let mut blocks = Vec::new();
    for round in 0..30u8 {
        for i in 0..keys {
            k.update(format!("k{i}").as_bytes(), &[round; 200]).unwrap();
        }
        k.flush().unwrap();
        k.reclaim().unwrap();
        blocks.push(c.allocated_blocks());
    }
    // 3000 updates of ~260-byte objects need ~6 blocks' worth of objects: without reuse the
    // count would climb round after round.
    // After warming up, the number of blocks stops growing: freed objects are reused.
    let warm = blocks[10];
    assert!(
        blocks.iter().skip(10).all(|b| *b <= warm + 2),
        "memory keeps growing: {blocks:?}"
    );
    for i in 0..keys {
        assert_eq!(
            k.search(format!("k{i}").as_bytes()).unwrap().unwrap(),
            vec![29u8; 200]
        );
    }
}

/// Eight threads sharing one client: their cleanups queue up on the client's background
/// thread, which runs them in batches (two round trips per batch, not per write). Every
/// replaced object still comes back (memory stays steady) and every key keeps its last value.
#[test]
fn cleanups_of_many_threads_run_in_batches_and_free_everything() {
    let c = cluster(3, 3);
    let k = c
        .client_with(ClientConfig {
            reclaim_every: 64,
            ..ClientConfig::new(1)
        })
        .unwrap();
    const THREADS: usize = 8;
    const KEYS: usize = 16;
    for t in 0..THREADS {
        for i in 0..KEYS {
            k.insert(format!("t{t}k{i}").as_bytes(), &[0u8; 100])
                .unwrap();
        }
    }
    k.flush().unwrap();
    let before = k.endpoint().stats().tag(dmkit_fusee::tags::CLEANUP);
    let mut blocks = Vec::new();
    let mut updates = 0u64;
    for round in 1..=20u8 {
        std::thread::scope(|s| {
            for t in 0..THREADS {
                let k = k.clone();
                s.spawn(move || {
                    for i in 0..KEYS {
                        k.update(format!("t{t}k{i}").as_bytes(), &[round; 100])
                            .unwrap();
                    }
                });
            }
        });
        updates += (THREADS * KEYS) as u64;
        k.flush().unwrap();
        k.reclaim().unwrap();
        blocks.push(c.allocated_blocks());
    }
    let cleanup = k
        .endpoint()
        .stats()
        .tag(dmkit_fusee::tags::CLEANUP)
        .since(&before);
    assert!(
        cleanup.round_trips < 2 * updates,
        "{} cleanup round trips for {updates} updates: none batched",
        cleanup.round_trips
    );
    let warm = blocks[8];
    assert!(
        blocks.iter().skip(8).all(|b| *b <= warm + 2),
        "memory keeps growing: {blocks:?}"
    );
    for t in 0..THREADS {
        for i in 0..KEYS {
            assert_eq!(
                k.search(format!("t{t}k{i}").as_bytes()).unwrap().unwrap(),
                vec![20u8; 100]
            );
        }
    }
}

#[test]
fn a_mixed_workload_matches_a_local_model() {
    use rand::{Rng, SeedableRng};
    let c = cluster(3, 2);
    let k = c.client(1).unwrap();
    let mut model: HashMap<Vec<u8>, Vec<u8>> = HashMap::new();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
    for step in 0..3000u32 {
        let key = format!("k{}", rng.random_range(0..200)).into_bytes();
        let val = step.to_le_bytes().repeat(rng.random_range(1..40));
        match rng.random_range(0..4) {
            0 => {
                let want = if model.contains_key(&key) {
                    InsertResult::AlreadyExists
                } else {
                    InsertResult::Inserted
                };
                assert_eq!(k.insert(&key, &val).unwrap(), want);
                model.entry(key).or_insert(val);
            }
            1 => {
                let want = if model.contains_key(&key) {
                    UpdateResult::Updated
                } else {
                    UpdateResult::NotFound
                };
                assert_eq!(k.update(&key, &val).unwrap(), want);
                if let Some(v) = model.get_mut(&key) {
                    *v = val;
                }
            }
            2 => {
                let want = if model.remove(&key).is_some() {
                    DeleteResult::Deleted
                } else {
                    DeleteResult::NotFound
                };
                assert_eq!(k.delete(&key).unwrap(), want);
            }
            _ => assert_eq!(
                k.search(&key).unwrap(),
                model.get(&key).cloned(),
                "step {step}"
            ),
        }
    }
}

#[test]
fn the_empty_key_and_the_empty_value_are_keys_and_values_like_any() {
    for r in [1, 3] {
        let c = cluster(3, r);
        let k = c.client(1).unwrap();
        assert_eq!(k.search(b"").unwrap(), None);
        assert_eq!(k.insert(b"", b"").unwrap(), InsertResult::Inserted);
        assert_eq!(k.search(b"").unwrap().as_deref(), Some(&b""[..]));
        assert_eq!(k.insert(b"a", b"x").unwrap(), InsertResult::Inserted);
        assert_eq!(k.update(b"", b"v").unwrap(), UpdateResult::Updated);
        let k2 = c.client(2).unwrap();
        assert_eq!(k2.search(b"").unwrap().as_deref(), Some(&b"v"[..]));
        assert_eq!(k2.search(b"a").unwrap().as_deref(), Some(&b"x"[..]));
        assert_eq!(k2.delete(b"").unwrap(), DeleteResult::Deleted);
        assert_eq!(k.search(b"").unwrap(), None);
        assert_eq!(k.search(b"a").unwrap().as_deref(), Some(&b"x"[..]));
        // A client restarted with its id recovers its log (the empty key's entries in it).
        drop(k);
        let (k, _) = c.recover(1).unwrap();
        assert_eq!(k.search(b"").unwrap(), None);
        k.upsert(b"", b"w").unwrap();
        assert_eq!(k2.search(b"").unwrap().as_deref(), Some(&b"w"[..]));
    }
}

#[test]
fn compare_and_set_and_delete_if_write_only_over_the_expected_value() {
    for r in [1, 3] {
        let c = cluster(3, r);
        let k = c.client(1).unwrap();
        assert_eq!(
            k.compare_and_set(b"n", b"0", b"1").unwrap(),
            CasResult::NotFound
        );
        assert_eq!(k.insert(b"n", b"0").unwrap(), InsertResult::Inserted);
        assert_eq!(
            k.compare_and_set(b"n", b"0", b"1").unwrap(),
            CasResult::Swapped
        );
        assert_eq!(
            k.compare_and_set(b"n", b"0", b"2").unwrap(),
            CasResult::Mismatch(b"1".to_vec())
        );
        let k2 = c.client(2).unwrap();
        assert_eq!(k2.search(b"n").unwrap().as_deref(), Some(&b"1"[..]));
        assert_eq!(
            k2.delete_if(b"n", b"0").unwrap(),
            CasResult::Mismatch(b"1".to_vec())
        );
        assert_eq!(k.search(b"n").unwrap().as_deref(), Some(&b"1"[..]));
        assert_eq!(k2.delete_if(b"n", b"1").unwrap(), CasResult::Swapped);
        assert_eq!(k.search(b"n").unwrap(), None);
        assert_eq!(k.delete_if(b"n", b"1").unwrap(), CasResult::NotFound);
    }
}

#[test]
fn concurrent_compare_and_set_increments_lose_no_increment() {
    // Read, add one, compare-and-set; again on a mismatch. Every increment lands once.
    let c = Arc::new(cluster(3, 3));
    c.client(100).unwrap().insert(b"counter", b"0").unwrap();
    let (threads, each) = (4u64, 40u64);
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let c = c.clone();
            std::thread::spawn(move || {
                let k = c.client(200 + t).unwrap();
                let mut retries = 0;
                for _ in 0..each {
                    let mut cur = k.search(b"counter").unwrap().unwrap();
                    loop {
                        let n: u64 = std::str::from_utf8(&cur).unwrap().parse().unwrap();
                        match k
                            .compare_and_set(b"counter", &cur, (n + 1).to_string().as_bytes())
                            .unwrap()
                        {
                            CasResult::Swapped => break,
                            CasResult::Mismatch(now) => {
                                retries += 1;
                                cur = now;
                            }
                            CasResult::NotFound => panic!("the counter vanished"),
                        }
                    }
                }
                retries
            })
        })
        .collect();
    let retries: u64 = handles.into_iter().map(|h| h.join().unwrap()).sum();
    let k = c.client(100).unwrap();
    assert_eq!(
        k.search(b"counter").unwrap().as_deref(),
        Some((threads * each).to_string().as_bytes()),
        "{retries} retries"
    );
}

#[test]
fn a_scan_returns_every_key_present_throughout_while_the_index_grows() {
    // Small subtables (4 groups): the inserts below split them many times during the scan.
    let mut cfg = LocalConfig::new(3, 2);
    cfg.cluster.index.groups_per_subtable_log2 = 2;
    let c = LocalCluster::start(cfg).unwrap();
    let k = c.client(1).unwrap();
    let before: Vec<Vec<u8>> = (0..300).map(|i| format!("old-{i}").into_bytes()).collect();
    for key in &before {
        k.insert(key, b"v").unwrap();
    }
    // Scan while another client inserts enough keys to split subtables, and deletes some
    // that were there at the start (those may or may not come back).
    let writer = {
        let c2 = c.client(2).unwrap();
        std::thread::spawn(move || {
            for i in 0..3000 {
                c2.insert(format!("new-{i}").as_bytes(), b"w").unwrap();
                if i % 50 == 0 {
                    c2.delete(format!("old-{}", i / 50).as_bytes()).unwrap();
                }
            }
        })
    };
    let mut seen = std::collections::HashSet::new();
    let mut cursor = 0;
    loop {
        let (keys, next) = k.scan(cursor).unwrap();
        seen.extend(keys);
        cursor = next;
        if cursor == 0 {
            break;
        }
    }
    writer.join().unwrap();
    for key in before.iter().skip(60) {
        assert!(
            seen.contains(key),
            "{} missed",
            String::from_utf8_lossy(key)
        );
    }
    // A scan on a quiet index returns exactly the keys.
    let (mut all, mut cursor) = (std::collections::HashSet::new(), 0);
    loop {
        let (keys, next) = k.scan(cursor).unwrap();
        all.extend(keys);
        cursor = next;
        if cursor == 0 {
            break;
        }
    }
    assert_eq!(all.len(), 300 - 60 + 3000);
}
