//! A client's access counting towards many servers: one [`AccessCounter`] per server (each
//! server selects among the objects it holds), and the cadence of the client's reports — a
//! window ends every `report_every` accesses, whichever servers they went to.
//!
//! ```
//! use dmkit_cache::{AccessReporter, CounterConfig};
//!
//! // Servers 0 and 1; a report every 3 accesses.
//! let reporter = AccessReporter::new([0u16, 1], CounterConfig::default(), 3)?;
//! assert!(!reporter.record(&0, 7));
//! assert!(!reporter.record(&0, 7));
//! assert!(reporter.record(&0, 8)); // the window is over: time to report
//! let reports = reporter.end_window(/* client */ 5);
//! // Only server 0 saw accesses.
//! assert_eq!(reports.len(), 1);
//! assert_eq!((reports[0].0, reports[0].1.entries[0].obj), (0, 7));
//! # Ok::<(), dmkit_cache::CacheError>(())
//! ```

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::counter::{AccessCounter, AccessReport, CounterConfig};
use crate::error::CacheError;

/// Access counters per server and the report cadence (see the module docs).
#[derive(Debug)]
pub struct AccessReporter<K> {
    counters: BTreeMap<K, AccessCounter>,
    accesses: AtomicU64,
    report_every: u64,
}

impl<K: Ord + Clone> AccessReporter<K> {
    /// A counter per server of `servers`; a window every `report_every` accesses.
    pub fn new(
        servers: impl IntoIterator<Item = K>,
        config: CounterConfig,
        report_every: u64,
    ) -> Result<Self, CacheError> {
        if report_every == 0 {
            return Err(CacheError::Zero {
                what: "report_every",
            });
        }
        let counters = servers
            .into_iter()
            .map(|k| Ok((k, AccessCounter::new(config)?)))
            .collect::<Result<_, CacheError>>()?;
        Ok(Self {
            counters,
            accesses: AtomicU64::new(0),
            report_every,
        })
    }

    /// Counts an access to `obj` on `server` (unknown servers are not counted, but their
    /// accesses keep the cadence); true when the window is over and it is time to report.
    pub fn record(&self, server: &K, obj: u64) -> bool {
        if let Some(c) = self.counters.get(server) {
            c.record(obj);
        }
        let n = self.accesses.fetch_add(1, Ordering::Relaxed) + 1;
        n % self.report_every == 0
    }

    /// Ends the window: the report for each server that saw hot objects in it, in server
    /// order.
    pub fn end_window(&self, client: u64) -> Vec<(K, AccessReport)> {
        self.counters
            .iter()
            .map(|(k, c)| (k.clone(), c.end_window(client)))
            .filter(|(_, r)| !r.entries.is_empty())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_follow_the_cadence_and_start_from_zero() {
        assert!(AccessReporter::new([1], CounterConfig::default(), 0).is_err());
        let r = AccessReporter::new([1, 2], CounterConfig::default(), 2).unwrap();
        assert!(!r.record(&9, 1), "an unknown server keeps the cadence");
        assert!(r.record(&2, 5));
        let reports = r.end_window(3);
        assert_eq!(reports.len(), 1);
        assert_eq!((reports[0].0, reports[0].1.client), (2, 3));
        assert!(r.end_window(3).is_empty());
    }
}
