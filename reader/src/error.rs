//! The one error type of the reader. Every variant names the dataset path, so a message read in
//! a training log says which dataset is at fault and what to do about it.

use std::path::PathBuf;

/// Result alias for this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong when opening or reading a dataset.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The file system refused an operation.
    #[error("{}: {source}", path.display())]
    Io {
        /// The file or directory involved.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// LMDB refused an operation.
    #[error("{}: LMDB error: {source}", path.display())]
    Lmdb {
        /// The LMDB environment directory.
        path: PathBuf,
        /// The underlying error.
        source: heed::Error,
    },
    /// The path exists but does not hold a complete imgpack dataset.
    #[error("{}: not a complete imgpack dataset: {reason}", path.display())]
    NotADataset {
        /// The path that was opened.
        path: PathBuf,
        /// What is missing or wrong, and what to do about it.
        reason: String,
    },
    /// The dataset metadata could not be parsed.
    #[error("{}: dataset metadata is invalid ({source}); re-run `pack` to rebuild the dataset", path.display())]
    BadMeta {
        /// The dataset path.
        path: PathBuf,
        /// The JSON error.
        source: serde_json::Error,
    },
    /// A sample index past the end of the dataset.
    #[error("{}: sample {index} is out of range: the dataset holds {len} samples", path.display())]
    OutOfRange {
        /// The dataset path.
        path: PathBuf,
        /// The requested index.
        index: u64,
        /// The number of samples.
        len: u64,
    },
    /// A sample the metadata promises is not stored, or one of its fields is malformed.
    #[error("{}: sample {key} is damaged: {reason}; re-run `pack` to rebuild the dataset", path.display())]
    BadSample {
        /// The dataset path.
        path: PathBuf,
        /// The sample key.
        key: String,
        /// What is wrong.
        reason: String,
    },
    /// A sample's bytes do not have the checksum the dataset recorded for them.
    #[error(
        "{}: sample {key} is damaged: its bytes have CRC-32 {actual:08x}, the dataset recorded {expected:08x}; restore the dataset from a good copy or re-run `pack`",
        path.display()
    )]
    Checksum {
        /// The dataset path.
        path: PathBuf,
        /// The sample key.
        key: String,
        /// The recorded CRC-32.
        expected: u32,
        /// The CRC-32 of the bytes read.
        actual: u32,
    },
    /// Checksums were asked for, but the dataset was written without them.
    #[error("{}: the dataset carries no checksums (it was written before format version 2); re-run `pack` to add them", path.display())]
    NoChecksums {
        /// The dataset path.
        path: PathBuf,
    },
}
