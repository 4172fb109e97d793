//! What the fuzz targets share: how one fuzz input becomes a dataset on disk, and the checks
//! every sample read back must pass whatever the input was.
//!
//! A dataset is several files, and libFuzzer hands a target one byte string, so an input is a
//! list of parts joined by [`SEP`]: for a WebDataset, a flags byte, `imgpack.json`,
//! `imgpack.index`, then one part per shard. Random bytes almost never get past the metadata's
//! CRC or the index length check, so the flags byte asks the harness to make some things
//! consistent again after the fuzzer mutated them (shard sizes, index length, CRCs): with
//! those set, the mutations reach the tar parser and the index entries; with them clear, they
//! test the checks at open. The seeds in `seeds/` are real `pack` outputs in this form
//! (`cargo run --example make_seeds`).

use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

use heed::types::Bytes;
use heed::{Database, EnvFlags, EnvOpenOptions};
use imgpack_reader::checksum::{crc32, crc32_parts, Table, TABLE_KEY};
use imgpack_reader::key::{format_key, is_valid_extension, META_KEY};
use imgpack_reader::webdataset::{
    IndexEntry, IndexHeader, INDEX_ENTRY_LEN, INDEX_HEADER_LEN, INDEX_VERSION, META_FILE, SAMPLE_INDEX_FILE,
};
use imgpack_reader::Sample;
use serde_json::{json, Value};

/// Separates the parts of an input. Bytes that neither JSON nor a ustar header produce.
pub const SEP: &[u8] = b"\n\xFF\xFEPART\xFE\xFF\n";

/// The most samples a harness reads or makes consistent per input: keeps one run short.
pub const MAX_SAMPLES: u64 = 512;

/// Flags of the first part: which consistency repairs to make before writing the dataset.
pub mod flags {
    /// WebDataset: set each listed shard's `bytes` to its part's length.
    pub const FIX_SHARD_SIZES: u8 = 1;
    /// WebDataset: cut or zero-pad the index to one entry per sample of the metadata.
    pub const FIX_INDEX_LEN: u8 = 2;
    /// WebDataset: set each index entry's CRC to that of the range it points at, if it is in a
    /// shard. LMDB: recompute the checksum table from the records.
    pub const FIX_CRCS: u8 = 4;
    /// WebDataset: write a valid index header with the metadata's sample count and CRC.
    /// LMDB: set the checksum table's metadata CRC.
    pub const FIX_HEADER: u8 = 8;
    /// Read with checksums verified.
    pub const VERIFY: u8 = 16;
}

/// Splits an input into its parts.
pub fn split(data: &[u8]) -> Vec<&[u8]> {
    let mut parts = Vec::new();
    let mut rest = data;
    while let Some(at) = rest.windows(SEP.len()).position(|w| w == SEP) {
        parts.push(&rest[..at]);
        rest = &rest[at + SEP.len()..];
    }
    parts.push(rest);
    parts
}

/// Joins parts into one input (what the seeds are made with).
pub fn join(parts: &[&[u8]]) -> Vec<u8> {
    parts.join(SEP)
}

static SCRATCH: OnceLock<PathBuf> = OnceLock::new();

/// A scratch directory of this process's own, on a RAM file system when there is one: every
/// run writes a dataset, and a disk would make that the slow part. It is removed when the
/// process exits normally (libFuzzer ends a timed run with `exit`); after a crash it stays,
/// holding the last dataset, under `/dev/shm/imgpack-fuzz-<pid>`.
pub fn scratch() -> &'static Path {
    SCRATCH.get_or_init(|| {
        let shm = Path::new("/dev/shm");
        let base = if shm.is_dir() { shm.to_path_buf() } else { std::env::temp_dir() };
        let dir = base.join(format!("imgpack-fuzz-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("scratch directory");
        extern "C" fn remove_scratch() {
            if let Some(dir) = SCRATCH.get() {
                let _ = std::fs::remove_dir_all(dir);
            }
        }
        // SAFETY: registers a plain function with no arguments, as atexit requires.
        unsafe { libc::atexit(remove_scratch) };
        dir
    })
}

/// A fresh, empty directory under [`scratch`] for one run.
pub fn fresh_dir(name: &str) -> PathBuf {
    static N: AtomicU64 = AtomicU64::new(0);
    let dir = scratch().join(format!("{name}-{}", N.fetch_add(1, Ordering::Relaxed)));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("run directory");
    dir
}

/// Writes the WebDataset of `data` (parts: flags, `imgpack.json`, `imgpack.index`, shards
/// named `shard-000000.tar`, ..., and again `part-0000-of-0001/shard-p0000-000000.tar`, ...)
/// into `dir`, and a copy of the first shard as `outside.tar`
/// next to it, so a shard name that climbs out (`../outside.tar`) would find a real shard. Returns
/// the flags.
pub fn write_webdataset(dir: &Path, data: &[u8]) -> u8 {
    let parts = split(data);
    let flags = parts.first().and_then(|p| p.first()).copied().unwrap_or(0);
    let mut meta = parts.get(1).copied().unwrap_or_default().to_vec();
    let mut index = parts.get(2).copied().unwrap_or_default().to_vec();
    let shards = parts.get(3..).unwrap_or_default();

    if flags & flags::FIX_SHARD_SIZES != 0 {
        if let Ok(mut value) = serde_json::from_slice::<Value>(&meta) {
            if let Some(list) = value.get_mut("shards").and_then(Value::as_array_mut) {
                for (shard, bytes) in list.iter_mut().zip(shards) {
                    if shard.is_object() {
                        shard["bytes"] = json!(bytes.len());
                    }
                }
            }
            meta = serde_json::to_vec(&value).expect("a Value serializes");
        }
    }
    let samples = serde_json::from_slice::<Value>(&meta).ok().and_then(|v| v.get("samples")?.as_u64());
    if flags & flags::FIX_INDEX_LEN != 0 {
        if let Some(n) = samples.filter(|&n| n <= MAX_SAMPLES) {
            index.resize(INDEX_HEADER_LEN + n as usize * INDEX_ENTRY_LEN, 0);
        }
    }
    if flags & flags::FIX_CRCS != 0 && index.len() > INDEX_HEADER_LEN {
        for chunk in index[INDEX_HEADER_LEN..].chunks_exact_mut(INDEX_ENTRY_LEN) {
            let mut entry = IndexEntry::decode(&(*chunk).try_into().expect("chunks_exact"));
            let range = shards.get(entry.shard as usize).and_then(|shard| {
                let start = usize::try_from(entry.offset).ok()?;
                shard.get(start..start.checked_add(usize::try_from(entry.len).ok()?)?)
            });
            if let Some(bytes) = range {
                entry.crc32 = crc32(bytes);
                chunk.copy_from_slice(&entry.encode());
            }
        }
    }
    if flags & flags::FIX_HEADER != 0 {
        if index.len() < INDEX_HEADER_LEN {
            index.resize(INDEX_HEADER_LEN, 0);
        }
        let old = IndexHeader::decode(&index);
        let header = IndexHeader {
            version: INDEX_VERSION,
            meta_crc32: crc32(&meta),
            samples: samples.or(old.map(|h| h.samples)).unwrap_or(0),
        };
        index[..INDEX_HEADER_LEN].copy_from_slice(&header.encode());
    }

    std::fs::write(dir.join(META_FILE), &meta).expect("write metadata");
    std::fs::write(dir.join(SAMPLE_INDEX_FILE), &index).expect("write index");
    // Each shard also as a merged dataset's part would hold it, so metadata naming shards in a
    // part directory (`part-0000-of-0001/shard-p0000-000000.tar`) finds them too.
    let part_dir = dir.join("part-0000-of-0001");
    std::fs::create_dir(&part_dir).expect("part directory");
    for (n, shard) in shards.iter().enumerate() {
        std::fs::write(dir.join(format!("shard-{n:06}.tar")), shard).expect("write shard");
        std::fs::write(part_dir.join(format!("shard-p0000-{n:06}.tar")), shard).expect("write part shard");
    }
    if let (Some(parent), Some(first)) = (dir.parent(), shards.first()) {
        std::fs::write(parent.join("outside.tar"), first).expect("write outside shard");
    }
    flags
}

/// Writes the LMDB dataset of `data` (parts: flags, the `__meta__` value, the `__checksums__`
/// value, then one record per part, its key up to the first NUL and its value after it) into
/// `dir`, and returns the flags. Records LMDB cannot hold (empty keys, keys over 511 bytes) are
/// left out; a later record with the same key replaces an earlier one.
pub fn write_lmdb(dir: &Path, data: &[u8]) -> u8 {
    let parts = split(data);
    let flags = parts.first().and_then(|p| p.first()).copied().unwrap_or(0);
    let meta = parts.get(1).copied().unwrap_or_default();
    let mut table = parts.get(2).copied().unwrap_or_default().to_vec();
    let mut records: std::collections::BTreeMap<&[u8], &[u8]> = parts
        .get(3..)
        .unwrap_or_default()
        .iter()
        .map(|part| match part.iter().position(|&b| b == 0) {
            Some(at) => (&part[..at], &part[at + 1..]),
            None => (*part, &[][..]),
        })
        .filter(|(key, _)| (1..=511).contains(&key.len()))
        .collect();

    if flags & flags::FIX_CRCS != 0 {
        // The table the writer would have made from these records, for the metadata's count.
        let value = serde_json::from_slice::<Value>(meta).ok();
        let samples = value.as_ref().and_then(|v| v.get("samples")?.as_u64()).filter(|&n| n <= MAX_SAMPLES);
        let width =
            value.as_ref().and_then(|v| v.get("key_width")?.as_u64()).filter(|w| (8..=20).contains(w));
        if let (Some(samples), Some(width)) = (samples, width) {
            let sums = (0..samples)
                .map(|i| {
                    let prefix = format!("{}.", format_key(i, width as usize));
                    crc32_parts(
                        records.iter().filter(|(k, _)| k.starts_with(prefix.as_bytes())).map(|(_, v)| *v),
                    )
                })
                .collect();
            table = Table { meta_crc32: crc32(meta), samples: sums }.encode();
        }
    }
    if flags & flags::FIX_HEADER != 0 && table.len() >= 16 {
        table[12..16].copy_from_slice(&crc32(meta).to_le_bytes());
    }
    records.insert(META_KEY.as_bytes(), meta);
    records.insert(TABLE_KEY.as_bytes(), &table);

    // SAFETY: a fresh directory that nothing else opens until this environment is closed.
    let env = unsafe {
        EnvOpenOptions::new()
            .map_size(1 << 26)
            .flags(EnvFlags::NO_SYNC | EnvFlags::NO_META_SYNC)
            .open(dir)
            .expect("LMDB environment")
    };
    let mut txn = env.write_txn().expect("write transaction");
    let db: Database<Bytes, Bytes> = env.create_database(&mut txn, None).expect("main database");
    for (key, value) in records {
        db.put(&mut txn, key, value).expect("put");
    }
    txn.commit().expect("commit");
    env.prepare_for_closing().wait();
    flags
}

/// Whether a shard name the reader accepted names a file inside the dataset directory: one
/// plain component, or a part directory (`part-0000-of-0004`) and one plain component — the
/// name exactly, with nothing `Path` would normalise away.
pub fn stays_inside(name: &str) -> bool {
    let components: Vec<Component<'_>> = Path::new(name).components().collect();
    !name.contains('\0')
        && match components[..] {
            [Component::Normal(file)] => file == name,
            [Component::Normal(dir), Component::Normal(file)] => {
                dir.to_str().and_then(imgpack_reader::part::parse_dir_name).is_some()
                    && format!("{}/{}", dir.to_string_lossy(), file.to_string_lossy()) == name
            }
            _ => false,
        }
}

/// What every sample the reader returns must satisfy, whatever the bytes on disk: its own key,
/// fields with valid extensions in strictly increasing order, and parsers of its fields that
/// return rather than panic.
pub fn check_sample(sample: &Sample<'_>, index: u64, key_width: usize) {
    assert_eq!(sample.index, index);
    assert_eq!(sample.key, format_key(index, key_width));
    assert!(!sample.fields.is_empty());
    for pair in sample.fields.windows(2) {
        assert!(pair[0].ext < pair[1].ext, "fields out of order: {:?} {:?}", pair[0].ext, pair[1].ext);
    }
    for field in &sample.fields {
        assert!(is_valid_extension(&field.ext), "invalid extension {:?}", field.ext);
    }
    let _ = sample.label();
    if let Ok(info) = sample.info() {
        let _ = info.path_bytes();
    }
    let _ = (sample.image(), sample.payload());
}
