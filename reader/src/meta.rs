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
    /// WebDataset outputs only: the shards in order, with the samples each holds.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shards: Vec<ShardInfo>,
}

/// One shard of a WebDataset output, as listed in its metadata.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardInfo {
    /// The shard's file name, relative to the dataset directory, e.g. `shard-000000.tar`.
    pub name: String,
    /// The index of its first sample.
    pub first: u64,
    /// How many samples it holds (samples `first .. first + samples`).
    pub samples: u64,
    /// Its size in bytes.
    pub bytes: u64,
    /// The MD5 of the whole file, lower-case hex (as `wids` records it).
    pub md5: String,
}

/// Where a dataset's samples came from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SourceInfo {
    /// The kind of source: `imagefolder`.
    pub kind: String,
    /// The source root as given on the command line.
    pub root: String,
}
