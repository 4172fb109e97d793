//! The memory floor under a measurement: the same reads, in the same order, on the same
//! number of threads, each doing the same per-read work ([`touch`] over each of the sample's
//! byte runs, timed by the same clock pair) — but over copies of the samples' bytes already in
//! this process's memory. The only difference is where the bytes come from, so a warm read
//! reported as "1.1× the floor" says how much the storage path costs over memory, on any
//! machine, while its microseconds alone say as much about the machine's memory as about the
//! path.
//!
//! # What is copied
//!
//! Each thread copies the samples it read, untimed and on its own thread (so the pages are
//! local to it), once each, laid out in sample order as storage holds them: replayed in the
//! measured order, the floor's reads jump around memory as the measured ones jumped around the
//! file or the page cache, and no hardware prefetcher runs on from one sample into the next
//! where the original could not. Each copy keeps its original's offset within a cache line.
//! The copies sit in ordinary anonymous memory (4 KiB pages, unless transparent huge pages are
//! set to `always`). Then the threads start together, as in the measurement, each summing its
//! own copies, so the floor of a many-thread level shares memory bandwidth the way its reads did.
//!
//! At most [`FLOOR_BYTES`] are copied in all (split evenly between the threads): a thread's
//! floor covers its reads up to the one that takes it over its share, and a note says when
//! that is fewer than it made.
//!
//! # What the floor is not
//!
//! It is not the cost of the measured path minus its I/O: a cold read's floor is still "if the
//! bytes were in memory". The copies are written just before they are summed, so for working
//! sets smaller than the CPU's last-level cache the floor comes from that cache — as warm reads
//! of such a small dataset mostly do too, since the warm-up and the earlier levels just read
//! it. If anything the floor is favoured: it is the best case the measured path could reach.

use std::ops::Range;
use std::sync::Barrier;
use std::time::Instant;

use super::input::{touch, Opened};
use super::stats::{self, Latency};
use crate::Result;

/// The most bytes copied for one measurement's floor, all threads together.
pub const FLOOR_BYTES: u64 = 256 << 20;
/// The most reads one measurement's floor replays, all threads together: plenty for its
/// percentiles, and a bound on the log a long `--duration` run keeps.
pub const FLOOR_READS: usize = 1_000_000;
/// Datasets of up to this many items are tracked with a bitmap (16 MiB per thread at most) so
/// that a sample read again counts once against [`FLOOR_BYTES`]; above it every read counts.
const MAX_TRACKED: u64 = 1 << 27;

/// The reads one thread made, in the order it made them (items), as far as its share of
/// [`FLOOR_BYTES`] and [`FLOOR_READS`] goes: what its floor replays.
#[derive(Debug, Default)]
pub struct Log {
    /// The items read, in order.
    pub items: Vec<u64>,
    /// The bytes of the distinct samples among them.
    bytes: u64,
    budget: u64,
    max_reads: usize,
    /// The items seen so far, one bit each, when a measurement reads some samples more than
    /// once.
    seen: Option<Vec<u64>>,
    full: Option<Cap>,
}

/// Which limit ended a [`Log`] before its thread's last read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Cap {
    /// [`FLOOR_READS`].
    Reads,
    /// [`FLOOR_BYTES`].
    Bytes,
}

impl Log {
    /// A log for one of `threads` threads of a measurement making at most `reads` reads of an
    /// input of `len` items; room for `capacity` reads up front.
    pub fn new(threads: usize, capacity: usize, len: u64, reads: u64) -> Log {
        let threads = threads.max(1);
        let seen = (reads > len && len <= MAX_TRACKED).then(|| vec![0u64; len.div_ceil(64) as usize]);
        Log {
            items: Vec::with_capacity(capacity.min(FLOOR_READS / threads)),
            bytes: 0,
            budget: FLOOR_BYTES / threads as u64,
            max_reads: (FLOOR_READS / threads).max(1),
            seen,
            full: None,
        }
    }

    /// The limit that ended the log, if one did.
    pub fn cap(&self) -> Option<Cap> {
        self.full
    }

    /// Records a read of `item` that returned `bytes` bytes, unless the log is full: a sample
    /// not logged before that would take it over the thread's share of [`FLOOR_BYTES`] fills
    /// it, as does its share of [`FLOOR_READS`], and nothing is logged after. The first read is
    /// always logged, so every thread that read has a floor.
    #[inline]
    pub fn push(&mut self, item: u64, bytes: u64) {
        if self.full.is_some() {
            return;
        }
        let new = match &mut self.seen {
            Some(bits) => {
                let (word, bit) = ((item / 64) as usize, 1u64 << (item % 64));
                let new = bits[word] & bit == 0;
                bits[word] |= bit;
                new
            }
            None => true,
        };
        if self.items.len() >= self.max_reads {
            self.full = Some(Cap::Reads);
        } else if new && !self.items.is_empty() && self.bytes + bytes > self.budget {
            self.full = Some(Cap::Bytes);
        }
        if self.full.is_some() {
            self.seen = None;
            return;
        }
        if new {
            self.bytes += bytes;
        }
        self.items.push(item);
    }
}

/// The floor of one measurement.
#[derive(Debug, Clone)]
pub struct Floor {
    /// Per-read latency of summing the copies.
    pub latency: Latency,
    /// Reads timed.
    pub samples: u64,
    /// Bytes copied (each sample once).
    pub bytes: u64,
}

/// Measures the floor under the reads in `logs` (one per thread), copying the samples through
/// `opened` (any access to the same input: only its bytes are used). `None` if no read was
/// logged.
pub fn measure(opened: &Opened, logs: &[Log]) -> Result<Option<Floor>> {
    let barrier = Barrier::new(logs.len());
    let results: Vec<Result<(Vec<u64>, u64)>> = std::thread::scope(|s| {
        let handles: Vec<_> = logs
            .iter()
            .map(|log| {
                let barrier = &barrier;
                s.spawn(move || {
                    let copies = Copies::new(opened, &log.items);
                    // Every thread reaches the barrier, even one whose copy failed.
                    barrier.wait();
                    let copies = copies?;
                    Ok((copies.time(), copies.bytes.len() as u64))
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("floor thread panicked")).collect()
    });
    let mut latencies = Vec::new();
    let mut bytes = 0;
    for result in results {
        let (lat, b) = result?;
        latencies.extend(lat);
        bytes += b;
    }
    let samples = latencies.len() as u64;
    Ok(stats::summarize(&mut latencies).map(|(latency, _)| Floor { latency, samples, bytes }))
}

/// Copies of the samples one thread read, each once, in sample order, and the reads to replay.
struct Copies {
    /// The copies; `runs` index into it.
    bytes: Vec<u8>,
    /// Each byte run (one per LMDB field, one per sample otherwise).
    runs: Vec<Range<usize>>,
    /// Per read, in the measured order: the range of `runs` that holds its sample.
    reads: Vec<Range<usize>>,
}

impl Copies {
    fn new(opened: &Opened, items: &[u64]) -> Result<Copies> {
        let mut distinct = items.to_vec();
        distinct.sort_unstable();
        distinct.dedup();
        let mut reader = opened.reader()?;
        let mut bytes = Vec::new();
        let mut runs = Vec::new();
        let mut slots = Vec::with_capacity(distinct.len());
        for &item in &distinct {
            let first = runs.len();
            reader.copy_into(item, &mut bytes, &mut runs)?;
            slots.push(first..runs.len());
        }
        // `copy_into` kept each run's offset within a cache line relative to the buffer's
        // start; put that start on a cache-line boundary. Usually in place: the buffer has
        // grown by doubling, so there is room for the 63 bytes at most.
        let len = bytes.len();
        bytes.reserve(64);
        let shift = (64 - bytes.as_ptr() as usize % 64) % 64;
        bytes.resize(len + shift, 0);
        bytes.copy_within(0..len, shift);
        for run in &mut runs {
            *run = run.start + shift..run.end + shift;
        }
        let reads = items
            .iter()
            .map(|item| slots[distinct.binary_search(item).expect("every item was copied")].clone())
            .collect();
        Ok(Copies { bytes, runs, reads })
    }

    /// Sums every read's copies as [`super::input::ItemReader::read`] sums its bytes, each read
    /// timed alone; the latencies in nanoseconds.
    fn time(&self) -> Vec<u64> {
        let mut latencies = Vec::with_capacity(self.reads.len());
        let mut checksum = 0u64;
        for read in &self.reads {
            let t0 = Instant::now();
            let mut sum = 0;
            for run in &self.runs[read.clone()] {
                // `black_box` keeps the sum between the two clock reads: the copies are plain
                // memory, which the compiler could otherwise read early or late.
                sum ^= touch(std::hint::black_box(&self.bytes[run.clone()]));
            }
            checksum = std::hint::black_box(checksum.wrapping_add(sum));
            let t1 = Instant::now();
            latencies.push((t1 - t0).as_nanos() as u64);
        }
        latencies
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logs_stop_at_their_share_but_keep_the_first_read() {
        let mut log = Log::new(4, 0, 100, 100);
        let share = FLOOR_BYTES / 4;
        log.push(1, share * 2);
        log.push(2, 10);
        assert_eq!(log.items, vec![1], "a first read over the share is still logged, none after it");
        assert_eq!(log.cap(), Some(Cap::Bytes));
        let mut log = Log::new(1, 0, 100, 100);
        for i in 0..10 {
            log.push(i, FLOOR_BYTES / 4 - 1);
        }
        assert_eq!(log.items, vec![0, 1, 2, 3]);
        // A prefix: once a read does not fit, a smaller one after it is not logged either.
        log.push(10, 1);
        assert_eq!(log.items.len(), 4);
    }

    #[test]
    fn a_sample_read_again_counts_once_when_reads_wrap() {
        // Three samples of a third of the share each, read round and round: they all fit.
        let mut log = Log::new(2, 0, 3, 1000);
        let third = FLOOR_BYTES / 2 / 3;
        for k in 0..30 {
            log.push(k % 3, third);
        }
        assert_eq!(log.items.len(), 30);
        assert_eq!(log.cap(), None);
        // Without wrapping no sample repeats, and every read counts.
        let mut log = Log::new(1, 0, 1000, 1000);
        for k in 0..10 {
            log.push(k, FLOOR_BYTES / 3);
        }
        assert_eq!(log.items, vec![0, 1, 2]);
        // The read cap holds even for tiny samples.
        let mut log = Log::new(4, 0, 10, u64::MAX);
        for k in 0..FLOOR_READS as u64 {
            log.push(k % 10, 1);
        }
        assert_eq!(log.items.len(), FLOOR_READS / 4);
        assert_eq!(log.cap(), Some(Cap::Reads));
    }

    #[test]
    fn copies_replay_the_reads_in_order_with_their_bytes() {
        let dir = tempfile::tempdir_in(std::env::current_exe().unwrap().parent().unwrap()).unwrap();
        let file = dir.path().join("blocks.bin");
        let data: Vec<u8> = (0..8 * 100u32).map(|i| (i % 251) as u8).collect();
        std::fs::write(&file, &data).unwrap();
        let input = super::super::input::Input::blocks(&file, 100).unwrap();
        let opened = input.open(false).unwrap();
        let items = [5, 1, 5, 7, 0];
        let copies = Copies::new(&opened, &items).unwrap();
        assert_eq!(copies.reads.len(), items.len());
        for (read, &item) in copies.reads.iter().zip(&items) {
            let got: Vec<u8> =
                copies.runs[read.clone()].iter().flat_map(|r| copies.bytes[r.clone()].to_vec()).collect();
            assert_eq!(got, &data[item as usize * 100..item as usize * 100 + 100]);
        }
        // Four distinct blocks, each copied once.
        assert_eq!(copies.runs.len(), 4);
        assert_eq!(copies.time().len(), items.len());

        let mut log = Log::new(1, 0, 8, 5);
        for &i in &items {
            log.push(i, 100);
        }
        let floor = measure(&opened, &[log, Log::new(2, 0, 8, 5)]).unwrap().unwrap();
        assert_eq!(floor.samples, 5);
        assert!(floor.bytes >= 400, "{floor:?}");
        assert!(floor.latency.p50 > 0.0 && floor.latency.p50 <= floor.latency.max);
    }
}
