//! `pack verify`: read a packed dataset end to end and name everything wrong with it.
//!
//! A dataset is checked against itself, the way the writer built it: the sample count against
//! the metadata, every sample's CRC-32 ([`imgpack_reader::checksum`]), every key in sequence
//! and present once, every label within the class list and agreeing with the sample's `.json`
//! record, and for WebDataset every shard's size and MD5, every tar header, every
//! `imgpack.index` entry and every DALI `.idx` line against the tar itself, and `shardindex.json`
//! against the shard list. With `decode`, every image is decoded too.
//!
//! Damage is reported, not raised: each problem names the sample (or file) and what is wrong,
//! and the check goes on, so one run lists all of them. Only a path that holds no dataset at
//! all is an error. Reading is the whole cost; shards are checked in parallel.

use std::fmt;
use std::path::{Path, PathBuf};

use imgpack_reader::checksum::{crc32, crc32_parts, Table, TABLE_KEY};
use imgpack_reader::format::{CLS_FIELD, JSON_FIELD, NPY_FIELD, NPY_ZSTD_FIELD};
use imgpack_reader::key::{format_key, split_field_name, META_KEY};
use imgpack_reader::webdataset::{
    dali_index_header, dali_index_line, is_shard_name, parse_member, DaliComponent, IndexEntry, IndexHeader,
    WidsIndex, BLOCK, END_OF_ARCHIVE, INDEX_ENTRY_LEN, INDEX_HEADER_LEN, META_FILE, SAMPLE_INDEX_FILE,
    WIDS_INDEX_FILE,
};
use imgpack_reader::{ImageFormat, Kind, Meta, SampleInfo, ShardInfo};
use md5::{Digest, Md5};
use rayon::prelude::*;
use serde::Serialize;

use crate::transcode::check::check;
use crate::transcode::decode::{decode, DecodeOptions};
use crate::transcode::encode::npy_shape;
use crate::{Error, Result};

/// What to check beyond the bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VerifyOptions {
    /// Decode every image (and check every `.npy` shape) as well.
    pub decode: bool,
    /// Worker threads.
    pub threads: usize,
}

/// One thing wrong with a dataset.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Problem {
    /// Where: `sample 00000042`, or a file name such as `shard-000001.tar`.
    pub place: String,
    /// What is wrong.
    pub reason: String,
}

/// The outcome of [`verify`].
#[derive(Debug, Clone, Serialize)]
pub struct Verified {
    /// Always `verify`, so a JSON consumer tells this record from a packing summary.
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// The dataset checked.
    pub path: PathBuf,
    /// Its format name from the metadata (`imgpack-lmdb`, `imgpack-webdataset`), if readable.
    pub format: String,
    /// Samples the metadata promises.
    pub expected: u64,
    /// Samples found and checked.
    pub checked: u64,
    /// Bytes of sample data read.
    pub bytes: u64,
    /// Whether images were decoded.
    pub decoded: bool,
    /// Everything wrong, in dataset order.
    pub problems: Vec<Problem>,
    /// Wall time in seconds.
    pub seconds: f64,
}

impl Verified {
    fn new(path: &Path, decoded: bool) -> Verified {
        Verified {
            kind: "verify",
            path: path.to_path_buf(),
            format: String::new(),
            expected: 0,
            checked: 0,
            bytes: 0,
            decoded,
            problems: Vec::new(),
            seconds: 0.0,
        }
    }

    /// Whether nothing is wrong.
    pub fn is_ok(&self) -> bool {
        self.problems.is_empty()
    }

    fn problem(&mut self, place: impl Into<String>, reason: impl Into<String>) {
        self.problems.push(Problem { place: place.into(), reason: reason.into() });
    }
}

impl fmt::Display for Verified {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = if self.decoded { "checksums, structure and images" } else { "checksums and structure" };
        writeln!(
            f,
            "{}: {} samples of {} checked ({}), {} of sample data, {:.1} s",
            self.path.display(),
            self.checked,
            self.expected,
            what,
            crate::pack::report::human_bytes(self.bytes),
            self.seconds
        )?;
        if self.problems.is_empty() {
            return writeln!(f, "ok: no problem found");
        }
        for p in &self.problems {
            writeln!(f, "  {}: {}", p.place, p.reason)?;
        }
        writeln!(
            f,
            "DAMAGED: {} problem{}; restore the dataset from a good copy or re-run `pack` to rebuild it",
            self.problems.len(),
            if self.problems.len() == 1 { "" } else { "s" }
        )
    }
}

/// Checks the dataset at `path` end to end. `progress` is called with the sample data bytes
/// read so far (for a progress bar); the total is [`dataset_bytes`].
pub fn verify(path: &Path, options: &VerifyOptions, progress: &(dyn Fn(u64) + Sync)) -> Result<Verified> {
    let started = std::time::Instant::now();
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(options.threads)
        .thread_name(|i| format!("imgpack-verify-{i}"))
        .build()
        .map_err(|e| Error::Usage(format!("cannot start {} worker threads: {e}", options.threads)))?;
    if imgpack_reader::is_unfinished(path) {
        return Err(Error::BadSource {
            path: path.to_path_buf(),
            reason: "is the temporary directory of a `pack` run that has not finished; verify its output once it is renamed into place".into(),
        });
    }
    let mut verified = Verified::new(path, options.decode);
    match imgpack_reader::detect(path) {
        Some(Kind::Lmdb) => pool.install(|| lmdb(path, options, &mut verified, progress))?,
        Some(Kind::WebDataset) => pool.install(|| webdataset(path, options, &mut verified, progress)),
        None => {
            return Err(Error::BadSource {
                path: path.to_path_buf(),
                reason: "neither data.mdb (LMDB) nor imgpack.json (WebDataset) inside; pass a directory written by `pack -o`".into(),
            })
        }
    }
    verified.seconds = started.elapsed().as_secs_f64();
    Ok(verified)
}

/// The bytes [`verify`] reads from the dataset at `path` (for progress), or 0 if unknown.
pub fn dataset_bytes(path: &Path) -> u64 {
    let size = |p: PathBuf| std::fs::metadata(p).map_or(0, |m| m.len());
    match imgpack_reader::detect(path) {
        Some(Kind::Lmdb) => size(path.join("data.mdb")),
        Some(Kind::WebDataset) => std::fs::read(path.join(META_FILE))
            .ok()
            .and_then(|raw| serde_json::from_slice::<Meta>(&raw).ok())
            .map_or(0, |meta| meta.shards.iter().map(|s| s.bytes).sum()),
        None => 0,
    }
}

/// Reads and checks the metadata; `None` (with the problem recorded) if it is unusable.
fn read_meta(raw: &[u8], place: &str, expected_format: &str, verified: &mut Verified) -> Option<Meta> {
    let meta: Meta = match serde_json::from_slice(raw) {
        Ok(meta) => meta,
        Err(e) => {
            verified.problem(place, format!("not valid dataset metadata: {e}"));
            return None;
        }
    };
    verified.format = meta.format.clone();
    verified.expected = meta.samples;
    // The readers' own test of what they can read, so verify and readers never disagree.
    if let Some(reason) = meta.unreadable(expected_format) {
        verified.problem(place, reason);
        return None;
    }
    if meta.checksum.is_none() {
        verified.problem(
            place,
            "records no checksums (written before format version 2); re-run `pack` to add them",
        );
    }
    Some(meta)
}

/// The checks every sample gets in both formats, on its fields in stored order. Returns the
/// problems found.
fn check_fields(fields: &[(&str, &[u8])], meta: &Meta, decode_images: bool) -> Vec<String> {
    let mut problems = Vec::new();
    let exts: Vec<&str> = fields.iter().map(|(ext, _)| *ext).collect();
    if !exts.is_sorted_by(|a, b| a < b) {
        problems.push(format!("fields {exts:?} are not sorted and unique"));
    }
    for ext in &exts {
        if !meta.fields.iter().any(|f| f == ext) {
            problems.push(format!("field {ext:?} is not among the metadata's fields {:?}", meta.fields));
        }
    }
    let field = |name: &str| fields.iter().find(|(ext, _)| *ext == name).map(|(_, data)| *data);
    let label = match field(CLS_FIELD) {
        None => {
            problems.push("no cls field".into());
            None
        }
        Some(raw) => match std::str::from_utf8(raw).ok().and_then(|s| s.parse::<u32>().ok()) {
            Some(label) if (label as usize) < meta.classes.len() => Some(label),
            Some(label) => {
                problems.push(format!("label {label} is outside the {} classes", meta.classes.len()));
                None
            }
            None => {
                problems.push(format!("cls field {:?} is not a class index", String::from_utf8_lossy(raw)));
                None
            }
        },
    };
    match field(JSON_FIELD).map(serde_json::from_slice::<SampleInfo>) {
        None => problems.push("no json field".into()),
        Some(Err(e)) => problems.push(format!("json field is not a sample record: {e}")),
        Some(Ok(info)) => {
            if let Some(label) = label {
                let class = &meta.classes[label as usize];
                if &info.class != class {
                    problems.push(format!(
                        "label {label} is class {class:?}, but the json record says {:?}",
                        info.class
                    ));
                }
            }
        }
    }
    let payloads: Vec<&(&str, &[u8])> = fields
        .iter()
        .filter(|(ext, _)| {
            ImageFormat::from_extension(ext).is_some() || *ext == NPY_FIELD || *ext == NPY_ZSTD_FIELD
        })
        .collect();
    match payloads[..] {
        [] => problems.push("no image field".into()),
        [(ext, data)] => {
            if decode_images {
                if let Err(reason) = decode_payload(ext, data) {
                    problems.push(format!("{ext} field does not decode: {reason}"));
                }
            }
        }
        _ => problems.push(format!("{} image fields; a sample holds one", payloads.len())),
    }
    problems
}

/// Decodes an image field (or checks a pixel array's shape against its size).
fn decode_payload(ext: &str, data: &[u8]) -> std::result::Result<(), String> {
    match ext {
        NPY_FIELD => {
            npy_shape(data).map(drop).ok_or_else(|| "not an .npy array of the size its header says".into())
        }
        NPY_ZSTD_FIELD => {
            let raw = zstd::stream::decode_all(data).map_err(|e| format!("zstd: {e}"))?;
            npy_shape(&raw).map(drop).ok_or_else(|| "not an .npy array of the size its header says".into())
        }
        _ => {
            let (format, _, _) = check(data)?;
            if Some(format) != ImageFormat::from_extension(ext) {
                return Err(format!("stored as .{ext} but holds a {format} image"));
            }
            let options = DecodeOptions { max_pixels: u64::MAX, ..DecodeOptions::default() };
            decode(data, format, &options, None).map(drop)
        }
    }
}

fn sample_place(key: &str) -> String {
    format!("sample {key}")
}

// ---------------------------------------------------------------------------------------------
// LMDB

fn lmdb(
    path: &Path,
    options: &VerifyOptions,
    verified: &mut Verified,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<()> {
    use heed::types::Bytes;
    use heed::Database;

    let data = "data.mdb";
    // Through the one LMDB opener, with the reader's flags (readahead off: `Ahead` makes up for
    // it), and shared with any reader of the dataset this process has open.
    let env = match imgpack_reader::lmdb::open_env(path) {
        Ok(env) => env,
        Err(imgpack_reader::Error::Lmdb { source: heed::Error::EnvAlreadyOpened, .. }) => {
            return Err(Error::Usage(format!(
                "{}: this program already has the dataset open for writing (LMDB allows one handle per process); check it after closing it",
                path.display()
            )))
        }
        Err(e) => {
            verified.problem(data, format!("LMDB cannot open it: {e}"));
            return Ok(());
        }
    };
    let lmdb_problem = |verified: &mut Verified, e: heed::Error| verified.problem(data, format!("LMDB: {e}"));
    let txn = match env.read_txn() {
        Ok(txn) => txn,
        Err(e) => {
            lmdb_problem(verified, e);
            return Ok(());
        }
    };
    let db: Database<Bytes, Bytes> = match env.open_database(&txn, None) {
        Ok(Some(db)) => db,
        Ok(None) => {
            verified.problem(data, "no main database");
            return Ok(());
        }
        Err(e) => {
            lmdb_problem(verified, e);
            return Ok(());
        }
    };
    let raw_meta = match db.get(&txn, META_KEY.as_bytes()) {
        Ok(Some(raw)) => raw,
        Ok(None) => {
            verified.problem(META_KEY, "missing: the run that wrote this dataset did not finish");
            return Ok(());
        }
        Err(e) => {
            lmdb_problem(verified, e);
            return Ok(());
        }
    };
    let Some(meta) = read_meta(raw_meta, META_KEY, imgpack_reader::lmdb::FORMAT_NAME, verified) else {
        return Ok(());
    };
    let sums = if meta.checksum.is_none() {
        None
    } else {
        match db.get(&txn, TABLE_KEY.as_bytes()) {
            Ok(Some(raw)) => match Table::decode(raw) {
                Ok(table) => {
                    if table.meta_crc32 != crc32(raw_meta) {
                        verified.problem(
                            META_KEY,
                            format!(
                                "its CRC-32 is {:08x}, {TABLE_KEY} records {:08x}",
                                crc32(raw_meta),
                                table.meta_crc32
                            ),
                        );
                    }
                    if table.samples.len() as u64 != meta.samples {
                        verified.problem(
                            TABLE_KEY,
                            format!("holds {} checksums for {} samples", table.samples.len(), meta.samples),
                        );
                    }
                    Some(table.samples)
                }
                Err(reason) => {
                    verified.problem(TABLE_KEY, reason);
                    None
                }
            },
            Ok(None) => {
                verified.problem(TABLE_KEY, "missing");
                None
            }
            Err(e) => {
                lmdb_problem(verified, e);
                None
            }
        }
    };

    let iter = match db.iter(&txn) {
        Ok(iter) => iter,
        Err(e) => {
            lmdb_problem(verified, e);
            return Ok(());
        }
    };
    // Samples are gathered in batches so their checks (CRC, and decoding with `decode`) run in
    // parallel, while the cursor walks the keys in order.
    let mut batch: Vec<LmdbSample<'_>> = Vec::new();
    let mut current: Option<LmdbSample<'_>> = None;
    let mut next_index = 0u64;
    let mut specials = Vec::new();
    let mut bytes = 0u64;
    let mut ahead = Ahead::new(&path.join(data));
    for entry in iter {
        let (name, value) = match entry {
            Ok(entry) => entry,
            Err(e) => {
                lmdb_problem(verified, e);
                break;
            }
        };
        bytes += value.len() as u64;
        let name_text = String::from_utf8_lossy(name);
        if name.starts_with(b"__") {
            specials.push(name_text.into_owned());
            continue;
        }
        if !specials.is_empty() {
            verified.problem(format!("record {name_text:?}"), "sorts after the dataset's own records");
            continue;
        }
        // The cursor walks the leaf pages; a lookup goes down the branch pages. Both must find
        // the same record, or readers that look keys up (all of them) miss it.
        if !matches!(db.get(&txn, name), Ok(Some(found)) if found.as_ptr() == value.as_ptr()) {
            verified.problem(
                format!("record {name_text:?}"),
                "a lookup by its key does not find it: the B-tree is damaged",
            );
        }
        let Some((key, ext)) = std::str::from_utf8(name).ok().and_then(split_field_name) else {
            verified.problem(format!("record {name_text:?}"), "is not {key}.{ext}");
            continue;
        };
        if current.as_ref().is_none_or(|s| s.key != key) {
            if let Some(done) = current.take() {
                batch.push(done);
            }
            // A key out of sequence: say which samples are missing, then check it as found.
            let parsed = key.parse::<u64>().ok().filter(|_| key.len() == meta.key_width);
            match parsed {
                Some(index) if index == next_index => {}
                Some(index) if index > next_index => verified.problem(
                    sample_place(&format_key(next_index, meta.key_width)),
                    if index - next_index == 1 {
                        "missing: no record is stored under its key".to_string()
                    } else {
                        format!(
                            "missing, with the {} samples after it: keys jump to {key}",
                            index - next_index - 1
                        )
                    },
                ),
                _ => verified.problem(
                    format!("record {name_text:?}"),
                    format!(
                        "key {key:?} is out of sequence: expected {}",
                        format_key(next_index, meta.key_width)
                    ),
                ),
            }
            let index = parsed.filter(|&i| i >= next_index).unwrap_or(next_index);
            next_index = index + 1;
            current = Some(LmdbSample { key, index, fields: Vec::new() });
        }
        current.as_mut().expect("set above").fields.push((ext, value));
        if batch.len() >= 256 {
            check_lmdb_batch(&mut batch, &meta, sums.as_deref(), options, verified);
            progress(bytes);
            ahead.reached(bytes);
        }
    }
    batch.extend(current.take());
    check_lmdb_batch(&mut batch, &meta, sums.as_deref(), options, verified);
    progress(bytes);
    verified.bytes = bytes;
    if next_index < meta.samples {
        verified.problem(
            sample_place(&format_key(next_index, meta.key_width)),
            format!(
                "missing, with every sample after it: the dataset ends at {next_index} of {} samples",
                meta.samples
            ),
        );
    } else if next_index > meta.samples {
        verified.problem(META_KEY, format!("says {} samples, {next_index} are stored", meta.samples));
    }
    let expected_specials: Vec<String> =
        if meta.checksum.is_some() { vec![TABLE_KEY.into(), META_KEY.into()] } else { vec![META_KEY.into()] };
    for name in specials.iter().filter(|n| !expected_specials.contains(n)) {
        verified.problem(format!("record {name:?}"), "is not a record imgpack writes");
    }
    Ok(())
}

/// Asks the kernel to read `data.mdb` ahead of the cursor. The map is opened with readahead
/// off (as the reader opens it), which would make a cold end-to-end check fault in one 4 KiB
/// page at a time; an `MDB_APPEND`-written database lies in the file in key order, so
/// the bytes checked so far say roughly where the cursor is.
struct Ahead {
    file: Option<std::fs::File>,
    advised: u64,
}

impl Ahead {
    const WINDOW: u64 = 64 << 20;

    fn new(path: &Path) -> Ahead {
        let mut ahead = Ahead { file: std::fs::File::open(path).ok(), advised: 0 };
        ahead.reached(0);
        ahead
    }

    fn reached(&mut self, offset: u64) {
        use std::os::fd::AsRawFd;
        let Some(file) = &self.file else { return };
        if offset + Self::WINDOW / 2 < self.advised {
            return;
        }
        let len = Self::WINDOW.min(i64::MAX as u64) as i64;
        // SAFETY: posix_fadvise only schedules reads of an open descriptor; the advice is advice.
        unsafe {
            libc::posix_fadvise(file.as_raw_fd(), self.advised as i64, len, libc::POSIX_FADV_WILLNEED);
        }
        self.advised = offset.max(self.advised) + Self::WINDOW;
    }
}

struct LmdbSample<'t> {
    key: &'t str,
    index: u64,
    fields: Vec<(&'t str, &'t [u8])>,
}

fn check_lmdb_batch(
    batch: &mut Vec<LmdbSample<'_>>,
    meta: &Meta,
    sums: Option<&[u32]>,
    options: &VerifyOptions,
    verified: &mut Verified,
) {
    let found: Vec<Vec<String>> = batch
        .par_iter()
        .map(|sample| {
            let mut problems = check_fields(&sample.fields, meta, options.decode);
            if let Some(&expected) = sums.and_then(|s| s.get(sample.index as usize)) {
                let actual = crc32_parts(sample.fields.iter().map(|(_, data)| *data));
                if actual != expected {
                    problems.insert(0, format!("CRC-32 is {actual:08x}, {TABLE_KEY} records {expected:08x}"));
                }
            }
            problems
        })
        .collect();
    for (sample, problems) in batch.iter().zip(found) {
        if sample.index < meta.samples {
            verified.checked += 1;
        }
        for reason in problems {
            verified.problem(sample_place(sample.key), reason);
        }
    }
    batch.clear();
}

// ---------------------------------------------------------------------------------------------
// WebDataset

fn webdataset(dir: &Path, options: &VerifyOptions, verified: &mut Verified, progress: &(dyn Fn(u64) + Sync)) {
    let raw_meta = match std::fs::read(dir.join(META_FILE)) {
        Ok(raw) => raw,
        Err(e) => return verified.problem(META_FILE, format!("cannot read it: {e}")),
    };
    let Some(meta) = read_meta(&raw_meta, META_FILE, imgpack_reader::webdataset::FORMAT_NAME, verified)
    else {
        return;
    };
    let entries = read_index(dir, &meta, crc32(&raw_meta), verified);
    check_shard_list(&meta, verified);
    check_wids(dir, &meta, verified);

    let read = std::sync::atomic::AtomicU64::new(0);
    let results: Vec<ShardCheck> = meta
        .shards
        .par_iter()
        .enumerate()
        .map(|(number, shard)| {
            let result = check_shard(dir, &meta, number, shard, &entries, options);
            let total = read.fetch_add(result.bytes, std::sync::atomic::Ordering::Relaxed) + result.bytes;
            progress(total);
            result
        })
        .collect();
    for result in results {
        verified.checked += result.checked;
        verified.bytes += result.bytes;
        verified.problems.extend(result.problems);
    }
    let listed: u64 = meta.shards.iter().map(|s| s.samples).sum();
    if listed != meta.samples {
        verified.problem(META_FILE, format!("its shards hold {listed} samples, it says {}", meta.samples));
    }
}

/// Reads `imgpack.index`, checks its header, and returns the entries it holds (as many as are
/// whole, even if that is not the count it should have).
fn read_index(dir: &Path, meta: &Meta, meta_crc: u32, verified: &mut Verified) -> Vec<IndexEntry> {
    let index = match std::fs::read(dir.join(SAMPLE_INDEX_FILE)) {
        Ok(index) => index,
        Err(e) => {
            verified.problem(SAMPLE_INDEX_FILE, format!("cannot read it: {e}"));
            return Vec::new();
        }
    };
    match IndexHeader::decode(&index) {
        None => verified.problem(SAMPLE_INDEX_FILE, "its header is not an imgpack.index header"),
        Some(header) => {
            if header.samples != meta.samples {
                verified.problem(
                    SAMPLE_INDEX_FILE,
                    format!("its header says {} samples, {META_FILE} says {}", header.samples, meta.samples),
                );
            }
            if meta.checksum.is_some() && header.meta_crc32 != meta_crc {
                verified.problem(
                    META_FILE,
                    format!(
                        "its CRC-32 is {meta_crc:08x}, {SAMPLE_INDEX_FILE} records {:08x}",
                        header.meta_crc32
                    ),
                );
            }
        }
    }
    let body = index.get(INDEX_HEADER_LEN..).unwrap_or_default();
    let expected = meta.samples.saturating_mul(INDEX_ENTRY_LEN as u64);
    if body.len() as u64 != expected {
        verified.problem(
            SAMPLE_INDEX_FILE,
            format!("holds {} bytes of entries, {} samples need {expected}", body.len(), meta.samples),
        );
    }
    body.chunks_exact(INDEX_ENTRY_LEN)
        .map(|chunk| IndexEntry::decode(chunk.try_into().expect("chunks_exact")))
        .collect()
}

/// The shard list must tile the samples in order, with names that stay inside the dataset.
fn check_shard_list(meta: &Meta, verified: &mut Verified) {
    let mut next = 0u64;
    for (n, shard) in meta.shards.iter().enumerate() {
        if !is_shard_name(&shard.name) || !shard.name.ends_with(".tar") {
            verified.problem(
                META_FILE,
                format!("shard {n} is named {:?}, which is not a shard file inside the dataset", shard.name),
            );
        }
        if shard.first != next {
            verified.problem(
                META_FILE,
                format!(
                    "shard {} starts at sample {}, the one before ends at {next}",
                    shard.name, shard.first
                ),
            );
        }
        next = shard.first.saturating_add(shard.samples);
    }
}

/// `shardindex.json` must be exactly what the writer makes of the shard list.
fn check_wids(dir: &Path, meta: &Meta, verified: &mut Verified) {
    let expected = WidsIndex::of(&meta.shards);
    match std::fs::read(dir.join(WIDS_INDEX_FILE)) {
        Err(e) => verified.problem(WIDS_INDEX_FILE, format!("cannot read it: {e}")),
        Ok(raw) if raw != crate::encoding::json_bytes(&expected) => {
            let reason = match serde_json::from_slice::<WidsIndex>(&raw) {
                Err(e) => format!("not a wids shard index: {e}"),
                Ok(found) if found == expected => "differs from what pack writes (formatting)".to_string(),
                Ok(found) => {
                    match found.shardlist.iter().zip(&expected.shardlist).position(|(a, b)| a != b) {
                        Some(i) => format!(
                            "entry {i} is {:?}, the shard list says {:?}",
                            found.shardlist[i], expected.shardlist[i]
                        ),
                        None => "does not match the shard list in imgpack.json".to_string(),
                    }
                }
            };
            verified.problem(WIDS_INDEX_FILE, reason);
        }
        Ok(_) => {}
    }
}

#[derive(Default)]
struct ShardCheck {
    checked: u64,
    bytes: u64,
    problems: Vec<Problem>,
}

impl ShardCheck {
    fn problem(&mut self, place: impl Into<String>, reason: impl Into<String>) {
        self.problems.push(Problem { place: place.into(), reason: reason.into() });
    }
}

/// Checks one shard: its size and MD5, then its samples in order, each against the tar headers,
/// its index entry and its checksum; then the end blocks and the DALI index.
fn check_shard(
    dir: &Path,
    meta: &Meta,
    number: usize,
    shard: &ShardInfo,
    entries: &[IndexEntry],
    options: &VerifyOptions,
) -> ShardCheck {
    let mut out = ShardCheck::default();
    let name = shard.name.as_str();
    if !is_shard_name(name) {
        return out; // reported by check_shard_list; never read outside the dataset
    }
    let path = dir.join(name);
    let map = match std::fs::File::open(&path).and_then(|file| {
        // SAFETY: a read-only map of a dataset nothing writes while it is checked; every offset
        // below is bounds-checked against the map's length.
        unsafe { memmap2::Mmap::map(&file) }
    }) {
        Ok(map) => map,
        Err(e) => {
            out.problem(name, format!("cannot read it: {e}"));
            return out;
        }
    };
    let buf: &[u8] = &map;
    out.bytes = buf.len() as u64;
    if buf.len() as u64 != shard.bytes {
        out.problem(name, format!("is {} bytes, {META_FILE} says {}", buf.len(), shard.bytes));
    }
    let md5 = crate::encoding::hex(&Md5::digest(buf));
    if md5 != shard.md5 {
        out.problem(name, format!("MD5 is {md5}, {META_FILE} records {}", shard.md5));
    }

    let mut pos = 0usize;
    let mut dali = dali_index_header(shard.samples);
    for index in shard.first..shard.first.saturating_add(shard.samples) {
        let key = format_key(index, meta.key_width);
        let place = sample_place(&key);
        let entry = entries.get(index as usize).copied();
        // The tar's own view of the sample: its members from `pos` while their key is this one.
        let mut members: Vec<(&str, &[u8], usize)> = Vec::new();
        let mut end = pos;
        let mut tar_error = None;
        while end < buf.len() && buf[end..(end + BLOCK as usize).min(buf.len())].iter().any(|&b| b != 0) {
            match parse_member(buf, end) {
                Ok(member) => match split_field_name(member.name) {
                    Some((member_key, ext)) if member_key == key => {
                        members.push((ext, member.data, end));
                        end = member.next.min(buf.len());
                    }
                    Some(_) if !members.is_empty() => break,
                    _ => {
                        tar_error = Some(format!(
                            "the member at offset {end} is {:?}, expected {key}.*",
                            member.name
                        ));
                        break;
                    }
                },
                Err(reason) => {
                    tar_error = Some(format!("tar header at offset {end}: {reason}"));
                    break;
                }
            }
        }
        if let Some(reason) = &tar_error {
            out.problem(&place, reason.clone());
        } else if members.is_empty() {
            out.problem(&place, format!("missing from {name}: no member at offset {pos}"));
        }
        match entry {
            None => out.problem(&place, format!("no {SAMPLE_INDEX_FILE} entry")),
            Some(e) => {
                if e.shard as usize != number {
                    out.problem(
                        &place,
                        format!("{SAMPLE_INDEX_FILE} puts it in shard {}, it is in shard {number}", e.shard),
                    );
                }
                if tar_error.is_none() && (e.offset != pos as u64 || e.len != (end - pos) as u64) {
                    out.problem(
                        &place,
                        format!(
                            "{SAMPLE_INDEX_FILE} says bytes {}+{}, the tar holds it at {pos}+{}",
                            e.offset,
                            e.len,
                            end - pos
                        ),
                    );
                }
                if meta.checksum.is_some() {
                    let actual = crc32(&buf[pos..end]);
                    if actual != e.crc32 {
                        out.problem(
                            &place,
                            format!("CRC-32 is {actual:08x}, {SAMPLE_INDEX_FILE} records {:08x}", e.crc32),
                        );
                    }
                }
            }
        }
        if tar_error.is_none() && !members.is_empty() {
            let fields: Vec<(&str, &[u8])> = members.iter().map(|(ext, data, _)| (*ext, *data)).collect();
            for reason in check_fields(&fields, meta, options.decode) {
                out.problem(&place, reason);
            }
            out.checked += 1;
        }
        let components: Vec<DaliComponent> = members
            .iter()
            .map(|(ext, data, header)| DaliComponent {
                ext: ext.to_string(),
                offset: (*header as u64) + BLOCK,
                size: data.len() as u64,
                name: format!("{key}.{ext}"),
            })
            .collect();
        dali.push_str(&dali_index_line(&components));
        // Go on from where the tar says the sample ends; if its header is unreadable, trust the
        // index entry's length so the samples after it are still checked.
        pos = if tar_error.is_none() {
            end
        } else {
            entry
                .and_then(|e| usize::try_from(e.offset.saturating_add(e.len)).ok())
                .filter(|&p| p > pos && p <= buf.len())
                .unwrap_or(buf.len())
        };
    }
    let tail = buf.get(pos..).unwrap_or_default();
    if tail.len() as u64 != END_OF_ARCHIVE || tail.iter().any(|&b| b != 0) {
        let zeros = tail.iter().take_while(|&&b| b == 0).count();
        out.problem(
            name,
            format!(
                "after its last sample come {} bytes ({zeros} of them zero before anything else); a shard ends with exactly {END_OF_ARCHIVE} zero bytes",
                tail.len()
            ),
        );
    }
    // The writer names it after the shard: `shard-000003.tar` -> `shard-000003.idx`.
    let idx_name = format!("{}.idx", name.strip_suffix(".tar").unwrap_or(name));
    match std::fs::read(dir.join(&idx_name)) {
        Err(e) => out.problem(&idx_name, format!("cannot read it: {e}")),
        Ok(raw) if raw != dali.as_bytes() => {
            let text = String::from_utf8_lossy(&raw);
            let line = text.lines().zip(dali.lines()).position(|(a, b)| a != b);
            let reason = match line {
                Some(i) => format!(
                    "line {} is {:?}, the tar says {:?}",
                    i + 1,
                    text.lines().nth(i).unwrap_or_default(),
                    dali.lines().nth(i).unwrap_or_default()
                ),
                None => format!("has {} lines, the tar needs {}", text.lines().count(), dali.lines().count()),
            };
            out.problem(&idx_name, reason);
        }
        Ok(_) => {}
    }
    out
}
