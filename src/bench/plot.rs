//! The `--plot` figure of `pack bench-read`. The tables print every path at every concurrency
//! level; five levels times a handful of paths is a wall of numbers, and the two things worth
//! knowing, where more readers stop paying off (the knee) and how slow the slow reads are (the
//! tail), have to be worked out from it. Drawn as curves, both show at a glance: throughput
//! against threads flattens at the knee, and a latency distribution on a log axis shows the tail
//! as a long reach to the right, whether the runs come from one drive or from several.

use std::ops::Range;
use std::path::Path;

use plotters::coord::Shift;
use plotters::element::DashedPathElement;
use plotters::prelude::*;

use super::record::{sweeps, Measurement};
use crate::{Error, Result};

/// Width and height of the figure, in pixels.
const SIZE: (u32, u32) = (1200, 500);

/// What the drawing functions return: plotters' errors, boxed, before they become an
/// [`Error::Io`] naming the file.
type Drawn = std::result::Result<(), Box<dyn std::error::Error>>;

/// Draws `measurements` as an SVG at `path`: left panel samples/s against threads (log2 x axis
/// with ticks at the thread counts measured, one line+points per sweep), right panel the latency
/// distribution of each sweep at one thread (or its lowest level) as a CDF: x = latency µs on a
/// log10 axis, y = share of reads at or below (0..1), one line per sweep, and a dashed vertical
/// line at the median of each sweep's memory floor where it was measured. Legend with the sweep
/// label: `{file name of path} {format} ({access}) {pattern} {cache}`.
///
/// The legend sits in the lower right of the latency panel, which a CDF leaves empty; the
/// colours are the same in both panels. Two sweeps whose labels would be the same (the same
/// file name under different directories) are labelled with their full paths, and an `O_DIRECT`
/// sweep says so. A sweep whose lowest level is not one thread has that level in its label, and
/// the latency caption then says the fewest threads measured rather than one.
pub fn plot(path: &Path, measurements: &[Measurement]) -> Result<()> {
    if measurements.is_empty() {
        return Err(Error::Usage(
            "nothing to plot: there are no measurements; measure at least one path, or pass files \
             that `pack bench-read --save FILE` wrote"
                .into(),
        ));
    }
    let sweeps: Vec<Vec<Measurement>> = sweeps(measurements)
        .into_iter()
        .map(|mut sweep| {
            sweep.sort_by_key(|m| m.threads);
            sweep
        })
        .collect();
    draw(path, &sweeps)
        .map_err(|e| Error::Io { path: path.to_path_buf(), source: std::io::Error::other(e.to_string()) })
}

/// Draws both panels and writes the file.
fn draw(path: &Path, sweeps: &[Vec<Measurement>]) -> Drawn {
    let colours: Vec<RGBAColor> = (0..sweeps.len()).map(|i| Palette99::pick(i).to_rgba()).collect();
    let root = SVGBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE)?;
    let (left, right) = root.split_horizontally(SIZE.0 / 2);
    draw_throughput(&left, sweeps, &colours)?;
    draw_latency(&right, sweeps, &colours)?;
    root.present()?;
    Ok(())
}

/// The left panel: samples/s against threads, one line with a point per level for each sweep.
fn draw_throughput(
    area: &DrawingArea<SVGBackend, Shift>,
    sweeps: &[Vec<Measurement>],
    colours: &[RGBAColor],
) -> Drawn {
    let mut levels: Vec<usize> = sweeps.iter().flatten().map(|m| m.threads.max(1)).collect();
    levels.sort_unstable();
    levels.dedup();
    let (fewest, most) = (levels[0] as f64, levels[levels.len() - 1] as f64);
    // Half a doubling either side, so one level alone still spans a range and the outermost
    // points do not sit on the frame.
    let x = (fewest / 1.4)..(most * 1.4);
    let ticks: Vec<f64> = levels.iter().map(|&n| n as f64).collect();
    let best = sweeps.iter().flatten().map(|m| m.samples_per_s).filter(|v| v.is_finite()).fold(0.0, f64::max);
    let y = 0.0..if best > 0.0 { best * 1.1 } else { 1.0 };

    let mut chart = ChartBuilder::on(area)
        .caption("throughput", ("sans-serif", 24))
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(80)
        .build_cartesian_2d(x.log_scale().base(2.0).with_key_points(ticks), y)?;
    chart
        .configure_mesh()
        .label_style(("sans-serif", 16))
        .axis_desc_style(("sans-serif", 17))
        .light_line_style(BLACK.mix(0.04))
        .x_desc("threads")
        .y_desc("samples/s")
        .x_label_formatter(&|n| format!("{n:.0}"))
        .y_label_formatter(&|v| tick(*v))
        .draw()?;
    for (sweep, &colour) in sweeps.iter().zip(colours) {
        let points = sweep
            .iter()
            .filter(|m| m.samples_per_s.is_finite())
            .map(|m| (m.threads.max(1) as f64, m.samples_per_s.max(0.0)));
        chart.draw_series(LineSeries::new(points, colour.stroke_width(2)).point_size(4))?;
    }
    Ok(())
}

/// The right panel: the latency distribution of each sweep at its lowest level, with the legend.
fn draw_latency(
    area: &DrawingArea<SVGBackend, Shift>,
    sweeps: &[Vec<Measurement>],
    colours: &[RGBAColor],
) -> Drawn {
    // Sweeps are sorted by threads: the first level is one thread, or the fewest measured.
    let lowest: Vec<&Measurement> = sweeps.iter().map(|sweep| &sweep[0]).collect();
    let caption = if lowest.iter().all(|m| m.threads == 1) {
        "latency distribution (1 thread)"
    } else {
        "latency distribution (fewest threads measured)"
    };
    let curves: Vec<Vec<(f64, f64)>> = lowest.iter().map(|m| cdf_points(m)).collect();
    let floors: Vec<Option<f64>> = lowest.iter().map(|m| floor_us(m)).collect();
    let x = decades(curves.iter().flatten().map(|&(us, _)| us).chain(floors.iter().flatten().copied()));
    let (bold, light) = decade_ticks(&x);

    let mut chart = ChartBuilder::on(area)
        .caption(caption, ("sans-serif", 24))
        .margin(15)
        .margin_right(35)
        .x_label_area_size(45)
        .y_label_area_size(60)
        .build_cartesian_2d(x.log_scale().with_key_points(bold).with_light_points(light), 0.0..1.0)?;
    chart
        .configure_mesh()
        .label_style(("sans-serif", 16))
        .axis_desc_style(("sans-serif", 17))
        .light_line_style(BLACK.mix(0.04))
        .x_desc("latency (µs)")
        .y_desc("share of reads at or below")
        .x_label_formatter(&|v| tick(*v))
        .y_label_formatter(&|v| tick(*v))
        .draw()?;
    let labels = labels(sweeps);
    for (((curve, label), m), &colour) in curves.into_iter().zip(labels).zip(&lowest).zip(colours) {
        let label = if m.threads == 1 { label } else { format!("{label} — {} threads", m.threads) };
        chart
            .draw_series(LineSeries::new(curve, colour.stroke_width(2)))?
            .label(label)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], colour.stroke_width(2)));
    }
    // Each sweep's memory floor (the same reads replayed from memory: `floor`) as a dashed
    // vertical line at its median, in the sweep's colour: how far a warm read is from what the
    // machine can do at all shows at a glance, as the tables' "x floor" column says in numbers.
    let mut explained = false;
    for (floor, &colour) in floors.iter().zip(colours) {
        let Some(us) = *floor else { continue };
        let dashes =
            DashedLineSeries::new([(us, 0.0), (us, 1.0)], 6, 5, colour.mix(FLOOR_ALPHA).stroke_width(1));
        let drawn = chart.draw_series(dashes)?;
        if !explained {
            explained = true;
            drawn.label("dashed: memory floor, median").legend(|(x, y)| {
                DashedPathElement::new(
                    vec![(x, y), (x + 20, y)],
                    5,
                    3,
                    BLACK.mix(FLOOR_ALPHA).stroke_width(1),
                )
            });
        }
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.5))
        .label_font(("sans-serif", 16))
        .draw()?;
    Ok(())
}

/// How opaque the memory-floor lines are: drawn over the curves, they must not hide them.
const FLOOR_ALPHA: f64 = 0.7;

/// The median of a measurement's memory floor, if it was measured and a log axis can show it.
fn floor_us(m: &Measurement) -> Option<f64> {
    m.floor_us.map(|f| f.p50).filter(|us| us.is_finite() && *us > 0.0)
}

/// The `(microseconds, quantile)` points of a measurement's latency distribution that a log
/// axis can show: positive, finite latencies.
fn cdf_points(m: &Measurement) -> Vec<(f64, f64)> {
    m.latency_cdf_us
        .iter()
        .filter(|[q, us]| q.is_finite() && us.is_finite() && *us > 0.0)
        .map(|&[q, us]| (us, q.clamp(0.0, 1.0)))
        .collect()
}

/// The range of whole decades (powers of ten) that holds every value; 1..1000 µs for none, and
/// one decade for a single value that is itself a power of ten.
fn decades(values: impl Iterator<Item = f64>) -> Range<f64> {
    let (lo, hi) = values.fold((f64::INFINITY, 0.0_f64), |(lo, hi), v| (lo.min(v), hi.max(v)));
    if !(lo.is_finite() && lo > 0.0 && hi.is_finite()) {
        return 1.0..1000.0;
    }
    let lo = 10f64.powf(lo.log10().floor());
    let hi = 10f64.powf(hi.log10().ceil());
    if hi > lo {
        lo..hi
    } else {
        lo..lo * 10.0
    }
}

/// Tick marks for a decade range: labelled at each power of ten, light lines at 2..9 times it.
fn decade_ticks(range: &Range<f64>) -> (Vec<f64>, Vec<f64>) {
    let (mut bold, mut light) = (Vec::new(), Vec::new());
    let mut decade = range.start;
    while decade <= range.end * (1.0 + 1e-9) {
        bold.push(decade);
        light.extend((2..10).map(|k| decade * f64::from(k)).filter(|&v| v < range.end));
        decade *= 10.0;
    }
    (bold, light)
}

/// The legend label of each sweep: `{file name} {format} ({access}) {pattern} {cache}`, with the
/// full path instead of the file name where two sweeps would otherwise share a label, and
/// ` O_DIRECT` for reads that bypassed the page cache.
fn labels(sweeps: &[Vec<Measurement>]) -> Vec<String> {
    let label = |m: &Measurement, full: bool| {
        let name = match Path::new(&m.path).file_name() {
            Some(name) if !full => name.to_string_lossy().into_owned(),
            _ => m.path.clone(),
        };
        let direct = if m.direct { " O_DIRECT" } else { "" };
        format!("{name} {} ({}) {} {}{direct}", m.format, m.access, m.pattern, m.cache)
    };
    let short: Vec<String> = sweeps.iter().map(|s| label(&s[0], false)).collect();
    sweeps
        .iter()
        .zip(&short)
        .map(
            |(s, l)| {
                if short.iter().filter(|o| *o == l).count() > 1 {
                    label(&s[0], true)
                } else {
                    l.clone()
                }
            },
        )
        .collect()
}

/// An axis label: thousands separators from 1,000 up, no trailing zeros below.
fn tick(value: f64) -> String {
    if value.abs() >= 1000.0 {
        let digits = format!("{:.0}", value.abs());
        let mut out = String::from(if value < 0.0 { "-" } else { "" });
        for (i, c) in digits.chars().enumerate() {
            if i > 0 && (digits.len() - i) % 3 == 0 {
                out.push(',');
            }
            out.push(c);
        }
        out
    } else {
        let text = format!("{value:.3}");
        let text = text.trim_end_matches('0').trim_end_matches('.');
        if text == "-0" {
            "0".into()
        } else {
            text.into()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::record::tests::sample;
    use super::*;

    fn colour(i: usize) -> String {
        let c = Palette99::pick(i).to_rgba();
        format!("#{:02X}{:02X}{:02X}", c.0, c.1, c.2)
    }

    /// Polylines (lines and legend marks) and circles (points) drawn in sweep `i`'s colour.
    fn marks(svg: &str, i: usize) -> (usize, usize) {
        let stroke = format!("opacity=\"1\" stroke=\"{}\"", colour(i));
        let hollow = format!("fill=\"none\" stroke=\"{}\"", colour(i));
        let lines = svg.lines().filter(|l| l.contains("<polyline") && l.contains(&stroke)).count();
        let points = svg.lines().filter(|l| l.contains("<circle") && l.contains(&hollow)).count();
        (lines, points)
    }

    /// The dashes of sweep `i`'s memory-floor line (polylines in its colour, see-through).
    fn floor_dashes(svg: &str, i: usize) -> usize {
        let stroke = format!("opacity=\"{FLOOR_ALPHA}\" stroke=\"{}\"", colour(i));
        svg.lines().filter(|l| l.contains("<polyline") && l.contains(&stroke)).count()
    }

    /// The text of every `<text>` element (plotters writes it on the line after the tag).
    fn texts(svg: &str) -> Vec<&str> {
        let lines: Vec<&str> = svg.lines().collect();
        lines.windows(2).filter(|w| w[0].starts_with("<text")).map(|w| w[1]).collect()
    }

    fn two_sweeps_and_a_single_level() -> Vec<Measurement> {
        let mut ms = Vec::new();
        for (threads, rate) in [(1, 1000.0), (2, 1900.0), (4, 2100.0)] {
            ms.push(sample("/d/train.lmdb", "reader", threads, rate));
            let mut faults = sample("/d/val.lmdb", "map faults", threads, rate * 3.0);
            faults.latency_cdf_us = vec![[0.1, 0.8], [0.5, 1.5], [0.99, 30.0], [1.0, 250.0]];
            ms.push(faults);
        }
        let mut shards = sample("/d/shards", "pread", 1, 420.0);
        shards.format = "webdataset".into();
        shards.cache = "cold".into();
        shards.floor_us = None;
        shards.x_floor = None;
        ms.push(shards);
        ms
    }

    #[test]
    fn draws_every_sweep_in_both_panels_with_its_label() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bench.svg");
        plot(&path, &two_sweeps_and_a_single_level()).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        assert!(
            svg.starts_with("<svg") || svg.starts_with("<?xml"),
            "{}",
            svg.chars().take(200).collect::<String>()
        );
        assert!(svg.contains("<text"), "no text in the SVG");
        for text in [
            "throughput",
            "latency distribution (1 thread)",
            "threads",
            "samples/s",
            "latency (µs)",
            "train.lmdb lmdb (reader) random warm",
            "val.lmdb lmdb (map faults) random warm",
            "shards webdataset (pread) random cold",
        ] {
            assert!(svg.contains(text), "{text:?} missing from the SVG");
        }
        // Each sweep: its throughput line, its distribution and its legend mark; a point per level.
        assert_eq!(marks(&svg, 0), (3, 3));
        assert_eq!(marks(&svg, 1), (3, 3));
        // One level: a one-point line (drawn, if invisibly) and one point.
        assert_eq!(marks(&svg, 2), (3, 1));
        assert_eq!(marks(&svg, 3), (0, 0), "a fourth sweep appeared");
        // The memory floor: a dashed line for each sweep that measured one, explained once.
        assert!(floor_dashes(&svg, 0) >= 5 && floor_dashes(&svg, 1) >= 5, "no floor lines drawn");
        assert_eq!(floor_dashes(&svg, 2), 0, "a floor drawn for a sweep without one");
        assert_eq!(svg.matches("dashed: memory floor, median").count(), 1);
    }

    #[test]
    fn the_thread_axis_is_labelled_at_the_levels_measured() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("threads.svg");
        let ms: Vec<Measurement> =
            [1, 3, 16].iter().map(|&n| sample("/d/train.lmdb", "reader", n, 100.0 * n as f64)).collect();
        plot(&path, &ms).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        let labels = texts(&svg);
        for n in ["1", "3", "16"] {
            assert!(labels.contains(&n), "no tick {n} in {labels:?}");
        }
        assert!(!labels.contains(&"8"), "a tick at a level not measured: {labels:?}");
    }

    #[test]
    fn a_sweep_without_one_thread_shows_its_lowest_level() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("lowest.svg");
        let ms =
            vec![sample("/d/train.lmdb", "reader", 8, 900.0), sample("/d/train.lmdb", "reader", 4, 800.0)];
        plot(&path, &ms).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        assert!(svg.contains("latency distribution (fewest threads measured)"), "{svg}");
        assert!(svg.contains("train.lmdb lmdb (reader) random warm — 4 threads"), "{svg}");
    }

    #[test]
    fn flat_or_degenerate_values_still_plot() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("flat.svg");
        let mut zero = sample("/d/train.lmdb", "reader", 1, 0.0);
        zero.samples_per_s = 0.0;
        zero.latency_cdf_us = vec![[0.5, 0.0], [1.0, 0.0]];
        let mut nan = sample("/d/val.lmdb", "reader", 1, 10.0);
        nan.latency_cdf_us = vec![];
        nan.samples_per_s = f64::NAN;
        plot(&path, &[zero, nan]).unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        assert!(svg.contains("train.lmdb lmdb (reader) random warm"), "{svg}");
        assert!(!svg.contains("NaN") && !svg.contains("inf"), "{svg}");
    }

    #[test]
    fn ranges_are_never_empty() {
        assert_eq!(decades([3.5, 1234.5].into_iter()), 1.0..10000.0);
        assert_eq!(decades([100.0].into_iter()), 100.0..1000.0);
        assert_eq!(decades([0.4, 0.4].into_iter()), 0.1..1.0);
        assert_eq!(decades(std::iter::empty()), 1.0..1000.0);
        assert_eq!(decades([0.0, f64::NAN].into_iter()), 1.0..1000.0);
        let (bold, light) = decade_ticks(&(1.0..100.0));
        assert_eq!(bold.len(), 3, "{bold:?}");
        assert!((bold[2] - 100.0).abs() < 1e-9, "{bold:?}");
        assert_eq!(light.len(), 16, "{light:?}");
    }

    #[test]
    fn labels_tell_sweeps_apart() {
        let mut ms =
            vec![sample("/a/train.lmdb", "reader", 1, 1.0), sample("/b/train.lmdb", "reader", 1, 1.0)];
        let mut direct = sample("/c/val.lmdb", "pread", 1, 1.0);
        direct.direct = true;
        ms.push(direct);
        let labels = labels(&sweeps(&ms));
        assert_eq!(
            labels,
            [
                "/a/train.lmdb lmdb (reader) random warm",
                "/b/train.lmdb lmdb (reader) random warm",
                "val.lmdb lmdb (pread) random warm O_DIRECT"
            ]
        );
    }

    #[test]
    fn tick_labels() {
        assert_eq!(tick(0.0), "0");
        assert_eq!(tick(0.30000000000000004), "0.3");
        assert_eq!(tick(1.0), "1");
        assert_eq!(tick(250.0), "250");
        assert_eq!(tick(12500.0), "12,500");
        assert_eq!(tick(1_000_000.0), "1,000,000");
    }

    #[test]
    fn nothing_to_plot_is_a_usage_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("empty.svg");
        let err = plot(&path, &[]).unwrap_err();
        assert!(matches!(&err, Error::Usage(m) if m.starts_with("nothing to plot: ")), "{err:?}");
        assert!(!path.exists());
    }

    #[test]
    fn an_unwritable_file_is_an_io_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("no such dir").join("bench.svg");
        let err = plot(&path, &[sample("/d/train.lmdb", "reader", 1, 10.0)]).unwrap_err();
        assert!(matches!(&err, Error::Io { path: p, .. } if *p == path), "{err:?}");
    }
}
