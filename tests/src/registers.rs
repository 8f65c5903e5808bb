//! A checker for histories of single-writer registers, as process tests log them: every key
//! is written by one client at a time (`dmkit ycsb --partition`), each write's value is unique
//! and carries a tag whose counter grows with every write of its writer (across restarts),
//! and the logs hold each acknowledged write's invocation and acknowledgement times and each
//! read's invocation and return times, on the host's one clock.
//!
//! For such a register a history is linearizable when every read returns a value some write
//! produced and (1) no write acknowledged before the read began is newer than what it
//! returned (no stale read), (2) the write it returned was invoked before it returned (no
//! read from the future), and (3) no read that returned before it began returned a newer
//! write (no new-old inversion). Writes killed in flight are never acknowledged: a read may
//! return one (its tag is simply not in the logs), but (1) and (3) still hold for it.
//!
//! ```
//! use dmkit_tests::registers::{Read, Write, check};
//! let w = |counter, start, end| Write { key: "k".into(), counter, hash: counter, start, end };
//! let r = |counter, start, end| Read {
//!     key: "k".into(), counter: Some(counter), hash: Some(counter), start, end,
//! };
//! // A read after an acknowledged write that returns the value before it: stale.
//! let bad = check(&[w(1, 0, 10), w(2, 20, 30)], &[r(1, 40, 50)]);
//! assert_eq!(bad.len(), 1);
//! assert!(check(&[w(1, 0, 10), w(2, 20, 30)], &[r(1, 25, 50), r(2, 26, 51)]).is_empty());
//! ```

use std::collections::HashMap;
use std::path::Path;

/// An acknowledged write.
#[derive(Clone, Debug)]
pub struct Write {
    pub key: String,
    /// The counter of the value's tag (`c<id>:<counter>`).
    pub counter: u64,
    /// The value's hash.
    pub hash: u64,
    /// Invoked at (µs).
    pub start: u128,
    /// Acknowledged at (µs).
    pub end: u128,
}

/// A read that returned.
#[derive(Clone, Debug)]
pub struct Read {
    pub key: String,
    /// The counter of the returned value's tag; `None` if the key was absent.
    pub counter: Option<u64>,
    /// The returned value's hash; `None` if absent.
    pub hash: Option<u64>,
    pub start: u128,
    pub end: u128,
}

fn counter_of(tag: &str) -> Option<u64> {
    tag.strip_prefix('c')?.split_once(':')?.1.parse().ok()
}

/// Reads a `dmkit ycsb --ack-log` file (six fields a line; older four-field lines, which
/// have no invocation time, are skipped).
pub fn read_writes(log: &Path) -> Vec<Write> {
    let text = std::fs::read_to_string(log)
        .unwrap_or_else(|e| panic!("read the ack log {}: {e}", log.display()));
    text.lines()
        .filter_map(|line| {
            let f: Vec<_> = line.split('\t').collect();
            if f.len() < 6 {
                return None;
            }
            Some(Write {
                key: f[0].to_string(),
                counter: counter_of(f[1]).unwrap_or_else(|| panic!("bad tag in {line:?}")),
                hash: u64::from_str_radix(f[2], 16).unwrap_or_else(|_| panic!("{line:?}")),
                start: f[4].parse().unwrap_or_else(|_| panic!("{line:?}")),
                end: f[5].parse().unwrap_or_else(|_| panic!("{line:?}")),
            })
        })
        .collect()
}

/// Reads a `dmkit ycsb --read-log` file. A value whose tag cannot be read gets counter
/// `Some(u64::MAX)` (the checker reports it).
pub fn read_reads(log: &Path) -> Vec<Read> {
    let text = std::fs::read_to_string(log)
        .unwrap_or_else(|e| panic!("read the read log {}: {e}", log.display()));
    text.lines()
        .filter_map(|line| {
            let f: Vec<_> = line.split('\t').collect();
            // (A process killed mid-line leaves a partial last line.)
            if f.len() < 5 {
                return None;
            }
            let (counter, hash) = if f[1] == "-" {
                (None, None)
            } else {
                (
                    Some(counter_of(f[1]).unwrap_or(u64::MAX)),
                    u64::from_str_radix(f[2], 16).ok(),
                )
            };
            Some(Read {
                key: f[0].to_string(),
                counter,
                hash,
                start: f[3].parse().ok()?,
                end: f[4].parse().ok()?,
            })
        })
        .collect()
}

/// Every violation of (1)–(3) above, and every read of a value no writer could have
/// produced, as messages; empty when the history is linearizable.
pub fn check(writes: &[Write], reads: &[Read]) -> Vec<String> {
    let mut by_key: HashMap<&str, (Vec<&Write>, Vec<&Read>)> = HashMap::new();
    for w in writes {
        by_key.entry(&w.key).or_default().0.push(w);
    }
    for r in reads {
        by_key.entry(&r.key).or_default().1.push(r);
    }
    let mut bad = Vec::new();
    for (key, (mut ws, mut rs)) in by_key {
        ws.sort_by_key(|w| w.end);
        let by_counter: HashMap<u64, &Write> = ws.iter().map(|w| (w.counter, *w)).collect();
        // Reads by return time, for the inversion check.
        let mut by_end: Vec<&Read> = rs.clone();
        by_end.sort_by_key(|r| r.end);
        rs.sort_by_key(|r| r.start);
        // Sweeps in invocation order: the newest write acknowledged, and the newest read
        // returned, before each read began.
        let (mut wi, mut ri) = (0, 0);
        let (mut acked, mut returned): (Option<&Write>, Option<&Read>) = (None, None);
        for r in rs {
            while wi < ws.len() && ws[wi].end < r.start {
                if acked.is_none_or(|a| ws[wi].counter > a.counter) {
                    acked = Some(ws[wi]);
                }
                wi += 1;
            }
            while ri < by_end.len() && by_end[ri].end < r.start {
                let q = by_end[ri];
                if q.counter.is_some_and(|c| c != u64::MAX)
                    && returned.is_none_or(|p| q.counter.unwrap_or(0) > p.counter.unwrap_or(0))
                {
                    returned = Some(q);
                }
                ri += 1;
            }
            let span = format!("read of {key} [{} .. {}] us", r.start, r.end);
            let Some(c) = r.counter else {
                if let Some(a) = acked {
                    bad.push(format!(
                        "{span} found no value, but the write of counter {} was acknowledged \
                         at {} us",
                        a.counter, a.end
                    ));
                }
                continue;
            };
            if c == u64::MAX {
                bad.push(format!("{span} returned a value with no writer's tag"));
                continue;
            }
            if let Some(a) = acked.filter(|a| a.counter > c) {
                bad.push(format!(
                    "{span} returned counter {c}, older than counter {} acknowledged at {} us",
                    a.counter, a.end
                ));
            }
            if let Some(w) = by_counter.get(&c) {
                if w.start > r.end {
                    bad.push(format!(
                        "{span} returned counter {c}, whose write was invoked at {} us",
                        w.start
                    ));
                }
                if r.hash.is_some_and(|h| h != w.hash) {
                    bad.push(format!("{span} returned counter {c} with other bytes"));
                }
            }
            if let Some(p) = returned.filter(|p| p.counter.is_some_and(|pc| pc > c)) {
                bad.push(format!(
                    "{span} returned counter {c}, older than counter {:?} an earlier read \
                     returned [{} .. {}] us",
                    p.counter, p.start, p.end
                ));
            }
        }
    }
    bad.sort();
    bad
}

#[cfg(test)]
mod tests {
    use super::*;

    fn w(counter: u64, start: u128, end: u128) -> Write {
        Write {
            key: "k".into(),
            counter,
            hash: counter * 7,
            start,
            end,
        }
    }

    fn r(counter: Option<u64>, start: u128, end: u128) -> Read {
        Read {
            key: "k".into(),
            counter,
            hash: counter.map(|c| c.wrapping_mul(7)),
            start,
            end,
        }
    }

    #[test]
    fn a_linearizable_history_passes() {
        let ws = [w(1, 0, 10), w(2, 20, 30), w(3, 40, 50)];
        let rs = [
            r(Some(1), 11, 19),
            r(Some(1), 21, 29), // concurrent with write 2: either is fine
            r(Some(2), 22, 28),
            r(Some(2), 31, 45),
            r(Some(3), 41, 60),
            r(Some(9), 70, 80), // a write killed in flight (never acknowledged)
        ];
        assert_eq!(check(&ws, &rs), Vec::<String>::new());
    }

    #[test]
    fn each_anomaly_is_reported() {
        let ws = [w(1, 0, 10), w(2, 20, 30)];
        // Stale.
        assert_eq!(check(&ws, &[r(Some(1), 31, 40)]).len(), 1);
        // From the future.
        assert_eq!(check(&ws, &[r(Some(2), 11, 15)]).len(), 1);
        // New-old inversion, both concurrent with write 2.
        assert_eq!(
            check(&ws, &[r(Some(2), 21, 22), r(Some(1), 23, 24)]).len(),
            1
        );
        // Lost.
        assert_eq!(check(&ws, &[r(None, 35, 40)]).len(), 1);
        // Other bytes under a known tag.
        let mut x = r(Some(2), 31, 40);
        x.hash = Some(1);
        assert_eq!(check(&ws, &[x]).len(), 1);
        // No tag.
        assert_eq!(check(&ws, &[r(Some(u64::MAX), 31, 40)]).len(), 1);
    }

    #[test]
    fn keys_are_separate_registers() {
        let mut other = w(5, 0, 10);
        other.key = "j".into();
        assert!(check(&[w(1, 0, 10), other], &[r(Some(1), 20, 30)]).is_empty());
    }
}
