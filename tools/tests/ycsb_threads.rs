//! Per-thread YCSB generators share one acknowledged insert counter.

use std::collections::HashSet;
use std::sync::Arc;
use std::thread;

use dmkit_workloads::ycsb::{Operation, Workload, WorkloadSpec};

#[test]
fn split_generators_insert_distinct_keys_and_share_progress() {
    let workload = Workload::new(WorkloadSpec::standard('d').unwrap(), 17).unwrap();
    let counter = Arc::clone(workload.insert_counter());
    let handles: Vec<_> = workload
        .split(4)
        .into_iter()
        .map(|mut w| {
            thread::spawn(move || {
                let mut inserted = Vec::new();
                for _ in 0..2000 {
                    if let Operation::Insert { key, .. } = w.next_op() {
                        inserted.push(key);
                    }
                }
                w.acknowledge_insert();
                inserted
            })
        })
        .collect();
    let mut all = Vec::new();
    for h in handles {
        all.extend(h.join().unwrap());
    }
    let distinct: HashSet<_> = all.iter().collect();
    assert_eq!(
        distinct.len(),
        all.len(),
        "two threads inserted the same key"
    );
    // Every insert was acknowledged, so the newest visible key is the last one handed out.
    assert_eq!(counter.last_value(), 1000 + all.len() as i64 - 1);
    assert_eq!(counter.peek_next(), counter.last_value() + 1);
}

#[test]
fn split_threads_draw_different_but_reproducible_streams() {
    let streams = || {
        let w = Workload::new(WorkloadSpec::standard('c').unwrap(), 3).unwrap();
        w.split(2)
            .into_iter()
            .map(|mut w| (0..200).map(|_| w.next_op()).collect::<Vec<_>>())
            .collect::<Vec<_>>()
    };
    let (a, b) = (streams(), streams());
    assert_eq!(a, b);
    assert_ne!(a[0], a[1]);
}

#[test]
fn load_keys_split_between_loaders_cover_the_record_set() {
    let w = Workload::new(WorkloadSpec::standard('a').unwrap(), 0).unwrap();
    let parts = w.load_keys().split(3);
    let keys: HashSet<String> = parts.into_iter().flatten().collect();
    assert_eq!(keys.len(), 1000);
    assert!(keys.contains("user6284781860667377211"));
}
