//! The benchmark harness: measurements, the human table, the JSON report and progress.
//!
//! Every bench measures ours and its baseline side by side in one run and reports ratios, so
//! a noisy shared machine moves both sides together.

pub mod all;
pub mod fusee;
pub mod fusee_micro;
pub mod gengar;
pub mod index;
pub mod perftest;
pub mod pool;
pub mod resp;
pub mod soak;
pub mod verbs;

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde::Serialize;
use serde_json::{Map, Value};

/// One measured line of a report.
#[derive(Debug, Clone, Serialize)]
pub struct Measurement {
    pub name: String,
    pub ops_per_sec: f64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub rtts_per_op: f64,
    /// Whether the figures are modeled (virtual time) rather than measured.
    pub modeled: bool,
    /// Extra columns specific to a bench.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// A bench's report: what `--json` writes (format in DESIGN.md).
#[derive(Debug, Serialize)]
pub struct Report {
    pub bench: String,
    pub config: Map<String, Value>,
    pub results: Vec<Measurement>,
    pub ratios: Map<String, Value>,
    /// Latency histograms (nanoseconds) of the measurements that kept one, by name: the
    /// source of `--plot`'s CDFs. Not part of the JSON.
    #[serde(skip)]
    pub histograms: Vec<(String, Histogram<u64>)>,
}

/// A measurement with the latency histogram it was computed from.
#[derive(Debug)]
pub struct Sample {
    pub measurement: Measurement,
    pub hist: Histogram<u64>,
}

impl Sample {
    /// One sample of several runs of the same measurement (`ops_each` operations per
    /// recorded value): the histograms add up, the rate is total operations over total time.
    #[cfg_attr(not(feature = "rdma"), allow(dead_code))]
    pub fn merge(name: &str, parts: Vec<Sample>, ops_each: u64) -> Sample {
        let mut hist = Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("histogram bounds");
        let (mut ops, mut secs, mut rtts) = (0.0, 0.0, 0.0);
        for p in &parts {
            let n = (p.hist.len() * ops_each) as f64;
            let _ = hist.add(&p.hist);
            ops += n;
            if p.measurement.ops_per_sec > 0.0 {
                secs += n / p.measurement.ops_per_sec;
            }
            rtts += p.measurement.rtts_per_op * n;
        }
        let measurement = Measurement {
            name: name.to_string(),
            ops_per_sec: if secs > 0.0 { ops / secs } else { 0.0 },
            p50_us: hist.value_at_quantile(0.5) as f64 / 1000.0,
            p99_us: hist.value_at_quantile(0.99) as f64 / 1000.0,
            rtts_per_op: if ops > 0.0 { rtts / ops } else { 0.0 },
            modeled: false,
            extra: Map::new(),
        };
        Sample { measurement, hist }
    }
}

/// The median of `v` (NaN when empty).
pub fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let m = v.len() / 2;
    if v.len() % 2 == 1 {
        v[m]
    } else {
        (v[m - 1] + v[m]) / 2.0
    }
}

impl Report {
    pub fn new(bench: &str) -> Self {
        Self {
            bench: bench.to_string(),
            config: Map::new(),
            results: Vec::new(),
            ratios: Map::new(),
            histograms: Vec::new(),
        }
    }

    /// Adds a measurement and keeps its histogram for plots.
    pub fn push(&mut self, s: Sample) {
        self.histograms.push((s.measurement.name.clone(), s.hist));
        self.results.push(s.measurement);
    }

    /// Draws the latency CDFs of the kept histograms whose names `keep` selects (SVG or PNG by
    /// the extension of `path`).
    pub fn plot_latency_cdf(
        &self,
        path: &std::path::Path,
        title: &str,
        keep: impl Fn(&str) -> bool,
    ) -> Result<(), String> {
        let series: Vec<(String, Vec<(f64, f64)>)> = self
            .histograms
            .iter()
            .filter(|(n, h)| keep(n) && !h.is_empty())
            .map(|(n, h)| (n.clone(), dmkit_tools::plot::histogram_cdf(h)))
            .collect();
        dmkit_tools::plot::plot_latency_cdf(path, title, &series).map_err(|e| e.to_string())
    }

    /// Prints the table and writes the JSON report when asked to.
    pub fn finish(&self, json: Option<&std::path::Path>) -> Result<(), String> {
        self.print_table();
        if let Some(p) = json {
            self.write_json(p)?;
            eprintln!("wrote {}", p.display());
        }
        Ok(())
    }

    pub fn config(&mut self, k: &str, v: impl Into<Value>) {
        self.config.insert(k.to_string(), v.into());
    }

    pub fn result(&self, name: &str) -> Option<&Measurement> {
        self.results.iter().find(|m| m.name == name)
    }

    /// Adds a ratio; `target` is printed beside it (e.g. "<= 1.5").
    pub fn ratio(&mut self, name: &str, value: f64, target: Option<&str>) {
        self.ratios
            .insert(name.to_string(), Value::from(round_ratio(value)));
        if let Some(t) = target {
            self.config
                .entry("targets")
                .or_insert_with(|| Value::Object(Map::new()))
                .as_object_mut()
                .expect("targets is an object")
                .insert(name.to_string(), Value::from(t));
        }
    }

    /// The human table.
    pub fn print_table(&self) {
        println!("{} bench", self.bench);
        println!(
            "{:<34} {:>14} {:>10} {:>10} {:>9}",
            "name", "ops/s", "p50 us", "p99 us", "RTTs/op"
        );
        for m in &self.results {
            println!(
                "{:<34} {:>14.0} {:>10.3} {:>10.3} {:>9.3}{}",
                m.name,
                m.ops_per_sec,
                m.p50_us,
                m.p99_us,
                m.rtts_per_op,
                if m.modeled { "  (modeled)" } else { "" }
            );
        }
        if !self.ratios.is_empty() {
            println!("ratios (ours vs baseline, same run):");
            let targets = self.config.get("targets").and_then(Value::as_object);
            for (k, v) in &self.ratios {
                let t = targets
                    .and_then(|t| t.get(k))
                    .and_then(Value::as_str)
                    .map(|t| format!("   target {t}"))
                    .unwrap_or_default();
                println!("  {k:<44} {v}{t}");
            }
        }
    }

    pub fn write_json(&self, path: &std::path::Path) -> Result<(), String> {
        let s = serde_json::to_string_pretty(self).map_err(|e| e.to_string())?;
        std::fs::write(path, s + "\n").map_err(|e| format!("cannot write {}: {e}", path.display()))
    }
}

/// Decimals that show a ratio: three, or three significant digits below 0.1 (so that a
/// ratio of 0.000158, an allocator against malloc, is not printed as 0).
pub fn ratio_decimals(v: f64) -> usize {
    if !v.is_finite() || v == 0.0 || v.abs() >= 0.1 {
        return 3;
    }
    (2 - v.abs().log10().floor() as i32).clamp(3, 15) as usize
}

/// A ratio rounded to [`ratio_decimals`].
pub fn round_ratio(v: f64) -> f64 {
    let f = 10f64.powi(ratio_decimals(v) as i32);
    (v * f).round() / f
}

/// Fails before a run when `--json PATH` could not be written after it: a missing directory,
/// a directory named as the file, no permission. A file this check creates is removed again.
pub fn check_json_path(path: Option<&std::path::Path>) -> Result<(), crate::CliError> {
    let Some(p) = path else {
        return Ok(());
    };
    let bad =
        |why: String| crate::CliError::usage(format!("cannot write --json {}: {why}", p.display()));
    if p.is_dir() {
        return Err(bad("it is a directory".into()));
    }
    let existed = p.exists();
    std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(p)
        .map_err(|e| bad(e.to_string()))?;
    if !existed {
        let _ = std::fs::remove_file(p);
    }
    Ok(())
}

/// The benches' stopwatch for single operations: the CPU's time-stamp counter on x86-64, read
/// as perftest's `get_cycles` reads it (whether or not the CPU calls it invariant), converted
/// to nanoseconds at a rate calibrated once against the OS clock; the OS clock elsewhere.
///
/// Where the OS clock is slow to read it would time itself: in the SoftRoCE guest the clock
/// source is an emulated HPET, and each reading is a system call of about 3 µs, which a
/// clock that falls back to the OS clock (quanta's, without an invariant-TSC flag) put into
/// every sample of ours while perftest's samples carried none.
#[derive(Debug, Clone, Copy, Default)]
pub struct Stopwatch;

impl Stopwatch {
    pub fn new() -> Self {
        let _ = ticks_per_ns();
        Stopwatch
    }

    /// A reading, in ticks (see [`Stopwatch::delta_as_nanos`]).
    pub fn raw(&self) -> u64 {
        ticks()
    }

    /// Nanoseconds from reading `start` to reading `end` (0 if `end` is not later).
    pub fn delta_as_nanos(&self, start: u64, end: u64) -> u64 {
        (end.saturating_sub(start) as f64 / ticks_per_ns()) as u64
    }
}

#[cfg(target_arch = "x86_64")]
fn ticks() -> u64 {
    // SAFETY: RDTSC reads a counter; it has no preconditions on x86-64.
    #[allow(unused_unsafe)]
    unsafe {
        core::arch::x86_64::_rdtsc()
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn ticks() -> u64 {
    static EPOCH: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    EPOCH.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

/// Ticks per nanosecond, measured once over 20 ms of the OS clock.
fn ticks_per_ns() -> f64 {
    static RATE: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    *RATE.get_or_init(|| {
        if cfg!(not(target_arch = "x86_64")) {
            return 1.0;
        }
        let (i0, t0) = (Instant::now(), ticks());
        std::thread::sleep(Duration::from_millis(20));
        let (t1, ns) = (ticks(), i0.elapsed().as_nanos() as f64);
        let rate = t1.saturating_sub(t0) as f64 / ns;
        if rate.is_finite() && rate > 0.0 {
            rate
        } else {
            1.0
        }
    })
}

/// Latency samples of one measurement.
///
/// Single operations are timed with [`Recorder::tick`] / [`Recorder::record_since`], on the
/// [`Stopwatch`].
pub struct Recorder {
    hist: Histogram<u64>,
    ops: u64,
    started: Instant,
    elapsed: Duration,
    clock: Stopwatch,
}

impl Recorder {
    pub fn new() -> Self {
        Self {
            hist: Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("histogram bounds"),
            ops: 0,
            started: Instant::now(),
            elapsed: Duration::ZERO,
            clock: Stopwatch::new(),
        }
    }

    /// A reading of the stopwatch, for [`Recorder::record_since`].
    pub fn tick(&self) -> u64 {
        self.clock.raw()
    }

    /// Records one sample from `start` (a [`Recorder::tick`]) to now, covering `ops`
    /// operations.
    pub fn record_since(&mut self, start: u64, ops: u64) {
        let ns = self.clock.delta_as_nanos(start, self.clock.raw());
        self.record(ns, ops);
    }

    /// Records one sample of `ticks` (a difference of two [`Recorder::tick`]s) covering
    /// `ops` operations.
    #[cfg_attr(not(feature = "rdma"), allow(dead_code))]
    pub fn record_ticks(&mut self, ticks: u64, ops: u64) {
        let ns = self.clock.delta_as_nanos(0, ticks);
        self.record(ns, ops);
    }

    /// Records one sample of `ns` covering `ops` operations.
    pub fn record(&mut self, ns: u64, ops: u64) {
        let _ = self.hist.record(ns.max(1));
        self.ops += ops;
    }

    pub fn start(&mut self) {
        self.started = Instant::now();
    }

    pub fn stop(&mut self) {
        self.elapsed = self.started.elapsed();
    }

    /// The measurement together with its histogram (for [`Report::push`]).
    pub fn sample(self, name: &str, rtts_per_op: f64) -> Sample {
        let measurement = self.measurement(name, rtts_per_op);
        Sample {
            measurement,
            hist: self.hist,
        }
    }

    pub fn measurement(&self, name: &str, rtts_per_op: f64) -> Measurement {
        let secs = self.elapsed.as_secs_f64().max(1e-9);
        Measurement {
            name: name.to_string(),
            ops_per_sec: self.ops as f64 / secs,
            p50_us: self.hist.value_at_quantile(0.5) as f64 / 1000.0,
            p99_us: self.hist.value_at_quantile(0.99) as f64 / 1000.0,
            rtts_per_op,
            modeled: false,
            extra: Map::new(),
        }
    }
}

impl Default for Recorder {
    fn default() -> Self {
        Self::new()
    }
}

/// A progress bar on a terminal; nothing otherwise.
pub fn progress(len: u64, what: &str) -> indicatif::ProgressBar {
    if !std::io::stderr().is_terminal() {
        return indicatif::ProgressBar::hidden();
    }
    let pb = indicatif::ProgressBar::new(len);
    pb.set_style(
        indicatif::ProgressStyle::with_template("{msg:>28} [{bar:30}] {pos}/{len} {elapsed}")
            .expect("progress template")
            .progress_chars("=> "),
    );
    pb.set_message(what.to_string());
    pb
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_ratios_keep_three_significant_digits() {
        assert_eq!(round_ratio(0.53149), 0.531);
        assert_eq!(round_ratio(12.34567), 12.346);
        assert_eq!(round_ratio(0.0303449), 0.0303);
        assert_eq!(round_ratio(0.000158449), 0.000158);
        assert_eq!(round_ratio(0.0), 0.0);
        assert!(round_ratio(f64::NAN).is_nan());
    }

    #[test]
    fn median_of_odd_even_and_empty() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0, 3.0, 2.0]), 2.5);
        assert!(median(Vec::new()).is_nan());
    }

    fn sample(values_us: &[u64], ops_each: u64, secs: f64) -> Sample {
        let mut r = Recorder::new();
        for v in values_us {
            r.record(v * 1000, ops_each);
        }
        let mut s = r.sample("x", 1.0);
        s.measurement.ops_per_sec = (values_us.len() as u64 * ops_each) as f64 / secs;
        s
    }

    #[test]
    fn merged_samples_pool_histograms_and_time() {
        // 3 single ops in 1 s and 1 in 1 s: 4 ops in 2 s.
        let m = Sample::merge(
            "m",
            vec![sample(&[10, 20, 30], 1, 1.0), sample(&[40], 1, 1.0)],
            1,
        );
        assert_eq!(m.measurement.name, "m");
        assert_eq!(m.hist.len(), 4);
        assert!((m.measurement.ops_per_sec - 2.0).abs() < 1e-9);
        assert!(
            (m.measurement.p50_us - 20.0).abs() < 0.1,
            "{}",
            m.measurement.p50_us
        );
        // Batches of 16: 2 batches (32 ops) in 1 s and 2 (32 ops) in 3 s: 64 ops in 4 s.
        let m = Sample::merge(
            "b",
            vec![sample(&[5, 5], 16, 1.0), sample(&[7, 7], 16, 3.0)],
            16,
        );
        assert!((m.measurement.ops_per_sec - 16.0).abs() < 1e-9);
    }
}
