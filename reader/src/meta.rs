//! Dataset metadata: the one record that says what a dataset holds.
//!
//! It is stored as JSON (under the LMDB key `__meta__`), written last, after every sample, so a
//! dataset without it is incomplete by definition. It holds no timestamps or host names: the
//! same input and options give byte-identical metadata.

use serde::{Deserialize, Serialize};

/// The format version this crate writes and reads. A change that old readers cannot read bumps it.
pub const FORMAT_VERSION: u32 = 1;

/// What a dataset holds and how it was made.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Meta {
    /// The format name: `imgpack-lmdb`.
    pub format: String,
    /// The format version, [`FORMAT_VERSION`] when written by this crate's writer.
    pub version: u32,
    /// How many samples the dataset holds; keys run from 0 to `samples - 1` with no gap.
    pub samples: u64,
    /// The number of digits in every sample key.
    pub key_width: usize,
    /// Class names in class-index order (`cls` field value `i` is `classes[i]`).
    pub classes: Vec<String>,
    /// Every field extension present in the dataset, sorted.
    pub fields: Vec<String>,
    /// Where the samples came from.
    pub source: SourceInfo,
    /// The options that shaped the output (mode, shuffle, seed, extensions, ...), as given.
    pub options: serde_json::Value,
    /// The tool and version that wrote the dataset, e.g. `imgpack 0.1.0`.
    pub tool: String,
}

/// Where a dataset's samples came from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SourceInfo {
    /// The kind of source: `imagefolder`.
    pub kind: String,
    /// The source root as given on the command line.
    pub root: String,
}
