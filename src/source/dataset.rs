//! A dataset written by `pack` (LMDB or WebDataset) as a source, for conversions between
//! formats. The reader crate does the reading; this module only maps its samples onto the
//! pipeline's terms. Listing looks at every sample's small fields (`cls`, `json`) without
//! copying any image bytes.

use std::path::{Path, PathBuf};

use imgpack_reader::{Dataset, Kind};

use super::{Listing, Samples, Source, SourceSample};
use crate::Result;

/// An LMDB or WebDataset output of `pack`, read back.
///
/// Every sample loaded for conversion is checked against its checksum: otherwise a damaged
/// sample would be re-packed under a fresh checksum of its damaged bytes, and the damage would
/// no longer show. A damaged sample is skipped (or stops the run) with the reason. Listing
/// reads only the small fields and checks nothing, so the dataset is switched to checking
/// reads once it is listed.
#[derive(Debug)]
pub struct PackedDataset {
    dataset: std::sync::RwLock<Option<Dataset>>,
    path: PathBuf,
    /// Its keys' width, to name a sample by its key.
    key_width: usize,
}

impl PackedDataset {
    /// Opens the dataset at `path`: a directory, or an `s3://` prefix at `endpoint` (every
    /// sample then one ranged GET, many in flight from the pipeline's readers).
    pub fn open(path: &Path, endpoint: Option<&str>) -> Result<PackedDataset> {
        Ok(PackedDataset::of(imgpack_reader::open_with_endpoint(path, endpoint)?, path))
    }

    /// The open `dataset`, which messages name by `path`.
    pub fn of(dataset: Dataset, path: &Path) -> PackedDataset {
        let key_width = dataset.meta().key_width;
        PackedDataset { dataset: std::sync::RwLock::new(Some(dataset)), path: path.to_path_buf(), key_width }
    }

    fn with<T>(&self, f: impl FnOnce(&Dataset) -> T) -> T {
        let guard = self.dataset.read().unwrap_or_else(|e| e.into_inner());
        f(guard.as_ref().expect("present except while switching to checked reads"))
    }

    /// Whether the samples hold decoded pixels (`--mode decode`: `npy` or `npy.zst` fields) and
    /// no image file: what an ImageFolder tree cannot hold, since it stores the files as they were.
    pub fn holds_decoded_pixels(&self) -> bool {
        use imgpack_reader::format::{NPY_FIELD, NPY_ZSTD_FIELD};
        self.with(|dataset| {
            let fields = &dataset.meta().fields;
            let pixels = fields.iter().any(|f| f == NPY_FIELD || f == NPY_ZSTD_FIELD);
            pixels && !fields.iter().any(|f| imgpack_reader::ImageFormat::from_extension(f).is_some())
        })
    }

    /// `imgpack-lmdb` or `imgpack-webdataset`.
    pub fn kind(&self) -> &'static str {
        match imgpack_reader::detect(&self.path) {
            Some(Kind::Lmdb) => imgpack_reader::lmdb::FORMAT_NAME,
            _ => imgpack_reader::webdataset::FORMAT_NAME,
        }
    }
}

impl Source for PackedDataset {
    fn list(&self, _progress: &dyn crate::progress::Progress) -> Result<Listing> {
        let listing = self.with(|dataset| -> Result<Listing> {
            let classes = dataset.classes().to_vec();
            let mut samples = Samples::with_capacity(dataset.len() as usize, 0);
            let mut used = vec![false; classes.len()];
            dataset.scan(|sample| {
                let info = sample.info()?;
                let class = sample.label()?;
                let rel_path = info.path_bytes().map_err(|reason| imgpack_reader::Error::BadSample {
                    path: dataset.path().to_path_buf(),
                    key: sample.key.clone(),
                    reason,
                })?;
                if let Some(u) = used.get_mut(class as usize) {
                    *u = true;
                }
                let size = sample.payload().map_or(0, |(_, bytes)| bytes.len() as u64);
                // Scanned in order: the position is the dataset index.
                debug_assert_eq!(sample.index, samples.len() as u64);
                samples.push(&rel_path, class, size);
                Ok(())
            })?;
            let empty_classes =
                classes.iter().zip(&used).filter(|(_, u)| !**u).map(|(c, _)| c.clone()).collect();
            Ok(Listing { classes, samples, empty_classes, warnings: Vec::new() })
        })?;
        let mut guard = self.dataset.write().unwrap_or_else(|e| e.into_inner());
        if let Some(dataset) = guard.take() {
            let verify = dataset.meta().checksum.is_some();
            *guard = Some(dataset.verify_checksums(verify)?);
        }
        Ok(listing)
    }

    /// `DATASET/KEY`: the sample as stored.
    fn name(&self, sample: &SourceSample) -> PathBuf {
        self.path.join(imgpack_reader::key::format_key(sample.index, self.key_width))
    }

    /// A published dataset is never rewritten, and its samples are not files of their own:
    /// the stored size stands for the sample.
    fn stamp(&self, sample: &SourceSample) -> Option<super::Stamp> {
        Some(super::Stamp { size: sample.size, mtime_ns: 0 })
    }

    fn load(&self, sample: &SourceSample) -> Result<Vec<u8>, super::LoadError> {
        self.with(|dataset| {
            let stored = dataset.get(sample.index).map_err(std::io::Error::other)?;
            match stored.payload() {
                Some((_, bytes)) => Ok(bytes.to_vec()),
                None => {
                    Err(std::io::Error::other("the sample holds neither an image nor a pixels (npy) field")
                        .into())
                }
            }
        })
    }
}

/// Whether `path` holds a dataset written by `pack`.
pub fn is_packed(path: &Path) -> bool {
    imgpack_reader::detect(path).is_some()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::imagefolder::ImageFolder;
    use crate::{OutputFormat, PackConfig};

    /// testdata packed into `format` in `dir`, and the tree's own listing.
    fn packed(dir: &Path, format: OutputFormat) -> (PathBuf, Listing) {
        let tree = Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/imagefolder");
        let out = dir.join("out");
        let config = PackConfig::new(&tree, &out, format);
        crate::pack::pack(&config, &crate::progress::Silent).unwrap();
        let listing = ImageFolder::new(&tree, &config.extensions).list(&crate::progress::Silent).unwrap();
        (out, listing)
    }

    #[test]
    fn a_packed_dataset_lists_and_loads_what_the_tree_held() {
        let formats = [
            OutputFormat::Lmdb,
            OutputFormat::WebDataset {
                prefix: "s".into(),
                limits: crate::sink::webdataset::ShardLimits { max_bytes: 1 << 20, max_samples: None },
                md5: false,
            },
        ];
        for format in formats {
            let dir = tempfile::tempdir().unwrap();
            let (out, tree) = packed(dir.path(), format.clone());
            assert!(is_packed(&out));
            let source = PackedDataset::open(&out, None).unwrap();
            let listing = source.list(&crate::progress::Silent).unwrap();
            assert_eq!(listing.classes, tree.classes, "{format:?}");
            // Packed samples keep the tree's order, paths and classes (skipped ones are gone).
            let tree_rest: Vec<_> = tree.samples.iter().map(|s| (s.rel_path.to_vec(), s.class)).collect();
            let mut packed_rest = listing.samples.iter().map(|s| (s.rel_path.to_vec(), s.class));
            let mut found = 0;
            for want in &tree_rest {
                if packed_rest.clone().next().as_ref() == Some(want) {
                    packed_rest.next();
                    found += 1;
                }
            }
            assert_eq!(found, listing.samples.len(), "{format:?}: listing is the tree's order");
            assert!(found > 0);
            for sample in listing.samples.iter() {
                let rel = std::str::from_utf8(sample.rel_path).unwrap();
                let original = std::fs::read(
                    Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/imagefolder").join(rel),
                )
                .unwrap();
                assert_eq!(source.load(&sample).unwrap(), original, "{format:?} {rel}");
                assert_eq!(source.stamp(&sample).map(|s| s.size), Some(original.len() as u64));
            }
        }
    }

    #[test]
    fn a_damaged_sample_fails_to_load_instead_of_being_repacked() {
        let dir = tempfile::tempdir().unwrap();
        let format = OutputFormat::WebDataset {
            prefix: "s".into(),
            limits: crate::sink::webdataset::ShardLimits { max_bytes: 1 << 20, max_samples: None },
            md5: false,
        };
        let (out, _) = packed(dir.path(), format);
        let source = PackedDataset::open(&out, None).unwrap();
        let listing = source.list(&crate::progress::Silent).unwrap();
        // Flip one byte in the middle of the first sample's image, in its shard.
        let shard = std::fs::read_dir(&out)
            .unwrap()
            .map(|e| e.unwrap().path())
            .find(|p| p.extension().is_some_and(|e| e == "tar"))
            .unwrap();
        let mut bytes = std::fs::read(&shard).unwrap();
        let first = &listing.samples.get(0);
        let image = source.load(first).unwrap();
        let at = bytes.windows(image.len()).position(|w| w == image.as_slice()).unwrap() + image.len() / 2;
        bytes[at] ^= 0xff;
        std::fs::write(&shard, &bytes).unwrap();
        let err = source.load(first).unwrap_err().to_string();
        assert!(err.to_lowercase().contains("checksum") || err.contains("CRC"), "{err}");
    }
}
