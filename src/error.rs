//! The writer's error type. Every variant carries the path it is about, and every message says
//! what to do next, because the person reading it is in the middle of a long packing job.

use std::path::PathBuf;

/// Result alias for the writer.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that stops a `pack` run.
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
    /// The source is not an ImageFolder tree.
    #[error("{}: {reason}", path.display())]
    BadSource {
        /// The source root.
        path: PathBuf,
        /// What is wrong and what to pass instead.
        reason: String,
    },
    /// The output exists and `--overwrite` was not given.
    #[error("{}: already exists; pass --overwrite to replace it, or choose another -o", path.display())]
    OutputExists {
        /// The output path.
        path: PathBuf,
    },
    /// LMDB refused an operation.
    #[error("{}: LMDB error: {source}{hint}", path.display())]
    Lmdb {
        /// The LMDB environment being written.
        path: PathBuf,
        /// The underlying error.
        source: heed::Error,
        /// What to do about it, if we know (starts with "; ").
        hint: String,
    },
    /// A sample could not be packed and `--on-error fail` was given.
    #[error("{}: {reason}; fix or remove the file, or drop `--on-error fail` to skip such files and list them in the summary", path.display())]
    BadSample {
        /// The source file.
        path: PathBuf,
        /// Why it could not be packed.
        reason: String,
    },
    /// Options that contradict each other or are out of range.
    #[error("{0}")]
    Usage(String),
    /// Reading a dataset back failed.
    #[error(transparent)]
    Reader(#[from] imgpack_reader::Error),
}

impl Error {
    pub(crate) fn io(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> Error {
        let path = path.into();
        move |source| Error::Io { path, source }
    }
}
