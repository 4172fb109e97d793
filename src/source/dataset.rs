//! A dataset written by `pack` (LMDB or WebDataset) as a source, for conversions between
//! formats. The reader crate does the reading; this module only maps its samples onto the
//! pipeline's terms. Listing looks at every sample's small fields (`cls`, `json`) without
//! copying any image bytes.

use std::path::{Path, PathBuf};

use imgpack_reader::{Dataset, Kind};

use super::{Listing, Source, SourceSample};
use crate::Result;

/// An LMDB or WebDataset output of `pack`, read back.
#[derive(Debug)]
pub struct PackedDataset {
    dataset: Dataset,
}

impl PackedDataset {
    /// Opens the dataset at `path`.
    pub fn open(path: &Path) -> Result<PackedDataset> {
        Ok(PackedDataset { dataset: imgpack_reader::open(path)? })
    }

    /// `imgpack-lmdb` or `imgpack-webdataset`.
    pub fn kind(&self) -> &'static str {
        match imgpack_reader::detect(self.dataset.path()) {
            Some(Kind::Lmdb) => imgpack_reader::lmdb::FORMAT_NAME,
            _ => imgpack_reader::webdataset::FORMAT_NAME,
        }
    }
}

impl Source for PackedDataset {
    fn list(&self) -> Result<Listing> {
        let classes = self.dataset.classes().to_vec();
        let mut samples = Vec::with_capacity(self.dataset.len() as usize);
        let mut used = vec![false; classes.len()];
        self.dataset.scan(|sample| {
            let info = sample.info()?;
            let class = sample.label()?;
            let rel_path = info.path_bytes().map_err(|reason| imgpack_reader::Error::BadSample {
                path: self.dataset.path().to_path_buf(),
                key: sample.key.clone(),
                reason,
            })?;
            if let Some(u) = used.get_mut(class as usize) {
                *u = true;
            }
            let size = sample.payload().map_or(0, |(_, bytes)| bytes.len() as u64);
            let path: PathBuf = self.dataset.path().join(&sample.key);
            samples.push(SourceSample { index: sample.index, path, rel_path, class, size });
            Ok(())
        })?;
        let empty_classes = classes.iter().zip(&used).filter(|(_, u)| !**u).map(|(c, _)| c.clone()).collect();
        Ok(Listing { classes, samples, empty_classes, warnings: Vec::new() })
    }

    fn load(&self, sample: &SourceSample) -> std::io::Result<Vec<u8>> {
        let stored = self.dataset.get(sample.index).map_err(std::io::Error::other)?;
        match stored.payload() {
            Some((_, bytes)) => Ok(bytes.to_vec()),
            None => Err(std::io::Error::other("the sample holds neither an image nor a pixels (npy) field")),
        }
    }
}

/// Whether `path` holds a dataset written by `pack`.
pub fn is_packed(path: &Path) -> bool {
    imgpack_reader::detect(path).is_some()
}
