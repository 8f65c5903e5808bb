//! Inserts, searches, updates and deletes with r = 1..5 replicas; replicas stay identical.

mod common;

use common::{TestCluster, key};
use dmkit_kv_index::{IndexConfig, InsertOutcome, Rule, SnapshotOutcome};

const SPACE: usize = 2 << 20;

fn config() -> IndexConfig {
    IndexConfig {
        groups_per_subtable_log2: 4,
        max_global_depth: 8,
        seed: 7,
    }
}

/// Everything but the primary-only words (bump pointer, split lock) must match.
fn assert_replicas_identical(tc: &TestCluster) {
    let all = tc.replica_bytes(0, SPACE);
    for (k, r) in all.iter().enumerate().skip(1) {
        assert_eq!(&r[..32], &all[0][..32], "replica {k}: header differs");
        assert!(
            r[64..] == all[0][64..],
            "replica {k}: directory or buckets differ"
        );
    }
}

#[test]
fn every_replication_factor_inserts_searches_updates_and_deletes() {
    for r in 1..=5 {
        let tc = TestCluster::new(r, SPACE, 1 << 20);
        let idx = tc.format(&config());
        let expected_rule = if r == 1 {
            Rule::PrimaryOnly
        } else {
            Rule::AllBackups
        };
        let n = 400u64; // enough to split the 336-slot subtable a few times
        let mut slots = Vec::new();
        for i in 0..n {
            let s = tc.slot(&idx, &key(i));
            match idx.insert(&tc.keys, &key(i), s).unwrap() {
                InsertOutcome::Inserted { rule, .. } => assert_eq!(rule, expected_rule),
                other => panic!("r={r} key {i}: {other:?}"),
            }
            slots.push(s);
        }
        assert!(idx.subtables() > 1, "r={r}: the index grew");
        for i in 0..n {
            assert_eq!(
                idx.search(&tc.keys, &key(i)).unwrap(),
                Some(slots[i as usize]),
                "r={r} key {i}"
            );
        }
        assert_eq!(idx.search(&tc.keys, &key(n + 1)).unwrap(), None);
        // A second client with a directory of its own sees the same.
        let other = tc.open();
        assert_eq!(other.search(&tc.keys, &key(3)).unwrap(), Some(slots[3]));
        assert!(matches!(
            other.insert(&tc.keys, &key(3), slots[3]).unwrap(),
            InsertOutcome::AlreadyExists { slot } if slot == slots[3]
        ));
        // Update half, delete a quarter.
        for i in (0..n).step_by(2) {
            let s = tc.slot(&idx, &key(i));
            let m = idx.update(&tc.keys, &key(i), s).unwrap().expect("present");
            assert_eq!(m.old, slots[i as usize]);
            assert_eq!(m.outcome, SnapshotOutcome::Won(expected_rule));
            slots[i as usize] = s;
        }
        for i in (0..n).step_by(4) {
            let m = other.delete(&tc.keys, &key(i)).unwrap().expect("present");
            assert_eq!(m.old, slots[i as usize]);
        }
        for i in 0..n {
            let want = (i % 4 != 0).then_some(slots[i as usize]);
            assert_eq!(
                idx.search(&tc.keys, &key(i)).unwrap(),
                want,
                "r={r} key {i}"
            );
        }
        assert_eq!(idx.delete(&tc.keys, &key(0)).unwrap(), None);
        let s = tc.slot(&idx, &key(n + 5));
        assert_eq!(idx.update(&tc.keys, &key(n + 5), s).unwrap(), None);
        assert_replicas_identical(&tc);
    }
}

#[test]
fn open_rejects_unformatted_and_mismatched_spaces() {
    let tc = TestCluster::new(3, SPACE, 1 << 16);
    let ep = tc.endpoint();
    assert!(dmkit_kv_index::RaceIndex::open(&ep, &tc.spaces).is_err());
    tc.format(&config());
    // Fewer replicas than formatted is a degraded index (a node failed over), not an error.
    let degraded = dmkit_kv_index::RaceIndex::open(&ep, &tc.spaces[..2]).unwrap();
    assert_eq!(degraded.replicas(), 2);
    let mut dup = tc.spaces.clone();
    dup[1] = dup[0];
    assert!(dmkit_kv_index::RaceIndex::open(&ep, &dup).is_err());
    assert!(dmkit_kv_index::RaceIndex::open(&ep, &tc.spaces).is_ok());
}

#[test]
fn corrupt_bucket_is_an_error_not_a_panic() {
    let tc = TestCluster::new(1, SPACE, 1 << 16);
    let idx = tc.format(&config());
    // Scribble over the whole subtable area of the primary.
    let s = tc.spaces[0];
    let node = tc.cluster.node(s.region.node).unwrap();
    let mem = node.memory(s.region.rkey).unwrap();
    let area = 64 + 8 * 256;
    mem.write(area, &vec![0x5Au8; 16 * 3 * 64]).unwrap();
    let err = idx.search(&tc.keys, b"anything").unwrap_err();
    assert!(
        matches!(err, dmkit_kv_index::Error::Corrupt { .. }),
        "{err}"
    );
}
