//! The I/O stage: files are read ahead of the CPU work, many at once, within a byte budget.
//!
//! On NFS, Lustre or a disk every `open` and `read` waits milliseconds while the CPU idles, so
//! the number of reads in flight, not the number of cores, sets the speed there. A [`Readahead`]
//! is served by its own threads (`--io-threads`), which claim the listed samples in order and
//! read them, while the `--threads` pool checks and transcodes what has been read. The consumer
//! [`take`](Readahead::take)s the samples in order; whatever order the reads finish in, the
//! output is the same.
//!
//! Memory stays bounded: a reader starts another read only while the bytes read and not yet
//! taken, plus the reads in flight at the average size read so far, stay within the budget
//! (before any read has finished, one read at a time). With samples of one size, what the stage
//! holds never exceeds the larger of the budget and one sample.
//!
//! # As many reads in flight as the source needs
//!
//! The readers are the most there may be (`--io-threads`, 32), not how many read at once. Reads
//! start one at a time, and a consumer that has to wait for a sample while every read allowed
//! is in flight, and fewer samples than that are ready, doubles the reads allowed, up to the
//! number of readers — at most once per read's time, so that the readers added last have
//! delivered before it judges again. A slow source (2 ms per open and read) reaches 32 reads in
//! flight within a few reads' time. A fast one (the page cache, an SSD) keeps the workers fed
//! with one or two, and stays there: 32 readers on such a source cost a 2-thread re-encode ~5%
//! of its time, the second core's share going to waking readers that each read one file and
//! slept again (`sys` time 0.4 s where two readers take 0.2 s), while a 1-thread run, which
//! leaves them the other core, did not notice.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Reads allowed in flight at the start ([`State::allowed`]): one reader, woken when a batch
/// of reads fits ([`WAKE_BATCH`]), reads the whole batch before it sleeps again.
const FIRST_ALLOWED: u64 = 1;

/// Reads the samples of a range ahead of their consumer, by any number of threads calling
/// [`serve`](Readahead::serve).
#[derive(Debug)]
pub struct Readahead<T> {
    state: Mutex<State<T>>,
    /// Signalled when a read finishes (for the consumer) ...
    read: Condvar,
    /// ... and when the budget allows another read (for one reader, which passes it on).
    room: Condvar,
    budget: u64,
    /// At most this many samples read and not taken, or being read.
    max_items: u64,
}

#[derive(Debug)]
struct State<T> {
    /// The next index to claim, and the end of the range.
    next: usize,
    end: usize,
    /// Read and not yet taken: the item and its size in bytes.
    ready: HashMap<usize, (T, u64)>,
    /// Bytes in `ready`.
    buffered: u64,
    /// Reads claimed and not finished.
    in_flight: u64,
    /// Reads finished and the bytes they gave, for the average size.
    finished: u64,
    finished_bytes: u64,
    /// Reads allowed in flight at once: from [`FIRST_ALLOWED`], doubled up to `readers` while
    /// the consumer waits with all of them in flight (see the [module docs](self)).
    allowed: u64,
    /// Threads in [`Readahead::serve`].
    readers: u64,
    /// When `allowed` last grew, and how long a read takes (a moving average of the last few):
    /// it grows again only once the readers it added have had a read's time to deliver.
    grown_at: Option<Instant>,
    read_time: Duration,
    /// No more reads are started (the consumer is done, or stopped early).
    stopped: bool,
    /// A reader panicked: the item it was reading will never come.
    failed: bool,
}

impl<T> Readahead<T> {
    /// A readahead of `range`, holding about `budget` bytes at most, and at most `max_items`
    /// samples (read or being read): small files would otherwise fill the budget with tens of
    /// thousands of samples, each with its own allocation, far more than the consumer takes at
    /// once.
    pub fn new(range: Range<usize>, budget: u64, max_items: usize) -> Readahead<T> {
        Readahead {
            state: Mutex::new(State {
                next: range.start,
                end: range.end.max(range.start),
                ready: HashMap::new(),
                buffered: 0,
                in_flight: 0,
                finished: 0,
                finished_bytes: 0,
                allowed: FIRST_ALLOWED,
                readers: 0,
                grown_at: None,
                read_time: Duration::ZERO,
                stopped: false,
                failed: false,
            }),
            read: Condvar::new(),
            room: Condvar::new(),
            budget,
            max_items: max_items.max(1) as u64,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State<T>> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Reads samples until the range is done or [`stop`](Readahead::stop) is called: claims the
    /// next index when the budget allows, `read`s it (returning the item and its size in bytes)
    /// and hands it to [`take`](Readahead::take). Call it from each reader thread.
    ///
    /// A reader waiting for room is woken only when there is room, and one at a time (the one
    /// woken wakes the next if there is room for more): with dozens of readers, a consumer that
    /// takes one sample does not wake them all.
    pub fn serve(&self, read: impl Fn(usize) -> (T, u64)) {
        // A panicking `read` must not leave the consumer waiting for an item that never comes;
        // and a reader that returns is no longer one that more reads could be allowed for.
        struct Serving<'a, T>(&'a Readahead<T>);
        impl<T> Drop for Serving<'_, T> {
            fn drop(&mut self) {
                let mut state = self.0.lock();
                state.readers -= 1;
                if std::thread::panicking() {
                    state.failed = true;
                    drop(state);
                    self.0.read.notify_all();
                }
            }
        }
        self.lock().readers += 1;
        let _serving = Serving(self);
        loop {
            let index = {
                let mut state = self.lock();
                loop {
                    if state.stopped || state.next >= state.end {
                        return;
                    }
                    if state.may_start(self.budget, self.max_items) {
                        break;
                    }
                    state = self.room.wait(state).unwrap_or_else(|e| e.into_inner());
                }
                state.next += 1;
                state.in_flight += 1;
                if state.next >= state.end {
                    self.room.notify_all(); // nothing left: every reader may return
                } else if state.may_start(self.budget, self.max_items) {
                    self.room.notify_one();
                }
                state.next - 1
            };
            let started = Instant::now();
            let (item, bytes) = read(index);
            let took = started.elapsed();
            let mut state = self.lock();
            state.in_flight -= 1;
            state.finished += 1;
            state.finished_bytes += bytes;
            state.buffered += bytes;
            state.read_time = if state.finished == 1 { took } else { (state.read_time * 7 + took) / 8 };
            state.ready.insert(index, (item, bytes));
            // No reader is woken here: this one claims the next read itself, and wakes another
            // if there is room for two.
            drop(state);
            self.read.notify_all();
        }
    }

    /// The item at `index`, waiting until it has been read; `None` if it never will be: a reader
    /// panicked, or the readahead was stopped before the index was claimed. Each index of the
    /// range is taken once, in any order.
    pub fn take(&self, index: usize) -> Option<T> {
        let mut state = self.lock();
        loop {
            if let Some((item, bytes)) = state.ready.remove(&index) {
                state.buffered -= bytes;
                if state.may_wake(self.budget, self.max_items) {
                    self.room.notify_one();
                }
                return Some(item);
            }
            if state.failed || (state.stopped && index >= state.next) {
                return None;
            }
            if state.may_grow() {
                state.allowed = (state.allowed * 2).min(state.readers);
                state.grown_at = Some(Instant::now());
                if state.may_start(self.budget, self.max_items) {
                    self.room.notify_one(); // it wakes the next, as long as there is room
                }
            }
            state = self.read.wait(state).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Whether a reader panicked.
    pub fn failed(&self) -> bool {
        self.lock().failed
    }

    /// Starts no more reads: the readers return once their reads in flight end, and a
    /// [`take`](Readahead::take) of an index not yet claimed returns `None`.
    pub fn stop(&self) {
        self.lock().stopped = true;
        self.room.notify_all();
        self.read.notify_all();
    }

    /// Waits until no read is in flight and none has started for 100 ms: the readers are all
    /// waiting, for room or for a batch of it (a take that makes room for fewer wakes none, so
    /// whether they will start cannot be told from the state alone).
    #[cfg(test)]
    fn wait_idle(&self) {
        use std::time::{Duration, Instant};
        let mut state = self.lock();
        let mut seen = (state.next, state.finished);
        let mut quiet_since = Instant::now();
        loop {
            if state.in_flight == 0 && quiet_since.elapsed() >= Duration::from_millis(100) {
                return;
            }
            state =
                self.read.wait_timeout(state, Duration::from_millis(10)).unwrap_or_else(|e| e.into_inner()).0;
            if (state.next, state.finished) != seen || state.in_flight > 0 {
                seen = (state.next, state.finished);
                quiet_since = Instant::now();
            }
        }
    }
}

/// How many reads a [`take`](Readahead::take) must make room for before it wakes a reader
/// (unless nothing is left to take). The consumers are the CPU work, and a woken reader
/// preempts the thread that woke it: woken for each sample taken, the readers preempted the
/// workers of a 2-thread re-encode ~3,800 times in 3,000 samples; woken when a batch fits,
/// they run back to back. A budget that holds fewer than two batches (large files) wakes them
/// when half of it is free instead ([`State::wake_batch`]).
const WAKE_BATCH: u64 = 8;

impl<T> State<T> {
    /// Whether a consumer that has to wait should allow more reads in flight: every read allowed
    /// is in flight (so the readers, not the budget, hold it up), the readers are not ahead of
    /// the consumer by even that many samples (when they are, it waits for one slow read, which
    /// more readers would not speed up), there are readers to run more, a read has finished
    /// (before, the size is unknown and one read runs at a time) and one read's time has passed
    /// since the last growth.
    fn may_grow(&self) -> bool {
        self.in_flight >= self.allowed
            && (self.ready.len() as u64) < self.allowed
            && self.allowed < self.readers
            && self.finished > 0
            && self.grown_at.is_none_or(|at| at.elapsed() >= self.read_time)
    }

    /// Whether a consumer that made room should wake a reader: a read fits, and either a batch
    /// of them fits or nothing is read or being read.
    fn may_wake(&self, budget: u64, max_items: u64) -> bool {
        if !self.may_start(budget, max_items) {
            return false;
        }
        (self.in_flight == 0 && self.ready.is_empty())
            || self.finished == 0
            || self.fits(self.wake_batch(budget, max_items), budget, max_items)
    }

    /// [`WAKE_BATCH`], or half of the reads the budget holds at the average size if that is
    /// fewer (at least one): with a batch the budget can hardly hold, the readers would wait
    /// until the consumer had taken everything, and then it would wait for them — reading and
    /// the CPU work one after the other instead of at once. Some read must have finished.
    fn wake_batch(&self, budget: u64, max_items: u64) -> u64 {
        let holds = (budget / self.average().max(1)).min(max_items);
        WAKE_BATCH.min(holds / 2).max(1)
    }

    /// Whether one more read may start: fewer than [`allowed`](State::allowed) are in flight,
    /// and it fits the budget: the bytes held plus the reads in flight (this one included) at
    /// the average size read so far. Before any read has finished the size is unknown, so one
    /// read at a time; with nothing held, a read always starts.
    fn may_start(&self, budget: u64, max_items: u64) -> bool {
        if self.in_flight >= self.allowed || self.ready.len() as u64 + self.in_flight >= max_items {
            return false;
        }
        if self.buffered == 0 && self.in_flight == 0 {
            return true;
        }
        self.finished > 0 && self.fits(1, budget, max_items)
    }

    /// Whether `reads` more reads fit, beside the reads in flight, at the average size read so
    /// far (some read must have finished).
    fn fits(&self, reads: u64, budget: u64, max_items: u64) -> bool {
        self.ready.len() as u64 + self.in_flight + reads <= max_items
            && self.buffered + (self.in_flight + reads) * self.average() <= budget
    }

    /// The average size of the reads finished so far, rounded up (some must have finished).
    fn average(&self) -> u64 {
        self.finished_bytes.div_ceil(self.finished)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};

    /// A source of `n` samples of `size` bytes that counts its reads and the bytes it has handed
    /// out and that are not yet taken back (`held`, with its peak).
    struct Counted {
        size: u64,
        reads: AtomicU64,
        held: AtomicU64,
        peak: AtomicU64,
        /// Reads running right now, and the most at once.
        reading: AtomicU64,
        most_reading: AtomicU64,
        /// How long each read waits, as on a slow file system.
        latency: std::time::Duration,
    }

    impl Counted {
        fn new(size: u64) -> Counted {
            Counted::slow(size, std::time::Duration::ZERO)
        }

        fn slow(size: u64, latency: std::time::Duration) -> Counted {
            Counted {
                latency,
                size,
                reads: AtomicU64::new(0),
                held: AtomicU64::new(0),
                peak: AtomicU64::new(0),
                reading: AtomicU64::new(0),
                most_reading: AtomicU64::new(0),
            }
        }

        fn read(&self, i: usize) -> (Vec<u8>, u64) {
            let now = self.reading.fetch_add(1, Ordering::SeqCst) + 1;
            self.most_reading.fetch_max(now, Ordering::SeqCst);
            std::thread::sleep(self.latency);
            self.reads.fetch_add(1, Ordering::SeqCst);
            let held = self.held.fetch_add(self.size, Ordering::SeqCst) + self.size;
            self.peak.fetch_max(held, Ordering::SeqCst);
            let item = vec![i as u8; self.size as usize];
            self.reading.fetch_sub(1, Ordering::SeqCst);
            (item, self.size)
        }

        fn take(&self, readahead: &Readahead<Vec<u8>>, i: usize) -> Vec<u8> {
            let item = readahead.take(i).expect("no reader failed");
            self.held.fetch_sub(self.size, Ordering::SeqCst);
            item
        }

        /// Takes the samples of `range` in order, checking each is the one asked for.
        fn take_in_order(&self, readahead: &Readahead<Vec<u8>>, range: Range<usize>) {
            for i in range {
                assert_eq!(self.take(readahead, i)[0], i as u8, "sample {i}");
            }
        }

        fn reads(&self) -> u64 {
            self.reads.load(Ordering::SeqCst)
        }

        /// Waits (up to a minute) until `n` reads have been made. Before a `wait_idle` that
        /// should find more reads: `wait_idle` alone returns after 100 ms without a change,
        /// which a reader descheduled that long on a loaded machine (the whole test suite at
        /// once) looks like.
        fn read_at_least(&self, n: u64) {
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
            while self.reads() < n {
                assert!(std::time::Instant::now() < deadline, "only {} of {n} reads made", self.reads());
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        }

        /// Checks that the readers of `readahead` make exactly `n` reads in all and then stop:
        /// waits for `n`, then until they are idle, then counts again.
        fn settles_at(&self, readahead: &Readahead<Vec<u8>>, n: u64, what: &str) {
            self.read_at_least(n);
            readahead.wait_idle();
            assert_eq!(self.reads(), n, "{what}");
        }
    }

    /// Runs `readers` threads serving `0..n` from `source` while `consume` takes from them.
    fn with_readers<R>(
        source: &Counted,
        n: usize,
        budget: u64,
        readers: usize,
        consume: impl FnOnce(&Readahead<Vec<u8>>) -> R,
    ) -> R {
        with_capped_readers(source, n, (budget, usize::MAX), readers, consume)
    }

    /// [`with_readers`] with a cap on the samples held as well as a budget.
    fn with_capped_readers<R>(
        source: &Counted,
        n: usize,
        (budget, max_items): (u64, usize),
        readers: usize,
        consume: impl FnOnce(&Readahead<Vec<u8>>) -> R,
    ) -> R {
        // Stopped however `consume` ends: a failed assertion in it must fail the test, not leave
        // the scope waiting for readers that wait for room.
        struct Stop<'a>(&'a Readahead<Vec<u8>>);
        impl Drop for Stop<'_> {
            fn drop(&mut self) {
                self.0.stop();
            }
        }
        let readahead = Readahead::new(0..n, budget, max_items);
        std::thread::scope(|scope| {
            for _ in 0..readers {
                scope.spawn(|| readahead.serve(|i| source.read(i)));
            }
            let _stop = Stop(&readahead);
            consume(&readahead)
        })
    }

    #[test]
    fn items_come_back_in_order_whatever_the_readers() {
        for readers in [1, 3, 16] {
            let source = Counted::new(10);
            let taken: Vec<u8> = with_readers(&source, 200, 100, readers, |readahead| {
                (0..200).map(|i| source.take(readahead, i)[0]).collect()
            });
            assert_eq!(taken, (0..200).map(|i| i as u8).collect::<Vec<_>>(), "{readers} readers");
            assert_eq!(source.reads(), 200, "each sample read once");
        }
    }

    #[test]
    fn the_stage_holds_no_more_than_its_budget() {
        // 16 readers, samples of 1,000 bytes, a budget of 20,000 bytes: room for 20, and a
        // reader is woken when a whole batch (8) fits. (With room for fewer than two batches
        // the batch is smaller, and a reader woken before the last of the eight takes could
        // refill the budget before them, so the reads made would depend on the interleaving.)
        let source = Counted::new(1000);
        with_readers(&source, 1000, 20_000, 16, |readahead| {
            // Nothing taken: the readers stop once the budget is full, whatever their number.
            source.settles_at(readahead, 20, "read ahead exactly what the budget holds");
            // Taking one makes room for one more, but the readers wait for room for a batch.
            assert_eq!(source.take(readahead, 0)[0], 0);
            source.settles_at(readahead, 20, "no reader woken for one read");
            // The eighth take frees a batch: only then is a reader woken, so exactly a batch
            // more is read, whenever the readers run.
            source.take_in_order(readahead, 1..WAKE_BATCH as usize);
            source.settles_at(readahead, 20 + WAKE_BATCH, "a batch taken, the budget filled again");
            source.take_in_order(readahead, WAKE_BATCH as usize..1000);
        });
        // Counted from outside, a read may start just before the consumer has counted the
        // sample it took as given back: one sample of slack.
        let peak = source.peak.load(Ordering::SeqCst);
        assert!(peak <= 20_000 + 1000, "held {peak} bytes at once with a budget of 20,000");
    }

    #[test]
    fn a_consumer_that_never_waits_is_served_by_one_read_at_a_time() {
        // 16 readers, 1 ms per read, and the consumer only takes what is already read: one
        // read in flight keeps up, so the others never run (each woken would read one file and
        // sleep again).
        let source = Counted::slow(1000, std::time::Duration::from_millis(1));
        with_readers(&source, 100, 20_000, 16, |readahead| {
            for batch in (0..100).step_by(20) {
                source.read_at_least(batch as u64 + 20);
                readahead.wait_idle();
                source.take_in_order(readahead, batch..batch + 20);
            }
        });
        assert_eq!(source.reads(), 100);
        assert_eq!(source.most_reading.load(Ordering::SeqCst), 1, "more than one read at once");
    }

    #[test]
    fn a_consumer_waiting_on_a_slow_source_gets_every_reader() {
        // 2 ms per read and a consumer that takes each sample at once: it waits every time,
        // and the reads in flight double until all 8 readers read.
        let source = Counted::slow(10, std::time::Duration::from_millis(2));
        with_readers(&source, 300, 1 << 20, 8, |readahead| source.take_in_order(readahead, 0..300));
        assert_eq!(source.reads(), 300);
        assert_eq!(source.most_reading.load(Ordering::SeqCst), 8, "not every reader was let read");
        // However many readers there are, no more reads at once than readers.
        let source = Counted::slow(10, std::time::Duration::from_millis(2));
        with_readers(&source, 100, 1 << 20, 3, |readahead| source.take_in_order(readahead, 0..100));
        assert_eq!(source.most_reading.load(Ordering::SeqCst), 3);
    }

    #[test]
    fn the_stage_holds_no_more_samples_than_its_cap() {
        // Samples of 10 bytes: the 100,000-byte budget would take 10,000 of them; the cap 50.
        let source = Counted::new(10);
        with_capped_readers(&source, 1000, (100_000, 50), 16, |readahead| {
            source.settles_at(readahead, 50, "read ahead exactly the cap");
            source.take_in_order(readahead, 0..WAKE_BATCH as usize);
            source.settles_at(readahead, 50 + WAKE_BATCH, "a batch taken, a batch more read");
            source.take_in_order(readahead, WAKE_BATCH as usize..1000);
        });
    }

    #[test]
    fn a_budget_that_holds_less_than_two_batches_is_refilled_when_half_of_it_is_free() {
        // Samples of 1 MB, a budget of 6 MB: the readers must not wait for room for a batch of
        // 8, which never comes before everything is taken (and then the consumer waits).
        let source = Counted::new(1 << 20);
        with_readers(&source, 100, 6 << 20, 16, |readahead| {
            source.settles_at(readahead, 6, "read ahead exactly what the budget holds");
            source.take_in_order(readahead, 0..2);
            source.settles_at(readahead, 6, "no reader woken while less than half is free");
            source.take_in_order(readahead, 2..3);
            source.settles_at(readahead, 9, "half of the budget free: refilled");
            source.take_in_order(readahead, 3..100);
        });
        // With room for fewer than two reads, each take wakes a reader.
        let source = Counted::new(1 << 20);
        with_readers(&source, 10, 3 << 20 >> 1, 4, |readahead| {
            for i in 0..10 {
                source.settles_at(readahead, i as u64 + 1, &format!("read {i} ahead"));
                source.take_in_order(readahead, i..i + 1);
            }
        });
    }

    #[test]
    fn a_sample_larger_than_the_budget_is_read_alone() {
        let source = Counted::new(1 << 20);
        with_readers(&source, 5, 1000, 8, |readahead| {
            for i in 0..5 {
                source.settles_at(readahead, i as u64 + 1, "one at a time");
                assert_eq!(source.take(readahead, i).len(), 1 << 20);
            }
        });
        // The stage never runs two of them at once. (Counted from outside, the next read may
        // start just before the consumer has counted the one it took as given back: `peak` can
        // see two, which the stage never holds.)
        assert_eq!(source.most_reading.load(Ordering::SeqCst), 1, "never two reads at once");
        assert!(source.peak.load(Ordering::SeqCst) <= 2 << 20);
    }

    #[test]
    fn stop_ends_the_readers_before_the_range_does() {
        let source = Counted::new(1);
        with_readers(&source, 1_000_000, 100, 4, |readahead| {
            assert_eq!(source.take(readahead, 0), [0]);
            readahead.stop();
        });
        // The scope has joined the readers: they returned long before a million reads.
        assert!(source.reads() <= 101 + 4, "{} reads", source.reads());
    }

    #[test]
    fn a_consumer_waiting_when_no_reader_will_come_is_told_so() {
        // The pipeline starts its consumer first; if the readers then cannot start, it stops the
        // readahead, and the consumer, already waiting, must return instead of hanging.
        let readahead: Readahead<Vec<u8>> = Readahead::new(0..10, 100, 10);
        std::thread::scope(|scope| {
            let waiting = scope.spawn(|| readahead.take(0));
            std::thread::sleep(std::time::Duration::from_millis(20));
            readahead.stop();
            assert_eq!(waiting.join().unwrap(), None);
        });
        assert!(!readahead.failed(), "stopped, not failed");
    }

    #[test]
    fn a_reader_that_panics_does_not_leave_the_consumer_waiting() {
        let readahead = Readahead::<u64>::new(0..10, 1000, usize::MAX);
        std::thread::scope(|scope| {
            let reader = scope.spawn(|| {
                readahead.serve(|i| {
                    assert!(i != 3, "reader fails on 3");
                    (i as u64, 1)
                })
            });
            for i in 0..3 {
                assert_eq!(readahead.take(i), Some(i as u64));
            }
            assert_eq!(readahead.take(3), None);
            assert!(reader.join().is_err());
        });
    }
}
