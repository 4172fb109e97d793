//! `pack verify`: read a packed dataset end to end and name everything wrong with it.
//!
//! A dataset is checked against itself, the way the writer built it: the sample count against
//! the metadata, every sample's CRC-32 ([`imgpack_reader::checksum`]), every key in sequence
//! and present once, every label within the class list and agreeing with the sample's `.json`
//! record, and for WebDataset every shard's size, CRC-32 and MD5, every tar header, every
//! `imgpack.index` entry and every DALI `.idx` line against the tar itself, and `shardindex.json`
//! against the shard list. With `decode`, every image is decoded too.
//!
//! Damage is reported, not raised: each problem names the sample (or file) and what is wrong,
//! and the check goes on, so one run lists all of them. Only a path that holds no dataset at
//! all is an error. Reading is the whole cost; shards are checked in parallel. A WebDataset in
//! an object store (`s3://bucket/prefix/`) is checked the same way, each shard downloaded to a
//! temporary file first.

use std::fmt;
use std::path::{Path, PathBuf};

use imgpack_reader::format::{CLS_FIELD, JSON_FIELD, NPY_FIELD, NPY_ZSTD_FIELD};
use imgpack_reader::webdataset::META_FILE;
use imgpack_reader::{ImageFormat, Kind, Meta, SampleInfo};
use serde::Serialize;

use crate::progress::Progress;
use crate::transcode::check::check;
use crate::transcode::decode::{decode, DecodeOptions};
use crate::transcode::encode::npy_shape;
use crate::{Error, Result};

mod lmdb;
mod webdataset;

/// What to check beyond the bytes, and how.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifyOptions {
    /// Decode every image (and check every `.npy` shape) as well.
    pub decode: bool,
    /// Worker threads.
    pub threads: std::num::NonZeroUsize,
    /// The object store's endpoint, for a dataset under an `s3://` prefix (none: AWS).
    pub endpoint: Option<String>,
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
            crate::size::human_bytes(self.bytes),
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

/// Checks the dataset at `path` end to end, reporting to `progress` the sample data bytes read
/// of [`dataset_bytes`].
pub fn verify(path: &Path, options: &VerifyOptions, progress: &dyn Progress) -> Result<Verified> {
    let started = std::time::Instant::now();
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(options.threads.get())
        .thread_name(|i| format!("imgpack-verify-{i}"))
        .build()
        .map_err(|e| Error::Threads { threads: options.threads.get(), reason: e.to_string() })?;
    if imgpack_reader::is_unfinished(path) {
        return Err(Error::BadSource {
            path: path.to_path_buf(),
            reason: "is the temporary directory of a `pack` run that has not finished; verify its output once it is renamed into place".into(),
        });
    }
    let mut verified = Verified::new(path, options.decode);
    if let Some(url) = crate::store::StoreUrl::of_path(path)? {
        let store = imgpack_reader::store::Store::open(&url, options.endpoint.as_deref())?;
        let listed: std::collections::BTreeMap<String, u64> = store.list_sizes()?.into_iter().collect();
        if !listed.contains_key(META_FILE) {
            return Err(imgpack_reader::webdataset::not_a_stored_dataset(&url, listed.len()).into());
        }
        let shards: Vec<u64> =
            listed.iter().filter(|(name, _)| name.ends_with(".tar")).map(|(_, size)| *size).collect();
        let at_once = options.threads.get().min(shards.len()) as u64;
        let need = at_once.saturating_mul(shards.iter().copied().max().unwrap_or(0));
        check_room(&std::env::temp_dir(), need, crate::fs::free_space(&std::env::temp_dir()))?;
        progress.length(shards.iter().sum());
        let files = webdataset::Files::Store { store, listed };
        pool.install(|| webdataset::check(&files, options, &mut verified, progress));
        verified.seconds = started.elapsed().as_secs_f64();
        progress.finish();
        return Ok(verified);
    }
    progress.length(dataset_bytes(path));
    match imgpack_reader::detect(path) {
        Some(Kind::Lmdb) => pool.install(|| lmdb::check(path, options, &mut verified, progress))?,
        Some(Kind::WebDataset) => {
            let files = webdataset::Files::Dir(path.to_path_buf());
            pool.install(|| webdataset::check(&files, options, &mut verified, progress))
        }
        None => return Err(imgpack_reader::not_a_dataset(path).into()),
    }
    verified.seconds = started.elapsed().as_secs_f64();
    progress.finish();
    Ok(verified)
}

/// Refuses to verify a stored dataset when `dir` (the temporary directory its shards are
/// downloaded to, one per thread at a time) has less than `need` bytes `free`.
fn check_room(dir: &Path, need: u64, free: Option<u64>) -> Result<()> {
    match free {
        Some(free) if free < need => Err(Error::Usage(format!(
            "{}: {} free, but checking a stored dataset downloads up to {} at once (one shard per --threads); free space, point TMPDIR at a larger disk, or pass fewer --threads",
            dir.display(),
            crate::size::human_bytes(free),
            crate::size::human_bytes(need)
        ))),
        _ => Ok(()),
    }
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

#[cfg(test)]
pub(crate) mod testing {
    //! Datasets for the per-format tests: testdata packed by the real pipeline, then damaged.

    use std::path::{Path, PathBuf};

    use super::{verify, Verified, VerifyOptions};
    use crate::{OutputFormat, PackConfig};

    /// testdata packed into `format` at `dir/out`.
    pub fn packed(dir: &Path, format: OutputFormat) -> PathBuf {
        let tree = Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/imagefolder");
        let out = dir.join("out");
        crate::pack::pack(&PackConfig::new(&tree, &out, format), &crate::progress::Silent).unwrap();
        out
    }

    /// `verify` with or without decoding.
    pub fn check(path: &Path, decode: bool) -> Verified {
        verify(
            path,
            &VerifyOptions { decode, threads: std::num::NonZeroUsize::MIN, endpoint: None },
            &crate::progress::Silent,
        )
        .unwrap()
    }

    /// The places of the problems found, each once, in order.
    pub fn places(verified: &Verified) -> Vec<String> {
        let mut places: Vec<String> = verified.problems.iter().map(|p| p.place.clone()).collect();
        places.dedup();
        places
    }

    /// XORs the byte of `file` at `at` with 0xff.
    pub fn flip(file: &Path, at: usize) {
        let mut bytes = std::fs::read(file).unwrap();
        bytes[at] ^= 0xff;
        std::fs::write(file, bytes).unwrap();
    }

    /// Where `needle` first occurs in `file`.
    pub fn find(file: &Path, needle: &[u8]) -> usize {
        let bytes = std::fs::read(file).unwrap();
        bytes.windows(needle.len()).position(|w| w == needle).expect("the bytes are in the file")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn too_little_room_for_the_downloads_is_refused_saying_what_to_do() {
        let dir = Path::new("/tmp");
        let err = check_room(dir, 2_000_000_000, Some(1_000_000)).unwrap_err().to_string();
        assert!(err.starts_with("/tmp: 1.0 MB free") && err.contains("2.0 GB at once"), "{err}");
        assert!(err.contains("TMPDIR") && err.contains("--threads"), "{err}");
        assert!(check_room(dir, 10, Some(10)).is_ok());
        assert!(check_room(dir, 10, None).is_ok(), "unknown free space is not a reason to refuse");
        assert!(crate::fs::free_space(&std::env::temp_dir()).is_some_and(|free| free > 0));
    }
}
