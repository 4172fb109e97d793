//! `pack verify` of an LMDB dataset: the records in key order against the metadata and the
//! checksum table, reading ahead of LMDB (which maps the file with readahead off).

use std::path::Path;

use imgpack_reader::checksum::{crc32, crc32_parts, Table, TABLE_KEY};
use imgpack_reader::key::{format_key, split_field_name, META_KEY};
use imgpack_reader::Meta;
use rayon::prelude::*;

use crate::progress::Progress;
use crate::{Error, Result};

use super::{check_fields, read_meta, sample_place, Verified, VerifyOptions};

/// Checks the LMDB dataset in `path`.
pub(super) fn check(
    path: &Path,
    options: &VerifyOptions,
    verified: &mut Verified,
    progress: &dyn Progress,
) -> Result<()> {
    use heed::types::Bytes;
    use heed::Database;

    let data = "data.mdb";
    // Through the one LMDB opener, with the reader's flags (readahead off: `Ahead` makes up for
    // it), and shared with any reader of the dataset this process has open.
    let env = match imgpack_reader::lmdb::open_env(path) {
        Ok(env) => env,
        Err(imgpack_reader::Error::Lmdb { source: heed::Error::EnvAlreadyOpened, .. }) => {
            return Err(Error::Lmdb {
                path: path.to_path_buf(),
                source: heed::Error::EnvAlreadyOpened,
                hint: "; this program has the dataset open for writing (LMDB allows one handle per process): check it after closing it".into(),
            })
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
            progress.position(bytes);
            ahead.reached(bytes);
        }
    }
    batch.extend(current.take());
    check_lmdb_batch(&mut batch, &meta, sums.as_deref(), options, verified);
    progress.position(bytes);
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

#[cfg(test)]
mod tests {
    use super::super::testing::{check, find, flip, packed, places};
    use crate::OutputFormat;

    #[test]
    fn an_intact_database_verifies_clean() {
        let dir = tempfile::tempdir().unwrap();
        let out = packed(dir.path(), OutputFormat::Lmdb);
        let verified = check(&out, true);
        assert!(verified.is_ok(), "{:?}", verified.problems);
        assert_eq!(verified.checked, verified.expected);
        assert!(verified.checked > 0);
    }

    #[test]
    fn a_damaged_value_is_named_by_its_sample_and_nothing_else() {
        let dir = tempfile::tempdir().unwrap();
        let out = packed(dir.path(), OutputFormat::Lmdb);
        let dataset = imgpack_reader::open(&out).unwrap();
        let (ext, image) = {
            let sample = dataset.get(3).unwrap();
            let (ext, bytes) = sample.payload().unwrap();
            (ext.to_string(), bytes.to_vec())
        };
        let key = dataset.get(3).unwrap().key.clone();
        drop(dataset);
        let data = out.join("data.mdb");
        flip(&data, find(&data, &image) + image.len() / 2);
        let verified = check(&out, false);
        assert_eq!(places(&verified), [format!("sample {key}")], "{ext}: {:?}", verified.problems);
        assert!(verified.problems[0].reason.contains("CRC"), "{:?}", verified.problems);
        assert_eq!(verified.checked, verified.expected, "the check goes on past the damage");
    }

    #[test]
    fn damaged_metadata_is_named_and_the_samples_are_not_trusted_to_it() {
        let dir = tempfile::tempdir().unwrap();
        let out = packed(dir.path(), OutputFormat::Lmdb);
        let data = out.join("data.mdb");
        // The metadata record's JSON starts with its format name.
        flip(&data, find(&data, b"\"imgpack-lmdb\"") + 3);
        let verified = check(&out, false);
        assert!(!verified.is_ok());
        assert!(verified.problems.iter().any(|p| p.place.contains("__meta__")), "{:?}", verified.problems);
    }
}
