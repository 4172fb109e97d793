//! The epoch loop: batches of one epoch, decoded ahead of the caller on a background thread.
//!
//! A training step and the decoding of the next batch should overlap, so a [`Loader`] decodes on
//! a thread of its own, [`PREFETCH`] batches ahead at most — memory stays bounded by that many
//! batches whatever the dataset size. The caller only ever waits on a channel:
//! [`Loader::next_batch`] takes nothing of the caller's and holds no lock of it, so a Python
//! binding can call it with the GIL released. Dropping the loader, or starting another epoch,
//! stops the thread within one sample's decode and joins it.

use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{sync_channel, Receiver};
use std::sync::Arc;
use std::thread::JoinHandle;

use imgpack_reader::Dataset;

use super::batch::{decode_until, Batch};
use super::crop::Crop;
use super::decode::slot_len;
use super::error::LoadError;
use super::order::epoch_indices;

/// Batches decoded ahead of the caller, at most: one waiting in the channel, one being decoded.
pub const PREFETCH: usize = 2;

/// How a [`Loader`] batches a dataset.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LoaderOptions {
    /// Samples per batch.
    pub batch_size: NonZeroUsize,
    /// Visit the samples in a new seeded order every epoch ([`epoch_indices`]).
    pub shuffle: bool,
    /// The seed of the orders and crops.
    pub seed: u64,
    /// Drop the samples that do not fill a last batch, and cut the epoch to a multiple of
    /// `world_size` instead of padding it (torch's `drop_last`, for both the sampler and the
    /// loader).
    pub drop_last: bool,
    /// The crop of every sample.
    pub crop: Crop,
    /// The side of every output image.
    pub size: u32,
    /// Decode threads.
    pub threads: NonZeroUsize,
    /// This process's rank among `world_size` (torch's `DistributedSampler`).
    pub rank: u64,
    /// The number of ranks sharing each epoch.
    pub world_size: u64,
}

impl Default for LoaderOptions {
    /// ImageNet training as torchvision's reference recipe does it: batches of 256 shuffled
    /// samples, random-resized crops to 224, one process, all cores.
    fn default() -> Self {
        LoaderOptions {
            batch_size: NonZeroUsize::new(256).expect("not 0"),
            shuffle: true,
            seed: 0,
            drop_last: false,
            crop: Crop::RANDOM_RESIZED,
            size: 224,
            threads: std::thread::available_parallelism().unwrap_or(NonZeroUsize::MIN),
            rank: 0,
            world_size: 1,
        }
    }
}

/// The batches of a dataset, epoch after epoch. `Send`: it can move to another thread (wrap it
/// in a `Mutex` to share it).
pub struct Loader {
    dataset: Arc<Dataset>,
    options: LoaderOptions,
    pool: Arc<rayon::ThreadPool>,
    epoch: u64,
    state: State,
}

/// Where the current epoch is.
enum State {
    /// Not started: the next [`Loader::next_batch`] starts it.
    Ready,
    Running(Producer),
    /// Every batch was handed out (or the epoch stopped at an error).
    Done,
}

impl std::fmt::Debug for Loader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Loader")
            .field("dataset", &self.dataset.path())
            .field("options", &self.options)
            .field("epoch", &self.epoch)
            .finish()
    }
}

impl Loader {
    /// A loader of `dataset` at epoch 0. Refuses options that cannot work, saying which.
    pub fn new(dataset: Arc<Dataset>, options: LoaderOptions) -> Result<Loader, LoadError> {
        let refuse = |reason: String| Err(LoadError::Options { path: dataset.path().to_path_buf(), reason });
        if options.world_size == 0 || options.rank >= options.world_size {
            return refuse(format!(
                "rank {} of world_size {}: world_size must be at least 1 and rank below it",
                options.rank, options.world_size
            ));
        }
        if let Err(reason) = options.crop.check() {
            return refuse(reason);
        }
        let slot = match slot_len(options.size) {
            Ok(slot) => slot,
            Err(reason) => return refuse(reason),
        };
        if slot.checked_mul(options.batch_size.get()).is_none() {
            return refuse(format!(
                "a batch of {} images of {} pixels square does not fit in memory",
                options.batch_size, options.size
            ));
        }
        let threads = options.threads.get();
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("imgpack-load-{i}"))
            .build()
            .map_err(|e| LoadError::Threads { threads, reason: e.to_string() })?;
        Ok(Loader { dataset, options, pool: Arc::new(pool), epoch: 0, state: State::Ready })
    }

    /// The dataset.
    pub fn dataset(&self) -> &Arc<Dataset> {
        &self.dataset
    }

    /// The options.
    pub fn options(&self) -> &LoaderOptions {
        &self.options
    }

    /// The epoch whose batches [`Loader::next_batch`] hands out.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// (Re)starts at `epoch`: stops the batches being decoded, if any, and makes the next
    /// [`Loader::next_batch`] begin epoch `epoch` from its first batch. Call it before each
    /// epoch, as with torch's `DistributedSampler.set_epoch`.
    pub fn set_epoch(&mut self, epoch: u64) {
        self.state = State::Ready;
        self.epoch = epoch;
    }

    /// The number of samples this rank visits per epoch.
    pub fn samples_per_epoch(&self) -> u64 {
        let (len, world) = (self.dataset.len(), self.options.world_size);
        if self.options.drop_last {
            len / world
        } else {
            len.div_ceil(world)
        }
    }

    /// The number of batches per epoch.
    pub fn len(&self) -> usize {
        let (n, b) = (self.samples_per_epoch(), self.options.batch_size.get() as u64);
        let batches = if self.options.drop_last { n / b } else { n.div_ceil(b) };
        usize::try_from(batches).unwrap_or(usize::MAX)
    }

    /// Whether an epoch has no batch.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The next batch of the epoch, waiting for it if it is not decoded yet; `None` once the
    /// epoch is over (until [`Loader::set_epoch`]). The first call of an epoch starts its
    /// background thread. An error ends the epoch: the calls after it return `None`.
    pub fn next_batch(&mut self) -> Option<Result<Batch, LoadError>> {
        if let State::Ready = self.state {
            match self.start() {
                Ok(producer) => self.state = State::Running(producer),
                Err(e) => {
                    self.state = State::Done;
                    return Some(Err(e));
                }
            }
        }
        let State::Running(producer) = &mut self.state else { return None };
        let next = producer.batches.as_ref().and_then(|batches| batches.recv().ok());
        match next {
            Some(Ok(batch)) => Some(Ok(batch)),
            Some(Err(e)) => {
                self.state = State::Done;
                Some(Err(e))
            }
            // The thread is gone: the epoch is over, or it panicked.
            None => {
                let panicked = producer.join();
                self.state = State::Done;
                panicked.then(|| Err(LoadError::Panicked { path: self.dataset.path().to_path_buf() }))
            }
        }
    }

    fn start(&self) -> Result<Producer, LoadError> {
        let (sender, receiver) = sync_channel(PREFETCH - 1);
        let stop = Arc::new(AtomicBool::new(false));
        let (dataset, pool, options, epoch) =
            (self.dataset.clone(), self.pool.clone(), self.options, self.epoch);
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("imgpack-loader".into())
            .spawn(move || {
                let o = options;
                let indices =
                    epoch_indices(dataset.len(), o.shuffle, o.seed, epoch, o.rank, o.world_size, o.drop_last);
                let batch_size = o.batch_size.get();
                let end = if o.drop_last { indices.len() / batch_size * batch_size } else { indices.len() };
                for chunk in indices[..end].chunks(batch_size) {
                    let batch = decode_until(&dataset, chunk, &o.crop, o.size, o.seed, epoch, &pool, &flag);
                    let failed = batch.is_err();
                    // A batch cut short by `stop` is never sent.
                    if flag.load(Ordering::Relaxed) || sender.send(batch).is_err() || failed {
                        return;
                    }
                }
            })
            .map_err(|e| LoadError::Threads { threads: 1, reason: e.to_string() })?;
        Ok(Producer { batches: Some(receiver), stop, thread: Some(thread) })
    }
}

/// The background thread of a running epoch and the receiving end of its batches.
struct Producer {
    /// `None` once dropped, which unblocks a thread waiting to send.
    batches: Option<Receiver<Result<Batch, LoadError>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Producer {
    /// Waits for the thread to end; whether it panicked.
    fn join(&mut self) -> bool {
        self.thread.take().is_some_and(|t| t.join().is_err())
    }
}

impl Drop for Producer {
    /// Stops the thread: between samples if it is decoding, at once if it waits to send (the
    /// channel closes), and joins it.
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        self.batches = None;
        self.join();
    }
}

#[cfg(test)]
mod tests {
    use super::super::batch::tests::webdataset;
    use super::*;
    use crate::verify::testing::packed;
    use crate::OutputFormat;

    fn options(batch_size: usize) -> LoaderOptions {
        LoaderOptions {
            batch_size: NonZeroUsize::new(batch_size).unwrap(),
            size: 16,
            threads: NonZeroUsize::new(2).unwrap(),
            ..LoaderOptions::default()
        }
    }

    fn epoch(loader: &mut Loader) -> Vec<Batch> {
        std::iter::from_fn(|| loader.next_batch()).map(Result::unwrap).collect()
    }

    fn dataset(dir: &std::path::Path, format: OutputFormat) -> Arc<Dataset> {
        Arc::new(imgpack_reader::open(packed(dir, format)).unwrap())
    }

    /// testdata without its one WebP file: 30 samples, divisible by 2, 3, 5, 6...
    fn even_dataset(dir: &std::path::Path) -> Arc<Dataset> {
        let tree = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/imagefolder");
        let out = dir.join("even");
        let mut config = crate::PackConfig::new(&tree, &out, OutputFormat::Lmdb);
        config.extensions.retain(|e| e != "webp");
        crate::pack::pack(&config, &crate::progress::Silent).unwrap();
        let dataset = imgpack_reader::open(&out).unwrap();
        assert_eq!(dataset.len(), 30);
        Arc::new(dataset)
    }

    #[test]
    fn an_epoch_visits_every_sample_once_with_its_label() {
        let dir = tempfile::tempdir().unwrap();
        let data = dataset(dir.path(), webdataset());
        let mut loader = Loader::new(data.clone(), options(4)).unwrap();
        assert_eq!((loader.samples_per_epoch(), loader.len()), (31, 8));
        let batches = epoch(&mut loader);
        assert_eq!(batches.iter().map(Batch::len).collect::<Vec<_>>(), [4, 4, 4, 4, 4, 4, 4, 3]);
        let mut seen: Vec<u64> = batches.iter().flat_map(|b| b.indices.clone()).collect();
        assert_ne!(seen, (0..31).collect::<Vec<_>>(), "shuffled");
        for b in &batches {
            for (&i, &label) in b.indices.iter().zip(&b.labels) {
                assert_eq!(label, i64::from(data.get(i).unwrap().label().unwrap()));
            }
        }
        seen.sort_unstable();
        assert_eq!(seen, (0..31).collect::<Vec<_>>());
        assert!(loader.next_batch().is_none(), "the epoch is over");
        assert!(loader.next_batch().is_none());
    }

    #[test]
    fn epochs_repeat_exactly_and_differ_from_each_other() {
        let dir = tempfile::tempdir().unwrap();
        let data = dataset(dir.path(), OutputFormat::Lmdb);
        let mut loader = Loader::new(data.clone(), options(8)).unwrap();
        let first = epoch(&mut loader);
        loader.set_epoch(0);
        assert_eq!(epoch(&mut loader), first, "the same epoch again");
        loader.set_epoch(1);
        let second = epoch(&mut loader);
        assert_ne!(second[0].indices, first[0].indices);
        // Another thread count, the same batches.
        let mut one = Loader::new(data, LoaderOptions { threads: NonZeroUsize::MIN, ..options(8) }).unwrap();
        one.set_epoch(1);
        assert_eq!(epoch(&mut one), second);
    }

    #[test]
    fn drop_last_drops_the_short_batch() {
        let dir = tempfile::tempdir().unwrap();
        let data = dataset(dir.path(), OutputFormat::Lmdb);
        let mut loader =
            Loader::new(data, LoaderOptions { drop_last: true, shuffle: false, ..options(4) }).unwrap();
        assert_eq!(loader.len(), 7);
        let batches = epoch(&mut loader);
        assert_eq!(batches.len(), 7);
        assert!(batches.iter().all(|b| b.len() == 4));
        assert_eq!(batches.last().unwrap().indices, [24, 25, 26, 27], "in order, 28..31 dropped");
    }

    #[test]
    fn two_ranks_share_an_epoch_disjointly_and_completely() {
        let dir = tempfile::tempdir().unwrap();
        let data = even_dataset(dir.path());
        let mut all = Vec::new();
        for rank in 0..2 {
            let mut loader =
                Loader::new(data.clone(), LoaderOptions { rank, world_size: 2, ..options(4) }).unwrap();
            loader.set_epoch(3);
            assert_eq!((loader.samples_per_epoch(), loader.len()), (15, 4));
            let share: Vec<u64> = epoch(&mut loader).iter().flat_map(|b| b.indices.clone()).collect();
            assert_eq!(share.len(), 15);
            all.extend(share);
        }
        all.sort_unstable();
        assert_eq!(all, (0..30).collect::<Vec<_>>());
    }

    #[test]
    fn dropping_a_loader_mid_epoch_stops_its_thread() {
        let dir = tempfile::tempdir().unwrap();
        let data = dataset(dir.path(), OutputFormat::Lmdb);
        let mut loader = Loader::new(data.clone(), LoaderOptions { size: 224, ..options(2) }).unwrap();
        assert!(loader.next_batch().unwrap().is_ok());
        // The thread holds the dataset while it runs: once the drop returns, it has let go.
        assert!(Arc::strong_count(&data) > 2);
        let started = std::time::Instant::now();
        drop(loader);
        assert_eq!(Arc::strong_count(&data), 1, "the thread ended");
        assert!(started.elapsed() < std::time::Duration::from_secs(5), "{:?}", started.elapsed());
        // So does starting another epoch mid-epoch.
        let mut loader = Loader::new(data.clone(), options(2)).unwrap();
        assert!(loader.next_batch().unwrap().is_ok());
        loader.set_epoch(1);
        assert_eq!(Arc::strong_count(&data), 2, "only the loader holds it");
    }

    #[test]
    fn impossible_options_are_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let data = dataset(dir.path(), webdataset());
        let refused = |o: LoaderOptions| Loader::new(data.clone(), o).unwrap_err().to_string();
        assert!(refused(LoaderOptions { rank: 2, world_size: 2, ..options(4) })
            .contains("rank 2 of world_size 2"));
        assert!(refused(LoaderOptions { world_size: 0, rank: 0, ..options(4) }).contains("world_size"));
        assert!(refused(LoaderOptions { size: 0, ..options(4) }).contains("size 0"));
        let crop = Crop::RandomResized { scale: (0.5, 0.1), ratio: (1.0, 1.0) };
        assert!(refused(LoaderOptions { crop, ..options(4) }).contains("scale"));
    }

    #[test]
    fn an_error_ends_the_epoch_and_is_reported_once() {
        let dir = tempfile::tempdir().unwrap();
        let out = packed(dir.path(), webdataset());
        // Damage sample 0's image inside its shard, keeping the tar intact: it no longer decodes.
        let dataset = imgpack_reader::open(&out).unwrap();
        let image = dataset.get(0).unwrap().payload().unwrap().1.to_vec();
        drop(dataset);
        let shard = out.join("shard-000000.tar");
        let at = crate::verify::testing::find(&shard, &image);
        let mut bytes = std::fs::read(&shard).unwrap();
        bytes[at..at + image.len()].fill(0);
        std::fs::write(&shard, bytes).unwrap();
        let data = Arc::new(imgpack_reader::open(&out).unwrap());
        let mut loader = Loader::new(data, LoaderOptions { shuffle: false, ..options(4) }).unwrap();
        let err = loader.next_batch().unwrap().unwrap_err();
        assert!(matches!(&err, LoadError::Decode { key, .. } if key.ends_with('0')), "{err}");
        assert!(err.to_string().contains(&out.display().to_string()), "{err}");
        assert!(loader.next_batch().is_none());
    }

    #[test]
    fn a_loader_can_move_to_another_thread() {
        fn send<T: Send>() {}
        send::<Loader>();
    }
}
