//! Benchmark plots: throughput against client count, and latency CDFs, written as SVG or PNG
//! (chosen by the file extension).
//!
//! Text is laid out and (for PNG) rasterised with the DejaVu Sans font compiled into the binary
//! (the `dejavu` crate), so plotting needs no system fonts, no fontconfig and no network. SVG
//! files name the font family `sans-serif` and leave the glyphs to the viewer.
//!
//! ```no_run
//! use std::path::Path;
//! use dmkit_tools::plot::plot_throughput_vs_clients;
//!
//! let series = vec![
//!     ("ours".to_string(), vec![(1, 95_000.0), (2, 180_000.0), (4, 330_000.0)]),
//!     ("baseline".to_string(), vec![(1, 60_000.0), (2, 100_000.0), (4, 150_000.0)]),
//! ];
//! plot_throughput_vs_clients(Path::new("throughput.svg"), "YCSB A", &series).unwrap();
//! ```

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use hdrhistogram::Histogram;
use plotters::coord::Shift;
use plotters::prelude::*;

/// The font family registered with plotters and named in SVG output.
const FONT: &str = "sans-serif";
/// Picture size in pixels.
const SIZE: (u32, u32) = (1024, 640);

/// What can go wrong drawing a plot.
#[derive(Debug, thiserror::Error)]
pub enum PlotError {
    /// The path does not end in `.svg` or `.png`.
    #[error("{}: unsupported image format (use .svg or .png)", path.display())]
    UnsupportedFormat {
        /// The requested output file.
        path: PathBuf,
    },
    /// No series has any point.
    #[error("nothing to plot for {}: every series is empty", path.display())]
    NoData {
        /// The requested output file.
        path: PathBuf,
    },
    /// A point is not a finite number (or a CDF fraction is outside 0..=1).
    #[error("series `{series}`: {reason}")]
    BadData {
        /// The series' name.
        series: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The embedded font could not be registered.
    #[error("the embedded DejaVu Sans font was rejected by the font loader")]
    Font,
    /// plotters failed to draw or to write the file.
    #[error("drawing {}: {message}", path.display())]
    Draw {
        /// The requested output file.
        path: PathBuf,
        /// plotters' description of the failure.
        message: String,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Format {
    Svg,
    Png,
}

fn format_of(path: &Path) -> Result<Format, PlotError> {
    let ext = path
        .extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase);
    match ext.as_deref() {
        Some("svg") => Ok(Format::Svg),
        Some("png") => Ok(Format::Png),
        _ => Err(PlotError::UnsupportedFormat {
            path: path.to_path_buf(),
        }),
    }
}

fn ensure_font() -> Result<(), PlotError> {
    static REGISTERED: OnceLock<bool> = OnceLock::new();
    let ok = *REGISTERED.get_or_init(|| {
        plotters::style::register_font(FONT, FontStyle::Normal, dejavu::sans::regular()).is_ok()
    });
    if ok { Ok(()) } else { Err(PlotError::Font) }
}

/// Plots operations per second against the number of clients, one line per series.
pub fn plot_throughput_vs_clients(
    path: &Path,
    title: &str,
    series: &[(String, Vec<(u32, f64)>)],
) -> Result<(), PlotError> {
    let points: Vec<(String, Vec<(f64, f64)>)> = series
        .iter()
        .map(|(name, pts)| {
            (
                name.clone(),
                pts.iter().map(|&(c, t)| (f64::from(c), t)).collect(),
            )
        })
        .collect();
    for (name, pts) in &points {
        if pts.iter().any(|&(_, y)| !y.is_finite() || y < 0.0) {
            return Err(bad(
                name,
                "throughput must be a finite, non-negative number",
            ));
        }
    }
    let (xs, ys) = bounds(path, &points)?;
    let chart = Chart {
        title,
        x: 0.0..xs.end.max(1.0) * 1.05,
        y: 0.0..ys.end.max(1.0) * 1.1,
        x_desc: "clients",
        y_desc: "throughput (ops/s)",
        log_x: false,
        legend: SeriesLabelPosition::UpperLeft,
    };
    render(path, &chart, &points)
}

/// Plots latency CDFs: x is latency in microseconds (log scale), y the fraction of requests at
/// or below it. [`histogram_cdf`] turns a recorded histogram into such points.
pub fn plot_latency_cdf(
    path: &Path,
    title: &str,
    series: &[(String, Vec<(f64, f64)>)],
) -> Result<(), PlotError> {
    for (name, pts) in series {
        if pts.iter().any(|&(x, _)| !x.is_finite() || x < 0.0) {
            return Err(bad(name, "latency must be a finite, non-negative number"));
        }
        if pts.iter().any(|&(_, y)| !(0.0..=1.0).contains(&y)) {
            return Err(bad(name, "CDF fractions must lie in 0..=1"));
        }
    }
    let (xs, _) = bounds(path, series)?;
    // A log axis cannot reach zero: start a little below the smallest positive latency.
    let min_positive = series
        .iter()
        .flat_map(|(_, p)| p)
        .map(|&(x, _)| x)
        .filter(|&x| x > 0.0)
        .fold(f64::INFINITY, f64::min);
    let lo = if min_positive.is_finite() {
        min_positive / 1.5
    } else {
        0.1
    };
    let hi = (xs.end * 1.5).max(lo * 10.0);
    let clamped: Vec<(String, Vec<(f64, f64)>)> = series
        .iter()
        .map(|(n, p)| (n.clone(), p.iter().map(|&(x, y)| (x.max(lo), y)).collect()))
        .collect();
    let chart = Chart {
        title,
        x: lo..hi,
        y: 0.0..1.0,
        x_desc: "latency (µs)",
        y_desc: "fraction of requests ≤ latency",
        log_x: true,
        legend: SeriesLabelPosition::LowerRight,
    };
    render(path, &chart, &clamped)
}

/// The CDF of a latency histogram whose values are nanoseconds: one `(latency µs, fraction at or
/// below)` point per recorded bucket, at the bucket's upper end (its highest equivalent value),
/// ending at fraction 1. Empty for an empty histogram.
pub fn histogram_cdf(histogram: &Histogram<u64>) -> Vec<(f64, f64)> {
    let total = histogram.len();
    if total == 0 {
        return Vec::new();
    }
    let mut seen = 0_u64;
    histogram
        .iter_recorded()
        .map(|v| {
            seen += v.count_since_last_iteration();
            (
                v.value_iterated_to() as f64 / 1000.0,
                seen as f64 / total as f64,
            )
        })
        .collect()
}

fn bad(series: &str, reason: &str) -> PlotError {
    PlotError::BadData {
        series: series.to_string(),
        reason: reason.to_string(),
    }
}

/// The x and y extents of all points; an error if there are none.
fn bounds(
    path: &Path,
    series: &[(String, Vec<(f64, f64)>)],
) -> Result<(Range<f64>, Range<f64>), PlotError> {
    let mut pts = series
        .iter()
        .flat_map(|(_, p)| p.iter().copied())
        .peekable();
    if pts.peek().is_none() {
        return Err(PlotError::NoData {
            path: path.to_path_buf(),
        });
    }
    let (mut xs, mut ys) = (
        f64::INFINITY..f64::NEG_INFINITY,
        f64::INFINITY..f64::NEG_INFINITY,
    );
    for (x, y) in pts {
        xs = xs.start.min(x)..xs.end.max(x);
        ys = ys.start.min(y)..ys.end.max(y);
    }
    Ok((xs, ys))
}

#[derive(Debug)]
struct Chart<'a> {
    title: &'a str,
    x: Range<f64>,
    y: Range<f64>,
    x_desc: &'a str,
    y_desc: &'a str,
    log_x: bool,
    legend: SeriesLabelPosition,
}

fn render(
    path: &Path,
    chart: &Chart<'_>,
    series: &[(String, Vec<(f64, f64)>)],
) -> Result<(), PlotError> {
    let format = format_of(path)?;
    ensure_font()?;
    let result = match format {
        Format::Svg => draw(
            SVGBackend::new(path, SIZE).into_drawing_area(),
            chart,
            series,
        ),
        Format::Png => draw(
            BitMapBackend::new(path, SIZE).into_drawing_area(),
            chart,
            series,
        ),
    };
    result.map_err(|message| PlotError::Draw {
        path: path.to_path_buf(),
        message,
    })
}

fn draw<DB: DrawingBackend>(
    root: DrawingArea<DB, Shift>,
    chart: &Chart<'_>,
    series: &[(String, Vec<(f64, f64)>)],
) -> Result<(), String> {
    let e = |err: DrawingAreaErrorKind<DB::ErrorType>| err.to_string();
    root.fill(&WHITE).map_err(e)?;
    let mut builder = ChartBuilder::on(&root);
    builder
        .caption(chart.title, (FONT, 28))
        .margin(16)
        .x_label_area_size(48)
        .y_label_area_size(88);
    if chart.log_x {
        let mut ctx = builder
            .build_cartesian_2d(chart.x.clone().log_scale(), chart.y.clone())
            .map_err(e)?;
        ctx.configure_mesh()
            .x_desc(chart.x_desc)
            .y_desc(chart.y_desc)
            .label_style((FONT, 15))
            .axis_desc_style((FONT, 17))
            .x_label_formatter(&|v| short_number(*v))
            .y_label_formatter(&|v| format!("{v:.2}"))
            .draw()
            .map_err(e)?;
        for (i, (name, pts)) in series.iter().enumerate() {
            let color = Palette99::pick(i).to_rgba();
            ctx.draw_series(LineSeries::new(pts.iter().copied(), color.stroke_width(2)))
                .map_err(e)?
                .label(name.as_str())
                .legend(move |(x, y)| {
                    PathElement::new([(x, y), (x + 20, y)], color.stroke_width(2))
                });
        }
        legend(&mut ctx, chart.legend.clone()).map_err(e)?;
    } else {
        let mut ctx = builder
            .build_cartesian_2d(chart.x.clone(), chart.y.clone())
            .map_err(e)?;
        ctx.configure_mesh()
            .x_desc(chart.x_desc)
            .y_desc(chart.y_desc)
            .label_style((FONT, 15))
            .axis_desc_style((FONT, 17))
            .x_label_formatter(&|v| short_number(*v))
            .y_label_formatter(&|v| short_number(*v))
            .draw()
            .map_err(e)?;
        for (i, (name, pts)) in series.iter().enumerate() {
            let color = Palette99::pick(i).to_rgba();
            ctx.draw_series(LineSeries::new(pts.iter().copied(), color.stroke_width(2)))
                .map_err(e)?
                .label(name.as_str())
                .legend(move |(x, y)| {
                    PathElement::new([(x, y), (x + 20, y)], color.stroke_width(2))
                });
            ctx.draw_series(pts.iter().map(|&p| Circle::new(p, 4, color.filled())))
                .map_err(e)?;
        }
        legend(&mut ctx, chart.legend.clone()).map_err(e)?;
    }
    root.present().map_err(e)
}

fn legend<'a, DB: DrawingBackend + 'a, CT: CoordTranslate>(
    ctx: &mut ChartContext<'a, DB, CT>,
    position: SeriesLabelPosition,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    ctx.configure_series_labels()
        .position(position)
        .label_font((FONT, 16))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
}

/// `1500000` → `1.5M`, `2500` → `2.5k`, `12` → `12`, `0.5` → `0.5`.
fn short_number(v: f64) -> String {
    let a = v.abs();
    let (scaled, suffix) = if a >= 1e9 {
        (v / 1e9, "G")
    } else if a >= 1e6 {
        (v / 1e6, "M")
    } else if a >= 1e3 {
        (v / 1e3, "k")
    } else {
        (v, "")
    };
    let text = format!("{scaled:.2}");
    let text = text.trim_end_matches('0').trim_end_matches('.');
    format!("{text}{suffix}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("dmkit-plot-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn throughput_series() -> Vec<(String, Vec<(u32, f64)>)> {
        vec![
            (
                "FUSEE".to_string(),
                vec![
                    (1, 110_000.0),
                    (2, 205_000.0),
                    (4, 390_000.0),
                    (8, 610_000.0),
                ],
            ),
            (
                "Clover".to_string(),
                vec![
                    (1, 90_000.0),
                    (2, 150_000.0),
                    (4, 210_000.0),
                    (8, 230_000.0),
                ],
            ),
        ]
    }

    fn cdf_series() -> Vec<(String, Vec<(f64, f64)>)> {
        let mut fast = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3).unwrap();
        let mut slow = fast.clone();
        for i in 0..1000_u64 {
            fast.record(2_000 + i * 3).unwrap();
            slow.record(5_000 + i * i * 20).unwrap();
        }
        vec![
            ("sim".to_string(), histogram_cdf(&fast)),
            ("tcp".to_string(), histogram_cdf(&slow)),
        ]
    }

    #[test]
    fn histogram_cdf_steps_at_recorded_values() {
        let mut h = Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3).unwrap();
        // Below 2048 ns, 3 significant digits keep every value in its own bucket.
        h.record_n(500, 50).unwrap();
        h.record_n(1_000, 30).unwrap();
        h.record_n(2_000, 20).unwrap();
        assert_eq!(histogram_cdf(&h), [(0.5, 0.5), (1.0, 0.8), (2.0, 1.0)]);
        // Above that, a point sits at the upper end of its bucket.
        h.record(4_000).unwrap();
        assert_eq!(histogram_cdf(&h).last().unwrap().0, 4.001);
        assert!(histogram_cdf(&Histogram::<u64>::new(3).unwrap()).is_empty());
    }

    #[test]
    fn both_formats_render_with_series_names() {
        let dir = scratch_dir("formats");
        for ext in ["svg", "png"] {
            let tput = dir.join(format!("tput.{ext}"));
            let cdf = dir.join(format!("cdf.{ext}"));
            plot_throughput_vs_clients(&tput, "YCSB A throughput", &throughput_series()).unwrap();
            plot_latency_cdf(&cdf, "YCSB A latency", &cdf_series()).unwrap();
            for file in [&tput, &cdf] {
                let bytes = std::fs::read(file).unwrap();
                assert!(
                    bytes.len() > 1000,
                    "{} is {} bytes",
                    file.display(),
                    bytes.len()
                );
                if ext == "png" {
                    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
                }
            }
        }
        let svg = std::fs::read_to_string(dir.join("tput.svg")).unwrap();
        for text in ["FUSEE", "Clover", "YCSB A throughput", "<text"] {
            assert!(svg.contains(text), "missing {text}");
        }
        let svg = std::fs::read_to_string(dir.join("cdf.svg")).unwrap();
        assert!(svg.contains("sim") && svg.contains("tcp"));
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// Writes the sample plots to `$DMKIT_PLOT_SAMPLES` (when set) for looking at them.
    #[test]
    fn sample_plots_for_inspection() {
        let Some(dir) = std::env::var_os("DMKIT_PLOT_SAMPLES").map(PathBuf::from) else {
            return;
        };
        std::fs::create_dir_all(&dir).unwrap();
        for ext in ["svg", "png"] {
            plot_throughput_vs_clients(
                &dir.join(format!("tput.{ext}")),
                "YCSB A throughput",
                &throughput_series(),
            )
            .unwrap();
            plot_latency_cdf(
                &dir.join(format!("cdf.{ext}")),
                "YCSB A latency",
                &cdf_series(),
            )
            .unwrap();
        }
    }

    #[test]
    fn bad_inputs_are_errors_not_panics() {
        let dir = scratch_dir("errors");
        let err = plot_throughput_vs_clients(&dir.join("x.jpg"), "t", &throughput_series());
        assert!(matches!(err, Err(PlotError::UnsupportedFormat { .. })));
        let err = plot_throughput_vs_clients(&dir.join("x.svg"), "t", &[("a".into(), vec![])]);
        assert!(matches!(err, Err(PlotError::NoData { .. })));
        let err = plot_latency_cdf(&dir.join("x.svg"), "t", &[("a".into(), vec![(1.0, 1.5)])]);
        assert!(matches!(err, Err(PlotError::BadData { .. })));
        let err = plot_throughput_vs_clients(
            &dir.join("x.png"),
            "t",
            &[("a".into(), vec![(1, f64::NAN)])],
        );
        assert!(matches!(err, Err(PlotError::BadData { .. })));
        let err = plot_latency_cdf(&dir.join("missing/dir/x.png"), "t", &cdf_series());
        assert!(matches!(err, Err(PlotError::Draw { .. })), "{err:?}");
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn short_numbers_use_si_suffixes() {
        assert_eq!(short_number(1_500_000.0), "1.5M");
        assert_eq!(short_number(2_500.0), "2.5k");
        assert_eq!(short_number(12.0), "12");
        assert_eq!(short_number(0.5), "0.5");
        assert_eq!(short_number(0.0), "0");
    }
}
