//! One FUSEE client shared by many tasks with many operations in flight, as FUSEE's
//! coroutines are: on a tokio runtime and on the std-only `block_on`, over tcp memory nodes.

use std::sync::Arc;
use std::time::{Duration, Instant};

use dmkit_fusee::{LocalCluster, LocalConfig};

fn key(i: usize) -> Vec<u8> {
    format!("key-{i:06}").into_bytes()
}

/// 64 tasks on two worker threads upsert 6 000 keys through one client (the index splits
/// under them), then read every one back concurrently.
#[test]
fn many_tasks_share_one_client_on_tokio() {
    let cluster = LocalCluster::start_tcp(LocalConfig::new(3, 3)).unwrap();
    let client = cluster.client(7).unwrap();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    const TASKS: usize = 64;
    const KEYS: usize = 6_000;
    let t = Instant::now();
    rt.block_on(async {
        let mut handles = Vec::new();
        for w in 0..TASKS {
            let c = client.clone();
            handles.push(tokio::spawn(async move {
                for i in (w..KEYS).step_by(TASKS) {
                    c.upsert_async(&key(i), format!("v{i}").as_bytes())
                        .await
                        .unwrap_or_else(|e| panic!("upsert {i}: {e}"));
                }
            }));
        }
        for h in handles {
            h.await.unwrap();
        }
        let mut handles = Vec::new();
        for w in 0..TASKS {
            let c = client.clone();
            handles.push(tokio::spawn(async move {
                for i in (w..KEYS).step_by(TASKS) {
                    let v = c.search_async(&key(i)).await.unwrap();
                    assert_eq!(v.as_deref(), Some(format!("v{i}").as_bytes()), "key {i}");
                }
            }));
        }
        for h in handles {
            h.await.unwrap();
        }
    });
    eprintln!(
        "{KEYS} upserts and searches from {TASKS} tasks in {:?}",
        t.elapsed()
    );
    assert!(t.elapsed() < Duration::from_secs(60));
    client.flush().unwrap();
    assert_eq!(client.endpoint().in_flight(), 0);
    drop(Arc::new(()));
}

/// A memory node fails under 1 000 operations in flight on one client (one thread, over
/// tcp, the master's failure detector running): every operation finishes — those that
/// reached the failed node are retried in the next membership epoch — no acknowledged write
/// is lost, and nothing is left in flight.
#[test]
fn a_memory_node_failing_under_a_thousand_operations_in_flight() {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

    use dmkit_fusee::failover::MasterConfig;
    use dmkit_verbs::NodeId;

    const OPS: usize = 1_000;
    let mut cluster = LocalCluster::start_tcp(LocalConfig::new(3, 3)).unwrap();
    let master = cluster.master().unwrap();
    let client = cluster.client(21).unwrap();
    for i in 0..OPS {
        client.upsert(&key(i), b"before").unwrap();
    }
    client.flush().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let detector = {
        let (m, s) = (master.clone(), stop.clone());
        std::thread::spawn(move || {
            m.run(
                MasterConfig {
                    heartbeat: Duration::from_millis(20),
                    miss_limit: 3,
                    auto_rejoin: false,
                },
                s,
            )
        })
    };
    // The victim dies once a tenth of the operations are done, the rest in flight.
    let mut victim = cluster.tcp.remove(1);
    let done = Arc::new(AtomicUsize::new(0));
    let killer = {
        let done = done.clone();
        std::thread::spawn(move || {
            while done.load(Ordering::SeqCst) < OPS / 10 {
                std::thread::sleep(Duration::from_micros(200));
            }
            victim.shutdown();
            (victim, done.load(Ordering::SeqCst))
        })
    };
    let t = Instant::now();
    let c = &client;
    let outcomes = dmkit_verbs::block_on(dmkit_verbs::join_all(
        (0..OPS)
            .map(|i| {
                let done = done.clone();
                async move {
                    let r = if i % 4 == 3 {
                        c.search_async(&key(i)).await.map(|v| {
                            assert!(v.as_deref() == Some(b"before".as_slice()), "key {i}: {v:?}");
                        })
                    } else {
                        c.upsert_async(&key(i), format!("after-{i}").as_bytes())
                            .await
                    };
                    done.fetch_add(1, Ordering::SeqCst);
                    r
                }
            })
            .collect(),
    ));
    let (_victim, done_at_kill) = killer.join().unwrap();
    eprintln!(
        "{OPS} operations across a node failure in {:?} ({} in flight when it failed)",
        t.elapsed(),
        OPS - done_at_kill
    );
    assert!(
        OPS - done_at_kill >= OPS / 2,
        "the node failed with only {} operations in flight",
        OPS - done_at_kill
    );
    for (i, o) in outcomes.iter().enumerate() {
        if let Err(e) = o {
            panic!("operation {i} failed: {e}");
        }
    }
    assert!(
        !master.membership().is_member(NodeId(1)),
        "the detector failed the node over"
    );
    client.flush().unwrap();
    assert_eq!(client.endpoint().in_flight(), 0, "verbs left in flight");
    let reader = cluster.client(22).unwrap();
    for i in 0..OPS {
        let want: Vec<u8> = if i % 4 == 3 {
            b"before".to_vec()
        } else {
            format!("after-{i}").into_bytes()
        };
        assert_eq!(
            reader.search(&key(i)).unwrap().as_deref(),
            Some(want.as_slice()),
            "acknowledged write of key {i} lost"
        );
    }
    stop.store(true, Ordering::SeqCst);
    detector.join().unwrap();
}
