//! `pack merge OUT`: the N parts packed into `OUT` ([`crate::cluster::part`]) become one dataset that
//! reads exactly like the output of a single `pack` run: the same keys (0 to `samples - 1` with
//! no gap), labels, bytes and metadata; only the shards are cut differently.
//!
//! Merging first checks that every part is there, finished, and from the same plan, part count,
//! format and options, and names any that is not. Then:
//!
//! - **WebDataset**: the shards stay where the parts wrote them; merge writes the dataset-level
//!   files (`imgpack.index`, `shardindex.json`, then `imgpack.json` last) in `OUT`, listing the
//!   shards as `part-KKKK-of-NNNN/shard-pKKKK-000000.tar`. Reading costs what it costs in a single
//!   run's output: the same index, one map per shard.
//! - **LMDB**: the part databases are copied, in key order, into one database with
//!   `MDB_APPEND` (no B-tree search, pages filled to the brim), checking every sample's CRC-32
//!   on the way; `data.mdb` then moves into `OUT` and the parts are deleted (`--keep-parts`
//!   keeps them). One database is what Python's `lmdb.open(OUT)` and every other LMDB client
//!   read; a set of part databases would need a reader of our own in every language, and would
//!   read no faster. The copy costs one sequential pass over the data (README: "Packing on many
//!   machines").
//!
//! **Keys.** A part keys its samples from the plan index of its first sample. When every file
//! was packed, those are the final keys and nothing is rewritten. When a part skipped files,
//! the samples after them move down to close the gap, as in a single run: LMDB renames them
//! while copying; WebDataset rewrites their 512-byte tar headers in place (same length, since
//! the key width is the plan's), recomputes their CRC-32s, the shards' MD5s and DALI indexes.
//! Every sample read for that is checked against its part's CRC-32 first, and the rewrite is
//! idempotent, so a merge that is interrupted is simply run again.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::fs::{self, File};
use std::io::{BufReader, BufWriter, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::Instant;

use imgpack_reader::checksum::{crc32, Table, TABLE_KEY};
use imgpack_reader::key::{format_key, split_field_name};
use imgpack_reader::part::{parse_dir_name, PartInfo};
use imgpack_reader::webdataset::{
    dali_index_header, dali_index_line, parse_member, DaliComponent, IndexEntry, IndexHeader, WidsIndex,
    BLOCK, INDEX_ENTRY_LEN, INDEX_HEADER_LEN, INDEX_VERSION, META_FILE, SAMPLE_INDEX_FILE, WIDS_INDEX_FILE,
};
use imgpack_reader::{Meta, ShardInfo, FORMAT_VERSION, UNFINISHED_SUFFIX};
use indicatif::ProgressBar;
use md5::{Digest, Md5};
use rayon::prelude::*;
use serde::Serialize;

use crate::encoding::{hex, json_bytes};
use crate::fs::replace_file;
use crate::pack::report::{human_bytes, Skipped};
use crate::pack::staged::Staged;
use crate::sink::lmdb::{LmdbSink, CHECKPOINT_BYTES};
use crate::sink::webdataset::ustar_header;
use crate::sink::{PackedSample, Sink};
use crate::{Error, Result};

/// How to merge.
#[derive(Debug, Clone)]
pub struct MergeOptions {
    /// LMDB: keep the part databases after the merged one is published.
    pub keep_parts: bool,
    /// Threads for rewriting WebDataset shards.
    pub threads: usize,
}

/// What a merge did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Merged {
    /// Always `"merge"`.
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// The merged dataset.
    #[serde(serialize_with = "crate::pack::report::lossy_path")]
    pub output: PathBuf,
    /// `lmdb` or `webdataset`.
    pub format: String,
    /// How many parts were merged.
    pub parts: u64,
    /// Samples the plan listed.
    pub found: u64,
    /// Samples in the merged dataset.
    pub packed: u64,
    /// Planned files the parts skipped, with reasons.
    pub skipped: Vec<Skipped>,
    /// Parts whose samples took new keys because files before them were skipped.
    pub renumbered_parts: u64,
    /// The output was already merged by an earlier run; nothing was written.
    pub already_merged: bool,
    /// Bytes the dataset occupies.
    pub bytes_out: u64,
    /// Wall time.
    pub seconds: f64,
}

impl Merged {
    /// 0 when every planned file was packed, 3 when some were skipped (as `pack` itself); 0
    /// when there was nothing to do (the merge that did it reported them).
    pub fn exit_code(&self) -> i32 {
        if self.skipped.is_empty() || self.already_merged {
            0
        } else {
            3
        }
    }
}

impl fmt::Display for Merged {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.already_merged {
            return writeln!(
                f,
                "{} was already merged ({} samples, {}); nothing to do",
                self.output.display(),
                self.packed,
                self.format
            );
        }
        writeln!(
            f,
            "{} merged {} parts, {} of {} planned files, {}",
            self.output.display(),
            self.parts,
            self.packed,
            self.found,
            self.format
        )?;
        if self.renumbered_parts > 0 {
            writeln!(f, "  renumbered {} parts (keys moved down past skipped files)", self.renumbered_parts)?;
        }
        writeln!(f, "  bytes     {}", human_bytes(self.bytes_out))?;
        writeln!(f, "  time      {:.2} s", self.seconds)?;
        crate::pack::report::write_skipped(f, &self.skipped, self.packed, self.found)
    }
}

/// One finished part found in the output.
#[derive(Debug)]
struct FoundPart {
    dir: PathBuf,
    name: String,
    meta: Meta,
    info: PartInfo,
    /// The key its first sample takes in the merged dataset.
    new_first: u64,
}

impl FoundPart {
    fn renumbered(&self) -> bool {
        self.new_first != self.info.first
    }
}

/// Merges the parts in `out` into one dataset there. See the module documentation. The bar
/// (hidden or not) shows the bytes copied (LMDB) or rewritten (WebDataset with moved keys).
pub fn merge(out: &Path, options: &MergeOptions, bar: &ProgressBar) -> Result<Merged> {
    let started = Instant::now();
    if !out.is_dir() {
        return Err(Error::Usage(format!(
            "{}: not a directory; pass the -o directory the parts were packed into",
            out.display()
        )));
    }
    let _lock = crate::pack::staged::OutputLock::acquire(out)?;
    let mut merged = if imgpack_reader::detect(out).is_some() {
        already_merged(out, options)?
    } else {
        let parts = find_parts(out)?;
        let first = &parts[0];
        let mut meta = Meta {
            samples: parts.iter().map(|p| p.meta.samples).sum(),
            fields: parts
                .iter()
                .flat_map(|p| p.meta.fields.iter().cloned())
                .collect::<BTreeSet<_>>()
                .into_iter()
                .collect(),
            tool: crate::TOOL.into(),
            version: FORMAT_VERSION,
            checksum: Some(imgpack_reader::checksum::ALGORITHM.into()),
            shards: Vec::new(),
            part: None,
            ..first.meta.clone()
        };
        let bytes_out = if meta.format == imgpack_reader::lmdb::FORMAT_NAME {
            merge_lmdb(out, &parts, &meta, options, bar)?
        } else {
            merge_webdataset(out, &parts, &mut meta, options, bar)?
        };
        Merged {
            kind: "merge",
            output: out.to_path_buf(),
            format: short_format(&meta.format),
            parts: first.info.count,
            found: first.info.plan_samples,
            packed: meta.samples,
            skipped: skipped(parts.iter().map(|p| &p.info), &first.meta.source.root),
            renumbered_parts: parts.iter().filter(|p| p.renumbered()).count() as u64,
            already_merged: false,
            bytes_out,
            seconds: 0.0,
        }
    };
    merged.seconds = started.elapsed().as_secs_f64();
    Ok(merged)
}

fn short_format(format: &str) -> String {
    format.strip_prefix("imgpack-").unwrap_or(format).to_string()
}

/// The skipped files of the parts, with paths under the source root.
fn skipped<'a>(parts: impl Iterator<Item = &'a PartInfo>, root: &str) -> Vec<Skipped> {
    parts
        .flat_map(|p| p.skipped.iter())
        .map(|s| Skipped::new(Path::new(root).join(&s.path), s.reason.clone()))
        .collect()
}

/// The summary for an output a merge already finished: it must open as a dataset. An LMDB
/// merge interrupted after publishing may have left its parts and staging directory; they are
/// removed now (unless `keep_parts`).
fn already_merged(out: &Path, options: &MergeOptions) -> Result<Merged> {
    let dataset = imgpack_reader::open(out)?;
    let meta = dataset.meta().clone();
    let lmdb = meta.format == imgpack_reader::lmdb::FORMAT_NAME;
    drop(dataset);
    let dirs: Vec<PathBuf> = part_dirs(out)?.0.into_iter().map(|(name, _)| out.join(name)).collect();
    let mut infos: Vec<PartInfo> = Vec::new();
    for dir in &dirs {
        infos.extend(crate::cluster::part::read_meta(dir)?.and_then(|meta| meta.part));
    }
    if lmdb {
        remove_if_present(&out.join(LMDB_STAGE))?;
        if !options.keep_parts {
            for dir in &dirs {
                fs::remove_dir_all(dir).map_err(Error::io(dir))?;
            }
        }
    }
    let count = shard_dirs(&meta).len();
    Ok(Merged {
        kind: "merge",
        output: out.to_path_buf(),
        format: short_format(&meta.format),
        parts: infos.first().map_or(count as u64, |p| p.count),
        found: meta.samples + infos.iter().map(|p| p.skipped.len() as u64).sum::<u64>(),
        packed: meta.samples,
        skipped: skipped(infos.iter(), &meta.source.root),
        renumbered_parts: 0,
        already_merged: true,
        bytes_out: dataset_bytes(out, &meta),
        seconds: 0.0,
    })
}

/// The part directories a merged dataset's shards are in.
fn shard_dirs(meta: &Meta) -> BTreeSet<&str> {
    meta.shards.iter().filter_map(|s| s.name.split_once('/')).map(|(dir, _)| dir).collect()
}

/// The bytes of the files in `out`, and in the part directories its shards are in.
fn dataset_bytes(out: &Path, meta: &Meta) -> u64 {
    let parts = shard_dirs(meta).into_iter().map(|d| crate::fs::disk_usage(&out.join(d)));
    crate::fs::disk_usage(out) + parts.sum::<u64>()
}

fn remove_if_present(path: &Path) -> Result<()> {
    match fs::remove_dir_all(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(Error::io(path)(e)),
        _ => Ok(()),
    }
}

/// The finished part directories in `out` (name, (index, count)) and the unfinished ones
/// (their temporary directories), by name.
#[allow(clippy::type_complexity)]
fn part_dirs(out: &Path) -> Result<(Vec<(String, (u64, u64))>, BTreeMap<(u64, u64), String>)> {
    let mut finished = Vec::new();
    let mut unfinished = BTreeMap::new();
    for entry in fs::read_dir(out).map_err(Error::io(out))? {
        let entry = entry.map_err(Error::io(out))?;
        let Ok(name) = entry.file_name().into_string() else { continue };
        if let Some(part) = parse_dir_name(&name) {
            finished.push((name, part));
        } else if let Some(part) =
            name.strip_prefix('.').and_then(|n| n.strip_suffix(UNFINISHED_SUFFIX)).and_then(parse_dir_name)
        {
            unfinished.insert(part, name);
        }
    }
    finished.sort();
    Ok((finished, unfinished))
}

/// Every part of the output, checked to be present, finished and of one plan; with the keys
/// their samples take in the merged dataset.
fn find_parts(out: &Path) -> Result<Vec<FoundPart>> {
    let refuse = |reason: String| Error::Merge { path: out.to_path_buf(), reason };
    let (finished, unfinished) = part_dirs(out)?;
    let counts: BTreeSet<u64> =
        finished.iter().map(|(_, (_, n))| *n).chain(unfinished.keys().map(|(_, n)| *n)).collect();
    let count = match counts.len() {
        0 => {
            return Err(refuse(
                "it holds no parts; pack them first with `pack PLAN --part K/N --to FORMAT -o OUT` for K = 0 .. N-1".into(),
            ))
        }
        1 => *counts.first().expect("one count"),
        _ => {
            return Err(refuse(format!(
                "it holds parts of splits into different numbers of parts (N = {}); keep only the parts of one split (remove the others)",
                counts.iter().map(u64::to_string).collect::<Vec<_>>().join(", ")
            )))
        }
    };
    let present: BTreeMap<u64, String> = finished.into_iter().map(|(name, (k, _))| (k, name)).collect();
    let mut problems = Vec::new();
    for k in 0..count {
        let name = imgpack_reader::part::dir_name(k, count);
        if let Some(temp) = unfinished.get(&(k, count)) {
            problems.push(format!(
                "part {k} of {count} is still being written, or was interrupted ({}): wait for it to finish, or run its command (`pack PLAN --part {k}/{count} ...`) again to continue it",
                out.join(temp).display()
            ));
        } else if !present.contains_key(&k) {
            problems.push(format!(
                "part {k} of {count} is missing (no {}): run `pack PLAN --part {k}/{count} ...` for it",
                out.join(&name).display()
            ));
        }
    }
    if !problems.is_empty() {
        return Err(refuse(problems.join("; ")));
    }
    let mut parts: Vec<FoundPart> = Vec::with_capacity(count as usize);
    for (k, name) in present {
        let dir = out.join(&name);
        let meta = crate::cluster::part::read_meta(&dir)?.ok_or_else(|| {
            refuse(format!("{} holds no finished part (no metadata); run its command again", dir.display()))
        })?;
        let Some(info) = meta.part.clone() else {
            return Err(refuse(format!("{} holds a whole dataset, not a part; remove it", dir.display())));
        };
        if (info.index, info.count) != (k, count) {
            return Err(refuse(format!(
                "{} holds part {} of {}, not part {k} of {count}; it was renamed: re-pack part {k}/{count}",
                dir.display(),
                info.index,
                info.count
            )));
        }
        if let Some(first) = parts.first() {
            let theirs = format!("part {k} of {count} ({})", dir.display());
            if info.plan != first.info.plan {
                return Err(refuse(format!(
                    "{theirs} was packed from another plan than part 0 (plan MD5 {} vs {}); re-pack it from the same plan with --overwrite",
                    info.plan, first.info.plan
                )));
            }
            if meta.format != first.meta.format || meta.options != first.meta.options {
                let differences = crate::pack::recorded::differences(&first.meta.options, &meta.options);
                return Err(refuse(format!(
                    "{theirs} was packed with other options than part 0 ({}); re-pack it with the same command and --overwrite",
                    if meta.format != first.meta.format {
                        format!("format {} vs {}", meta.format, first.meta.format)
                    } else {
                        differences.join(", ")
                    }
                )));
            }
        }
        let expected_first = parts.last().map_or(0, |p: &FoundPart| p.info.first + p.info.planned);
        if info.first != expected_first || meta.samples + info.skipped.len() as u64 != info.planned {
            return Err(refuse(format!(
                "part {k} of {count} ({}) covers plan samples {}..{} with {} packed and {} skipped, which does not continue the part before it at {expected_first}; it is damaged: re-pack it with --overwrite",
                dir.display(),
                info.first,
                info.first + info.planned,
                meta.samples,
                info.skipped.len()
            )));
        }
        let new_first = parts.last().map_or(0, |p| p.new_first + p.meta.samples);
        parts.push(FoundPart { dir, name, meta, info, new_first });
    }
    let last = parts.last().expect("count >= 1");
    if last.info.first + last.info.planned != last.info.plan_samples {
        return Err(refuse(format!(
            "the parts cover {} of the plan's {} samples; they are damaged: re-pack them",
            last.info.first + last.info.planned,
            last.info.plan_samples
        )));
    }
    Ok(parts)
}

/// The staging directory of an LMDB merge, inside the output.
const LMDB_STAGE: &str = ".merged";

/// Copies the part databases into one in `out`; returns its size.
fn merge_lmdb(
    out: &Path,
    parts: &[FoundPart],
    meta: &Meta,
    options: &MergeOptions,
    bar: &ProgressBar,
) -> Result<u64> {
    use heed::types::Bytes;
    let stage = out.join(LMDB_STAGE);
    let hint: u64 = parts.iter().map(|p| fs::metadata(p.dir.join("data.mdb")).map_or(0, |m| m.len())).sum();
    let mut sink = Box::new(LmdbSink::start(Staged::create_dir(&stage, true)?, hint, CHECKPOINT_BYTES)?);
    bar.set_length(hint);
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
                        sink.write_batch(&batch)?;
                        bar.inc(batch.iter().map(PackedSample::bytes).sum());
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
        bar.inc(batch.iter().map(PackedSample::bytes).sum());
        if j != part.meta.samples {
            return Err(damaged("-", format!("holds {j} samples, its metadata says {}", part.meta.samples)));
        }
        drop(txn);
        // The last handle: the environment closes here, before the part's files are removed.
        drop(env);
    }
    bar.set_message("syncing to disk");
    let finished = sink.finish(meta)?;
    bar.finish_and_clear();
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

/// Writes the dataset-level files of a WebDataset merged from `parts` (renumbering the parts
/// that need it first); `meta` gets the shard list. Returns the dataset's size.
fn merge_webdataset(
    out: &Path,
    parts: &[FoundPart],
    meta: &mut Meta,
    options: &MergeOptions,
    bar: &ProgressBar,
) -> Result<u64> {
    let moved = parts.iter().filter(|p| p.renumbered()).flat_map(|p| &p.meta.shards).map(|s| s.bytes).sum();
    bar.set_length(moved);
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(options.threads.max(1))
        .build()
        .map_err(|e| Error::Usage(format!("cannot start {} threads: {e}", options.threads)))?;
    let index_path = out.join(SAMPLE_INDEX_FILE);
    let index_temp = crate::fs::temp_path(&index_path);
    let io = Error::io(&index_temp);
    let mut index = BufWriter::new(File::create(&index_temp).map_err(io)?);
    index.write_all(&[0; INDEX_HEADER_LEN]).map_err(Error::io(&index_temp))?;
    let mut shards: Vec<ShardInfo> = Vec::new();
    for part in parts {
        let mut entries = read_index(part)?;
        let mut part_shards = part.meta.shards.clone();
        if part.renumbered() {
            let results: Vec<Result<Renumbered>> = pool.install(|| {
                part_shards
                    .par_iter()
                    .map(|shard| {
                        let range = shard.first as usize..(shard.first + shard.samples) as usize;
                        let renumbered = renumber_shard(part, shard, &entries[range]);
                        bar.inc(shard.bytes);
                        renumbered
                    })
                    .collect()
            });
            for (shard, result) in part_shards.iter_mut().zip(results) {
                let renumbered = result?;
                shard.md5 = renumbered.md5;
                for (entry, crc) in entries[shard.first as usize..].iter_mut().zip(renumbered.crcs) {
                    entry.crc32 = crc;
                }
            }
        }
        let shard_base = shards.len() as u32;
        for mut entry in entries {
            entry.shard += shard_base;
            index.write_all(&entry.encode()).map_err(Error::io(&index_temp))?;
        }
        shards.extend(part_shards.into_iter().map(|s| ShardInfo {
            name: format!("{}/{}", part.name, s.name),
            first: part.new_first + s.first,
            ..s
        }));
    }
    meta.shards = shards;
    let meta_json = json_bytes(meta);
    let header = IndexHeader { version: INDEX_VERSION, meta_crc32: crc32(&meta_json), samples: meta.samples };
    let mut index = index.into_inner().map_err(|e| Error::io(&index_temp)(e.into_error()))?;
    index.seek(SeekFrom::Start(0)).map_err(Error::io(&index_temp))?;
    index.write_all(&header.encode()).and_then(|()| index.sync_all()).map_err(Error::io(&index_temp))?;
    drop(index);
    fs::rename(&index_temp, &index_path).map_err(Error::io(&index_path))?;
    replace_file(&out.join(WIDS_INDEX_FILE), &json_bytes(&WidsIndex::of(&meta.shards)))?;
    // Last: a directory with imgpack.json is a finished dataset.
    replace_file(&out.join(META_FILE), &meta_json)?;
    bar.finish_and_clear();
    Ok(dataset_bytes(out, meta))
}

/// The index entries of a WebDataset part, checked against its metadata.
fn read_index(part: &FoundPart) -> Result<Vec<IndexEntry>> {
    let path = part.dir.join(SAMPLE_INDEX_FILE);
    let damaged = |reason: String| Error::Merge {
        path: part.dir.clone(),
        reason: format!("{SAMPLE_INDEX_FILE}: {reason}; the part is damaged: re-pack it with --overwrite"),
    };
    let mut file = BufReader::new(File::open(&path).map_err(Error::io(&path))?);
    let mut header = [0u8; INDEX_HEADER_LEN];
    file.read_exact(&mut header).map_err(Error::io(&path))?;
    let header = IndexHeader::decode(&header).ok_or_else(|| damaged("no valid header".into()))?;
    if header.samples != part.meta.samples {
        return Err(damaged(format!("{} entries for {} samples", header.samples, part.meta.samples)));
    }
    let mut entries = Vec::with_capacity(part.meta.samples as usize);
    let mut raw = [0u8; INDEX_ENTRY_LEN];
    for _ in 0..part.meta.samples {
        file.read_exact(&mut raw).map_err(Error::io(&path))?;
        entries.push(IndexEntry::decode(&raw));
    }
    let shards_cover = part.meta.shards.iter().map(|s| s.samples).sum::<u64>() == part.meta.samples
        && part.meta.shards.iter().enumerate().all(|(n, s)| {
            entries[s.first as usize..(s.first + s.samples) as usize].iter().all(|e| e.shard as usize == n)
        });
    if !shards_cover {
        return Err(damaged("entries do not match the shards the metadata lists".into()));
    }
    Ok(entries)
}

/// A shard after renumbering.
struct Renumbered {
    md5: String,
    crcs: Vec<u32>,
}

/// Gives the samples of one shard of a part their merged keys: rewrites each member's tar
/// header in place (only if it still carries the part's key), checks the sample against its
/// recorded CRC-32 under its old key, and returns the new CRC-32s and the shard's new MD5;
/// rewrites the shard's DALI index. Running it twice gives the same result.
fn renumber_shard(part: &FoundPart, shard: &ShardInfo, entries: &[IndexEntry]) -> Result<Renumbered> {
    let path = part.dir.join(&shard.name);
    let damaged = |reason: String| Error::Merge {
        path: path.clone(),
        reason: format!("{reason}; the part is damaged: re-pack it with --overwrite"),
    };
    let file = fs::OpenOptions::new().read(true).write(true).open(&path).map_err(Error::io(&path))?;
    let len = file.metadata().map_err(Error::io(&path))?.len();
    if len != shard.bytes {
        return Err(damaged(format!("{len} bytes, the part's metadata says {}", shard.bytes)));
    }
    let width = part.meta.key_width;
    let mut md5 = Md5::new();
    let mut crcs = Vec::with_capacity(entries.len());
    let mut dali = dali_index_header(entries.len() as u64);
    let mut buf = Vec::new();
    let mut pos = 0u64;
    for (j, entry) in entries.iter().enumerate() {
        if entry.offset != pos {
            return Err(damaged(format!("sample {j} starts at {}, not at {pos}", entry.offset)));
        }
        buf.resize(entry.len as usize, 0);
        file.read_exact_at(&mut buf, entry.offset).map_err(Error::io(&path))?;
        let old_key = format_key(part.info.first + shard.first + j as u64, width);
        let new_key = format_key(part.new_first + shard.first + j as u64, width);
        // Each member: where its header is, its extension and size.
        let mut members = Vec::new();
        let mut at = 0;
        while at < buf.len() {
            let member = parse_member(&buf, at).map_err(|r| damaged(format!("sample {old_key}: {r}")))?;
            let (key, ext) = split_field_name(member.name)
                .filter(|(key, _)| *key == old_key || *key == new_key)
                .ok_or_else(|| damaged(format!("member {:?} is not sample {old_key}'s", member.name)))?;
            members.push((at, ext.to_string(), member.data.len() as u64, key == new_key));
            at = member.next;
        }
        let set_headers = |buf: &mut [u8], key: &str| -> Result<()> {
            for (at, ext, size, _) in &members {
                let header = ustar_header(&format!("{key}.{ext}"), *size).map_err(damaged)?;
                buf[*at..*at + BLOCK as usize].copy_from_slice(&header);
            }
            Ok(())
        };
        set_headers(&mut buf, &old_key)?;
        if crc32(&buf) != entry.crc32 {
            return Err(damaged(format!("sample {old_key} does not match its CRC-32")));
        }
        set_headers(&mut buf, &new_key)?;
        let mut components = Vec::with_capacity(members.len());
        for (at, ext, size, renamed) in &members {
            if !renamed {
                file.write_all_at(&buf[*at..*at + BLOCK as usize], entry.offset + *at as u64)
                    .map_err(Error::io(&path))?;
            }
            components.push(DaliComponent {
                ext: ext.clone(),
                offset: entry.offset + *at as u64 + BLOCK,
                size: *size,
                name: format!("{new_key}.{ext}"),
            });
        }
        dali.push_str(&dali_index_line(&components));
        crcs.push(crc32(&buf));
        md5.update(&buf);
        pos += entry.len;
    }
    let mut tail = vec![0u8; (len - pos) as usize];
    file.read_exact_at(&mut tail, pos).map_err(Error::io(&path))?;
    md5.update(&tail);
    file.sync_data().map_err(Error::io(&path))?;
    let idx = part.dir.join(format!("{}.idx", shard.name.strip_suffix(".tar").unwrap_or(&shard.name)));
    replace_file(&idx, dali.as_bytes())?;
    Ok(Renumbered { md5: hex(&md5.finalize()), crcs })
}
