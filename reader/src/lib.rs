//! Read datasets written by imgpack's `pack`.
//!
//! `pack` turns an ImageFolder tree into a few large files that a training job reads by offset
//! instead of opening hundreds of thousands of small files. This crate owns that on-disk format
//! — key naming, metadata records, image format names — and reads it back: random access by
//! sample index and in-order iteration. The writer (`imgpack`) imports the format from here, so
//! the two can never disagree. `FORMAT.md` at the repository root says the same for Python users.
//!
//! It depends on no image codec, thread pool or CLI crate: a data loader can use it alone.
//!
//! With the `s3` feature, [`open`] also takes an `s3://bucket/prefix/` holding a WebDataset
//! (`webdataset::RemoteWebDataset`: one ranged GET per sample, one streamed GET per shard when
//! iterating), and `store` is the object-store client `pack` writes with too. The feature is
//! off by default, so a reader of local files pulls in no HTTP client or async runtime.
//!
//! # Example
//!
//! ```
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let dir = tempfile::tempdir()?;
//! # let path = dir.path().join("train.lmdb");
//! # imgpack_reader::lmdb::write_example(&path)?;
//! let dataset = imgpack_reader::open(&path)?;
//! assert_eq!(dataset.len(), 2);
//! assert_eq!(dataset.classes(), ["cat", "dog"]);
//!
//! let sample = dataset.get(1)?;
//! let (format, bytes) = sample.image().expect("every sample has an image");
//! assert_eq!(format.extension(), "png");
//! assert_eq!(sample.label()?, 1);
//! assert_eq!(sample.info()?.path, "dog/rex.png");
//! # let _ = bytes;
//! # Ok(()) }
//! ```
#![deny(missing_docs)]

pub mod checksum;
mod dataset;
mod error;
pub mod format;
#[cfg(test)]
mod hostile;
pub mod key;
pub mod lmdb;
mod meta;
pub mod part;
mod sample;
pub mod shared;
#[cfg(feature = "s3")]
pub mod store;
mod unfinished;
pub mod webdataset;

#[cfg(feature = "s3")]
pub use dataset::open_with_endpoint;
pub use dataset::{detect, not_a_dataset, open, Dataset, Kind};
pub use error::{Error, Result};
pub use format::ImageFormat;
pub use lmdb::Prefetch;
pub use meta::{Meta, ShardInfo, SourceInfo, FORMAT_VERSION};
pub use sample::{Field, Sample, SampleInfo};
pub use unfinished::{is_unfinished, UNFINISHED_SUFFIX};
