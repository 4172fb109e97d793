//! Plan files: a source walked once and written down (`pack plan SRC -o PLAN`), to be packed
//! later with `pack PLAN --to ...` — here, or split across the machines of a cluster job.
//!
//! Walking a tree of millions of files on a shared file system is the slow part that every
//! machine of a job would otherwise repeat. A plan holds everything a run takes from the walk:
//! the classes, and every sample in its final order (the same walk, class indices, shuffle and
//! seed as `pack SRC` itself) with its size and modification time, so a run from the plan
//! writes exactly what `pack SRC` writes. The format is in FORMAT.md ("Plan files"): zstd-
//! compressed JSON Lines, a header line and then one line per sample.
//!
//! The tree may be local or stored under an `s3://` prefix, and the plan a file or an object
//! ([`stored`]), so the machines of a job need share no volume: a plan of a stored tree names
//! its prefix as its root, and packing it reads the images from the store.

pub mod stored;

pub use stored::{PlanFile, StoredPlan};

use std::fs::File;
use std::io::{BufRead, BufReader, BufWriter, Read, Write};
use std::num::NonZeroUsize;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::cluster::split::Part;
use crate::source::{Listing, LoadError, Samples, Source, SourceSample, Stamp, Stamps};
use crate::{Error, Result};

/// The `format` value of a plan's header.
pub const FORMAT_NAME: &str = "imgpack-plan";
/// The plan format version this crate writes and reads.
pub const PLAN_VERSION: u32 = 1;

/// A plan's first line.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Header {
    /// Always [`FORMAT_NAME`].
    pub format: String,
    /// [`PLAN_VERSION`].
    pub version: u32,
    /// The tool that wrote it, e.g. `imgpack 0.1.0`.
    pub tool: String,
    /// The source root as given to `pack plan` (what a dataset's metadata records).
    pub root: String,
    /// The source root as an absolute path (where the files are read from).
    pub root_abs: String,
    /// The options that shaped the sample list: `extensions`, `shuffle`, `seed`.
    pub options: serde_json::Value,
    /// Class names in class-index order.
    pub classes: Vec<String>,
    /// Classes without samples (they keep their index).
    pub empty_classes: Vec<String>,
    /// What the walk noticed (symlink loops, unreadable directories).
    pub warnings: Vec<String>,
    /// How many sample lines follow.
    pub samples: u64,
    /// Their total size in bytes.
    pub bytes: u64,
}

/// One sample line.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Planned {
    /// The path relative to the root, `/`-separated (lossy if not UTF-8; see `path_hex`).
    pub path: String,
    /// The exact path bytes in hex, only when the path is not UTF-8.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path_hex: Option<String>,
    /// The class index.
    pub class: u32,
    /// Size in bytes when planned (0 if it could not be `stat`ed; packing then says why).
    pub size: u64,
    /// Modification time in nanoseconds since the epoch when planned (0 if not `stat`ed).
    pub mtime_ns: i64,
}

impl Planned {
    /// The size and modification time when planned; `None` if the file could not be `stat`ed
    /// then (recorded as size 0 and time 0).
    pub fn stamp(&self) -> Option<Stamp> {
        (self.size != 0 || self.mtime_ns != 0).then_some(Stamp { size: self.size, mtime_ns: self.mtime_ns })
    }

    /// The exact relative path bytes, from `path` or, when it is not UTF-8, `path_hex`.
    pub fn path_bytes(&self) -> std::result::Result<Vec<u8>, String> {
        imgpack_reader::SampleInfo {
            path: self.path.clone(),
            class: String::new(),
            path_hex: self.path_hex.clone(),
        }
        .path_bytes()
    }
}

/// A plan, or the samples of one part of it, as a run packs it: each sample's path, class and
/// planned size (the modification times are only for [`visit`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// The header.
    pub header: Header,
    /// The samples in order: all of them, or one part's ([`Plan::read`]). Their indices are
    /// their plan indices.
    pub samples: Samples,
    /// The plan index of the first sample (0 for a whole plan).
    pub first: u64,
}

/// A plan still to be written, whose samples are a listing's: [`ListingPlan::write`] turns each
/// into its line as it goes, so writing a plan of millions of samples holds no second copy of
/// them (a `Planned` per sample would add ~100 bytes each to the listing's own).
#[derive(Debug)]
pub struct ListingPlan<'a> {
    /// The header, complete.
    pub header: Header,
    listing: &'a Listing,
    stamps: &'a Stamps,
}

impl<'a> ListingPlan<'a> {
    /// A plan of `listing` (already in its final order) with the samples' `stamps`, made from
    /// the tree at `root` (as given, and where its files are read: the absolute path of a local
    /// tree, the `s3://` prefix of a stored one) with the listing `options`.
    pub fn new(
        root: Root,
        options: serde_json::Value,
        listing: &'a Listing,
        stamps: &'a Stamps,
    ) -> ListingPlan<'a> {
        let mut plan = ListingPlan::of_listing(listing, stamps);
        plan.header.root = root.given;
        plan.header.root_abs = root.read_from;
        plan.header.options = options;
        plan
    }

    /// A plan of `listing` with the samples' `stamps` that names no root and no options: what
    /// a resumable run saves of its listing, to tell later whether the source changed
    /// ([`crate::pack::resume`]). One format for both, so one reader and one writer.
    pub fn of_listing(listing: &'a Listing, stamps: &'a Stamps) -> ListingPlan<'a> {
        let bytes = stamps.total_size();
        ListingPlan {
            header: Header {
                format: FORMAT_NAME.into(),
                version: PLAN_VERSION,
                tool: crate::TOOL.into(),
                root: String::new(),
                root_abs: String::new(),
                options: serde_json::Value::Null,
                classes: listing.classes.clone(),
                empty_classes: listing.empty_classes.clone(),
                warnings: listing.warnings.clone(),
                samples: listing.samples.len() as u64,
                bytes,
            },
            listing,
            stamps,
        }
    }

    /// Writes the plan to `path` atomically, one sample line at a time.
    pub fn write(&self, path: &Path) -> Result<()> {
        write_plan(path, &self.header, self.lines())
    }

    /// The plan file's bytes, exactly what [`ListingPlan::write`] writes: for a plan stored as
    /// one object. They are the compressed lines, a small fraction of the listing they are made
    /// from, which is in memory anyway.
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        encode_plan(Vec::new(), &self.header, self.lines()).map_err(|e| Error::io(Path::new("<plan>"))(e))
    }

    fn lines(&self) -> impl Iterator<Item = Planned> + '_ {
        self.listing.samples.iter().zip(self.stamps.iter()).map(|(s, stamp)| {
            let info = imgpack_reader::SampleInfo::new(s.rel_path, "");
            let (size, mtime_ns) = stamp.map_or((0, 0), |s| (s.size, s.mtime_ns));
            Planned { path: info.path, path_hex: info.path_hex, class: s.class, size, mtime_ns }
        })
    }
}

/// Where a plan's tree is, as a plan records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Root {
    /// As given to `pack plan` (what a dataset's metadata records).
    pub given: String,
    /// Where its files are read from: a local tree's absolute path, a stored tree's
    /// `s3://bucket/prefix/`.
    pub read_from: String,
}

impl Root {
    /// The local tree at `root`: its path as given and made absolute, both UTF-8 (a plan is
    /// JSON).
    pub fn local(root: &Path) -> Result<Root> {
        let root_abs = root.canonicalize().map_err(Error::io(root))?;
        let text = |p: &Path| {
            p.to_str().map(str::to_string).ok_or_else(|| Error::BadSource {
                path: p.to_path_buf(),
                reason: "a plan needs a source path that is valid UTF-8".into(),
            })
        };
        Ok(Root { given: text(root)?, read_from: text(&root_abs)? })
    }

    /// The tree stored under `url`: named, and read, by its `s3://bucket/prefix/` (what
    /// `pack s3://bucket/prefix/` records as its root), so a part on any machine reads it
    /// from the store.
    pub fn stored(url: &crate::store::StoreUrl) -> Root {
        Root { given: url.to_string(), read_from: url.to_string() }
    }
}

/// Writes a plan file atomically (a temporary beside it, synced, then renamed): the header
/// line, then one line per sample.
fn write_plan<P: Serialize>(path: &Path, header: &Header, samples: impl Iterator<Item = P>) -> Result<()> {
    let temp = crate::fs::temp_path(path);
    let write = || -> std::io::Result<()> {
        let file = encode_plan(BufWriter::new(File::create(&temp)?), header, samples)?;
        file.into_inner().map_err(|e| e.into_error())?.sync_all()
    };
    if let Err(e) = write() {
        let _ = std::fs::remove_file(&temp);
        return Err(Error::io(path)(e));
    }
    std::fs::rename(&temp, path).map_err(Error::io(path))
}

/// The plan format into `out`: zstd-compressed, the header line, then one line per sample.
/// One encoder for plan files and stored plans, so both hold the same bytes (and MD5).
fn encode_plan<W: Write, P: Serialize>(
    out: W,
    header: &Header,
    samples: impl Iterator<Item = P>,
) -> std::io::Result<W> {
    let mut out = zstd::stream::Encoder::new(out, 3)?;
    serde_json::to_writer(&mut out, header)?;
    out.write_all(b"\n")?;
    for sample in samples {
        serde_json::to_writer(&mut out, &sample)?;
        out.write_all(b"\n")?;
    }
    out.finish()
}

/// Writes a plan of `samples` lines with `header` (tests make plans by hand this way).
#[cfg(test)]
pub(crate) fn write_planned(path: &Path, header: &Header, samples: &[Planned]) -> Result<()> {
    write_plan(path, header, samples.iter())
}

/// Reads the plan at `path` line by line: checks its header, and calls `visit` with the plan
/// index and contents of each sample line that `part` selects (every line without a part);
/// returns the header and the plan index where the part starts. [`Plan::read`] keeps what a run
/// needs; a resumed run compares its saved listing this way without holding a copy of it.
pub fn visit(
    path: &Path,
    part: Option<Part>,
    mut visit: impl FnMut(u64, Planned) -> Result<()>,
) -> Result<(Header, u64)> {
    let bad = |reason: String| Error::BadSource {
        path: path.to_path_buf(),
        reason: format!("not a plan written by `pack plan`: {reason}"),
    };
    let file = File::open(path).map_err(Error::io(path))?;
    let decoder = zstd::stream::Decoder::new(BufReader::new(file)).map_err(|e| bad(e.to_string()))?;
    let mut reader = BufReader::with_capacity(1 << 20, decoder);
    let mut line = String::new();
    let mut next_line = |line: &mut String, n: u64| -> Result<bool> {
        line.clear();
        let read = reader.read_line(line).map_err(|e| bad(format!("line {n}: {e}")))?;
        Ok(read > 0)
    };
    if !next_line(&mut line, 1)? {
        return Err(bad("it is empty".into()));
    }
    let header: Header = serde_json::from_str(&line).map_err(|e| bad(format!("header: {e}")))?;
    if header.format != FORMAT_NAME || header.version != PLAN_VERSION {
        return Err(bad(format!(
            "header says {:?} version {}; this pack reads {FORMAT_NAME} version {PLAN_VERSION}",
            header.format, header.version
        )));
    }
    /// What a part needs of every line, to place its cut: parsed without allocating.
    #[derive(Deserialize)]
    struct Size {
        size: u64,
    }
    let (mut seen, mut bytes, mut first) = (0u64, 0u64, None);
    while next_line(&mut line, seen + 2)? {
        let n = seen + 2;
        let size = serde_json::from_str::<Size>(&line).map_err(|e| bad(format!("line {n}: {e}")))?.size;
        let (i, before) = (seen, bytes);
        seen += 1;
        bytes = bytes.saturating_add(size);
        if let Some(p) = part {
            if first.is_none() && p.reached(i, before, header.bytes, header.samples) {
                first = Some(i);
            }
            if !p.selects(i, before, header.bytes, header.samples) {
                continue;
            }
        }
        let sample: Planned = serde_json::from_str(&line).map_err(|e| bad(format!("line {n}: {e}")))?;
        if sample.class as usize >= header.classes.len() {
            return Err(bad(format!("line {n}: class {} of {}", sample.class, header.classes.len())));
        }
        visit(i, sample)?;
    }
    if seen != header.samples || bytes != header.bytes {
        return Err(bad(format!(
            "its header promises {} samples of {} bytes, {seen} of {bytes} follow",
            header.samples, header.bytes
        )));
    }
    // A part that starts past the last sample is empty and starts at the end.
    let first = if part.is_some() { first.unwrap_or(seen) } else { 0 };
    Ok((header, first))
}

impl Plan {
    /// Reads the plan at `path`: all of it, or with `part` only that part's samples
    /// ([`Part::selects`]), so a part's memory follows the part's size, not the plan's.
    pub fn read(path: &Path, part: Option<Part>) -> Result<Plan> {
        let mut samples = Samples::default();
        let (header, first) = visit(path, part, |i, planned| {
            let rel_path = planned_path(&planned).map_err(|reason| Error::BadSource {
                path: path.to_path_buf(),
                reason: format!("plan sample {i}: {reason}"),
            })?;
            samples.push(&rel_path, planned.class, planned.size);
            Ok(())
        })?;
        samples.set_first(first);
        Ok(Plan { header, samples, first })
    }

    /// The extensions and shuffle seed the plan was made with.
    pub fn extensions_and_seed(&self) -> (Vec<String>, Option<u64>) {
        let options = &self.header.options;
        let extensions = options["extensions"]
            .as_array()
            .map(|a| a.iter().filter_map(|e| e.as_str().map(str::to_string)).collect())
            .unwrap_or_default();
        let seed =
            options["shuffle"].as_bool().unwrap_or(false).then(|| options["seed"].as_u64().unwrap_or(0));
        (extensions, seed)
    }
}

/// Walks the ImageFolder tree at `root` as `pack root` would — the same walk, order, class
/// indices, and shuffle with `seed` — and `stat`s every file on `threads` threads. `root` may
/// be an `s3://bucket/prefix/` holding the tree (listed once, at `endpoint`: the listing gives
/// every size). `progress` counts the files found while the tree is listed. Writes the plan to
/// `out` and returns its header.
pub fn make(
    root: &Path,
    extensions: &[String],
    seed: Option<u64>,
    threads: NonZeroUsize,
    endpoint: Option<&str>,
    progress: &dyn crate::progress::Progress,
    out: &PlanFile,
) -> Result<Header> {
    use rayon::prelude::*;
    let (source, planned_root): (Box<dyn Source>, Root) = match crate::store::StoreUrl::of_path(root)? {
        Some(url) => {
            let store = imgpack_reader::store::Store::open(&url, endpoint)?;
            let listed = store.list_sizes()?;
            let tree = crate::source::remote::RemoteImageFolder::new(store, listed, extensions);
            (Box::new(tree), Root::stored(&url))
        }
        None => {
            crate::source::imagefolder::check_root(root)?;
            let tree = crate::source::imagefolder::ImageFolder::new(root, extensions);
            (Box::new(tree), Root::local(root)?)
        }
    };
    let mut listing = source.list(progress)?;
    progress.finish();
    if let Some(seed) = seed {
        listing.samples.shuffle(seed);
    }
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads.get())
        .build()
        .map_err(|e| Error::Threads { threads: threads.get(), reason: e.to_string() })?;
    let stamps: Stamps = pool.install(|| listing.samples.par_iter().map(|s| source.stamp(&s)).collect());
    let options = serde_json::json!({"extensions": extensions, "shuffle": seed.is_some(), "seed": seed});
    let plan = ListingPlan::new(planned_root, options, &listing, &stamps);
    out.write(&plan)?;
    Ok(plan.header)
}

/// Whether the file at `path` is a plan: a zstd frame whose first line is a JSON object with
/// `"format": "imgpack-plan"` (however the JSON is spaced, wherever the field stands in it).
pub fn is_plan(path: &Path) -> bool {
    let Ok(file) = File::open(path) else { return false };
    let Ok(decoder) = zstd::stream::Decoder::new(BufReader::new(file)) else { return false };
    // The header holds the class names; 64 MiB bounds what a stray file can make us read.
    let mut first = Vec::new();
    if BufReader::new(decoder.take(64 << 20)).read_until(b'\n', &mut first).is_err() {
        return false;
    }
    serde_json::from_slice::<serde_json::Value>(&first)
        .is_ok_and(|header| header["format"].as_str() == Some(FORMAT_NAME))
}

/// A plan as a source: its listing is the plan (or one part of it), its files are read from
/// the planned root.
#[derive(Debug)]
pub struct PlanSource {
    header: Header,
    root: PathBuf,
    /// The store the tree is read from, for a plan of a stored tree.
    store: Option<imgpack_reader::store::Store>,
    /// The plan's samples until [`Source::list`] hands them over: a run lists its source once,
    /// and a plan of millions of samples is not copied for it.
    samples: std::sync::Mutex<Option<Samples>>,
}

impl PlanSource {
    /// A source reading the samples of `plan`.
    pub fn new(plan: Plan) -> PlanSource {
        let root = PathBuf::from(&plan.header.root_abs);
        PlanSource {
            header: plan.header,
            root,
            store: None,
            samples: std::sync::Mutex::new(Some(plan.samples)),
        }
    }

    /// A source reading the samples of `plan`, from the store at `endpoint` when the plan's
    /// tree is stored under an `s3://` prefix (no request is sent yet), else from disk.
    pub fn open(plan: Plan, endpoint: Option<&str>) -> Result<PlanSource> {
        let store = match crate::store::StoreUrl::of_path(Path::new(&plan.header.root_abs))? {
            Some(url) => Some(imgpack_reader::store::Store::open(&url, endpoint)?),
            None => None,
        };
        Ok(PlanSource { store, ..PlanSource::new(plan) })
    }
}

impl Source for PlanSource {
    /// The plan's samples. Listed once: a second listing is an internal error.
    fn list(&self, _progress: &dyn crate::progress::Progress) -> Result<Listing> {
        let samples = self.samples.lock().unwrap_or_else(|e| e.into_inner()).take();
        let samples = samples.ok_or_else(|| Error::BadSource {
            path: self.root.clone(),
            reason: "internal error: a plan's samples are listed once".into(),
        })?;
        Ok(Listing {
            classes: self.header.classes.clone(),
            samples,
            empty_classes: self.header.empty_classes.clone(),
            warnings: self.header.warnings.clone(),
        })
    }

    fn load(&self, sample: &SourceSample) -> Result<Vec<u8>, LoadError> {
        match &self.store {
            Some(store) => {
                let name = std::str::from_utf8(sample.rel_path).map_err(std::io::Error::other)?;
                store.get(name).map_err(LoadError::from_store)
            }
            None => super::load_file(&self.file(sample)),
        }
    }

    /// Named as every summary names a file: under the root as given to `pack plan` (which the
    /// metadata records, and `pack merge` names skipped files by), not under the absolute root
    /// the file is read from.
    fn name(&self, sample: &SourceSample) -> PathBuf {
        Path::new(&self.header.root).join(os_path(sample.rel_path))
    }

    fn file(&self, sample: &SourceSample) -> PathBuf {
        self.root.join(os_path(sample.rel_path))
    }

    /// A stored file's planned size, as [`crate::source::remote`] stamps it (a store's
    /// modification time is left out); a local file's `stat`.
    fn stamp(&self, sample: &SourceSample) -> Option<Stamp> {
        match self.store {
            Some(_) => Some(Stamp { size: sample.size, mtime_ns: 0 }),
            None => Stamp::of(&self.file(sample)),
        }
    }
}

use crate::source::os_path;

/// The exact relative path bytes of a planned sample.
fn planned_path(sample: &Planned) -> std::result::Result<Vec<u8>, String> {
    let bytes = sample.path_bytes()?;
    // The same test that keeps an unpacked tree inside its output keeps reads inside the root.
    crate::sink::imagefolder::safe_relative(&bytes)?;
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reading_a_part_of_a_plan_keeps_exactly_its_range() {
        let dir = tempfile::tempdir().unwrap();
        let sizes = [5u64, 100, 1, 1, 1, 300, 2, 0, 9];
        let sample = |(i, &size): (usize, &u64)| Planned {
            path: format!("c/{i}.jpg"),
            path_hex: None,
            class: 0,
            size,
            mtime_ns: 1,
        };
        let header = Header {
            format: FORMAT_NAME.into(),
            version: PLAN_VERSION,
            tool: crate::TOOL.into(),
            root: "r".into(),
            root_abs: "/r".into(),
            options: serde_json::json!({}),
            classes: vec!["c".into()],
            empty_classes: vec![],
            warnings: vec![],
            samples: sizes.len() as u64,
            bytes: sizes.iter().sum(),
        };
        let planned: Vec<Planned> = sizes.iter().enumerate().map(sample).collect();
        let path = dir.path().join("p.plan");
        write_planned(&path, &header, &planned).unwrap();
        let kept = |plan: &Plan| -> Vec<(u64, String, u64)> {
            plan.samples
                .iter()
                .map(|s| (s.index, String::from_utf8(s.rel_path.to_vec()).unwrap(), s.size))
                .collect()
        };
        let expected = |range: std::ops::Range<usize>| -> Vec<(u64, String, u64)> {
            range.map(|i| (i as u64, planned[i].path.clone(), planned[i].size)).collect()
        };
        for count in [1, 2, 3, 5, 12] {
            let mut next = 0;
            for index in 0..count {
                let part = Part { index, count };
                let read = Plan::read(&path, Some(part)).unwrap();
                let range = part.range(&sizes);
                assert_eq!(read.first, next, "{index}/{count}: starts where the last part ended");
                if !range.is_empty() {
                    assert_eq!(read.first as usize, range.start);
                }
                assert_eq!(kept(&read), expected(range.clone()), "{index}/{count}");
                next = read.first + read.samples.len() as u64;
            }
            assert_eq!(next, sizes.len() as u64, "{count} parts cover the plan");
        }
        // A plan rewritten by another JSON writer (spaces after colons) is still a plan.
        let text =
            String::from_utf8(zstd::stream::decode_all(&std::fs::read(&path).unwrap()[..]).unwrap()).unwrap();
        let spaced = dir.path().join("spaced.plan");
        std::fs::write(&spaced, zstd::stream::encode_all(text.replace("\":", "\": ").as_bytes(), 3).unwrap())
            .unwrap();
        assert!(is_plan(&spaced) && is_plan(&path));
        let other = dir.path().join("other.plan");
        std::fs::write(&other, zstd::stream::encode_all(&b"{\"format\": \"x\"}\n"[..], 3).unwrap()).unwrap();
        assert!(!is_plan(&other));
        assert_eq!(kept(&Plan::read(&spaced, None).unwrap()), expected(0..sizes.len()));
    }
}
