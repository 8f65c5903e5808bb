//! Power-failure testing in the manner of PMDK's pmreorder.
//!
//! [`CrashMedium`] is an in-memory [`Medium`] that records every 8-byte store and every persist
//! made through it. [`CrashMedium::for_each_crash_image`] replays the record and, at every
//! persist point (and at the end), produces the media images a power failure at that moment
//! could leave behind.
//!
//! The model is x86's with ADR: a store reaches the CPU cache; a cache line can be written back
//! at any time (evicted) and is written back for sure by a persist that covers it. So at a
//! crash, each line dirtied since its last persist holds, on media, its contents after some
//! prefix (possibly empty, possibly all) of the stores made to it since then; lines are
//! independent of each other. 8-byte aligned stores are never torn. A crash image is one choice
//! of prefix per dirty line. The images at a persist point cover every crash since the previous
//! one, because prefixes only grow until a line is persisted.
//!
//! All combinations are enumerated when there are at most [`CrashPolicy::exhaustive_limit`];
//! otherwise the two extremes plus [`CrashPolicy::samples`] combinations drawn with a seeded RNG.
//! Writes through [`crate::Pool::data_ptr`] bypass the medium and are not modelled.

use std::alloc::Layout;
use std::collections::BTreeMap;
use std::path::Path;
use std::ptr::NonNull;
use std::sync::Arc;

use parking_lot::Mutex;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::error::Result;
use crate::media::{Medium, MediumKind, Region};

/// Bytes of a cache line, the unit that reaches media together.
pub const CACHE_LINE: usize = 64;

/// Page-aligned zeroed heap memory.
#[derive(Debug)]
struct AlignedBuf {
    ptr: NonNull<u8>,
    layout: Layout,
}

// SAFETY: the buffer is uniquely owned heap memory; access goes through `Region`.
unsafe impl Send for AlignedBuf {}
// SAFETY: as above; the buffer itself is never accessed through `&AlignedBuf`.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    fn zeroed(len: usize) -> Self {
        let layout = Layout::from_size_align(len.max(8), 4096).expect("test medium size");
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(ptr).unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
        AlignedBuf { ptr, layout }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in `zeroed` with this layout, freed once.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

#[derive(Debug, Clone, Copy)]
enum Event {
    Store { offset: usize, value: u64 },
    Persist { offset: usize, len: usize },
    Mark(u64),
}

#[derive(Debug)]
struct Recorder {
    recording: bool,
    base: Vec<u8>,
    events: Vec<Event>,
}

#[derive(Debug)]
struct Inner {
    region: Region,
    _buf: AlignedBuf,
    rec: Mutex<Recorder>,
}

/// An in-memory medium that records stores and persists (see the module docs). Cloning gives
/// another handle to the same medium, so a test can keep one while the pool owns another.
#[derive(Debug, Clone)]
pub struct CrashMedium {
    inner: Arc<Inner>,
}

/// How many images to make at each crash point.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CrashPolicy {
    /// Enumerate every combination when there are at most this many.
    pub exhaustive_limit: u64,
    /// Otherwise, how many random combinations to add to the two extremes.
    pub samples: usize,
    /// Seed of the sampling RNG (mixed with the crash point's index).
    pub seed: u64,
}

impl Default for CrashPolicy {
    fn default() -> Self {
        CrashPolicy {
            exhaustive_limit: 256,
            samples: 32,
            seed: 0x5eed,
        }
    }
}

/// One image a crash could leave.
#[derive(Debug, Clone, Copy)]
pub struct CrashImage<'a> {
    /// The last [`CrashMedium::mark`] before the crash (the operation in flight).
    pub mark: u64,
    /// Index of the persist point (the number of persists that completed before the crash).
    pub point: usize,
    /// The media contents.
    pub bytes: &'a [u8],
}

impl CrashMedium {
    /// A zeroed medium of `len` bytes that records from the start (the zeroes count as durable).
    pub fn new(len: usize) -> Self {
        Self::build(len, true)
    }

    /// A medium holding a copy of `bytes`, not recording: for opening a crash image.
    pub fn from_image(bytes: &[u8]) -> Self {
        let m = Self::build(bytes.len(), false);
        m.inner.region.write(0, bytes);
        m
    }

    fn build(len: usize, recording: bool) -> Self {
        let buf = AlignedBuf::zeroed(len);
        // SAFETY: `buf` is page-aligned, `len` bytes long, and lives in the same `Inner` as
        // the region, so it outlives every use of the region.
        let region = unsafe { Region::new(buf.ptr, len) };
        CrashMedium {
            inner: Arc::new(Inner {
                region,
                _buf: buf,
                rec: Mutex::new(Recorder {
                    recording,
                    base: if recording { vec![0; len] } else { Vec::new() },
                    events: Vec::new(),
                }),
            }),
        }
    }

    /// A boxed handle for [`crate::Pool::create_on`] / [`crate::Pool::open_on`].
    pub fn boxed(&self) -> Box<dyn Medium> {
        Box::new(self.clone())
    }

    /// Labels what follows (e.g. the index of the operation about to run).
    pub fn mark(&self, label: u64) {
        let mut rec = self.inner.rec.lock();
        if rec.recording {
            rec.events.push(Event::Mark(label));
        }
    }

    /// Stops recording (what is recorded so far stays).
    pub fn stop_recording(&self) {
        self.inner.rec.lock().recording = false;
    }

    /// Persist points recorded so far.
    pub fn persist_points(&self) -> usize {
        let rec = self.inner.rec.lock();
        rec.events
            .iter()
            .filter(|e| matches!(e, Event::Persist { .. }))
            .count()
    }

    fn record(&self, event: Event) {
        let mut rec = self.inner.rec.lock();
        if rec.recording {
            rec.events.push(event);
        }
    }

    /// Calls `f(image, index, total)` with at most `cap` of the crash images at persist points
    /// from `from_point` on (earlier ones — a cut during setup, say — are skipped), spread
    /// evenly over the record, the last one always included; returns `(total, checked)`.
    /// Enumerates the record twice (once to count).
    pub fn for_each_sampled_image(
        &self,
        policy: CrashPolicy,
        from_point: usize,
        cap: usize,
        mut f: impl FnMut(CrashImage<'_>, usize, usize),
    ) -> (usize, usize) {
        let mut total = 0;
        self.for_each_crash_image(policy, |img| total += usize::from(img.point >= from_point));
        let stride = total.div_ceil(cap.max(1)).max(1);
        let (mut seen, mut checked) = (0, 0);
        self.for_each_crash_image(policy, |img| {
            if img.point < from_point {
                return;
            }
            seen += 1;
            if seen % stride == 0 || seen == total {
                checked += 1;
                f(img, seen, total);
            }
        });
        (total, checked)
    }

    /// Calls `f` with every crash image of the record; returns how many there were.
    pub fn for_each_crash_image(
        &self,
        policy: CrashPolicy,
        mut f: impl FnMut(CrashImage<'_>),
    ) -> usize {
        let (base, events) = {
            let rec = self.inner.rec.lock();
            (rec.base.clone(), rec.events.clone())
        };
        let mut persisted = base;
        let mut pending: BTreeMap<usize, Vec<(usize, u64)>> = BTreeMap::new();
        let mut mark = 0;
        let mut point = 0;
        let mut changed = true;
        let mut count = 0;
        let mut image = Vec::new();
        for event in events {
            match event {
                Event::Store { offset, value } => {
                    pending
                        .entry(offset / CACHE_LINE)
                        .or_default()
                        .push((offset, value));
                    changed = true;
                }
                Event::Mark(m) => mark = m,
                Event::Persist { offset, len } => {
                    if changed {
                        count += emit(
                            &persisted, &pending, policy, mark, point, &mut image, &mut f,
                        );
                        changed = false;
                    }
                    point += 1;
                    if len > 0 {
                        let lines = offset / CACHE_LINE..=(offset + len - 1) / CACHE_LINE;
                        let flushed: Vec<usize> = pending.range(lines).map(|(l, _)| *l).collect();
                        for line in flushed {
                            for (o, v) in pending.remove(&line).unwrap_or_default() {
                                persisted[o..o + 8].copy_from_slice(&v.to_le_bytes());
                            }
                            changed = true;
                        }
                    }
                }
            }
        }
        if changed {
            count += emit(
                &persisted, &pending, policy, mark, point, &mut image, &mut f,
            );
        }
        count
    }
}

/// Emits the images of one crash point; returns how many.
fn emit(
    persisted: &[u8],
    pending: &BTreeMap<usize, Vec<(usize, u64)>>,
    policy: CrashPolicy,
    mark: u64,
    point: usize,
    image: &mut Vec<u8>,
    f: &mut impl FnMut(CrashImage<'_>),
) -> usize {
    let lines: Vec<&Vec<(usize, u64)>> = pending.values().collect();
    let combos = lines
        .iter()
        .try_fold(1u64, |acc, l| acc.checked_mul(l.len() as u64 + 1));
    let mut choices: Vec<Vec<usize>> = Vec::new();
    match combos {
        Some(n) if n <= policy.exhaustive_limit => {
            let mut c = vec![0usize; lines.len()];
            loop {
                choices.push(c.clone());
                // Mixed-radix increment.
                let mut i = 0;
                while i < c.len() {
                    c[i] += 1;
                    if c[i] <= lines[i].len() {
                        break;
                    }
                    c[i] = 0;
                    i += 1;
                }
                if i == c.len() {
                    break;
                }
            }
        }
        _ => {
            choices.push(vec![0; lines.len()]);
            choices.push(lines.iter().map(|l| l.len()).collect());
            let mut rng = StdRng::seed_from_u64(
                policy.seed ^ (point as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15),
            );
            for _ in 0..policy.samples {
                choices.push(
                    lines
                        .iter()
                        .map(|l| rng.random_range(0..=l.len()))
                        .collect(),
                );
            }
        }
    }
    for choice in &choices {
        image.clear();
        image.extend_from_slice(persisted);
        for (line, k) in lines.iter().zip(choice) {
            for (o, v) in &line[..*k] {
                image[*o..*o + 8].copy_from_slice(&v.to_le_bytes());
            }
        }
        f(CrashImage {
            mark,
            point,
            bytes: image,
        });
    }
    choices.len()
}

impl Medium for CrashMedium {
    fn kind(&self) -> MediumKind {
        MediumKind::Test
    }
    fn location(&self) -> String {
        "<crash-test medium>".into()
    }
    fn path(&self) -> Option<&Path> {
        None
    }
    fn as_ptr(&self) -> *mut u8 {
        self.inner.region.as_ptr()
    }
    fn len(&self) -> usize {
        self.inner.region.len()
    }
    fn is_persistent(&self) -> bool {
        true
    }
    fn load_u64(&self, offset: usize) -> u64 {
        self.inner.region.load_u64(offset)
    }
    fn store_u64(&self, offset: usize, value: u64) {
        self.inner.region.store_u64(offset, value);
        self.record(Event::Store { offset, value });
    }
    fn read(&self, offset: usize, buf: &mut [u8]) {
        self.inner.region.read(offset, buf)
    }
    fn write(&self, offset: usize, data: &[u8]) {
        self.inner.region.write(offset, data);
        self.note_write(offset, data.len());
    }
    fn note_write(&self, offset: usize, len: usize) {
        if len == 0 {
            return;
        }
        // Model a copy as the 8-byte stores a memcpy makes, in address order.
        let first = offset / 8 * 8;
        let end = offset + len;
        for word in (first..end).step_by(8) {
            if word + 8 <= self.len() {
                let value = self.inner.region.load_u64(word);
                self.record(Event::Store {
                    offset: word,
                    value,
                });
            }
        }
    }
    fn persist(&self, offset: usize, len: usize) -> Result<()> {
        assert!(
            offset.checked_add(len).is_some_and(|e| e <= self.len()),
            "persist {offset:#x}+{len:#x} outside the medium"
        );
        self.record(Event::Persist { offset, len });
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn images(m: &CrashMedium, policy: CrashPolicy) -> Vec<(u64, Vec<u8>)> {
        let mut out = Vec::new();
        let n = m.for_each_crash_image(policy, |img| out.push((img.mark, img.bytes.to_vec())));
        assert_eq!(n, out.len());
        out
    }

    #[test]
    fn an_unpersisted_store_may_be_lost_or_kept_a_persisted_one_is_kept() {
        let m = CrashMedium::new(256);
        m.mark(1);
        m.store_u64(0, 7);
        m.persist(0, 8).unwrap();
        m.mark(2);
        m.store_u64(64, 9);
        let imgs = images(&m, CrashPolicy::default());
        // Point 0: word 0 lost or kept. End: word 0 kept, word 64 lost or kept.
        let words: Vec<(u64, u64, u64)> = imgs
            .iter()
            .map(|(mark, b)| {
                let w = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap());
                (*mark, w(0), w(64))
            })
            .collect();
        assert_eq!(words, vec![(1, 0, 0), (1, 7, 0), (2, 7, 0), (2, 7, 9)]);
    }

    #[test]
    fn stores_to_one_line_reach_media_in_order() {
        let m = CrashMedium::new(128);
        m.store_u64(0, 1);
        m.store_u64(8, 2);
        m.store_u64(0, 3);
        let imgs = images(&m, CrashPolicy::default());
        let seen: Vec<(u64, u64)> = imgs
            .iter()
            .map(|(_, b)| {
                let w = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap());
                (w(0), w(8))
            })
            .collect();
        // Never (0, 2) without the first store, never (3, 0).
        assert_eq!(seen, vec![(0, 0), (1, 0), (1, 2), (3, 2)]);
    }

    #[test]
    fn many_dirty_lines_are_sampled_reproducibly() {
        let m = CrashMedium::new(64 * 64);
        for line in 0..64 {
            m.store_u64(line * 64, line as u64 + 1);
        }
        let policy = CrashPolicy::default();
        let a = images(&m, policy);
        assert_eq!(a.len(), 2 + policy.samples);
        assert_eq!(a, images(&m, policy));
        assert!(a[0].1.iter().all(|b| *b == 0));
    }

    #[test]
    fn writes_are_modelled_as_word_stores_and_images_can_be_reopened() {
        let m = CrashMedium::new(128);
        m.write(4, &[0xff; 8]);
        m.persist(0, 16).unwrap();
        m.stop_recording();
        m.store_u64(64, 1);
        assert_eq!(m.persist_points(), 1);
        let imgs = images(&m, CrashPolicy::default());
        // At the persist: 0, 1 or 2 of the line's word stores; at the end: the persisted line
        // (the store after `stop_recording` is not modelled).
        assert_eq!(imgs.len(), 4);
        let copy = CrashMedium::from_image(&imgs.last().unwrap().1);
        assert_eq!(copy.load_u64(0), 0xffff_ffff_0000_0000);
        assert_eq!(copy.load_u64(8), 0x0000_0000_ffff_ffff);
    }
}
