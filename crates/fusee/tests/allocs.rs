//! Heap allocations on the caller's thread per operation (its critical path: the
//! background cleanup runs elsewhere), on sim and tcp, r = 1 and 3. Under emulation (the
//! SoftRoCE tier) every allocation and copy of a value shows in the latency, so the sim
//! counts have ceilings: a change that adds per-operation allocations fails here first.
//! `DMKIT_ALLOC_SITES=1` prints where each allocation of one UPDATE, SEARCH, DELETE and
//! INSERT comes from (size and the innermost dmkit frames).

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use dmkit_fusee::{Client, LocalCluster, LocalConfig};

struct Counting;

thread_local! {
    static TRACE: Cell<bool> = const { Cell::new(false) };
    static SITES: std::cell::RefCell<Vec<(usize, String)>> = const { std::cell::RefCell::new(Vec::new()) };
    static ALLOCS: Cell<u64> = const { Cell::new(0) };
    static BYTES: Cell<u64> = const { Cell::new(0) };
}

// SAFETY: forwards to the system allocator; the counters are const-initialized thread
// locals without destructors, so touching them never allocates.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        ALLOCS.with(|c| c.set(c.get() + 1));
        BYTES.with(|c| c.set(c.get() + l.size() as u64));
        if TRACE.with(|t| t.replace(false)) {
            let bt = std::backtrace::Backtrace::force_capture().to_string();
            let site: Vec<String> = bt
                .lines()
                .filter(|l| l.contains("dmkit") && !l.contains("allocs::") && l.contains(": "))
                .take(3)
                .map(|l| l.trim().to_string())
                .collect();
            SITES.with(|s| s.borrow_mut().push((l.size(), site.join(" < "))));
            TRACE.with(|t| t.set(true));
        }
        // SAFETY: the caller's contract, passed on.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: the caller's contract, passed on.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        ALLOCS.with(|c| c.set(c.get() + 1));
        BYTES.with(|c| c.set(c.get() + n as u64));
        // SAFETY: the caller's contract, passed on.
        unsafe { System.realloc(p, l, n) }
    }
}

#[global_allocator]
static A: Counting = Counting;

fn count<T>(c: &Client, op: impl FnOnce() -> T) -> (u64, u64) {
    c.flush().unwrap();
    let (a0, b0) = (ALLOCS.with(Cell::get), BYTES.with(Cell::get));
    let _ = op();
    (ALLOCS.with(Cell::get) - a0, BYTES.with(Cell::get) - b0)
}

/// Mean allocations per INSERT, SEARCH, UPDATE, DELETE.
fn probe(cluster: &LocalCluster, name: &str) -> [u64; 4] {
    let c = cluster.client(1).unwrap();
    let v = vec![7u8; 1000];
    for i in 0..20 {
        let k = format!("warm-{i}").into_bytes();
        c.insert(&k, &v).unwrap();
        c.update(&k, &v).unwrap();
        c.search(&k).unwrap();
        c.delete(&k).unwrap();
    }
    let mut rows = vec![(0, 0); 4];
    const N: u64 = 50;
    for i in 0..N {
        let k = format!("key-{i:04}").into_bytes();
        let r = [
            count(&c, || c.insert(&k, &v).unwrap()),
            count(&c, || {
                c.search(&k).unwrap();
            }),
            count(&c, || c.update(&k, &v).unwrap()),
            count(&c, || {
                c.delete(&k).unwrap();
            }),
        ];
        for (row, x) in rows.iter_mut().zip(r) {
            row.0 += x.0;
            row.1 += x.1;
        }
    }
    let k = b"key-0001".to_vec();
    c.insert(&k, &v).unwrap();
    let sites = std::env::var_os("DMKIT_ALLOC_SITES").is_some();
    for (name, op) in [("update", 0), ("search", 1), ("delete", 2), ("insert", 3)] {
        c.flush().unwrap();
        TRACE.with(|t| t.set(sites));
        match op {
            0 => drop(c.update(&k, &v).unwrap()),
            1 => drop(c.search(&k).unwrap()),
            2 => drop(c.delete(&k).unwrap()),
            _ => drop(c.insert(&k, &v).unwrap()),
        }
        TRACE.with(|t| t.set(false));
        for (size, site) in SITES.with(|s| std::mem::take(&mut *s.borrow_mut())) {
            eprintln!("{name} {size:>6} {site}");
        }
    }
    for (op, (n, b)) in ["insert", "search", "update", "delete"].iter().zip(&rows) {
        eprintln!("{name} {op}: {} allocations, {} bytes per op", n / N, b / N);
    }
    [0, 1, 2, 3].map(|i| rows[i].0 / N)
}

#[test]
fn allocations_per_operation() {
    // Measured 2026-12-04 (sim): r = 1 [50, 15, 41, 45], r = 3 [78, 15, 69, 67]; the
    // ceilings leave a little room.
    let ceilings = [(1, [57, 18, 47, 52]), (3, [90, 18, 80, 77])];
    for (r, ceiling) in ceilings {
        let cluster = LocalCluster::start(LocalConfig::new(3, r)).unwrap();
        let got = probe(&cluster, &format!("sim r={r}"));
        for ((op, n), max) in ["insert", "search", "update", "delete"]
            .iter()
            .zip(got)
            .zip(ceiling)
        {
            assert!(
                n <= max,
                "sim r={r}: {op} allocates {n} times, more than {max}"
            );
        }
        let cluster = LocalCluster::start_tcp(LocalConfig::new(3, r)).unwrap();
        probe(&cluster, &format!("tcp r={r}"));
    }
}
