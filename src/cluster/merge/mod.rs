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
//! - **In a store** (`pack merge s3://bucket/out/`): WebDataset parts uploaded under the prefix
//!   are merged there as on disk (module `stored`); LMDB parts are refused (merged on disk only).
//!
//! **Keys.** A part keys its samples from the plan index of its first sample. When every file
//! was packed, those are the final keys and nothing is rewritten. When a part skipped files,
//! the samples after them move down to close the gap, as in a single run: LMDB renames them
//! while copying; WebDataset rewrites their 512-byte tar headers in place (same length, since
//! the key width is the plan's), recomputes their CRC-32s, the shards' MD5s and DALI indexes.
//! Every sample read for that is checked against its part's CRC-32 first, and the rewrite is
//! idempotent, so a merge that is interrupted is simply run again.
//!
//! **Ctrl-C.** `pack merge` installs the stop handler ([`crate::interrupt`]): a stop request
//! is honoured between shards (WebDataset) and batches (LMDB) and before publishing, never
//! once publishing has begun, and ends the merge with [`Error::MergeInterrupted`], the output
//! as it was found (an LMDB merge's staging directory and a WebDataset merge's index
//! temporary removed, a store prefix's lock released).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::Instant;

use imgpack_reader::part::{parse_dir_name, PartInfo};
use imgpack_reader::{Meta, FORMAT_VERSION, UNFINISHED_SUFFIX};
use serde::Serialize;

use crate::pack::report::Skipped;
use crate::progress::Progress;
use crate::size::human_bytes;
use crate::{Error, Result};

mod lmdb;
mod stored;
mod webdataset;

/// How to merge.
#[derive(Debug, Clone)]
pub struct MergeOptions {
    /// LMDB: keep the part databases after the merged one is published.
    pub keep_parts: bool,
    /// Threads for rewriting WebDataset shards.
    pub threads: std::num::NonZeroUsize,
    /// The object store endpoint for an `s3://` output (none: the environment's, else AWS).
    pub endpoint: Option<String>,
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
    /// What the user should know besides (a store merge that took over a stale lock).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
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
        if self.already_merged && self.parts == 0 {
            return writeln!(
                f,
                "{} is a complete {} dataset with no parts in it (the output of a single pack run, or a merge whose parts were deleted): there is nothing to merge",
                self.output.display(),
                self.format
            );
        }
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
/// `out` may be an `s3://bucket/prefix/` holding WebDataset parts (module `stored`).
pub fn merge(out: &Path, options: &MergeOptions, bar: &dyn Progress) -> Result<Merged> {
    let started = Instant::now();
    if let Some(url) = crate::store::StoreUrl::of_path(out)? {
        let mut merged = stored::merge(&url, options, bar)?;
        merged.seconds = started.elapsed().as_secs_f64();
        return Ok(merged);
    }
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
        let mut meta = merged_meta(&parts);
        let bytes_out = if meta.format == imgpack_reader::lmdb::FORMAT_NAME {
            lmdb::merge(out, &parts, &meta, options, bar)?
        } else {
            webdataset::merge(&webdataset::Local { out }, &parts, &mut meta, options, bar)?
        };
        summary(out.to_path_buf(), &parts, &meta, bytes_out)
    };
    merged.seconds = started.elapsed().as_secs_f64();
    Ok(merged)
}

/// Fails with [`Error::MergeInterrupted`] once a stop was asked for (Ctrl-C, SIGTERM: `pack
/// merge` installs [`crate::interrupt`]'s handler). Called between shards and batches and
/// before publishing, never after: a merge that has started publishing finishes, and one
/// stopped before is run again.
fn stop_requested(out: &Path) -> Result<()> {
    if crate::interrupt::requested() {
        return Err(Error::MergeInterrupted { path: out.to_path_buf() });
    }
    Ok(())
}

/// The metadata of the dataset merged from `parts` (found and checked by [`find_parts`]),
/// before the format's merge adds its shards.
fn merged_meta(parts: &[FoundPart]) -> Meta {
    Meta {
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
        ..parts[0].meta.clone()
    }
}

/// What a merge of `parts` into `out` that wrote `meta` and `bytes_out` bytes reports.
fn summary(out: PathBuf, parts: &[FoundPart], meta: &Meta, bytes_out: u64) -> Merged {
    let first = &parts[0];
    Merged {
        kind: "merge",
        output: out,
        format: short_format(&meta.format),
        parts: first.info.count,
        found: first.info.plan_samples,
        packed: meta.samples,
        skipped: skipped(parts.iter().map(|p| &p.info), &first.meta.source.root),
        renumbered_parts: parts.iter().filter(|p| p.renumbered()).count() as u64,
        already_merged: false,
        bytes_out,
        seconds: 0.0,
        warnings: Vec::new(),
    }
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
        remove_if_present(&out.join(lmdb::LMDB_STAGE))?;
        if !options.keep_parts {
            for dir in &dirs {
                fs::remove_dir_all(dir).map_err(Error::io(dir))?;
            }
        }
    }
    Ok(already_summary(out.to_path_buf(), &meta, &infos, dataset_bytes(out, &meta)))
}

/// What a merge of an output that an earlier merge finished (`meta`, from parts `infos`, of
/// `bytes_out` bytes) reports.
fn already_summary(out: PathBuf, meta: &Meta, infos: &[PartInfo], bytes_out: u64) -> Merged {
    // A WebDataset merged from parts lists its shards in the part directories; a single run's
    // lists them at the top, and has no part directory: `parts` is then 0.
    let count = shard_dirs(meta).len();
    Merged {
        kind: "merge",
        output: out,
        format: short_format(&meta.format),
        parts: infos.first().map_or(count as u64, |p| p.count),
        found: meta.samples + infos.iter().map(|p| p.skipped.len() as u64).sum::<u64>(),
        packed: meta.samples,
        skipped: skipped(infos.iter(), &meta.source.root),
        renumbered_parts: 0,
        already_merged: true,
        bytes_out,
        seconds: 0.0,
        warnings: Vec::new(),
    }
}

/// The part directories a merged dataset's shards are in (none for one run's output).
pub(crate) fn shard_dirs(meta: &Meta) -> BTreeSet<&str> {
    meta.shards.iter().filter_map(|s| s.name.split_once('/')).map(|(dir, _)| dir).collect()
}

/// The bytes of the files in `out`, and in the part directories its shards are in.
pub(crate) fn dataset_bytes(out: &Path, meta: &Meta) -> u64 {
    let parts = shard_dirs(meta).into_iter().map(|d| crate::fs::disk_usage(&out.join(d)));
    crate::fs::disk_usage(out) + parts.sum::<u64>()
}

fn remove_if_present(path: &Path) -> Result<()> {
    match fs::remove_dir_all(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(Error::io(path)(e)),
        _ => Ok(()),
    }
}

/// The part directories in `out`, finished and unfinished, by name.
type PartDirs = (Vec<(String, (u64, u64))>, BTreeMap<(u64, u64), String>);

/// The finished part directories in `out` (name, (index, count)) and the unfinished ones
/// (their temporary directories), by name.
pub(crate) fn part_dirs(out: &Path) -> Result<PartDirs> {
    let mut names = Vec::new();
    for entry in fs::read_dir(out).map_err(Error::io(out))? {
        let entry = entry.map_err(Error::io(out))?;
        names.extend(entry.file_name().into_string().ok());
    }
    Ok(sort_part_dirs(names))
}

/// Of the entry `names` of an output (files and directories on disk, the first `/`-separated
/// part of the keys in a store), the finished part directories and the unfinished ones.
fn sort_part_dirs(names: impl IntoIterator<Item = String>) -> PartDirs {
    let mut finished = Vec::new();
    let mut unfinished = BTreeMap::new();
    for name in names {
        if let Some(part) = parse_dir_name(&name) {
            finished.push((name, part));
        } else if let Some(part) =
            name.strip_prefix('.').and_then(|n| n.strip_suffix(UNFINISHED_SUFFIX)).and_then(parse_dir_name)
        {
            unfinished.insert(part, name);
        }
    }
    finished.sort();
    finished.dedup();
    (finished, unfinished)
}

/// Every part in the directory `out`, checked as [`check_parts`] does.
fn find_parts(out: &Path) -> Result<Vec<FoundPart>> {
    check_parts(out, part_dirs(out)?, |name| crate::cluster::part::read_meta(&out.join(name)))
}

/// Every part of the output `out`, whose part directories are `dirs`, checked to be present,
/// finished and of one plan; with the keys their samples take in the merged dataset.
/// `read_meta` reads the metadata of the part directory it is given the name of (`None` when
/// there is none: the part is not finished).
fn check_parts(
    out: &Path,
    (finished, unfinished): PartDirs,
    read_meta: impl Fn(&str) -> Result<Option<Meta>>,
) -> Result<Vec<FoundPart>> {
    let refuse = |reason: String| Error::Merge { path: out.to_path_buf(), reason };
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
        let meta = read_meta(&name)?.ok_or_else(|| {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn part_directories_are_found_among_a_stores_key_prefixes() {
        // A store lists keys: their first part, once per object.
        let names = [
            "part-0001-of-0003",
            "part-0000-of-0003",
            "part-0000-of-0003",
            ".part-0002-of-0003.imgpack-tmp",
            "imgpack.json",
            "part-3-of-3",
        ];
        let (finished, unfinished) = sort_part_dirs(names.map(String::from));
        assert_eq!(
            finished,
            [("part-0000-of-0003".to_string(), (0, 3)), ("part-0001-of-0003".to_string(), (1, 3))]
        );
        assert_eq!(unfinished, BTreeMap::from([((2, 3), ".part-0002-of-0003.imgpack-tmp".to_string())]));
    }
}

#[cfg(test)]
pub(crate) mod testing {
    //! Parts for the merge tests: testdata with one broken image first, planned and packed as
    //! parts by the real pipeline, so the part after the broken image must be renumbered.

    use std::fs;
    use std::path::{Path, PathBuf};

    use crate::cluster::split::Part;
    use crate::{OutputFormat, PackConfig};

    fn copy_tree(from: &Path, to: &Path) {
        fs::create_dir_all(to).unwrap();
        for entry in fs::read_dir(from).unwrap() {
            let entry = entry.unwrap();
            if entry.file_type().unwrap().is_dir() {
                copy_tree(&entry.path(), &to.join(entry.file_name()));
            } else {
                fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
            }
        }
    }

    /// The tree (testdata plus `cat/0broken.jpg`, plan sample 0, which is skipped) and its
    /// parts packed into `dir/out` as `format`, `count` of them.
    pub fn parts(dir: &Path, format: OutputFormat, count: u64) -> (PathBuf, PathBuf) {
        let tree = dir.join("tree");
        copy_tree(&Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/imagefolder"), &tree);
        fs::write(tree.join("cat/0broken.jpg"), b"\xff\xd8\xff not a jpeg").unwrap();
        let plan = dir.join("t.plan");
        let extensions: Vec<String> =
            crate::pack::config::DEFAULT_EXTENSIONS.iter().map(|e| e.to_string()).collect();
        crate::source::plan::make(
            &tree,
            &extensions,
            None,
            std::num::NonZeroUsize::MIN,
            None,
            &crate::progress::Silent,
            &crate::source::plan::PlanFile::Local(plan.clone()),
        )
        .unwrap();
        let out = dir.join("out");
        for index in 0..count {
            let mut config = PackConfig::new(&plan, &out, format.clone());
            config.part = Some(Part { index, count });
            crate::pack::pack(&config, &crate::progress::Silent).unwrap();
        }
        (tree, out)
    }
}
