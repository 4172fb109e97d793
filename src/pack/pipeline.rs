//! The packing pipeline: list, read ahead, check in parallel, write in order, publish.
//!
//! Samples are listed once and cut into chunks of about 32 MiB (sizes are learnt as
//! files are read, since listing does not `stat` them). Three stages run at once:
//!
//! * the readers (`--io-threads`, [`crate::pack::readahead`]) read the files in listing order,
//!   ahead of the CPU work and within a 32 MiB budget, as many at a time as keep the workers
//!   fed: on NFS, Lustre or a disk each read waits milliseconds, and that wait is spent on
//!   other reads, not on idle cores;
//! * the worker pool (`--threads`, one per core: CPU work, [`crate::pack::chunks`]) checks and
//!   transcodes them a chunk at a time, two chunks at once so that the workers never wait at a
//!   chunk's end, each worker taking the next sample read as soon as it is read; a loader
//!   thread hands the chunks in order over a channel that holds at most one;
//! * the calling thread writes chunks in order to the sink.
//!
//! So the source is read and the output written at the same time, the output is the same
//! whatever the thread counts, and at most the readahead's budget plus four chunks (two
//! loading, one queued, one writing) are in memory at once, whatever the dataset size.

use std::path::PathBuf;
use std::sync::mpsc;
use std::time::Instant;

use imgpack_reader::format::{CLS_FIELD, JSON_FIELD};
use imgpack_reader::key::{format_key, key_width};
use imgpack_reader::part::{PartInfo, SkippedSample};
use imgpack_reader::{ImageFormat, Meta, SampleInfo, SourceInfo, FORMAT_VERSION};
use rayon::prelude::*;

use crate::cluster::part::PartRun;
use crate::pack::chunks::{self, Chunker, Loaded, CHUNK_SAMPLES};
use crate::pack::config::{OnError, OutputFormat, PackConfig, SourceKind};
use crate::pack::readahead::Readahead;
use crate::pack::recorded::{Run, RunPart};
use crate::pack::report::Report;
use crate::pack::resume::{self, Journal, Journals, Ledger, Outcome};
use crate::pack::staged::Staged;
use crate::progress::Progress;
use crate::sink::imagefolder::{safe_relative, ImageFolderSink};
use crate::sink::lmdb::LmdbSink;
use crate::sink::webdataset::WebDatasetSink;
use crate::sink::{Durable, PackedSample, Sink};
use crate::source::dataset::{is_packed, PackedDataset};
use crate::source::imagefolder::ImageFolder;
use crate::source::plan::{Plan, PlanSource};
use crate::source::{Listing, LoadError, Samples, Source, SourceSample, Stamps};
use crate::transcode::{Image, Transcoder};
use crate::{Error, Result};

/// Packs `config.source` into `config.output`, reporting progress to `bar` in source samples.
/// Returns the summary; the output is published and durable when this returns.
///
/// LMDB and WebDataset runs write checkpoints as they go ([`crate::pack::resume`]); with
/// `config.resume` a run continues from the last checkpoint an interrupted run left. A stop
/// asked for with [`crate::interrupt`] ends the run at a checkpoint with
/// [`Error::Interrupted`].
///
/// `config.source` may also be a plan written by `pack plan` ([`crate::source::plan`]): the run then
/// takes its samples, order and listing options from the plan and writes exactly what packing
/// the planned tree directly writes.
pub fn pack(config: &PackConfig, bar: &dyn Progress) -> Result<Report> {
    // A plan stored as an object is packed from a local copy, as a plan file is.
    if let Some(copy) = crate::source::plan::StoredPlan::fetch(&config.source, config.endpoint.as_deref())? {
        let local = PackConfig { source: copy.path().to_path_buf(), ..config.clone() };
        return pack(&local, bar).map_err(|e| copy.named(e));
    }
    if config.source.is_file() {
        if !crate::source::plan::is_plan(&config.source) {
            return Err(Error::BadSource {
                path: config.source.clone(),
                reason: "is a file, neither a plan written by `pack plan` nor an ImageFolder tree or packed dataset (directories)".into(),
            });
        }
        let plan = Plan::read(&config.source, config.part)?;
        if config.shuffle.is_some() {
            return Err(Error::Usage(format!(
                "--shuffle: the plan {} fixed the order of the samples; make the plan with --shuffle instead",
                config.source.display()
            )));
        }
        let (extensions, seed) = plan.extensions_and_seed();
        let mut planned = config.clone();
        planned.source = PathBuf::from(&plan.header.root_abs);
        planned.extensions = extensions;
        planned.shuffle = seed;
        let root = plan.header.root.clone();
        let part = match config.part {
            None => None,
            Some(part) => match crate::cluster::part::prepare(config, &mut planned, &plan, part)? {
                PartRun::Done(report) => return Ok(*report),
                PartRun::Pack(info) => Some(info),
            },
        };
        let source = Box::new(PlanSource::open(plan, config.endpoint.as_deref())?);
        let input = Input { source, kind: "imagefolder", root, ordered: true, part };
        return run(&planned, input, bar);
    }
    if config.part.is_some() {
        return Err(Error::Usage(format!(
            "--part packs a part of a plan, and {} is not one: make the plan once with `pack plan {} -o PLAN`, then run `pack PLAN --part K/N ...` on each machine",
            config.source.display(),
            config.source.display()
        )));
    }
    let detect = config.source_kind == SourceKind::Detect;
    if detect && !is_packed(&config.source) && imgpack_reader::part::holds_parts(&config.source) {
        return Err(Error::BadSource {
            path: config.source.clone(),
            reason: "holds parts packed with `--part K/N` that are not merged yet; run `pack merge` on it first, then convert the merged dataset".into(),
        });
    }
    if let Some(url) = config.store_source()? {
        let (source, kind) = store_source(config, &url)?;
        let root = url.to_string();
        return run(config, Input { source, kind, root, ordered: false, part: None }, bar);
    }
    let (source, kind): (Box<dyn Source>, &str) = if detect && is_packed(&config.source) {
        let packed = PackedDataset::open(&config.source, config.endpoint.as_deref())?;
        refuse_decoded(config, &packed)?;
        let kind = packed.kind();
        (Box::new(packed), kind)
    } else {
        (Box::new(ImageFolder::new(&config.source, &config.extensions)), "imagefolder")
    };
    let root = config.source.to_string_lossy().into_owned();
    run(config, Input { source, kind, root, ordered: false, part: None }, bar)
}

/// Refuses to unpack or transcode a dataset of decoded pixels: found before starting, not as
/// one skipped sample after another.
fn refuse_decoded(config: &PackConfig, packed: &PackedDataset) -> Result<()> {
    if !packed.holds_decoded_pixels() {
        return Ok(());
    }
    let cannot = if config.format == OutputFormat::ImageFolder {
        "unpacked into an ImageFolder tree"
    } else if !matches!(config.transcoder.mode, crate::transcode::Mode::Passthrough) {
        "transcoded again (--mode needs image files to decode)"
    } else {
        return Ok(());
    };
    Err(Error::Usage(format!(
        "{} holds decoded pixels (packed with --mode decode), not image files, so it cannot be {cannot}; start from the dataset or tree it was made from, or convert it as it is (--to lmdb or --to webdataset, without --mode)",
        config.source.display()
    )))
}

/// The source under a store prefix: the WebDataset `pack` stored there (a prefix holding
/// `imgpack.json`), else an ImageFolder tree laid out under it. One listing tells which.
fn store_source(
    config: &PackConfig,
    url: &crate::store::StoreUrl,
) -> Result<(Box<dyn Source>, &'static str)> {
    let store = imgpack_reader::store::Store::open(url, config.endpoint.as_deref())?;
    let listed = store.list_sizes()?;
    let dataset = listed.iter().any(|(name, _)| name == imgpack_reader::webdataset::META_FILE);
    if dataset && config.source_kind == SourceKind::Detect {
        let remote = imgpack_reader::webdataset::RemoteWebDataset::open_listed(store, listed)?;
        let packed = PackedDataset::of(imgpack_reader::Dataset::Remote(remote), &config.source);
        refuse_decoded(config, &packed)?;
        return Ok((Box::new(packed), imgpack_reader::webdataset::FORMAT_NAME));
    }
    let tree = crate::source::remote::RemoteImageFolder::new(store, listed, &config.extensions);
    Ok((Box::new(tree), "imagefolder"))
}

/// With `--resume`, an output that is already complete — published, no interrupted run's
/// temporary beside it — and was made by this same command from the same source: nothing is
/// left to do, so the run reports that and exits 0, as a finished `--part` run does, and
/// scripts and schedulers can retry any run. Made by another command, it is refused with
/// what differs.
fn already_complete(config: &PackConfig, source_kind: &str, root: &str) -> Result<Option<Report>> {
    let output = &config.output;
    if !config.resume || config.overwrite {
        return Ok(None);
    }
    let meta = if let Some(url) = config.store_output()? {
        // In a store: a prefix holding imgpack.json; an interrupted run's leftovers beside it
        // (killed while publishing) are only what publishing had not deleted yet.
        let store = imgpack_reader::store::Store::open(&url, config.endpoint.as_deref())?;
        let Some(raw) = store.get_if_exists(imgpack_reader::webdataset::META_FILE)? else { return Ok(None) };
        imgpack_reader::webdataset::parse_meta(output, &raw)?
    } else {
        if imgpack_reader::detect(output).is_none() || crate::fs::temp_path(output).exists() {
            return Ok(None);
        }
        imgpack_reader::open(output)?.meta().clone()
    };
    let mut differences = config.recorded_options().differences_from_recorded(&meta.options);
    if meta.source.root != root || meta.source.kind != source_kind {
        differences.insert(
            0,
            format!(
                "source {source_kind} {root}, where it was made from {} {}",
                meta.source.kind, meta.source.root
            ),
        );
    }
    if differences.is_empty() {
        return Ok(Some(Report::already_complete(output, &meta)));
    }
    Err(Error::Resume {
        path: output.clone(),
        reason: format!(
            "it is a finished dataset that another command made ({}), so there is nothing of this run to continue; pass --overwrite to replace it, or choose another -o",
            differences.join("; ")
        ),
    })
}

/// The warnings a run gives: the listing's, and — when this run walked the tree itself
/// (`walked`: not a plan, a part or a conversion, which list what was walked before) — one
/// for each class with no image, so each is said once, where the tree is read.
fn run_warnings(listing: &crate::source::Listing, walked: bool) -> Vec<String> {
    let empty =
        listing.empty_classes.iter().filter(|_| walked).map(|c| crate::pack::report::empty_class_warning(c));
    empty.chain(listing.warnings.iter().cloned()).collect()
}

/// The note for shards written in a tree's class-after-class order: a WebDataset packed from a
/// tree (or a plan of one) without `--shuffle`. Not for a part (the plan's run says it once)
/// nor for a conversion, which keeps the order the dataset was packed in.
fn class_order_note(config: &PackConfig, source_kind: &str, is_part: bool) -> Vec<String> {
    let class_order = matches!(config.format, OutputFormat::WebDataset { .. }) && config.shuffle.is_none();
    if class_order && source_kind == "imagefolder" && !is_part {
        vec![crate::pack::report::CLASS_ORDER_NOTE.to_string()]
    } else {
        Vec::new()
    }
}

/// What a run packs and how its samples are keyed.
struct Input {
    source: Box<dyn Source>,
    /// The kind of source the metadata records.
    kind: &'static str,
    /// The source root the metadata records.
    root: String,
    /// The listing is already in its final order (a plan), so `config.shuffle` is only
    /// recorded, not applied again.
    ordered: bool,
    /// When packing one part of a plan: which. Its keys then start at the plan index of its
    /// first sample and are as wide as the whole plan's.
    part: Option<PartInfo>,
}

/// Packs the samples `input` lists.
fn run(config: &PackConfig, input: Input, bar: &dyn Progress) -> Result<Report> {
    let Input { source, kind: source_kind, root, ordered, part } = input;
    let started = Instant::now();
    config.validate()?;
    if part.is_none() {
        if let Some(report) = already_complete(config, source_kind, &root)? {
            return Ok(report);
        }
    }
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(config.threads.get())
        .thread_name(|i| format!("imgpack-load-{i}"))
        .build()
        .map_err(|e| Error::Threads { threads: config.threads.get(), reason: e.to_string() })?;
    // Listing and `stat`ing wait on the file system, like reading: on the readers' count.
    let io_pool = rayon::ThreadPoolBuilder::new()
        .num_threads(config.io_threads.get())
        .thread_name(|i| format!("imgpack-stat-{i}"))
        .build()
        .map_err(|e| Error::Threads { threads: config.io_threads.get(), reason: e.to_string() })?;
    bar.message("listing samples");
    let mut listing = io_pool.install(|| source.list(bar))?;
    // A part may be empty (more parts than samples); it still says so to `pack merge`.
    if listing.samples.is_empty() && part.is_none() {
        let reason = if source_kind == "imagefolder" {
            format!(
                "no files with extensions {} found in its class folders; pass --extensions to accept others",
                config.extensions.join(",")
            )
        } else {
            "the dataset holds no samples; nothing to convert".to_string()
        };
        return Err(Error::BadSource { path: config.source.clone(), reason });
    }
    if let Some(seed) = config.shuffle.filter(|_| !ordered) {
        listing.samples.shuffle(seed);
    }
    // Known for packed sources; an ImageFolder listing does not stat files, so 0 there.
    let total_bytes: u64 = listing.samples.total_size();
    let found = listing.samples.len() as u64;
    let first_key = part.as_ref().map_or(0, |p| p.first);
    let width = key_width(part.as_ref().map_or(found, |p| p.plan_samples));
    bar.length(found);

    let mut report = Report {
        kind: "summary",
        found,
        classes: listing.classes.len(),
        empty_classes: listing.empty_classes.clone(),
        warnings: run_warnings(&listing, source_kind == "imagefolder" && !ordered),
        notes: class_order_note(config, source_kind, part.is_some()),
        ..Report::default()
    };
    let run = Run {
        tool: crate::TOOL.into(),
        source: root.clone(),
        source_kind: source_kind.into(),
        options: config.recorded_options(),
        part: part.as_ref().map(|p| RunPart { index: p.index, count: p.count, plan: p.plan.clone() }),
    };
    let (mut sink, mut ledger, journals): (Box<dyn Sink>, Ledger, Option<Journals>) = match &config.format {
        OutputFormat::ImageFolder => (
            Box::new(ImageFolderSink::create(&config.output, config.overwrite, &listing.classes)?),
            Ledger::default(),
            None,
        ),
        _ => {
            bar.message("checking the source");
            let stamps: Stamps =
                io_pool.install(|| listing.samples.par_iter().map(|s| source.stamp(&s)).collect());
            // The stamps give the source size an ImageFolder listing does not: a better first
            // LMDB map size.
            let stamped: u64 = stamps.total_size();
            let hint = total_bytes.max(stamped);
            let keys = (first_key, width);
            if config.store_output()?.is_some() {
                bar.message("checking the store");
            }
            let (sink, ledger, journals) =
                open_resumable(config, bar, &listing, &stamps, &run, keys, hint, &mut report)?;
            bar.position(ledger.total().position);
            (sink, ledger, Some(journals))
        }
    };
    let checkpoint = |sink: &mut Box<dyn Sink>, ledger: &mut Ledger, now: bool| -> Result<()> {
        if let (Some(durable), Some(journals)) = (sink.checkpoint(now)?, &journals) {
            let progress = ledger.checkpoint(durable).clone();
            journals.write(&Journal { run: run.clone(), found, progress })?;
        }
        Ok(())
    };

    let unpacking = config.format == OutputFormat::ImageFolder;
    let to_store = config.store_output()?.is_some();
    let start = usize::try_from(ledger.total().position).unwrap_or(usize::MAX).min(listing.samples.len());
    let chunker = Chunker::with_budget(config.checkpoint_bytes);
    let (tx, rx) = mpsc::sync_channel::<Vec<Loaded>>(1);
    // Read ahead at most a chunk's budget: 32 MiB, less when asked to checkpoint more often, so
    // such a run also reads little past the sample it will stop at; and at most two chunks'
    // worth of samples, however small they are.
    let readahead = Readahead::new(start..listing.samples.len(), chunker.budget, 2 * CHUNK_SAMPLES);
    let fatal = std::sync::Mutex::new(None);
    let written = std::thread::scope(|scope| -> Result<()> {
        let samples = &listing.samples;
        let source = &*source;
        let transcoder = &config.transcoder;
        let readahead = &readahead;
        let fatal = &fatal;
        // Named, as every thread of a run is, so a profile tells the loader from the writer.
        // Started before the readers: started after them, it waited ~50 ms for the CPU while 32
        // runnable readers filled the readahead, and so did both workers (4% of a 2-thread
        // re-encode of 3,000 images).
        let loader =
            std::thread::Builder::new().name("imgpack-loader".into()).spawn_scoped(scope, move || {
                // However the loader ends (done, interrupted, the writer gone), the readers stop.
                let _stop = StopOnDrop(readahead);
                let transform = |bytes| transform(transcoder, bytes, unpacking);
                chunks::load(&pool, readahead, start..samples.len(), chunker, &transform, &tx);
            });
        let loader = match loader {
            Ok(loader) => loader,
            Err(e) => {
                readahead.stop();
                return Err(Error::Threads { threads: 1, reason: e.to_string() });
            }
        };
        let count = config.io_threads.get().min(samples.len().saturating_sub(start)).max(1);
        let readers = (0..count).map(|i| {
            std::thread::Builder::new().name(format!("imgpack-read-{i}")).spawn_scoped(scope, move || {
                readahead.serve(|index| {
                    let read = read(source, &samples.get(index), unpacking, fatal);
                    let bytes = read.as_ref().map_or(0, |b| b.len() as u64);
                    (read, bytes)
                })
            })
        });
        let readers = match readers.collect::<std::io::Result<Vec<_>>>() {
            Ok(readers) => readers,
            Err(e) => {
                // The readers that did start return, the loader's next `take` returns `None`,
                // and the scope can end.
                readahead.stop();
                return Err(Error::Threads { threads: config.io_threads.get(), reason: e.to_string() });
            }
        };
        let mut next = start;
        let mut batch = Vec::new();
        // This run's rate: samples kept from an interrupted run took no time now.
        let packing_started = Instant::now();
        let (mut done_here, mut bytes_here) = (0u64, 0u64);
        for loaded in rx {
            // A source that fails every read: stop, rather than skip each sample in turn.
            if let Some(error) = fatal.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take() {
                return Err(error);
            }
            batch.clear();
            for result in loaded {
                let position = next as u64;
                let sample = samples.get(next);
                next += 1;
                bar.advance(1);
                done_here += 1;
                match result {
                    Ok((image, crc)) => {
                        bytes_here += image.source_bytes;
                        let key = format_key(first_key + ledger.packed(), width);
                        ledger.record(Outcome::Packed {
                            position,
                            bytes_in: image.source_bytes,
                            format: image.kind,
                            kept: image.kept,
                            field: image.ext,
                        });
                        batch.push(packed_sample(key, &sample, &listing.classes, image, crc));
                    }
                    Err(reason) if config.on_error == OnError::Fail => {
                        return Err(Error::BadSample { path: source.name(&sample), reason });
                    }
                    Err(reason) => ledger.record(Outcome::Skipped { position, reason }),
                }
            }
            sink.write_batch(&batch)?;
            checkpoint(&mut sink, &mut ledger, false)?;
            if crate::interrupt::requested() {
                break;
            }
            bar.message(&rate_text(done_here, bytes_here, packing_started.elapsed()));
        }
        // A loader that panicked closed the channel as if it were done: say so instead of
        // publishing a short output. (The panic hook has printed where it happened.)
        let loaded = loader.join();
        let panicked = |thread: &str| Error::Panicked { path: config.source.clone(), thread: thread.into() };
        // A reader that panicked made the loader panic too: name the reader.
        for reader in readers {
            reader.join().map_err(|_| panicked("reader"))?;
        }
        loaded.map_err(|_| panicked("loader"))
    });
    if crate::interrupt::requested() {
        // Never publish what an interrupted run wrote. An unpacked tree has no checkpoints:
        // dropping the sink removes its temporary.
        let Some(journals) = &journals else {
            return Err(Error::Interrupted { temp: crate::fs::temp_path(&config.output), kept: None });
        };
        bar.message("saving a checkpoint");
        checkpoint(&mut sink, &mut ledger, true)?;
        let kept = journals.read()?.map(|j| j.progress.packed);
        return Err(Error::Interrupted { temp: journals.place(), kept });
    }
    written?;

    let total = ledger.total();
    let mut fields: Vec<String> = total.fields.iter().cloned().collect();
    fields.extend([CLS_FIELD.to_string(), JSON_FIELD.to_string()]);
    fields.sort();
    let format = match &config.format {
        OutputFormat::Lmdb => imgpack_reader::lmdb::FORMAT_NAME,
        OutputFormat::WebDataset { .. } => imgpack_reader::webdataset::FORMAT_NAME,
        OutputFormat::ImageFolder => "imagefolder",
    };
    let meta = Meta {
        format: format.into(),
        version: FORMAT_VERSION,
        samples: total.packed,
        key_width: width,
        classes: listing.classes.clone(),
        fields,
        source: SourceInfo { kind: source_kind.into(), root: root.clone() },
        options: config.recorded_options().to_value(),
        tool: crate::TOOL.into(),
        checksum: Some(imgpack_reader::checksum::ALGORITHM.into()),
        shards: Vec::new(),
        part: part.map(|p| PartInfo { skipped: part_skipped(&p, &total, &listing.samples), ..p }),
    };
    bar.message(if to_store { FINISHING_UPLOAD } else { FINISHING_SYNC });
    let finished = sink.finish(&meta)?;
    bar.finish();
    if crate::interrupt::requested() {
        // The stop came while the output was being finished (the last sync or upload), after
        // the last checkpoint: it is whole, so it was published rather than left to resume.
        report.warnings.push(FINISHED_THOUGH_INTERRUPTED.to_string());
    }
    report.packed = total.packed;
    report.bytes_in = total.bytes_in;
    report.formats = total.formats.clone();
    report.stored = total.stored.clone();
    report.kept_unchanged = total.kept_unchanged;
    report.skipped = resume::skipped(&total, &listing.samples, &*source);
    report.output = finished.path;
    report.bytes_out = finished.bytes;
    report.warnings.extend(finished.warnings);
    report.set_elapsed(started.elapsed().as_secs_f64());
    Ok(report)
}

/// What the progress bar says while the output is made durable and published: to disk...
pub const FINISHING_SYNC: &str = "syncing to disk";
/// ... or to a store.
pub const FINISHING_UPLOAD: &str = "finishing the upload";

/// The warning of a run that a stop request (Ctrl-C, SIGTERM) reached while it was finishing.
pub const FINISHED_THOUGH_INTERRUPTED: &str = "the stop request came while the output was being finished (its last sync or upload); it is complete and was published, not stopped — delete it if it is not wanted";

/// The progress bar's one rate: files and source megabytes per second of this run.
fn rate_text(files: u64, bytes: u64, elapsed: std::time::Duration) -> String {
    let secs = elapsed.as_secs_f64().max(1e-3);
    format!("{:.0} files/s, {:.1} MB/s", files as f64 / secs, bytes as f64 / 1e6 / secs)
}

/// Where a resumable run writes: a staged directory, or a store prefix.
enum Staging {
    Dir(Staged),
    /// The prefix, and this run's lease on it ([`crate::store::lock`]).
    Store(crate::store::Store, crate::store::lock::StoreLock),
}

/// Prepares the output of a resumable run ([`resume::stage`], [`resume::stage_store`]):
/// returns where it goes, where its journals are kept, the interrupted run's journal to
/// continue (with `resume`), and whether an interrupted run's work was discarded.
///
/// A store prefix is locked first ([`crate::store::lock`]): `waiting` hears of a wait for
/// another run's lock.
fn stage(
    config: &PackConfig,
    resume: bool,
    waiting: &dyn Fn(&str),
) -> Result<(Staging, Journals, Option<Journal>, bool)> {
    use crate::store::lock::{StoreLock, Timing};
    match config.store_output()? {
        Some(url) => {
            let store = crate::store::Store::open(&url, config.endpoint.as_deref())?;
            let lock = StoreLock::acquire(&store, Timing::from_env(), waiting)?;
            // Every write of the run goes through a store that checks the lease.
            let store = store.under(&lock);
            let (journals, journal, discarded) =
                resume::stage_store(store.clone(), config.overwrite, resume)?;
            Ok((Staging::Store(store, lock), journals, journal, discarded))
        }
        None => {
            let (staged, journal, discarded) = resume::stage(&config.output, config.overwrite, resume)?;
            let journals = Journals::Dir(staged.path().to_path_buf());
            Ok((Staging::Dir(staged), journals, journal, discarded))
        }
    }
}

/// Opens an LMDB or WebDataset sink: with `--resume` and a checkpoint left by an interrupted
/// run of the same `run`, cut back to that checkpoint (after checking that the source has not
/// changed since); otherwise fresh, with the listing saved for a later `--resume`. Returns the
/// sink, the ledger to continue and where the run's journals go.
#[allow(clippy::too_many_arguments)]
fn open_resumable(
    config: &PackConfig,
    bar: &dyn Progress,
    listing: &Listing,
    stamps: &Stamps,
    run: &Run,
    (first_key, key_width): (u64, usize),
    total_bytes: u64,
    report: &mut Report,
) -> Result<(Box<dyn Sink>, Ledger, Journals)> {
    let waiting = |text: &str| bar.notice(text);
    let (staging, journals, journal, discarded) = stage(config, config.resume, &waiting)?;
    if let Staging::Store(_, lock) = &staging {
        report.warnings.extend(lock.warning.clone());
    }
    // A part resumes by itself, whether or not there is anything to resume.
    if config.resume && journal.is_none() && config.part.is_none() {
        report.warnings.push(format!(
            "--resume: no checkpoint of an interrupted run was found in {}; packed from the start",
            journals.place().display()
        ));
    }
    if discarded {
        report.warnings.push(format!(
            "discarded the unfinished run in {} (pass --resume to continue such a run instead)",
            journals.place().display()
        ));
    }
    let shard_prefix = |prefix: &str| match config.part {
        Some(part) => imgpack_reader::part::shard_prefix(prefix, part.index, part.count),
        None => prefix.to_string(),
    };
    let fresh = |staging: Staging, journals: Journals| -> Result<(Box<dyn Sink>, Ledger, Journals)> {
        journals.save_listing(listing, stamps)?;
        let sink: Box<dyn Sink> = match (&config.format, staging) {
            (OutputFormat::WebDataset { prefix, limits, md5 }, Staging::Dir(staged)) => {
                Box::new(WebDatasetSink::start(staged, &shard_prefix(prefix), *limits, *md5)?)
            }
            (OutputFormat::WebDataset { prefix, limits, md5 }, Staging::Store(store, lock)) => {
                Box::new(WebDatasetSink::to_store(store, lock, &shard_prefix(prefix), *limits, *md5)?)
            }
            (_, Staging::Dir(staged)) => {
                Box::new(LmdbSink::start(staged, total_bytes, config.checkpoint_bytes)?)
            }
            // `validate` lets only WebDataset through to a store.
            (_, Staging::Store(store, _)) => {
                return Err(Error::Usage(format!(
                    "{}: only --to webdataset can be written there",
                    store.url()
                )))
            }
        };
        Ok((sink, Ledger::default(), journals))
    };
    let Some(journal) = journal else { return fresh(staging, journals) };
    let mismatch = if &journal.run != run {
        Some(format!(
            "the interrupted run was made differently: {}",
            run.differences(&journal.run).join(", ")
        ))
    } else {
        resume::changes(journals.dir(), listing, stamps)?
            .map(|changes| format!("the source changed since the interrupted run started: {changes}"))
    };
    if let Some(reason) = mismatch {
        if config.part.is_none() {
            return Err(Error::Resume { path: config.output.clone(), reason });
        }
        // A part resumes without being asked to, so what cannot be resumed starts over.
        report.warnings.push(format!("started the part over, as {reason}"));
        drop((staging, journals));
        let (staging, journals, _, _) = stage(config, false, &waiting)?;
        return fresh(staging, journals);
    }
    let progress = &journal.progress;
    let durable =
        Durable { samples: progress.packed, shards: progress.shards.clone(), etags: progress.etags.clone() };
    let sink: Box<dyn Sink> = match (&config.format, staging) {
        (OutputFormat::WebDataset { prefix, limits, md5 }, Staging::Dir(staged)) => {
            Box::new(WebDatasetSink::resume(staged, &shard_prefix(prefix), *limits, *md5, &durable)?)
        }
        (OutputFormat::WebDataset { prefix, limits, md5 }, Staging::Store(store, lock)) => Box::new(
            WebDatasetSink::resume_in_store(store, lock, &shard_prefix(prefix), *limits, *md5, &durable)?,
        ),
        (_, Staging::Dir(staged)) => Box::new(LmdbSink::resume(
            staged,
            &durable,
            (first_key, key_width),
            total_bytes,
            config.checkpoint_bytes,
        )?),
        (_, Staging::Store(store, _)) => {
            return Err(Error::Usage(format!("{}: only --to webdataset can be written there", store.url())))
        }
    };
    report.resumed = journal.progress.packed;
    Ok((sink, Ledger::resume(journal.progress), journals))
}

/// The planned samples a part skipped, by plan index.
fn part_skipped(part: &PartInfo, total: &resume::Progress, samples: &Samples) -> Vec<SkippedSample> {
    total
        .skipped
        .iter()
        .map(|(position, reason)| SkippedSample {
            index: part.first + position,
            path: samples
                .try_get(*position as usize)
                .map_or_else(String::new, |s| SampleInfo::new(s.rel_path, "").path),
            reason: reason.clone(),
        })
        .collect()
}

/// Stops a [`Readahead`] when dropped.
struct StopOnDrop<'a, T>(&'a Readahead<T>);

impl<T> Drop for StopOnDrop<'_, T> {
    fn drop(&mut self) {
        self.0.stop();
    }
}

/// Reads one sample's bytes, on a reader thread; the error is the reason it is skipped. When
/// unpacking to a tree, a sample whose recorded path would land outside the tree is refused here,
/// before it is read.
///
/// A read that fails because of the source as a whole rather than the sample
/// ([`LoadError::Source`]: a bucket gone, credentials refused, a mount lost) is not a bad file:
/// its error is put in `fatal`, which stops the run with it, instead of every later sample being
/// skipped for the same reason.
fn read(
    source: &dyn Source,
    sample: &SourceSample,
    unpacking: bool,
    fatal: &std::sync::Mutex<Option<Error>>,
) -> Result<Vec<u8>, String> {
    if unpacking {
        safe_relative(sample.rel_path)?;
    }
    source.load(sample).map_err(|e| match e {
        LoadError::Source(error) => {
            let reason = format!("cannot read: {error}");
            let mut slot = fatal.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            slot.get_or_insert(error);
            reason
        }
        LoadError::Sample(e) => format!("cannot read: {e}"),
    })
}

/// Checks (and transcodes) one sample's bytes, and computes the CRC-32 of its stored bytes here,
/// on the worker threads, rather than on the one writer thread; the error is the reason it is
/// skipped.
fn transform(transcoder: &Transcoder, bytes: Vec<u8>, unpacking: bool) -> Result<(Image, u32), String> {
    let image = transcoder.apply(bytes)?;
    if unpacking && ImageFormat::from_extension(image.ext).is_none() {
        return Err(format!(
            "holds decoded pixels ({}), not an image file; it cannot be unpacked into a tree",
            image.ext
        ));
    }
    let crc = imgpack_reader::checksum::crc32(&image.bytes);
    Ok((image, crc))
}

/// Builds the stored fields of one sample, sorted by extension.
fn packed_sample(
    key: String,
    sample: &SourceSample,
    classes: &[String],
    image: Image,
    image_crc: u32,
) -> PackedSample {
    let info = SampleInfo::new(sample.rel_path, &classes[sample.class as usize]);
    let cls = sample.class.to_string().into_bytes();
    let json = serde_json::to_vec(&info).expect("sample info serialises");
    let (cls_crc, json_crc) = (imgpack_reader::checksum::crc32(&cls), imgpack_reader::checksum::crc32(&json));
    let mut fields = vec![
        ((CLS_FIELD.to_string(), cls), cls_crc),
        ((image.ext.to_string(), image.bytes), image_crc),
        ((JSON_FIELD.to_string(), json), json_crc),
    ];
    fields.sort_by(|a, b| a.0 .0.cmp(&b.0 .0));
    let (fields, crcs) = fields.into_iter().unzip();
    PackedSample { key, fields, crcs }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_counts_every_listed_sample_once() {
        let source = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/imagefolder");
        let dir = tempfile::tempdir().unwrap();
        let config = PackConfig::new(&source, dir.path().join("out.lmdb"), OutputFormat::Lmdb);
        let progress = crate::progress::testing::Recorded::default();
        let report = pack(&config, &progress).unwrap();
        assert!(report.found > 0);
        assert_eq!(report.packed + report.skipped.len() as u64, report.found);
        assert_eq!(*progress.state.lock().unwrap(), (report.found, report.found), "(length, position)");
        assert!(*progress.finished.lock().unwrap());
        let messages = progress.messages.lock().unwrap();
        assert_eq!(messages.first().map(String::as_str), Some("listing samples"));
        assert_eq!(messages.last().map(String::as_str), Some("syncing to disk"));
    }

    /// A source whose every file answers with one OS error, as a lost mount does.
    struct Failing(i32);

    impl Source for Failing {
        fn list(&self, _: &dyn Progress) -> Result<Listing> {
            unreachable!("only loaded")
        }
        fn load(&self, sample: &SourceSample) -> Result<Vec<u8>, LoadError> {
            Err(LoadError::from_file(&self.name(sample), std::io::Error::from_raw_os_error(self.0)))
        }
        fn name(&self, sample: &SourceSample) -> std::path::PathBuf {
            std::path::Path::new("/mnt/train").join(crate::source::os_path(sample.rel_path))
        }
    }

    #[test]
    fn a_lost_mount_stops_the_run_and_a_bad_file_is_only_skipped() {
        let sample = SourceSample { index: 0, rel_path: b"cat/1.jpg", class: 0, size: 0 };
        let fatal = std::sync::Mutex::new(None);
        // A FUSE mount whose daemon died: the sample's reason, and the error that stops the run.
        let reason = read(&Failing(libc::ENOTCONN), &sample, false, &fatal).unwrap_err();
        assert!(reason.starts_with("cannot read: /mnt/train/cat/1.jpg: "), "{reason}");
        let stop = fatal.lock().unwrap().take().expect("a lost mount stops the run");
        assert!(
            matches!(stop, Error::SourceGone { ref path, .. } if path.ends_with("cat/1.jpg")),
            "{stop:?}"
        );
        let message = stop.to_string();
        assert!(message.contains("mount it again") && message.contains("--resume"), "{message}");
        // One unreadable file is that file's problem.
        let reason = read(&Failing(libc::EACCES), &sample, false, &fatal).unwrap_err();
        assert!(reason.starts_with("cannot read: ") && reason.contains("ermission denied"), "{reason}");
        assert!(fatal.lock().unwrap().is_none(), "a bad file does not stop the run");
    }
}
