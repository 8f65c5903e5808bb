//! The server's global choice of hot objects from many clients' window reports.

use std::collections::HashMap;

use parking_lot::Mutex;

use crate::counter::AccessReport;

/// An object chosen (or a candidate) for the DRAM buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct HotObject {
    /// The object.
    pub obj: u64,
    /// Its accesses in the window, summed over all reporting clients.
    pub count: u64,
    /// Its size in bytes.
    pub size: u64,
}

/// A window's global selection.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Selection {
    /// The selected objects, hottest first; their sizes sum to at most the capacity.
    pub hot: Vec<HotObject>,
    /// The count of the coldest selected object (at least `min_count`): the hotness an
    /// object needed this window to be selected. Zero when nothing was selected.
    pub threshold: u64,
    /// Sum of the selected objects' sizes.
    pub bytes: u64,
    /// Distinct objects reported in the window.
    pub candidates: usize,
}

/// Merges clients' [`AccessReport`]s of one window and selects the globally hottest objects
/// that fit in a DRAM budget.
///
/// Clients report only their top objects, so a merged count is a lower bound of the global
/// count (an object below one client's top-k contributes nothing from that client); memory
/// is bounded by clients × top-k per window.
#[derive(Debug)]
pub struct GlobalSelector {
    min_count: u64,
    window: Mutex<Merged>,
}

#[derive(Debug, Default)]
struct Merged {
    counts: HashMap<u64, u64>,
    reports: u64,
}

impl GlobalSelector {
    /// A selector that never selects objects with fewer than `min_count` merged accesses.
    pub fn new(min_count: u64) -> Self {
        Self {
            min_count,
            window: Mutex::new(Merged::default()),
        }
    }

    /// Adds one client's report to the current window.
    pub fn merge(&self, report: &AccessReport) {
        let mut w = self.window.lock();
        for e in &report.entries {
            *w.counts.entry(e.obj).or_default() += e.count;
        }
        w.reports += 1;
    }

    /// Reports merged in the current window.
    pub fn reports(&self) -> u64 {
        self.window.lock().reports
    }

    /// The hottest objects of the current window whose sizes fit in `capacity_bytes`, taken
    /// greedily by count (an object that does not fit is skipped, smaller colder ones may
    /// still fit). `size_of` gives an object's size, `None` if it no longer exists.
    pub fn select(&self, capacity_bytes: u64, size_of: impl Fn(u64) -> Option<u64>) -> Selection {
        let w = self.window.lock();
        let mut ranked: Vec<(u64, u64)> = w
            .counts
            .iter()
            .filter(|&(_, &c)| c >= self.min_count)
            .map(|(&o, &c)| (c, o))
            .collect();
        ranked.sort_unstable_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
        let mut selection = Selection {
            candidates: w.counts.len(),
            ..Selection::default()
        };
        for (count, obj) in ranked {
            let Some(size) = size_of(obj) else { continue };
            if selection.bytes + size > capacity_bytes {
                continue;
            }
            selection.bytes += size;
            selection.threshold = count;
            selection.hot.push(HotObject { obj, count, size });
        }
        metrics::gauge!("dmkit_cache_selected_bytes").set(selection.bytes as f64);
        selection
    }

    /// [`select`](Self::select)s, then starts the next window from nothing.
    pub fn finish_window(
        &self,
        capacity_bytes: u64,
        size_of: impl Fn(u64) -> Option<u64>,
    ) -> Selection {
        let selection = self.select(capacity_bytes, size_of);
        *self.window.lock() = Merged::default();
        selection
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::counter::HotEntry;

    fn report(client: u64, entries: &[(u64, u64)]) -> AccessReport {
        let entries = entries
            .iter()
            .map(|&(obj, count)| HotEntry { obj, count })
            .collect();
        AccessReport {
            client,
            window: 0,
            total_accesses: 0,
            entries,
        }
    }

    #[test]
    fn counts_from_all_clients_are_summed() {
        let s = GlobalSelector::new(1);
        s.merge(&report(1, &[(10, 5), (11, 3)]));
        s.merge(&report(2, &[(11, 4), (12, 1)]));
        let sel = s.select(u64::MAX, |_| Some(1));
        let got: Vec<(u64, u64)> = sel.hot.iter().map(|h| (h.obj, h.count)).collect();
        assert_eq!(got, vec![(11, 7), (10, 5), (12, 1)]);
        assert_eq!(sel.candidates, 3);
        assert_eq!(s.reports(), 2);
    }

    #[test]
    fn selection_fits_the_capacity_in_bytes() {
        let s = GlobalSelector::new(1);
        s.merge(&report(1, &[(1, 100), (2, 90), (3, 80), (4, 70)]));
        let sizes = |o: u64| Some([0, 600, 500, 300, 100][o as usize]);
        let sel = s.select(1_000, sizes);
        // 1 (600) fits, 2 (500) does not, 3 (300) does, 4 (100) does.
        assert_eq!(
            sel.hot.iter().map(|h| h.obj).collect::<Vec<_>>(),
            vec![1, 3, 4]
        );
        assert_eq!(sel.bytes, 1_000);
        assert_eq!(sel.threshold, 70);
    }

    #[test]
    fn objects_below_min_count_or_gone_are_never_selected() {
        let s = GlobalSelector::new(10);
        s.merge(&report(1, &[(1, 50), (2, 9), (3, 40)]));
        let sel = s.select(u64::MAX, |o| (o != 3).then_some(8));
        assert_eq!(
            sel.hot,
            vec![HotObject {
                obj: 1,
                count: 50,
                size: 8
            }]
        );
        assert_eq!(sel.threshold, 50);
    }

    #[test]
    fn finishing_a_window_forgets_it() {
        let s = GlobalSelector::new(1);
        s.merge(&report(1, &[(1, 5)]));
        assert_eq!(s.finish_window(100, |_| Some(1)).hot.len(), 1);
        assert_eq!(s.select(100, |_| Some(1)), Selection::default());
    }
}
