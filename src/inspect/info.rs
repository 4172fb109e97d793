//! `pack info PATH`: what a dataset is, from its metadata and one pass over its labels.

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;

use serde::Serialize;

use crate::cluster::merge::{dataset_bytes, part_dirs, shard_dirs};
use crate::progress::Progress;
use crate::size::human_bytes;

/// What `pack info` reports.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Info {
    /// Always `info`: the record's type among `pack`'s JSON lines.
    #[serde(rename = "type")]
    pub record: &'static str,
    /// The dataset path, as given.
    pub path: String,
    /// `lmdb` or `webdataset`.
    pub format: &'static str,
    /// The format name and version in the metadata (`imgpack-lmdb`, 2).
    pub format_name: String,
    pub format_version: u32,
    /// Samples in the dataset.
    pub samples: u64,
    /// Class names in class-index order.
    pub classes: Vec<String>,
    /// Samples per class, in class-index order.
    pub class_counts: Vec<u64>,
    /// Per stored field: how many samples have it and their bytes.
    pub fields: BTreeMap<String, FieldStats>,
    /// The bytes of every stored field of every sample.
    pub sample_bytes: u64,
    /// The bytes of the dataset's files on disk, part directories of a merged WebDataset
    /// included (for LMDB, `data.mdb` with its free pages); in an object store, of every object
    /// under its prefix.
    pub bytes_on_disk: u64,
    /// WebDataset only: the shards.
    pub shards: Option<ShardStats>,
    /// `passthrough`, `reencode` or `decode`.
    pub mode: String,
    /// Every option that shaped the output, as recorded in the metadata.
    pub options: serde_json::Value,
    /// Whether the samples were shuffled, and with which seed.
    pub shuffle: bool,
    pub seed: Option<u64>,
    /// Where the samples came from: the source kind and root as given to `pack`.
    pub source_kind: String,
    pub source_root: String,
    /// The tool that wrote the dataset, e.g. `imgpack 0.1.0`.
    pub tool: String,
    /// The checksum algorithm of the samples (`crc32`), none before format version 2.
    pub checksum: Option<String>,
    /// How many parts the dataset was merged from, when that can be told: a merged
    /// WebDataset keeps its shards in the part directories, and a merged LMDB whose parts were
    /// kept (`--keep-parts`) still has them. A merged LMDB without its parts is key for key
    /// the dataset one run would have written, and says nothing.
    pub parts: Option<u64>,
}

/// One stored field across the dataset.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct FieldStats {
    /// Samples that have the field.
    pub samples: u64,
    /// Their bytes in all.
    pub bytes: u64,
}

/// The shards of a WebDataset.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct ShardStats {
    pub count: u64,
    pub min_bytes: u64,
    pub max_bytes: u64,
    pub total_bytes: u64,
    pub min_samples: u64,
    pub max_samples: u64,
    /// Whether every shard has a recorded CRC-32 (format version 3 on).
    pub crc32: bool,
    /// Whether every shard has a recorded MD5 (`--md5`, or before version 3).
    pub md5: bool,
}

/// Reads what `pack info` reports about the dataset at `path`: the metadata, then every
/// sample's label and field sizes (with `progress` over the samples).
pub fn info(path: &Path, endpoint: Option<&str>, progress: &dyn Progress) -> crate::Result<Info> {
    let dataset = super::open(path, endpoint)?;
    let meta = dataset.meta().clone();
    let mut class_counts = vec![0u64; meta.classes.len()];
    let mut fields: BTreeMap<String, FieldStats> = BTreeMap::new();
    let mut sample_bytes = 0u64;
    progress.length(dataset.len());
    let mut done = 0u64;
    dataset.scan(|sample| {
        let label = sample.label()? as usize;
        if let Some(count) = class_counts.get_mut(label) {
            *count += 1;
        }
        for field in &sample.fields {
            let stats = fields.entry(field.ext.clone()).or_default();
            stats.samples += 1;
            stats.bytes += field.data.len() as u64;
            sample_bytes += field.data.len() as u64;
        }
        done += 1;
        if done.is_multiple_of(4096) {
            progress.position(done);
        }
        Ok(())
    })?;
    progress.finish();
    let option = |name: &str| meta.options.get(name);
    let shards = shard_stats(&meta.shards);
    // A merged WebDataset's shards name their part directories; a merged LMDB whose parts were
    // kept still holds them.
    let parts = match &shards {
        Some(_) => shard_dirs(&meta).len(),
        None => part_dirs(path).map_or(0, |(finished, _)| finished.len()),
    };
    let parts = (parts > 0).then_some(parts as u64);
    Ok(Info {
        record: "info",
        path: path.display().to_string(),
        format: if meta.format == imgpack_reader::lmdb::FORMAT_NAME { "lmdb" } else { "webdataset" },
        format_name: meta.format.clone(),
        format_version: meta.version,
        samples: meta.samples,
        classes: meta.classes.clone(),
        class_counts,
        fields,
        sample_bytes,
        bytes_on_disk: match &dataset {
            imgpack_reader::Dataset::Remote(remote) => remote.stored_bytes(),
            _ => dataset_bytes(path, &meta),
        },
        shards,
        mode: option("mode").and_then(|m| m.as_str()).unwrap_or("passthrough").to_string(),
        options: meta.options.clone(),
        shuffle: option("shuffle").and_then(|s| s.as_bool()).unwrap_or(false),
        seed: option("seed").and_then(|s| s.as_u64()),
        source_kind: meta.source.kind.clone(),
        source_root: meta.source.root.clone(),
        tool: meta.tool.clone(),
        checksum: meta.checksum.clone(),
        parts,
    })
}

fn shard_stats(shards: &[imgpack_reader::ShardInfo]) -> Option<ShardStats> {
    if shards.is_empty() {
        return None;
    }
    let bytes = shards.iter().map(|s| s.bytes);
    let samples = shards.iter().map(|s| s.samples);
    Some(ShardStats {
        count: shards.len() as u64,
        min_bytes: bytes.clone().min().unwrap_or(0),
        max_bytes: bytes.clone().max().unwrap_or(0),
        total_bytes: bytes.sum(),
        min_samples: samples.clone().min().unwrap_or(0),
        max_samples: samples.max().unwrap_or(0),
        crc32: shards.iter().all(|s| s.crc32.is_some()),
        md5: shards.iter().all(|s| s.md5.is_some()),
    })
}

impl Info {
    /// The human report, with the `top` largest and smallest classes.
    pub fn display(&self, top: usize) -> Display<'_> {
        Display { info: self, top }
    }

    /// The sample order in words.
    fn order(&self) -> String {
        match (self.shuffle, self.seed) {
            (true, Some(seed)) => format!("shuffled with seed {seed} (pack --shuffle --seed {seed})"),
            (true, None) => "shuffled".into(),
            (false, _) => "source order: class after class, as torchvision's ImageFolder lists them".into(),
        }
    }
}

/// [`Info`] as text.
pub struct Display<'a> {
    info: &'a Info,
    top: usize,
}

impl fmt::Display for Display<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let i = self.info;
        writeln!(
            f,
            "{}: {} dataset ({} version {}), written by {}",
            i.path,
            if i.format == "lmdb" { "LMDB" } else { "WebDataset" },
            i.format_name,
            i.format_version,
            i.tool
        )?;
        writeln!(f, "  samples    {} in {} classes", i.samples, i.classes.len())?;
        writeln!(
            f,
            "  bytes      {} of samples, {} {}",
            human_bytes(i.sample_bytes),
            human_bytes(i.bytes_on_disk),
            if crate::store::is_store_url(&i.path) { "stored" } else { "on disk" }
        )?;
        let fields: Vec<String> = i
            .fields
            .iter()
            .map(|(ext, s)| format!("{ext} {} ({})", s.samples, human_bytes(s.bytes)))
            .collect();
        writeln!(f, "  fields     {}", fields.join(", "))?;
        if let Some(s) = &i.shards {
            let sizes = if s.min_bytes == s.max_bytes {
                human_bytes(s.min_bytes)
            } else {
                format!("{} to {}", human_bytes(s.min_bytes), human_bytes(s.max_bytes))
            };
            let samples = if s.min_samples == s.max_samples {
                format!("{}", s.min_samples)
            } else {
                format!("{} to {}", s.min_samples, s.max_samples)
            };
            writeln!(f, "  shards     {}, {sizes} each, {samples} samples each", s.count)?;
        }
        writeln!(f, "  mode       {}", mode_text(&i.mode, &i.options))?;
        writeln!(f, "  order      {}", i.order())?;
        writeln!(f, "  source     {} {}", i.source_kind, i.source_root)?;
        let per_shard = match &i.shards {
            Some(ShardStats { crc32: true, md5: true, .. }) => ", crc32 and md5 per shard",
            Some(ShardStats { crc32: true, .. }) => ", crc32 per shard",
            Some(ShardStats { md5: true, .. }) => ", md5 per shard",
            _ => "",
        };
        match &i.checksum {
            Some(algorithm) => {
                writeln!(f, "  checksums  {algorithm} per sample{per_shard} (pack verify checks them)")?
            }
            None => writeln!(f, "  checksums  none per sample (written before format version 2){per_shard}")?,
        }
        match i.parts {
            Some(n) => writeln!(f, "  parts      merged from {n} parts")?,
            None => writeln!(f, "  parts      none recorded (one run, or a merged LMDB)")?,
        }
        write_classes(f, &i.classes, &i.class_counts, self.top)
    }
}

/// The mode with the transcoding options that shaped it (`reencode: resize_shorter 256,
/// quality 90, ...`).
fn mode_text(mode: &str, options: &serde_json::Value) -> String {
    // Options about listing and the output format are shown elsewhere or not at all.
    const NOT_TRANSCODING: [&str; 10] = [
        "mode",
        "to",
        "shuffle",
        "seed",
        "extensions",
        "on_error",
        "prefix",
        "shard_size",
        "shard_samples",
        "part",
    ];
    let Some(map) = options.as_object() else { return mode.to_string() };
    let details: Vec<String> = map
        .iter()
        .filter(|(key, value)| !NOT_TRANSCODING.contains(&key.as_str()) && !value.is_null())
        .map(|(key, value)| match value {
            serde_json::Value::String(text) => format!("{key} {text}"),
            other => format!("{key} {other}"),
        })
        .collect();
    if details.is_empty() {
        mode.to_string()
    } else {
        format!("{mode}: {}", details.join(", "))
    }
}

/// The class histogram: every class when there are few, else the `top` largest and smallest.
fn write_classes(f: &mut fmt::Formatter<'_>, classes: &[String], counts: &[u64], top: usize) -> fmt::Result {
    if classes.is_empty() {
        return Ok(());
    }
    let mut order: Vec<usize> = (0..classes.len()).collect();
    // Largest first; ties in class order, so the report is the same on every run.
    order.sort_by_key(|&c| (std::cmp::Reverse(counts[c]), c));
    let largest = counts[order[0]].max(1);
    let width = order.iter().map(|&c| classes[c].len()).max().unwrap_or(0).min(40);
    let row = |f: &mut fmt::Formatter<'_>, c: usize| -> fmt::Result {
        let bar = "#".repeat(((counts[c] * 30).div_ceil(largest)) as usize);
        writeln!(f, "    {c:>5}  {:<width$}  {:>8}  {bar}", classes[c], counts[c])
    };
    let min = counts.iter().min().copied().unwrap_or(0);
    let max = counts.iter().max().copied().unwrap_or(0);
    writeln!(f, "  classes    {} to {} samples per class", min, max)?;
    if classes.len() <= 2 * top {
        for &c in &order {
            row(f, c)?;
        }
    } else {
        writeln!(f, "   largest")?;
        for &c in &order[..top] {
            row(f, c)?;
        }
        writeln!(
            f,
            "   smallest ({} classes between not shown; --top N, or --json for all)",
            classes.len() - 2 * top
        )?;
        for &c in &order[order.len() - top..] {
            row(f, c)?;
        }
    }
    Ok(())
}
