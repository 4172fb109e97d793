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
    /// A store location or setting that cannot be used as written.
    #[error("{location}: {reason}")]
    BadLocation {
        /// What was written: an `s3://` location, or the `--endpoint` setting.
        location: String,
        /// What is wrong with it, and how to write it.
        reason: String,
    },
    /// The bucket of a store location does not exist at the endpoint.
    #[error("{url}: there is no bucket {bucket:?} at {endpoint}; create it first (e.g. `aws s3 mb s3://{bucket}` with --endpoint-url {endpoint} for a local store), or correct the bucket's name")]
    NoSuchBucket {
        /// The object the failed request was about (`s3://bucket/key`).
        url: String,
        /// The bucket.
        bucket: String,
        /// The endpoint asked.
        endpoint: String,
    },
    /// The store refused the request: credentials unknown or wrong, or not allowed to.
    #[error("s3://{bucket}/{key}: the store at {endpoint} denied access to bucket {bucket:?}, key {key:?} ({code}); check the credentials (AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, with AWS_SESSION_TOKEN for temporary ones) and that they may {operation} in that bucket")]
    StoreDenied {
        /// The bucket.
        bucket: String,
        /// The key.
        key: String,
        /// The endpoint asked.
        endpoint: String,
        /// What was being done (`upload`, `list`, `read`, ...).
        operation: &'static str,
        /// What the store said (its error code, e.g. `InvalidAccessKeyId`).
        code: String,
    },
    /// The store's endpoint does not answer.
    #[error("s3://{bucket}/{key}: cannot connect to the store at {endpoint} (bucket {bucket:?}, key {key:?}): {reason}; check --endpoint or AWS_ENDPOINT_URL, and that the store is running")]
    StoreUnreachable {
        /// The bucket.
        bucket: String,
        /// The key.
        key: String,
        /// The endpoint asked.
        endpoint: String,
        /// What the connection attempt said.
        reason: String,
    },
    /// The multipart upload of an object was aborted while a run wrote it, and not by that
    /// run; its bucket still exists (else [`Error::NoSuchBucket`]).
    #[error("{url}: the store at {endpoint} no longer has this run's unfinished upload (NoSuchUpload): something else aborted it, such as another run writing to the same prefix, or a cleanup script or lifecycle rule that aborts incomplete uploads; nothing was published: make sure only one run writes to this prefix, then run the command again")]
    StoreUploadAborted {
        /// The object being uploaded (`s3://bucket/key`).
        url: String,
        /// The endpoint asked.
        endpoint: String,
    },
    /// Any other store failure, once transient errors (timeouts, 5xx, dropped connections)
    /// were retried with backoff.
    #[error("{url}: {operation} failed at {endpoint}, after retrying: {reason}; run the command again once the store is back")]
    Store {
        /// The object the failed request was about (`s3://bucket/key`).
        url: String,
        /// What was being done (`upload`, `list`, `read`, ...).
        operation: &'static str,
        /// The endpoint asked.
        endpoint: String,
        /// What the store or the connection said.
        reason: String,
    },
}
