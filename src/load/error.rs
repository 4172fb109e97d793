//! The loader's error: what stopped a batch, naming the dataset and the sample.
//!
//! A training log shows one line of it, maybe hours into a run, so it says which dataset and
//! which sample key, and why, without needing the traceback.

use std::path::PathBuf;

/// Everything that can stop a batch.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LoadError {
    /// Reading a sample failed: a damaged or missing record, a checksum mismatch, an I/O or
    /// LMDB error. The reader's error names the dataset and the sample.
    #[error(transparent)]
    Read(#[from] imgpack_reader::Error),
    /// A sample was read but does not decode to an image.
    #[error("{}: sample {key} cannot be decoded: {reason}; `pack verify --decode` lists every such sample", path.display())]
    Decode {
        /// The dataset.
        path: PathBuf,
        /// The sample key.
        key: String,
        /// Why it does not decode.
        reason: String,
    },
    /// The loader was asked for something it cannot do (a batch size of 0, a rank outside the
    /// world, a crop that makes no region); the fix is other options.
    #[error("{}: {reason}", path.display())]
    Options {
        /// The dataset the loader was made for.
        path: PathBuf,
        /// Which option is wrong and what it must be.
        reason: String,
    },
    /// The decode threads or the loader's background thread could not be started.
    #[error("cannot start {threads} loader threads: {reason}; ask for fewer threads")]
    Threads {
        /// How many were asked for.
        threads: usize,
        /// What the system said.
        reason: String,
    },
    /// The loader's background thread panicked: a bug in imgpack, reported instead of ending
    /// the epoch early without a word.
    #[error("{}: the loader's background thread stopped on an internal error (a bug in imgpack); please report it", path.display())]
    Panicked {
        /// The dataset being loaded.
        path: PathBuf,
    },
}
