//! One measurement's result, as `--json` writes it and `--compare` and `--plot` read it back,
//! and the tables printed on stdout.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::device::Device;
use super::stats::{knee, Latency};
use crate::{Error, Result};

/// The result of one measurement: one path, read one way, at one concurrency level. `--json`
/// prints one per line, `--save` writes them to a file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Measurement {
    /// Always `measurement`: the record's type among `pack`'s JSON lines. Files saved before
    /// it was written read as well.
    #[serde(rename = "type", default = "measurement_type")]
    pub record: String,
    /// The path measured, as given.
    pub path: String,
    /// `files` (an ImageFolder tree), `lmdb`, `webdataset` or `file` (`--file`).
    pub format: String,
    /// How each sample was read: `open+read`, `map faults`, `reader`, `pread`, `block pread`.
    pub access: String,
    /// The storage under the path.
    pub device: Device,
    /// `random` or `sequential`.
    pub pattern: String,
    /// `warm`, `cold`, or `bypassed` (`O_DIRECT` reads without `--cache cold`).
    pub cache: String,
    /// Whether reads bypassed the page cache (`O_DIRECT`).
    pub direct: bool,
    /// Concurrent readers.
    pub threads: usize,
    /// Reads measured.
    pub samples: u64,
    /// Bytes read.
    pub bytes: u64,
    /// Wall-clock time of the measurement.
    pub seconds: f64,
    /// Samples per second.
    pub samples_per_s: f64,
    /// Megabytes (10^6 bytes) per second.
    pub mb_per_s: f64,
    /// Per-read latency.
    pub latency_us: Latency,
    /// The latency distribution: `[quantile, microseconds]` pairs.
    pub latency_cdf_us: Vec<[f64; 2]>,
    /// The memory floor: per-read latency of the same reads summing copies of the same bytes
    /// already in memory ([`super::floor`]). `None` in files saved before it was measured.
    #[serde(default)]
    pub floor_us: Option<Latency>,
    /// The p50 latency over the floor's p50: how many times the memory floor a typical read
    /// costs. `None` in files saved before it was measured.
    #[serde(default)]
    pub x_floor: Option<f64>,
    /// Share of the files' pages in the page cache just before reading (after the eviction
    /// for a cold measurement, after the warm-up for a warm one); `None` if unknown.
    pub resident_before: Option<f64>,
    /// For a cold measurement, the share before eviction.
    pub resident_before_eviction: Option<f64>,
    /// Anything that makes the figure mean less than it says (eviction did not take, the data
    /// does not fit in the page cache, a cold run capped at one pass...).
    pub notes: Vec<String>,
    /// The seed of the random order.
    pub seed: u64,
    /// The machine's host name.
    pub host: String,
    /// The tool that measured.
    pub tool: String,
}

fn measurement_type() -> String {
    MEASUREMENT.to_string()
}

/// The `"type"` of a measurement's JSON line.
pub const MEASUREMENT: &str = "measurement";

impl Measurement {
    /// A short name for the thing measured: `files`, `lmdb (map faults)`, `webdataset (pread)`.
    pub fn kind(&self) -> String {
        format!("{} ({})", self.format, self.access)
    }
}

/// Measurements as JSON lines.
pub fn jsonl(measurements: &[Measurement]) -> String {
    let mut text = String::new();
    for m in measurements {
        text.push_str(&serde_json::to_string(m).expect("measurement serialises"));
        text.push('\n');
    }
    text
}

/// Writes measurements as JSON lines to `path` (`-` for stdout).
pub fn write_jsonl(path: &Path, measurements: &[Measurement]) -> Result<()> {
    let text = jsonl(measurements);
    if path == Path::new("-") {
        print!("{text}");
        return Ok(());
    }
    std::fs::write(path, text).map_err(Error::io(path))
}

/// Reads measurements written by `--save` (or printed by `--json`).
pub fn read_jsonl(path: &Path) -> Result<Vec<Measurement>> {
    let text = std::fs::read_to_string(path).map_err(Error::io(path))?;
    text.lines()
        .enumerate()
        .filter(|(_, line)| !line.trim().is_empty())
        .map(|(n, line)| {
            serde_json::from_str(line).map_err(|e| Error::BadSource {
                path: path.to_path_buf(),
                reason: format!(
                    "line {}: not a bench-read measurement ({e}); pass files written by `pack bench-read --save FILE`",
                    n + 1
                ),
            })
        })
        .collect()
}

/// The table for the measurements of one path read one way (one concurrency sweep).
pub fn sweep_table(sweep: &[Measurement]) -> String {
    let Some(first) = sweep.first() else { return String::new() };
    let mut out = String::new();
    let direct = if first.direct { ", O_DIRECT" } else { "" };
    let _ = writeln!(out, "{} — {}", first.path, first.kind());
    let _ = writeln!(out, "  storage: {}", first.device.describe());
    let _ = writeln!(out, "  {} order, {} cache{direct}", first.pattern, first.cache);
    let _ = writeln!(
        out,
        "  {:>7} {:>9} {:>12} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>7}",
        "threads",
        "samples",
        "samples/s",
        "MB/s",
        "p50 µs",
        "p90 µs",
        "p99 µs",
        "p99.9 µs",
        "max µs",
        "floor µs",
        "×floor"
    );
    for m in sweep {
        let l = &m.latency_us;
        let _ = writeln!(
            out,
            "  {:>7} {:>9} {:>12} {:>9.1} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>7}",
            m.threads,
            m.samples,
            group(m.samples_per_s),
            m.mb_per_s,
            us(l.p50),
            us(l.p90),
            us(l.p99),
            us(l.p99_9),
            us(l.max),
            m.floor_us.map_or("-".into(), |f| us(f.p50)),
            ratio(m.x_floor)
        );
    }
    if sweep.iter().any(|m| m.floor_us.is_some()) {
        let _ = writeln!(
            out,
            "  floor: the same reads summing copies of the same bytes already in memory (p50); ×floor = p50 / floor"
        );
    }
    let levels: Vec<(usize, f64)> = sweep.iter().map(|m| (m.threads, m.samples_per_s)).collect();
    if let (Some(k), true) = (knee(&levels), levels.len() > 1) {
        let best =
            sweep.iter().max_by(|a, b| a.samples_per_s.total_cmp(&b.samples_per_s)).expect("non-empty");
        let _ = writeln!(
            out,
            "  knee: {k} threads (the fewest within 5% of the best, {} samples/s at {} threads)",
            group(best.samples_per_s),
            best.threads
        );
    }
    let mut notes: Vec<String> = Vec::new();
    for m in sweep {
        if let (Some(before), Some(after)) = (m.resident_before_eviction, m.resident_before) {
            notes.push(format!(
                "{} threads: {:.0}% of the pages cached before eviction, {:.0}% after",
                m.threads,
                before * 100.0,
                after * 100.0
            ));
        }
        for note in &m.notes {
            let line = format!("{} threads: {note}", m.threads);
            if !notes.contains(&line) {
                notes.push(line);
            }
        }
    }
    for note in notes {
        let _ = writeln!(out, "  note: {note}");
    }
    out
}

/// Groups measurements into sweeps: same path, format, access, pattern, cache and direct, in
/// the order they first appear.
pub fn sweeps(measurements: &[Measurement]) -> Vec<Vec<Measurement>> {
    let mut out: Vec<Vec<Measurement>> = Vec::new();
    for m in measurements {
        let same = |o: &Measurement| {
            (&o.path, &o.format, &o.access, &o.pattern, &o.cache, o.direct)
                == (&m.path, &m.format, &m.access, &m.pattern, &m.cache, m.direct)
        };
        match out.iter_mut().find(|s| same(&s[0])) {
            Some(sweep) => sweep.push(m.clone()),
            None => out.push(vec![m.clone()]),
        }
    }
    out
}

/// Results of several runs side by side (`--compare`): one column per run, one row per
/// dataset (by directory name), access, pattern, cache and thread count, so the same dataset
/// measured on an HDD, a SATA SSD and an NVMe drive lines up.
pub fn compare_table(runs: &[(String, Vec<Measurement>)]) -> String {
    type Row = (String, String, String, String, usize);
    let row_of = |m: &Measurement| -> Row {
        let name =
            Path::new(&m.path).file_name().map_or(m.path.clone(), |n| n.to_string_lossy().into_owned());
        let direct = if m.direct { " O_DIRECT" } else { "" };
        (name, m.kind(), m.pattern.clone(), format!("{}{direct}", m.cache), m.threads)
    };
    let mut rows: Vec<Row> = Vec::new();
    let mut cells: BTreeMap<(Row, usize), &Measurement> = BTreeMap::new();
    for (col, (_, ms)) in runs.iter().enumerate() {
        for m in ms {
            let row = row_of(m);
            if !rows.contains(&row) {
                rows.push(row.clone());
            }
            cells.insert((row, col), m);
        }
    }
    let mut out = String::new();
    for (col, (name, ms)) in runs.iter().enumerate() {
        let mut devices: Vec<String> = Vec::new();
        for m in ms {
            let d = format!("{} on {}", m.host, m.device.describe());
            if !devices.contains(&d) {
                devices.push(d);
            }
        }
        let _ = writeln!(out, "[{}] {name}: {}", col + 1, devices.join("; "));
    }
    let _ = writeln!(out, "cells: samples/s | p50 µs | p99 µs | ×floor (p50 over the memory floor's)");
    let _ = write!(out, "{:<44} {:>7}", "dataset, access, order, cache", "threads");
    for col in 0..runs.len() {
        let _ = write!(out, " {:>36}", format!("[{}]", col + 1));
    }
    out.push('\n');
    for row in &rows {
        let label = format!("{}, {}, {}, {}", row.0, row.1, row.2, row.3);
        let _ = write!(out, "{label:<44} {:>7}", row.4);
        for col in 0..runs.len() {
            let cell = match cells.get(&(row.clone(), col)) {
                Some(m) => format!(
                    "{} | {} | {} | {}",
                    group(m.samples_per_s),
                    us(m.latency_us.p50),
                    us(m.latency_us.p99),
                    ratio(m.x_floor)
                ),
                None => "-".to_string(),
            };
            let _ = write!(out, " {cell:>36}");
        }
        out.push('\n');
    }
    out
}

/// A count or throughput with thousands separators and no decimals.
pub(crate) fn group(value: f64) -> String {
    let digits = format!("{:.0}", value.max(0.0));
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// A ratio to the memory floor with three significant figures, `-` when there is none (files
/// saved before it was measured).
fn ratio(value: Option<f64>) -> String {
    value.map_or("-".into(), us)
}

/// Microseconds with three significant figures (1.23, 45.6, 789, 12,345).
fn us(value: f64) -> String {
    if value < 10.0 {
        format!("{value:.2}")
    } else if value < 100.0 {
        format!("{value:.1}")
    } else {
        group(value)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn sample(path: &str, access: &str, threads: usize, rate: f64) -> Measurement {
        Measurement {
            record: MEASUREMENT.to_string(),
            path: path.into(),
            format: "lmdb".into(),
            access: access.into(),
            device: Device {
                name: "vda".into(),
                partition: None,
                model: None,
                rotational: Some(true),
                transport: "virtio".into(),
                filesystem: "ext4".into(),
                mount_point: "/".into(),
            },
            pattern: "random".into(),
            cache: "warm".into(),
            direct: false,
            threads,
            samples: 1000,
            bytes: 80_000_000,
            seconds: 1000.0 / rate,
            samples_per_s: rate,
            mb_per_s: rate * 0.08,
            latency_us: Latency { p50: 3.5, p90: 5.0, p99: 12.25, p99_9: 40.0, max: 1234.5, mean: 4.0 },
            latency_cdf_us: vec![[0.5, 3.5], [1.0, 1234.5]],
            floor_us: Some(Latency { p50: 2.8, p90: 3.0, p99: 4.0, p99_9: 9.0, max: 20.0, mean: 2.9 }),
            x_floor: Some(1.25),
            resident_before: Some(1.0),
            resident_before_eviction: None,
            notes: vec![],
            seed: 7,
            host: "box".into(),
            tool: "imgpack test".into(),
        }
    }

    #[test]
    fn jsonl_round_trip_keeps_every_field() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("run.json");
        let ms =
            vec![sample("/d/train.lmdb", "reader", 1, 1000.0), sample("/d/train.lmdb", "reader", 2, 1900.0)];
        write_jsonl(&path, &ms).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text.lines().count(), 2);
        assert!(text.contains("\"p99.9\":40.0"), "{text}");
        assert_eq!(read_jsonl(&path).unwrap(), ms);
    }

    #[test]
    fn files_saved_before_the_floor_read_without_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("old.json");
        let mut m = sample("/d/train.lmdb", "reader", 1, 1000.0);
        m.floor_us = None;
        m.x_floor = None;
        let mut value = serde_json::to_value(&m).unwrap();
        let object = value.as_object_mut().unwrap();
        object.remove("floor_us");
        object.remove("x_floor");
        std::fs::write(&path, format!("{value}\n")).unwrap();
        assert_eq!(read_jsonl(&path).unwrap(), vec![m.clone()]);
        let t = sweep_table(&[m.clone()]);
        assert!(!t.contains("floor: the same reads"), "{t}");
        let t = compare_table(&[
            ("old.json".into(), vec![m]),
            ("new.json".into(), vec![sample("/e/train.lmdb", "reader", 1, 900.0)]),
        ]);
        let row = t.lines().find(|l| l.starts_with("train.lmdb")).unwrap();
        assert!(row.contains("| 12.2 | - ") && row.ends_with("| 12.2 | 1.25"), "{t}");
    }

    #[test]
    fn a_file_that_is_not_jsonl_is_named_with_its_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bad.json");
        std::fs::write(&path, "{\"path\": 1}\n").unwrap();
        let err = read_jsonl(&path).unwrap_err().to_string();
        assert!(err.contains("bad.json") && err.contains("line 1"), "{err}");
    }

    #[test]
    fn sweep_table_shows_every_level_and_the_knee() {
        let ms = vec![
            sample("/d/train.lmdb", "reader", 1, 1000.0),
            sample("/d/train.lmdb", "reader", 2, 1960.0),
            sample("/d/train.lmdb", "reader", 4, 2000.0),
        ];
        let t = sweep_table(&ms);
        assert!(t.contains("/d/train.lmdb — lmdb (reader)"), "{t}");
        assert!(t.contains("1,960"), "{t}");
        assert!(t.contains("knee: 2 threads"), "{t}");
        assert!(t.contains("12.2") && t.contains("1,234"), "{t}");
        let header = t.lines().find(|l| l.contains("threads") && l.contains("samples/s")).unwrap();
        assert!(header.ends_with("floor µs  ×floor"), "{t}");
        assert!(t.lines().any(|l| l.ends_with("  2.80    1.25")), "{t}");
        assert!(t.contains("×floor = p50 / floor"), "{t}");
    }

    #[test]
    fn compare_lines_up_the_same_dataset_from_two_runs() {
        let mut hdd = sample("/mnt/hdd/train.lmdb", "reader", 1, 100.0);
        hdd.device.name = "sda".into();
        let ssd = sample("/nvme/train.lmdb", "reader", 1, 9000.0);
        let extra = sample("/nvme/train.lmdb", "reader", 2, 17000.0);
        let t = compare_table(&[("hdd.json".into(), vec![hdd]), ("nvme.json".into(), vec![ssd, extra])]);
        let lines: Vec<&str> = t.lines().collect();
        assert!(lines[0].starts_with("[1] hdd.json: box on "), "{t}");
        let one = lines.iter().find(|l| l.starts_with("train.lmdb") && l.contains("  1 ")).unwrap();
        assert!(one.contains("100 |") && one.contains("9,000 |"), "{t}");
        let two = lines.iter().find(|l| l.starts_with("train.lmdb") && l.contains("  2 ")).unwrap();
        assert!(two.contains(" -") && two.contains("17,000"), "{t}");
    }

    #[test]
    fn number_formatting() {
        assert_eq!(group(1234567.4), "1,234,567");
        assert_eq!(group(999.0), "999");
        assert_eq!(us(3.456), "3.46");
        assert_eq!(us(45.67), "45.7");
        assert_eq!(us(12345.0), "12,345");
    }
}
