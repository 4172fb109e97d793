//! One entry point for every output format: [`open`] looks at a path and opens what is there.

use std::path::Path;

use crate::lmdb::LmdbDataset;
use crate::{Error, Meta, Result, Sample};

/// A dataset in any format `pack` writes.
#[derive(Debug)]
#[non_exhaustive]
pub enum Dataset {
    /// An LMDB environment directory.
    Lmdb(LmdbDataset),
}

/// Opens the dataset at `path`, detecting its format.
pub fn open(path: impl AsRef<Path>) -> Result<Dataset> {
    let path = path.as_ref();
    if path.join("data.mdb").is_file() {
        return LmdbDataset::open(path).map(Dataset::Lmdb);
    }
    let reason = if path.exists() {
        "no data.mdb inside; expected a directory written by `pack --to lmdb -o`"
    } else {
        "no such file or directory"
    };
    Err(Error::NotADataset { path: path.to_path_buf(), reason: reason.into() })
}

impl Dataset {
    /// The dataset metadata.
    pub fn meta(&self) -> &Meta {
        match self {
            Dataset::Lmdb(d) => d.meta(),
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

    /// Sample `index`, owning its bytes.
    pub fn get(&self, index: u64) -> Result<Sample<'static>> {
        match self {
            Dataset::Lmdb(d) => d.get(index),
        }
    }

    /// Every sample in index order.
    pub fn iter(&self) -> Result<Box<dyn Iterator<Item = Result<Sample<'static>>> + '_>> {
        match self {
            Dataset::Lmdb(d) => Ok(Box::new(d.iter()?)),
        }
    }
}
