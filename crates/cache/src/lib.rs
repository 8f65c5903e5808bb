//! Hot-object caching for disaggregated memory, shared by Gengar and FUSEE: windowed access
//! counting in bounded memory, global hot-object selection under a DRAM budget, DRAM buffer
//! admission and eviction, and a client-side address cache that steps aside when it does
//! not pay.
//!
//! - [`AccessCounter`] (a [`CountMinSketch`] plus a top-k set) counts a client's accesses per
//!   window and produces an [`AccessReport`].
//! - [`AccessReporter`] keeps a client's counters per server and ends a window every so many
//!   accesses.
//! - [`GlobalSelector`] merges many clients' reports and picks the hottest objects whose sizes
//!   fit the DRAM buffer ([`Selection`]).
//! - [`DramCachePolicy`] turns selections into a [`Plan`] (evict these, promote those), with
//!   hysteresis and a minimum residency so that objects do not flap; the caller copies.
//! - [`AddressCache`] is a bounded CLOCK cache with hit/miss statistics that reports
//!   [`should_bypass`](AddressCache::should_bypass) while its miss ratio is high.
//! - [`DecayedHeat`] carries heat across windows (decayed) and splits what fits a budget into
//!   hot and lukewarm objects.
//! - [`Residency`] tracks which objects a DRAM buffer holds and plans, window by window, what
//!   to promote and demote (heat, selection and admission together); the caller copies.
//! - [`HotTier`] puts counting, selection, admission and the resident copies together, for a
//!   process that keeps hot objects' bytes in its own DRAM.
//! - [`WindowThread`] ends a window every period on a background thread, for as long as its
//!   owner (a server) and the handle live.
//!
//! ```
//! use dmkit_cache::{AccessCounter, AdmissionConfig, CounterConfig, DramCachePolicy, GlobalSelector};
//!
//! // Two clients count their reads during a window and report.
//! let (a, b) = (AccessCounter::new(CounterConfig::default())?, AccessCounter::new(CounterConfig::default())?);
//! a.record_n(7, 90);
//! a.record_n(8, 5);
//! b.record_n(7, 30);
//! b.record_n(9, 60);
//!
//! // The server merges the reports and selects what fits in 2 KiB of DRAM (1 KiB objects).
//! let selector = GlobalSelector::new(10);
//! selector.merge(&a.end_window(1));
//! selector.merge(&b.end_window(2));
//! let selection = selector.finish_window(2048, |_obj| Some(1024));
//! assert_eq!(selection.hot.iter().map(|h| h.obj).collect::<Vec<_>>(), vec![7, 9]);
//!
//! // The policy decides what to copy; the server does the copying (after leases expire).
//! let mut dram = DramCachePolicy::new(AdmissionConfig { capacity_bytes: 2048, ..AdmissionConfig::default() })?;
//! let plan = dram.plan(&selection.hot);
//! assert_eq!(plan.promote.len(), 2);
//! assert!(plan.evict.is_empty());
//! # Ok::<(), dmkit_cache::CacheError>(())
//! ```
//!
//! `examples/hot_selection.rs` runs clients on a Zipfian workload through all of these and
//! prints, window by window, what the DRAM buffer holds and how the address cache fares.

mod address;
mod admission;
mod counter;
mod error;
mod heat;
mod reporter;
mod residency;
mod selector;
mod sketch;
mod tier;
mod window;

pub use address::{AddressCache, AddressCacheConfig, AddressCacheStats};
pub use admission::{AdmissionConfig, DramCachePolicy, Plan};
pub use counter::{AccessCounter, AccessReport, CounterConfig, HotEntry};
pub use error::CacheError;
pub use heat::DecayedHeat;
pub use reporter::AccessReporter;
pub use residency::{Applied, Residency, ResidencyConfig};
pub use selector::{GlobalSelector, HotObject, Selection};
pub use sketch::CountMinSketch;
pub use tier::HotTier;
pub use window::WindowThread;
