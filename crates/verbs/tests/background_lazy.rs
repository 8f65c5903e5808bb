//! `Background::kick_lazily`: a batch of jobs wakes the task at once, fewer wait for the
//! timer thread's wake-up. (A binary of its own: the verbs unit tests count the armed
//! timeouts of the process-wide timer.)

use std::sync::Arc;
use std::time::{Duration, Instant};

use dmkit_verbs::background::Background;

/// A task on its own thread that records when it took each batch of jobs.
fn task(q: Arc<Background<u32>>) -> std::thread::JoinHandle<Vec<(Instant, Vec<u32>)>> {
    std::thread::spawn(move || {
        dmkit_verbs::block_on(async {
            let mut seen = Vec::new();
            while let Some(jobs) = q.take(64).await {
                q.done(jobs.len());
                seen.push((Instant::now(), jobs));
            }
            seen
        })
    })
}

#[test]
fn fewer_than_a_batch_wait_for_the_timer_and_a_batch_wakes_at_once() {
    let q = Arc::new(Background::new());
    let t = task(q.clone());
    std::thread::sleep(Duration::from_millis(20));
    // Two jobs, a batch of four: no wake-up from here; the timer's comes within the delay.
    let start = Instant::now();
    q.push_deferred(1).unwrap();
    q.push_deferred(2).unwrap();
    q.kick_lazily(4, Duration::from_millis(200));
    q.kick_lazily(4, Duration::from_millis(200));
    std::thread::sleep(Duration::from_millis(60));
    assert_eq!(q.pending(), 2, "the task was woken before the delay");
    while q.pending() > 0 && start.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(q.pending(), 0, "the timer's wake-up never came");
    let waited = start.elapsed();
    assert!(
        waited >= Duration::from_millis(150),
        "woken after {waited:?}"
    );
    // A whole batch: taken at once.
    let start = Instant::now();
    for j in 3..7 {
        q.push_deferred(j).unwrap();
    }
    q.kick_lazily(4, Duration::from_secs(30));
    while q.pending() > 0 && start.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(q.pending(), 0);
    assert!(start.elapsed() < Duration::from_secs(5));
    // Nothing queued: nothing armed, nothing woken.
    q.kick_lazily(4, Duration::from_millis(1));
    // The lazy wake-up left by jobs the task took anyway is disarmed.
    q.push_deferred(7).unwrap();
    q.kick_lazily(4, Duration::from_secs(30));
    q.kick();
    while q.pending() > 0 && start.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(
        dmkit_verbs::armed_timeouts(),
        0,
        "a taken batch disarms its wake-up"
    );
    q.close();
    let seen = t.join().unwrap();
    let batches: Vec<Vec<u32>> = seen.into_iter().map(|(_, j)| j).collect();
    assert_eq!(batches, vec![vec![1, 2], vec![3, 4, 5, 6], vec![7]]);
}
