//! The LMDB layout and its reader.
//!
//! # Layout
//!
//! A dataset is an LMDB environment directory (`data.mdb`, `lock.mdb`) with one unnamed
//! database. Every field of every sample is a record under `{key}.{ext}` (see [`crate::key`]),
//! e.g. `00000042.cls`, `00000042.jpg`, `00000042.json`; the record [`META_KEY`] holds the
//! [`Meta`] JSON and is written last. Keys sort as sample order, so one cursor
//! `set_range(b"00000042.")` lands on sample 42's first field and its fields follow it.
//!
//! Readers open the environment read-only and without the lock file: a published dataset is
//! never written again, and this way it also reads from read-only and shared mounts. They open it
//! through [`open_env`] (in `env.rs`), the one place that opens LMDB, which also lets two readers
//! of one path in one process share the environment that heed allows only once.
//!
//! # Cold reads
//!
//! The map is opened without readahead (LMDB's `MDB_NORDAHEAD`, py-lmdb's `readahead=False`):
//! with it, every random read pulls in the pages around it too, wasting device bandwidth on
//! bytes nobody asked for. Without it, though, an ~80 kB image spans ~20 pages and touching it
//! through the map faults them in one device read at a time. So [`Snapshot::get`] first asks
//! the kernel for each value's whole byte range (`madvise(MADV_WILLNEED)`), which it fetches
//! as one request: a cold read then costs about one positioned read of the same size.
//! [`Prefetch::None`] turns that off, for benchmarks that show the difference.

use std::borrow::Cow;
use std::path::Path;
use std::sync::Arc;
use std::sync::OnceLock;

use heed::types::Bytes;
use heed::{Database, Env, RoTxn, WithoutTls};

pub(crate) mod env;

pub use env::open_env;

use crate::key::{format_key, is_valid_extension, split_field_name, META_KEY};
use crate::{Error, Field, Meta, Result, Sample, FORMAT_VERSION};

/// The `format` value in the metadata of an LMDB dataset.
pub const FORMAT_NAME: &str = "imgpack-lmdb";

/// An LMDB dataset written by `pack`, open for reading. `Send + Sync`: share it across threads
/// (behind an `Arc` or by reference) and read from all of them at once.
pub struct LmdbDataset {
    path: Arc<Path>,
    /// Shared with every other handle on this environment in the process ([`open_env`]).
    env: Arc<Env<WithoutTls>>,
    db: Database<Bytes, Bytes>,
    meta: Meta,
    /// CRC-32 of the `__meta__` record as read.
    meta_crc32: u32,
    prefetch: Prefetch,
    /// Each sample's CRC-32, when reads are verified.
    sums: Option<Vec<u32>>,
}

/// How [`Snapshot::get`] brings a value that is not in the page cache into memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Prefetch {
    /// Ask for each value's whole byte range before touching it (`madvise(MADV_WILLNEED)`):
    /// one device read per value. The default.
    #[default]
    Value,
    /// Touch the map only: with readahead off, one device read per 4 KiB page of the value.
    /// This is what a plain LMDB reader with `readahead=False` does; it exists so benchmarks
    /// can show what [`Prefetch::Value`] saves.
    None,
}

impl std::fmt::Debug for LmdbDataset {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LmdbDataset").field("path", &self.path).field("samples", &self.meta.samples).finish()
    }
}

impl LmdbDataset {
    /// Opens the LMDB dataset in directory `path`.
    pub fn open(path: impl AsRef<Path>) -> Result<LmdbDataset> {
        LmdbDataset::open_with(path, Prefetch::Value)
    }

    /// Opens the LMDB dataset in directory `path`, reading cold values as `prefetch` says.
    ///
    /// The `__meta__` record is checked before anything trusts it: it must parse (with a sane
    /// `key_width`, see [`Meta::key_width`]), name this format, a known version and a known
    /// checksum algorithm, and promise no more samples than the database holds (see
    /// `missing_samples`). A damaged record is [`Error::BadMeta`] or [`Error::NotADataset`],
    /// never a panic or an allocation sized by it. LMDB's own pages are liblmdb's to check.
    ///
    /// The environment comes from [`open_env`], so opening a dataset that is already open in
    /// this process (by another `open`, or by anything else that opens through [`open_env`])
    /// succeeds and shares its environment.
    pub fn open_with(path: impl AsRef<Path>, prefetch: Prefetch) -> Result<LmdbDataset> {
        let path: Arc<Path> = Arc::from(path.as_ref());
        crate::unfinished::refuse(&path)?;
        let env = open_env(&path)?;
        let lmdb_err = |source| Error::Lmdb { path: path.to_path_buf(), source };
        let txn = env.read_txn().map_err(lmdb_err)?;
        let db: Database<Bytes, Bytes> =
            env.open_database(&txn, None).map_err(lmdb_err)?.ok_or_else(|| Error::NotADataset {
                path: path.to_path_buf(),
                reason: "no main database".into(),
            })?;
        let raw = db.get(&txn, META_KEY.as_bytes()).map_err(lmdb_err)?.ok_or_else(|| Error::NotADataset {
            path: path.to_path_buf(),
            reason: format!(
                "no {META_KEY} record, so the run that wrote it did not finish; re-run `pack` with --overwrite"
            ),
        })?;
        let meta: Meta = serde_json::from_slice(raw)
            .map_err(|source| Error::BadMeta { path: path.to_path_buf(), source })?;
        let meta_crc32 = crate::checksum::crc32(raw);
        if let Some(reason) = meta.unreadable(FORMAT_NAME) {
            return Err(Error::NotADataset { path: path.to_path_buf(), reason });
        }
        if let Some(reason) = missing_samples(&db, &txn, &meta).map_err(lmdb_err)? {
            return Err(Error::NotADataset { path: path.to_path_buf(), reason });
        }
        drop(txn);
        Ok(LmdbDataset { path, env, db, meta, meta_crc32, prefetch, sums: None })
    }

    /// Makes [`Snapshot::get`] (and so [`LmdbDataset::get`] and iteration) check each sample's
    /// CRC-32 against the dataset's checksum table ([`crate::checksum`]) and fail with
    /// [`Error::Checksum`] on a mismatch. It loads the table (4 bytes per sample) and checks
    /// that it matches the metadata; each read then costs one extra pass over the sample's bytes
    /// at memory speed. Fails with [`Error::NoChecksums`] for a dataset written before
    /// checksums existed.
    pub fn verify_checksums(mut self, on: bool) -> Result<LmdbDataset> {
        if !on {
            self.sums = None;
            return Ok(self);
        }
        if self.meta.checksum.is_none() {
            return Err(Error::NoChecksums { path: self.path.to_path_buf() });
        }
        self.sums = Some(self.checksum_table()?.samples);
        Ok(self)
    }

    /// The dataset's checksum table, checked against the metadata it covers.
    pub fn checksum_table(&self) -> Result<crate::checksum::Table> {
        use crate::checksum::{Table, TABLE_KEY};
        let bad = |reason: String| Error::NotADataset { path: self.path.to_path_buf(), reason };
        let txn = self.env.read_txn().map_err(|e| self.lmdb_err(e))?;
        let raw = self.db.get(&txn, TABLE_KEY.as_bytes()).map_err(|e| self.lmdb_err(e))?;
        let table = Table::decode(raw.ok_or_else(|| bad(format!("no {TABLE_KEY} record")))?)
            .map_err(|reason| bad(format!("{TABLE_KEY}: {reason}")))?;
        if table.samples.len() as u64 != self.meta.samples {
            return Err(bad(format!(
                "{TABLE_KEY} holds {} checksums for {} samples",
                table.samples.len(),
                self.meta.samples
            )));
        }
        if table.meta_crc32 != self.meta_crc32 {
            return Err(bad(format!(
                "{META_KEY} does not have the CRC-32 that {TABLE_KEY} records: one of them is damaged; restore the dataset from a good copy or re-run `pack`"
            )));
        }
        Ok(table)
    }

    /// The dataset directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The dataset metadata.
    pub fn meta(&self) -> &Meta {
        &self.meta
    }

    /// The number of samples.
    pub fn len(&self) -> u64 {
        self.meta.samples
    }

    /// Whether the dataset holds no sample.
    pub fn is_empty(&self) -> bool {
        self.meta.samples == 0
    }

    /// Class names in class-index order.
    pub fn classes(&self) -> &[String] {
        &self.meta.classes
    }

    /// A consistent read snapshot: samples read through it borrow their bytes from the memory
    /// map instead of copying them. Hold it for a batch of reads, not for a whole epoch.
    pub fn snapshot(&self) -> Result<Snapshot<'_>> {
        let txn = self.env.read_txn().map_err(|source| self.lmdb_err(source))?;
        Ok(Snapshot { dataset: self, txn })
    }

    /// Sample `index`, with its bytes copied out of the map.
    pub fn get(&self, index: u64) -> Result<Sample<'static>> {
        Ok(self.snapshot()?.get(index)?.into_owned())
    }

    /// Every sample in index order, each copied out of the map.
    pub fn iter(&self) -> Result<Iter<'_>> {
        Ok(Iter { snapshot: self.snapshot()?, next: 0 })
    }

    fn lmdb_err(&self, source: heed::Error) -> Error {
        Error::Lmdb { path: self.path.to_path_buf(), source }
    }
}

/// Why the database cannot hold the `meta.samples` samples its metadata promises, if it cannot.
///
/// `len()` and iteration trust the sample count, and callers size buffers by it, so a damaged
/// `__meta__` claiming 10^18 samples must fail here, not as a billion errors or an allocation
/// later. Two cheap checks, both B-tree lookups that read no value: every sample takes at least
/// one record besides `__meta__` (LMDB counts records in its header), and the last sample's key
/// is present (keys run with no gap, so a database cut short lacks it).
fn missing_samples(
    db: &Database<Bytes, Bytes>,
    txn: &RoTxn<'_, WithoutTls>,
    meta: &Meta,
) -> heed::Result<Option<String>> {
    let Some(last) = meta.samples.checked_sub(1) else { return Ok(None) };
    let records = db.len(txn)?;
    if meta.samples >= records {
        return Ok(Some(format!(
            "{META_KEY} says {} samples, but the database holds only {records} records in all; it is damaged, re-run `pack`",
            meta.samples
        )));
    }
    let prefix = format!("{}.", format_key(last, meta.key_width));
    if db.prefix_iter(txn, prefix.as_bytes())?.next().transpose()?.is_none() {
        return Ok(Some(format!(
            "{META_KEY} says {} samples, but the last one ({prefix}*) is not stored; the database is damaged or cut short, re-run `pack`",
            meta.samples
        )));
    }
    Ok(None)
}

/// A read transaction over an [`LmdbDataset`]; samples from it borrow from the memory map.
pub struct Snapshot<'d> {
    dataset: &'d LmdbDataset,
    txn: RoTxn<'d, WithoutTls>,
}

impl<'d> Snapshot<'d> {
    /// Sample `index`, its fields pointing into the memory map (no copy).
    ///
    /// Every record under `{key}.` is one field; its extension must be a valid one
    /// ([`crate::key::is_valid_extension`]), so a record such as `00000042./../../x` is
    /// [`Error::BadSample`] rather than a field whose name climbs out of wherever it is written.
    pub fn get(&self, index: u64) -> Result<Sample<'_>> {
        self.dataset.get_in(&self.txn, index)
    }
}

impl LmdbDataset {
    /// A read transaction that holds its own handle on the environment, for samples that must
    /// outlive any borrow of the dataset ([`crate::shared`]).
    pub(crate) fn static_txn(&self) -> Result<RoTxn<'static, WithoutTls>> {
        Env::clone(&self.env).static_read_txn().map_err(|source| self.lmdb_err(source))
    }

    /// Sample `index` as found in `txn`, its fields pointing into the map; see [`Snapshot::get`].
    pub(crate) fn get_in<'t>(&self, txn: &'t RoTxn<'_, WithoutTls>, index: u64) -> Result<Sample<'t>> {
        let ds = self;
        if index >= ds.meta.samples {
            return Err(Error::OutOfRange { path: ds.path.to_path_buf(), index, len: ds.meta.samples });
        }
        let key = format_key(index, ds.meta.key_width);
        let prefix = format!("{key}.");
        let mut fields = Vec::with_capacity(3);
        let iter = ds.db.prefix_iter(txn, prefix.as_bytes()).map_err(|e| ds.lmdb_err(e))?;
        for entry in iter {
            let (name, data) = entry.map_err(|e| ds.lmdb_err(e))?;
            let ext = std::str::from_utf8(name)
                .ok()
                .and_then(split_field_name)
                .filter(|(_, ext)| is_valid_extension(ext))
                .map(|(_, ext)| ext.to_string())
                .ok_or_else(|| Error::BadSample {
                    path: ds.path.to_path_buf(),
                    key: key.clone(),
                    reason: format!("record name {:?} is not {{key}}.{{ext}}", String::from_utf8_lossy(name)),
                })?;
            if ds.prefetch == Prefetch::Value {
                will_need(data);
            }
            fields.push(Field { ext, data: Cow::Borrowed(data) });
        }
        if fields.is_empty() {
            return Err(Error::BadSample {
                path: ds.path.to_path_buf(),
                key,
                reason: "no record is stored under this key".into(),
            });
        }
        if let Some(sums) = &ds.sums {
            // `verify_checksums` checked there is one sum per sample; looked up without indexing
            // all the same, so no `index` can panic.
            let expected =
                usize::try_from(index).ok().and_then(|i| sums.get(i)).copied().ok_or_else(|| {
                    Error::BadSample {
                        path: ds.path.to_path_buf(),
                        key: key.clone(),
                        reason: format!("{} holds no checksum for it", crate::checksum::TABLE_KEY),
                    }
                })?;
            let actual = crate::checksum::crc32_parts(fields.iter().map(|f| &*f.data));
            if actual != expected {
                return Err(Error::Checksum { path: ds.path.to_path_buf(), key, expected, actual });
            }
        }
        Ok(Sample { index, key, fields, dataset: ds.path.clone() })
    }
}

/// Makes sure the pages under `data` (a slice of the map) are in memory before they are
/// touched: if any is missing, the kernel is asked for the whole range (`MADV_WILLNEED`) and
/// reads it in one request instead of one fault per page.
///
/// `mincore` of the first page first, because on a warm cache `MADV_WILLNEED` still walks every
/// page: about 2 µs per 100 kB value here, against ~1 µs for the one-page check (mostly the
/// system call itself). Values within one page
/// gain nothing and skip both calls. Neither call can fail the read: the advice is advice.
fn will_need(data: &[u8]) {
    static PAGE: OnceLock<usize> = OnceLock::new();
    let page = *PAGE.get_or_init(|| {
        // SAFETY: sysconf has no preconditions.
        let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        usize::try_from(size).ok().filter(|s| s.is_power_of_two()).unwrap_or(4096)
    });
    if data.len() <= page {
        return;
    }
    let start = data.as_ptr() as usize & !(page - 1);
    let len = data.as_ptr() as usize + data.len() - start;
    // A value has its overflow pages to itself and is read whole, so its pages come and go
    // together and the first stands for the rest (a partly cached value is still read
    // right, its missing pages one fault each).
    let mut resident = 0u8;
    // SAFETY: the page at `start` lies within the live map that `data` borrows from, and
    // `resident` has room for its one byte.
    let rc = unsafe { libc::mincore(start as *mut libc::c_void, page, &mut resident) };
    if rc == 0 && resident & 1 == 1 {
        return;
    }
    // SAFETY: [start, start + len) lies within the live map that `data` borrows from;
    // MADV_WILLNEED only schedules reads and changes no memory contents.
    unsafe {
        libc::madvise(start as *mut libc::c_void, len, libc::MADV_WILLNEED);
    }
}

/// Iterator over every sample of an [`LmdbDataset`] in index order, from one snapshot.
pub struct Iter<'d> {
    snapshot: Snapshot<'d>,
    next: u64,
}

impl Iterator for Iter<'_> {
    type Item = Result<Sample<'static>>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.next >= self.snapshot.dataset.len() {
            return None;
        }
        let item = self.snapshot.get(self.next).map(Sample::into_owned);
        self.next += 1;
        Some(item)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let left = usize::try_from(self.snapshot.dataset.len() - self.next).unwrap_or(usize::MAX);
        (left, Some(left))
    }
}

/// Writes a two-sample dataset for the crate's examples. Not part of the API.
#[doc(hidden)]
pub fn write_example(path: &Path) -> std::result::Result<(), Box<dyn std::error::Error>> {
    std::fs::create_dir_all(path)?;
    let env = env::create(path, 1 << 20)?;
    let mut txn = env.write_txn()?;
    let db: Database<Bytes, Bytes> = env.create_database(&mut txn, None)?;
    let samples =
        [("cat", "cat/tom.jpg", &b"\xFF\xD8\xFF\xE0"[..], "jpg"), ("dog", "dog/rex.png", b"\x89PNG", "png")];
    for (i, (class, rel, bytes, ext)) in samples.into_iter().enumerate() {
        let key = format_key(i as u64, 8);
        db.put(&mut txn, format!("{key}.cls").as_bytes(), i.to_string().as_bytes())?;
        db.put(&mut txn, format!("{key}.{ext}").as_bytes(), bytes)?;
        let info = crate::SampleInfo { path: rel.into(), class: class.into(), path_hex: None };
        db.put(&mut txn, format!("{key}.json").as_bytes(), &serde_json::to_vec(&info)?)?;
    }
    let meta = Meta {
        format: FORMAT_NAME.into(),
        version: FORMAT_VERSION,
        samples: 2,
        key_width: 8,
        classes: vec!["cat".into(), "dog".into()],
        fields: vec!["cls".into(), "jpg".into(), "json".into(), "png".into()],
        source: crate::SourceInfo { kind: "imagefolder".into(), root: "train".into() },
        options: serde_json::json!({}),
        tool: "example".into(),
        checksum: None,
        shards: Vec::new(),
        part: None,
    };
    db.put(&mut txn, META_KEY.as_bytes(), &serde_json::to_vec(&meta)?)?;
    txn.commit()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_send_sync<T: Send + Sync>() {}

    #[test]
    fn dataset_is_send_and_sync() {
        assert_send_sync::<LmdbDataset>();
    }

    #[test]
    fn reads_back_what_was_written() {
        let dir = tempfile::tempdir().unwrap();
        write_example(dir.path()).unwrap();
        let ds = LmdbDataset::open(dir.path()).unwrap();
        assert_eq!(ds.len(), 2);
        let snap = ds.snapshot().unwrap();
        let s = snap.get(0).unwrap();
        assert!(matches!(s.fields[0].data, Cow::Borrowed(_)));
        assert_eq!(s.label().unwrap(), 0);
        assert_eq!(s.image().unwrap().1, b"\xFF\xD8\xFF\xE0");
        assert!(matches!(snap.get(2), Err(Error::OutOfRange { index: 2, len: 2, .. })));
        let all: Vec<_> = ds.iter().unwrap().collect::<Result<_>>().unwrap();
        assert_eq!(all.len(), 2);
        assert_eq!(all[1].info().unwrap().class, "dog");
    }

    #[test]
    fn multi_page_values_read_the_same_with_and_without_prefetch() {
        let dir = tempfile::tempdir().unwrap();
        write_example(dir.path()).unwrap();
        let big: Vec<u8> = (0..50_000u32).map(|i| (i * 31 % 251) as u8).collect();
        {
            let env = env::create(dir.path(), 1 << 20).unwrap();
            let mut txn = env.write_txn().unwrap();
            let db: Database<Bytes, Bytes> = env.open_database(&txn, None).unwrap().unwrap();
            db.put(&mut txn, b"00000001.png", &big).unwrap();
            txn.commit().unwrap();
        }
        for prefetch in [Prefetch::Value, Prefetch::None] {
            let ds = LmdbDataset::open_with(dir.path(), prefetch).unwrap();
            let snap = ds.snapshot().unwrap();
            // Twice: the first read may find the pages missing, the second finds them cached.
            for _ in 0..2 {
                assert_eq!(snap.get(1).unwrap().image().unwrap().1, &big[..], "{prefetch:?}");
            }
            drop(snap);
            drop(ds);
        }
    }

    #[test]
    fn an_unfinished_runs_directory_never_opens_whatever_it_holds() {
        let dir = tempfile::tempdir().unwrap();
        let temp = dir.path().join(".train.lmdb.imgpack-tmp");
        write_example(&temp).unwrap();
        let err = LmdbDataset::open(&temp).unwrap_err().to_string();
        assert!(err.contains("has not finished") && err.contains("--resume"), "{err}");
        assert!(crate::open(&temp).is_err());
        // The same complete database under its final name opens.
        let done = dir.path().join("train.lmdb");
        std::fs::rename(&temp, &done).unwrap();
        assert_eq!(LmdbDataset::open(&done).unwrap().len(), 2);
    }

    #[test]
    fn a_directory_without_data_mdb_is_named_in_the_error() {
        let dir = tempfile::tempdir().unwrap();
        let err = LmdbDataset::open(dir.path()).unwrap_err().to_string();
        assert!(err.contains(&dir.path().display().to_string()), "{err}");
        assert!(err.contains("data.mdb"), "{err}");
    }

    #[test]
    fn a_database_without_meta_is_incomplete() {
        let dir = tempfile::tempdir().unwrap();
        {
            let env = env::create(dir.path(), 1 << 20).unwrap();
            let mut txn = env.write_txn().unwrap();
            let db: Database<Bytes, Bytes> = env.create_database(&mut txn, None).unwrap();
            db.put(&mut txn, b"00000000.cls", b"0").unwrap();
            txn.commit().unwrap();
        }
        let err = LmdbDataset::open(dir.path()).unwrap_err().to_string();
        assert!(err.contains("did not finish"), "{err}");
    }
}
