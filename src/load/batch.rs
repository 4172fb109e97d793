//! A batch: many samples read and decoded in parallel into one contiguous array.
//!
//! The images land in one `N x size x size x 3` buffer, each decoded straight into its slot, so
//! a binding can hand it to NumPy or torch as one array without copying or stacking. Reads are
//! zero-copy: from LMDB through one read snapshot per chunk of work (the reader's cold-read
//! path, see [`imgpack_reader::lmdb`]), from WebDataset straight out of the shard's map.

use std::sync::atomic::{AtomicBool, Ordering};

use imgpack_reader::{Dataset, Sample};
use rayon::prelude::*;

use super::crop::Crop;
use super::decode::{decode_crop, slot_len};
use super::error::LoadError;
use super::seed::sample_seed;

/// Decoded samples, in the order asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Batch {
    /// `len * size * size * 3` bytes: RGB `uint8`, sample-major, then rows, columns, channels
    /// (NHWC).
    pub images: Vec<u8>,
    /// Each sample's class index.
    pub labels: Vec<i64>,
    /// Each sample's index in the dataset.
    pub indices: Vec<u64>,
    /// The side of every image.
    pub size: u32,
}

impl Batch {
    /// The number of samples.
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    /// Whether the batch holds no sample.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }

    /// Sample `i`'s image, `size * size * 3` bytes.
    pub fn image(&self, i: usize) -> &[u8] {
        let slot = self.size as usize * self.size as usize * 3;
        &self.images[i * slot..(i + 1) * slot]
    }
}

/// Reads samples `indices` of `dataset` and decodes each with [`decode_crop`] (its crop seeded
/// by [`sample_seed`]`(seed, epoch, index)`) into a [`Batch`], on the threads of `pool`.
///
/// The result depends on the indices, crop, size, seed and epoch only, never on the thread
/// count. On failure the error is that of the first failing sample in `indices` order.
pub fn decode_batch(
    dataset: &Dataset,
    indices: &[u64],
    crop: &Crop,
    size: u32,
    seed: u64,
    epoch: u64,
    pool: &rayon::ThreadPool,
) -> Result<Batch, LoadError> {
    decode_until(dataset, indices, crop, size, seed, epoch, pool, &AtomicBool::new(false))
}

/// [`decode_batch`], giving up between samples once `stop` is set (the result is then
/// meaningless): how a loader that is dropped mid-batch stops within one sample's decode.
#[allow(clippy::too_many_arguments)]
pub(super) fn decode_until(
    dataset: &Dataset,
    indices: &[u64],
    crop: &Crop,
    size: u32,
    seed: u64,
    epoch: u64,
    pool: &rayon::ThreadPool,
    stop: &AtomicBool,
) -> Result<Batch, LoadError> {
    let options = |reason: String| LoadError::Options { path: dataset.path().to_path_buf(), reason };
    crop.check().map_err(options)?;
    let slot = slot_len(size).map_err(options)?;
    let total = slot.checked_mul(indices.len()).ok_or_else(|| {
        options(format!("a batch of {} images of {size}x{size} does not fit in memory", indices.len()))
    })?;
    let mut images = vec![0u8; total];
    let mut labels = vec![0i64; indices.len()];
    // A few chunks per thread, so a slow sample does not hold up a whole share.
    let chunk = indices.len().div_ceil(pool.current_num_threads() * 4).max(1);
    let job = Job { dataset, crop, size, seed, epoch, stop };
    let results: Vec<Result<(), LoadError>> = pool.install(|| {
        images
            .par_chunks_mut(chunk * slot)
            .zip(labels.par_chunks_mut(chunk))
            .zip(indices.par_chunks(chunk))
            .map(|((images, labels), indices)| job.chunk(indices, images, labels))
            .collect()
    });
    results.into_iter().collect::<Result<(), LoadError>>()?;
    Ok(Batch { images, labels, indices: indices.to_vec(), size })
}

/// What every chunk of a batch shares.
struct Job<'a> {
    dataset: &'a Dataset,
    crop: &'a Crop,
    size: u32,
    seed: u64,
    epoch: u64,
    stop: &'a AtomicBool,
}

impl Job<'_> {
    /// Reads and decodes `indices` into `images` and `labels`, stopping at the first failure.
    fn chunk(&self, indices: &[u64], images: &mut [u8], labels: &mut [i64]) -> Result<(), LoadError> {
        let slots = images.chunks_exact_mut(images.len() / indices.len().max(1));
        let mut each = indices.iter().zip(slots.zip(labels.iter_mut()));
        match self.dataset {
            Dataset::Lmdb(lmdb) => {
                let snapshot = lmdb.snapshot()?;
                each.try_for_each(|(&i, (image, label))| self.sample(|| snapshot.get(i), image, label))
            }
            other => each.try_for_each(|(&i, (image, label))| self.sample(|| other.get(i), image, label)),
        }
    }

    fn sample<'s>(
        &self,
        read: impl FnOnce() -> imgpack_reader::Result<Sample<'s>>,
        image: &mut [u8],
        label: &mut i64,
    ) -> Result<(), LoadError> {
        if self.stop.load(Ordering::Relaxed) {
            return Ok(());
        }
        let sample = read()?;
        *label = i64::from(sample.label()?);
        let failed = |reason: String| LoadError::Decode {
            path: sample.dataset.to_path_buf(),
            key: sample.key.clone(),
            reason,
        };
        let (ext, bytes) = sample.payload().ok_or_else(|| failed("it holds no image field".into()))?;
        let seed = sample_seed(self.seed, self.epoch, sample.index);
        decode_crop(ext, bytes, self.crop, self.size, seed, image).map_err(failed)
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::sink::webdataset::ShardLimits;
    use crate::verify::testing::packed;
    use crate::OutputFormat;

    /// WebDataset shards of 8 samples: testdata spans four of them.
    pub(in crate::load) fn webdataset() -> OutputFormat {
        OutputFormat::WebDataset {
            prefix: "shard".into(),
            limits: ShardLimits { max_bytes: 1 << 20, max_samples: Some(8) },
            md5: false,
        }
    }

    fn pool(threads: usize) -> rayon::ThreadPool {
        rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap()
    }

    #[test]
    fn a_batch_holds_each_samples_label_and_decode_crop() {
        for format in [OutputFormat::Lmdb, webdataset()] {
            let dir = tempfile::tempdir().unwrap();
            let dataset = imgpack_reader::open(packed(dir.path(), format.clone())).unwrap();
            let indices = [30, 0, 7, 7, 12, 3, 21, 1, 29];
            let crop = Crop::RANDOM_RESIZED;
            let batch = decode_batch(&dataset, &indices, &crop, 48, 5, 2, &pool(3)).unwrap();
            assert_eq!((batch.len(), batch.size, batch.images.len()), (9, 48, 9 * 48 * 48 * 3));
            assert_eq!(batch.indices, indices);
            for (n, &i) in indices.iter().enumerate() {
                let sample = dataset.get(i).unwrap();
                assert_eq!(batch.labels[n], i64::from(sample.label().unwrap()), "{format:?} sample {i}");
                let (ext, bytes) = sample.payload().unwrap();
                let mut want = vec![0; 48 * 48 * 3];
                decode_crop(ext, bytes, &crop, 48, sample_seed(5, 2, i), &mut want).unwrap();
                assert_eq!(batch.image(n), &want[..], "{format:?} sample {i}");
            }
            // The same sample twice in a batch gets the same crop: it depends on the index.
            assert_eq!(batch.image(2), batch.image(3));
            // And nothing depends on the thread count.
            assert_eq!(decode_batch(&dataset, &indices, &crop, 48, 5, 2, &pool(1)).unwrap(), batch);
            assert_ne!(
                decode_batch(&dataset, &indices, &crop, 48, 5, 3, &pool(2)).unwrap().images,
                batch.images
            );
        }
    }

    #[test]
    fn a_decoded_dataset_batches_its_stored_pixels() {
        use crate::transcode::{Decode, Filter, Mode, Resize, Transcoder};
        let dir = tempfile::tempdir().unwrap();
        let tree = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/imagefolder");
        let out = dir.path().join("decoded");
        let mut config = crate::PackConfig::new(&tree, &out, OutputFormat::Lmdb);
        config.transcoder = Transcoder {
            mode: Mode::Decode(Decode {
                resize: Some(Resize::ShorterSide(40)),
                upscale: true,
                filter: Filter::Bilinear,
                center_crop: Some(32),
                zstd_level: Some(3),
            }),
            ..Transcoder::default()
        };
        crate::pack::pack(&config, &crate::progress::Silent).unwrap();
        let dataset = imgpack_reader::open(&out).unwrap();
        let indices: Vec<u64> = (0..dataset.len()).collect();
        let batch = decode_batch(&dataset, &indices, &Crop::RANDOM_RESIZED, 32, 0, 0, &pool(2)).unwrap();
        for &i in &indices {
            let sample = dataset.get(i).unwrap();
            let (ext, bytes) = sample.payload().unwrap();
            assert_eq!(ext, "npy.zst");
            let (w, h, pixels) = super::super::decode::decode_full(ext, bytes).unwrap();
            assert_eq!((w, h), (32, 32));
            assert_eq!(batch.image(i as usize), &pixels[..], "stored at the output size: copied");
        }
        // At another size they are cropped and resized like any image.
        let small = decode_batch(&dataset, &indices, &Crop::Center, 24, 0, 0, &pool(2)).unwrap();
        assert_eq!(small.images.len(), indices.len() * 24 * 24 * 3);
    }

    #[test]
    fn errors_name_the_dataset_and_the_sample() {
        let dir = tempfile::tempdir().unwrap();
        let dataset = imgpack_reader::open(packed(dir.path(), webdataset())).unwrap();
        let err = decode_batch(&dataset, &[0, 31, 40], &Crop::Center, 8, 0, 0, &pool(2)).unwrap_err();
        assert!(matches!(err, LoadError::Read(imgpack_reader::Error::OutOfRange { index: 31, .. })), "{err}");
        let bad_crop = Crop::RandomResized { scale: (1.0, 0.5), ratio: (1.0, 1.0) };
        let err = decode_batch(&dataset, &[0], &bad_crop, 8, 0, 0, &pool(1)).unwrap_err();
        assert!(matches!(err, LoadError::Options { .. }) && err.to_string().contains("scale"), "{err}");
        let err = decode_batch(&dataset, &[0], &Crop::Center, 0, 0, 0, &pool(1)).unwrap_err();
        assert!(err.to_string().contains(&dataset.path().display().to_string()), "{err}");
        let empty = decode_batch(&dataset, &[], &Crop::Center, 8, 0, 0, &pool(1)).unwrap();
        assert!(empty.is_empty() && empty.images.is_empty());
    }
}
