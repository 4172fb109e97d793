//! `pack merge` of LMDB parts: the part databases copied in key order into one database with
//! `MDB_APPEND`, keys renamed to close the gaps skipped files left, every sample's CRC-32
//! checked on the way.

use std::fs::{self, File};
use std::path::Path;

use imgpack_reader::checksum::{crc32, Table, TABLE_KEY};
use imgpack_reader::key::{format_key, split_field_name};
use imgpack_reader::Meta;

use crate::pack::staged::Staged;
use crate::progress::Progress;
use crate::sink::lmdb::{LmdbSink, CHECKPOINT_BYTES};
use crate::sink::{PackedSample, Sink};
use crate::{Error, Result};

use super::{remove_if_present, stop_requested, FoundPart, MergeOptions};

/// The staging directory of an LMDB merge, inside the output.
pub(super) const LMDB_STAGE: &str = ".merged";

/// Copies the part databases into one in `out`; returns its size.
pub(super) fn merge(
    out: &Path,
    parts: &[FoundPart],
    meta: &Meta,
    options: &MergeOptions,
    bar: &dyn Progress,
) -> Result<u64> {
    use heed::types::Bytes;
    let stage = out.join(LMDB_STAGE);
    let hint: u64 = parts.iter().map(|p| fs::metadata(p.dir.join("data.mdb")).map_or(0, |m| m.len())).sum();
    let mut sink = Box::new(LmdbSink::start(Staged::create_dir(&stage, true)?, hint, CHECKPOINT_BYTES)?);
    bar.length(hint);
    for part in parts {
        let damaged = |key: &str, reason: String| Error::Merge {
            path: out.to_path_buf(),
            reason: format!(
                "part {} of {} ({}) is damaged at key {key}: {reason}; re-pack it with --overwrite",
                part.info.index,
                part.info.count,
                part.dir.display()
            ),
        };
        let err = crate::cluster::part::lmdb_error(&part.dir);
        let env = crate::cluster::part::open_lmdb(&part.dir)?;
        let txn = env.read_txn().map_err(err)?;
        let db: heed::Database<Bytes, Bytes> =
            env.open_database(&txn, None).map_err(err)?.ok_or_else(|| damaged("-", "no database".into()))?;
        let table = db
            .get(&txn, TABLE_KEY.as_bytes())
            .map_err(err)?
            .ok_or_else(|| damaged(TABLE_KEY, "missing".into()))
            .and_then(|raw| Table::decode(raw).map_err(|r| damaged(TABLE_KEY, r)))?;
        if table.samples.len() as u64 != part.meta.samples {
            return Err(damaged(
                TABLE_KEY,
                format!("{} checksums for {} samples", table.samples.len(), part.meta.samples),
            ));
        }
        // Sample `j` of the part: its key must be the part's `first + j`, its CRC the table's;
        // it is stored under its merged key.
        let width = part.meta.key_width;
        let mut j = 0u64;
        let mut merged = |mut sample: PackedSample| -> Result<PackedSample> {
            let expected = format_key(part.info.first + j, width);
            if sample.key != expected {
                let reason = format!("expected key {expected} (a part's keys run without gaps)");
                return Err(damaged(&sample.key, reason));
            }
            // Each field's CRC once, here: the sink reuses them for the merged checksum table.
            sample.crcs = sample.fields.iter().map(|(_, bytes)| crc32(bytes)).collect();
            let (want, got) = (table.samples.get(j as usize).copied(), sample.crc());
            if want != Some(got) {
                let reason = format!("CRC-32 {got:08x}, its checksum table says {want:08x?}");
                return Err(damaged(&sample.key, reason));
            }
            sample.key = format_key(part.new_first + j, width);
            j += 1;
            Ok(sample)
        };
        let mut batch: Vec<PackedSample> = Vec::new();
        let mut collecting: Option<PackedSample> = None;
        for record in db.iter(&txn).map_err(err)? {
            let (name, value) = record.map_err(err)?;
            if name.starts_with(b"__") {
                continue;
            }
            let name = String::from_utf8_lossy(name);
            let (key, ext) =
                split_field_name(&name).ok_or_else(|| damaged(&name, "not {key}.{ext}".into()))?;
            if collecting.as_ref().is_none_or(|s| s.key != key) {
                if let Some(done) = collecting.take() {
                    batch.push(merged(done)?);
                    if batch.iter().map(PackedSample::bytes).sum::<u64>() >= 32 << 20 {
                        stop_requested(out)?;
                        sink.write_batch(&batch)?;
                        bar.advance(batch.iter().map(PackedSample::bytes).sum());
                        batch.clear();
                    }
                }
                collecting =
                    Some(PackedSample { key: key.to_string(), fields: Vec::new(), crcs: Vec::new() });
            }
            collecting.as_mut().expect("set above").fields.push((ext.to_string(), value.to_vec()));
        }
        if let Some(done) = collecting.take() {
            batch.push(merged(done)?);
        }
        sink.write_batch(&batch)?;
        bar.advance(batch.iter().map(PackedSample::bytes).sum());
        if j != part.meta.samples {
            return Err(damaged("-", format!("holds {j} samples, its metadata says {}", part.meta.samples)));
        }
        drop(txn);
        // The last handle: the environment closes here, before the part's files are removed.
        drop(env);
    }
    stop_requested(out)?;
    bar.message("syncing to disk");
    let finished = sink.finish(meta)?;
    bar.finish();
    // Publish: lock file first, then data.mdb — a data.mdb in OUT is a finished dataset.
    for file in ["lock.mdb", "data.mdb"] {
        let (from, to) = (finished.path.join(file), out.join(file));
        fs::rename(&from, &to).map_err(Error::io(&to))?;
    }
    File::open(out).and_then(|d| d.sync_all()).map_err(Error::io(out))?;
    remove_if_present(&stage)?;
    if !options.keep_parts {
        for part in parts {
            fs::remove_dir_all(&part.dir).map_err(Error::io(&part.dir))?;
        }
    }
    Ok(finished.bytes)
}

#[cfg(test)]
mod tests {
    use std::num::NonZeroUsize;

    use super::super::testing::parts;
    use super::super::{merge, MergeOptions};
    use crate::OutputFormat;

    #[test]
    fn parts_after_a_skip_are_renamed_to_keys_without_a_gap() {
        let dir = tempfile::tempdir().unwrap();
        let (tree, out) = parts(dir.path(), OutputFormat::Lmdb, 3);
        let options = MergeOptions { keep_parts: false, threads: NonZeroUsize::MIN, endpoint: None };
        let merged = merge(&out, &options, &crate::progress::Silent).unwrap();
        assert_eq!(merged.skipped.len(), 1, "the broken image");
        assert_eq!(merged.renumbered_parts, 2, "the parts after the one that skipped sample 0");
        let dataset = imgpack_reader::open(&out).unwrap().verify_checksums(true).unwrap();
        assert_eq!(dataset.len(), merged.packed);
        for i in 0..dataset.len() {
            // Keys run 0..n-1; each sample's bytes (checked against its CRC-32 on the way) are
            // the file its path names.
            let sample = dataset.get(i).unwrap();
            assert_eq!(sample.key, imgpack_reader::key::format_key(i, dataset.meta().key_width));
            let path = sample.info().unwrap().path;
            assert_eq!(sample.payload().unwrap().1, std::fs::read(tree.join(&path)).unwrap(), "{path}");
        }
        assert!(!out.join("part-0000-of-0003").exists(), "parts deleted without --keep-parts");
    }
}
