//! One entry point for every output format: [`open`] looks at a path and opens what is there.

use std::path::Path;

use crate::lmdb::LmdbDataset;
use crate::webdataset::{WebDataset, META_FILE};
use crate::{Error, Meta, Result, Sample};

/// A dataset in any format `pack` writes.
#[derive(Debug)]
#[non_exhaustive]
pub enum Dataset {
    /// An LMDB environment directory.
    Lmdb(LmdbDataset),
    /// A directory of WebDataset tar shards.
    WebDataset(WebDataset),
    /// WebDataset tar shards under an `s3://bucket/prefix/` (feature `s3`).
    #[cfg(feature = "s3")]
    Remote(crate::webdataset::RemoteWebDataset),
}

/// What kind of dataset, if any, is at a path, judged from the files present.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A directory holding `data.mdb`.
    Lmdb,
    /// A directory holding `imgpack.json`.
    WebDataset,
}

/// Tells which format the dataset at `path` is in, without opening it.
pub fn detect(path: &Path) -> Option<Kind> {
    if path.join("data.mdb").is_file() {
        Some(Kind::Lmdb)
    } else if path.join(META_FILE).is_file() {
        Some(Kind::WebDataset)
    } else {
        None
    }
}

/// Opens the dataset at `path`, detecting its format. With the `s3` feature, `path` may be an
/// `s3://bucket/prefix/` holding a WebDataset, reached at the endpoint `AWS_ENDPOINT_URL_S3`
/// or `AWS_ENDPOINT_URL` names (else AWS); [`crate::webdataset::RemoteWebDataset::open`] takes
/// the endpoint as an argument.
pub fn open(path: impl AsRef<Path>) -> Result<Dataset> {
    #[cfg(feature = "s3")]
    return open_with_endpoint(path, None);
    #[cfg(not(feature = "s3"))]
    open_local(path.as_ref())
}

/// Opens the dataset at `path` as [`open`] does; an `s3://` one at `endpoint` when given
/// (else the endpoint the environment names, as for [`open`]).
#[cfg(feature = "s3")]
pub fn open_with_endpoint(path: impl AsRef<Path>, endpoint: Option<&str>) -> Result<Dataset> {
    let path = path.as_ref();
    match path.to_str().filter(|p| crate::store::is_store_url(p)) {
        Some(url) => crate::webdataset::RemoteWebDataset::open(url, endpoint).map(Dataset::Remote),
        None => open_local(path),
    }
}

fn open_local(path: &Path) -> Result<Dataset> {
    match detect(path) {
        Some(Kind::Lmdb) => LmdbDataset::open(path).map(Dataset::Lmdb),
        Some(Kind::WebDataset) => WebDataset::open(path).map(Dataset::WebDataset),
        None => Err(not_a_dataset(path)),
    }
}

/// Why `path`, where [`detect`] finds no dataset, is none: it does not exist, it holds parts
/// not merged yet, or something else. Every command that opens a dataset says it this one way.
pub fn not_a_dataset(path: &Path) -> Error {
    let store = path.to_str().is_some_and(|p| p.get(..5).is_some_and(|s| s.eq_ignore_ascii_case("s3://")));
    let reason = if store {
        "is an object-store location, and this build of imgpack-reader cannot read one: enable its `s3` feature"
    } else if crate::part::holds_parts(path) {
        "holds parts of a dataset packed with `pack PLAN --part K/N` that are not merged yet; run `pack merge` on it when every part is done"
    } else if path.exists() {
        "neither data.mdb (LMDB) nor imgpack.json (WebDataset) inside; pass a directory written by `pack -o`"
    } else {
        "does not exist; check the path"
    };
    Error::NotADataset { path: path.to_path_buf(), reason: reason.into() }
}

impl Dataset {
    /// Makes every read check the sample's CRC-32 ([`crate::checksum`]) and fail with
    /// [`Error::Checksum`] on a mismatch; see [`LmdbDataset::verify_checksums`] and
    /// [`WebDataset::verify_checksums`].
    pub fn verify_checksums(self, on: bool) -> Result<Dataset> {
        Ok(match self {
            Dataset::Lmdb(d) => Dataset::Lmdb(d.verify_checksums(on)?),
            Dataset::WebDataset(d) => Dataset::WebDataset(d.verify_checksums(on)?),
            #[cfg(feature = "s3")]
            Dataset::Remote(d) => Dataset::Remote(d.verify_checksums(on)?),
        })
    }

    /// The dataset metadata.
    pub fn meta(&self) -> &Meta {
        match self {
            Dataset::Lmdb(d) => d.meta(),
            Dataset::WebDataset(d) => d.meta(),
            #[cfg(feature = "s3")]
            Dataset::Remote(d) => d.meta(),
        }
    }

    /// The dataset path.
    pub fn path(&self) -> &Path {
        match self {
            Dataset::Lmdb(d) => d.path(),
            Dataset::WebDataset(d) => d.path(),
            #[cfg(feature = "s3")]
            Dataset::Remote(d) => d.path(),
        }
    }

    /// The number of samples.
    pub fn len(&self) -> u64 {
        self.meta().samples
    }

    /// Whether the dataset holds no sample.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Class names in class-index order.
    pub fn classes(&self) -> &[String] {
        &self.meta().classes
    }

    /// Sample `index`. From a WebDataset its bytes point into the shard's memory map; from
    /// LMDB they are copied out of the map (use [`LmdbDataset::snapshot`] to avoid that); from
    /// an object store they are one ranged GET.
    pub fn get(&self, index: u64) -> Result<Sample<'_>> {
        match self {
            Dataset::Lmdb(d) => d.get(index),
            Dataset::WebDataset(d) => d.get(index),
            #[cfg(feature = "s3")]
            Dataset::Remote(d) => d.get(index),
        }
    }

    /// Every sample in index order.
    pub fn iter(&self) -> Result<Box<dyn Iterator<Item = Result<Sample<'_>>> + '_>> {
        match self {
            // The map only shortens the item lifetime from 'static to '_, which a trait
            // object's item type cannot do by itself.
            #[allow(clippy::map_identity)]
            Dataset::Lmdb(d) => Ok(Box::new(d.iter()?.map(|sample| -> Result<Sample<'_>> { sample }))),
            Dataset::WebDataset(d) => Ok(Box::new(d.iter())),
            #[cfg(feature = "s3")]
            #[allow(clippy::map_identity)]
            Dataset::Remote(d) => Ok(Box::new(d.iter().map(|sample| -> Result<Sample<'_>> { sample }))),
        }
    }

    /// Calls `visit` with every sample in order, without copying any bytes: a cheap way to
    /// look at every sample's small fields.
    pub fn scan(&self, visit: impl FnMut(&Sample<'_>) -> Result<()>) -> Result<()> {
        self.scan_range(0..self.len(), visit)
    }

    /// Like [`Dataset::scan`], for the samples in `range` only (clamped to the dataset), so a
    /// caller can stop early or work in chunks.
    pub fn scan_range(
        &self,
        range: std::ops::Range<u64>,
        mut visit: impl FnMut(&Sample<'_>) -> Result<()>,
    ) -> Result<()> {
        let range = range.start.min(self.len())..range.end.min(self.len());
        match self {
            Dataset::Lmdb(d) => {
                let snapshot = d.snapshot()?;
                range.into_iter().try_for_each(|i| visit(&snapshot.get(i)?))
            }
            Dataset::WebDataset(d) => range.into_iter().try_for_each(|i| visit(&d.get(i)?)),
            // One streamed GET per shard, not one request per sample.
            #[cfg(feature = "s3")]
            Dataset::Remote(d) => d.iter_range(range).try_for_each(|sample| visit(&sample?)),
        }
    }
}
