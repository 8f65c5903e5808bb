//! Clients read objects with a skewed (Zipf-like) popularity; each window they report their
//! hot objects, the server selects globally under a DRAM budget and plans promotions and
//! evictions. Halfway through, popularity shifts to other objects. A client address cache
//! serves the lookups and is bypassed during a scan that would only pollute it.
//!
//! Run with `cargo run -p dmkit-cache --example hot_selection`.

use dmkit_cache::{
    AccessCounter, AddressCache, AddressCacheConfig, AdmissionConfig, CacheError, CounterConfig,
    DramCachePolicy, GlobalSelector,
};

const OBJECTS: u64 = 10_000;
const OBJECT_SIZE: u64 = 4096;
const CLIENTS: u64 = 4;

/// A cheap deterministic generator, so that the example needs no dependency.
fn next(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

/// Rank `r` with probability roughly proportional to 1/r (log-uniform draw).
fn skewed(state: &mut u64) -> u64 {
    let u = (next(state) % 1_000_000) as f64 / 1_000_000.0;
    ((OBJECTS as f64).powf(u) as u64).saturating_sub(1)
}

fn main() -> Result<(), CacheError> {
    let counters: Vec<AccessCounter> = (0..CLIENTS)
        .map(|_| {
            AccessCounter::new(CounterConfig {
                top_k: 64,
                ..CounterConfig::default()
            })
        })
        .collect::<Result<_, _>>()?;
    let selector = GlobalSelector::new(20);
    let capacity = 32 * OBJECT_SIZE;
    let mut dram = DramCachePolicy::new(AdmissionConfig {
        capacity_bytes: capacity,
        ..AdmissionConfig::default()
    })?;
    let addresses: AddressCache<u64, u64> = AddressCache::new(AddressCacheConfig {
        capacity: 512,
        ..AddressCacheConfig::default()
    })?;

    let mut rng = 0x9E37_79B9_7F4A_7C15;
    println!(
        "{:>6} {:>9} {:>8} {:>6} {:>9} {:>10}",
        "window", "threshold", "promote", "evict", "resident", "addr hits"
    );
    for window in 0..10u64 {
        // From window 5 on, a different set of objects is popular.
        let shift = if window >= 5 { 5_000 } else { 0 };
        let scan = window == 7;
        for (client, counter) in counters.iter().enumerate() {
            for i in 0..20_000u64 {
                let obj = if scan {
                    (i * 7 + client as u64) % OBJECTS
                } else {
                    (skewed(&mut rng) + shift) % OBJECTS
                };
                counter.record(obj);
                if addresses.should_bypass() || addresses.get(&obj).is_none() {
                    addresses.insert(obj, obj * OBJECT_SIZE);
                }
            }
            selector.merge(&counter.end_window(client as u64));
        }
        let selection = selector.finish_window(capacity, |_| Some(OBJECT_SIZE));
        let plan = dram.plan(&selection.hot);
        let stats = addresses.stats();
        let hit_ratio = stats.hits as f64 / (stats.hits + stats.misses).max(1) as f64;
        println!(
            "{window:>6} {:>9} {:>8} {:>6} {:>9} {:>9.0}%{}",
            selection.threshold,
            plan.promote.len(),
            plan.evict.len(),
            dram.len(),
            hit_ratio * 100.0,
            if stats.bypassing { " (bypassing)" } else { "" },
        );
    }
    println!("address cache: {:?}", addresses.stats());
    Ok(())
}
