//! Resuming an interrupted run: the journal, the saved listing, and the ledger of outcomes.
//!
//! A run writes into a temporary directory next to its output ([`Staged`]). Each
//! time the sink makes part of its output durable — a finished shard synced to disk, or a
//! synced LMDB batch (a *checkpoint*) — the pipeline writes a journal beside it: how many source
//! samples are accounted for, what was packed and skipped up to there, and the run's options.
//! The journal is replaced atomically (write, `fsync`, rename, `fsync` the directory), so a
//! crash at any moment leaves either the old one or the new one, and it always describes output
//! that is on disk. `pack ... --resume` reads it, cuts the output back to the checkpoint and
//! goes on from there; since the output depends only on the sample sequence, the result is the
//! one an uninterrupted run writes.
//!
//! The run also saves its source listing (every file's path, class, size and modification
//! time, in the plan file format: [`ListingPlan::of_listing`]) when it starts. A resumed run lists and `stat`s the source again and refuses to go on
//! if anything was added, removed or modified, naming what changed: the kept output would
//! otherwise silently disagree with the source.
//!
//! None of these files is published: [`stage`] marks them as scratch, which
//! [`Staged::publish`] removes.
//!
//! **In an object store** there is no temporary directory to rename: a run writes under the
//! output prefix itself (visibility is `imgpack.json`, written last: `sink::webdataset`), and
//! keeps its journal and saved listing there too, under [`STORE_SCRATCH`]`/` — so a job that is
//! re-run on another machine, as a cluster re-schedules a task, finds them. Each is written to a
//! local copy first and then stored whole; a journal in the store always describes shards that
//! are stored, since a shard counts as durable once its upload has completed. [`stage_store`]
//! is [`stage`] for a prefix.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::fs;
use std::path::{Path, PathBuf};

use imgpack_reader::ShardInfo;
use serde::{Deserialize, Serialize};

use crate::pack::recorded::Run;
use crate::pack::report::Skipped;
use crate::pack::staged::Staged;
use crate::sink::Durable;
use crate::source::plan::{self, Header, ListingPlan, Planned};
use crate::source::{Listing, Samples, Source, Stamp, Stamps};
use crate::store::Store;
use crate::{Error, Result};

/// The journal file in the temporary directory.
pub const JOURNAL_FILE: &str = "imgpack-resume.json";
/// The saved source listing in the temporary directory.
pub const LISTING_FILE: &str = "imgpack-resume.listing.zst";
/// The next journal, before it replaces the last one: the temporary name
/// [`crate::fs::replace_file`] gives it.
const JOURNAL_TEMP: &str = ".imgpack-resume.json.imgpack-tmp";
/// Where a run writing to a store keeps, under its output prefix, what a local run keeps in its
/// temporary directory: the journal, the saved listing, the record of its open uploads and the
/// WebDataset sink's per-shard index pieces. Removed once the dataset is published.
pub const STORE_SCRATCH: &str = "imgpack-resume";
/// The record of the uploads a run to a store has open ([`crate::store::Store::record_uploads`]).
pub const UPLOADS_RECORD: &str = "imgpack-resume/uploads.json";

/// The object under a store prefix that holds the scratch file `name`.
pub fn store_scratch(name: &str) -> String {
    format!("{STORE_SCRATCH}/{name}")
}

/// Every file this module leaves in a temporary directory for resuming (scratch: removed before
/// publishing). A sink may add its own (the LMDB sink's checksums).
pub const FILES: [&str; 3] = [JOURNAL_FILE, LISTING_FILE, JOURNAL_TEMP];

/// Prepares the temporary directory of a resumable run writing `target`.
///
/// With `resume`, an interrupted run's temporary that holds a journal is kept and its journal
/// returned; otherwise the temporary is cleared, and the flag says whether it held a journal
/// (an interrupted run's work, discarded). Either way the resume files are scratch, and the
/// temporary is kept after a failure once a journal is in it.
pub fn stage(target: &Path, overwrite: bool, resume: bool) -> Result<(Staged, Option<Journal>, bool)> {
    let (mut journal, mut discarded) = (None, false);
    let (mut staged, _) = Staged::open_dir(target, overwrite, |temp| {
        if !resume {
            discarded = temp.join(JOURNAL_FILE).exists();
            return Ok(false);
        }
        journal = Journal::read(temp)?;
        Ok(journal.is_some())
    })?;
    for name in FILES {
        staged.scratch(name);
    }
    staged.keep_if(JOURNAL_FILE);
    Ok((staged, journal, discarded))
}

/// Where a resumable run keeps its journal and saved listing.
#[derive(Debug)]
pub enum Journals {
    /// In the run's temporary directory.
    Dir(PathBuf),
    /// Under the output prefix's [`STORE_SCRATCH`], each stored from a local copy in `dir`.
    Store {
        /// The output prefix.
        store: Store,
        /// The local copies.
        dir: tempfile::TempDir,
    },
}

impl Journals {
    /// The local directory holding the journal and the listing.
    pub fn dir(&self) -> &Path {
        match self {
            Journals::Dir(dir) => dir,
            Journals::Store { dir, .. } => dir.path(),
        }
    }

    /// Where the work is kept, as messages name it: the temporary directory or the prefix.
    pub fn place(&self) -> PathBuf {
        match self {
            Journals::Dir(dir) => dir.clone(),
            Journals::Store { store, .. } => PathBuf::from(store.url().to_string()),
        }
    }

    /// Replaces the journal, atomically: on disk by a rename, in a store by one PUT.
    pub fn write(&self, journal: &Journal) -> Result<()> {
        journal.write(self.dir())?;
        self.store_copy(JOURNAL_FILE)
    }

    /// The journal, if there is one.
    pub fn read(&self) -> Result<Option<Journal>> {
        Journal::read(self.dir())
    }

    /// Saves the listing ([`save_listing`]).
    pub fn save_listing(&self, listing: &Listing, stamps: &Stamps) -> Result<()> {
        save_listing(self.dir(), listing, stamps)?;
        self.store_copy(LISTING_FILE)
    }

    /// Stores the local copy of `name`, when the journals live in a store.
    fn store_copy(&self, name: &str) -> Result<()> {
        let Journals::Store { store, dir } = self else { return Ok(()) };
        store.upload_file(&store_scratch(name), &dir.path().join(name), Some(UPLOADS_RECORD))
    }
}

/// Prepares the prefix of a resumable run writing to `store`: [`stage`] for a store.
///
/// The prefix is what a run kept there: empty, a finished dataset (refused, unless
/// `overwrite`), an interrupted run's work (objects under [`STORE_SCRATCH`] and no
/// `imgpack.json`: kept with `resume` when it holds a journal, the journal and the listing
/// fetched; else discarded, and the flag says so), or anything else (refused, unless
/// `overwrite`). Whatever is kept or not, the uploads an interrupted run left open (recorded, or
/// listed by the store) are aborted first. Cleared, `imgpack.json` goes first, so an old dataset stops being one before its
/// shards go.
pub fn stage_store(store: Store, overwrite: bool, resume: bool) -> Result<(Journals, Option<Journal>, bool)> {
    use imgpack_reader::webdataset::META_FILE;
    let listed = store.read().list_objects(None)?;
    // The lock is this run's own, taken before ([`crate::store::lock`]).
    let mut names: Vec<String> =
        listed.iter().map(|o| o.name.clone()).filter(|n| n != crate::store::lock::LOCK_OBJECT).collect();
    let dir = tempfile::Builder::new()
        .prefix(".imgpack-resume-")
        .tempdir()
        .map_err(Error::io(std::env::temp_dir()))?;
    let journals = Journals::Store { store: store.clone(), dir };
    let dataset = names.iter().any(|n| n == META_FILE);
    let scratch = format!("{STORE_SCRATCH}/");
    let unfinished = !dataset && names.iter().any(|n| n.starts_with(&scratch));
    if !overwrite && !unfinished && !names.is_empty() {
        let (url, objects) = (store.url().to_string(), names.len());
        return Err(Error::StoreOutputExists { url, objects, dataset });
    }
    let recorded = names.iter().any(|n| n == UPLOADS_RECORD);
    store.abort_left_uploads(recorded.then_some(UPLOADS_RECORD))?;
    let journal_object = store_scratch(JOURNAL_FILE);
    if unfinished && resume && !overwrite && names.contains(&journal_object) {
        for name in [JOURNAL_FILE, LISTING_FILE] {
            let object = store_scratch(name);
            if let Some(listed) = listed.iter().find(|o| o.name == object) {
                store.download(&object, listed.size, &journals.dir().join(name))?;
            }
        }
        let journal = journals.read()?;
        return Ok((journals, journal, false));
    }
    let discarded = unfinished && names.contains(&journal_object);
    if let Some(meta) = names.iter().position(|n| n == META_FILE) {
        let meta = names.remove(meta);
        names.insert(0, meta);
    }
    store.delete(&names)?;
    Ok((journals, None, discarded))
}

/// How far a run got: everything needed to continue it and to report on it at the end.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Progress {
    /// Source samples (in listing order, after any shuffle) fully accounted for.
    pub position: u64,
    /// Samples packed among them.
    pub packed: u64,
    /// Source bytes of the packed samples.
    pub bytes_in: u64,
    /// Packed samples by source format.
    pub formats: BTreeMap<String, u64>,
    /// Images stored unchanged by `--keep-if-fits`.
    pub kept_unchanged: u64,
    /// Stored payload extensions.
    pub fields: BTreeSet<String>,
    /// Packed samples by stored payload extension (`jpg` for every re-encoded image, `npy`
    /// for decoded ones). Journals written before it was counted read as empty.
    #[serde(default)]
    pub stored: BTreeMap<String, u64>,
    /// Skipped samples: listing position and reason (the path comes from the listing).
    pub skipped: Vec<(u64, String)>,
    /// WebDataset: the finished, synced shards.
    pub shards: Vec<ShardInfo>,
    /// WebDataset in a store: each stored shard's ETag, which a resumed run checks it by.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub etags: Vec<String>,
}

/// The journal: the run it belongs to and how far it got.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Journal {
    /// What made the output: tool, source, format and options. A resumed run must match it.
    pub run: Run,
    /// Source samples listed.
    pub found: u64,
    /// The last checkpoint.
    pub progress: Progress,
}

impl Journal {
    /// Reads the journal in `dir`, if there is one.
    pub fn read(dir: &Path) -> Result<Option<Journal>> {
        let path = dir.join(JOURNAL_FILE);
        match fs::read(&path) {
            Ok(raw) => serde_json::from_slice(&raw).map(Some).map_err(|e| Error::Resume {
                path,
                reason: format!("the journal of the interrupted run is unreadable ({e})"),
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(Error::io(&path)(e)),
        }
    }

    /// Replaces the journal in `dir` atomically and durably.
    pub fn write(&self, dir: &Path) -> Result<()> {
        crate::fs::replace_file(&dir.join(JOURNAL_FILE), &crate::encoding::json_bytes(self))
    }
}

/// The outcome of every source sample since the last checkpoint, and the totals up to it.
///
/// Outcomes arrive in source order; a checkpoint says how many samples the sink has made
/// durable, and the ledger folds exactly the outcomes up to the last of those into the
/// checkpoint's [`Progress`]. Skips after it stay pending: a resumed run meets them again.
///
/// A WebDataset run keeps every outcome of the shard being written until it is synced: 900,000
/// of them in a 1 GB shard of 1 kB images. So each is held in 16 bytes: its position follows
/// from the last checkpoint's, its names are indices into the few this run has met, and a skip's
/// reason waits in a queue of its own.
#[derive(Debug, Default)]
pub struct Ledger {
    durable: Progress,
    pending: VecDeque<Pending>,
    /// The reasons of the skips in `pending`, in order.
    reasons: VecDeque<String>,
    /// The format and field names `pending` refers to.
    names: Vec<&'static str>,
    /// How many of `pending` are packed samples (counted, not scanned: asked once per sample).
    pending_packed: u64,
}

/// One source sample's outcome.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// Packed from `bytes_in` source bytes of `format`, stored as `field`. Both are names from
    /// a fixed set, not allocated.
    Packed { position: u64, bytes_in: u64, format: &'static str, kept: bool, field: &'static str },
    /// Skipped for `reason`.
    Skipped { position: u64, reason: String },
}

/// An [`Outcome`] as the ledger holds it until a checkpoint.
#[derive(Debug, Clone, Copy)]
enum Pending {
    Packed { bytes_in: u64, format: u8, field: u8, kept: bool },
    Skipped,
}

impl Ledger {
    /// A ledger that continues from `progress`.
    pub fn resume(progress: Progress) -> Ledger {
        Ledger { durable: progress, ..Ledger::default() }
    }

    /// Records the next sample's outcome.
    ///
    /// # Panics
    ///
    /// If it is not the next position's, or with more than 256 names.
    pub fn record(&mut self, outcome: Outcome) {
        let next = self.durable.position + self.pending.len() as u64;
        let pending = match outcome {
            Outcome::Packed { position, bytes_in, format, kept, field } => {
                assert_eq!(position, next, "outcomes are recorded in order");
                self.pending_packed += 1;
                Pending::Packed { bytes_in, format: self.name(format), field: self.name(field), kept }
            }
            Outcome::Skipped { position, reason } => {
                assert_eq!(position, next, "outcomes are recorded in order");
                self.reasons.push_back(reason);
                Pending::Skipped
            }
        };
        self.pending.push_back(pending);
    }

    fn name(&mut self, name: &'static str) -> u8 {
        let at = self.names.iter().position(|n| *n == name).unwrap_or_else(|| {
            self.names.push(name);
            self.names.len() - 1
        });
        u8::try_from(at).expect("at most 256 format and field names")
    }

    /// Samples packed so far, durable or not.
    pub fn packed(&self) -> u64 {
        self.durable.packed + self.pending_packed
    }

    /// Folds outcomes into the durable totals until `durable.samples` are durable, and returns
    /// them (with the shards as the sink says).
    pub fn checkpoint(&mut self, durable: Durable) -> &Progress {
        let Durable { samples: packed, shards, etags } = durable;
        while self.durable.packed < packed {
            let Some(pending) = self.pending.pop_front() else { break };
            if matches!(pending, Pending::Packed { .. }) {
                self.pending_packed -= 1;
            }
            let reasons = &mut self.reasons;
            let reason = || reasons.pop_front().expect("a reason per skip");
            let outcome = unpack(&self.names, self.durable.position, pending, reason);
            fold(&mut self.durable, outcome);
        }
        self.durable.shards = shards;
        self.durable.etags = etags;
        &self.durable
    }

    /// Every outcome, durable or not: the run's totals.
    pub fn total(&self) -> Progress {
        let mut all = self.durable.clone();
        let mut reasons = self.reasons.iter();
        for (k, pending) in self.pending.iter().enumerate() {
            let position = self.durable.position + k as u64;
            let outcome = unpack(&self.names, position, *pending, || {
                reasons.next().expect("a reason per skip").clone()
            });
            fold(&mut all, outcome);
        }
        all
    }
}

/// The outcome a [`Pending`] at `position` stands for; a skip takes its reason from `reason`.
fn unpack(
    names: &[&'static str],
    position: u64,
    pending: Pending,
    reason: impl FnOnce() -> String,
) -> Outcome {
    match pending {
        Pending::Packed { bytes_in, format, field, kept } => Outcome::Packed {
            position,
            bytes_in,
            format: names[format as usize],
            kept,
            field: names[field as usize],
        },
        Pending::Skipped => Outcome::Skipped { position, reason: reason() },
    }
}

/// One more of `name` in `counts`, allocating the key only the first time.
fn count(counts: &mut BTreeMap<String, u64>, name: &str) {
    match counts.get_mut(name) {
        Some(n) => *n += 1,
        None => {
            counts.insert(name.to_string(), 1);
        }
    }
}

fn fold(progress: &mut Progress, outcome: Outcome) {
    match outcome {
        Outcome::Packed { position, bytes_in, format, kept, field } => {
            progress.position = position + 1;
            progress.packed += 1;
            progress.bytes_in += bytes_in;
            count(&mut progress.formats, format);
            progress.kept_unchanged += u64::from(kept);
            count(&mut progress.stored, field);
            if !progress.fields.contains(field) {
                progress.fields.insert(field.to_string());
            }
        }
        Outcome::Skipped { position, reason } => {
            progress.position = position + 1;
            progress.skipped.push((position, reason));
        }
    }
}

/// The skipped samples of `progress` with their paths from the listing.
pub fn skipped(progress: &Progress, samples: &Samples, source: &dyn Source) -> Vec<Skipped> {
    progress
        .skipped
        .iter()
        .map(|(position, reason)| {
            let path = samples.try_get(*position as usize).map_or_else(PathBuf::new, |s| source.name(&s));
            Skipped::new(path, reason.clone())
        })
        .collect()
}

/// Saves the listing, with each sample's stamp, as a plan file that names no root
/// ([`ListingPlan::of_listing`]): one format for plans and saved listings.
pub fn save_listing(dir: &Path, listing: &Listing, stamps: &Stamps) -> Result<()> {
    ListingPlan::of_listing(listing, stamps).write(&dir.join(LISTING_FILE))
}

/// Reads the listing saved by [`save_listing`] in `dir`, calling `visit` with each sample.
fn visit_listing(dir: &Path, visit: impl FnMut(u64, Planned) -> Result<()>) -> Result<Header> {
    let path = dir.join(LISTING_FILE);
    plan::visit(&path, None, visit).map(|(header, _)| header).map_err(|e| Error::Resume {
        reason: format!("the interrupted run's saved listing is unreadable ({e})"),
        path,
    })
}

/// What changed between the listing saved in `dir` ([`save_listing`]) and the current one, or
/// `None` if nothing did.
///
/// The saved listing is compared line by line as it is read, without a copy of it in memory:
/// a listing of millions of samples that did not change costs no more than reading it. Only
/// when something differs is it read again, to say what.
pub fn changes(dir: &Path, listing: &Listing, stamps: &Stamps) -> Result<Option<String>> {
    let mut same = true;
    let header = visit_listing(dir, |i, planned| {
        same = same
            && listing.samples.try_get(i as usize).is_some_and(|now| {
                let path = match &planned.path_hex {
                    None => planned.path.as_bytes() == now.rel_path,
                    Some(_) => planned.path_bytes().is_ok_and(|p| p == now.rel_path),
                };
                path && planned.class == now.class && planned.stamp() == stamps.get(i as usize)
            });
        Ok(())
    })?;
    if header.classes != listing.classes {
        return Ok(Some(format!("the classes changed from {:?} to {:?}", header.classes, listing.classes)));
    }
    if same && header.samples == listing.samples.len() as u64 {
        return Ok(None);
    }
    // A saved path that does not decode cannot match any listed one: it shows as removed.
    let mut saved: Vec<(Vec<u8>, u32, Option<Stamp>)> = Vec::new();
    visit_listing(dir, |_, s| {
        let path = s.path_bytes().unwrap_or_else(|_| s.path.clone().into_bytes());
        saved.push((path, s.class, s.stamp()));
        Ok(())
    })?;
    let before: HashMap<&[u8], (u32, Option<Stamp>)> =
        saved.iter().map(|(rel, class, stamp)| (rel.as_slice(), (*class, *stamp))).collect();
    let now: HashMap<&[u8], (u32, Option<Stamp>)> =
        listing.samples.iter().zip(stamps.iter()).map(|(s, stamp)| (s.rel_path, (s.class, stamp))).collect();
    let name = |rel: &[u8]| String::from_utf8_lossy(rel).into_owned();
    let mut added: Vec<String> = now.keys().filter(|k| !before.contains_key(*k)).map(|k| name(k)).collect();
    let mut removed: Vec<String> = before.keys().filter(|k| !now.contains_key(*k)).map(|k| name(k)).collect();
    let mut modified: Vec<String> =
        now.iter().filter(|(k, v)| before.get(*k).is_some_and(|b| b != *v)).map(|(k, _)| name(k)).collect();
    let reordered = added.is_empty()
        && removed.is_empty()
        && modified.is_empty()
        && saved.iter().map(|(rel, _, _)| rel.as_slice()).ne(listing.samples.iter().map(|s| s.rel_path));
    let mut parts = Vec::new();
    for (what, list) in [("added", &mut added), ("removed", &mut removed), ("modified", &mut modified)] {
        if list.is_empty() {
            continue;
        }
        list.sort();
        let shown: Vec<&str> = list.iter().take(5).map(String::as_str).collect();
        let more = if list.len() > 5 { format!(" and {} more", list.len() - 5) } else { String::new() };
        parts.push(format!("{} {what} ({}{more})", list.len(), shown.join(", ")));
    }
    if reordered {
        parts.push("the same files list in another order".into());
    }
    Ok((!parts.is_empty()).then(|| parts.join("; ")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_journal_temp_is_the_name_replace_file_writes() {
        let temp = crate::fs::temp_path(&Path::new("dir").join(JOURNAL_FILE));
        assert_eq!(temp, Path::new("dir").join(JOURNAL_TEMP));
    }

    fn samples(list: &[(&str, u32)]) -> Samples {
        let mut samples = Samples::default();
        list.iter().for_each(|(rel, class)| samples.push(rel.as_bytes(), *class, 0));
        samples
    }

    /// Every line of the listing saved in `dir`.
    fn saved(dir: &Path) -> (Header, Vec<Planned>) {
        let mut lines = Vec::new();
        let header = visit_listing(dir, |_, planned| {
            lines.push(planned);
            Ok(())
        })
        .unwrap();
        (header, lines)
    }

    fn packed(position: u64) -> Outcome {
        Outcome::Packed { position, bytes_in: 10, format: "jpg", kept: false, field: "jpg" }
    }

    #[test]
    fn a_checkpoint_folds_outcomes_up_to_the_last_durable_sample() {
        let mut ledger = Ledger::default();
        ledger.record(packed(0));
        ledger.record(Outcome::Skipped { position: 1, reason: "bad".into() });
        ledger.record(packed(2));
        ledger.record(Outcome::Skipped { position: 3, reason: "bad".into() });
        ledger.record(packed(4));
        let progress = ledger.checkpoint(Durable { samples: 2, ..Durable::default() }).clone();
        assert_eq!((progress.position, progress.packed, progress.skipped.len()), (3, 2, 1));
        assert_eq!(progress.bytes_in, 20);
        // The skip after the durable samples is met again by a resumed run.
        let total = ledger.total();
        assert_eq!((total.position, total.packed, total.skipped.len()), (5, 3, 2));
        assert_eq!(ledger.packed(), 3);
        assert_eq!(total.skipped, [(1, "bad".to_string()), (3, "bad".to_string())]);
        // The rest folds in order, names and reasons intact.
        let rest = ledger.checkpoint(Durable { samples: 3, ..Durable::default() }).clone();
        assert_eq!(rest, total);
        assert_eq!(rest.formats.get("jpg"), Some(&3));
        assert_eq!(std::mem::size_of::<Pending>(), 16, "what a shard's outcomes cost each");
    }

    #[test]
    fn journals_and_listings_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        assert!(Journal::read(dir.path()).unwrap().is_none());
        let journal = Journal {
            run: Run {
                tool: "t".into(),
                source: "s".into(),
                source_kind: "imagefolder".into(),
                options: crate::PackConfig::new("s", "o", crate::OutputFormat::Lmdb).recorded_options(),
                part: None,
            },
            found: 3,
            progress: Progress {
                position: 2,
                packed: 1,
                skipped: vec![(1, "bad".into())],
                ..Progress::default()
            },
        };
        journal.write(dir.path()).unwrap();
        assert_eq!(Journal::read(dir.path()).unwrap(), Some(journal));

        let listing = Listing {
            classes: vec!["a".into(), "b".into()],
            samples: samples(&[("a/1.jpg", 0), ("b/\u{e9}.jpg", 1)]),
            ..Listing::default()
        };
        let stamps: Stamps = [Some(Stamp { size: 5, mtime_ns: 7 }), None].into_iter().collect();
        save_listing(dir.path(), &listing, &stamps).unwrap();
        let (header, saved) = saved(dir.path());
        assert_eq!(header.classes, listing.classes);
        assert_eq!(saved[0].stamp(), stamps.get(0));
        assert_eq!((saved[1].class, saved[1].stamp()), (1, None), "no stamp stays none");
        assert_eq!(saved[1].path_bytes().unwrap(), "b/\u{e9}.jpg".as_bytes());
        assert_eq!(changes(dir.path(), &listing, &stamps).unwrap(), None);
        // The saved listing is a plan, read by the plan reader.
        assert!(crate::source::plan::is_plan(&dir.path().join(LISTING_FILE)));
        // A file that can be stat-ed now but could not then has changed.
        let now: Stamps = [stamps.get(0), Some(Stamp { size: 1, mtime_ns: 1 })].into_iter().collect();
        assert_eq!(
            changes(dir.path(), &listing, &now).unwrap().as_deref(),
            Some("1 modified (b/\u{e9}.jpg)")
        );
        // The same files in another order.
        let swapped = Listing { samples: samples(&[("b/\u{e9}.jpg", 1), ("a/1.jpg", 0)]), ..listing.clone() };
        let text =
            changes(dir.path(), &swapped, &[stamps.get(1), stamps.get(0)].into_iter().collect()).unwrap();
        assert_eq!(text.as_deref(), Some("the same files list in another order"));
    }

    #[test]
    fn changes_name_what_was_added_removed_and_modified() {
        let classes = vec!["a".to_string()];
        let before = Listing {
            classes: classes.clone(),
            samples: samples(&[("a/1.jpg", 0), ("a/2.jpg", 0)]),
            ..Listing::default()
        };
        let one = Some(Stamp { size: 1, mtime_ns: 1 });
        let dir = tempfile::tempdir().unwrap();
        save_listing(dir.path(), &before, &[one, one].into_iter().collect()).unwrap();
        let listing =
            Listing { classes, samples: samples(&[("a/1.jpg", 0), ("a/3.jpg", 0)]), ..Listing::default() };
        let stamps: Stamps = [Some(Stamp { size: 2, mtime_ns: 1 }), one].into_iter().collect();
        let text = changes(dir.path(), &listing, &stamps).unwrap().unwrap();
        assert_eq!(text, "1 added (a/3.jpg); 1 removed (a/2.jpg); 1 modified (a/1.jpg)");
    }
}
