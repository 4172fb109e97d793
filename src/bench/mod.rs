//! `pack bench-read`: random-read latency and throughput of raw files, LMDB and WebDataset
//! shards on the user's own storage.
//!
//! The case for packing a dataset is a measurement — milliseconds per small file on an HDD,
//! ~0.1 ms on a SATA SSD, microseconds from a packed file — and this module lets a user take
//! it on their machine, at the concurrency their data loader uses. [`input`] says what is read
//! and how, [`cache`] evicts and checks the page cache for cold measurements, [`device`] names
//! the storage, [`stats`] does the percentile arithmetic, [`floor`] measures the memory floor
//! under each measurement, [`record`] holds the results and prints them, and [`plot`] draws them.
//!
//! # Timing
//!
//! Each read is timed on its own with `Instant::now()` before and after (the monotonic clock,
//! read through the vDSO: ~20-50 ns a pair, see [`timer_overhead_ns`]), and a read ends only
//! when the sample's bytes are in hand and every byte has been touched ([`input::touch`]).
//! Throughput is reads over wall time, from the moment all threads start together to the
//! moment the last one stops.
//!
//! After the timed reads, [`floor`] replays them over copies of the same bytes in memory: the
//! same work from memory, so each latency can also be read as a multiple of that floor.

pub mod cache;
pub mod device;
pub mod floor;
pub mod input;
pub mod plot;
pub mod record;
pub mod stats;

use std::num::NonZeroUsize;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Barrier;
use std::time::{Duration, Instant};

use self::cache::Residency;
use self::device::Device;
use self::input::Input;
use self::record::Measurement;
use crate::progress::Progress;
use crate::{Error, Result};

/// Reads per measurement when neither `--samples` nor `--duration` is given (at most one pass).
pub const DEFAULT_SAMPLES: u64 = 10_000;
/// Time limit per measurement when neither is given.
pub const DEFAULT_DURATION: Duration = Duration::from_secs(60);
/// A cold measurement whose files are more cached than this after eviction is flagged.
const COLD_THRESHOLD: f64 = 0.05;
/// A warm measurement whose files are less cached than this after warm-up is flagged.
const WARM_THRESHOLD: f64 = 0.95;

/// The order samples are read in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pattern {
    /// A seeded random permutation: what `DataLoader(shuffle=True)` does.
    Random,
    /// Storage order.
    Sequential,
}

/// The page cache state each measurement starts from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cache {
    /// The files are read once first, so reads hit the page cache.
    Warm,
    /// The files are evicted first, so reads reach the device.
    Cold,
}

/// What to measure for every input.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Read order.
    pub pattern: Pattern,
    /// Reads per measurement (`--samples`).
    pub samples: Option<u64>,
    /// Time per measurement (`--duration`).
    pub duration: Option<Duration>,
    /// Seed of the random order.
    pub seed: u64,
    /// Concurrency levels.
    pub threads: Vec<NonZeroUsize>,
    /// Concurrency levels for an object store (the same as `threads` when the user gave them).
    pub store_threads: Vec<NonZeroUsize>,
    /// Cache state.
    pub cache: Cache,
    /// `O_DIRECT` reads for raw files, shards and `--file`.
    pub direct: bool,
}

/// The default concurrency levels for local storage.
pub const DEFAULT_THREADS: [usize; 5] = [1, 2, 4, 8, 16];
/// The default concurrency levels for an object store: one request at a time is its latency,
/// not its throughput, which needs many in flight.
pub const DEFAULT_STORE_THREADS: [usize; 5] = [1, 4, 16, 32, 64];

impl Plan {
    /// Levels as `NonZeroUsize`s.
    pub fn levels(levels: &[usize]) -> Vec<NonZeroUsize> {
        levels.iter().filter_map(|&n| NonZeroUsize::new(n)).collect()
    }

    /// The items read, in order, for an input of `len` items.
    pub fn order(&self, len: u64) -> Vec<u64> {
        let mut order: Vec<u64> = (0..len).collect();
        if self.pattern == Pattern::Random {
            crate::shuffle::shuffle(&mut order, self.seed);
        }
        order
    }

    /// How many reads a measurement of an input of `len` items makes at most, how long it may
    /// run, and a note if the limit was cut.
    pub fn limits(&self, len: u64) -> (u64, Option<Duration>, Option<String>) {
        let (reads, duration) = match (self.samples, self.duration) {
            (None, None) => (len.min(DEFAULT_SAMPLES), Some(DEFAULT_DURATION)),
            (Some(n), d) => (n, d),
            (None, Some(d)) => (u64::MAX, Some(d)),
        };
        if self.cache == Cache::Cold && reads > len {
            let note = format!(
                "cold: one pass ({len} reads), since a second read of a sample would come from the cache"
            );
            return (len, duration, Some(note));
        }
        (reads.max(1), duration, None)
    }
}

/// Runs every concurrency level of `plan` on `input`. `bar` is reset for each level.
pub fn sweep(input: &Input, plan: &Plan, bar: &dyn Progress) -> Result<Vec<Measurement>> {
    if input.is_empty() {
        return Err(Error::BadSource { path: input.path.clone(), reason: "holds no sample to read".into() });
    }
    let device = input.device();
    if plan.cache == Cache::Warm && !(plan.direct && input.access.can_be_direct()) && input.access.is_cached()
    {
        // How pages entered the cache matters: read sequentially they sit in large folios,
        // faulted in one by one they do not, and warm map reads differ by 2x between the two
        // (measured: 7 µs against 17 µs per 100 kB LMDB value). Starting every sweep from an
        // evicted file read front to back makes warm figures repeatable.
        let len = input.len();
        for file in files_read(input, &plan.order(len), plan.limits(len).0) {
            cache::evict(&file).map_err(Error::io(&file))?;
            warm_up(&file)?;
        }
    }
    let levels = if input.access.is_cached() { &plan.threads } else { &plan.store_threads };
    levels.iter().map(|&threads| measure(input, plan, threads.get(), &device, bar)).collect()
}

/// The files holding the items that a measurement making `reads` reads in `order` reaches
/// (all of them once it wraps around).
fn files_read(input: &Input, order: &[u64], reads: u64) -> Vec<PathBuf> {
    let first_pass = usize::try_from(reads).map_or(order.len(), |r| r.min(order.len()));
    input.files(&order[..first_pass])
}

/// One measurement: `input` read by `threads` threads.
pub fn measure(
    input: &Input,
    plan: &Plan,
    threads: usize,
    device: &Device,
    bar: &dyn Progress,
) -> Result<Measurement> {
    let len = input.len();
    let order = plan.order(len);
    let (reads, duration, limit_note) = plan.limits(len);
    let mut notes: Vec<String> = limit_note.into_iter().collect();
    let files = files_read(input, &order, reads);
    let direct = plan.direct && input.access.can_be_direct();
    let (resident_before_eviction, resident_before) = match plan.cache {
        // O_DIRECT reads bypass the page cache: warming it would only waste time; a store's
        // bytes are not in this machine's cache at all.
        Cache::Warm if direct => (None, None),
        _ if !input.access.is_cached() => (None, None),
        Cache::Cold => {
            let before = residency(&files);
            for file in &files {
                cache::evict(file).map_err(Error::io(file))?;
            }
            let after = residency(&files);
            if after.share().is_some_and(|s| s > COLD_THRESHOLD) {
                notes.push(format!(
                    "eviction did not take: {:.0}% of the pages stayed cached (a file system that ignores POSIX_FADV_DONTNEED, or pages dirty or mapped by another process), so these are not cold reads",
                    after.share().unwrap_or(0.0) * 100.0
                ));
            }
            if after.unknown > 0 {
                notes.push(
                    "the kernel does not report the page cache of files you neither own nor may write; eviction is unverified for those".into(),
                );
            }
            (before.share(), after.share())
        }
        Cache::Warm => {
            // `sweep` has read the files; read them again only if some pages have gone since.
            let mut after = residency(&files);
            if after.share().is_some_and(|s| s < 1.0) {
                for file in &files {
                    warm_up(file)?;
                }
                after = residency(&files);
            }
            if after.share().is_some_and(|s| s < WARM_THRESHOLD) {
                notes.push(format!(
                    "only {:.0}% of the data stayed in the page cache after reading it; some warm reads reach the device",
                    after.share().unwrap_or(0.0) * 100.0
                ));
            }
            (None, after.share())
        }
    };
    let opened = input.open(plan.direct)?;

    bar.length(if reads == u64::MAX { 0 } else { reads });
    bar.position(0);
    bar.message(&format!("{} {}, {threads} threads", input.path.display(), input.access.name()));

    let next = AtomicU64::new(0);
    let stop = AtomicBool::new(false);
    let running = AtomicUsize::new(threads);
    let barrier = Barrier::new(threads + 1);
    let capacity = usize::try_from(reads.min(len).min(1 << 20) / threads as u64 + 1).unwrap_or(1024);
    let results = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    let reader = opened.reader();
                    let mut latencies: Vec<u64> = Vec::with_capacity(capacity);
                    let mut log = floor::Log::new(threads, capacity, len, reads);
                    barrier.wait();
                    let started = Instant::now();
                    let deadline = duration.map(|d| started + d);
                    let worker = || -> Result<(u64, u64)> {
                        let mut reader = reader?;
                        let mut bytes = 0;
                        while !stop.load(Ordering::Relaxed) {
                            let k = next.fetch_add(1, Ordering::Relaxed);
                            if k >= reads {
                                break;
                            }
                            let item = order[(k % len) as usize];
                            let t0 = Instant::now();
                            let n = reader.read(item)?;
                            let t1 = Instant::now();
                            latencies.push((t1 - t0).as_nanos() as u64);
                            bytes += n;
                            log.push(item, n);
                            if deadline.is_some_and(|d| t1 >= d) {
                                stop.store(true, Ordering::Relaxed);
                            }
                        }
                        Ok((bytes, std::hint::black_box(reader.checksum())))
                    };
                    let result = worker();
                    if result.is_err() {
                        stop.store(true, Ordering::Relaxed);
                    }
                    let finished = Instant::now();
                    running.fetch_sub(1, Ordering::Release);
                    result.map(|(bytes, _)| (latencies, log, bytes, started, finished))
                })
            })
            .collect();
        barrier.wait();
        while running.load(Ordering::Acquire) > 0 {
            bar.position(next.load(Ordering::Relaxed).min(reads));
            std::thread::sleep(Duration::from_millis(50));
        }
        handles.into_iter().map(|h| h.join().expect("reader thread panicked")).collect::<Vec<_>>()
    });
    let mut latencies = Vec::new();
    let mut logs = Vec::with_capacity(threads);
    let mut bytes = 0;
    // Wall time runs from the first thread's start to the last one's end, as each saw them:
    // with more threads than cores, this thread may not even run until they are done.
    let mut span: Option<(Instant, Instant)> = None;
    for result in results {
        let (lat, log, b, started, finished) = result?;
        span = Some(span.map_or((started, finished), |(s, e)| (s.min(started), e.max(finished))));
        latencies.extend(lat);
        logs.push(log);
        bytes += b;
    }
    let (start, end) = span.expect("at least one thread");
    let seconds = (end - start).as_secs_f64().max(1e-9);
    let samples = latencies.len() as u64;
    let (latency_us, latency_cdf_us) = stats::summarize(&mut latencies).ok_or_else(|| Error::BadSource {
        path: input.path.clone(),
        reason: "no read was measured; pass a longer --duration or more --samples".into(),
    })?;
    bar.position(samples);

    bar.message(&format!(
        "{} {}, {threads} threads: memory floor",
        input.path.display(),
        input.access.name()
    ));
    // The copies are read through the page cache: an `O_DIRECT` pass would only be slower.
    let buffered;
    let source = if direct {
        buffered = input.open(false)?;
        &buffered
    } else {
        &opened
    };
    let floor = floor::measure(source, &logs)?;
    if let (Some(f), Some(cap)) = (&floor, logs.iter().filter_map(floor::Log::cap).max()) {
        let why = match cap {
            floor::Cap::Bytes => format!("its copies are capped at {} MB", floor::FLOOR_BYTES / 1_000_000),
            floor::Cap::Reads => {
                format!("it replays at most {} reads", record::group(floor::FLOOR_READS as f64))
            }
        };
        notes.push(format!(
            "memory floor over the first {} of the {} reads ({why})",
            record::group(f.samples as f64),
            record::group(samples as f64)
        ));
    }
    Ok(Measurement {
        record: record::MEASUREMENT.to_string(),
        path: input.path.display().to_string(),
        format: input.access.format().into(),
        access: input.access.name().into(),
        device: device.clone(),
        pattern: match plan.pattern {
            Pattern::Random => "random",
            Pattern::Sequential => "sequential",
        }
        .into(),
        cache: match plan.cache {
            _ if !input.access.is_cached() => "none (object store)",
            Cache::Warm if direct => "bypassed",
            Cache::Warm => "warm",
            Cache::Cold => "cold",
        }
        .into(),
        direct,
        threads,
        samples,
        bytes,
        seconds,
        samples_per_s: samples as f64 / seconds,
        mb_per_s: bytes as f64 / seconds / 1e6,
        x_floor: floor.as_ref().map(|f| latency_us.p50 / f.latency.p50).filter(|x| x.is_finite()),
        floor_us: floor.map(|f| f.latency),
        latency_us,
        latency_cdf_us,
        resident_before,
        resident_before_eviction,
        notes,
        seed: plan.seed,
        host: host_name(),
        tool: crate::TOOL.into(),
    })
}

/// The page-cache residency of `files` together; unreadable files count as unknown.
fn residency(files: &[PathBuf]) -> Residency {
    let mut total = Residency::default();
    for file in files {
        if let Ok(r) = cache::resident(file) {
            total.add(r);
        }
    }
    total
}

/// Reads `path` once, sequentially, so that its pages are in the page cache.
fn warm_up(path: &std::path::Path) -> Result<()> {
    use std::io::Read;
    let mut file = std::fs::File::open(path).map_err(Error::io(path))?;
    let mut buf = vec![0u8; 1 << 20];
    while file.read(&mut buf).map_err(Error::io(path))? > 0 {}
    Ok(())
}

/// This machine's host name, to tell runs from different machines apart.
pub fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "unknown".into())
}

/// The median cost of one `Instant::now()` pair on this machine, in nanoseconds: the floor
/// under every latency reported.
pub fn timer_overhead_ns() -> f64 {
    let mut samples: Vec<u64> = (0..10_001)
        .map(|_| {
            let t0 = Instant::now();
            let t1 = Instant::now();
            (t1 - t0).as_nanos() as u64
        })
        .collect();
    samples.sort_unstable();
    samples[samples.len() / 2] as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(samples: Option<u64>, duration: Option<u64>, cache: Cache) -> Plan {
        Plan {
            pattern: Pattern::Random,
            samples,
            duration: duration.map(Duration::from_secs),
            seed: 1,
            threads: vec![std::num::NonZeroUsize::MIN],
            store_threads: vec![std::num::NonZeroUsize::MIN],
            cache,
            direct: false,
        }
    }

    #[test]
    fn limits_default_to_one_pass_capped() {
        assert_eq!(plan(None, None, Cache::Warm).limits(31), (31, Some(DEFAULT_DURATION), None));
        assert_eq!(plan(None, None, Cache::Warm).limits(1 << 30).0, DEFAULT_SAMPLES);
        assert_eq!(plan(Some(100), None, Cache::Warm).limits(31), (100, None, None));
        assert_eq!(plan(None, Some(5), Cache::Warm).limits(31).0, u64::MAX);
        let (reads, _, note) = plan(Some(100), None, Cache::Cold).limits(31);
        assert_eq!(reads, 31);
        assert!(note.unwrap().contains("one pass"));
    }

    #[test]
    fn orders_are_seeded_permutations() {
        let p = plan(None, None, Cache::Warm);
        let a = p.order(1000);
        assert_eq!(a, p.order(1000));
        let mut sorted = a.clone();
        sorted.sort();
        assert_eq!(sorted, (0..1000).collect::<Vec<u64>>());
        assert_ne!(a, sorted);
        let other = Plan { seed: 2, ..p.clone() };
        assert_ne!(a, other.order(1000));
        let seq = Plan { pattern: Pattern::Sequential, ..p };
        assert_eq!(seq.order(5), vec![0, 1, 2, 3, 4]);
    }
}
