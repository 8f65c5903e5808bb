//! Free-space figures and the metrics that publish them.

use metrics::{Counter, Gauge};

/// A snapshot of a pool's space (Gengar servers report free NVM in every reply).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolStats {
    /// Bytes per block.
    pub block_size: usize,
    /// Blocks in the pool.
    pub block_count: usize,
    /// Blocks nobody owns.
    pub free_blocks: usize,
    /// Blocks held by the object allocator.
    pub object_blocks: usize,
    /// Live objects.
    pub live_objects: usize,
    /// Bytes in free blocks plus free object slots.
    pub free_bytes: u64,
}

/// The pool's metrics, labelled with its uuid; names follow `dmkit_pmem_pool_<what>_<unit>`.
pub(crate) struct PoolMetrics {
    allocated_blocks: Gauge,
    free_bytes: Gauge,
    live_objects: Gauge,
    pub object_allocs: Counter,
    pub object_frees: Counter,
    pub recovered_log_entries: Counter,
}

impl PoolMetrics {
    /// The metrics of a pool on a file; `exported = false` (a DRAM pool: volatile memory a
    /// server reports in its own terms) records nothing.
    pub fn new(uuid: String, exported: bool) -> Self {
        if !exported {
            return PoolMetrics {
                allocated_blocks: Gauge::noop(),
                free_bytes: Gauge::noop(),
                live_objects: Gauge::noop(),
                object_allocs: Counter::noop(),
                object_frees: Counter::noop(),
                recovered_log_entries: Counter::noop(),
            };
        }
        PoolMetrics {
            allocated_blocks: metrics::gauge!("dmkit_pmem_pool_allocated_blocks", "pool" => uuid.clone()),
            free_bytes: metrics::gauge!("dmkit_pmem_pool_free_bytes", "pool" => uuid.clone()),
            live_objects: metrics::gauge!("dmkit_pmem_pool_live_objects", "pool" => uuid.clone()),
            object_allocs: metrics::counter!("dmkit_pmem_pool_object_allocs_total", "pool" => uuid.clone()),
            object_frees: metrics::counter!("dmkit_pmem_pool_object_frees_total", "pool" => uuid.clone()),
            recovered_log_entries: metrics::counter!(
                "dmkit_pmem_pool_recovered_log_entries_total",
                "pool" => uuid
            ),
        }
    }

    pub fn publish(&self, s: &PoolStats) {
        self.allocated_blocks
            .set((s.block_count - s.free_blocks) as f64);
        self.free_bytes.set(s.free_bytes as f64);
        self.live_objects.set(s.live_objects as f64);
    }
}

impl std::fmt::Debug for PoolMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PoolMetrics").finish_non_exhaustive()
    }
}
