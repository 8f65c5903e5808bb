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
