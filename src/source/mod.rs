//! Inputs: where samples come from.
//!
//! A source lists its samples once, in their final order, and loads each one's bytes on demand
//! from any thread. Listing is separate from loading so the pipeline knows the total before it
//! starts (for progress and map sizing) and can load in parallel while writing in order.

pub mod dataset;
pub mod imagefolder;
pub mod plan;
pub mod remote;
pub mod samples;

pub use samples::Samples;

use std::fs;
use std::path::{Path, PathBuf};

/// One sample as a source lists it, before its bytes are read: a view into the listing's
/// [`Samples`].
///
/// It holds nothing a source can derive: where the file is and how messages name it come from
/// the source ([`Source::name`], [`Source::file`]) and its relative path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SourceSample<'a> {
    /// Its position in the source, before any shuffle.
    pub index: u64,
    /// The path relative to the source root, as raw bytes with `/` separators.
    pub rel_path: &'a [u8],
    /// Index into the source's class list.
    pub class: u32,
    /// Size in bytes if the listing knows it cheaply, else 0 (an ImageFolder listing does not
    /// `stat` files; a packed dataset knows).
    pub size: u64,
}

/// A listed dataset: classes and samples in order, and what the listing noticed.
#[derive(Debug, Clone, Default)]
pub struct Listing {
    /// Class names in class-index order.
    pub classes: Vec<String>,
    /// Samples in order.
    pub samples: Samples,
    /// Classes that hold no sample; they keep their index.
    pub empty_classes: Vec<String>,
    /// Things worth telling the user that did not stop the listing (symlink loops,
    /// unreadable directories).
    pub warnings: Vec<String>,
}

/// An input format.
pub trait Source: Sync {
    /// Lists every sample, in order. A listing that takes a while (walking a tree) may
    /// `advance` `progress` by the samples found so far.
    fn list(&self, progress: &dyn crate::progress::Progress) -> crate::Result<Listing>;

    /// Reads one sample's bytes. The error says whether only this sample is bad (it is
    /// skipped) or the source as a whole failed (the run stops): see [`LoadError`].
    fn load(&self, sample: &SourceSample) -> Result<Vec<u8>, LoadError>;

    /// How messages name a sample: its file under the source root as given (for a packed
    /// dataset, `DATASET/KEY`).
    fn name(&self, sample: &SourceSample) -> PathBuf;

    /// The file a sample is read from: by default its [`Source::name`]. A plan names its
    /// samples under the root as given to `pack plan` and reads them under its absolute root.
    fn file(&self, sample: &SourceSample) -> PathBuf {
        self.name(sample)
    }

    /// The sample's size and modification time, which `--resume` compares to tell whether the
    /// source changed. By default the file it is read from, followed through symlinks.
    fn stamp(&self, sample: &SourceSample) -> Option<Stamp> {
        Stamp::of(&self.file(sample))
    }
}

/// Why a sample could not be loaded.
///
/// The pipeline needs to tell the two apart: a bad file is skipped, named in the report and
/// counted, and the run goes on; a source that failed as a whole (a bucket deleted, credentials
/// refused, a mount that went away) would fail every later sample for the same reason, so it
/// stops the run at once with one error that says what to fix, and `--resume` continues after.
#[derive(Debug)]
pub enum LoadError {
    /// This sample cannot be read; the message is the reason it is skipped.
    Sample(std::io::Error),
    /// The source failed: no sample after this one can be read either.
    Source(crate::Error),
}

impl LoadError {
    /// A store's error, sorted: a missing bucket, refused credentials or an endpoint that does
    /// not answer (after the store client's retries) fail the source; anything else (no such
    /// key, a damaged object) only the sample.
    pub fn from_store(error: imgpack_reader::Error) -> LoadError {
        use imgpack_reader::Error as R;
        match error {
            R::NoSuchBucket { .. } | R::StoreDenied { .. } | R::StoreUnreachable { .. } => {
                LoadError::Source(crate::Error::Reader(error))
            }
            other => LoadError::Sample(std::io::Error::other(other)),
        }
    }

    /// A local file's read error, sorted: `ENOTCONN` is what every file of a FUSE mount (sshfs,
    /// s3fs, gcsfuse, ...) answers once its daemon is gone, so it fails the source, named by the
    /// file that met it; anything else (not found, permission, an I/O error) only the sample.
    /// The two symlink failures get a reason that says so: the system's "No such file or
    /// directory" for a file the listing just found reads as a race, not as a link to nothing.
    pub fn from_file(path: &Path, error: std::io::Error) -> LoadError {
        use std::io::{Error as E, ErrorKind};
        if error.raw_os_error() == Some(libc::ENOTCONN) {
            return LoadError::Source(crate::Error::SourceGone { path: path.to_path_buf(), source: error });
        }
        let is_link = || fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink());
        LoadError::Sample(if error.kind() == ErrorKind::NotFound && is_link() {
            E::new(ErrorKind::NotFound, "dangling symlink (its target does not exist)")
        } else if error.raw_os_error() == Some(libc::ELOOP) {
            E::new(error.kind(), "symlink loop (its links point at each other)")
        } else {
            error
        })
    }
}

impl From<std::io::Error> for LoadError {
    fn from(error: std::io::Error) -> LoadError {
        LoadError::Sample(error)
    }
}

impl std::fmt::Display for LoadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LoadError::Sample(e) => e.fmt(f),
            LoadError::Source(e) => e.fmt(f),
        }
    }
}

/// Reads a local file as [`Source::load`] does.
pub(crate) fn load_file(path: &Path) -> Result<Vec<u8>, LoadError> {
    fs::read(path).map_err(|e| LoadError::from_file(path, e))
}

/// Relative path bytes (`/`-separated, as a listing holds them) as a path.
pub(crate) fn os_path(bytes: &[u8]) -> &Path {
    Path::new(<std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(bytes))
}

/// A file's size and modification time, as `stat` says when the run starts. A file that cannot
/// be `stat`ed has none (`None` where stamps are listed); reading it will say why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stamp {
    /// Size in bytes.
    pub size: u64,
    /// Modification time in nanoseconds since the epoch.
    pub mtime_ns: i64,
}

/// Every listed sample's [`Stamp`], in listing order, 16 bytes each (an `Option<Stamp>` takes
/// 24): a sample that could not be `stat`ed is held as size 0 and time 0, as a plan records it,
/// and read back as `None`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stamps(Vec<Stamp>);

impl Stamps {
    const NONE: Stamp = Stamp { size: 0, mtime_ns: 0 };

    /// The stamp of the sample at `position`; `None` if it could not be `stat`ed.
    ///
    /// # Panics
    ///
    /// If `position` is out of range.
    pub fn get(&self, position: usize) -> Option<Stamp> {
        Some(self.0[position]).filter(|s| *s != Stamps::NONE)
    }

    /// The stamps in order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = Option<Stamp>> + '_ {
        (0..self.0.len()).map(|i| self.get(i))
    }

    /// How many.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether there is none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The sizes summed.
    pub fn total_size(&self) -> u64 {
        self.0.iter().map(|s| s.size).sum()
    }
}

impl FromIterator<Option<Stamp>> for Stamps {
    fn from_iter<I: IntoIterator<Item = Option<Stamp>>>(iter: I) -> Stamps {
        Stamps(iter.into_iter().map(|s| s.unwrap_or(Stamps::NONE)).collect())
    }
}

impl rayon::iter::FromParallelIterator<Option<Stamp>> for Stamps {
    fn from_par_iter<I: rayon::iter::IntoParallelIterator<Item = Option<Stamp>>>(iter: I) -> Stamps {
        use rayon::iter::ParallelIterator;
        Stamps(iter.into_par_iter().map(|s| s.unwrap_or(Stamps::NONE)).collect())
    }
}

impl Stamp {
    /// The stamp of the file at `path`, following symlinks as reading does; `None` when it
    /// cannot be `stat`ed.
    pub fn of(path: &Path) -> Option<Stamp> {
        use std::os::unix::fs::MetadataExt;
        let m = fs::metadata(path).ok()?;
        Some(Stamp { size: m.len(), mtime_ns: m.mtime() * 1_000_000_000 + m.mtime_nsec() })
    }
}
