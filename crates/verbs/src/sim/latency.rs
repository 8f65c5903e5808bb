//! The latency model of the sim backend, in virtual time. Every figure is a setting; the
//! defaults are FUSEE's testbed network (2 µs round trip, 56 Gbit/s) and Gengar's measured
//! Optane DC PMM media. Modeled figures are labelled as modeled wherever they are reported.

use std::collections::VecDeque;
use std::time::Duration;

use super::SimNode;
use crate::batch::Batch;
use crate::node::OpKind;
use crate::types::Media;

/// Costs of the modeled network and media.
#[derive(Debug, Clone)]
pub struct LatencyModel {
    /// Small-message round trip (both directions together).
    pub rtt: Duration,
    /// Link bandwidth in Gbit/s.
    pub link_gbps: f64,
    pub nvm_read: Duration,
    pub nvm_write: Duration,
    pub dram_read: Duration,
    pub dram_write: Duration,
    /// Per-node DRAM bandwidth in GB/s; NVM reads get a third of it, NVM writes a sixth.
    pub dram_gbytes_per_sec: f64,
    pub nvm_read_share: f64,
    pub nvm_write_share: f64,
}

impl Default for LatencyModel {
    fn default() -> Self {
        Self {
            rtt: Duration::from_nanos(2000),
            link_gbps: 56.0,
            nvm_read: Duration::from_nanos(700),
            nvm_write: Duration::from_nanos(2300),
            dram_read: Duration::from_nanos(233),
            dram_write: Duration::from_nanos(233),
            dram_gbytes_per_sec: 20.0,
            nvm_read_share: 1.0 / 3.0,
            nvm_write_share: 1.0 / 6.0,
        }
    }
}

impl LatencyModel {
    fn wire_ns(&self, bytes: u64) -> u64 {
        // Gbit/s = bits per ns.
        ((bytes * 8) as f64 / self.link_gbps) as u64
    }

    fn media_cost(&self, media: Media, write: bool, bytes: u64) -> (u64, u64) {
        let bw = self.dram_gbytes_per_sec
            * match (media, write) {
                (Media::Dram, _) => 1.0,
                (Media::Nvm, false) => self.nvm_read_share,
                (Media::Nvm, true) => self.nvm_write_share,
            };
        let lat = match (media, write) {
            (Media::Dram, false) => self.dram_read,
            (Media::Dram, true) => self.dram_write,
            (Media::Nvm, false) => self.nvm_read,
            (Media::Nvm, true) => self.nvm_write,
        };
        // GB/s = bytes per ns.
        let occupancy = (bytes as f64 / bw.max(1e-9)) as u64;
        (lat.as_nanos() as u64, occupancy)
    }

    /// When a batch posted at `start` completes: requests cross the link, queue at the node's
    /// media (which stays busy for their bytes), execute in order, and the reply comes back.
    pub(super) fn batch_done(&self, node: &SimNode, start: u64, batch: &Batch) -> u64 {
        let half = self.rtt.as_nanos() as u64 / 2;
        let mut sent = 0u64;
        let mut back = 0u64;
        let mut done = start + half;
        let mut busy = node.busy.lock();
        for op in &batch.ops {
            let len = u64::from(op.len);
            let write = matches!(op.kind, OpKind::Write { .. });
            if write {
                sent += len;
            } else {
                back += len;
            }
            let media = node.node.media_of(op.rkey).unwrap_or(Media::Dram);
            let slot = usize::from(media == Media::Nvm);
            let arrival = start + half + self.wire_ns(sent);
            let (lat, occ) = self.media_cost(media, write, len);
            // Requests pipeline through the NIC; the medium serialises only their bytes.
            let begin = busy[slot].book(arrival, occ);
            done = done.max(begin + lat + occ);
        }
        done + half + self.wire_ns(back)
    }

    pub(super) fn rpc_done(&self, start: u64, bytes: usize) -> u64 {
        start + self.rtt.as_nanos() as u64 + self.wire_ns(bytes as u64)
    }
}

/// The periods in which one medium of a node is busy, in virtual time: sorted, disjoint
/// `[start, end)` spans. Clients' clocks are independent (a fork starts at its parent's time),
/// so work can arrive at a virtual time before work already booked; it takes the first free
/// gap at or after its arrival instead of queueing behind everything booked so far.
#[derive(Debug, Default)]
pub(super) struct Calendar {
    spans: VecDeque<(u64, u64)>,
}

/// Spans kept per medium; the oldest are forgotten beyond it (bounded memory).
const MAX_SPANS: usize = 4096;

impl Calendar {
    /// Books `occ` ns of the medium at or after `arrival`; returns when the work begins.
    pub(super) fn book(&mut self, arrival: u64, occ: u64) -> u64 {
        if occ == 0 {
            return arrival;
        }
        let mut i = self.spans.partition_point(|&(_, end)| end <= arrival);
        let mut begin = arrival;
        while let Some(&(start, end)) = self.spans.get(i) {
            if begin + occ <= start {
                break;
            }
            begin = begin.max(end);
            i += 1;
        }
        let end = begin + occ;
        let joins_prev = i > 0 && self.spans[i - 1].1 == begin;
        let joins_next = self.spans.get(i).is_some_and(|&(start, _)| start == end);
        match (joins_prev, joins_next) {
            (true, true) => {
                self.spans[i - 1].1 = self.spans[i].1;
                self.spans.remove(i);
            }
            (true, false) => self.spans[i - 1].1 = end,
            (false, true) => self.spans[i].0 = begin,
            (false, false) => {
                self.spans.insert(i, (begin, end));
                if self.spans.len() > MAX_SPANS {
                    self.spans.pop_front();
                }
            }
        }
        begin
    }
}

#[cfg(test)]
mod tests {
    use super::Calendar;

    #[test]
    fn calendar_queues_overlapping_work_and_fills_earlier_gaps() {
        let mut c = Calendar::default();
        assert_eq!(c.book(100, 10), 100);
        assert_eq!(c.book(100, 10), 110); // queued behind
        assert_eq!(c.book(105, 10), 120);
        assert_eq!(c.book(1000, 10), 1000);
        // Work arriving "earlier" (another client's clock) uses the free time then.
        assert_eq!(c.book(0, 10), 0);
        assert_eq!(c.book(130, 50), 130);
        assert_eq!(c.book(150, 900), 1010); // no gap of 900 before 1010
        assert_eq!(c.book(5, 0), 5);
    }
}
