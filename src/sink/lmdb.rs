//! The LMDB sink. Layout: see [`imgpack_reader::lmdb`].
//!
//! Keys arrive sorted, so every record is inserted with `MDB_APPEND`: LMDB skips the B-tree
//! search and fills pages to the brim, which both speeds the load and keeps the file no larger
//! than the data. Syncing is deferred to [`Sink::finish`] (`MDB_NOSYNC`), where one
//! `fdatasync` makes the whole database durable before it is published — an unpublished
//! temporary is thrown away on a crash, so the per-commit syncs would buy nothing.
//!
//! # Small transactions
//!
//! A batch is committed in transactions of at most [`TXN_BYTES`] (256 KiB) of values. At
//! commit LMDB flushes the transaction's dirty pages with `writev` calls that gather up to 64
//! contiguous pages or overflow runs, so one transaction per 32 MiB batch meant `writev`s of
//! several MB each. On the 2-core VM the benchmarks run on, one multi-megabyte write into fresh
//! page cache costs several times the system time per byte of the same bytes in writes of a
//! few hundred KiB (the kernel allocates large folios for large writes, slow to get from a
//! guest whose free memory went back to the host): with one transaction per batch, packing the
//! `benches/pack_vs_tar.py` tree (15,000 JPEGs, 1.47 GB, warm cache) spent three quarters of
//! its time in `writev`. Measured A/B, alternating, 7 rounds after a warm-up, 5 s settle, as
//! the median wall time (min–max) and its ratio to a durable `tar -cf && sync` of the tree
//! (1.65 s, 1.59–2.05) in the same run:
//!
//! | LMDB writer | median s (min–max) | × tar |
//! |---|---:|---:|
//! | one transaction per batch | 2.95 (2.78–3.71) | 1.79 |
//! | the same, with the process's `writev` replaced by 64 KiB `write`s (until now) | 1.10 (1.00–1.88) | 0.67 |
//! | transactions of at most 512 KiB | 1.13 (0.75–1.65) | 0.68 |
//! | transactions of at most 256 KiB | 0.88 (0.83–2.27) | 0.53 |
//!
//! In another run (5 rounds), `MDB_WRITEMAP` (pages written through a shared mapping, no
//! `writev`) took 2.09× tar, 4 MiB transactions 1.44× and 1 MiB 1.19×. So 256 KiB it is: as fast
//! as replacing libc's `writev` for the whole process was, without touching anything outside
//! LMDB's own calls. A commit without sync costs one meta page write, ~1.6 % more bytes at
//! 256 KiB; the records, keys and values are the same whatever the transaction size.
//!
//! The map starts at the source size plus slack and doubles whenever LMDB reports it full; the
//! batch is then retried, so a user never sees `MDB_MAP_FULL`. The map size is address space,
//! not disk: `data.mdb` only grows as pages are written.
//!
//! # Writeback while packing
//!
//! With `MDB_NOSYNC` the committed pages only sit dirty in the page cache until the kernel's
//! own writeback gets to them (after 30 s by default) or until `finish` syncs: a run of a few
//! seconds left all its output, ~100 MB for 3,000 re-encoded images, to be written out by that
//! last `fdatasync`, while both cores had nothing left to do. So every [`WRITEBACK_BYTES`]
//! committed, the sink asks the kernel to start writing the file out
//! (`sync_file_range(SYNC_FILE_RANGE_WRITE)`, which queues the writes and does not wait for
//! them): the disk works while the cores encode, and the final sync waits only for the last
//! few megabytes. It changes when bytes reach the disk, not which.
//!
//! For `--resume`, every [`CHECKPOINT_BYTES`] of values (by default) the sink syncs the
//! database and the per-sample checksums so far ([`SUMS_FILE`]) and reports a
//! checkpoint.
//! A resumed sink reopens the database, deletes whatever was committed after the checkpoint,
//! and appends from there; the committed batches before it are kept as they are.

use std::fs::{self, File};
use std::io::Write;
use std::ops::Bound;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use heed::types::Bytes;
use heed::{Database, Env, EnvFlags, EnvOpenOptions, MdbError, PutFlags, RwTxn};
use imgpack_reader::checksum::{crc32, Table, TABLE_KEY};
use imgpack_reader::key::{format_key, META_KEY};
use imgpack_reader::Meta;

use super::{Durable, Finished, PackedSample, Sink};
use crate::pack::staged::Staged;
use crate::{Error, Result};

/// Writes an LMDB environment directory.
pub struct LmdbSink {
    staged: Staged,
    env: Env,
    db: Database<Bytes, Bytes>,
    map_size: usize,
    /// Each written sample's CRC-32, for the checksum table written at the end (4 bytes per
    /// sample: 5 MB for ImageNet).
    sums: Vec<u32>,
    /// How many of `sums` the sums file holds.
    saved_sums: usize,
    /// Value bytes committed since the last sync.
    unsynced: u64,
    checkpoint_bytes: u64,
    /// The background sync in flight, if any.
    pending: Option<PendingSync>,
    /// A checkpoint reached but not reported yet (samples durable).
    ready: Option<usize>,
    /// Value bytes committed since the map's pages were last released ([`release_map`]).
    unreleased: u64,
    /// The database file, for starting its writeback; `None` where LMDB cannot hand it out.
    data: Option<File>,
    /// Value bytes committed since writeback was last started.
    unflushed: u64,
}

/// A sync of the database running on its own thread, covering the first `samples` samples.
struct PendingSync {
    samples: usize,
    handle: std::thread::JoinHandle<heed::Result<()>>,
}

/// The per-sample checksums up to the last checkpoint, in the temporary directory (scratch:
/// never published).
pub const SUMS_FILE: &str = "imgpack-resume.sums";

/// Values written between two checkpoints by default: a sync every 256 MiB costs little next
/// to writing them, and an interrupted run loses at most that much work.
pub const CHECKPOINT_BYTES: u64 = 256 << 20;

const PAGE: usize = 4096;

/// Value bytes committed between two releases of the pages LMDB's map holds ([`release_map`]).
const RELEASE_BYTES: u64 = 64 << 20;

/// Value bytes committed per transaction, at most (a larger sample is a transaction of its own):
/// keeps LMDB's page flushes to `writev`s of a few hundred KiB (see the module docs).
pub const TXN_BYTES: u64 = 256 << 10;

/// Value bytes committed between two writeback starts (see the module docs): small enough that
/// the last `fdatasync` finds little left, large enough that the call costs nothing next to the
/// writes.
pub const WRITEBACK_BYTES: u64 = 8 << 20;

/// `batch` cut into consecutive runs of at most `limit` value bytes, each holding at least one
/// sample.
fn transactions(batch: &[PackedSample], limit: u64) -> impl Iterator<Item = &[PackedSample]> {
    let mut rest = batch;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let mut bytes = 0;
        let len = rest
            .iter()
            .position(|sample| {
                bytes += sample.bytes();
                bytes > limit
            })
            .unwrap_or(rest.len())
            .max(1);
        let (run, tail) = rest.split_at(len);
        rest = tail;
        Some(run)
    })
}

impl LmdbSink {
    /// Starts an LMDB output at `target`. `size_hint` is the expected data size in bytes,
    /// used to size the first map.
    pub fn create(target: &Path, overwrite: bool, size_hint: u64) -> Result<LmdbSink> {
        LmdbSink::start(Staged::create_dir(target, overwrite)?, size_hint, CHECKPOINT_BYTES)
    }

    /// Starts an LMDB output in a fresh staged directory, checkpointing every
    /// `checkpoint_bytes` of values.
    pub fn start(staged: Staged, size_hint: u64, checkpoint_bytes: u64) -> Result<LmdbSink> {
        let mut sink = LmdbSink::open(staged, size_hint, checkpoint_bytes)?;
        let sums = sink.staged.path().join(SUMS_FILE);
        File::create(&sums).map_err(Error::io(&sums))?;
        let err = |source| lmdb_error(sink.staged.path(), source);
        let mut txn = sink.env.write_txn().map_err(err)?;
        sink.db = sink.env.create_database(&mut txn, None).map_err(err)?;
        txn.commit().map_err(err)?;
        Ok(sink)
    }

    /// Reopens the database an interrupted run left in `staged` and cuts it back to the
    /// checkpoint `durable`: the keys run from `first_key` (0, or a part's first plan index), so
    /// records from key `format_key(first_key + durable.samples, key_width)` on are deleted
    /// (they were committed after the last sync, or belong to an interrupted finish).
    pub fn resume(
        staged: Staged,
        durable: &Durable,
        (first_key, key_width): (u64, usize),
        size_hint: u64,
        checkpoint_bytes: u64,
    ) -> Result<LmdbSink> {
        let data = staged.path().join("data.mdb");
        let on_disk = fs::metadata(&data).map_err(Error::io(&data))?.len();
        let mut sink = LmdbSink::open(staged, size_hint.max(on_disk), checkpoint_bytes)?;
        let dir = sink.staged.path().to_path_buf();
        let err = |source| lmdb_error(&dir, source);
        let stale = |reason: String| Error::Resume {
            path: dir.clone(),
            reason: format!("the interrupted run's database does not match its journal ({reason})"),
        };
        let mut txn = sink.env.write_txn().map_err(err)?;
        sink.db =
            sink.env.open_database(&txn, None).map_err(err)?.ok_or_else(|| stale("no database".into()))?;
        let first = format_key(first_key + durable.samples, key_width);
        let range = (Bound::Included(first.as_bytes()), Bound::Unbounded);
        sink.db.delete_range(&mut txn, &range).map_err(err)?;
        let last = sink.db.last(&txn).map_err(err)?.map(|(k, _)| String::from_utf8_lossy(k).into_owned());
        let expected_last = durable.samples.checked_sub(1).map(|n| format_key(first_key + n, key_width));
        if last.as_deref().map(|k| k.split('.').next().unwrap_or(k)) != expected_last.as_deref() {
            return Err(stale(format!(
                "its last record is {last:?}, the journal says {} samples",
                durable.samples
            )));
        }
        txn.commit().map_err(err)?;
        sink.env.force_sync().map_err(err)?;

        let sums_path = dir.join(SUMS_FILE);
        let raw = fs::read(&sums_path).map_err(Error::io(&sums_path))?;
        let keep = durable.samples as usize * 4;
        if raw.len() < keep {
            return Err(stale(format!("{SUMS_FILE} holds {} checksums", raw.len() / 4)));
        }
        sink.sums =
            raw[..keep].chunks_exact(4).map(|c| u32::from_le_bytes(c.try_into().expect("4"))).collect();
        sink.saved_sums = sink.sums.len();
        let file = fs::OpenOptions::new().write(true).open(&sums_path).map_err(Error::io(&sums_path))?;
        file.set_len(keep as u64).and_then(|()| file.sync_all()).map_err(Error::io(&sums_path))?;
        Ok(sink)
    }

    fn open(mut staged: Staged, size_hint: u64, checkpoint_bytes: u64) -> Result<LmdbSink> {
        staged.scratch(SUMS_FILE);
        let hint = usize::try_from(size_hint).unwrap_or(usize::MAX / 4);
        let map_size = round_to_page(hint.saturating_add(hint / 4).saturating_add(64 << 20));
        let path = staged.path().to_path_buf();
        let err = |source| lmdb_error(&path, source);
        let mut options = EnvOpenOptions::new();
        options.map_size(map_size);
        // SAFETY: the environment is a fresh temporary directory that only this sink opens.
        // NO_SYNC skips the fsync per commit; `finish` syncs once before publishing, and a crash
        // before that leaves only the temporary, which is discarded.
        let env = unsafe {
            options.flags(EnvFlags::NO_SYNC);
            options.open(&path)
        }
        .map_err(err)?;
        let txn = env.read_txn().map_err(err)?;
        // A placeholder handle until `start` creates the database or `resume` opens it: the
        // unnamed database always exists in an environment.
        let db = env.open_database(&txn, None).map_err(err)?.expect("the main database exists");
        drop(txn);
        // Only ever used to start writeback, never to write: heed's documented safe use.
        let data = env.try_clone_inner_file().ok();
        Ok(LmdbSink {
            staged,
            env,
            db,
            map_size,
            sums: Vec::new(),
            saved_sums: 0,
            unsynced: 0,
            checkpoint_bytes,
            pending: None,
            ready: None,
            unreleased: 0,
            data,
            unflushed: 0,
        })
    }

    /// Asks the kernel to start writing the database's dirty pages out, without waiting for
    /// them. A hint: if it fails, `finish`'s sync still writes everything.
    fn start_writeback(&self) {
        #[cfg(target_os = "linux")]
        if let Some(file) = &self.data {
            use std::os::fd::AsRawFd;
            // SAFETY: a valid open descriptor; the call only queues writeback of its pages.
            unsafe { libc::sync_file_range(file.as_raw_fd(), 0, 0, libc::SYNC_FILE_RANGE_WRITE) };
        }
    }

    fn put_all(&self, txn: &mut RwTxn, batch: &[PackedSample]) -> heed::Result<()> {
        let mut name = String::new();
        for sample in batch {
            for (ext, bytes) in &sample.fields {
                name.clear();
                name.push_str(&sample.key);
                name.push('.');
                name.push_str(ext);
                self.db.put_with_flags(txn, PutFlags::APPEND, name.as_bytes(), bytes)?;
            }
        }
        Ok(())
    }

    /// Runs `write` in a transaction, doubling the map and retrying while LMDB says it is full.
    fn transact(&mut self, write: impl Fn(&Self, &mut RwTxn) -> heed::Result<()>) -> Result<()> {
        loop {
            let mut txn = self.env.write_txn().map_err(|e| self.error(e))?;
            let result = write(self, &mut txn).and_then(|()| txn.commit());
            match result {
                Ok(()) => return Ok(()),
                Err(heed::Error::Mdb(MdbError::MapFull)) => self.grow()?,
                Err(e) => return Err(self.error(e)),
            }
        }
    }

    /// Waits for the background sync, if one is running, and records its checkpoint.
    fn join_pending(&mut self) -> Result<()> {
        let Some(pending) = self.pending.take() else { return Ok(()) };
        match pending.handle.join() {
            Ok(result) => result.map_err(|e| self.error(e))?,
            Err(_) => {
                return Err(Error::Panicked {
                    path: self.staged.path().to_path_buf(),
                    thread: "LMDB sync".into(),
                })
            }
        }
        self.save_sums(pending.samples)
    }

    /// Appends the checksums of samples up to `samples` to the sums file, syncs it, and marks
    /// them as the next checkpoint to report.
    fn save_sums(&mut self, samples: usize) -> Result<()> {
        let path = self.staged.path().join(SUMS_FILE);
        let bytes: Vec<u8> =
            self.sums[self.saved_sums..samples].iter().flat_map(|c| c.to_le_bytes()).collect();
        let mut file = fs::OpenOptions::new().append(true).open(&path).map_err(Error::io(&path))?;
        file.write_all(&bytes).and_then(|()| file.sync_data()).map_err(Error::io(&path))?;
        self.saved_sums = samples;
        self.ready = Some(samples);
        Ok(())
    }

    fn grow(&mut self) -> Result<()> {
        // Resizing remaps the file; let a background sync finish first.
        self.join_pending()?;
        let new_size = round_to_page(self.map_size.saturating_mul(2));
        // SAFETY: LMDB allows resizing while no transaction is open; the failed transaction was
        // dropped (aborted) before this call and this sink is the environment's only user.
        unsafe { self.env.resize(new_size) }.map_err(|e| self.error(e))?;
        self.map_size = new_size;
        Ok(())
    }

    fn error(&self, source: heed::Error) -> Error {
        lmdb_error(self.staged.path(), source)
    }
}

impl Sink for LmdbSink {
    fn write_batch(&mut self, batch: &[PackedSample]) -> Result<()> {
        for run in transactions(batch, TXN_BYTES) {
            self.transact(|sink, txn| sink.put_all(txn, run))?;
        }
        self.sums.extend(batch.iter().map(PackedSample::crc));
        let bytes = batch.iter().map(PackedSample::bytes).sum::<u64>();
        self.unsynced += bytes;
        self.unflushed += bytes;
        if self.unflushed >= WRITEBACK_BYTES {
            self.start_writeback();
            self.unflushed = 0;
        }
        self.unreleased += bytes;
        if self.unreleased >= RELEASE_BYTES {
            release_map(&self.staged.path().join("data.mdb"));
            self.unreleased = 0;
        }
        Ok(())
    }

    /// Every `checkpoint_bytes` a background thread syncs the database (an `fdatasync` that
    /// covers every batch committed before it) while the writer goes on; the checkpoint is
    /// reported once that sync is done. With `now`, it syncs on the spot.
    fn checkpoint(&mut self, now: bool) -> Result<Option<Durable>> {
        if now || self.pending.as_ref().is_some_and(|p| p.handle.is_finished()) {
            self.join_pending()?;
        }
        if now {
            if self.saved_sums < self.sums.len() {
                self.env.force_sync().map_err(|e| self.error(e))?;
                self.save_sums(self.sums.len())?;
            }
        } else if self.pending.is_none() && self.unsynced >= self.checkpoint_bytes {
            let env = self.env.clone();
            let handle = std::thread::Builder::new()
                .name("imgpack-lmdb-sync".into())
                .spawn(move || env.force_sync())
                .map_err(Error::io(self.staged.path()))?;
            self.pending = Some(PendingSync { samples: self.sums.len(), handle });
            self.unsynced = 0;
        }
        Ok(self.ready.take().map(|samples| Durable { samples: samples as u64, ..Durable::default() }))
    }

    fn finish(mut self: Box<Self>, meta: &Meta) -> Result<Finished> {
        self.join_pending()?;
        let json = serde_json::to_vec(meta).expect("metadata serialises");
        let table = Table { meta_crc32: crc32(&json), samples: std::mem::take(&mut self.sums) }.encode();
        self.transact(|sink, txn| {
            sink.db.put_with_flags(txn, PutFlags::APPEND, TABLE_KEY.as_bytes(), &table)?;
            sink.db.put_with_flags(txn, PutFlags::APPEND, META_KEY.as_bytes(), &json)
        })?;
        self.env.force_sync().map_err(|e| self.error(e))?;
        let LmdbSink { staged, env, .. } = *self;
        env.prepare_for_closing().wait();
        let data = staged.path().join("data.mdb");
        let bytes = std::fs::metadata(&data).map_err(Error::io(&data))?.len();
        // LMDB creates its files 0600; a dataset is meant to be shared, read-only.
        for file in ["data.mdb", "lock.mdb"] {
            let path = staged.path().join(file);
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644))
                .map_err(Error::io(&path))?;
        }
        let path = staged.target().to_path_buf();
        staged.publish()?;
        Ok(Finished { path, bytes, warnings: Vec::new() })
    }
}

/// Unmaps from this process the pages of `data` (the database file) that LMDB's memory map
/// holds, leaving them in the page cache.
///
/// LMDB reads pages through its map: every transaction starts by walking from the root to the
/// last leaf, and each fault maps the pages around it that are in the page cache too (the
/// kernel's fault-around, 64 KiB), which every page just written is. Over a run that maps a
/// good share of the file into the process: 210 MB of a 1.3 GB database of 1,000,000 small
/// images (`RssFile` in `/proc/PID/status`), which peak-RSS figures count as the run's memory
/// and which grows with the dataset. Dropping them now and then keeps that to what was touched
/// since (`MADV_DONTNEED` on a shared file mapping only drops this process's page-table entries:
/// the next read faults the same bytes back from the page cache, so LMDB sees no difference).
///
/// LMDB does not say where its map is (`mdb_env_info`'s `me_mapaddr` is only set for a fixed
/// map), so it is found in `/proc/self/maps` by the file's device and inode. Best effort: on
/// any failure nothing is released, which costs only memory.
fn release_map(data: &Path) {
    use std::os::unix::fs::MetadataExt;
    let (Ok(meta), Ok(maps)) = (fs::metadata(data), fs::read_to_string("/proc/self/maps")) else { return };
    for (start, end) in mappings_of(&maps, meta.dev(), meta.ino()) {
        // SAFETY: [start, end) is a whole mapping of the database file that LMDB made
        // read-only and shared (the environment is opened without MDB_WRITEMAP). Dropping its
        // page-table entries frees no memory anyone holds a reference into for longer than a
        // read: the writer thread, the only one using the environment, is here, and a later
        // access faults the same file bytes back in.
        unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_DONTNEED) };
    }
}

/// The address ranges in `maps` (the text of `/proc/self/maps`) that map the file with device
/// `dev` and inode `ino`.
fn mappings_of(maps: &str, dev: u64, ino: u64) -> Vec<(usize, usize)> {
    let (major, minor) = (libc::major(dev), libc::minor(dev));
    maps.lines()
        .filter_map(|line| {
            let mut fields = line.split_ascii_whitespace();
            let (range, _perms, _offset, device, inode) =
                (fields.next()?, fields.next()?, fields.next()?, fields.next()?, fields.next()?);
            let (maj, min) = device.split_once(':')?;
            let same_file = inode.parse::<u64>().ok()? == ino
                && u32::from_str_radix(maj, 16).ok()? == major
                && u32::from_str_radix(min, 16).ok()? == minor;
            let (start, end) = range.split_once('-')?;
            let range = (usize::from_str_radix(start, 16).ok()?, usize::from_str_radix(end, 16).ok()?);
            same_file.then_some(range)
        })
        .collect()
}

fn round_to_page(n: usize) -> usize {
    n.div_ceil(PAGE).saturating_mul(PAGE)
}

fn lmdb_error(path: &Path, source: heed::Error) -> Error {
    let errno = match &source {
        heed::Error::Io(e) => e.raw_os_error(),
        heed::Error::Mdb(MdbError::Other(code)) => Some(*code),
        _ => None,
    };
    if errno == Some(libc::EIO) {
        if let Some(hint) = short_write_cause(path).and_then(|cause| crate::error::space_hint(Some(cause))) {
            return Error::Lmdb { path: path.to_path_buf(), source, hint: hint.to_string() };
        }
    }
    let hint = match &source {
        heed::Error::Io(e) if crate::error::space_hint(e.raw_os_error()).is_some() => {
            crate::error::space_hint(e.raw_os_error()).unwrap_or_default().to_string()
        }
        heed::Error::Mdb(MdbError::Other(code)) if crate::error::space_hint(Some(*code)).is_some() => {
            crate::error::space_hint(Some(*code)).unwrap_or_default().to_string()
        }
        heed::Error::Mdb(MdbError::Invalid) => {
            "; the directory holds a damaged database: delete it".to_string()
        }
        _ => String::new(),
    };
    Error::Lmdb { path: path.to_path_buf(), source, hint }
}

/// Why a write into the database in `dir` fell short, when the cause shows: the file size
/// limit reached (`EFBIG`) or the file system full (`ENOSPC`).
///
/// LMDB writes its pages with `writev` and reports a write that stops short as `EIO`, without
/// the reason the kernel gives only to the next write. The user needs that reason (free space,
/// raise the limit), so it is looked for here.
fn short_write_cause(dir: &Path) -> Option<i32> {
    let data = dir.join("data.mdb");
    let size = fs::metadata(&data).ok()?.len();
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes the struct it is given.
    if unsafe { libc::getrlimit(libc::RLIMIT_FSIZE, &mut limit) } == 0
        && limit.rlim_cur != libc::RLIM_INFINITY
        && size.saturating_add(TXN_BYTES) >= limit.rlim_cur
    {
        return Some(libc::EFBIG);
    }
    (crate::fs::free_space(dir)? < 2 * TXN_BYTES).then_some(libc::ENOSPC)
}

#[cfg(test)]
mod tests {
    use super::*;
    use imgpack_reader::lmdb::LmdbDataset;
    use imgpack_reader::SourceInfo;

    /// The resident kB of the mapping at `addr`, from `/proc/self/smaps`.
    fn resident_kb(addr: usize) -> u64 {
        let smaps = fs::read_to_string("/proc/self/smaps").unwrap();
        let header = format!("{addr:x}-");
        let rest = &smaps[smaps.find(&header).expect("the mapping is listed")..];
        let rss = rest.lines().find(|l| l.starts_with("Rss:")).unwrap();
        rss.split_ascii_whitespace().nth(1).unwrap().parse().unwrap()
    }

    #[test]
    fn releasing_the_map_unmaps_its_pages_and_keeps_its_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("data.mdb");
        let bytes: Vec<u8> = (0..(1u32 << 20)).map(|i| (i % 251) as u8).collect();
        fs::write(&path, &bytes).unwrap();
        let file = File::open(&path).unwrap();
        let len = bytes.len();
        // SAFETY: a fresh read-only shared mapping of a file nobody else writes, unmapped below.
        let addr = unsafe {
            use std::os::fd::AsRawFd;
            libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ, libc::MAP_SHARED, file.as_raw_fd(), 0)
        };
        assert_ne!(addr, libc::MAP_FAILED);
        // SAFETY: the mapping is `len` bytes long and stays mapped until munmap below.
        let mapped = unsafe { std::slice::from_raw_parts(addr as *const u8, len) };
        assert_eq!(mapped, &bytes[..], "every page read, so every page mapped");
        assert!(resident_kb(addr as usize) >= 1024, "{} kB resident", resident_kb(addr as usize));
        release_map(&path);
        assert_eq!(resident_kb(addr as usize), 0, "no page of it left in this process");
        assert_eq!(mapped, &bytes[..], "the same bytes read back");
        // SAFETY: `mapped` is not used past this point.
        unsafe { libc::munmap(addr, len) };
    }

    #[test]
    fn mappings_are_found_by_device_and_inode() {
        let maps = "7f00a000-7f00c000 r--s 00000000 fd:01 1234 /tmp/x/data.mdb\n\
                    7f00c000-7f00d000 r--s 00002000 fd:01 1234 /tmp/x/data.mdb\n\
                    7f00d000-7f00e000 r--s 00000000 fd:01 999 /tmp/x/other\n\
                    7f00e000-7f00f000 rw-p 00000000 00:00 0\n";
        let dev = libc::makedev(0xfd, 1);
        assert_eq!(mappings_of(maps, dev, 1234), [(0x7f00a000, 0x7f00c000), (0x7f00c000, 0x7f00d000)]);
        assert!(mappings_of(maps, libc::makedev(8, 1), 1234).is_empty(), "another device");
    }

    fn sample(len: usize) -> PackedSample {
        PackedSample { key: "00000000".into(), fields: vec![("jpg".into(), vec![0; len])], crcs: Vec::new() }
    }

    #[test]
    fn batches_are_cut_into_transactions_of_bounded_bytes() {
        let lens =
            |batch: &[PackedSample], limit| transactions(batch, limit).map(<[_]>::len).collect::<Vec<_>>();
        let batch: Vec<_> = [100, 100, 100, 50, 300, 10].map(sample).into();
        assert_eq!(lens(&batch, 250), [2, 2, 1, 1], "runs of at most 250 bytes");
        // A sample larger than the limit is a transaction of its own; none is empty or lost.
        assert_eq!(lens(&batch, 1), [1; 6]);
        assert_eq!(lens(&batch, u64::MAX), [6]);
        assert!(lens(&[], 10).is_empty());
        let covered: usize = transactions(&batch, 250).map(<[_]>::len).sum();
        assert_eq!(covered, batch.len());
    }

    fn meta(samples: u64) -> Meta {
        Meta {
            format: imgpack_reader::lmdb::FORMAT_NAME.into(),
            version: imgpack_reader::FORMAT_VERSION,
            samples,
            key_width: 8,
            classes: vec!["a".into()],
            fields: vec!["cls".into(), "jpg".into()],
            source: SourceInfo { kind: "test".into(), root: "x".into() },
            options: serde_json::json!({}),
            tool: crate::TOOL.into(),
            checksum: Some(imgpack_reader::checksum::ALGORITHM.into()),
            shards: Vec::new(),
            part: None,
        }
    }

    #[test]
    fn a_tiny_map_grows_until_everything_fits() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("out.lmdb");
        // A hint of zero gives the smallest map; 300 MB of samples must still fit.
        let mut sink = Box::new(LmdbSink::create(&out, false, 0).unwrap());
        let value = vec![7u8; 1 << 20];
        for batch in 0..30u64 {
            let samples: Vec<_> = (0..10)
                .map(|i| PackedSample {
                    key: format!("{:08}", batch * 10 + i),
                    fields: vec![("cls".into(), b"0".to_vec()), ("jpg".into(), value.clone())],
                    crcs: Vec::new(),
                })
                .collect();
            sink.write_batch(&samples).unwrap();
        }
        let finished = sink.finish(&meta(300)).unwrap();
        assert!(finished.bytes > 300 << 20 && finished.bytes < 320 << 20, "{}", finished.bytes);
        let ds = LmdbDataset::open(&out).unwrap();
        assert_eq!(ds.len(), 300);
        assert_eq!(ds.get(299).unwrap().field("jpg").unwrap(), &value[..]);
    }
}
