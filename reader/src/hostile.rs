//! Tests with damaged and hostile datasets: truncated and corrupt indexes, metadata and shards,
//! bogus offsets and sizes, member and shard names that climb out of the dataset, absurd key
//! widths and sample counts, in both formats.
//!
//! Each test builds an intact dataset, breaks one thing, and checks the exact error variant the
//! reader gives — never a panic, never an allocation sized by a damaged value — and, where a
//! name could point outside, that the dataset's surroundings are left as they were. A fuzzer
//! crash fixed in the reader ends up here too, as a test named after what it found.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use heed::types::Bytes;
use heed::Database;
use serde_json::{json, Value};

use crate::checksum::{crc32, crc32_parts, Table, TABLE_KEY};
use crate::key::META_KEY;
use crate::lmdb::LmdbDataset;
use crate::webdataset::{
    IndexEntry, IndexHeader, WebDataset, BLOCK, INDEX_VERSION, META_FILE, SAMPLE_INDEX_FILE,
};
use crate::{Error, Field, Sample};

// ---------------------------------------------------------------------------------------------
// Builders

/// A ustar member named `name` holding `data`, as `pack` writes one (deterministic header).
fn member(name: &str, data: &[u8]) -> Vec<u8> {
    let mut header = [0u8; BLOCK as usize];
    header[..name.len()].copy_from_slice(name.as_bytes());
    header[100..108].copy_from_slice(b"0000644\0");
    header[108..116].copy_from_slice(b"0000000\0");
    header[116..124].copy_from_slice(b"0000000\0");
    header[124..136].copy_from_slice(format!("{:011o}\0", data.len()).as_bytes());
    header[136..148].copy_from_slice(b"00000000000\0");
    header[148..156].copy_from_slice(b"        ");
    header[156] = b'0';
    header[257..265].copy_from_slice(b"ustar\x0000");
    let sum: u32 = header.iter().map(|&b| u32::from(b)).sum();
    header[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
    let mut out = header.to_vec();
    out.extend_from_slice(data);
    out.resize(out.len().div_ceil(BLOCK as usize) * BLOCK as usize, 0);
    out
}

/// The fields of a well-formed sample `i` (cls, jpg, json).
fn fields(i: u64) -> Vec<(String, Vec<u8>)> {
    vec![
        ("cls".into(), (i % 2).to_string().into_bytes()),
        ("jpg".into(), [&b"\xFF\xD8\xFF"[..], &[i as u8; 700]].concat()),
        ("json".into(), format!(r#"{{"path":"c/{i}.jpg","class":"c"}}"#).into_bytes()),
    ]
}

/// A WebDataset output in memory, written by [`Wds::write`] exactly as `pack` lays it out.
struct Wds {
    meta: Value,
    /// Shard file names and bytes, written into the dataset directory.
    shards: Vec<(String, Vec<u8>)>,
    entries: Vec<IndexEntry>,
}

impl Wds {
    /// `samples` samples of [`fields`], in two shards.
    fn new(samples: u64) -> Wds {
        let mut wds = Wds { meta: Value::Null, shards: Vec::new(), entries: Vec::new() };
        let split = samples.div_ceil(2);
        for range in [0..split, split..samples] {
            let mut tar = Vec::new();
            for i in range.clone() {
                let start = tar.len();
                for (ext, data) in fields(i) {
                    tar.extend(member(&format!("{i:08}.{ext}"), &data));
                }
                let crc32 = crc32(&tar[start..]);
                let shard = wds.shards.len() as u32;
                wds.entries.push(IndexEntry {
                    offset: start as u64,
                    len: (tar.len() - start) as u64,
                    shard,
                    crc32,
                });
            }
            tar.extend([0u8; 1024]);
            wds.shards.push((format!("shard-{:06}.tar", wds.shards.len()), tar));
        }
        let shards: Vec<Value> = wds
            .shards
            .iter()
            .map(|(name, bytes)| json!({"name": name, "first": 0, "samples": 0, "bytes": bytes.len(), "md5": ""}))
            .collect();
        wds.meta = json!({
            "format": "imgpack-webdataset", "version": 2, "samples": samples, "key_width": 8,
            "classes": ["a", "b"], "fields": ["cls", "jpg", "json"],
            "source": {"kind": "imagefolder", "root": "x"}, "options": {}, "tool": "test",
            "checksum": "crc32", "shards": shards,
        });
        wds
    }

    /// Writes the dataset into `dir` (created if need be): shards, index with the metadata's
    /// CRC and the metadata's sample count in its header, metadata.
    fn write(&self, dir: &Path) {
        std::fs::create_dir_all(dir).unwrap();
        for (name, bytes) in &self.shards {
            std::fs::write(dir.join(name), bytes).unwrap();
        }
        let meta = serde_json::to_vec(&self.meta).unwrap();
        let samples = self.meta["samples"].as_u64().unwrap_or(0);
        let header = IndexHeader { version: INDEX_VERSION, meta_crc32: crc32(&meta), samples };
        let mut index = header.encode().to_vec();
        self.entries.iter().for_each(|e| index.extend(e.encode()));
        std::fs::write(dir.join(SAMPLE_INDEX_FILE), index).unwrap();
        std::fs::write(dir.join(META_FILE), meta).unwrap();
    }

    /// Writes the dataset with entry `i` replaced by `entry`, and opens it.
    fn with_entry(mut self, dir: &Path, i: usize, entry: IndexEntry) -> WebDataset {
        self.entries[i] = entry;
        self.write(dir);
        WebDataset::open(dir).unwrap()
    }
}

/// Every file under `dir` (recursively) with its bytes: what "untouched" is checked against.
fn snapshot(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut out = BTreeMap::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            out.extend(snapshot(&path));
        } else {
            out.insert(path.clone(), std::fs::read(&path).unwrap_or_default());
        }
    }
    out
}

/// The start of `value`'s debug form: enough to tell what came back instead of an error.
fn short(value: &impl std::fmt::Debug) -> String {
    format!("{value:?}").chars().take(300).collect()
}

fn not_a_dataset(result: crate::Result<impl std::fmt::Debug>) -> String {
    match result {
        Err(Error::NotADataset { reason, .. }) => reason,
        other => panic!("expected NotADataset, got {}", short(&other)),
    }
}

fn bad_sample(result: crate::Result<impl std::fmt::Debug>) -> String {
    match result {
        Err(Error::BadSample { reason, key, .. }) => format!("{key}: {reason}"),
        other => panic!("expected BadSample, got {}", short(&other)),
    }
}

fn bad_meta(result: crate::Result<impl std::fmt::Debug>) -> String {
    match result {
        Err(e @ Error::BadMeta { .. }) => e.to_string(),
        other => panic!("expected BadMeta, got {}", short(&other)),
    }
}

// ---------------------------------------------------------------------------------------------
// WebDataset: opening

#[test]
fn an_intact_webdataset_reads_back_with_checksums() {
    let dir = tempfile::tempdir().unwrap();
    Wds::new(5).write(dir.path());
    let ds = WebDataset::open(dir.path()).unwrap().verify_checksums(true).unwrap();
    let samples: Vec<_> = ds.iter().collect::<crate::Result<_>>().unwrap();
    assert_eq!(samples.len(), 5);
    assert_eq!(samples[4].key, "00000004");
    assert_eq!(samples[4].label().unwrap(), 0);
    assert_eq!(samples[3].info().unwrap().path, "c/3.jpg");
    assert_eq!(samples[3].image().unwrap().1, &fields(3)[1].1[..]);
}

#[test]
fn a_truncated_padded_or_emptied_index_is_not_a_dataset() {
    let dir = tempfile::tempdir().unwrap();
    Wds::new(3).write(dir.path());
    let index_path = dir.path().join(SAMPLE_INDEX_FILE);
    let index = std::fs::read(&index_path).unwrap();
    for broken in
        [&index[..index.len() - 1], &index[..30], &index[..10], &[][..], &[&index[..], &[0; 24]].concat()]
    {
        std::fs::write(&index_path, broken).unwrap();
        let reason = not_a_dataset(WebDataset::open(dir.path()));
        assert!(reason.contains("does not match the 3 samples"), "{} bytes: {reason}", broken.len());
    }
    let mut bad_magic = index.clone();
    bad_magic[3] ^= 0x20;
    std::fs::write(&index_path, bad_magic).unwrap();
    assert!(not_a_dataset(WebDataset::open(dir.path())).contains("no valid header"));
}

#[test]
fn sample_counts_that_overflow_the_index_length_are_refused() {
    // samples * 24 + 24 wraps around u64 for these; with wrapping arithmetic, 2^64/24 * 24 + 24
    // would even come out at a small length that a short index file could match.
    for samples in [u64::MAX, u64::MAX / 24, u64::MAX / 24 + 1, 1 << 62] {
        let dir = tempfile::tempdir().unwrap();
        let mut wds = Wds::new(2);
        wds.meta["samples"] = json!(samples);
        wds.write(dir.path());
        let reason = not_a_dataset(WebDataset::open(dir.path()));
        assert!(reason.contains(&format!("the {samples} samples")), "{reason}");
    }
}

#[test]
fn corrupt_or_truncated_metadata_is_bad_meta() {
    let dir = tempfile::tempdir().unwrap();
    Wds::new(2).write(dir.path());
    let meta_path = dir.path().join(META_FILE);
    let meta = std::fs::read(&meta_path).unwrap();
    for broken in [&meta[..meta.len() / 2], b"", b"\xFF\xFE{", b"[1,2,3]", b"{\"format\":1}"] {
        std::fs::write(&meta_path, broken).unwrap();
        let message = bad_meta(WebDataset::open(dir.path()));
        assert!(message.contains(META_FILE) && message.contains("re-run `pack`"), "{message}");
    }
}

#[test]
fn an_absurd_key_width_is_refused_before_any_key_is_built() {
    for width in [json!(1_000_000_000u64), json!(u64::MAX), json!(0), json!(21), json!(-8)] {
        let dir = tempfile::tempdir().unwrap();
        let mut wds = Wds::new(2);
        wds.meta["key_width"] = width.clone();
        wds.write(dir.path());
        let message = bad_meta(WebDataset::open(dir.path()));
        assert!(message.contains("key_width") || message.contains("expected u64"), "{width}: {message}");
    }
}

#[test]
fn unknown_versions_formats_and_checksums_are_not_a_dataset() {
    for (field, value, expected) in [
        ("version", json!(0), "version 0"),
        ("version", json!(4), "version 4"),
        ("format", json!("imgpack-lmdb"), "imgpack-lmdb"),
        ("checksum", json!("sha256"), "sha256"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let mut wds = Wds::new(2);
        wds.meta[field] = value;
        wds.write(dir.path());
        let reason = not_a_dataset(WebDataset::open(dir.path()));
        assert!(reason.contains(expected), "{reason}");
    }
}

#[test]
fn metadata_that_does_not_match_its_crc_is_not_a_dataset() {
    let dir = tempfile::tempdir().unwrap();
    Wds::new(2).write(dir.path());
    let meta_path = dir.path().join(META_FILE);
    let mut meta = std::fs::read(&meta_path).unwrap();
    let at = meta.windows(4).position(|w| w == b"test").unwrap();
    meta[at] = b'T';
    std::fs::write(&meta_path, meta).unwrap();
    assert!(not_a_dataset(WebDataset::open(dir.path())).contains("CRC-32"));
}

#[test]
fn shard_names_outside_the_dataset_are_refused_before_anything_is_opened() {
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("ds");
    let wds = Wds::new(2);
    wds.write(&dir);
    // A perfectly good shard just outside the dataset, so only the name check can refuse it.
    let outside = root.path().join("outside.tar");
    std::fs::write(&outside, &wds.shards[0].1).unwrap();
    std::fs::create_dir(dir.join("sub")).unwrap();
    std::fs::write(dir.join("sub/x.tar"), &wds.shards[0].1).unwrap();
    let hostile = [
        "../outside.tar".to_string(),
        outside.display().to_string(),
        "/etc/passwd".into(),
        "sub/x.tar".into(),
        "..".into(),
        ".".into(),
        "".into(),
        "shard-000000.tar\0/../../outside.tar".into(),
        "..\\outside.tar".into(),
        ".hidden.tar".into(),
    ];
    for name in hostile {
        let mut wds = Wds::new(2);
        wds.meta["shards"][0]["name"] = json!(name);
        wds.write(&dir);
        let before = snapshot(root.path());
        let reason = not_a_dataset(WebDataset::open(&dir));
        assert!(reason.contains("not a file name inside the dataset directory"), "{name:?}: {reason}");
        assert_eq!(snapshot(root.path()), before, "{name:?}");
    }
}

#[test]
fn a_missing_or_truncated_shard_is_not_a_dataset() {
    let dir = tempfile::tempdir().unwrap();
    let wds = Wds::new(4);
    wds.write(dir.path());
    let shard = dir.path().join(&wds.shards[1].0);
    std::fs::write(&shard, &wds.shards[1].1[..wds.shards[1].1.len() - 512]).unwrap();
    assert!(not_a_dataset(WebDataset::open(dir.path())).contains("truncated"));
    std::fs::remove_file(&shard).unwrap();
    assert!(not_a_dataset(WebDataset::open(dir.path())).contains("is missing"));
    std::fs::remove_file(dir.path().join(SAMPLE_INDEX_FILE)).unwrap();
    assert!(not_a_dataset(WebDataset::open(dir.path())).contains("no imgpack.index"));
}

#[test]
fn fifos_and_directories_under_dataset_names_are_refused_without_hanging() {
    // Opening a FIFO for reading blocks until a writer comes, and none ever would.
    let mkfifo = |path: &Path| {
        let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
    };
    for file in ["shard-000001.tar", SAMPLE_INDEX_FILE, META_FILE] {
        let dir = tempfile::tempdir().unwrap();
        Wds::new(4).write(dir.path());
        std::fs::remove_file(dir.path().join(file)).unwrap();
        mkfifo(&dir.path().join(file));
        let reason = not_a_dataset(WebDataset::open(dir.path()));
        assert!(reason.contains("not a regular file"), "{file}: {reason}");
        std::fs::remove_file(dir.path().join(file)).unwrap();
        std::fs::create_dir(dir.path().join(file)).unwrap();
        let reason = not_a_dataset(WebDataset::open(dir.path()));
        assert!(reason.contains("not a regular file"), "{file}: {reason}");
    }
}

// ---------------------------------------------------------------------------------------------
// WebDataset: reading

#[test]
fn offsets_and_lengths_outside_the_shard_are_bad_samples() {
    let good = Wds::new(4).entries[1];
    let shard_len = Wds::new(4).shards[0].1.len() as u64;
    for (offset, len) in [
        (shard_len, 512),
        (shard_len + 1, 0),
        (0, shard_len + 1),
        (u64::MAX, 1),
        (1, u64::MAX),
        (u64::MAX - 511, 1024),
        (1 << 63, 1 << 63),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let ds = Wds::new(4).with_entry(dir.path(), 1, IndexEntry { offset, len, ..good });
        let reason = bad_sample(ds.get(1));
        assert!(reason.starts_with("00000001: index range"), "{offset}+{len}: {reason}");
        assert!(ds.get(0).is_ok(), "the other samples still read");
    }
}

#[test]
fn ranges_that_do_not_hold_exactly_the_sample_are_bad_samples() {
    let good = Wds::new(6).entries[1];
    let cases = [
        (IndexEntry { len: 0, ..good }, "no member stored"),
        (IndexEntry { shard: 2, ..good }, "index names shard 2 of 2"),
        (IndexEntry { offset: good.offset + 512, ..good }, "not octal"),
        (IndexEntry { shard: u32::MAX, ..good }, "of 2"),
        (IndexEntry { offset: good.offset + 1, ..good }, "checksum"),
        (IndexEntry { offset: 0, ..good }, "not this sample's"),
        (IndexEntry { len: good.len + 1024, ..good }, "not this sample's"),
        (IndexEntry { len: good.len - 500, ..good }, "runs past the end"),
        (IndexEntry { len: good.len - 700, ..good }, "runs past the end"),
        // the end-of-archive blocks of the shard
        (IndexEntry { offset: Wds::new(6).shards[0].1.len() as u64 - 1024, len: 1024, ..good }, "not octal"),
    ];
    for (entry, expected) in cases {
        let dir = tempfile::tempdir().unwrap();
        let ds = Wds::new(6).with_entry(dir.path(), 1, entry);
        let reason = bad_sample(ds.get(1));
        assert!(reason.contains(expected), "{entry:?}: {reason}");
    }
}

#[test]
fn member_names_that_climb_out_or_belong_elsewhere_are_bad_samples() {
    let names = [
        "../00000001.jpg",
        "/etc/passwd",
        "/00000001.jpg",
        "00000001./../../x",
        "00000001.jpg/../../x",
        "00000001.",
        "00000001",
        "00000001.j\\pg",
        "00000002.jpg",
        "0000001.jpg",
        "000000001.jpg",
    ];
    for name in names {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("ds");
        std::fs::write(root.path().join("outside"), b"keep").unwrap();
        let mut wds = Wds::new(2);
        let tar = member(name, b"\xFF\xD8\xFF");
        let entry = IndexEntry { offset: 0, len: tar.len() as u64, shard: 1, crc32: crc32(&tar) };
        wds.shards[1].1 = [tar, vec![0; 1024]].concat();
        wds.meta["shards"][1]["bytes"] = json!(wds.shards[1].1.len());
        let ds = wds.with_entry(&dir, 1, entry);
        let before = snapshot(root.path());
        let reason = bad_sample(ds.get(1));
        assert!(
            reason.contains("is not {key}.{ext}") || reason.contains("not this sample's"),
            "{name}: {reason}"
        );
        let exts_ok = |s: Sample<'_>| s.fields.iter().all(|f| crate::key::is_valid_extension(&f.ext));
        assert!(ds.iter().all(|s| s.map_or(true, exts_ok)), "{name}");
        drop(ds);
        assert_eq!(snapshot(root.path()), before, "{name}");
    }
}

#[test]
fn a_field_stored_twice_or_out_of_order_is_a_bad_sample() {
    for exts in [["jpg", "jpg"], ["jpg", "cls"]] {
        let dir = tempfile::tempdir().unwrap();
        let mut wds = Wds::new(2);
        let tar =
            [member(&format!("00000001.{}", exts[0]), b"a"), member(&format!("00000001.{}", exts[1]), b"b")]
                .concat();
        let entry = IndexEntry { offset: 0, len: tar.len() as u64, shard: 1, crc32: crc32(&tar) };
        wds.shards[1].1 = [tar, vec![0; 1024]].concat();
        wds.meta["shards"][1]["bytes"] = json!(wds.shards[1].1.len());
        let ds = wds.with_entry(dir.path(), 1, entry);
        assert!(bad_sample(ds.get(1)).contains("unique and sorted"), "{exts:?}");
    }
}

#[test]
fn a_huge_member_size_is_a_bad_sample_not_an_overflow() {
    let mut tar = member("00000001.jpg", b"x");
    // 12 octal digits, the most the field holds: about 64 GiB.
    tar[124..136].copy_from_slice(b"777777777777");
    let sum: u32 = tar[..512]
        .iter()
        .enumerate()
        .map(|(i, &b)| if (148..156).contains(&i) { 32 } else { u32::from(b) })
        .sum();
    tar[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
    let dir = tempfile::tempdir().unwrap();
    let mut wds = Wds::new(2);
    let entry = IndexEntry { offset: 0, len: tar.len() as u64, shard: 1, crc32: crc32(&tar) };
    wds.shards[1].1 = [tar, vec![0; 1024]].concat();
    wds.meta["shards"][1]["bytes"] = json!(wds.shards[1].1.len());
    let ds = wds.with_entry(dir.path(), 1, entry);
    assert!(bad_sample(ds.get(1)).contains("68719476735 bytes runs past the end"));
}

#[test]
fn a_damaged_sample_fails_its_checksum_when_asked() {
    let dir = tempfile::tempdir().unwrap();
    let mut wds = Wds::new(2);
    let at = wds.entries[1].offset as usize + 512 + 3 * 512 + 100; // inside the jpg's data
    wds.shards[1].1[at] ^= 1;
    wds.write(dir.path());
    let ds = WebDataset::open(dir.path()).unwrap();
    assert!(ds.get(1).is_ok(), "without checks the damage goes unseen");
    let ds = ds.verify_checksums(true).unwrap();
    assert!(matches!(ds.get(1), Err(Error::Checksum { ref key, .. }) if key == "00000001"));
    assert!(ds.get(0).is_ok());
}

// ---------------------------------------------------------------------------------------------
// LMDB

/// An LMDB dataset of `samples` samples of [`fields`] with its checksum table, then `edit`
/// applied to its records (a `None` value deletes the record).
fn lmdb(dir: &Path, samples: u64, edit: impl FnOnce(&mut BTreeMap<Vec<u8>, Vec<u8>>)) {
    let mut records = BTreeMap::new();
    let mut sums = Vec::new();
    for i in 0..samples {
        let fields = fields(i);
        sums.push(crc32_parts(fields.iter().map(|(_, d)| &d[..])));
        for (ext, data) in fields {
            records.insert(format!("{i:08}.{ext}").into_bytes(), data);
        }
    }
    let meta = serde_json::to_vec(&json!({
        "format": "imgpack-lmdb", "version": 2, "samples": samples, "key_width": 8,
        "classes": ["a", "b"], "fields": ["cls", "jpg", "json"],
        "source": {"kind": "imagefolder", "root": "x"}, "options": {}, "tool": "test", "checksum": "crc32",
    }))
    .unwrap();
    records.insert(TABLE_KEY.as_bytes().to_vec(), Table { meta_crc32: crc32(&meta), samples: sums }.encode());
    records.insert(META_KEY.as_bytes().to_vec(), meta);
    edit(&mut records);
    write_lmdb(dir, &records);
}

fn write_lmdb(dir: &Path, records: &BTreeMap<Vec<u8>, Vec<u8>>) {
    let env = crate::lmdb::env::create(dir, 1 << 22).unwrap();
    let mut txn = env.write_txn().unwrap();
    let db: Database<Bytes, Bytes> = env.create_database(&mut txn, None).unwrap();
    for (k, v) in records {
        db.put(&mut txn, k, v).unwrap();
    }
    txn.commit().unwrap();
}

/// Replaces the `__meta__` record's JSON field `field` with `value`, keeping the rest.
fn set_meta(records: &mut BTreeMap<Vec<u8>, Vec<u8>>, field: &str, value: Value) {
    let mut meta: Value = serde_json::from_slice(&records[META_KEY.as_bytes()]).unwrap();
    meta[field] = value;
    records.insert(META_KEY.as_bytes().to_vec(), serde_json::to_vec(&meta).unwrap());
}

#[test]
fn an_intact_lmdb_dataset_reads_back_with_checksums() {
    let dir = tempfile::tempdir().unwrap();
    lmdb(dir.path(), 3, |_| ());
    let ds = LmdbDataset::open(dir.path()).unwrap().verify_checksums(true).unwrap();
    let all: Vec<_> = ds.iter().unwrap().collect::<crate::Result<_>>().unwrap();
    assert_eq!(all[2].info().unwrap().path, "c/2.jpg");
}

#[test]
fn corrupt_lmdb_meta_is_bad_meta() {
    let garbage: [&[u8]; 4] = [b"", b"{\"format\":\"imgpack-lmdb\",\"vers", b"\xFF\x00\x01", b"null"];
    for raw in garbage {
        let dir = tempfile::tempdir().unwrap();
        lmdb(dir.path(), 2, |r| {
            r.insert(META_KEY.as_bytes().to_vec(), raw.to_vec());
        });
        bad_meta(LmdbDataset::open(dir.path()));
    }
    let dir = tempfile::tempdir().unwrap();
    lmdb(dir.path(), 2, |r| set_meta(r, "key_width", json!(1_000_000_000u64)));
    assert!(bad_meta(LmdbDataset::open(dir.path())).contains("key_width 1000000000 is not between 8 and 20"));
}

#[test]
fn lmdb_meta_promising_more_samples_than_stored_is_not_a_dataset() {
    for (samples, expected) in
        [(3u64, "the last one (00000002.*)"), (10, "only 8 records"), (u64::MAX, "records in all")]
    {
        let dir = tempfile::tempdir().unwrap();
        lmdb(dir.path(), 2, |r| set_meta(r, "samples", json!(samples)));
        let reason = not_a_dataset(LmdbDataset::open(dir.path()));
        assert!(reason.contains(expected), "{samples}: {reason}");
    }
    // The last sample cut off, every other record still there.
    let dir = tempfile::tempdir().unwrap();
    lmdb(dir.path(), 4, |r| r.retain(|k, _| !k.starts_with(b"00000003.")));
    assert!(not_a_dataset(LmdbDataset::open(dir.path())).contains("00000003."));
}

#[test]
fn lmdb_unknown_versions_and_checksums_are_not_a_dataset() {
    for (field, value) in [("version", json!(0)), ("version", json!(99)), ("checksum", json!("md5"))] {
        let dir = tempfile::tempdir().unwrap();
        lmdb(dir.path(), 2, |r| set_meta(r, field, value.clone()));
        not_a_dataset(LmdbDataset::open(dir.path()));
    }
}

#[test]
fn lmdb_missing_and_misnamed_records_are_bad_samples() {
    let dir = tempfile::tempdir().unwrap();
    lmdb(dir.path(), 3, |r| {
        r.retain(|k, _| !k.starts_with(b"00000000."));
        r.remove(&b"00000001.jpg"[..]);
        r.insert(b"00000001./../../x".to_vec(), b"x".to_vec());
        r.insert(b"00000002.".to_vec(), b"x".to_vec());
    });
    let ds = LmdbDataset::open(dir.path()).unwrap();
    assert!(bad_sample(ds.get(0)).contains("no record"));
    assert!(bad_sample(ds.get(1)).contains("00000001./../../x"));
    assert!(bad_sample(ds.get(2)).contains("\"00000002.\""));
    assert!(matches!(ds.get(3), Err(Error::OutOfRange { index: 3, len: 3, .. })));
}

#[test]
fn a_damaged_lmdb_checksum_table_is_not_a_dataset() {
    type Damage = fn(&mut Vec<u8>);
    let cases: [(&str, Damage); 5] = [
        ("shorter than its header", |t| t.truncate(10)),
        ("says 2 samples", |t| t.truncate(t.len() - 1)),
        ("not IMGPKSUM", |t| t[0] = b'X'),
        ("says 18446744073709551615 samples", |t| t[16..24].copy_from_slice(&u64::MAX.to_le_bytes())),
        ("holds 3 checksums for 2 samples", |t| {
            t[16] = 3;
            t.extend([0; 4]);
        }),
    ];
    for (expected, damage) in cases {
        let dir = tempfile::tempdir().unwrap();
        lmdb(dir.path(), 2, |r| damage(r.get_mut(TABLE_KEY.as_bytes()).unwrap()));
        let ds = LmdbDataset::open(dir.path()).unwrap();
        let reason = not_a_dataset(ds.verify_checksums(true));
        assert!(reason.contains(expected), "{reason}");
    }
    let dir = tempfile::tempdir().unwrap();
    lmdb(dir.path(), 2, |r| {
        r.remove(TABLE_KEY.as_bytes());
    });
    assert!(not_a_dataset(LmdbDataset::open(dir.path()).unwrap().verify_checksums(true))
        .contains("no __checksums__"));
}

#[test]
fn a_damaged_lmdb_sample_fails_its_checksum() {
    let dir = tempfile::tempdir().unwrap();
    lmdb(dir.path(), 2, |r| r.get_mut(&b"00000001.jpg"[..]).unwrap()[5] ^= 1);
    let ds = LmdbDataset::open(dir.path()).unwrap().verify_checksums(true).unwrap();
    assert!(ds.get(0).is_ok());
    assert!(matches!(ds.get(1), Err(Error::Checksum { ref key, .. }) if key == "00000001"));
}

// ---------------------------------------------------------------------------------------------
// Sample fields

fn sample(fields: &[(&str, &[u8])]) -> Sample<'static> {
    Sample {
        index: 0,
        key: "00000000".into(),
        fields: fields
            .iter()
            .map(|(ext, d)| Field { ext: ext.to_string(), data: Cow::Owned(d.to_vec()) })
            .collect(),
        dataset: Path::new("/data/x").into(),
    }
}

#[test]
fn malformed_cls_and_json_fields_are_bad_samples() {
    for cls in [&b""[..], b"-1", b"4294967296", b"1e3", b"\xFF", b"3 4"] {
        bad_sample(sample(&[("cls", cls)]).label());
    }
    assert_eq!(sample(&[("cls", b" 7\n")]).label().unwrap(), 7);
    bad_sample(sample(&[]).label());
    let deep = "[".repeat(100_000);
    for json in [&b""[..], b"{", b"{\"path\":1}", b"null", deep.as_bytes()] {
        bad_sample(sample(&[("json", json)]).info());
    }
    bad_sample(sample(&[]).info());
}

#[test]
fn malformed_path_hex_is_an_error_not_a_panic() {
    let info =
        |hex: &str| crate::SampleInfo { path: "p".into(), class: "c".into(), path_hex: Some(hex.into()) };
    for hex in ["6", "zz", "é", "éé", "6é", "+1", "-1", " 1"] {
        assert!(info(hex).path_bytes().is_err(), "{hex:?}");
    }
    assert_eq!(
        info("2e2e2f78").path_bytes().unwrap(),
        b"../x",
        "bytes are returned as recorded; writers check them"
    );
}
