//! The packing pipeline: list, load and check in parallel, write in order, publish.
//!
//! Samples are listed once and cut into chunks bounded by count and by bytes. A loader thread
//! reads and checks each chunk on the worker pool (`--threads`) and hands it over a channel
//! that holds at most one chunk; the calling thread writes chunks in order to the sink. So the
//! disk is read and written at the same time, the output is the same whatever the thread count,
//! and at most three chunks (one loading, one queued, one writing) are in memory at once,
//! whatever the dataset size.

use std::sync::mpsc;
use std::time::Instant;

use imgpack_reader::format::{CLS_FIELD, JSON_FIELD};
use imgpack_reader::key::{format_key, key_width};
use imgpack_reader::{Meta, SampleInfo, SourceInfo, FORMAT_VERSION};
use indicatif::ProgressBar;
use rayon::prelude::*;

use crate::config::{OnError, OutputFormat, PackConfig, SourceKind};
use crate::report::{Report, Skipped};
use crate::sink::imagefolder::{safe_relative, ImageFolderSink};
use crate::sink::lmdb::LmdbSink;
use crate::sink::webdataset::WebDatasetSink;
use crate::sink::{PackedSample, Sink};
use crate::source::dataset::{is_packed, PackedDataset};
use crate::source::imagefolder::ImageFolder;
use crate::source::{Source, SourceSample};
use crate::transcode::{self, Image};
use crate::{Error, Result};

/// At most this many source bytes in one chunk.
const CHUNK_BYTES: u64 = 32 << 20;
/// At most this many samples in one chunk.
const CHUNK_SAMPLES: usize = 1024;

/// Packs `config.source` into `config.output`. The bar (hidden or not) shows progress in
/// source bytes. Returns the summary; the output is published and durable when this returns.
pub fn pack(config: &PackConfig, bar: &ProgressBar) -> Result<Report> {
    let started = Instant::now();
    config.validate()?;
    let (source, source_kind): (Box<dyn Source>, &str) =
        if config.source_kind == SourceKind::Detect && is_packed(&config.source) {
            let packed = PackedDataset::open(&config.source)?;
            let kind = packed.kind();
            (Box::new(packed), kind)
        } else {
            (Box::new(ImageFolder::new(&config.source, &config.extensions)), "imagefolder")
        };
    bar.set_message("listing samples");
    let mut listing = source.list()?;
    if listing.samples.is_empty() {
        let reason = if source_kind == "imagefolder" {
            format!(
                "no files with extensions {} found in its class folders; pass --extensions to accept others",
                config.extensions.join(",")
            )
        } else {
            "the dataset holds no samples; nothing to convert".to_string()
        };
        return Err(Error::BadSource { path: config.source.clone(), reason });
    }
    if let Some(seed) = config.shuffle {
        crate::shuffle::shuffle(&mut listing.samples, seed);
    }
    let total_bytes: u64 = listing.samples.iter().map(|s| s.size).sum();
    let found = listing.samples.len() as u64;
    let width = key_width(found);
    bar.set_length(total_bytes);

    let mut sink: Box<dyn Sink> = match &config.format {
        OutputFormat::Lmdb => Box::new(LmdbSink::create(&config.output, config.overwrite, total_bytes)?),
        OutputFormat::WebDataset { prefix, limits } => {
            Box::new(WebDatasetSink::create(&config.output, config.overwrite, prefix, *limits)?)
        }
        OutputFormat::ImageFolder => {
            Box::new(ImageFolderSink::create(&config.output, config.overwrite, &listing.classes)?)
        }
    };
    let unpacking = config.format == OutputFormat::ImageFolder;
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(config.threads)
        .thread_name(|i| format!("imgpack-load-{i}"))
        .build()
        .map_err(|e| Error::Usage(format!("cannot start {} worker threads: {e}", config.threads)))?;

    let mut report = Report {
        kind: "summary",
        found,
        classes: listing.classes.len(),
        empty_classes: listing.empty_classes.clone(),
        warnings: listing.warnings.clone(),
        ..Report::default()
    };
    let chunks = chunk(&listing.samples);
    let (tx, rx) = mpsc::sync_channel::<Vec<Result<Image, String>>>(1);
    let written = std::thread::scope(|scope| -> Result<()> {
        let samples = &listing.samples;
        let source = &*source;
        scope.spawn(move || {
            for range in chunks {
                let loaded =
                    pool.install(|| samples[range].par_iter().map(|s| load(source, s, unpacking)).collect());
                if tx.send(loaded).is_err() {
                    return; // the writer stopped
                }
            }
        });
        let mut next = 0usize;
        let mut batch = Vec::new();
        for loaded in rx {
            batch.clear();
            for result in loaded {
                let sample = &samples[next];
                next += 1;
                bar.inc(sample.size);
                match result {
                    Ok(image) => {
                        let key = format_key(report.packed, width);
                        report.packed += 1;
                        report.bytes_in += image.bytes.len() as u64;
                        *report.formats.entry(image.format.extension().to_string()).or_default() += 1;
                        batch.push(packed_sample(key, sample, &listing.classes, image));
                    }
                    Err(reason) if config.on_error == OnError::Fail => {
                        return Err(Error::BadSample { path: sample.path.clone(), reason });
                    }
                    Err(reason) => report.skipped.push(Skipped { path: sample.path.clone(), reason }),
                }
            }
            sink.write_batch(&batch)?;
            let rate = next as f64 / started.elapsed().as_secs_f64().max(1e-3);
            bar.set_message(format!("{next}/{found} files, {rate:.0} files/s"));
        }
        Ok(())
    });
    written?;

    let mut fields: Vec<String> = report.formats.keys().cloned().collect();
    fields.extend([CLS_FIELD.to_string(), JSON_FIELD.to_string()]);
    fields.sort();
    let format = match &config.format {
        OutputFormat::Lmdb => imgpack_reader::lmdb::FORMAT_NAME,
        OutputFormat::WebDataset { .. } => imgpack_reader::webdataset::FORMAT_NAME,
        OutputFormat::ImageFolder => "imagefolder",
    };
    let meta = Meta {
        format: format.into(),
        version: FORMAT_VERSION,
        samples: report.packed,
        key_width: width,
        classes: listing.classes.clone(),
        fields,
        source: SourceInfo { kind: source_kind.into(), root: config.source.to_string_lossy().into_owned() },
        options: config.recorded_options(),
        tool: crate::TOOL.into(),
        shards: Vec::new(),
    };
    bar.set_message("syncing to disk");
    let finished = sink.finish(&meta)?;
    bar.finish_and_clear();
    report.output = finished.path;
    report.bytes_out = finished.bytes;
    report.warnings.extend(finished.warnings);
    report.set_elapsed(started.elapsed().as_secs_f64());
    Ok(report)
}

/// Reads and checks one sample; the error is the reason it is skipped. When unpacking to a
/// tree, a sample whose recorded path would land outside the tree is refused here.
fn load(source: &dyn Source, sample: &SourceSample, unpacking: bool) -> Result<Image, String> {
    if unpacking {
        safe_relative(&sample.rel_path)?;
    }
    let bytes = source.load(sample).map_err(|e| {
        let dangling = sample.path.symlink_metadata().is_ok_and(|m| m.file_type().is_symlink())
            && e.kind() == std::io::ErrorKind::NotFound;
        if dangling {
            "cannot read: dangling symlink (its target does not exist)".to_string()
        } else {
            format!("cannot read: {e}")
        }
    })?;
    transcode::passthrough(bytes)
}

/// Builds the stored fields of one sample, sorted by extension.
fn packed_sample(key: String, sample: &SourceSample, classes: &[String], image: Image) -> PackedSample {
    let (path, path_hex) = match std::str::from_utf8(&sample.rel_path) {
        Ok(s) => (s.to_string(), None),
        Err(_) => (
            String::from_utf8_lossy(&sample.rel_path).into_owned(),
            Some(sample.rel_path.iter().map(|b| format!("{b:02x}")).collect()),
        ),
    };
    let info = SampleInfo { path, class: classes[sample.class as usize].clone(), path_hex };
    let mut fields = vec![
        (CLS_FIELD.to_string(), sample.class.to_string().into_bytes()),
        (image.format.extension().to_string(), image.bytes),
        (JSON_FIELD.to_string(), serde_json::to_vec(&info).expect("sample info serialises")),
    ];
    fields.sort_by(|a, b| a.0.cmp(&b.0));
    PackedSample { key, fields }
}

/// Cuts the sample list into index ranges of at most [`CHUNK_SAMPLES`] samples and about
/// [`CHUNK_BYTES`] bytes (a single larger sample gets a chunk of its own).
fn chunk(samples: &[SourceSample]) -> Vec<std::ops::Range<usize>> {
    let mut chunks = Vec::new();
    let (mut start, mut bytes) = (0, 0u64);
    for (i, s) in samples.iter().enumerate() {
        if i > start && (i - start >= CHUNK_SAMPLES || bytes + s.size > CHUNK_BYTES) {
            chunks.push(start..i);
            start = i;
            bytes = 0;
        }
        bytes += s.size;
    }
    if start < samples.len() {
        chunks.push(start..samples.len());
    }
    chunks
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn sample(size: u64) -> SourceSample {
        SourceSample { index: 0, path: PathBuf::new(), rel_path: vec![], class: 0, size }
    }

    #[test]
    fn chunks_are_bounded_by_count_and_bytes() {
        let many: Vec<_> = (0..2500).map(|_| sample(10)).collect();
        assert_eq!(chunk(&many), vec![0..1024, 1024..2048, 2048..2500]);
        let big = vec![sample(20 << 20), sample(20 << 20), sample(40 << 20), sample(1)];
        assert_eq!(chunk(&big), vec![0..1, 1..2, 2..3, 3..4]);
        assert!(chunk(&[]).is_empty());
    }
}
