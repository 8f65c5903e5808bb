//! A timer thread that runs delayed work in deadline order (ties in posting order), started on
//! first use and stopped when the cluster is dropped.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::Arc;
use std::time::Instant;

use parking_lot::{Condvar, Mutex};

type Job = Box<dyn FnOnce() + Send>;

struct Entry {
    at: Instant,
    seq: u64,
    job: Job,
}

impl PartialEq for Entry {
    fn eq(&self, o: &Self) -> bool {
        (self.at, self.seq) == (o.at, o.seq)
    }
}
impl Eq for Entry {}
impl PartialOrd for Entry {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Entry {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        (self.at, self.seq).cmp(&(o.at, o.seq))
    }
}

#[derive(Default)]
struct State {
    heap: BinaryHeap<Reverse<Entry>>,
    seq: u64,
    started: bool,
    stop: bool,
}

#[derive(Default)]
struct Shared {
    state: Mutex<State>,
    cv: Condvar,
}

#[derive(Default)]
pub(super) struct Timer {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Timer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Timer")
    }
}

impl Timer {
    pub fn schedule(&self, at: Instant, job: impl FnOnce() + Send + 'static) {
        let mut s = self.shared.state.lock();
        s.seq += 1;
        let seq = s.seq;
        s.heap.push(Reverse(Entry {
            at,
            seq,
            job: Box::new(job),
        }));
        if !s.started {
            s.started = true;
            let shared = self.shared.clone();
            std::thread::Builder::new()
                .name("dmkit-sim-timer".into())
                .spawn(move || run(&shared))
                .expect("spawn the sim timer thread");
        }
        self.shared.cv.notify_all();
    }
}

impl Drop for Timer {
    fn drop(&mut self) {
        self.shared.state.lock().stop = true;
        self.shared.cv.notify_all();
    }
}

fn run(shared: &Shared) {
    let mut s = shared.state.lock();
    loop {
        let now = Instant::now();
        match s.heap.peek() {
            Some(Reverse(e)) if e.at <= now => {
                let Reverse(e) = s.heap.pop().expect("peeked");
                drop(s);
                (e.job)();
                s = shared.state.lock();
            }
            Some(Reverse(e)) => {
                let at = e.at;
                shared.cv.wait_until(&mut s, at);
            }
            None if s.stop => return,
            None => shared.cv.wait(&mut s),
        }
    }
}
