//! The validated plan for a run: command-line options become a [`PackConfig`] before any work
//! starts, so a contradiction is reported in the first millisecond, not an hour into a job.

use std::num::NonZeroUsize;
use std::path::PathBuf;

use crate::pack::recorded::Options;
use crate::sink::webdataset::ShardLimits;
use crate::transcode::{Mode, Transcoder};
use crate::{Error, Result};

/// The image extensions torchvision's `ImageFolder` accepts, which are ours by default.
pub const DEFAULT_EXTENSIONS: [&str; 9] = ["jpg", "jpeg", "png", "ppm", "bmp", "pgm", "tif", "tiff", "webp"];

/// What to do with a file that cannot be packed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnError {
    /// Skip it, list it in the summary and exit with code 3 at the end.
    #[default]
    Skip,
    /// Stop the run at the first such file; nothing is published.
    Fail,
}

/// The output formats.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OutputFormat {
    /// An LMDB environment directory.
    Lmdb,
    /// A directory of tar shards with their indexes.
    WebDataset {
        /// Shard file name prefix (`{prefix}-000000.tar`).
        prefix: String,
        /// When to start a new shard.
        limits: ShardLimits,
        /// Give every shard an MD5 too (`--md5`), for tools that want `md5sum` in
        /// `shardindex.json`; every shard has a CRC-32 anyway.
        md5: bool,
    },
    /// An ImageFolder tree, each sample back at its source path.
    ImageFolder,
}

impl OutputFormat {
    /// The name used on the command line (`--to`).
    pub fn name(&self) -> &'static str {
        match self {
            OutputFormat::Lmdb => "lmdb",
            OutputFormat::WebDataset { .. } => "webdataset",
            OutputFormat::ImageFolder => "imagefolder",
        }
    }
}

/// What the source is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SourceKind {
    /// Decide from what is at the path: a dataset written by `pack`, else an ImageFolder tree.
    #[default]
    Detect,
    /// An ImageFolder tree, whatever it contains.
    ImageFolder,
}

/// The default shard prefix.
pub const DEFAULT_PREFIX: &str = "shard";

/// Everything a `pack` run needs, checked.
#[derive(Debug, Clone)]
pub struct PackConfig {
    /// The source: an ImageFolder root, or a dataset written by `pack`.
    pub source: PathBuf,
    /// How to read the source.
    pub source_kind: SourceKind,
    /// The output path.
    pub output: PathBuf,
    /// The output format.
    pub format: OutputFormat,
    /// Worker threads for checking and transcoding images: CPU work, one per core by default.
    pub threads: NonZeroUsize,
    /// The most files read at once, ahead of the workers (`--io-threads`): reads wait on storage,
    /// not on the CPU, so there may be more of them than cores ([`default_io_threads`]). The
    /// readahead runs as many as keep the workers fed ([`crate::pack::readahead`]).
    pub io_threads: NonZeroUsize,
    /// `Some(seed)` to permute the samples deterministically.
    pub shuffle: Option<u64>,
    /// Accepted file extensions, lower case, without the dot.
    pub extensions: Vec<String>,
    /// What to do with files that cannot be packed.
    pub on_error: OnError,
    /// Replace an existing output.
    pub overwrite: bool,
    /// Continue the interrupted run that left its checkpoints next to the output.
    pub resume: bool,
    /// LMDB: values written between two checkpoints.
    pub checkpoint_bytes: u64,
    /// What happens to each image (`--mode` and its settings).
    pub transcoder: Transcoder,
    /// Pack only this part of a plan ([`crate::cluster::part`]) into `output/part-KKKK-of-NNNN`.
    pub part: Option<crate::cluster::split::Part>,
    /// The object store endpoint for an `s3://` source or output (`--endpoint`, else `AWS_ENDPOINT_URL_S3`
    /// or `AWS_ENDPOINT_URL`; none: AWS itself). See [`crate::store::settings`].
    pub endpoint: Option<String>,
}

impl PackConfig {
    /// A configuration with the defaults: all cores, no shuffle, torchvision's extensions.
    pub fn new(source: impl Into<PathBuf>, output: impl Into<PathBuf>, format: OutputFormat) -> PackConfig {
        PackConfig {
            source: source.into(),
            source_kind: SourceKind::Detect,
            output: output.into(),
            format,
            threads: all_cores(),
            io_threads: default_io_threads(),
            shuffle: None,
            extensions: DEFAULT_EXTENSIONS.iter().map(|e| e.to_string()).collect(),
            on_error: OnError::Skip,
            overwrite: false,
            resume: false,
            checkpoint_bytes: crate::sink::lmdb::CHECKPOINT_BYTES,
            transcoder: Transcoder::default(),
            part: None,
            endpoint: None,
        }
    }

    /// The store location of an `s3://` source (a WebDataset `pack` stored there), or `None`
    /// for a local one.
    pub fn store_source(&self) -> Result<Option<crate::store::StoreUrl>> {
        Ok(crate::store::StoreUrl::of_path(&self.source)?)
    }

    /// The store location of an `s3://` output, or `None` for a local one.
    pub fn store_output(&self) -> Result<Option<crate::store::StoreUrl>> {
        Ok(crate::store::StoreUrl::of_path(&self.output)?)
    }

    /// Parses a `--extensions` list: comma-separated, with or without dots, any case.
    pub fn parse_extensions(list: &str) -> Result<Vec<String>> {
        let exts: Vec<String> = list
            .split(',')
            .map(|e| e.trim().trim_start_matches('.').to_lowercase())
            .filter(|e| !e.is_empty())
            .collect();
        if exts.is_empty() {
            return Err(Error::Usage(format!(
                "--extensions {list:?} names no extension; pass e.g. --extensions jpg,jpeg,png"
            )));
        }
        Ok(exts)
    }

    /// Checks the plan: sources and outputs that cannot work are refused here.
    pub fn validate(&self) -> Result<()> {
        if let OutputFormat::WebDataset { prefix, limits, .. } = &self.format {
            if prefix.is_empty() || prefix.contains('/') || prefix.starts_with('.') || prefix.len() > 64 {
                return Err(Error::Usage(format!(
                    "--prefix {prefix:?}: use a plain file name prefix such as `shard` or `train` (no '/', not starting with '.', at most 64 bytes)"
                )));
            }
            if limits.max_bytes < 4096 {
                return Err(Error::Usage(format!(
                    "--shard-size {} bytes is too small to hold a sample; use e.g. --shard-size 1GB",
                    limits.max_bytes
                )));
            }
            if limits.max_samples == Some(0) {
                return Err(Error::Usage("--shard-samples must be at least 1".into()));
            }
        }
        if self.format == OutputFormat::ImageFolder && self.resume {
            return Err(Error::Usage(
                "--resume continues lmdb and webdataset outputs; an unpacked tree is rewritten from the start".into(),
            ));
        }
        if self.format == OutputFormat::ImageFolder && self.transcoder.mode != Mode::Passthrough {
            return Err(Error::Usage(
                "--to imagefolder writes the stored bytes back as files; drop --mode (it only applies to lmdb and webdataset)".into(),
            ));
        }
        let source_url = self.store_source()?;
        if source_url.is_none() {
            crate::source::imagefolder::check_root(&self.source)?;
        }
        if let Some(url) = self.store_output()? {
            if let Some(source) = &source_url {
                let inside = url.bucket == source.bucket
                    && (source.prefix.is_empty()
                        || url.prefix == source.prefix
                        || url.prefix.starts_with(&format!("{}/", source.prefix)));
                if inside {
                    return Err(Error::Usage(format!(
                        "-o {url} is inside the source {source}; write the output under another prefix"
                    )));
                }
            }
            return self.check_store_output(&url);
        }
        let (src, out) = (self.source.canonicalize().ok(), absolute(&self.output));
        if let (Some(src), Some(out)) = (src, out) {
            if out.starts_with(&src) {
                return Err(Error::Usage(format!(
                    "-o {} is inside the source tree {}; write the output elsewhere so it is not packed into itself",
                    self.output.display(),
                    self.source.display()
                )));
            }
        }
        Ok(())
    }

    /// Refuses what cannot be written to a store yet, saying what to do instead.
    pub(crate) fn check_store_output(&self, url: &crate::store::StoreUrl) -> Result<()> {
        let not_yet = |what: &str, instead: &str| {
            Err(Error::Usage(format!("-o {url}: {what} is not supported for object storage yet; {instead}")))
        };
        if !matches!(self.format, OutputFormat::WebDataset { .. }) {
            let to = self.format.name();
            return not_yet(
                &format!("--to {to}"),
                &format!("pack to a local directory and upload it (e.g. `aws s3 cp --recursive OUT {url}`), or pass --to webdataset"),
            );
        }
        Ok(())
    }

    /// The options that shape the output, as recorded in the dataset metadata. Thread counts are
    /// left out on purpose: they do not change a byte of the output.
    pub fn recorded_options(&self) -> Options {
        let webdataset = match &self.format {
            OutputFormat::WebDataset { prefix, limits, md5 } => {
                Some((prefix.clone(), limits.max_bytes, limits.max_samples, *md5))
            }
            _ => None,
        };
        Options {
            to: self.format.name().into(),
            shuffle: self.shuffle.is_some(),
            seed: self.shuffle,
            extensions: self.extensions.clone(),
            on_error: match self.on_error {
                OnError::Skip => "skip",
                OnError::Fail => "fail",
            }
            .into(),
            transcode: self.transcoder.recorded(),
            prefix: webdataset.as_ref().map(|w| w.0.clone()),
            shard_size: webdataset.as_ref().map(|w| w.1),
            shard_samples: webdataset.as_ref().map(|w| w.2),
            md5: webdataset.as_ref().and_then(|w| w.3.then_some(true)),
        }
    }
}

/// The absolute form of a path that may not exist yet (its parent is canonicalised).
fn absolute(path: &std::path::Path) -> Option<PathBuf> {
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.canonicalize().ok()?,
        _ => std::env::current_dir().ok()?,
    };
    Some(parent.join(path.file_name()?))
}

/// One worker thread per core this process may use: the default of every `--threads`.
pub fn all_cores() -> NonZeroUsize {
    std::thread::available_parallelism().unwrap_or(NonZeroUsize::MIN)
}

/// The default `--io-threads`: up to 32 reads in flight, or 4 per core on a machine with more than 8.
/// A read that waits on NFS, Lustre or a disk costs a sleeping thread, not a core; benches/
/// slow_source.py measured the choice (README, "Packing from slow storage").
pub fn default_io_threads() -> NonZeroUsize {
    all_cores()
        .saturating_mul(NonZeroUsize::new(4).expect("4 > 0"))
        .max(NonZeroUsize::new(32).expect("32 > 0"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extensions_are_normalised() {
        assert_eq!(PackConfig::parse_extensions(".JPG, png,,Tiff").unwrap(), ["jpg", "png", "tiff"]);
        assert!(PackConfig::parse_extensions(" , ").is_err());
    }

    #[test]
    fn output_inside_source_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = PackConfig::new(dir.path(), dir.path().join("out.lmdb"), OutputFormat::Lmdb);
        let err = cfg.validate().unwrap_err().to_string();
        assert!(err.contains("inside the source tree"), "{err}");
    }

    #[test]
    fn missing_source_names_the_path() {
        let cfg = PackConfig::new("/no/such/dir", "/tmp/x", OutputFormat::Lmdb);
        let err = cfg.validate().unwrap_err().to_string();
        assert!(err.starts_with("/no/such/dir: does not exist"), "{err}");
    }
}
