//! Round trips per operation are part of the contract (crate docs, "Round trips").

mod common;

use common::{TestCluster, key};
use dmkit_kv_index::{IndexConfig, InsertOutcome, tags};
use dmkit_verbs::TagStats;

fn delta(ep: &dmkit_verbs::Endpoint, tag: &str, before: &TagStats) -> u64 {
    ep.stats().tag(tag).since(before).round_trips
}

#[test]
fn common_case_round_trips_per_operation() {
    for r in 1..=5usize {
        let tc = TestCluster::new(r, 4 << 20, 1 << 20);
        let idx = tc.format(&IndexConfig {
            groups_per_subtable_log2: 8,
            ..IndexConfig::default()
        });
        let ep = idx.endpoint().clone();
        let writes = if r == 1 { 2 } else { 3 };
        for i in 0..20 {
            let k = key(i);
            let s = tc.slot(&idx, &k);
            let (b, d) = (
                ep.stats().tag(tags::INSERT),
                ep.stats().tag(tags::DIRECTORY),
            );
            assert!(matches!(
                idx.insert(&tc.keys, &k, s).unwrap(),
                InsertOutcome::Inserted { .. }
            ));
            assert_eq!(delta(&ep, tags::INSERT, &b), writes, "r={r}: INSERT");
            assert_eq!(delta(&ep, tags::DIRECTORY, &d), 0, "r={r}: fresh cache");

            let b = ep.stats().tag(tags::SEARCH);
            assert_eq!(idx.search(&tc.keys, &k).unwrap(), Some(s));
            assert_eq!(delta(&ep, tags::SEARCH, &b), 1, "r={r}: SEARCH");

            let s2 = tc.slot(&idx, &k);
            let b = ep.stats().tag(tags::UPDATE);
            idx.update(&tc.keys, &k, s2).unwrap().unwrap();
            assert_eq!(delta(&ep, tags::UPDATE, &b), writes, "r={r}: UPDATE");
            let st = ep.stats().tag(tags::UPDATE).since(&b);
            assert_eq!(st.cas as usize, r, "r={r}: one CAS per replica");
        }
        for i in 0..20 {
            let b = ep.stats().tag(tags::DELETE);
            idx.delete(&tc.keys, &key(i)).unwrap().unwrap();
            assert_eq!(delta(&ep, tags::DELETE, &b), writes, "r={r}: DELETE");
        }
        assert_eq!(ep.stats().tag(tags::SPLIT).round_trips, 0);
    }
}

#[test]
fn a_stale_directory_costs_one_refresh_then_is_fresh_again() {
    let tc = TestCluster::new(3, 8 << 20, 4 << 20);
    let cfg = IndexConfig {
        groups_per_subtable_log2: 3,
        ..IndexConfig::default()
    };
    let writer = tc.format(&cfg);
    let reader = tc.open();
    let k0 = key(0);
    let s0 = tc.slot(&writer, &k0);
    writer.insert(&tc.keys, &k0, s0).unwrap();
    // The writer grows the index; the reader's cached directory is now stale.
    for i in 1..2000 {
        let s = tc.slot(&writer, &key(i));
        writer.insert(&tc.keys, &key(i), s).unwrap();
    }
    assert!(writer.global_depth() > 2);
    let ep = reader.endpoint().clone();
    let mut refreshed = 0;
    for i in 0..2000 {
        let d = ep.stats().tag(tags::DIRECTORY);
        assert!(
            reader.search(&tc.keys, &key(i)).unwrap().is_some(),
            "key {i}"
        );
        refreshed += delta(&ep, tags::DIRECTORY, &d);
    }
    assert!((1..=2).contains(&refreshed), "refreshed {refreshed} times");
    // Fresh again: one round trip per search.
    let b = ep.stats().tag(tags::SEARCH);
    for i in 0..100 {
        reader.search(&tc.keys, &key(i)).unwrap();
    }
    assert_eq!(delta(&ep, tags::SEARCH, &b), 100);
}
