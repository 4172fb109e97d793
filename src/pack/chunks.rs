//! The CPU stage: samples read ahead are checked and transcoded on the worker pool, a chunk
//! at a time, and handed to the writer in order.
//!
//! A chunk is about 32 MiB of samples (`Chunker`): the writer checkpoints, and notices a stop
//! request, between chunks. Two chunks are in flight at once, so that a worker that finishes
//! its share of one starts on the next instead of waiting for the other's last sample. Within
//! a chunk the workers claim samples one at a time, in order, and take each one's bytes from
//! the readahead as they claim it: they start on the first sample read rather than waiting for
//! the whole chunk to be read, and never wait on a sample far ahead of the readers while an
//! earlier one is ready (an indexed parallel iterator would hand the second worker the second
//! half of the chunk, which the readers reach last).

use std::collections::VecDeque;
use std::ops::Range;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, SyncSender};
use std::sync::{Arc, Mutex};

use crate::pack::readahead::Readahead;
use crate::transcode::Image;

/// A sample as the workers leave it: transformed, with the CRC-32 of its stored bytes, or the
/// reason it is skipped.
pub(crate) type Loaded = Result<(Image, u32), String>;

/// A sample as the readers leave it: its bytes, or the reason it cannot be read.
pub(crate) type Read = Result<Vec<u8>, String>;

/// About this many source bytes in one chunk.
pub(crate) const CHUNK_BYTES: u64 = 32 << 20;
/// At most this many samples in one chunk.
pub(crate) const CHUNK_SAMPLES: usize = 1024;
/// The last chunks of a range are cut down to this many samples ([`tapered`]).
const TAIL_SAMPLES: usize = 16;
/// Chunks being transformed at once: two, so that the workers move on to the next chunk while
/// the last samples of one finish. Each holds up to [`CHUNK_BYTES`].
const CHUNKS_IN_FLIGHT: usize = 2;

/// Chooses how many samples the next chunk takes so that it holds about [`CHUNK_BYTES`]:
/// the first chunk is small, later ones follow the average size of the samples read so far,
/// within 1..=[`CHUNK_SAMPLES`].
/// A smaller `budget` (in bytes) makes chunks smaller: the writer checkpoints, and notices a
/// stop request, between chunks, so a run asked to checkpoint every N bytes cuts its chunks
/// no larger than that.
#[derive(Debug)]
pub(crate) struct Chunker {
    samples: u64,
    bytes: u64,
    /// At most this many source bytes in a chunk.
    pub(crate) budget: u64,
}

impl Default for Chunker {
    fn default() -> Self {
        Chunker { samples: 0, bytes: 0, budget: CHUNK_BYTES }
    }
}

impl Chunker {
    pub(crate) fn with_budget(budget: u64) -> Chunker {
        Chunker { budget: budget.clamp(1, CHUNK_BYTES), ..Chunker::default() }
    }

    fn next_len(&self) -> usize {
        if self.samples == 0 || self.bytes == 0 {
            return 64;
        }
        let average = (self.bytes / self.samples).max(1);
        ((self.budget / average) as usize).clamp(1, CHUNK_SAMPLES)
    }

    /// Whether a chunk has been observed, so that [`next_len`](Chunker::next_len) follows
    /// what was read rather than its first guess.
    fn observed(&self) -> bool {
        self.samples > 0
    }

    /// Learns from a loaded chunk. A sample counts as the larger of its source and stored
    /// sizes: the stored size bounds what a chunk holds in memory, the source size keeps a
    /// chunk within the readahead's budget (the same bytes). Counting only the stored bytes, a
    /// re-encode (~35 kB stored for ~98 kB read) made chunks of 1,024 samples: three times what
    /// the readahead holds, so the workers waited for reads at the start of every chunk, and
    /// at the end of a run both cores idled while the writer stored and synced one large last
    /// chunk.
    fn observe(&mut self, loaded: &[Loaded]) {
        self.samples += loaded.len() as u64;
        self.bytes += loaded
            .iter()
            .map(|r| r.as_ref().map_or(0, |(image, _)| (image.bytes.len() as u64).max(image.source_bytes)))
            .sum::<u64>();
    }
}

/// Transforms the samples of `range` on `pool`, taking their bytes from `readahead`, in chunks
/// sized by `chunker`, and sends the chunks in order to `tx`.
///
/// Returns when the range is done; when a stop is requested (after sending the chunks in
/// flight, so the writer checkpoints what was read); when the writer hangs up; or when the
/// readahead stops (its readers could not start). A worker's panic is raised again here once
/// the chunks in flight end, and a reader's as "a reader thread stopped".
pub(crate) fn load(
    pool: &rayon::ThreadPool,
    readahead: &Readahead<Read>,
    range: Range<usize>,
    mut chunker: Chunker,
    transform: &(dyn Fn(Vec<u8>) -> Loaded + Sync),
    tx: &SyncSender<Vec<Loaded>>,
) {
    let workers = pool.current_num_threads();
    pool.in_place_scope(|scope| {
        let mut pending = VecDeque::new();
        let mut next = range.start;
        loop {
            let more = next < range.end && !crate::interrupt::requested();
            // The first chunk's size is a guess (64 samples); the next is sized from what it
            // held, so it waits for the first to finish.
            let sized = pending.is_empty() || chunker.observed();
            if more && sized && pending.len() < CHUNKS_IN_FLIGHT {
                let samples = next..next + tapered(chunker.next_len(), range.end - next);
                next = samples.end;
                let jobs = workers.min(samples.len());
                let (done, result) = mpsc::sync_channel(1);
                let chunk = Arc::new(Chunk::new(samples, jobs, done));
                for _ in 0..jobs {
                    let chunk = Arc::clone(&chunk);
                    scope.spawn(move |_| chunk.work(readahead, transform));
                }
                pending.push_back(result);
                continue;
            }
            // Done; or a chunk whose worker panicked, which sends nothing: the scope raises the
            // panic again on this thread once it ends, sooner with the readers stopped.
            let Some(Ok(loaded)) = pending.pop_front().map(|r| r.recv()) else {
                readahead.stop();
                return;
            };
            let Some(loaded) = loaded else {
                assert!(!readahead.failed(), "a reader thread stopped on an internal error");
                return; // stopped: the readers could not all start
            };
            chunker.observe(&loaded);
            if tx.send(loaded).is_err() {
                readahead.stop();
                return; // the writer stopped
            }
        }
    });
}

/// How many samples the next chunk takes, `len` being a full chunk and `remaining` the samples
/// left: all of them, or a full chunk while more than two are left; then half of what is left,
/// down to [`TAIL_SAMPLES`]. The writer stores a chunk while the workers transform the next,
/// except the last, which it stores (and the sink then syncs) after every worker is done: a
/// full last chunk (~13 MB of re-encoded JPEGs) left both cores idle for ~17 ms of writes at
/// the end of every run, ~1% of a 2-thread re-encode of 3,000 images. Halving the last two
/// chunks' worth costs a few more chunks, whose boundaries change no output byte.
fn tapered(len: usize, remaining: usize) -> usize {
    if remaining <= TAIL_SAMPLES || remaining > 2 * len {
        return len.min(remaining);
    }
    remaining.div_ceil(2).max(TAIL_SAMPLES).min(len)
}

/// One chunk being transformed by `jobs` workers at once.
struct Chunk {
    samples: Range<usize>,
    /// The next sample to claim.
    next: AtomicUsize,
    /// What each sample became, by position in the chunk.
    loaded: Mutex<Vec<Option<Loaded>>>,
    /// Jobs still working on it: the last one out sends the chunk.
    working: AtomicUsize,
    /// Where the chunk goes: `None` if a sample's bytes never came (the readahead stopped). A
    /// job that panics never counts itself out, so nothing is sent, and the loader sees the
    /// sender dropped with the last job.
    done: SyncSender<Option<Vec<Loaded>>>,
}

impl Chunk {
    fn new(samples: Range<usize>, jobs: usize, done: SyncSender<Option<Vec<Loaded>>>) -> Chunk {
        Chunk {
            next: AtomicUsize::new(samples.start),
            loaded: Mutex::new((0..samples.len()).map(|_| None).collect()),
            samples,
            working: AtomicUsize::new(jobs),
            done,
        }
    }

    /// Claims samples in order and transforms each, until the chunk has none left.
    fn work(&self, readahead: &Readahead<Read>, transform: &(dyn Fn(Vec<u8>) -> Loaded + Sync)) {
        loop {
            let i = self.next.fetch_add(1, Ordering::Relaxed);
            if i >= self.samples.end {
                break;
            }
            // `None`: the readahead was stopped; the slot left empty makes the chunk `None`.
            let Some(read) = readahead.take(i) else { break };
            let loaded = read.and_then(transform);
            self.slots()[i - self.samples.start] = Some(loaded);
        }
        if self.working.fetch_sub(1, Ordering::AcqRel) == 1 {
            let chunk = std::mem::take(&mut *self.slots()).into_iter().collect();
            let _ = self.done.send(chunk); // the loader may have stopped
        }
    }

    fn slots(&self) -> std::sync::MutexGuard<'_, Vec<Option<Loaded>>> {
        self.loaded.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image(len: usize) -> Result<(Image, u32), String> {
        Ok((
            Image {
                kind: "jpg",
                ext: "jpg",
                bytes: vec![0; len],
                width: 1,
                height: 1,
                kept: false,
                source_bytes: len as u64,
            },
            0,
        ))
    }

    #[test]
    fn chunks_follow_the_average_sample_size() {
        let mut chunker = Chunker::default();
        assert_eq!(chunker.next_len(), 64, "small first chunk");
        chunker.observe(&vec![image(100_000); 64]);
        assert_eq!(chunker.next_len(), (CHUNK_BYTES / 100_000) as usize);
        let mut tiny = Chunker::default();
        tiny.observe(&vec![image(10); 64]);
        assert_eq!(tiny.next_len(), CHUNK_SAMPLES, "capped by count");
        let mut huge = Chunker::default();
        huge.observe(&[image(100 << 20)]);
        assert_eq!(huge.next_len(), 1, "one huge sample at a time");
        let mut shrunk = Chunker::default();
        let small = |len: usize| image(len).map(|(i, crc)| (Image { source_bytes: 100_000, ..i }, crc));
        shrunk.observe(&vec![small(30_000); 64]);
        assert_eq!(shrunk.next_len(), (CHUNK_BYTES / 100_000) as usize, "re-encoded: by the source size");
        let mut skipped = Chunker::default();
        skipped.observe(&[Err("bad".into()), Err("bad".into())]);
        assert_eq!(skipped.next_len(), 64);
    }

    #[test]
    fn the_last_chunks_get_smaller_down_to_the_tail_size() {
        // Full chunks of 400 while more than 800 are left, then halves, then the rest.
        let mut left = 1_000;
        let mut lens = Vec::new();
        while left > 0 {
            let len = tapered(400, left);
            lens.push(len);
            left -= len;
        }
        assert_eq!(lens, [400, 300, 150, 75, 38, 19, 16, 2]);
        assert_eq!(tapered(400, 5), 5, "fewer than the tail size left: all of them");
        assert_eq!(tapered(10, 30), 10, "a full chunk while more than two are left");
        assert_eq!(tapered(10, 20), 10, "never above a full chunk");
        assert_eq!(tapered(1, 3), 1, "one huge sample at a time, to the end");
    }

    #[test]
    fn a_checkpoint_budget_caps_the_chunk_bytes() {
        let mut chunker = Chunker::with_budget(1_000_000);
        chunker.observe(&vec![image(100_000); 64]);
        assert_eq!(chunker.next_len(), 10, "10 samples of 100 kB fill a 1 MB budget");
        assert_eq!(Chunker::with_budget(u64::MAX).budget, CHUNK_BYTES, "never above the default");
        let mut zero = Chunker::with_budget(0);
        zero.observe(&[image(10)]);
        assert_eq!(zero.next_len(), 1, "at least one sample per chunk");
    }

    /// Runs `load` over `n` samples of 10 bytes served by one reader thread that, before
    /// reading sample `k`, waits (up to a second) until the workers have transformed `k - lag`
    /// samples. Returns the samples' bytes as the writer got them and how many reads had to
    /// give up waiting.
    fn load_paced(n: usize, lag: usize, workers: usize) -> (Vec<u8>, usize) {
        use std::time::{Duration, Instant};
        let pool = rayon::ThreadPoolBuilder::new().num_threads(workers).build().unwrap();
        let readahead: Readahead<Read> = Readahead::new(0..n, 1 << 20, 2 * CHUNK_SAMPLES);
        let transformed = AtomicUsize::new(0);
        let gave_up = AtomicUsize::new(0);
        let transform = |bytes: Vec<u8>| {
            transformed.fetch_add(1, Ordering::SeqCst);
            image(bytes.len()).map(|(i, crc)| (Image { bytes, ..i }, crc))
        };
        let (tx, rx) = mpsc::sync_channel(1);
        let written = std::thread::scope(|scope| {
            scope.spawn(|| {
                readahead.serve(|k| {
                    let deadline = Instant::now() + Duration::from_secs(1);
                    while transformed.load(Ordering::SeqCst) + lag < k {
                        if Instant::now() > deadline {
                            gave_up.fetch_add(1, Ordering::SeqCst);
                            break;
                        }
                        std::thread::sleep(Duration::from_micros(100));
                    }
                    (Ok(vec![k as u8; 10]), 10)
                })
            });
            let writer =
                scope.spawn(move || rx.iter().flatten().map(|r: Loaded| r.unwrap().0.bytes[0]).collect());
            load(&pool, &readahead, 0..n, Chunker::default(), &transform, &tx);
            drop(tx);
            readahead.stop();
            writer.join().unwrap()
        });
        (written, gave_up.load(Ordering::SeqCst))
    }

    #[test]
    fn workers_start_on_each_sample_as_it_is_read_and_the_writer_gets_them_in_order() {
        // The reader stays at most 2 samples ahead of the workers: had the workers waited for a
        // whole chunk (64 samples first) to be read, every read past the second would have had
        // to give up waiting.
        for workers in [1, 2, 4] {
            let (written, gave_up) = load_paced(200, 2, workers);
            assert_eq!(written, (0..200).map(|k| k as u8).collect::<Vec<_>>(), "{workers} workers");
            assert_eq!(gave_up, 0, "{workers} workers waited for reads they had not asked for");
        }
    }
}
