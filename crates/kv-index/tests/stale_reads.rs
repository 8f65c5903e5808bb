//! A reader whose bucket read and object read are far apart in time (a process paused, a
//! thread descheduled) meets objects that were freed and reused by other keys meanwhile:
//! the index must not take that for "absent".

mod common;

use std::sync::atomic::{AtomicBool, Ordering};

use common::{TestCluster, key};
use dmkit_kv_index::{IndexConfig, KeyVerifier, RaceIndex, Result, Slot};
use dmkit_verbs::Endpoint;

const SPACE: usize = 4 << 20;

fn config() -> IndexConfig {
    IndexConfig {
        groups_per_subtable_log2: 6,
        max_global_depth: 12,
        seed: 5,
    }
}

/// A verifier that, before its first look at the candidates, lets the world move on: another
/// client updates the key to a new object, and the key's old object is freed and reused by
/// another key (its bytes overwritten in place) — what a reader paused between reading the
/// buckets and reading the objects finds.
struct WorldMovesOn<'a> {
    tc: &'a TestCluster,
    writer: RaceIndex,
    key: Vec<u8>,
    other: Vec<u8>,
    done: AtomicBool,
}

impl WorldMovesOn<'_> {
    fn move_on(&self, old: Slot) {
        let new = self.tc.slot(&self.writer, &self.key);
        self.writer
            .update(&self.tc.keys, &self.key, new)
            .unwrap()
            .expect("present");
        // The old object, reused: the key store's record `[len: u32][key]` of another key.
        let mut rec = (self.other.len() as u32).to_le_bytes().to_vec();
        rec.extend_from_slice(&self.other);
        let region = self
            .tc
            .objects
            .iter()
            .find(|r| r.node == old.node())
            .expect("the object's region");
        let node = self.tc.cluster.node(old.node()).unwrap();
        let mem = node.memory(region.rkey).unwrap();
        mem.write(old.offset() as usize, &rec).unwrap();
    }
}

impl KeyVerifier for WorldMovesOn<'_> {
    fn keys(&self, ep: &Endpoint, slots: &[Slot]) -> Result<Vec<Vec<u8>>> {
        self.tc.keys.keys(ep, slots)
    }

    fn find(&self, ep: &Endpoint, key: &[u8], candidates: &[Slot]) -> Result<Option<usize>> {
        if !self.done.swap(true, Ordering::SeqCst) {
            self.move_on(candidates[0]);
        }
        self.tc.keys.find(ep, key, candidates)
    }
}

#[test]
fn a_search_paused_between_its_reads_never_answers_absent_for_a_present_key() {
    for r in [1, 2, 3] {
        let tc = TestCluster::new(r, SPACE, 8 << 20);
        let idx = tc.format(&config());
        let k = key(7);
        let first = tc.slot(&idx, &k);
        idx.insert(&tc.keys, &k, first).unwrap();
        let reader = tc.open();
        let moves = || WorldMovesOn {
            tc: &tc,
            writer: tc.open(),
            key: k.clone(),
            other: key(8),
            done: AtomicBool::new(false),
        };
        // SEARCH that says where (FUSEE's), and the plain one.
        let v = moves();
        let (found, _) = reader
            .search_at(&v, &k)
            .unwrap()
            .unwrap_or_else(|| panic!("r = {r}: search_at answered absent for a present key"));
        assert!(v.done.load(Ordering::SeqCst));
        assert_eq!(tc.keys.keys(reader.endpoint(), &[found]).unwrap()[0], k);
        let v = moves();
        let found = reader
            .search(&v, &k)
            .unwrap()
            .unwrap_or_else(|| panic!("r = {r}: search answered absent for a present key"));
        assert_eq!(tc.keys.keys(reader.endpoint(), &[found]).unwrap()[0], k);
        // During a repair the replicas are read together; "no candidate holds the key" is
        // not an answer then either: ask again after the repair.
        let v = moves();
        assert_ne!(
            reader.search_agreed(&v, &k).unwrap(),
            Some(None),
            "r = {r}: search_agreed answered absent for a present key"
        );
    }
}
